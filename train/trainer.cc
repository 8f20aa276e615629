#include "train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <new>
#include <thread>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
#include "checkpoint/reader.h"
#include "checkpoint/writer.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "kernels/matmul.h"
#include "nlohmann/json.hpp"
#include "spec/job_spec.h"
#include "train/data/fashion_mnist.h"
#include "train/data/partition.h"
#include "train/data/sampler.h"
#include "train/data/text_dataset.h"
#include "train/device.h"
#include "train/grad_sync.h"
#include "train/gradient_backend.h"
#include "train/memory_estimate.h"
#include "train/nn/classifiers.h"
#include "train/nn/gpt.h"
#include "train/optim/clip.h"
#include "train/optim/loss_scaler.h"
#include "train/optim/lr_schedule.h"
#include "train/optim/optimizer.h"
#include "xxhash.h"

namespace ringmaster::train {
namespace {

using comm::ReduceOp;

Precision PrecisionOf(const JobSpec& spec) {
  switch (spec.precision().compute()) {
    case PrecisionSpec::DTYPE_BF16:
      return Precision::kBFloat16;
    case PrecisionSpec::DTYPE_FP16:
      return Precision::kFloat16;
    default:
      return Precision::kFloat32;
  }
}

absl::StatusOr<OptimizerOptions> OptimizerOptionsOf(const JobSpec& spec) {
  const OptimizerSpec& o = spec.optimizer();
  switch (o.kind_case()) {
    case OptimizerSpec::kSgd: {
      SgdOptions s;
      s.momentum = o.sgd().momentum();
      s.nesterov = o.sgd().nesterov();
      s.weight_decay = o.weight_decay();
      return s;
    }
    case OptimizerSpec::kAdamw: {
      AdamWOptions a;
      a.beta1 = o.adamw().beta1();
      a.beta2 = o.adamw().beta2();
      a.eps = o.adamw().eps();
      a.weight_decay = o.weight_decay();
      return a;
    }
    case OptimizerSpec::kLamb: {
      LambOptions l;
      l.beta1 = o.lamb().beta1();
      l.beta2 = o.lamb().beta2();
      l.eps = o.lamb().eps();
      l.weight_decay = o.weight_decay();
      return l;
    }
    default:
      return absl::InvalidArgumentError("optimizer: set one of sgd, adamw or lamb");
  }
}

LrScheduleOptions::Decay DecayOf(const ScheduleSpec& s) {
  switch (s.decay()) {
    case ScheduleSpec::DECAY_CONSTANT:
      return LrScheduleOptions::Decay::kConstant;
    case ScheduleSpec::DECAY_LINEAR:
      return LrScheduleOptions::Decay::kLinear;
    default:
      return LrScheduleOptions::Decay::kCosine;
  }
}

using Data = JobData;

// RESOURCE_EXHAUSTED, marked permanent (a restart finds no more memory): out of memory
// while allocating `what`.
absl::Status OutOfMemory(absl::string_view what) {
  return MarkPermanent(absl::ResourceExhaustedError(
      absl::StrCat("out of memory while allocating ", what,
                   " (std::bad_alloc); make the model or the batch smaller, or give each "
                   "rank more memory (fewer ranks per node, parallelism.zero_stage)")));
}

absl::StatusOr<JobData> LoadJobDataOrThrow(const JobSpec& spec) {
  Data d;
  const DataSpec& ds = spec.data();
  if (ds.has_fashion_mnist()) {
    data::FashionMnistOptions fo;
    if (ds.fashion_mnist().has_normalize() && !ds.fashion_mnist().normalize()) {
      fo.normalization = data::PixelNormalization{};
    }
    const std::string dir =
        ds.fashion_mnist().dir().empty() ? data::kDefaultFashionMnistDir : ds.fashion_mnist().dir();
    RM_ASSIGN_OR_RETURN(d.owned_train,
                        data::LoadFashionMnist(dir, data::FashionMnistSplit::kTrain, fo));
    RM_ASSIGN_OR_RETURN(d.owned_test,
                        data::LoadFashionMnist(dir, data::FashionMnistSplit::kTest, fo));
  } else if (ds.has_text()) {
    RM_ASSIGN_OR_RETURN(d.owned_train,
                        data::LoadTextDataset(ds.text().path(), spec.model().gpt().context()));
  } else {
    return absl::InvalidArgumentError("data: set fashion_mnist or text");
  }
  d.train = d.owned_train.get();
  d.test = d.owned_test.get();
  return d;
}

}  // namespace

absl::StatusOr<JobData> LoadJobData(const JobSpec& spec) {
  try {
    return LoadJobDataOrThrow(spec);
  } catch (const std::bad_alloc&) {
    return OutOfMemory("the job's data (data)");
  }
}

namespace {

// Sums doubles across ranks (the optimizer's and clipping's SumAcrossRanks).
SumAcrossRanks AllReduceSum(comm::Communicator* comm, absl::Duration timeout) {
  return [comm, timeout](absl::Span<double> values) {
    return comm->AllReduce(values.data(), values.data(), values.size(), DataType::kFloat64,
                           ReduceOp::kSum, absl::Now() + timeout);
  };
}

// "42s", "3m05s", "1h02m": a duration for a progress line.
std::string ShortDuration(absl::Duration d) {
  const int64_t s = std::max<int64_t>(0, absl::ToInt64Seconds(d + absl::Milliseconds(500)));
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%dh%02dm", s / 3600, s % 3600 / 60);
}

// The metrics file is the job's history: a resumed or recovered run appends to it (its
// records carry their step, so a step trained again shows twice, in order). A last line cut
// short (a process killed while writing it) is dropped first, so that every line is JSON.
absl::Status OpenMetrics(const std::string& path, std::ofstream* out) {
  std::error_code ignored;  // a failure to create it shows when opening the file
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ignored);
  if (std::ifstream in(path, std::ios::binary); in) {
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!text.empty() && text.back() != '\n') {
      const size_t keep = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
      std::error_code error;
      std::filesystem::resize_file(path, keep, error);
      if (error) {
        return absl::FailedPreconditionError(absl::StrCat(
            "metrics.jsonl: cannot drop the cut-short last line of ", path, ": ", error.message()));
      }
      LOG(WARNING) << path << ": dropped a last line cut short (" << text.size() - keep
                   << " bytes)";
    }
  }
  out->open(path, std::ios::out | std::ios::app);
  if (!*out) {
    return absl::FailedPreconditionError(
        absl::StrCat("metrics.jsonl: cannot write ", path, " (does its directory exist?)"));
  }
  return absl::OkStatus();
}

// What the ZeRO paper's formula says this rank keeps: fp32 parameters, fp32 gradients,
// and the optimizer's moments (sharded by ZeRO-1/2).
MemoryEstimateOptions RankMemoryOptions(const JobSpec& spec, const state::TensorTable& table,
                                        int world) {
  MemoryEstimateOptions mo;
  mo.parameters = static_cast<double>(table.parameter_count());
  mo.world_size = world;
  mo.zero_stage = std::min(spec.parallelism().zero_stage(), 1);  // gradients stay whole on CPU
  mo.mixed_precision = false;
  mo.optimizer = spec.optimizer().has_sgd() ? MemoryEstimateOptions::Optimizer::kSgdMomentum
                                            : MemoryEstimateOptions::Optimizer::kAdam;
  return mo;
}

// RESOURCE_EXHAUSTED, marked permanent, when the state the ranks on this host keep in its
// memory (the formula's terms; the gradients only without a device) is more than the
// machine has: allocating it would fail, or the kernel would kill the process later.
absl::Status CheckHostMemory(const JobSpec& spec, const state::TensorTable& table, int world,
                             bool gradients_on_host, int local_ranks) {
  absl::StatusOr<MemoryEstimate> e = EstimateMemory(RankMemoryOptions(spec, table, world));
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (!e.ok() || pages <= 0 || page <= 0) return absl::OkStatus();  // nothing to compare
  const double machine = static_cast<double>(pages) * static_cast<double>(page);
  const double rank =
      e->parameter_bytes + (gradients_on_host ? e->gradient_bytes : 0) + e->optimizer_bytes;
  const int ranks = std::max(1, local_ranks);
  if (rank * ranks <= machine) return absl::OkStatus();
  constexpr double kGiB = 1 << 30;
  return MarkPermanent(absl::ResourceExhaustedError(absl::StrFormat(
      "out of memory: the model's %d parameters need %.4g GiB on each rank (parameters "
      "%.4g GiB, gradients %.4g GiB, optimizer state %.4g GiB): %.4g GiB for the %d rank(s) on "
      "this host, which has %.4g GiB; make the model smaller (model), or use more ranks with "
      "parallelism.zero_stage, or fewer ranks per node",
      table.parameter_count(), rank / kGiB, e->parameter_bytes / kGiB,
      gradients_on_host ? e->gradient_bytes / kGiB : 0.0, e->optimizer_bytes / kGiB,
      rank * ranks / kGiB, ranks, machine / kGiB)));
}

