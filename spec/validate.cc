#include "spec/validate.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "google/protobuf/repeated_field.h"
#include "spec/defaults.h"
#include "spec/job_spec.h"

namespace ringmaster::spec {
namespace {

// Collects FieldErrors; the range checks say the range and the value found.
class Checker {
 public:
  void Fail(std::string path, std::string message) {
    errors_.push_back(FieldError{"", std::move(path), std::move(message)});
  }

  // Unless `ok`: "<path>: must be <want>, got <value>".
  template <typename T>
  void Expect(bool ok, std::string path, absl::string_view want, T value) {
    if (!ok) Fail(std::move(path), absl::StrCat("must be ", want, ", got ", Text(value)));
  }

  // NaN fails every check: the comparisons are written so.
  template <typename T>
  void Positive(std::string path, T value) {
    Expect(value > 0, std::move(path), "> 0", value);
  }

  template <typename T>
  void NonNegative(std::string path, T value) {
    Expect(value >= 0, std::move(path), ">= 0", value);
  }

  // A value with no default: 0 means it was not written.
  template <typename T>
  void Required(std::string path, T value, absl::string_view what) {
    if (value == 0) {
      Fail(std::move(path), absl::StrCat("required: ", what));
    } else {
      Positive(std::move(path), value);
    }
  }

  // In [0, 1), the range of a moment's decay (beta, momentum).
  void Decay(std::string path, double value) {
    Expect(value >= 0 && value < 1, std::move(path), "in [0, 1)", value);
  }

  std::vector<FieldError> Take() { return std::move(errors_); }

 private:
  template <typename T>
  static std::string Text(T value) {
    if constexpr (std::is_floating_point_v<T>) {
      return FormatNumber(value);
    } else {
      return absl::StrCat(value);
    }
  }

