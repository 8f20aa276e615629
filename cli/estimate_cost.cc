#include "cli/estimate_cost.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "config/train_config.h"
#include "spec/job_spec.h"
#include "train/memory_estimate.h"
#include "train/model_factory.h"

namespace ringmaster::cli {

const std::vector<GpuKind>& GpuKinds() {
  // peak_tflops: NVIDIA's datasheet figure for dense (not 2:4 sparse) bf16 on the tensor
  // cores. Prices are dollars per GPU-hour, indicative list prices of 2023-2024 (an 8-GPU
  // instance's price over 8 where the cloud rents them so); they change often: override them
  // with --price and --spot_price. Spot: the seeds' 65 % discount (exercise 26.20) where no
  // figure is given.
  static const std::vector<GpuKind>* const kinds = new std::vector<GpuKind>{
      // $3.50 on demand and 65 % off on spot: the seeds' AWS figures (26.20, chapter 26's quiz).
      {"a100", "A100 SXM 80GB", 312, 80, 3.50, 3.50 * 0.35},
      // AWS p4d.24xlarge, $32.77/h for 8 (2023); spot $1.10: exercise 26.21's option B.
      {"a100-40gb", "A100 SXM 40GB", 312, 40, 32.77 / 8, 1.10},
      // AWS p5.48xlarge, $98.32/h for 8 (2023-2024). 1979 TFLOP/s is with sparsity.
      {"h100", "H100 SXM 80GB", 989, 80, 98.32 / 8, 98.32 / 8 * 0.35},
      // The H100's compute with 141 GB of HBM3e; indicative: 1.1x the H100's price.
      {"h200", "H200 SXM 141GB", 989, 141, 98.32 / 8 * 1.1, 98.32 / 8 * 1.1 * 0.35},
      // AWS g5.xlarge, $1.006/h for one (2023-2024). 125 is the A10's datasheet figure; AWS's
      // A10G runs at lower clocks (reported about 70): give --peak_tflops or --gpu_hours.
      {"a10g", "A10G 24GB (AWS g5)", 125, 24, 1.006, 1.006 * 0.35},
      // AWS p3.2xlarge, $3.06/h for one (2017-2024). The V100 has no bf16: fp16 tensor cores.
      {"v100", "V100 SXM2 16GB (fp16)", 125, 16, 3.06, 3.06 * 0.35},
      // AWS g6.xlarge, $0.805/h for one (2024). 242 TFLOP/s is with sparsity.
      {"l4", "L4 24GB", 121, 24, 0.805, 0.805 * 0.35},
  };
  return *kinds;
}

namespace {

absl::Status FlagError(const std::string& flag, const std::string& problem) {
  return absl::InvalidArgumentError(absl::StrCat(flag, ": ", problem));
}

// A count such as 1.4T or 2e21 (train::ParseParameterCount's forms), its error naming `flag`.
absl::StatusOr<double> ParseCount(const std::string& flag, const std::string& text) {
  absl::StatusOr<double> n = train::ParseParameterCount(text);
  if (!n.ok()) {
    return FlagError(flag, absl::StrCat("\"", text, "\" is not a count (e.g. 1.4T, 300B, 2e21)"));
  }
  return *n;
}

// "30m", "1.5h", "90s" in hours; nullopt when empty.
absl::StatusOr<std::optional<double>> ParseHours(const std::string& flag, const std::string& text,
                                                 bool positive) {
  if (text.empty()) return std::optional<double>();
  absl::Duration d;
  if (!absl::ParseDuration(text, &d) || d < absl::ZeroDuration() || d == absl::InfiniteDuration() ||
      (positive && d == absl::ZeroDuration())) {
    return FlagError(flag, absl::StrCat("\"", text, "\" is not a ", positive ? "positive " : "",
                                        "duration (e.g. 90s, 30m, 1.5h)"));
  }
  return std::optional<double>(absl::ToDoubleHours(d));
}

absl::Status InSpec(const std::string& file, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat("--spec ", file, ": ", s.message()));
}

// --spec: the model's parameters and, for a GPT trained by steps, its tokens.
absl::Status SpecWork(const EstimateCostFlags& flags, CostInputs* in) {
  const std::string& file = flags.spec_file;
  absl::StatusOr<JobSpec> spec = spec::LoadJobSpecFile(file, flags.overrides);
  if (!spec.ok()) return InSpec(file, spec.status());
  absl::StatusOr<train::TrainConfig> config = config::TrainConfigFromSpec(*spec);
  if (!config.ok()) return InSpec(file, config.status());
  absl::StatusOr<std::unique_ptr<train::Model>> model =
      train::CreateModel(config->model, train::DescribeJobData(*config));
  if (!model.ok()) return InSpec(file, model.status());
  in->parameters = static_cast<double>((*model)->table().parameter_count());
  if (!flags.tokens.empty()) {
    absl::StatusOr<double> tokens = ParseCount("--tokens", flags.tokens);
    if (!tokens.ok()) return tokens.status();
    in->tokens = *tokens;
    in->work = absl::StrCat(spec->name(), " (", (*model)->Describe(), ")");
    return absl::OkStatus();
  }
  if (config->model.kind != train::ModelConfig::Kind::kGpt || config->steps <= 0) {
    return FlagError("--tokens", absl::StrCat("required: the spec ", file,
                                              " has no steps of a GPT's context to count the "
                                              "tokens from (give e.g. --tokens 300B)"));
  }
  const int64_t context = config->model.gpt.context;
  in->tokens = static_cast<double>(config->steps) * static_cast<double>(config->global_batch) *
               static_cast<double>(context);
  in->work = absl::StrCat(spec->name(), " (", (*model)->Describe(), "): ", config->steps,
                          " steps x ", config->global_batch, " sequences x ", context, " tokens");
  return absl::OkStatus();
}

std::string Hours(double h) {
  if (std::isinf(h)) return "never";
  if (h < 1.0 / 60) return absl::StrFormat("%.3g s", h * 3600);
  if (h < 1) return absl::StrFormat("%.1f min", h * 60);
  if (h < 10) return absl::StrFormat("%.2f h", h);
  if (h < 48) return absl::StrFormat("%.1f h", h);
  return absl::StrFormat("%.1f h (%.1f days)", h, h / 24);
}

// Below 0.1 with two significant digits, up to 1000 with one decimal (`decimals` for
// dollars), else whole with thousands separators: 116,334.
std::string Number(double n, int decimals = 1) {
  if (n > 0 && n < 0.1) return absl::StrFormat("%.2g", n);  // a tiny job's
  if (n < 1000) return absl::StrFormat("%.*f", decimals, n);
  const std::string digits = absl::StrFormat("%.0f", n);
  std::string grouped;  // built forwards: GCC 12 warns (-Wrestrict, wrongly) on inserts
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) grouped += ',';
    grouped += digits[i];
  }
  return grouped;
}