// FAILED_PRECONDITION, marked permanent (training again would diverge again): the run
// diverged at `step` (1-based) because `what`.
absl::Status Diverged(const JobSpec& spec, int64_t step, absl::string_view what,
                      int64_t skipped_steps) {
  return MarkPermanent(absl::FailedPreconditionError(absl::StrFormat(
      "training diverged at step %d: %s (%d step(s) skipped before); lower optimizer.lr "
      "(%g) or clip the gradients (optimizer.clip_grad_norm)",
      step, what, skipped_steps, spec.optimizer().lr())));
}

// Whether `resident` holds a state this run can restore: the same training spec, the
// table's size, and the optimizer's buffers by name and size.
bool ResidentFits(const ResidentState& resident, uint64_t spec_hash,
                  const state::TensorTable& table, const std::vector<StateBuffer>& buffers) {
  if (resident.step < 0 || resident.spec_hash != spec_hash) return false;
  if (static_cast<int64_t>(resident.params.size()) != table.total_elements()) return false;
  if (resident.optimizer.size() != buffers.size()) return false;
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (resident.optimizer[i].first != buffers[i].name ||
        resident.optimizer[i].second.size() != buffers[i].data.size()) {
      return false;
    }
  }
  return true;
}

// What the ranks agreed on at start (TrainerOptions::resident).
struct MemoryRestore {
  int source = -1;              // the rank whose memory the state came from; -1: none
  int64_t checkpoint_step = -1;  // rank 0's latest checkpoint; -1: none seen
  int64_t step = 0;
  int64_t optimizer_step = 0;
  state::SamplerState sampler;
  std::optional<state::LossScalerState> loss_scaler;
};

// TrainerOptions::resident, on entry (ZeRO-0): every rank tells the step it holds in memory
// (-1: none) and its view of the latest checkpoint; when some rank holds a step at least as
// recent as rank 0's latest checkpoint, the first such rank broadcasts its state into
// `params` and the optimizer's buffers, and the rest of it comes back. Otherwise source is
// -1 and the caller reads the checkpoint.
absl::StatusOr<MemoryRestore> RestoreFromMemory(
    comm::Communicator* comm, const ResidentState& resident, uint64_t spec_hash,
    const state::TensorTable& table, state::FlatBuffer& params,
    const std::vector<StateBuffer>& buffers, int64_t latest_checkpoint, absl::Duration op_timeout) {
  auto deadline = [&] { return absl::Now() + op_timeout; };
  const int world = comm->size();
  const bool fits = ResidentFits(resident, spec_hash, table, buffers);
  int64_t mine[2] = {fits ? resident.step : -1, latest_checkpoint};
  std::vector<int64_t> all(2 * world);
  RM_RETURN_IF_ERROR(comm->AllGather(mine, all.data(), 2, DataType::kInt64, deadline()));
  MemoryRestore out;
  out.checkpoint_step = all[1];
  int64_t best = -1;
  for (int r = 0; r < world; ++r) {
    if (all[2 * r] > best) {
      best = all[2 * r];
      out.source = r;
    }
  }
  if (best < 0 || best < out.checkpoint_step) {
    out.source = -1;
    return out;
  }
  const int64_t n = table.total_elements();
  // The small state: step, optimizer step, sampler epoch and cursor, loss scaler (present,
  // the scale's bits, good steps, steps, skipped steps).
  int64_t small[9] = {};
  if (comm->rank() == out.source) {
    std::memcpy(params.data(), resident.params.data(), n * sizeof(float));
    for (size_t i = 0; i < buffers.size(); ++i) {
      std::memcpy(buffers[i].data.data(), resident.optimizer[i].second.data(),
                  buffers[i].data.size() * sizeof(float));
    }
    small[0] = resident.step;
    small[1] = resident.optimizer_step;
    small[2] = static_cast<int64_t>(resident.sampler.epoch);
    small[3] = resident.sampler.cursor;
    if (resident.loss_scaler) {
      small[4] = 1;
      std::memcpy(&small[5], &resident.loss_scaler->scale, sizeof(double));
      small[6] = resident.loss_scaler->good_steps;
      small[7] = resident.loss_scaler->steps;
      small[8] = resident.loss_scaler->skipped_steps;
    }
  }
  RM_RETURN_IF_ERROR(comm->Broadcast(params.data(), params.data(), static_cast<size_t>(n),
                                     DataType::kFloat32, out.source, deadline()));
  for (const StateBuffer& b : buffers) {
    RM_RETURN_IF_ERROR(comm->Broadcast(b.data.data(), b.data.data(), b.data.size(),
                                       DataType::kFloat32, out.source, deadline()));
  }
  RM_RETURN_IF_ERROR(comm->Broadcast(small, small, 9, DataType::kInt64, out.source, deadline()));
  out.step = small[0];
  out.optimizer_step = small[1];
  out.sampler.epoch = static_cast<uint64_t>(small[2]);
  out.sampler.cursor = small[3];
  if (small[4] != 0) {
    state::LossScalerState ls;
    std::memcpy(&ls.scale, &small[5], sizeof(double));
    ls.good_steps = small[6];
    ls.steps = small[7];
    ls.skipped_steps = small[8];
    out.loss_scaler = ls;
  }
  return out;
}

// A resume error as the trainer returns it: FAILED_PRECONDITION from the checkpoint reader
// means the checkpoint and this job disagree (another job's spec hash, other tensors, a
// missing buffer, a newer format), which every restart would meet again, so it is marked
// permanent (common/status_macros.h). Data loss and I/O errors are left restartable.
absl::Status UnlessRestartable(const absl::Status& status) {
  if (!absl::IsFailedPrecondition(status)) return status;
  return MarkPermanent(absl::FailedPreconditionError(absl::StrCat(
      status.message(),
      "; resuming cannot work until checkpoint.dir points elsewhere or resume is set to never")));
}

// The GPU the spec asks for (TrainerOptions::gpu), or null for the CPU: `device: cpu`, or
// `auto` where this build, this machine or this job has no CUDA path (`why_cpu` says which).
// `device: cuda` gets a GPU or the error that says why not, naming the field.
absl::StatusOr<std::unique_ptr<TrainingDevice>> ChooseDevice(const JobSpec& spec,
                                                             const Model& model,
                                                             int64_t padded, int gpu,
                                                             std::string* why_cpu) {
  if (spec.device() == JobSpec::DEVICE_CPU) return nullptr;
  const bool required = spec.device() == JobSpec::DEVICE_CUDA;
  if (!required && !CudaDeviceAvailable()) {
    *why_cpu = "no CUDA GPU here (or a build without --config=cuda)";
    return nullptr;
  }
  CudaDeviceOptions o;
  o.gpu = CudaOrdinalForSlot(gpu);
  o.tf32 = spec.precision().tf32();
  o.precision = PrecisionOf(spec);
  absl::StatusOr<std::unique_ptr<TrainingDevice>> device = CreateCudaDevice(model, padded, o);
  if (device.ok()) return device;
  const absl::Status& why = device.status();
  if (required) {
    return absl::Status(why.code(), absl::StrCat("device: cuda: ", why.message()));
  }
  *why_cpu = std::string(why.message());
  return nullptr;
}

// The host's view of a rank's parameters and optimizer state. On the CPU it is that state
// itself. With a TrainingDevice the step works on the device's buffers and the host holds
// copies: Pull refreshes them (before a save, a fingerprint, an evaluation, keeping the
// state between epochs), Push sends them back (after a restore).
class HostView {
 public:
  enum class What { kParams, kEverything };

  // `params` (padded), the optimizer and the device (null: the CPU) outlive the view.
  HostView(state::FlatBuffer& params, Optimizer& optimizer, TrainingDevice* device)
      : params_(params), optimizer_(optimizer), device_(device) {
    if (device == nullptr) {
      host_ = optimizer.state_buffers();
      return;
    }
    // A FlatBuffer owns its memory through a pointer: the spans survive the vector growing.
    for (const StateBuffer& b : optimizer.state_buffers()) {
      owned_.emplace_back(b.range.size());
      host_.push_back({b.name, b.range, owned_.back().span()});
    }
  }

  // The optimizer's state buffers in host memory (the ranges and names of the optimizer's).
  std::vector<StateBuffer>& optimizer() { return host_; }

  // The device's state has moved on (an optimizer step).
  void Invalidate() { params_current_ = optimizer_current_ = device_ == nullptr; }

