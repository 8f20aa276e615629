#include "cli/estimate.h"

#include <algorithm>
#include <memory>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "config/train_config.h"
#include "spec/job_spec.h"
#include "train/model_factory.h"
#include "train/trainer_mesh.h"

namespace ringmaster::cli {
namespace {

std::string MiB(int64_t bytes) {
  return absl::StrFormat("%.2f", static_cast<double>(bytes) / (1 << 20));
}

const char* OptimizerName(const train::OptimizerOptions& o) {
  if (const auto* sgd = std::get_if<train::SgdOptions>(&o)) {
    return sgd->momentum > 0 ? "sgd with momentum" : "sgd";
  }
  return std::holds_alternative<train::AdamWOptions>(o) ? "adamw" : "lamb";
}

std::string Strategies(const train::TrainConfig& c) {
  const train::FsdpConfig& f = c.fsdp;
  return absl::StrCat(
      "ZeRO-2 buckets of ", c.bucket_mb, " MiB; ZeRO-3 prefetch ", train::PrefetchName(f.prefetch),
      f.prefetch == train::FsdpConfig::Prefetch::kNone
          ? std::string()
          : absl::StrCat(" (", f.prefetch_limit, " ahead)"),
      f.reshard_after_forward ? ", reshard after forward" : ", units kept from forward to backward",
      c.model.kind == train::ModelConfig::Kind::kGpt && c.model.gpt.checkpoint_every > 0
          ? absl::StrCat(", activation checkpointing every ", c.model.gpt.checkpoint_every)
          : std::string(),
      "; reduce in ", train::PrecisionName(c.reduce_precision));
}

// The heading's job, model and training lines (the batch and strategies are the caller's).
EstimateHeading Heading(const JobSpec& spec, const train::TrainConfig& config,
                        const train::Model& model, int world) {
  EstimateHeading h;
  h.job = spec.name();
  h.model = model.Describe();
  h.parameters = model.table().parameter_count();
  h.world = world;
  h.precision = train::PrecisionName(config.precision);
  h.optimizer = OptimizerName(config.optimizer);
  return h;
}

absl::Status InSpec(const std::string& file, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat("--spec ", file, ": ", s.message()));
}

}  // namespace

namespace {

// The document's fields above its rows.
nlohmann::ordered_json HeadingJson(const EstimateHeading& h) {
  nlohmann::ordered_json doc;
  doc["job"] = h.job;
  doc["model"] = h.model;
  doc["parameters"] = h.parameters;
  doc["world"] = h.world;
  doc["precision"] = h.precision;
  doc["optimizer"] = h.optimizer;
  doc["batch"] = h.batch;
  doc["strategies"] = h.strategies;
  return doc;
}

}  // namespace

nlohmann::ordered_json MemoryPlansJson(const EstimateHeading& h,
                                       const std::vector<train::RankMemoryPlan>& plans) {
  nlohmann::ordered_json doc = HeadingJson(h);
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (const train::RankMemoryPlan& p : plans) {
    nlohmann::ordered_json row;
    row["configuration"] = p.Name();
    row["zero_stage"] = p.zero_stage;
    if (p.zero_stage == 3) row["wrap"] = train::WrapName(p.wrap);
    row["parameter_bytes"] = p.parameter_bytes;
    row["compute_copy_bytes"] = p.compute_copy_bytes;
    row["gradient_bytes"] = p.gradient_bytes;
    row["optimizer_bytes"] = p.optimizer_bytes;
    row["unit_buffer_bytes"] = p.unit_buffer_bytes;
    row["activation_bytes"] = p.activation_bytes;
    row["activation_method"] = train::ActivationMethodName(p.activation_method);
    row["total_bytes"] = p.total_bytes();
    rows.push_back(std::move(row));
  }
  doc["per_rank"] = std::move(rows);
  return doc;
}