std::string Dollars(double d) { return std::isinf(d) ? "never ends" : "$" + Number(d, 2); }

std::string Count(double n) { return Number(n); }

// A price per GPU-hour: cents, or tenths of a cent where it has them ($1.225).
std::string Price(double d) {
  const double cents = d * 100;
  const int decimals = std::abs(cents - std::round(cents)) > 1e-6 ? 3 : 2;
  return absl::StrFormat("$%.*f", decimals, d);
}

// JSON has no infinity: a run that never ends is null.
nlohmann::ordered_json Finite(double v) {
  return std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json(nullptr);
}

void Put(nlohmann::ordered_json* doc, const char* key, const std::optional<double>& v) {
  if (v.has_value()) (*doc)[key] = Finite(*v);
}

}  // namespace

absl::StatusOr<CostInputs> ResolveCostInputs(const EstimateCostFlags& flags) {
  CostInputs in;
  // The machines first: --gpu_hours needs their rate.
  const std::vector<GpuKind>& kinds = GpuKinds();
  auto kind = std::find_if(kinds.begin(), kinds.end(),
                           [&](const GpuKind& k) { return k.name == flags.gpu; });
  if (kind == kinds.end()) {
    std::vector<std::string> names;
    for (const GpuKind& k : kinds) names.push_back(k.name);
    return FlagError("--gpu", absl::StrCat("unknown GPU kind \"", flags.gpu, "\" (the kinds are ",
                                           absl::StrJoin(names, ", "),
                                           "; another with --peak_tflops and --price)"));
  }
  in.gpu = *kind;
  const struct {
    const char* flag;
    const std::optional<double>& value;
    double low;       // exclusive unless zero_ok
    bool zero_ok;
    double high;      // inclusive; infinity: none
  } numbers[] = {
      {"--peak_tflops", flags.peak_tflops, 0, false, 1e9},
      {"--price", flags.price, 0, true, 1e9},
      {"--spot_price", flags.spot_price, 0, true, 1e9},
      {"--spot_discount", flags.spot_discount, 0, true, 0.999999},
      {"--preemptions_per_day", flags.preemptions_per_day, 0, true, 1e9},
      {"--budget", flags.budget, 0, false, 1e15},
      {"--gpu_hours", flags.gpu_hours, 0, false, 1e15},
  };
  for (const auto& n : numbers) {
    if (!n.value.has_value()) continue;
    const double v = *n.value;
    if (!std::isfinite(v) || v < n.low || (v == n.low && !n.zero_ok) || v > n.high) {
      return FlagError(n.flag, absl::StrCat("must be ", n.zero_ok ? ">= " : "> ", n.low,
                                            n.high < 1 ? absl::StrCat(" and < 1") : "", ", got ",
                                            v));
    }
  }
  if (!(flags.mfu > 0 && flags.mfu <= 1)) {
    return FlagError("--mfu", absl::StrCat("must be in (0, 1] (0.45 is 45 % of the peak), got ",
                                           flags.mfu));
  }
  if (flags.gpus < 1) return FlagError("--gpus", absl::StrCat("must be >= 1, got ", flags.gpus));
  if (flags.peak_tflops) in.gpu.peak_tflops = *flags.peak_tflops;
  if (flags.price) in.gpu.price = *flags.price;
  if (flags.spot_price) in.gpu.spot_price = *flags.spot_price;
  if (flags.spot_discount) in.gpu.spot_price = in.gpu.price * (1 - *flags.spot_discount);
  in.gpus = flags.gpus;
  in.mfu = flags.mfu;
  const double rate = in.gpu.peak_tflops * 1e12 * in.mfu;

  // The work.
  if (!flags.spec_file.empty()) {
    if (absl::Status s = SpecWork(flags, &in); !s.ok()) return s;
    in.flops = 6 * in.parameters * in.tokens;
  } else if (!flags.params.empty()) {
    absl::StatusOr<double> n = ParseCount("--params", flags.params);
    if (!n.ok()) return n.status();
    if (flags.tokens.empty()) return FlagError("--tokens", "required with --params (e.g. 1.4T)");
    absl::StatusOr<double> d = ParseCount("--tokens", flags.tokens);
    if (!d.ok()) return d.status();
    in.parameters = *n;
    in.tokens = *d;
    in.flops = 6 * in.parameters * in.tokens;
    in.work = absl::StrFormat("6 x %.4g parameters x %.4g tokens", in.parameters, in.tokens);
  } else if (!flags.flops.empty()) {
    absl::StatusOr<double> f = ParseCount("--flops", flags.flops);
    if (!f.ok()) return f.status();
    in.flops = *f;
    in.work.clear();  // the FLOPs as given
  } else if (flags.gpu_hours.has_value()) {
    in.flops = *flags.gpu_hours * 3600 * rate;
    in.work = absl::StrFormat("%.6g GPU-hours on %s at %.3g MFU", *flags.gpu_hours, in.gpu.name,
                              in.mfu);
  } else {
    return FlagError("--params", "give the work: --params N --tokens D, --flops F, --gpu_hours H "
                                 "or --spec JOB.yaml");
  }
  // Spot and preemptions.
  auto hours = [](const std::string& flag, const std::string& text, bool positive,
                  std::optional<double>* into) -> absl::Status {
    absl::StatusOr<std::optional<double>> h = ParseHours(flag, text, positive);
    if (!h.ok()) return h.status();
    *into = *h;
    return absl::OkStatus();
  };
  std::optional<double> mtbf, restart;
  for (absl::Status s : {hours("--mtbf", flags.mtbf, true, &mtbf),
                         hours("--checkpoint_interval", flags.checkpoint_interval, true,
                               &in.checkpoint_interval),
                         hours("--checkpoint_save", flags.checkpoint_save, false,
                               &in.checkpoint_save),
                         hours("--restart", flags.restart, false, &restart),
                         hours("--lost_per_preemption", flags.lost_per_preemption, false,
                               &in.lost_per_preemption)}) {
    if (!s.ok()) return s;
  }
  if (flags.preemptions_per_day) in.preemptions_per_hour = *flags.preemptions_per_day / 24;
  if (mtbf) in.preemptions_per_hour = 1 / *mtbf;
  in.restart = restart.value_or(0);
  if (restart && in.lost_per_preemption) {
    return FlagError("--restart", "--lost_per_preemption already counts the restart");
  }
  if (restart && !in.checkpoint_interval) {
    return FlagError("--restart", "needs --checkpoint_interval (a preemption loses half an "
                                  "interval plus the restart)");
  }
  in.budget = flags.budget;
  return in;
}