  std::vector<FieldError> errors_;
};

void CheckName(const JobSpec& spec, Checker* check) {
  const std::string& name = spec.name();
  if (name.empty()) {
    check->Fail("name", "required");
    return;
  }
  if (IsValidJobName(name)) return;
  const bool allowed = std::all_of(name.begin(), name.end(), [](char c) {
    return absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-';
  });
  if (!allowed || name == "." || name == "..") {
    check->Fail("name", absl::StrCat("must be letters, digits, '.', '_' and '-' (it names ",
                                     "directories), got \"", name.substr(0, 200),
                                     name.size() > 200 ? "...\"" : "\""));
  } else if (name.size() > kMaxJobNameLength) {
    // It is the job's id: in every trainer's call, its files' names and its checkpoints'.
    check->Fail("name", absl::StrCat("must be at most ", kMaxJobNameLength,
                                     " characters (it is the job's id), got ", name.size()));
  }
}

void CheckLength(const JobSpec& spec, Checker* check) {
  switch (spec.length_case()) {
    case JobSpec::kSteps:
      check->Positive("steps", spec.steps());
      break;
    case JobSpec::kEpochs:
      check->Positive("epochs", spec.epochs());
      break;
    case JobSpec::LENGTH_NOT_SET:
      check->Fail("steps", "required: set steps or epochs");
      break;
  }
}

// A list of layer sizes: at least one, each > 0.
void CheckSizes(const std::string& path, const google::protobuf::RepeatedField<int64_t>& sizes,
                Checker* check) {
  if (sizes.empty()) check->Fail(path, "required: at least one size");
  for (int i = 0; i < sizes.size(); ++i) {
    check->Positive(absl::StrCat(path, "[", i, "]"), sizes.Get(i));
  }
}

// The GPT's fields of model.gpt or model.gpt2 (null for another model).
const GptSpec* GptFieldsOf(const ModelSpec& model) {
  if (model.has_gpt()) return &model.gpt();
  if (model.has_gpt2()) return &model.gpt2();
  return nullptr;
}

// The fields model.gpt and model.gpt2 share; `path` is "model.gpt" or "model.gpt2".
void CheckGptShape(const std::string& path, const GptSpec& gpt, Checker* check) {
  check->Positive(path + ".layers", gpt.layers());
  check->Positive(path + ".heads", gpt.heads());
  check->Positive(path + ".width", gpt.width());
  check->Positive(path + ".context", gpt.context());
  if (gpt.heads() > 0) {
    check->Expect(gpt.width() % gpt.heads() == 0, path + ".width",
                  absl::StrCat("divisible by ", path, ".heads (", gpt.heads(), ")"), gpt.width());
  }
}

void CheckModel(const JobSpec& spec, Checker* check) {
  const ModelSpec& model = spec.model();
  switch (model.kind_case()) {
    case ModelSpec::kMlp: {
      const MlpSpec& mlp = model.mlp();
      CheckSizes("model.mlp.hidden", mlp.hidden(), check);
      if (mlp.activation() == MlpSpec::ACTIVATION_UNSPECIFIED) {
        check->Fail("model.mlp.activation", "required");
      }
      break;
    }
    case ModelSpec::kCnn: {
      const CnnSpec& cnn = model.cnn();
      CheckSizes("model.cnn.channels", cnn.channels(), check);
      check->Positive("model.cnn.fc", cnn.fc());
      break;
    }
    case ModelSpec::kGpt: {
      const GptSpec& gpt = model.gpt();
      CheckGptShape("model.gpt", gpt, check);
      check->Expect(gpt.vocab() >= 256, "model.gpt.vocab", ">= 256 (byte-level text)", gpt.vocab());
      break;
    }
    case ModelSpec::kGpt2: {
      const GptSpec& gpt = model.gpt2();
      CheckGptShape("model.gpt2", gpt, check);
      if (gpt.has_tied_head() && !gpt.tied_head()) {
        check->Fail("model.gpt2.tied_head",
                    "GPT-2's LM head is tied to wte; leave it unset (or use model.gpt with "
                    "tied_head false for an untied head)");
      }
      if (gpt.has_vocab()) {
        check->Fail("model.gpt2.vocab",
                    absl::StrCat("GPT-2's vocabulary is fixed at ", kGpt2Vocab,
                                 " tokens; leave it unset (or use model.gpt for another), got ",
                                 gpt.vocab()));
      }
      break;
    }
    case ModelSpec::kResnet18: {
      const int64_t width = model.resnet18().width();
      check->Expect(width >= 1 && width <= 1024, "model.resnet18.width", "in [1, 1024]", width);
      // Its BatchNorm running statistics are updated in every forward, in whole flat buffers,
      // in fp32.
      const int32_t zero = spec.parallelism().zero_stage();
      if (zero >= 2) {
        check->Fail("parallelism.zero_stage",
                    absl::StrCat("model.resnet18 needs zero_stage 0 or 1 (its BatchNorm running "
                                 "statistics live in whole flat buffers), got ",
                                 zero));
      }
      if (spec.precision().compute() == PrecisionSpec::DTYPE_BF16 ||
          spec.precision().compute() == PrecisionSpec::DTYPE_FP16) {
        check->Fail("precision.compute", "model.resnet18 computes in fp32 only; use fp32");
      }
      break;
    }
    case ModelSpec::KIND_NOT_SET:
      check->Fail("model", "required: one of mlp, cnn, gpt, gpt2, resnet18");
      break;
  }
}

// The chosen model's field name ("mlp", "cnn", "gpt"); the model must be set.
const std::string& ModelName(const ModelSpec& model) {
  // A oneof's case is its member's field number.
  return ModelSpec::descriptor()->FindFieldByNumber(model.kind_case())->name();
}

void CheckData(const JobSpec& spec, Checker* check) {
  const DataSpec& data = spec.data();
  switch (data.source_case()) {
    case DataSpec::kFashionMnist:
      if (data.fashion_mnist().dir().empty()) check->Fail("data.fashion_mnist.dir", "required");
      break;
    case DataSpec::kText:
      if (data.text().path().empty()) check->Fail("data.text.path", "required");
      break;
    case DataSpec::kTokens:
      if (data.tokens().train().empty()) {
        check->Fail("data.tokens.train",
                    "required: a token file (make one with `ringctl data prepare`)");
      }
      break;
    case DataSpec::kMnist:
      if (data.mnist().dir().empty()) check->Fail("data.mnist.dir", "required");
      break;
    case DataSpec::SOURCE_NOT_SET:
      check->Fail("data", "required: one of fashion_mnist, mnist, text, tokens");
      return;
  }
  check->NonNegative("data.eval_every_steps", data.eval_every_steps());
  check->NonNegative("data.eval_samples", data.eval_samples());
  if (data.eval_every_steps() > 0) {
    if (data.has_text()) {
      check->Fail("data.eval_every_steps",
                  "needs evaluation data, which data.text has none of; use data.tokens with a "
                  "validation file (`ringctl data prepare --validation_fraction`)");
    } else if (data.has_tokens() && data.tokens().validation().empty()) {
      check->Fail("data.eval_every_steps",
                  "needs data.tokens.validation (`ringctl data prepare --validation_fraction`)");
    }
  }
  // The language model reads text or tokens; the classifiers read labelled images.
  const ModelSpec::KindCase model = spec.model().kind_case();
  if (model == ModelSpec::KIND_NOT_SET) return;
  const bool wants_text = model == ModelSpec::kGpt || model == ModelSpec::kGpt2;
  const bool has_text = data.has_text() || data.has_tokens();
  if (wants_text != has_text) {
    const std::string& model_name = ModelName(spec.model());
    const std::string& data_name =
        DataSpec::descriptor()->FindFieldByNumber(data.source_case())->name();
    check->Fail("data",
                absl::StrCat("model.", model_name, " needs data.",
                             wants_text ? "text or data.tokens" : "fashion_mnist or data.mnist",
                             ", got data.", data_name));
  }
}

void CheckAdam(const std::string& path, const AdamSpec& adam, Checker* check) {
  check->Decay(path + ".beta1", adam.beta1());
  check->Decay(path + ".beta2", adam.beta2());
  check->Positive(path + ".eps", adam.eps());
}

void CheckOptimizer(const JobSpec& spec, Checker* check) {
  const OptimizerSpec& optimizer = spec.optimizer();
  switch (optimizer.kind_case()) {
    case OptimizerSpec::kSgd:
      check->Decay("optimizer.sgd.momentum", optimizer.sgd().momentum());
      if (optimizer.sgd().nesterov() && !(optimizer.sgd().momentum() > 0)) {
        check->Fail("optimizer.sgd.nesterov", "needs optimizer.sgd.momentum > 0");
      }
      break;
    case OptimizerSpec::kAdamw:
      CheckAdam("optimizer.adamw", optimizer.adamw(), check);
      break;
    case OptimizerSpec::kLamb:
      CheckAdam("optimizer.lamb", optimizer.lamb(), check);
      break;
    case OptimizerSpec::KIND_NOT_SET:
      check->Fail("optimizer", "required: one of sgd, adamw, lamb");
      break;
  }
  check->Required("optimizer.lr", optimizer.lr(), "a learning rate > 0");
  check->NonNegative("optimizer.weight_decay", optimizer.weight_decay());
  check->NonNegative("optimizer.clip_grad_norm", optimizer.clip_grad_norm());
}

void CheckSchedule(const JobSpec& spec, Checker* check) {
  const ScheduleSpec& schedule = spec.schedule();
  check->NonNegative("schedule.base_batch", schedule.base_batch());
  // A warm-up longer than the run is clamped to it by the trainer, which says so (a short
  // smoke run of a spec written for a long one).
  check->NonNegative("schedule.warmup_steps", schedule.warmup_steps());
  if (schedule.decay() == ScheduleSpec::DECAY_UNSPECIFIED) {
    check->Fail("schedule.decay", "required");
  }
  const double min_lr_ratio = schedule.min_lr_ratio();
  check->Expect(min_lr_ratio >= 0 && min_lr_ratio <= 1, "schedule.min_lr_ratio", "in [0, 1]",
                min_lr_ratio);
}

void CheckBatch(const JobSpec& spec, Checker* check) {
  const BatchSpec& batch = spec.batch();
  check->Required("batch.global", batch.global(), "samples per step over all ranks, > 0");
  check->NonNegative("batch.micro_max", batch.micro_max());
  check->NonNegative("batch.accumulation", batch.accumulation());
  if (batch.global() > 0) {
    check->Expect(batch.accumulation() <= batch.global(), "batch.accumulation",
                  absl::StrCat("<= batch.global (", batch.global(), ")"), batch.accumulation());
  }
}

// precision.reduce: the reduce-scatter of ZeRO-2 and ZeRO-3, in fp32 or bf16.
void CheckReduce(const JobSpec& spec, Checker* check) {
  const int32_t zero_stage = spec.parallelism().zero_stage();
  switch (spec.precision().reduce()) {
    case PrecisionSpec::DTYPE_UNSPECIFIED:
      if (zero_stage == 2 || zero_stage == 3) check->Fail("precision.reduce", "required");
      break;
    case PrecisionSpec::DTYPE_FP16:
      check->Fail("precision.reduce",
                  "fp16 is refused: a sum of gradients overflows fp16 without a loss scale; "
                  "use bf16 (fp32's range) or fp32");
      break;
    case PrecisionSpec::DTYPE_BF16:
      if (zero_stage != 2 && zero_stage != 3) {
        check->Fail("precision.reduce",
                    absl::StrCat("bf16 applies to parallelism.zero_stage 2 or 3 (their gradient "
                                 "reduce-scatter), got zero_stage ",
                                 zero_stage, "; use fp32 or zero_stage 2 or 3"));
      }
      break;
    default:
      break;
  }
}

void CheckPrecision(const JobSpec& spec, Checker* check) {
  const PrecisionSpec& precision = spec.precision();
  if (precision.compute() == PrecisionSpec::DTYPE_UNSPECIFIED) {
    check->Fail("precision.compute", "required");
  }
  CheckReduce(spec, check);
  if (!precision.has_loss_scale()) return;
  const LossScaleSpec& scale = precision.loss_scale();
  check->Positive("precision.loss_scale.initial", scale.initial());
  if (scale.mode() == LossScaleSpec::MODE_FIXED) return;
  check->Positive("precision.loss_scale.growth_interval", scale.growth_interval());
  check->Expect(scale.growth_factor() > 1, "precision.loss_scale.growth_factor", "> 1",
                scale.growth_factor());
  const double backoff = scale.backoff_factor();
  check->Expect(backoff > 0 && backoff < 1, "precision.loss_scale.backoff_factor", "in (0, 1)",
                backoff);
}

// A section written where it does not apply: `why` for each field written in it (at its
// path, so that the loader names where it was written), or for the section when it is empty.
void FailEveryWrittenField(const std::string& path, const google::protobuf::Message& section,
                           const std::string& why, Checker* check) {
  std::vector<const google::protobuf::FieldDescriptor*> written;
  section.GetReflection()->ListFields(section, &written);
  if (written.empty()) check->Fail(path, why);
  for (const google::protobuf::FieldDescriptor* field : written) {
    check->Fail(absl::StrCat(path, ".", field->name()), why);
  }
}

// parallelism.fsdp: ZeRO-3's units and prefetch; under another stage, not written at all.
void CheckFsdp(const ParallelismSpec& parallelism, Checker* check) {
  const FsdpSpec& fsdp = parallelism.fsdp();
  if (parallelism.zero_stage() != 3) {
    if (!parallelism.has_fsdp()) return;
    FailEveryWrittenField("parallelism.fsdp", fsdp,
                          absl::StrCat("applies to parallelism.zero_stage: 3 only, got zero_stage ",
                                       parallelism.zero_stage()),
                          check);
    return;
  }
  if (fsdp.wrap() == FsdpSpec::WRAP_UNSPECIFIED) check->Fail("parallelism.fsdp.wrap", "required");
  if (fsdp.prefetch() == FsdpSpec::PREFETCH_UNSPECIFIED) {
    check->Fail("parallelism.fsdp.prefetch", "required");
  }
  const int32_t limit = fsdp.prefetch_limit();
  check->Expect(limit >= 1 && limit <= kMaxFsdpPrefetchLimit, "parallelism.fsdp.prefetch_limit",
                absl::StrCat("in [1, ", kMaxFsdpPrefetchLimit, "] (all-gathers in flight)"), limit);
}

// parallelism.pipeline: how mesh.pp > 1 runs; with pp 1, not written at all.
void CheckPipeline(const JobSpec& spec, Checker* check) {
  const ParallelismSpec& parallelism = spec.parallelism();
  const int32_t pp = parallelism.mesh().pp();
  if (pp < 1) return;  // mesh.pp's own error
  const PipelineSpec& pipeline = parallelism.pipeline();
  if (pp == 1) {
    if (!parallelism.has_pipeline()) return;
    FailEveryWrittenField("parallelism.pipeline", pipeline,
                          "needs parallelism.mesh.pp > 1 (pipeline stages), got mesh.pp 1; set "
                          "mesh.pp or remove parallelism.pipeline",
                          check);
    return;
  }
  const PipelineSpec::Schedule schedule = pipeline.schedule();
  if (schedule == PipelineSpec::SCHEDULE_UNSPECIFIED) {
    check->Fail("parallelism.pipeline.schedule", "required");
  }
  if (spec.batch().accumulation() > 0) {
    check->Fail("batch.accumulation",
                absl::StrCat("does not apply with parallelism.mesh.pp ", pp,
                             ": parallelism.pipeline.micro_batches cuts each data-parallel "
                             "replica's share of the batch; remove batch.accumulation"));
  }
  const int32_t micro_batches = pipeline.micro_batches();
  check->Expect(micro_batches >= 1, "parallelism.pipeline.micro_batches", ">= 1", micro_batches);
  const int64_t global = spec.batch().global();
  if (micro_batches >= 1 && global > 0) {
    check->Expect(micro_batches <= global, "parallelism.pipeline.micro_batches",
                  absl::StrCat("<= batch.global (", global,
                               ") (each micro-batch holds at least one sample)"),
                  micro_batches);
  }
  const int32_t virtual_stages = pipeline.virtual_stages();
  check->Expect(virtual_stages >= 1, "parallelism.pipeline.virtual_stages",
                ">= 1 (1: one model chunk per rank)", virtual_stages);
  const bool interleaved = schedule == PipelineSpec::SCHEDULE_INTERLEAVED_1F1B;
  if (virtual_stages > 1 && !interleaved && schedule != PipelineSpec::SCHEDULE_UNSPECIFIED) {
    check->Fail("parallelism.pipeline.virtual_stages",
                absl::StrCat("> 1 applies to schedule interleaved_1f1b only, got ", virtual_stages,
                             " with schedule ",
                             EnumValueYamlName(*PipelineSpec::Schedule_descriptor()
                                                    ->FindValueByNumber(schedule)),
                             "; use schedule interleaved_1f1b or virtual_stages 1"));
  }
  if (interleaved && virtual_stages == 1) {
    check->Fail("parallelism.pipeline.virtual_stages",
                "must be >= 2 under schedule interleaved_1f1b (model chunks per rank; with 1 it "
                "is 1f1b), got 1; set virtual_stages 2 (its default) or more, or schedule 1f1b");
  }
  if (interleaved && micro_batches >= 1) {
    check->Expect(micro_batches % pp == 0, "parallelism.pipeline.micro_batches",
                  absl::StrCat("a multiple of parallelism.mesh.pp (", pp,
                               ") under schedule interleaved_1f1b"),
                  micro_batches);
  }
}

// parallelism.mesh: the checks that need no world size (the world a multiple of tp · pp is
// the coordinator's and the trainer's check).
void CheckMesh(const JobSpec& spec, Checker* check) {
  const ParallelismSpec& parallelism = spec.parallelism();
  const int32_t tp = parallelism.mesh().tp();
  const int32_t pp = parallelism.mesh().pp();
  check->Expect(tp >= 1, "parallelism.mesh.tp", ">= 1 (1: no tensor parallelism)", tp);
  check->Expect(pp >= 1, "parallelism.mesh.pp", ">= 1 (1: no pipeline parallelism)", pp);
  CheckPipeline(spec, check);
  if (tp <= 1 && pp <= 1) return;

  const int32_t zero_stage = parallelism.zero_stage();
  if (zero_stage == 3 && pp > 1) {
    check->Fail("parallelism.zero_stage",
                absl::StrCat("ZeRO-3 composes with data and tensor parallelism only in this "
                             "version, got mesh tp ",
                             tp, ", pp ", pp,
                             " (a rank's stages keep their whole parameters through the "
                             "pipeline's step, its micro-batches in flight); use zero_stage 0, 1 "
                             "or 2, or ZeRO-3 with mesh pp 1"));
  }
  if (zero_stage == 2 && spec.precision().reduce() == PrecisionSpec::DTYPE_BF16) {
    check->Fail("precision.reduce",
                absl::StrCat("bf16 applies to ZeRO-2/3 without a mesh, got mesh tp ", tp, ", pp ",
                             pp, " (the mesh's reduce-scatter is in fp32); use fp32"));
  }
  const ModelSpec& model = spec.model();
  if (model.kind_case() == ModelSpec::KIND_NOT_SET) return;  // model's own error
  const GptSpec* fields = GptFieldsOf(model);
  if (fields == nullptr) {
    const std::string got = absl::StrCat("got model.", ModelName(model));
    if (tp > 1) {
      check->Fail(
          "parallelism.mesh.tp",
          absl::StrCat("tensor parallelism (tp ", tp,
                       ") applies to model.gpt and model.gpt2 only, ", got, "; use tp 1 or a GPT"));
    }
    if (pp > 1) {
      check->Fail(
          "parallelism.mesh.pp",
          absl::StrCat("pipeline parallelism (pp ", pp,
                       ") applies to model.gpt and model.gpt2 only, ", got, "; use pp 1 or a GPT"));
    }
    return;
  }
  const GptSpec& gpt = *fields;
  const std::string path = absl::StrCat("model.", ModelName(model));
  if (tp > 1 && gpt.heads() > 0) {
    check->Expect(gpt.heads() % tp == 0, "parallelism.mesh.tp",
                  absl::StrCat("a divisor of ", path, ".heads (", gpt.heads(),
                               ") (each rank computes whole heads)"),
                  tp);
  }
  if (pp > 1 && gpt.layers() > 0) {
    // Each model stage (pp ranks × virtual_stages chunks each) holds at least one block.
    const int64_t virtual_stages = std::max(parallelism.pipeline().virtual_stages(), 1);
    const int64_t stages = int64_t{pp} * virtual_stages;
    if (stages <= gpt.layers()) return;
    if (virtual_stages == 1) {
      check->Expect(false, "parallelism.mesh.pp",
                    absl::StrCat("<= ", path, ".layers (", gpt.layers(),
                                 ") (each stage holds at least one block)"),
                    pp);
    } else {
      check->Fail(
          "parallelism.pipeline.virtual_stages",
          absl::StrCat("mesh.pp × virtual_stages must be <= ", path, ".layers (", gpt.layers(),
                       ") (each stage holds at least one block), got ", pp, " × ", virtual_stages,
                       " = ", stages, "; use fewer virtual stages or more layers"));
    }
  }
}

void CheckParallelism(const JobSpec& spec, Checker* check) {
  const ParallelismSpec& parallelism = spec.parallelism();
  const int32_t zero_stage = parallelism.zero_stage();
  check->Expect(zero_stage >= 0 && zero_stage <= 3, "parallelism.zero_stage", "0, 1, 2 or 3",
                zero_stage);
  CheckFsdp(parallelism, check);
  CheckMesh(spec, check);
  check->Positive("parallelism.bucket_mb", parallelism.bucket_mb());
  check->NonNegative("parallelism.threads", parallelism.threads());
  const int32_t every = parallelism.activation_checkpointing_every();
  check->NonNegative("parallelism.activation_checkpointing_every", every);
  const GptSpec* gpt = GptFieldsOf(spec.model());
  if (every > 0 && gpt == nullptr) {
    check->Fail("parallelism.activation_checkpointing_every",
                "applies to model.gpt and model.gpt2 only");
  } else if (every > 0) {
    check->Expect(
        every <= gpt->layers(), "parallelism.activation_checkpointing_every",
        absl::StrCat("<= model.", ModelName(spec.model()), ".layers (", gpt->layers(), ")"), every);
  }
}

void CheckCheckpoint(const JobSpec& spec, Checker* check) {
  const CheckpointSpec& checkpoint = spec.checkpoint();
  check->NonNegative("checkpoint.every_steps", checkpoint.every_steps());
  check->NonNegative("checkpoint.every_seconds", checkpoint.every_seconds());
  check->NonNegative("checkpoint.keep_every", checkpoint.keep_every());
  check->NonNegative("checkpoint.preemption_rate_per_hour", checkpoint.preemption_rate_per_hour());
  if (!checkpoint.every().empty() && checkpoint.every() != "auto") {
    check->Fail("checkpoint.every",
                absl::StrCat("must be auto (an interval from the measured save cost and the "
                             "preemption rate), got \"", checkpoint.every(),
                             "\"; for a fixed interval set checkpoint.every_steps or "
                             "checkpoint.every_seconds"));
  }
  if (checkpoint.preemption_rate_per_hour() > 0 && checkpoint.every() != "auto") {
    check->Fail("checkpoint.preemption_rate_per_hour",
                "goes with checkpoint.every: auto (the rate that sets its interval)");
  }
  if (checkpoint.dir().empty()) {
    if (checkpoint.every_steps() > 0 || checkpoint.every_seconds() > 0 ||
        !checkpoint.every().empty()) {
      check->Fail("checkpoint.dir",
                  checkpoint.every().empty()
                      ? "required when checkpoint.every_steps or checkpoint.every_seconds is set"
                      : "required when checkpoint.every is set");
    }
    return;
  }
  check->Positive("checkpoint.keep_last", checkpoint.keep_last());
  check->Positive("checkpoint.drain_grace_seconds", checkpoint.drain_grace_seconds());
  if (checkpoint.on_busy() == CheckpointSpec::ON_BUSY_UNSPECIFIED) {
    check->Fail("checkpoint.on_busy", "required");
  }
  if (checkpoint.on_failure() == CheckpointSpec::ON_FAILURE_UNSPECIFIED) {
    check->Fail("checkpoint.on_failure", "required (continue or fail)");
  }
}

void CheckResume(const JobSpec& spec, Checker* check) {
  absl::StatusOr<ResumePoint> resume = ParseResume(spec.resume());
  if (!resume.ok()) {
    check->Fail("resume", std::string(resume.status().message()));
  } else if (resume->kind == ResumePoint::Kind::kStep && spec.checkpoint().dir().empty()) {
    check->Fail("resume",
                absl::StrCat("resuming from step ", resume->step, " needs checkpoint.dir"));
  } else if (resume->kind == ResumePoint::Kind::kExtend && spec.checkpoint().dir().empty()) {
    check->Fail("resume", "extend (train a job longer from its checkpoint) needs checkpoint.dir");
  }
}

void CheckMetrics(const JobSpec& spec, Checker* check) {
  const MetricsSpec& metrics = spec.metrics();
  if (!metrics.tensorboard().empty() && metrics.tensorboard() == metrics.jsonl()) {
    check->Fail("metrics.tensorboard",
                "is metrics.jsonl's path; give the event files a directory of their own");
  }
}

// command.preload: module names, for a python SCRIPT command.
void CheckPreload(const CommandSpec& command, Checker* check) {
  if (!IsPythonScriptArgv({command.argv().begin(), command.argv().end()})) {
    check->Fail("command.preload", "needs command.argv of the form [python3, SCRIPT, ARGS...] "
                                   "(a warm interpreter runs SCRIPT); remove command.preload or "
                                   "run the script with python directly");
  }
  for (int i = 0; i < command.preload_size(); ++i) {
    const std::vector<absl::string_view> parts = absl::StrSplit(command.preload(i), '.');
    const bool ok = std::all_of(parts.begin(), parts.end(), [](absl::string_view part) {
      return !part.empty() && !absl::ascii_isdigit(part[0]) &&
             std::all_of(part.begin(), part.end(),
                         [](char c) { return absl::ascii_isalnum(c) || c == '_'; });
    });
    if (!ok) {
      check->Fail(absl::StrCat("command.preload[", i, "]"),
                  absl::StrCat("'", command.preload(i), "' is not a Python module name "
                               "(e.g. torch, torch.distributed)"));
    }
  }
}

// A command job: the program to run, and none of the built-in trainer's sections.
void CheckCommand(const JobSpec& spec, Checker* check) {
  const CommandSpec& command = spec.command();
  if (command.argv().empty()) {
    check->Fail("command.argv", "required: the program and its arguments, e.g. [python3, train.py]");
  } else if (command.argv(0).empty()) {
    check->Fail("command.argv[0]", "must name the program to run, got an empty string");
  }
  for (const auto& [name, value] : command.env()) {
    if (IsReservedCommandEnvName(name)) {
      check->Fail(absl::StrCat("command.env.", name),
                  "is set by ringmaster for every rank (torchrun's worker environment and "
                  "RINGMASTER_*); remove it from command.env");
    } else if (name.empty() || name.find('=') != std::string::npos) {
      check->Fail(absl::StrCat("command.env.", name),
                  "must be a variable name without '=' and not empty");
    }
  }
  check->Expect(command.stop_grace_s() > 0 && command.stop_grace_s() <= 3600,
                "command.stop_grace_s", "in (0, 3600] seconds", command.stop_grace_s());
  if (!command.preload().empty()) CheckPreload(command, check);
  // The built-in trainer's sections mean nothing to the user's program.
  std::vector<std::string> built_in;
  for (const char* section : {"model", "data", "optimizer", "schedule", "batch", "precision",
                              "parallelism", "diagnostics"}) {
    const auto* field = JobSpec::descriptor()->FindFieldByName(section);
    if (spec.GetReflection()->HasField(spec, field)) built_in.push_back(section);
  }
  if (spec.length_case() == JobSpec::kSteps) built_in.push_back("steps");
  if (spec.length_case() == JobSpec::kEpochs) built_in.push_back("epochs");
  if (!spec.init_from().empty()) built_in.push_back("init_from");
  for (const std::string& section : built_in) {
    check->Fail(section, "is a built-in model's setting; a job with command runs its own "
                         "program: remove " + section + " or the command section");
  }
}

void CheckRest(const JobSpec& spec, Checker* check) {
  if (spec.backend() == JobSpec::BACKEND_UNSPECIFIED) check->Fail("backend", "required");
  if (spec.device() == JobSpec::DEVICE_UNSPECIFIED) check->Fail("device", "required");
  check->NonNegative("diagnostics.fingerprint_every", spec.diagnostics().fingerprint_every());
  check->NonNegative("diagnostics.log_every", spec.diagnostics().log_every());
  const ElasticSpec& elastic = spec.elastic();
  check->Positive("elastic.min_ranks", elastic.min_ranks());
  check->NonNegative("elastic.max_ranks", elastic.max_ranks());
  check->NonNegative("elastic.restart_budget", elastic.restart_budget());
  if (elastic.max_ranks() > 0) {
    check->Expect(elastic.max_ranks() >= elastic.min_ranks(), "elastic.max_ranks",
                  absl::StrCat(">= elastic.min_ranks (", elastic.min_ranks(), ") or 0 (no limit)"),
                  elastic.max_ranks());
  }
  // At most 1 PiB a rank: a bigger number is a typo (and would overflow as bytes).
  check->Expect(spec.resources().memory_per_rank_mib() >= 0 &&
                    spec.resources().memory_per_rank_mib() <= (int64_t{1} << 30),
                "resources.memory_per_rank_mib", "between 0 (not stated) and 2^30 MiB",
                spec.resources().memory_per_rank_mib());
}

// What YAML cannot write but a raw RPC can: a float or double that is not finite (inf, NaN),
// an enum number with no name (the wire keeps unknown values). Every field set anywhere in
// the message, so a new field is covered without a line here.
void CheckRepresentable(const google::protobuf::Message& message, const std::string& prefix,
                        Checker* check) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* reflection = message.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  reflection->ListFields(message, &fields);
  for (const FieldDescriptor* field : fields) {
    const std::string name = prefix.empty() ? field->name() : prefix + "." + field->name();
    const int count = field->is_repeated() ? reflection->FieldSize(message, field) : 1;
    for (int i = 0; i < count; ++i) {
      const std::string path = field->is_repeated() ? absl::StrCat(name, "[", i, "]") : name;
      const bool repeated = field->is_repeated();
      switch (field->cpp_type()) {
        case FieldDescriptor::CPPTYPE_DOUBLE:
        case FieldDescriptor::CPPTYPE_FLOAT: {
          const double value =
              field->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE
                  ? (repeated ? reflection->GetRepeatedDouble(message, field, i)
                              : reflection->GetDouble(message, field))
                  : (repeated ? reflection->GetRepeatedFloat(message, field, i)
                              : reflection->GetFloat(message, field));
          check->Expect(std::isfinite(value), path, "a finite number", value);
          break;
        }
        case FieldDescriptor::CPPTYPE_ENUM: {
          const int value = repeated ? reflection->GetRepeatedEnumValue(message, field, i)
                                     : reflection->GetEnumValue(message, field);
          if (field->enum_type()->FindValueByNumber(value) == nullptr) {
            std::vector<std::string> names;
            for (int v = 0; v < field->enum_type()->value_count(); ++v) {
              const auto& known = *field->enum_type()->value(v);
              if (known.number() != 0) names.push_back(EnumValueYamlName(known));
            }
            check->Fail(path, absl::StrCat("must be one of ", absl::StrJoin(names, ", "),
                                           ", got the number ", value));
          }
          break;
        }
        case FieldDescriptor::CPPTYPE_MESSAGE:
          CheckRepresentable(repeated ? reflection->GetRepeatedMessage(message, field, i)
                                      : reflection->GetMessage(message, field),
                             path, check);
          break;
        default:
          break;
      }
    }
  }
}

}  // namespace