std::string FormatMemoryPlans(const EstimateHeading& h,
                              const std::vector<train::RankMemoryPlan>& plans,
                              OutputFormat format) {
  if (format == OutputFormat::kJson || format == OutputFormat::kYaml) {
    return FormatJsonValue(MemoryPlansJson(h, plans), format);
  }
  std::vector<std::vector<std::string>> rows = {{"PER RANK (MiB)", "PARAMETERS", "GRADIENTS",
                                                 "OPTIMIZER", "UNIT BUFFERS", "ACTIVATIONS",
                                                 "TOTAL"}};
  for (const train::RankMemoryPlan& p : plans) {
    rows.push_back({p.Name(), MiB(p.parameter_bytes + p.compute_copy_bytes),
                    MiB(p.gradient_bytes), MiB(p.optimizer_bytes), MiB(p.unit_buffer_bytes),
                    MiB(p.activation_bytes), MiB(p.total_bytes())});
  }
  const bool computed = !plans.empty() &&
                        plans[0].activation_method == train::ActivationMethod::kComputed;
  return absl::StrCat(
      h.job, ": ", h.model, " (", h.parameters, " parameters) on ", h.world, " rank(s)\n",
      h.precision, ", ", h.optimizer, "; ", h.batch, "\n", h.strategies, "\n",
      FormatTable(rows),
      "PARAMETERS: the fp32 step buffer, with ZeRO-2's whole compute copy and, in bf16/fp16 at\n"
      "ZeRO-0/1, the model's rounded copy. UNIT BUFFERS: gathered units, gradients before\n"
      "their reduce-scatter and staging, at most (what the trainer plans).\n",
      computed ? "ACTIVATIONS: computed from the GPT's buffer sizes (exact; nothing run).\n"
               : "ACTIVATIONS: measured on one micro-batch.\n",
      "CPU ranks (a GPU's activations differ); train/memory_plan.h has the details.\n");
}

std::string FormatMeshPlans(const EstimateHeading& h, const std::vector<train::MeshRankPlan>& plans,
                            OutputFormat format) {
  if (format == OutputFormat::kJson || format == OutputFormat::kYaml) {
    nlohmann::ordered_json doc = HeadingJson(h);
    nlohmann::ordered_json rows = nlohmann::ordered_json::array();
    for (const train::MeshRankPlan& p : plans) {
      nlohmann::ordered_json row;
      row["pp_rank"] = p.pp_rank;
      row["tp_rank"] = p.tp_rank;
      row["elements"] = p.elements;
      row["block_elements"] = p.block_elements;
      row["parameter_bytes"] = p.parameter_bytes;
      row["compute_copy_bytes"] = p.compute_copy_bytes;
      row["gradient_bytes"] = p.gradient_bytes;
      row["optimizer_bytes"] = p.optimizer_bytes;
      row["unit_buffer_bytes"] = p.unit_buffer_bytes;
      row["activation_bytes_per_micro_batch"] = p.activation_bytes_per_micro_batch;
      row["peak_in_flight"] = p.peak_in_flight;
      row["activation_bytes"] = p.activation_bytes;
      row["total_bytes"] = p.total_bytes();
      rows.push_back(std::move(row));
    }
    doc["per_rank"] = std::move(rows);
    return FormatJsonValue(doc, format);
  }
  // ZeRO-3 over tensor-parallel shards gathers units: their column.
  const bool units = std::any_of(plans.begin(), plans.end(), [](const train::MeshRankPlan& p) {
    return p.unit_buffer_bytes > 0;
  });
  std::vector<std::vector<std::string>> rows = {{"PER RANK (MiB)", "PARAMETERS", "GRADIENTS",
                                                 "OPTIMIZER", "ACTIVATIONS", "IN FLIGHT", "TOTAL"}};
  if (units) rows[0].insert(rows[0].begin() + 4, "UNIT BUFFERS");
  for (const train::MeshRankPlan& p : plans) {
    std::vector<std::string> row = {absl::StrCat("pp ", p.pp_rank, " tp ", p.tp_rank),
                                    MiB(p.parameter_bytes + p.compute_copy_bytes),
                                    MiB(p.gradient_bytes),
                                    MiB(p.optimizer_bytes),
                                    MiB(p.activation_bytes),
                                    absl::StrFormat("%.2f", p.peak_in_flight),
                                    MiB(p.total_bytes())};
    if (units) row.insert(row.begin() + 4, MiB(p.unit_buffer_bytes));
    rows.push_back(std::move(row));
  }
  return absl::StrCat(
      h.job, ": ", h.model, " (", h.parameters, " parameters) on ", h.world, " rank(s)\n",
      h.precision, ", ", h.optimizer, "; ", h.batch, "\n", h.strategies, "\n", FormatTable(rows),
      "A row per (pp, tp) coordinate; its data-parallel replicas hold the same. PARAMETERS:\n"
      "the stages' fp32 buffer and, in bf16/fp16, their rounded copy.\n",
      units ? "Under ZeRO-3 each rank holds 1/dp of its shard's state, and UNIT BUFFERS its\n"
              "gathered units and unreduced gradients at most.\n"
            : "",
      "ACTIVATIONS: one micro-batch through the rank's stages, computed from their buffer\n"
      "sizes (exact; nothing run), times the schedule's peak of micro-batches in flight (IN\n"
      "FLIGHT, simulated; under zero_bubble with what each keeps for its W). CPU ranks.\n");
}