CostEstimate EstimateCost(const CostInputs& in) {
  CostEstimate e;
  const double p = in.gpu.price, s = in.gpu.spot_price, g = in.gpus;
  e.gpu_flops_per_second = in.gpu.peak_tflops * 1e12 * in.mfu;
  e.gpu_hours = in.flops / e.gpu_flops_per_second / 3600;
  e.wall_hours = e.gpu_hours / g;
  e.on_demand_dollars = e.gpu_hours * p;
  e.spot_dollars = e.gpu_hours * s;
  if (in.checkpoint_save && in.checkpoint_interval) {
    e.save_overhead = *in.checkpoint_save / *in.checkpoint_interval;
  }
  const double work_hours = e.wall_hours * (1 + e.save_overhead);  // T_work
  if (in.lost_per_preemption) {
    e.lost_per_preemption = *in.lost_per_preemption;
  } else if (in.checkpoint_interval) {
    e.lost_per_preemption = *in.checkpoint_interval / 2 + in.restart;
  }
  const double inf = std::numeric_limits<double>::infinity();
  if (in.preemptions_per_hour) {
    const double rate = *in.preemptions_per_hour;
    const double loss = rate * e.lost_per_preemption.value_or(0);  // λL
    const double wall = loss >= 1 ? inf : work_hours / (1 - loss);
    e.spot_wall_hours = wall;
    e.expected_preemptions = rate * wall;
    e.lost_gpu_hours = rate * wall * e.lost_per_preemption.value_or(0) * g;
    e.spot_preempted_dollars = wall * g * s;
    if (in.checkpoint_save && rate > 0) {
      e.young_daly_interval = std::sqrt(2 * *in.checkpoint_save / rate);
    }
  }
  if (e.lost_per_preemption && *e.lost_per_preemption > 0 && p > 0) {
    const double l = *e.lost_per_preemption;
    if (s <= 0) {
      e.break_even_per_hour = 1 / l;  // free spot time: only a run that never ends costs more
      e.break_even_preemptions = inf;
    } else {
      e.break_even_per_hour = std::max(0.0, (1 - work_hours * s / (e.wall_hours * p)) / l);
      e.break_even_preemptions = std::max(0.0, (e.wall_hours * p / s - work_hours) / l);
    }
  }
  if (in.budget) {
    if (p > 0) e.budget_on_demand_flops = *in.budget / p * e.gpu_flops_per_second * 3600;
    if (s > 0) {
      const double loss =
          in.preemptions_per_hour ? *in.preemptions_per_hour * e.lost_per_preemption.value_or(0)
                                  : 0;
      e.budget_spot_flops = *in.budget / s * e.gpu_flops_per_second * 3600 *
                            std::max(0.0, 1 - loss) / (1 + e.save_overhead);
    }
  }
  return e;
}