bool IsValidJobName(absl::string_view name) {
  return !name.empty() && name.size() <= kMaxJobNameLength && name != "." && name != ".." &&
         std::all_of(name.begin(), name.end(), [](char c) {
           return absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-';
         });
}

bool IsReservedCommandEnvName(absl::string_view name) {
  static constexpr absl::string_view kTorchrun[] = {
      "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
      "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR",
      "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
      "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE",
      "TORCHELASTIC_ENABLE_FILE_TIMER", "TORCHELASTIC_TIMER_FILE"};
  return absl::StartsWith(name, "RINGMASTER_") ||
         std::find(std::begin(kTorchrun), std::end(kTorchrun), name) != std::end(kTorchrun);
}

bool IsPythonScriptArgv(const std::vector<std::string>& argv) {
  if (argv.size() < 2 || argv[1].empty() || argv[1][0] == '-') return false;
  absl::string_view name = argv[0];
  name = name.substr(name.find_last_of('/') + 1);
  if (!absl::ConsumePrefix(&name, "python")) return false;
  // Nothing, or digits with at most one '.' between digits: 3, 3.11.
  const std::vector<absl::string_view> version = absl::StrSplit(name, '.');
  if (name.empty()) return true;
  if (version.size() > 2) return false;
  return std::all_of(version.begin(), version.end(), [](absl::string_view v) {
    return !v.empty() && std::all_of(v.begin(), v.end(), absl::ascii_isdigit);
  });
}

std::vector<FieldError> FindJobSpecErrors(const JobSpec& spec) {
  Checker check;
  CheckRepresentable(spec, "", &check);
  CheckName(spec, &check);
  if (spec.has_command()) {
    CheckCommand(spec, &check);
    CheckCheckpoint(spec, &check);
    CheckRest(spec, &check);
    return check.Take();
  }
  CheckLength(spec, &check);
  CheckModel(spec, &check);
  CheckData(spec, &check);
  CheckOptimizer(spec, &check);
  CheckSchedule(spec, &check);
  CheckBatch(spec, &check);
  CheckPrecision(spec, &check);
  CheckParallelism(spec, &check);
  CheckCheckpoint(spec, &check);
  CheckResume(spec, &check);
  CheckRest(spec, &check);
  CheckMetrics(spec, &check);
  return check.Take();
}

absl::Status ValidateJobSpec(const JobSpec& spec) {
  return FieldErrorsToStatus(FindJobSpecErrors(spec));
}

}  // namespace ringmaster::spec