absl::StatusOr<std::string> EstimateSpecMemory(const EstimateSpecFlags& flags,
                                               OutputFormat format) {
  const std::string& file = flags.spec_file;
  absl::StatusOr<JobSpec> spec = spec::LoadJobSpecFile(file, flags.overrides);
  if (!spec.ok()) return InSpec(file, spec.status());
  absl::StatusOr<train::TrainConfig> config = config::TrainConfigFromSpec(*spec);
  if (!config.ok()) return InSpec(file, config.status());
  const int world = flags.world > 0 ? flags.world : std::max(1, spec->elastic().min_ranks());
  absl::StatusOr<std::unique_ptr<train::Model>> model =
      train::CreateModel(config->model, train::DescribeJobData(*config));
  if (!model.ok()) return InSpec(file, model.status());
  if (train::HasMesh(*config)) {
    absl::StatusOr<std::vector<train::MeshRankPlan>> plans = train::PlanMeshMemory(*config, world);
    if (!plans.ok()) return InSpec(file, plans.status());
    const train::MeshConfig& mesh = config->mesh;
    const int dp = world / (mesh.tp * mesh.pp);
    absl::StatusOr<train::data::BatchPlan> batches = train::PlanPipelineBatches(*config, dp);
    if (!batches.ok()) return InSpec(file, batches.status());
    EstimateHeading h = Heading(*spec, *config, **model, world);
    h.batch = absl::StrCat(batches->DebugString(), " (W: the data-parallel replicas)");
    absl::StatusOr<train::pipeline::ScheduleOptions> schedule = train::MeshSchedule(*config, dp);
    if (!schedule.ok()) return InSpec(file, schedule.status());
    // Under ZeRO-3 (tp only) each shard runs as a whole model, without a schedule.
    h.strategies =
        config->zero_stage == 3
            ? absl::StrCat("mesh pp ", mesh.pp, " x dp ", dp, " x tp ", mesh.tp,
                           "; each tensor-parallel shard fully sharded along dp (ZeRO-3, wrap ",
                           train::WrapName(config->fsdp.wrap), ")")
            : absl::StrCat("mesh pp ", mesh.pp, " x dp ", dp, " x tp ", mesh.tp, "; ",
                           train::pipeline::ScheduleName(schedule->kind), " over ", schedule->ranks,
                           " stage-rank(s), ", schedule->micro_batches, " micro-batches",
                           schedule->virtual_stages > 1
                               ? absl::StrCat(", ", schedule->virtual_stages, " virtual stages")
                               : std::string(),
                           "; ZeRO-", config->zero_stage, " along dp");
    return FormatMeshPlans(h, *plans, format);
  }
  absl::StatusOr<train::data::BatchPlan> batches = train::PlanRankBatches(*config, world);
  if (!batches.ok()) return InSpec(file, batches.status());
  absl::StatusOr<std::vector<train::RankMemoryPlan>> plans =
      train::PlanEveryConfiguration(*config, world);
  if (!plans.ok()) return InSpec(file, plans.status());
  EstimateHeading h = Heading(*spec, *config, **model, world);
  h.batch = batches->DebugString();
  h.strategies = absl::StrCat(Strategies(*config), "; unit buffers for ",
                              train::PlannedDevice(*config) == train::TrainConfig::Device::kCpu
                                  ? "CPU ranks"
                                  : "GPU ranks",
                              config->device == train::TrainConfig::Device::kAuto
                                  ? " (device auto, as the trainer resolves it here)"
                                  : "");
  return FormatMemoryPlans(h, *plans, format);
}

}  // namespace ringmaster::cli