nlohmann::ordered_json CostJson(const CostInputs& in, const CostEstimate& e) {
  nlohmann::ordered_json doc;
  doc["work"] = in.work;
  if (in.parameters > 0) doc["parameters"] = in.parameters;
  if (in.tokens > 0) doc["tokens"] = in.tokens;
  doc["flops"] = in.flops;
  nlohmann::ordered_json gpu;
  gpu["kind"] = in.gpu.name;
  gpu["description"] = in.gpu.description;
  gpu["peak_tflops"] = in.gpu.peak_tflops;
  gpu["memory_gb"] = in.gpu.memory_gb;
  gpu["price_per_hour"] = in.gpu.price;
  gpu["spot_price_per_hour"] = in.gpu.spot_price;
  doc["gpu"] = std::move(gpu);
  doc["gpus"] = in.gpus;
  doc["mfu"] = in.mfu;
  doc["gpu_flops_per_second"] = e.gpu_flops_per_second;
  doc["gpu_hours"] = e.gpu_hours;
  doc["wall_hours"] = e.wall_hours;
  doc["on_demand_dollars"] = e.on_demand_dollars;
  doc["spot_dollars"] = e.spot_dollars;
  if (in.preemptions_per_hour) doc["preemptions_per_day"] = *in.preemptions_per_hour * 24;
  Put(&doc, "checkpoint_interval_hours", in.checkpoint_interval);
  Put(&doc, "checkpoint_save_hours", in.checkpoint_save);
  if (in.restart > 0) doc["restart_hours"] = in.restart;
  Put(&doc, "lost_hours_per_preemption", e.lost_per_preemption);
  if (e.save_overhead > 0) doc["save_overhead"] = e.save_overhead;
  Put(&doc, "spot_wall_hours", e.spot_wall_hours);
  Put(&doc, "expected_preemptions", e.expected_preemptions);
  Put(&doc, "lost_gpu_hours", e.lost_gpu_hours);
  Put(&doc, "spot_preempted_dollars", e.spot_preempted_dollars);
  if (e.break_even_per_hour) doc["break_even_preemptions_per_day"] = *e.break_even_per_hour * 24;
  Put(&doc, "break_even_preemptions", e.break_even_preemptions);
  Put(&doc, "young_daly_interval_hours", e.young_daly_interval);
  Put(&doc, "budget_dollars", in.budget);
  Put(&doc, "budget_on_demand_flops", e.budget_on_demand_flops);
  Put(&doc, "budget_spot_flops", e.budget_spot_flops);
  return doc;
}