  absl::Status Pull(What what) {
    VectorOps* ops = device_ == nullptr ? nullptr : device_->ops();
    if (!params_current_) {
      RM_RETURN_IF_ERROR(ops->CopyToHost(device_->params(), params_.data()));
      params_current_ = true;
    }
    if (what == What::kEverything && !optimizer_current_) {
      std::vector<StateBuffer> on_device = optimizer_.state_buffers();
      for (size_t i = 0; i < host_.size(); ++i) {
        RM_RETURN_IF_ERROR(ops->CopyToHost(on_device[i].data, host_[i].data.data()));
      }
      optimizer_current_ = true;
    }
    return absl::OkStatus();
  }

  absl::Status Push() {
    if (device_ == nullptr) return absl::OkStatus();
    VectorOps* ops = device_->ops();
    RM_RETURN_IF_ERROR(ops->CopyFromHost(params_.data(), device_->params()));
    std::vector<StateBuffer> on_device = optimizer_.state_buffers();
    for (size_t i = 0; i < host_.size(); ++i) {
      RM_RETURN_IF_ERROR(ops->CopyFromHost(host_[i].data.data(), on_device[i].data));
    }
    params_current_ = optimizer_current_ = true;
    return absl::OkStatus();
  }

 private:
  state::FlatBuffer& params_;
  Optimizer& optimizer_;
  TrainingDevice* device_;
  std::vector<state::FlatBuffer> owned_;  // with a device: the host copies of the state buffers
  std::vector<StateBuffer> host_;
  bool params_current_ = true;
  bool optimizer_current_ = true;
};

}  // namespace

absl::StatusOr<int64_t> EstimateRankStateBytes(const JobSpec& spec, int world) {
  data::DatasetInfo shape;  // what the data sets of the spec look like, unread
  if (spec.data().has_fashion_mnist()) {
    shape.feature_dim = data::kFashionMnistRows * data::kFashionMnistCols;
    shape.num_classes = data::kFashionMnistClasses;
  } else if (spec.data().has_text()) {
    shape.context = spec.model().gpt().context();
    shape.vocab_size = spec.model().gpt().vocab();
  }
  RM_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, CreateModelFromSpec(spec, shape));
  RM_ASSIGN_OR_RETURN(MemoryEstimate e,
                      EstimateMemory(RankMemoryOptions(spec, model->table(), std::max(1, world))));
  return static_cast<int64_t>(e.parameter_bytes + e.gradient_bytes + e.optimizer_bytes);
}

absl::StatusOr<std::unique_ptr<Model>> CreateModelFromSpec(const JobSpec& spec,
                                                           const data::DatasetInfo& data) {
  const ModelSpec& m = spec.model();
  nn::ModelOptions o;
  if (m.has_mlp()) {
    if (data.feature_dim == 0) {
      return absl::InvalidArgumentError("model.mlp needs image data (data.fashion_mnist)");
    }
    o.kind = nn::ModelKind::kMlp;
    o.mlp.inputs = data.feature_dim;
    o.mlp.classes = data.num_classes;
    o.mlp.hidden.assign(m.mlp().hidden().begin(), m.mlp().hidden().end());
    if (m.mlp().activation() == MlpSpec::ACTIVATION_GELU) {
      return absl::InvalidArgumentError(
          "model.mlp.activation: gelu is not available for the MLP yet; use relu");
    }
    return nn::CreateModel(o);
  }
  if (m.has_cnn()) {
    if (data.feature_dim != data::kFashionMnistRows * data::kFashionMnistCols) {
      return absl::InvalidArgumentError("model.cnn needs 28x28 images (data.fashion_mnist)");
    }
    o.kind = nn::ModelKind::kCnn;
    o.cnn.conv_channels.assign(m.cnn().channels().begin(), m.cnn().channels().end());
    o.cnn.hidden = {m.cnn().fc()};
    o.cnn.classes = data.num_classes;
    return nn::CreateModel(o);
  }
  if (m.has_gpt()) {
    if (data.context == 0) {
      return absl::InvalidArgumentError("model.gpt needs text data (data.text)");
    }
    nn::GptOptions g;
    g.layers = m.gpt().layers();
    g.heads = m.gpt().heads();
    g.width = m.gpt().width();
    g.context = m.gpt().context();
    g.vocab = m.gpt().vocab();
    g.checkpoint_every = spec.parallelism().activation_checkpointing_every();
    RM_ASSIGN_OR_RETURN(std::unique_ptr<nn::GptModel> gpt, nn::GptModel::Create(g));
    return std::unique_ptr<Model>(std::move(gpt));
  }
  return absl::InvalidArgumentError("model: set one of mlp, cnn or gpt");
}

absl::Status CompareFingerprints(const state::TensorTable& table,
                                 absl::Span<const uint64_t> gathered, int world, int64_t step) {
  const size_t per_rank = static_cast<size_t>(table.size()) + 1;
  CHECK_EQ(gathered.size(), per_rank * world);
  for (int q = 1; q < world; ++q) {
    for (size_t t = 0; t < per_rank; ++t) {
      if (gathered[q * per_rank + t] == gathered[t]) continue;
      const std::string what = t < static_cast<size_t>(table.size())
                                   ? absl::StrCat("parameter tensor ", table.tensor(t).name)
                                   : std::string("the training loss");
      return absl::InternalError(absl::StrCat(
          "ranks diverged at step ", step, ": ", what, " differs between rank 0 and rank ", q,
          " (a non-deterministic kernel, a lost update, or memory corruption)"));
    }
  }
  return absl::OkStatus();
}

std::vector<uint64_t> TensorHashes(const state::TensorTable& table, const float* params) {
  std::vector<uint64_t> hashes;
  hashes.reserve(table.size());
  for (const state::TensorSpec& t : table.tensors()) {
    hashes.push_back(XXH3_64bits(params + t.offset, static_cast<size_t>(t.numel) * sizeof(float)));
  }
  return hashes;
}

std::string TrainResultJson(const TrainResult& r) {
  auto measured = [](double v) {
    return v < 0 ? nlohmann::ordered_json() : nlohmann::ordered_json(v);
  };
  const nlohmann::ordered_json json = {
      {"steps", r.steps},
      {"skipped_steps", r.skipped_steps},
      {"final_loss", r.final_loss},
      {"eval_accuracy", measured(r.eval_accuracy)},
      {"eval_loss", measured(r.eval_loss)},
      {"samples_per_second", r.samples_per_second},
      {"tokens_per_second", r.tokens_per_second},
      {"world_size", r.world_size},
      {"parameters", r.parameters},
      {"comm_seconds", absl::ToDoubleSeconds(r.comm_time)},
      {"exposed_comm_seconds", absl::ToDoubleSeconds(r.exposed_comm)},
      {"elapsed_seconds", absl::ToDoubleSeconds(r.elapsed)},
      {"activation_bytes_peak", r.memory.activation_bytes_peak},
      {"optimizer_state_bytes", r.optimizer_state_bytes},
      {"drained", r.drained},
      {"resumed_from_step", r.resumed_from_step},
      {"checkpoints_saved", r.checkpoints_saved},
      {"checkpoint_failures", r.checkpoint_failures},
  };
  return json.dump() + "\n";
}