std::string FormatCost(const CostInputs& in, const CostEstimate& e, OutputFormat format) {
  if (format == OutputFormat::kJson || format == OutputFormat::kYaml) {
    return FormatJsonValue(CostJson(in, e), format);
  }
  const GpuKind& k = in.gpu;
  std::string out = absl::StrFormat(
      "work: %s%.3g FLOPs\n"
      "GPUs: %d x %s (%s, %g GB): %g TFLOP/s peak x %.3g MFU = %.4g TFLOP/s each\n"
      "prices per GPU-hour: %s on demand, %s spot\n",
      in.work.empty() ? "" : in.work + " = ", in.flops, in.gpus, k.name, k.description, k.memory_gb, k.peak_tflops, in.mfu,
      e.gpu_flops_per_second / 1e12, Price(k.price), Price(k.spot_price));
  std::vector<std::vector<std::string>> rows = {{"RUN", "GPU-HOURS", "WALL TIME", "COST"}};
  rows.push_back({"on demand", Count(e.gpu_hours), Hours(e.wall_hours),
                  Dollars(e.on_demand_dollars)});
  rows.push_back({"spot, no preemption", Count(e.gpu_hours), Hours(e.wall_hours),
                  Dollars(e.spot_dollars)});
  if (e.spot_wall_hours) {
    rows.push_back({absl::StrFormat("spot, %.3g preemptions/day", *in.preemptions_per_hour * 24),
                    std::isfinite(*e.spot_wall_hours) ? Count(*e.spot_wall_hours * in.gpus)
                                                      : "never",
                    Hours(*e.spot_wall_hours), Dollars(*e.spot_preempted_dollars)});
  }
  absl::StrAppend(&out, FormatTable(rows));
  if (e.lost_per_preemption) {
    const std::string why =
        in.lost_per_preemption
            ? "given"
            : absl::StrCat("half the ", Hours(*in.checkpoint_interval), " checkpoint interval",
                           in.restart > 0 ? absl::StrCat(" + ", Hours(in.restart), " restart")
                                          : std::string());
    absl::StrAppend(&out, "each preemption loses ", Hours(*e.lost_per_preemption), " of the run (",
                    why, ")");
    if (e.expected_preemptions && std::isfinite(*e.expected_preemptions)) {
      absl::StrAppendFormat(&out, "; %.1f expected, losing %s GPU-hours", *e.expected_preemptions,
                            Count(*e.lost_gpu_hours));
    } else if (e.expected_preemptions) {
      absl::StrAppend(&out, "; at this rate the lost work outgrows the progress: the run never "
                            "ends");
    }
    absl::StrAppend(&out, "\n");
  }
  if (e.save_overhead > 0) {
    absl::StrAppendFormat(&out, "checkpoint saves: %s every %s (%.1f %% more time on spot)\n",
                          Hours(*in.checkpoint_save), Hours(*in.checkpoint_interval),
                          100 * e.save_overhead);
  }
  if (e.break_even_per_hour) {
    if (*e.break_even_per_hour <= 0) {
      absl::StrAppend(&out, "break-even: spot costs more than on demand even without "
                            "preemptions\n");
    } else {
      absl::StrAppendFormat(&out,
                            "break-even: spot costs as much as on demand at %.3g preemptions/day "
                            "(one every %s), %s preemptions in the run\n",
                            *e.break_even_per_hour * 24, Hours(1 / *e.break_even_per_hour),
                            Count(*e.break_even_preemptions));
    }
  }
  if (e.young_daly_interval) {
    absl::StrAppendFormat(&out,
                          "Young/Daly checkpoint interval: sqrt(2 x %s save x %s MTBF) = %s\n",
                          Hours(*in.checkpoint_save), Hours(1 / *in.preemptions_per_hour),
                          Hours(*e.young_daly_interval));
  }
  if (in.budget) {
    absl::StrAppendFormat(&out, "%s buys %.3g FLOPs on demand", Dollars(*in.budget),
                          e.budget_on_demand_flops.value_or(0));
    if (e.budget_spot_flops) {
      absl::StrAppendFormat(&out, ", %.3g on spot%s", *e.budget_spot_flops,
                            in.preemptions_per_hour ? " (less the lost work and saves)" : "");
    }
    absl::StrAppend(&out, "\n");
  }
  return out;
}

absl::StatusOr<std::string> EstimateCostText(const EstimateCostFlags& flags,
                                             OutputFormat format) {
  absl::StatusOr<CostInputs> in = ResolveCostInputs(flags);
  if (!in.ok()) return in.status();
  return FormatCost(*in, EstimateCost(*in), format);
}

}  // namespace ringmaster::cli