namespace {

// RunTraining, but std::bad_alloc propagates; `allocating` says what is being allocated.
absl::StatusOr<TrainResult> TrainOrThrow(const TrainerOptions& options, std::string& allocating) {
  const JobSpec& spec = options.spec;
  comm::Communicator* comm = options.comm;
  if (comm == nullptr) return absl::InvalidArgumentError("TrainerOptions.comm is null");
  // Collectives over host memory (control, sums across ranks, restores, fingerprints) go to
  // host_comm when the gradients' communicator takes device memory only (NCCL).
  comm::Communicator* hcomm = options.host_comm != nullptr ? options.host_comm : comm;
  if (hcomm->rank() != comm->rank() || hcomm->size() != comm->size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TrainerOptions.host_comm is rank ", hcomm->rank(), " of ", hcomm->size(),
        " but comm is rank ", comm->rank(), " of ", comm->size()));
  }
  const int rank = comm->rank(), world = comm->size();
  const bool leader = rank == 0;
  auto say = [&](const std::string& line) {
    LOG(INFO) << line;
    if (leader && options.progress) options.progress(line);
  };
  auto deadline = [&] { return absl::Now() + options.op_timeout; };

  // Threads: the spec's, or this host's cores shared among its ranks.
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = spec.parallelism().threads() > 0
                          ? spec.parallelism().threads()
                          : std::max(1, cores / std::max(1, options.local_ranks));
  kernels::SetBlasThreads(threads);

  Data data;
  if (options.train_data != nullptr) {
    data.train = options.train_data;
    data.test = options.test_data;
  } else {
    RM_ASSIGN_OR_RETURN(data, LoadJobData(spec));
  }
  allocating = "the model (model)";
  RM_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, CreateModelFromSpec(spec, data.train->info()));
  const state::TensorTable& table = model->table();
  const int64_t padded = PaddedElements(table.total_elements(), world);
  // The step runs on a GPU (its memory holds the flat buffers) or on the CPU.
  std::string why_cpu;
  allocating = "the model's state on its device";
  RM_ASSIGN_OR_RETURN(std::unique_ptr<TrainingDevice> device,
                      ChooseDevice(spec, *model, padded, options.gpu, &why_cpu));
  RM_RETURN_IF_ERROR(CheckHostMemory(spec, table, world, /*gradients_on_host=*/device == nullptr,
                                     options.local_ranks));
  allocating = absl::StrFormat("the flat parameters and gradients (%d floats each, %.4g GiB)",
                               padded, padded * 4.0 / (1 << 30));
  VectorOps* ops = device != nullptr ? device->ops() : HostVectorOps();
  // The gradients' communicator: NCCL when every rank trains on its own GPU and the spec
  // allows it, with `comm` kept for the host collectives; else `comm`. An error exit aborts
  // NCCL rather than wait for its orderly shutdown with peers that may be gone.
  std::unique_ptr<comm::Communicator> nccl;
  bool nccl_finished = false;
  absl::Cleanup abort_nccl = [&] {
    if (nccl != nullptr && !nccl_finished) nccl->Abort();
  };
  std::string why_backend;
  if (comm->backend() != "nccl" && spec.backend() != JobSpec::BACKEND_TCP) {
    if (options.nccl_store != nullptr) {
      std::string mine;  // "" = the CPU
      if (device != nullptr) {
        absl::StatusOr<std::string> uuid = CudaDeviceUuid(CudaOrdinalForSlot(options.gpu));
        if (uuid.ok()) {
          mine = *uuid;
        } else {  // counted as a rank without a GPU: the TCP backend serves it
          LOG(WARNING) << "no UUID for this rank's GPU, so the gradients go over tcp: "
                       << uuid.status();
        }
      }
      RM_ASSIGN_OR_RETURN(std::vector<std::string> ids, GatherGpuIds(*hcomm, mine, deadline()));
      RM_ASSIGN_OR_RETURN(GradientBackendChoice choice,
                          ChooseGradientBackend(spec.backend(), ids));
      why_backend = choice.reason;
      if (choice.nccl) {
        NcclGradientsOptions no;
        no.rank = rank;
        no.size = world;
        no.store = options.nccl_store;
        no.prefix = options.nccl_prefix;
        no.gpu = CudaOrdinalForSlot(options.gpu);
        no.init_timeout = options.op_timeout;
        RM_ASSIGN_OR_RETURN(nccl, CreateNcclGradients(no));
        comm = nccl.get();
      }
    } else if (spec.backend() == JobSpec::BACKEND_NCCL) {
      return absl::FailedPreconditionError(
          "backend: nccl, but this trainer was given no Store to bootstrap NCCL through "
          "(TrainerOptions.nccl_store); set backend: auto or tcp");
    }
  }
  // `params` is the step's on the CPU and the host's copy with a device; `grads` exists on
  // the CPU only.
  state::FlatBuffer params(padded), grads(device != nullptr ? 0 : padded);
  const absl::Span<float> step_params = device != nullptr ? device->params() : params.span();
  const absl::Span<float> step_grads = device != nullptr ? device->grads() : grads.span();
  model->Init(spec.seed(), params);
  // Every rank initialises from the same seed; the broadcast makes equality a fact.
  RM_RETURN_IF_ERROR(
      hcomm->Broadcast(params.data(), params.data(), padded, DataType::kFloat32, 0, deadline()));

  const int zero = spec.parallelism().zero_stage();
  GradientSyncOptions so;
  so.padded_elements = padded;
  so.bucket_elements = std::max<int64_t>(
      state::kAlignElements, static_cast<int64_t>(spec.parallelism().bucket_mb() * (1 << 20) / 4));
  so.reduction = zero == 2 ? GradientReduction::kReduceScatter : GradientReduction::kAllReduce;
  so.overlap = spec.parallelism().overlap();
  so.op_timeout = options.op_timeout;
  so.ops = ops;
  so.comm_ops = device != nullptr ? device->comm_ops() : HostVectorOps();
  RM_ASSIGN_OR_RETURN(std::unique_ptr<GradientSync> sync, GradientSync::Create(comm, so));

  // The optimizer's range: everything, or this rank's shard (clamped to the tensors).
  const state::FlatRange shard = sync->shard();
  const state::FlatRange opt_range =
      zero == 0 ? state::FullRange(table)
                : state::FlatRange{std::min(shard.begin, table.total_elements()),
                                   std::min(shard.end, table.total_elements())};
  // With plain data parallelism every rank holds the whole reduced gradient, so local sums
  // are already global; with ZeRO each rank sums its shard and the ranks add up.
  const SumAcrossRanks sum =
      zero == 0 ? SumAcrossRanks(SumOnOneRank) : AllReduceSum(hcomm, options.op_timeout);
  RM_ASSIGN_OR_RETURN(OptimizerOptions oo, OptimizerOptionsOf(spec));
  allocating = absl::StrFormat("the optimizer state (%d elements per moment)", opt_range.size());
  RM_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> optimizer,
                      CreateOptimizer(table, opt_range, oo, ops));
  allocating = "the trainer's working memory (batches, activations, buffers)";
  HostView view(params, *optimizer, device.get());

  RM_ASSIGN_OR_RETURN(data::GlobalBatchSampler sampler,
                      data::GlobalBatchSampler::Create(data.train->size(), {spec.seed(), false}));
  const int64_t global_batch = spec.batch().global();
  data::BatchPlanOptions po;
  po.global_batch = global_batch;
  po.world_size = world;
  if (spec.batch().accumulation() > 0) {
    po.accumulation_steps = static_cast<int>(spec.batch().accumulation());
  } else if (spec.batch().micro_max() > 0) {
    po.max_micro_batch = spec.batch().micro_max();
  } else {
    po.accumulation_steps = 1;
  }
  RM_ASSIGN_OR_RETURN(data::BatchPlan plan, data::PlanBatches(po));

  const int64_t steps_per_epoch = sampler.BatchesPerEpoch(global_batch);
  const int64_t total_steps =
      spec.length_case() == JobSpec::kSteps ? spec.steps() : spec.epochs() * steps_per_epoch;
  LrScheduleOptions lo;
  lo.base_lr = spec.optimizer().lr();
  lo.base_batch = spec.schedule().base_batch();
  lo.global_batch = global_batch;
  lo.warmup_steps = std::min(spec.schedule().warmup_steps(), total_steps);
  lo.decay = DecayOf(spec.schedule());
  lo.min_lr_ratio = spec.schedule().min_lr_ratio();
  lo.total_steps = std::max<int64_t>(1, total_steps);
  RM_ASSIGN_OR_RETURN(LrSchedule schedule, LrSchedule::Create(lo));

  const Precision precision = PrecisionOf(spec);
  std::optional<LossScaler> scaler;
  if (precision == Precision::kFloat16) {
    const LossScaleSpec& ls = spec.precision().loss_scale();
    LossScalerOptions lso;
    lso.mode = ls.mode() == LossScaleSpec::MODE_FIXED ? LossScalerOptions::Mode::kFixed
                                                      : LossScalerOptions::Mode::kDynamic;
    lso.initial_scale = ls.initial();
    lso.growth_interval = ls.growth_interval();
    lso.growth_factor = ls.growth_factor();
    lso.backoff_factor = ls.backoff_factor();
    RM_ASSIGN_OR_RETURN(LossScaler s, LossScaler::Create(lso));
    scaler.emplace(std::move(s));
  }

  std::ofstream metrics;
  if (leader && !spec.metrics().jsonl().empty()) {
    RM_RETURN_IF_ERROR(OpenMetrics(spec.metrics().jsonl(), &metrics));
  }

  say(absl::StrCat("job ", spec.name(), ": ", model->Describe(), " (", table.parameter_count(),
                   " parameters) on ", world, " ranks, ", data.train->info().name));
  say(absl::StrCat("batch: global ", global_batch, ", ", plan.DebugString(), "; ", total_steps,
                   " steps (", steps_per_epoch, " per epoch); ", PrecisionName(precision),
                   "; ZeRO-", zero, "; buckets ", sync->num_buckets(), " (",
                   spec.parallelism().bucket_mb(), " MiB), overlap ", so.overlap ? "on" : "off",
                   "; ", threads, " BLAS thread(s) per rank"));
  say(absl::StrCat("optimizer: ", optimizer->Describe(), "; ", schedule.Describe(),
                   scaler ? absl::StrCat("; ", scaler->Describe()) : std::string()));
  std::vector<std::string> gradient_notes;
  if (comm->backend() == "tcp") gradient_notes.push_back("staged through host memory");
  if (!why_backend.empty()) gradient_notes.push_back(why_backend);
  say(device != nullptr
          ? absl::StrCat("device: ", device->Describe(), "; gradients over ", comm->backend(),
                         " (", absl::StrJoin(gradient_notes, "; "), ")")
          : absl::StrCat("device: cpu", why_cpu.empty() ? "" : absl::StrCat(" (", why_cpu, ")")));

  TrainResult result;
  result.world_size = world;
  result.gradient_backend = std::string(comm->backend());
  result.parameters = table.parameter_count();
  result.optimizer_state_bytes = optimizer->state_bytes();
  state::SamplerState state;
  Batch batch;

  // Checkpoints (checkpoint.dir): resume from one, then save on the triggers in the loop.
  // Each rank saves its shard of every buffer (with plain data parallelism too, so the
  // save work is split N ways); chunks are flat ranges, so any world size can load them.
  const CheckpointSpec& cs = spec.checkpoint();
  const bool checkpointing = !cs.dir().empty();
  const uint64_t spec_hash = spec::TrainingSpecHash(spec);
  const state::FlatRange save_range{std::min(shard.begin, table.total_elements()),
                                    std::min(shard.end, table.total_elements())};
  std::unique_ptr<checkpoint::CheckpointWriter> writer;
  int64_t first_step = 0;
  RM_ASSIGN_OR_RETURN(spec::ResumePoint resume, spec::ParseResume(spec.resume()));
  // An elastic job's ranks first look for the state in the survivors' memory.
  int64_t checkpoint_step = -1;  // rank 0's latest, when the ranks agreed on a checkpoint
  bool restored = false;
  // `resume: extend` is auto that also takes a checkpoint of this job with another length.
  const bool extend = resume.kind == spec::ResumePoint::Kind::kExtend;
  if (options.resident != nullptr && (resume.kind == spec::ResumePoint::Kind::kAuto || extend) &&
      zero == 0) {
    int64_t latest = -1;
    if (checkpointing) {
      Env* env = options.checkpoint_env != nullptr ? options.checkpoint_env : Env::Default();
      latest = checkpoint::ReadLatest(env, checkpoint::JobDir(cs.dir(), spec.name())).value_or(-1);
    }
    RM_ASSIGN_OR_RETURN(MemoryRestore m,
                        RestoreFromMemory(hcomm, *options.resident, spec_hash, table, params,
                                          view.optimizer(), latest, options.op_timeout));
    checkpoint_step = m.checkpoint_step;
    if (m.source >= 0) {
      RM_RETURN_IF_ERROR(optimizer->RestoreStep(m.optimizer_step));
      if (scaler && m.loss_scaler) RM_RETURN_IF_ERROR(scaler->Restore(*m.loss_scaler));
      state = m.sampler;
      first_step = m.step;
      result.resumed_from_step = m.step;
      result.resumed_from_memory_of = m.source;
      restored = true;
      say(absl::StrFormat(
          "restored step %d from the memory of rank %d (%s; latest checkpoint: %s): %.2f MiB "
          "broadcast, nothing read from disk",
          m.step, m.source, state::SamplerStateString(m.sampler),
          m.checkpoint_step >= 0 ? absl::StrCat("step ", m.checkpoint_step) : "none",
          table.total_elements() * (1.0 + optimizer->state_buffers().size()) * 4 / 1048576.0));
    }
  }
  // Restored, or not usable: the memory is not held twice while training.
  if (options.resident != nullptr) options.resident->Clear();
  if (checkpointing) {

    checkpoint::CheckpointWriterOptions wo;
    wo.root = cs.dir();
    wo.job = spec.name();
    if (options.checkpoint_env != nullptr) wo.env = options.checkpoint_env;
    wo.rank = rank;
    wo.world_size = world;
    wo.zero_stage = zero;
    wo.spec_hash = spec_hash;
    wo.training_spec = spec::TrainingSpecText(spec);
    wo.table = &table;
    // The staging copy for a save: this rank's slice of the parameters and each moment,
    // reserved now so the first save does not pay its page faults.
    wo.staging_reserve_bytes = static_cast<int64_t>(save_range.size()) * 4 *
                               (1 + static_cast<int64_t>(optimizer->state_buffers().size()));
    wo.retention.keep_last = cs.keep_last();
    wo.retention.keep_every = cs.keep_every();
    wo.on_busy = cs.on_busy() == CheckpointSpec::ON_BUSY_SKIP ? checkpoint::OnBusy::kSkip
                                                              : checkpoint::OnBusy::kWait;
    allocating =
        absl::StrFormat("the checkpoint staging area (%d bytes)", wo.staging_reserve_bytes);
    RM_ASSIGN_OR_RETURN(writer, checkpoint::CheckpointWriter::Create(wo));
    allocating = "the trainer's working memory (batches, activations, buffers)";

    if (!restored && resume.kind != spec::ResumePoint::Kind::kNever) {
      checkpoint::LoadOptions lo;
      lo.root = cs.dir();
      lo.job = spec.name();
      lo.spec_hash = spec_hash;
      lo.training_spec = spec::TrainingSpecText(spec);
      for (absl::string_view field : spec::kLengthFields) {
        if (extend) {
          lo.spec_changes_allowed.emplace(field);
        } else {
          lo.spec_change_hints.emplace(
              field, "to train this job longer from its checkpoint, submit it with "
                     "resume: extend, or ringctl submit --extend");
        }
      }
      lo.table = &table;
      if (resume.kind == spec::ResumePoint::Kind::kStep) lo.step = resume.step;
      // The ranks agreed on rank 0's latest checkpoint (they all read that one).
      if (checkpoint_step >= 0) lo.step = checkpoint_step;
      auto opened = checkpoint::OpenCheckpoint(lo);
      if (absl::IsNotFound(opened.status()) &&
          (resume.kind == spec::ResumePoint::Kind::kAuto || extend)) {
        say(absl::StrCat("resume: ", spec.resume(), ": no checkpoint of job ", spec.name(),
                         " in ", cs.dir(), " yet; starting from scratch"));
      } else {
        RM_RETURN_IF_ERROR(UnlessRestartable(opened.status()));
        std::vector<checkpoint::LoadTarget> targets;
        targets.push_back({"params", state::FullRange(table),
                           state::Slice(params.span(), state::FullRange(table))});
        for (StateBuffer& b : view.optimizer()) {
          targets.push_back({b.name, b.range, b.data});
        }
        auto read_or = checkpoint::ReadBuffers(lo, *opened, targets);
        RM_RETURN_IF_ERROR(UnlessRestartable(read_or.status()));
        const checkpoint::ReadStats& read = *read_or;
        const checkpoint::TrainingState& ts = opened->state;
        RM_RETURN_IF_ERROR(optimizer->RestoreStep(ts.optimizer_step));
        if (scaler && ts.loss_scaler) RM_RETURN_IF_ERROR(scaler->Restore(*ts.loss_scaler));
        state = ts.sampler;
        first_step = ts.step;
        result.resumed_from_step = ts.step;
        say(absl::StrFormat(
            "resumed from %s (step %d, saved by %d ranks, ZeRO-%d; %s): read %.2f MiB for "
            "%.2f MiB needed",
            opened->dir, ts.step, opened->manifest.world_size(), opened->manifest.zero_stage(),
            state::SamplerStateString(ts.sampler), read.bytes_read / 1048576.0,
            read.bytes_needed / 1048576.0));
        if (!opened->spec_changes.empty()) {
          // The schedule is the new length's: warm-up and decay laid out over total_steps
          // as if the job had been submitted with it (a warm restart for a decaying one).
          say(absl::StrFormat(
              "resume: extend: the checkpoint's job was %s; training on to step %d with the "
              "learning-rate schedule of the new length (lr %g at step %d)",
              absl::StrJoin(opened->spec_changes, ", "), total_steps, schedule.LrAt(ts.step),
              ts.step));
        }
      }
    }
  }
  // The initial or restored state goes to the device (nothing to do on the CPU).
  RM_RETURN_IF_ERROR(view.Push());
  // What this rank saves at the end of step `done`. The host view must be current (Pull).
  auto save_request = [&](int64_t done) {
    checkpoint::SaveRequest req;
    req.step = done;
    req.buffers.push_back(
        {"params", table.total_elements(), save_range, state::Slice(params.span(), save_range)});
    for (StateBuffer& b : view.optimizer()) {
      req.buffers.push_back({b.name, table.total_elements(), save_range,
                             b.data.subspan(save_range.begin - b.range.begin, save_range.size())});
    }
    req.state.step = done;
    req.state.sampler = state;
    req.state.rng_seed = spec.seed();
    if (scaler) req.state.loss_scaler = scaler->state();
    req.state.optimizer_step = optimizer->step();
    req.state.schedule_step = done;
    return req;
  };
  // Rank 0 says what became of the saves (failures, with their cause and path) and hands
  // each committed checkpoint to on_checkpoint.
  int64_t failures_reported = 0;
  int64_t commit_reported = -1;
  auto committed = [&](int64_t step, int world_size, int64_t bytes, absl::Time when) {
    if (!options.on_checkpoint || step <= commit_reported) return;
    commit_reported = step;
    options.on_checkpoint(CommittedCheckpoint{
        step, JoinPath(writer->job_dir(), checkpoint::StepDirName(step)), world_size, bytes, when});
  };
  auto report_saves = [&] {
    const checkpoint::WriterStats ws = writer->stats();
    if (ws.failed > failures_reported) {
      failures_reported = ws.failed;
      say(absl::StrCat("checkpoint of step ", ws.last_failed_step, " failed (training goes on): ",
                       ws.last_failure.ToString(absl::StatusToStringMode::kWithNoExtraData)));
    }
    for (const checkpoint::CommittedSave& c : ws.recent_commits) {
      committed(c.step, world, c.bytes, c.time);
    }
  };
  if (leader && checkpointing) {  // the latest checkpoint, e.g. one an earlier epoch saved
    Env* env = options.checkpoint_env != nullptr ? options.checkpoint_env : Env::Default();
    if (absl::StatusOr<int64_t> latest = checkpoint::ReadLatest(env, writer->job_dir());
        latest.ok()) {
      absl::StatusOr<checkpoint::Manifest> m = checkpoint::ReadManifest(
          env, JoinPath(writer->job_dir(), checkpoint::StepDirName(*latest)));
      if (m.ok()) {
        committed(m->step(), m->world_size(), checkpoint::ManifestBytes(*m),
                  absl::FromUnixMicros(m->created_unix_micros()));
        commit_reported = -1;  // this run's commits are told whatever their step
      }
    }
  }

  // The ranks agree on the saves' outcomes (see trainer.h). Each rank tells its own failures
  // not told yet, at most kRecentOwnFailures, as kFailureWords int64 words each: the step,
  // the status code, and the message's bytes.
  constexpr int kRecent = checkpoint::CheckpointWriter::kRecentOwnFailures;
  constexpr int kFailureWords = 128;
  constexpr int kRecordWords = 1 + kRecent * kFailureWords;  // [0]: failures told, in all
  double agreed_failures = 0;                                // the ranks' own failures told, summed
  int64_t told_failures = 0;                                 // this rank's
  auto exchange_failures = [&]() -> absl::Status {
    const checkpoint::WriterStats ws = writer->stats();
    std::vector<int64_t> mine(kRecordWords, -1);
    const int64_t fresh = std::min<int64_t>(ws.own_failures - told_failures,
                                            static_cast<int64_t>(ws.recent_own_failures.size()));
    for (int64_t i = 0; i < fresh; ++i) {
      const checkpoint::SaveFailure& f =
          ws.recent_own_failures[ws.recent_own_failures.size() - fresh + i];
      int64_t* entry = mine.data() + 1 + i * kFailureWords;
      entry[0] = f.step;
      entry[1] = static_cast<int64_t>(f.status.code());
      char* text = reinterpret_cast<char*>(entry + 2);
      const size_t room = (kFailureWords - 2) * sizeof(int64_t);
      std::memset(text, 0, room);
      std::memcpy(text, f.status.message().data(), std::min(room - 1, f.status.message().size()));
    }
    told_failures = ws.own_failures;
    mine[0] = told_failures;
    std::vector<int64_t> all(static_cast<size_t>(kRecordWords) * world);
    RM_RETURN_IF_ERROR(
        hcomm->AllGather(mine.data(), all.data(), kRecordWords, DataType::kInt64, deadline()));
    agreed_failures = 0;
    absl::Status first;  // the lowest rank's first failure
    for (int r = 0; r < world; ++r) {
      const int64_t* record = all.data() + static_cast<size_t>(r) * kRecordWords;
      agreed_failures += static_cast<double>(record[0]);
      for (int i = 0; i < kRecent; ++i) {
        const int64_t* entry = record + 1 + i * kFailureWords;
        if (entry[0] < 0) continue;
        const absl::Status status(static_cast<absl::StatusCode>(entry[1]),
                                  reinterpret_cast<const char*>(entry + 2));
        if (leader && r != 0) writer->ReportPeerFailure(r, entry[0], status);
        if (first.ok()) {
          first = absl::Status(status.code(),
                               absl::StrCat("the checkpoint of step ", entry[0], " failed on rank ",
                                            r, ": ", status.message()));
        }
      }
    }
    if (!first.ok() && cs.on_failure() == CheckpointSpec::ON_FAILURE_FAIL) {
      return MarkPermanent(absl::Status(
          first.code(), absl::StrCat("checkpoint.on_failure is fail and ", first.message())));
    }
    return absl::OkStatus();
  };
  // Every rank waits (by `until`, at most half op_timeout, so that the others' collective
  // does not time out meanwhile) for its own part of the running save, then the ranks agree
  // on the failures; true when every rank's part is done. Where some rank's disk is so slow
  // that it is not, the caller skips the save at hand on every rank (waiting for it would
  // stall the others' collectives) and says why.
  std::string unfinished;  // why, when settle returned false
  auto settle = [&](absl::Time until) -> absl::StatusOr<bool> {
    absl::Status part = writer->WaitOwnPart(std::min(until, absl::Now() + options.op_timeout / 2));
    LOG_IF(WARNING, absl::IsDeadlineExceeded(part))
        << "checkpoint.dir " << cs.dir() << ": " << part;
    double votes[2] = {static_cast<double>(writer->stats().own_failures),
                       absl::IsDeadlineExceeded(part) ? 1.0 : 0.0};
    RM_RETURN_IF_ERROR(
        hcomm->AllReduce(votes, votes, 2, DataType::kFloat64, ReduceOp::kSum, deadline()));
    if (votes[0] != agreed_failures) RM_RETURN_IF_ERROR(exchange_failures());
    if (votes[1] == 0) return true;
    unfinished = absl::StrCat(votes[1],
                              " rank(s) still write their shard of the previous save "
                              "(a slow or stuck disk under checkpoint.dir ",
                              cs.dir(), "?)");
    return false;
  };
  absl::Time last_save_time = absl::Now();
  // An asynchronous save's snapshot is copied by the writer's thread while the next step's
  // forward and backward run (they only read the state); the optimizer waits for it.
  bool snapshot_pending = false;
  auto finish_snapshot = [&] {
    if (snapshot_pending) writer->FinishSnapshot();
    snapshot_pending = false;
  };
  const int64_t log_every = std::max<int64_t>(1, spec.diagnostics().log_every());
  // Steps whose metrics are logged (epoch ends are logged too, once known).
  auto logged_step = [&](int64_t step) {
    return (step + 1) % log_every == 0 || step + 1 == total_steps || step == 0;
  };
  const int64_t fingerprint_every = spec.diagnostics().fingerprint_every();
  const absl::Time start = absl::Now();
  absl::Time window_start = start;
  int64_t window_samples = 0, total_samples = 0;
  absl::Duration window_comm, window_exposed;

  auto evaluate = [&]() -> absl::Status {
    if (data.test == nullptr) return absl::OkStatus();
    double stats[3] = {0, 0, 0};  // loss sum, terms, correct
    const int64_t eval_batch = std::max<int64_t>(256, plan.max_micro_batch);
    for (const data::Range& r :
         data::EvaluationBatches(data.test->size(), eval_batch, world, rank)) {
      std::vector<int64_t> idx = data::RangeIndices(r);
      RM_RETURN_IF_ERROR(data.test->Gather(idx, &batch));
      RM_RETURN_IF_ERROR(view.Pull(HostView::What::kParams));
      RM_ASSIGN_OR_RETURN(StepStats s, model->Evaluate(batch, params, precision));
      stats[0] += s.loss_sum;
      stats[1] += static_cast<double>(s.loss_terms);
      stats[2] += static_cast<double>(s.correct);
    }
    RM_RETURN_IF_ERROR(
        hcomm->AllReduce(stats, stats, 3, DataType::kFloat64, ReduceOp::kSum, deadline()));
    result.eval_loss = stats[0] / std::max(1.0, stats[1]);
    result.eval_accuracy = stats[2] / std::max(1.0, stats[1]);
    return absl::OkStatus();
  };

  // The state after the last completed step, kept for TrainerOptions::resident when this
  // run returns, with an error too (ZeRO-0: every rank holds all of it). `updating` is set
  // while the optimizer writes the parameters: a failure there leaves no usable state.
  int64_t consistent_step = first_step;
  int64_t consistent_optimizer_step = optimizer->step();
  state::SamplerState consistent_sampler = state;
  std::optional<state::LossScalerState> consistent_scaler;
  if (scaler) consistent_scaler = scaler->state();
  bool updating = false;
  absl::Cleanup keep_resident = [&] {
    // Not while an exception (std::bad_alloc) unwinds: it would allocate.
    if (options.resident == nullptr || zero != 0 || updating || std::uncaught_exceptions() > 0) {
      return;
    }
    if (absl::Status pulled = view.Pull(HostView::What::kEverything); !pulled.ok()) {
      LOG(WARNING) << "no state kept in memory: " << pulled;
      return;
    }
    ResidentState& r = *options.resident;
    r.step = consistent_step;
    r.spec_hash = spec_hash;
    r.params.assign(params.data(), params.data() + table.total_elements());
    r.optimizer.clear();
    for (const StateBuffer& b : view.optimizer()) {
      r.optimizer.emplace_back(b.name, std::vector<float>(b.data.begin(), b.data.end()));
    }
    r.optimizer_step = consistent_optimizer_step;
    r.sampler = consistent_sampler;
    r.loss_scaler = consistent_scaler;
  };

  if (options.on_restored) RM_RETURN_IF_ERROR(options.on_restored(first_step));
  for (int64_t step = first_step; step < total_steps; ++step) {
    const absl::Time step_start = absl::Now();
    RM_ASSIGN_OR_RETURN(data::GlobalBatch gb, sampler.NextGlobalBatch(state, global_batch));
    const int64_t count = static_cast<int64_t>(gb.indices.size());
    ForwardBackwardOptions fb;
    fb.loss_divisor = static_cast<double>(count * model->LossTermsPerSample());
    fb.loss_scale = scaler ? scaler->scale() : 1.0f;
    fb.precision = precision;
    double step_stats[3] = {0, 0, 0};  // loss sum, terms, correct
    sync->Begin(step_grads.data(), logged_step(step)
                                       ? GradientSync::StepDiagnostics::kLocalGradNorm
                                       : GradientSync::StepDiagnostics::kNone);
    bool ran = false;
    for (int micro = 0; micro < plan.accumulation_steps; ++micro) {
      const data::Range r = plan.MicroBatch(count, rank, micro);
      if (r.empty()) continue;  // short batch: this rank contributes zeros
      RM_RETURN_IF_ERROR(
          data.train->Gather(absl::MakeConstSpan(gb.indices).subspan(r.begin, r.size()), &batch));
      fb.accumulate = ran;
      const bool last = micro == plan.accumulation_steps - 1;
      if (last) {
        fb.on_grads_ready = [&sync](int64_t offset) { sync->Ready(offset); };
      } else {
        fb.on_grads_ready = nullptr;
      }
      RM_ASSIGN_OR_RETURN(StepStats s, device != nullptr
                                           ? device->ForwardBackward(batch, fb)
                                           : model->ForwardBackward(batch, params, grads, fb));
      ran = true;
      step_stats[0] += s.loss_sum;
      step_stats[1] += static_cast<double>(s.loss_terms);
      step_stats[2] += static_cast<double>(s.correct);
    }
    if (!ran) RM_RETURN_IF_ERROR(ops->Zero(step_grads));
    RM_RETURN_IF_ERROR(sync->Finish());
    window_comm += sync->last_step().comm_time;
    window_exposed += sync->last_step().exposed_wait;
    result.comm_time += sync->last_step().comm_time;
    result.exposed_comm += sync->last_step().exposed_wait;

    // The applied gradient: this rank's range of the reduced buffer.
    absl::Span<float> g = state::Slice(step_grads, opt_range);
    bool apply = true;
    if (scaler) {
      RM_ASSIGN_OR_RETURN(StepVerdict v, scaler->UnscaleAndUpdate(g, sum, ops));
      apply = v == StepVerdict::kApply;
    }
    GradNorm norm;
    if (apply) {
      RM_ASSIGN_OR_RETURN(norm, ClipGradNorm(g, {spec.optimizer().clip_grad_norm()}, sum, ops));
      apply = norm.finite();
      // Only fp16's loss scaler skips steps on purpose (and lowers its scale); elsewhere a
      // gradient that is not finite means the run diverged. The norm is global: every rank
      // stops here alike.
      if (!apply && !scaler) {
        return Diverged(
            spec, step + 1,
            absl::StrCat("the gradient norm is ", norm.norm, " and ", PrecisionName(precision),
                         " has no loss scaler to skip such a step"),
            result.skipped_steps);
      }
    }
    const double lr = schedule.LrAt(step);
    // The optimizer writes the parameters and moments that a save begun after the last
    // step may still be copying (its copy overlapped this step's forward and backward).
    finish_snapshot();
    updating = true;
    if (apply) {
      RM_RETURN_IF_ERROR(optimizer->Step(lr, state::Slice(step_params, opt_range), g, sum));
      view.Invalidate();
      if (zero > 0) {
        // The collective does not wait for the device's queue: the update must be done.
        RM_RETURN_IF_ERROR(ops->Synchronize());
        RM_RETURN_IF_ERROR(comm->AllGather(step_params.data() + shard.begin, step_params.data(),
                                           static_cast<size_t>(shard.size()), DataType::kFloat32,
                                           deadline()));
      }
    } else {
      ++result.skipped_steps;
    }
    state = gb.next;
    result.steps = step + 1;
    updating = false;
    consistent_step = step + 1;
    consistent_optimizer_step = optimizer->step();
    consistent_sampler = state;
    if (scaler) consistent_scaler = scaler->state();
    window_samples += count;
    total_samples += count;

    const bool epoch_end = gb.next.epoch != gb.start.epoch;
    const bool last_step = step + 1 == total_steps;
    const bool log_now = logged_step(step) || epoch_end;
    // One small all-reduce per step: the loss, and the ranks' votes to drain or to save now
    // (signals and clocks differ between ranks; the sum makes every rank decide alike).
    bool drain_vote = (options.drain_requested != nullptr && options.drain_requested->load()) ||
                      (options.stop_at_step > 0 && step + 1 >= options.stop_at_step);
    bool save_vote = options.save_requested != nullptr && options.save_requested->exchange(false);
    if (leader && cs.every_seconds() > 0 &&
        absl::Now() - last_save_time >= absl::Seconds(cs.every_seconds())) {
      save_vote = true;
    }
    // The sixth: the ranks' own failed saves, summed (see exchange_failures).
    double control[6] = {
        step_stats[0],         step_stats[1],
        step_stats[2],         drain_vote ? 1.0 : 0.0,
        save_vote ? 1.0 : 0.0, writer ? static_cast<double>(writer->stats().own_failures) : 0.0};
    RM_RETURN_IF_ERROR(
        hcomm->AllReduce(control, control, 6, DataType::kFloat64, ReduceOp::kSum, deadline()));
    result.final_loss = control[0] / std::max(1.0, control[1]);
    // The loss is all-reduced: every rank stops here alike, before saving what diverged.
    if (!std::isfinite(result.final_loss)) {
      return Diverged(spec, step + 1, absl::StrCat("the loss is ", result.final_loss),
                      result.skipped_steps);
    }
    const bool drain = control[3] > 0 && !last_step;
    if (checkpointing) {
      const int64_t done = step + 1;
      if (control[5] != agreed_failures) RM_RETURN_IF_ERROR(exchange_failures());
      report_saves();
      if (drain || last_step) {
        // The drain save (and the last one) is synchronous: the job may end right after.
        const absl::Time limit =
            absl::Now() + (drain ? absl::Seconds(cs.drain_grace_seconds()) : absl::Minutes(10));
        finish_snapshot();
        RM_RETURN_IF_ERROR(view.Pull(HostView::What::kEverything));
        // The previous save, this one's parts (so that rank 0 waits for no one in vain), and
        // its commit; a save some rank cannot finish in time is given up by every rank.
        RM_ASSIGN_OR_RETURN(bool done_everywhere, settle(limit));
        absl::Status saved = absl::DeadlineExceededError(unfinished);
        if (done_everywhere) {
          saved = writer->SaveWhenIdle(save_request(done), limit);
          RM_ASSIGN_OR_RETURN(done_everywhere, settle(limit));
          if (!done_everywhere) saved = absl::DeadlineExceededError(unfinished);
        }
        if (done_everywhere) {
          if (saved.ok()) saved = writer->Wait(limit);
          RM_RETURN_IF_ERROR(settle(limit).status());
        }
        report_saves();
        if (!saved.ok()) {
          say(absl::StrCat("checkpoint of step ", done, " failed: ",
                           saved.ToString(absl::StatusToStringMode::kWithNoExtraData)));
        } else {
          say(absl::StrCat("checkpoint of step ", done, " saved in ", writer->job_dir()));
        }
      } else if ((cs.every_steps() > 0 && done % cs.every_steps() == 0) || control[4] > 0) {
        finish_snapshot();
        RM_RETURN_IF_ERROR(view.Pull(HostView::What::kEverything));
        // Waiting for the previous save must not wait for a rank that failed it.
        bool done_everywhere = true;
        if (cs.on_busy() != CheckpointSpec::ON_BUSY_SKIP) {
          RM_ASSIGN_OR_RETURN(done_everywhere, settle(absl::InfiniteFuture()));
        }
        if (done_everywhere) {
          RM_ASSIGN_OR_RETURN(checkpoint::SaveOutcome outcome,
                              writer->BeginSave(save_request(done)));
          snapshot_pending = outcome == checkpoint::SaveOutcome::kStarted;
          if (outcome == checkpoint::SaveOutcome::kSkipped) ++result.checkpoints_skipped;
        } else {
          ++result.checkpoints_skipped;
          say(absl::StrCat("checkpoint of step ", done, " skipped: ", unfinished));
        }
        last_save_time = absl::Now();
      }
    }
    if (fingerprint_every > 0 && ((step + 1) % fingerprint_every == 0 || last_step)) {
      // Per-tensor parameter hashes, and the (all-reduced, so common) loss's bits.
      RM_RETURN_IF_ERROR(view.Pull(HostView::What::kParams));
      std::vector<uint64_t> mine = TensorHashes(table, params.data());
      uint64_t loss_bits;
      std::memcpy(&loss_bits, &result.final_loss, sizeof(loss_bits));
      mine.push_back(loss_bits);
      std::vector<uint64_t> all(mine.size() * world);
      RM_RETURN_IF_ERROR(
          hcomm->AllGather(mine.data(), all.data(), mine.size(), DataType::kInt64, deadline()));
      RM_RETURN_IF_ERROR(CompareFingerprints(table, all, world, step + 1));
    }
    if (epoch_end && spec.data().eval_every_epoch()) RM_RETURN_IF_ERROR(evaluate());
    if (log_now) {
      const absl::Duration window = absl::Now() - window_start;
      const double secs = std::max(1e-9, absl::ToDoubleSeconds(window));
      const double sps = static_cast<double>(window_samples) / secs;
      const double comm_s = absl::ToDoubleSeconds(window_comm);
      const int64_t context = data.train->info().context;
      const std::string rate = context > 0 ? absl::StrFormat("%.0f tokens/s", sps * context)
                                           : absl::StrFormat("%.0f samples/s", sps);
      std::string line = absl::StrFormat(
          "step %d/%d epoch %d loss %.4f lr %.4g grad_norm %.3g %s comm %.1f%% (exposed %.1f%%)",
          step + 1, total_steps, gb.start.epoch, result.final_loss, lr, norm.norm, rate,
          100 * comm_s / secs, 100 * absl::ToDoubleSeconds(window_exposed) / secs);
      // This run's pace so far, for the steps left.
      const absl::Duration elapsed = absl::Now() - start;
      const absl::Duration eta =
          elapsed / static_cast<double>(step + 1 - first_step) * (total_steps - step - 1);
      absl::StrAppend(&line, " elapsed ", ShortDuration(elapsed), " eta ", ShortDuration(eta));
      if (scaler) absl::StrAppend(&line, absl::StrFormat(" loss_scale %g", scaler->scale()));
      if (epoch_end && result.eval_accuracy >= 0) {
        absl::StrAppend(&line, absl::StrFormat(" test_accuracy %.4f", result.eval_accuracy));
      }
      say(line);
      if (metrics.is_open()) {
        // A JSON library writes it: a number that is not finite becomes null.
        nlohmann::ordered_json record = {
            {"step", step + 1},
            {"epoch", gb.start.epoch},
            {"loss", result.final_loss},
            {"lr", lr},
            {"grad_norm", norm.norm},
            {"local_grad_norm", sync->last_step().local_grad_norm},
            {"samples_per_second", sps},
            {"comm_seconds", comm_s},
            {"exposed_comm_seconds", absl::ToDoubleSeconds(window_exposed)},
            {"window_seconds", secs},
            {"loss_scale", scaler ? scaler->scale() : 1.0},
            {"skipped_steps", result.skipped_steps},
        };
        if (epoch_end && result.eval_accuracy >= 0) {
          record["test_accuracy"] = result.eval_accuracy;
          record["test_loss"] = result.eval_loss;
        }
        metrics << record.dump() << "\n";
        metrics.flush();
      }
      LOG(INFO) << "rank " << rank << " step " << step + 1 << ": local gradient norm "
                << sync->last_step().local_grad_norm << ", comm "
                << absl::FormatDuration(sync->last_step().comm_time) << " (exposed "
                << absl::FormatDuration(sync->last_step().exposed_wait) << ")";
      window_start = absl::Now();
      window_samples = 0;
      window_comm = window_exposed = absl::ZeroDuration();
    }
    if (options.on_step) {
      StepReport report;
      report.step = step + 1;
      report.total_steps = total_steps;
      report.loss = result.final_loss;
      report.grad_norm = apply ? norm.norm : 0;
      report.step_time = absl::Now() - step_start;
      report.comm_time = sync->last_step().comm_time;
      if (leader && writer != nullptr) {
        const checkpoint::WriterStats ws = writer->stats();
        if (!ws.last_failure.ok()) {
          report.checkpoint_error_step = ws.last_failed_step;
          report.checkpoint_error =
              ws.last_failure.ToString(absl::StatusToStringMode::kWithNoExtraData);
        }
      }
      options.on_step(report);
    }
    if (drain) {
      result.drained = true;
      say(absl::StrCat("drained after step ", step + 1, " of ", total_steps));
      break;
    }
  }
  finish_snapshot();
  if (writer != nullptr) {
    absl::Status last = writer->Wait(absl::Now() + absl::Minutes(10));
    report_saves();
    const checkpoint::WriterStats ws = writer->stats();
    result.checkpoints_saved = ws.succeeded;
    result.checkpoint_failures = ws.failed;
    result.checkpoints_skipped += ws.skipped;
    if (!last.ok() && !absl::IsDeadlineExceeded(last)) {
      LOG(WARNING) << "the last checkpoint save failed: " << last;
    }
  }
  if (result.eval_accuracy < 0 && data.test != nullptr) RM_RETURN_IF_ERROR(evaluate());
  result.elapsed = absl::Now() - start;
  const double secs = std::max(1e-9, absl::ToDoubleSeconds(result.elapsed));
  result.samples_per_second = static_cast<double>(total_samples) / secs;
  if (data.train->info().context > 0) {
    result.tokens_per_second = result.samples_per_second * data.train->info().context;
  }
  result.memory = model->memory();
  if (device != nullptr) result.memory.activation_bytes_peak = device->activation_bytes();
  {
    // Memory held by this rank against the ZeRO paper's formula for what we keep.
    constexpr double kMiB = 1 << 20;
    std::string formula;
    if (auto e = EstimateMemory(RankMemoryOptions(spec, table, world)); e.ok()) {
      formula = absl::StrFormat(" (formula: %.2f + %.2f + %.2f MiB)", e->parameter_bytes / kMiB,
                                e->gradient_bytes / kMiB, e->optimizer_bytes / kMiB);
    }
    const int64_t copy_bytes = device != nullptr ? device->parameter_copy_bytes() : 0;
    say(absl::StrFormat(
        "memory on rank %d (%s): parameters %.2f MiB%s, gradients %.2f MiB, optimizer state "
        "%.2f MiB%s, activations peak %.2f MiB",
        rank, device != nullptr ? "GPU" : "host", step_params.size() * 4 / kMiB,
        copy_bytes > 0 ? absl::StrFormat(" (+ a 16-bit copy, %.2f MiB)", copy_bytes / kMiB)
                       : std::string(),
        step_grads.size() * 4 / kMiB, static_cast<double>(result.optimizer_state_bytes) / kMiB,
        formula, static_cast<double>(result.memory.activation_bytes_peak) / kMiB));
  }
  if (options.on_finish) {
    RM_RETURN_IF_ERROR(view.Pull(HostView::What::kParams));
    options.on_finish(table, params);
  }
  nccl_finished = true;
  return result;
}

}  // namespace

absl::StatusOr<TrainResult> RunTraining(const TrainerOptions& options) {
  std::string allocating = "the trainer's state";
  try {
    return TrainOrThrow(options, allocating);
  } catch (const std::bad_alloc&) {
    return OutOfMemory(allocating);
  }
}

}  // namespace ringmaster::train
