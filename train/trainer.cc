#include "train/trainer.h"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <new>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/plural.h"
#include "common/proto_json.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "kernels/matmul.h"
#include "state/range.h"
#include "train/data/partition.h"
#include "train/data/sampler.h"
#include "train/device.h"
#include "train/fingerprint.h"
#include "train/fsdp.h"
#include "train/grad_sync.h"
#include "train/gradient_backend.h"
#include "train/host_view.h"
#include "train/init_from.h"
#include "train/memory_plan.h"
#include "train/model_factory.h"
#include "train/optim/clip.h"
#include "train/optim/loss_scaler.h"
#include "train/optim/lr_schedule.h"
#include "train/optim/optimizer.h"
#include "train/parallel_strategy.h"
#include "train/process_memory.h"
#include "train/rank_memory.h"
#include "train/rank_report.h"
#include "train/step_reporter.h"
#include "train/trainer_mesh.h"

namespace ringmaster::train {
namespace {

absl::Status Diverged(const TrainConfig& config, int64_t step, absl::string_view what,
                      int64_t skipped_steps) {
  return MarkPermanent(absl::FailedPreconditionError(absl::StrFormat(
      "training diverged at step %d: %s (%d step(s) skipped before); lower optimizer.lr "
      "(%g) or clip the gradients (optimizer.clip_grad_norm)",
      step, what, skipped_steps, config.lr)));
}

// A setup error that says the job asks for what this build, machine or model cannot do
// (INVALID_ARGUMENT, FAILED_PRECONDITION: device: cuda without CUDA, a schedule the mesh
// cannot run): every restart would meet it again, so it is marked permanent and named a
// configuration error; the coordinator fails the job at once instead of spending its restart
// budget. Other codes (a peer lost while the communicators are built) pass as they are.
absl::Status ConfigurationError(const absl::Status& status) {
  if (!absl::IsInvalidArgument(status) && !absl::IsFailedPrecondition(status)) return status;
  if (IsNodeLocal(status)) return status;  // another node may do it
  absl::Status named(status.code(), absl::StrCat("configuration error: ", status.message()));
  status.ForEachPayload(
      [&named](absl::string_view url, const absl::Cord& payload) { named.SetPayload(url, payload); });
  return MarkPermanent(named);
}

// Whether the model's forward and backward sum BatchNorm statistics over the data-parallel
// ranks (model.resnet18.sync_batchnorm).
bool SyncsBatchNorm(const TrainConfig& config) {
  return config.model.kind == ModelConfig::Kind::kResnet18 && config.model.resnet18_sync_batchnorm;
}

// The GPU the config asks for (TrainerOptions::gpu), or null for the CPU: `device: cpu`, or
// `auto` where this build, this machine or this job has no CUDA path (`why_cpu` says which).
// `device: cuda` gets a GPU or the error that says why not, naming the field. The device's
// step buffers hold `elements` floats each (the whole padded flat space, or a shard; with a
// mesh the device makes the GPT's stages and the strategy sizes its buffers later).
absl::StatusOr<std::unique_ptr<TrainingDevice>> ChooseDevice(const TrainConfig& config,
                                                             const Model& model, int64_t elements,
                                                             int gpu, std::string* why_cpu) {
  if (config.device == TrainConfig::Device::kCpu) return nullptr;
  const bool required = config.device == TrainConfig::Device::kCuda;
  if (!required && !CudaDeviceAvailable()) {
    *why_cpu = "no CUDA GPU here (or a build without --config=cuda)";
    return nullptr;
  }
  CudaDeviceOptions o;
  o.gpu = CudaOrdinalForSlot(gpu);
  o.tf32 = config.tf32;
  o.precision = config.precision;
  o.flat_parameters = !UsesShardedStrategy(config);
  o.stages = HasMesh(config);
  absl::StatusOr<std::unique_ptr<TrainingDevice>> device = CreateCudaDevice(model, elements, o);
  if (device.ok()) return device;
  const absl::Status& why = device.status();
  if (required) {
    return absl::Status(why.code(), absl::StrCat("device: cuda: ", why.message()));
  }
  *why_cpu = std::string(why.message());
  return nullptr;
}

// Payload bytes this rank has sent through `comm`: all collectives, all-gathers, and
// reductions (reduce-scatters and all-reduces).
struct Sent {
  uint64_t all = 0, gathered = 0, reduced = 0;
};
Sent BytesSent(const comm::Communicator& comm) {
  const comm::Counters c = comm.counters();
  Sent sent;
  for (const comm::OpCounters& op : c.ops) sent.all += op.bytes_sent;
  sent.gathered = c.of(comm::OpKind::kAllGather).bytes_sent;
  sent.reduced =
      c.of(comm::OpKind::kReduceScatter).bytes_sent + c.of(comm::OpKind::kAllReduce).bytes_sent;
  return sent;
}

// What a step sends: through the gradients' communicator and every group of the mesh (all),
// and of it through the pipeline and tensor-parallel groups.
struct StepSent {
  Sent all;
  uint64_t pipeline = 0, tensor_parallel = 0;
};

}  // namespace

std::string TrainResultJson(const TrainResult& r) { return ToJsonLine(r) + "\n"; }

namespace {
// What UseBestCpuKernels found, for the start lines.
std::string& BlasNote() {
  static std::string* note = new std::string;
  return *note;
}
}  // namespace

std::string UseBestCpuKernels(char** argv) {
  BlasNote() = kernels::UseBestBlasKernels(argv);
  return BlasNote();
}

// The trainer's state: what Create builds and each Step uses. Members are destroyed in
// reverse order, so the strategy (whose thread uses the gradients' communicator) goes before
// the communicator, and the device last but the model and data.
struct Trainer::State {
  TrainerOptions options;
  const TrainConfig& config = options.config;
  comm::Communicator* comm = nullptr;   // the gradients' (NCCL's when it serves them)
  comm::Communicator* hcomm = nullptr;  // host-memory collectives
  int rank = 0, world = 1;
  bool leader = false;
  // parallelism.mesh: the pipeline and data-parallel groups (the data-parallel group is the
  // whole job without a mesh); `pipeline` is the strategy's when pp > 1.
  MeshGroups groups;
  PipelineParallel* pipeline = nullptr;
  std::string allocating = "the trainer's state";  // for an out-of-memory error

  JobData data;
  std::unique_ptr<Model> model;
  std::unique_ptr<TrainingDevice> device;
  std::unique_ptr<comm::Communicator> nccl;
  bool nccl_finished = false;
  std::string why_cpu, why_backend;
  int threads = 1;
  VectorOps* ops = nullptr;
  // `params` is the step's on the CPU and the host's copy with a device; `grads` exists on
  // the CPU only.
  state::FlatBuffer params, grads;
  absl::Span<float> step_params, step_grads;
  std::unique_ptr<ParallelStrategy> strategy;
  std::unique_ptr<Optimizer> optimizer;
  std::unique_ptr<HostView> view;

  std::optional<data::GlobalBatchSampler> sampler;
  data::BatchPlan plan;
  int64_t steps_per_epoch = 0, total_steps = 0;
  std::optional<LrSchedule> schedule;
  std::optional<LossScaler> scaler;
  std::unique_ptr<StepReporter> reporter;
  std::unique_ptr<CheckpointPolicy> checkpoints;

  TrainResult result;
  absl::Duration comm_time, exposed_comm;  // inside gradient collectives, summed
  absl::Duration eval_time;                // in evaluations, summed
  absl::Duration last_eval_time;           // the last evaluation's
  int evaluations = 0;
  // Bytes this rank sent through `comm` inside the steps: all, all-gathers, reductions.
  uint64_t step_bytes_sent = 0, step_bytes_gathered = 0, step_bytes_reduced = 0;
  // Of step_bytes_sent: through the mesh's pipeline and tensor-parallel groups.
  uint64_t step_bytes_pipeline = 0, step_bytes_tensor_parallel = 0;
  state::SamplerState sampler_state;
  Batch batch;
  std::vector<Batch> micro_batches;  // a pipeline step's
  int64_t first_step = 0, step = 0;
  bool finished = false;
  bool evaluated_start = false;  // init_from's weights evaluated before the first step
  absl::Status error;  // the error that ended the run
  // The state after the last completed step, kept for TrainerOptions::resident when the
  // trainer goes, after an error too (when every rank holds all of it). `updating` is set
  // while the optimizer writes the parameters: a failure there leaves no usable state.
  bool keep_resident = false;
  int64_t consistent_step = 0;
  int64_t consistent_optimizer_step = 0;
  state::SamplerState consistent_sampler;
  std::optional<state::LossScalerState> consistent_scaler;
  bool updating = false;

  absl::Time Deadline() const { return absl::Now() + options.op_timeout; }
  StepSent BytesSentInSteps() const {
    StepSent sent;
    sent.all = BytesSent(*comm);
    for (const auto* group : {&groups.pp, &groups.dp, &groups.tp, &groups.pp_device,
                              &groups.dp_device, &groups.tp_device}) {
      if (*group == nullptr) continue;
      const Sent g = BytesSent(**group);
      sent.all.all += g.all;
      sent.all.gathered += g.gathered;
      sent.all.reduced += g.reduced;
      if (group == &groups.pp || group == &groups.pp_device) sent.pipeline += g.all;
      if (group == &groups.tp || group == &groups.tp_device) sent.tensor_parallel += g.all;
    }
    return sent;
  }
  // Every communicator's counters, named as CommGroupCounters says.
  std::vector<CommGroupCounters> CommCounters() const {
    std::vector<CommGroupCounters> all;
    auto add = [&all](const comm::Communicator* c, std::string group) {
      if (c != nullptr) all.push_back({std::move(group), c->size(), c->counters()});
    };
    add(hcomm, "world");
    if (comm != hcomm) add(comm, std::string(comm->backend()));  // "nccl"
    add(groups.dp.get(), "dp");
    add(groups.tp.get(), "tp");
    add(groups.pp.get(), "pp");
    add(groups.dp_device.get(), "dp/nccl");
    add(groups.tp_device.get(), "tp/nccl");
    add(groups.pp_device.get(), "pp/nccl");
    return all;
  }
  // The model each step runs: the job's, or the strategy's own (a tensor-parallel shard).
  Model& StepModel() const {
    Model* own = strategy->step_model();
    return own != nullptr ? *own : *model;
  }
  void Say(const std::string& line) const {
    LOG(INFO) << line;
    if (leader && options.progress) options.progress(line);
  }

  absl::Status CheckOptions();
  absl::Status BuildMesh();
  absl::Status LoadModel();
  absl::Status ChooseGradientComm();
  absl::Status BuildState();
  absl::Status BuildSchedule();
  void SayStart() const;
  absl::Status RestoreAndCheckpoint();
  // Evaluates on data.test (when there is one) after `done` steps: result.eval_*. Timed
  // into eval_time, and kept out of the training rates (StepReporter::ExcludeFromRates).
  absl::Status Evaluate(int64_t done);
  absl::Status RunEvaluation(int64_t done);
  // After the last step (Finish): the evaluation data.final_eval asks for, unless the last
  // evaluation is of these parameters already (a classifier keeps its last epoch's without
  // data.eval_every_steps); its own line, and result.final_eval_seconds.
  absl::Status FinalEvaluation();
  // The samples of data.test an evaluation reads (data.eval_samples, or all).
  int64_t EvaluatedSamples() const {
    const int64_t size = data.test->size();
    return config.data.eval_samples > 0 ? std::min(config.data.eval_samples, size) : size;
  }
  // Whether an evaluation by steps (data.eval_every_steps) is due after `done` steps: every
  // K steps, and after the last one with data.final_eval.
  bool EvaluationDueBySteps(int64_t done) const {
    if (config.data.eval_every_steps <= 0) return false;
    return done % config.data.eval_every_steps == 0 ||
           (done == total_steps && config.data.final_eval);
  }
  // Whether the step that reads `gb` (0-based `step`) writes a progress line and a metrics
  // record: every diagnostics.log_every steps, at a data epoch's end, and after an
  // evaluation by steps. Such a step measures this rank's own gradient norm for the record.
  bool RecordsStep(const data::GlobalBatch& gb, int64_t step) const {
    return reporter->Logged(step) || gb.next.epoch != gb.start.epoch ||
           EvaluationDueBySteps(step + 1);
  }
  absl::Status ForwardBackward(const data::GlobalBatch& gb, bool measure, double stats[3]);
  absl::StatusOr<bool> Update(int64_t step, GradNorm& norm);
  absl::Status AfterStep(const data::GlobalBatch& gb, const double stats[3], bool applied,
                         const GradNorm& norm, double lr, absl::Time step_start);
  void Report(int64_t step, bool applied, const GradNorm& norm, double lr,
              absl::Time step_start) const;
  absl::StatusOr<TrainResult> Finish();
  // At the end of Finish: every rank's figures into rank 0's result.ranks.
  absl::Status GatherRanks();
  void KeepResidentState();
};

absl::Status Trainer::State::CheckOptions() {
  if (options.comm == nullptr) return absl::InvalidArgumentError("TrainerOptions.comm is null");
  comm = options.comm;
  // Collectives over host memory (control, sums across ranks, restores, fingerprints) go to
  // host_comm when the gradients' communicator takes device memory only (NCCL).
  hcomm = options.host_comm != nullptr ? options.host_comm : comm;
  if (hcomm->rank() != comm->rank() || hcomm->size() != comm->size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("TrainerOptions.host_comm is rank ", hcomm->rank(), " of ", hcomm->size(),
                     " but comm is rank ", comm->rank(), " of ", comm->size()));
  }
  rank = comm->rank();
  world = comm->size();
  leader = rank == 0;
  return absl::OkStatus();
}

absl::Status Trainer::State::BuildMesh() {
  RM_ASSIGN_OR_RETURN(groups, BuildMeshGroups(config, *hcomm, options.op_timeout));
  return absl::OkStatus();
}

// The data, the model, and the device the step runs on (its memory holds the flat buffers).
absl::Status Trainer::State::LoadModel() {
  // Threads: the config's, or this host's cores shared among its ranks.
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads =
      config.threads > 0 ? config.threads : std::max(1, cores / std::max(1, options.local_ranks));
  kernels::SetBlasThreads(threads);
  if (options.train_data != nullptr) {
    data.train = options.train_data;
    data.test = options.test_data;
  } else {
    RM_ASSIGN_OR_RETURN(data, LoadJobData(config));
  }
  allocating = "the model (model)";
  RM_ASSIGN_OR_RETURN(model, CreateModel(config.model, data.train->info()));
  // The step buffers' elements: data parallelism's padded flat space, or a rank's pieces.
  int64_t elements = PaddedElements(model->table().total_elements(), world);
  if (UsesShardedStrategy(config)) {
    RM_ASSIGN_OR_RETURN(FsdpLayout layout, ShardedLayout(ShardedOptionsFor(config, *model), world));
    elements = layout.local_elements;
  }
  if (HasMesh(config)) elements = 0;  // the stages' buffers: BuildState sizes them
  allocating = "the model's state on its device";
  RM_ASSIGN_OR_RETURN(device, ChooseDevice(config, *model, elements, options.gpu, &why_cpu));
  RM_RETURN_IF_ERROR(CheckHostMemory(config, *model, world,
                                     /*gradients_on_host=*/device == nullptr, options.local_ranks));
  ops = device != nullptr ? device->ops() : HostVectorOps();
  return absl::OkStatus();
}

// The gradients' communicator: NCCL when every rank trains on its own GPU and the config
// allows it, with `comm` kept for the host collectives; else `comm`.
absl::Status Trainer::State::ChooseGradientComm() {
  if (comm->backend() == "nccl" || config.backend == TrainConfig::Backend::kTcp) {
    return absl::OkStatus();
  }
  if (options.nccl_store == nullptr) {
    if (config.backend != TrainConfig::Backend::kNccl) return absl::OkStatus();
    return absl::FailedPreconditionError(
        "backend: nccl, but this trainer was given no Store to bootstrap NCCL through "
        "(TrainerOptions.nccl_store); set backend: auto or tcp");
  }
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
  RM_ASSIGN_OR_RETURN(std::vector<std::string> ids, GatherGpuIds(*hcomm, mine, Deadline()));
  RM_ASSIGN_OR_RETURN(GradientBackendChoice choice, ChooseGradientBackend(config.backend, ids));
  why_backend = choice.reason;
  if (!choice.nccl) return absl::OkStatus();
  NcclGradientsOptions no;
  no.rank = rank;
  no.size = world;
  no.store = options.nccl_store;
  no.prefix = options.nccl_prefix;
  no.gpu = CudaOrdinalForSlot(options.gpu);
  no.init_timeout = options.op_timeout;
  RM_ASSIGN_OR_RETURN(nccl, CreateNcclGradients(no));
  comm = nccl.get();
  return absl::OkStatus();
}

// The parallel strategy, the step's buffers (the whole flat space, or this rank's shard
// under ZeRO-2/3 on the CPU) initialised from the seed, and the optimizer over the part of
// the state this rank updates.
absl::Status Trainer::State::BuildState() {
  const state::TensorTable& table = model->table();
  const bool sharded = UsesShardedStrategy(config);
  VectorOps* comm_ops = device != nullptr ? device->comm_ops() : HostVectorOps();
  if (groups.mesh) {
    // On GPUs with NCCL the stages' groups are split from it; else the host groups serve
    // (staging a device's memory through the host).
    if (device != nullptr && nccl != nullptr) {
      RM_RETURN_IF_ERROR(BuildDeviceMeshGroups(groups, *nccl, options.op_timeout));
    }
    RM_ASSIGN_OR_RETURN(strategy, CreatePipelineStrategy(config, *model, groups, *hcomm,
                                                         options.op_timeout, device.get()));
    pipeline = strategy->pipeline();
    if (device != nullptr) RM_RETURN_IF_ERROR(device->ResizeBuffers(strategy->local_elements()));
  } else if (sharded) {
    ShardedOptions so = ShardedOptionsFor(config, *model);
    so.op_timeout = options.op_timeout;
    so.ops = ops;
    so.comm_ops = comm_ops;
    RM_ASSIGN_OR_RETURN(strategy, CreateShardedDataParallel(comm, hcomm, so));
  } else {
    DataParallelOptions dp;
    dp.elements = table.total_elements();
    dp.zero_stage = config.zero_stage;
    dp.bucket_mb = config.bucket_mb;
    // Synchronized BatchNorm all-reduces on the training thread during backward, which must
    // not run beside the communication thread's bucket reductions.
    dp.overlap = config.overlap && !SyncsBatchNorm(config);
    dp.op_timeout = options.op_timeout;
    dp.ops = ops;
    dp.comm_ops = comm_ops;
    RM_ASSIGN_OR_RETURN(strategy, CreateDataParallel(comm, hcomm, dp));
  }
  RM_RETURN_IF_ERROR(CheckProcessMemoryLimit(
      {&config, model.get(), strategy.get(), world, /*state_on_host=*/device == nullptr}));
  const int64_t local = strategy->local_elements();
  allocating = absl::StrFormat("the %s parameters and gradients (%d floats each, %.4g GiB)",
                               pipeline != nullptr ? "pipeline stages'"
                               : sharded           ? "sharded"
                                                   : "flat",
                               local, local * 4.0 / (1 << 30));
  params = state::FlatBuffer(local);
  grads = state::FlatBuffer(device != nullptr ? 0 : local);
  step_params = device != nullptr ? device->params() : params.span();
  step_grads = device != nullptr ? device->grads() : grads.span();
  if (pipeline != nullptr) {
    // Each rank holds its stages' tensors: it fills them from the common seed.
    params.Zero();
    model->InitPieces(config.seed, pipeline->held_pieces(), params.span());
  } else if (strategy->store() != nullptr) {
    // Each rank holds other pieces: it fills its own from the common seed.
    params.Zero();
    model->InitPieces(config.seed, strategy->update_pieces(), params.span());
  } else {
    model->Init(config.seed, params);
    // Every rank initialises from the same seed; the broadcast makes equality a fact.
    RM_RETURN_IF_ERROR(
        hcomm->Broadcast(params.data(), params.data(), local, DataType::kFloat32, 0, Deadline()));
  }
  const state::FlatRange window = strategy->update_window();
  allocating = absl::StrFormat("the optimizer state (%d elements per moment)", window.size());
  RM_ASSIGN_OR_RETURN(optimizer, CreateOptimizer(table, strategy->update_pieces(), window.size(),
                                                 config.optimizer, ops));
  optimizer->set_duplicate_ranges(strategy->duplicate_ranges());
  allocating = "the trainer's working memory (batches, activations, buffers)";
  view = std::make_unique<HostView>(params, *optimizer, device.get());
  return absl::OkStatus();
}

// The data order, the batch plan, the length, the learning-rate schedule and fp16's loss
// scaler.
absl::Status Trainer::State::BuildSchedule() {
  RM_ASSIGN_OR_RETURN(sampler,
                      data::GlobalBatchSampler::Create(data.train->size(), {config.seed, false}));
  if (groups.mesh) {
    RM_ASSIGN_OR_RETURN(plan, PlanPipelineBatches(config, groups.dp_size));
  } else {
    RM_ASSIGN_OR_RETURN(plan, PlanRankBatches(config, world));
  }
  steps_per_epoch = sampler->BatchesPerEpoch(config.global_batch);
  total_steps = config.steps > 0 ? config.steps : config.epochs * steps_per_epoch;
  LrScheduleOptions lo = config.schedule;
  lo.base_lr = config.lr;
  lo.global_batch = config.global_batch;
  lo.warmup_steps = config.schedule.warmup_steps;  // LrSchedule clamps it to the run, saying so
  lo.total_steps = std::max<int64_t>(1, total_steps);
  RM_ASSIGN_OR_RETURN(schedule, LrSchedule::Create(lo));
  if (config.precision == Precision::kFloat16) {
    RM_ASSIGN_OR_RETURN(scaler, LossScaler::Create(config.loss_scale));
  }
  return absl::OkStatus();
}

void Trainer::State::SayStart() const {
  const state::TensorTable& table = model->table();
  Say(absl::StrCat("job ", config.name, ": ", model->Describe(), " (", table.parameter_count(),
                   " parameters) on ", Plural(world, "rank"), ", ", data.train->info().name));
  Say(absl::StrCat("batch: global ", config.global_batch, ", ", plan.DebugString(), "; ",
                   total_steps, " steps (", steps_per_epoch, " per epoch); ",
                   PrecisionName(config.precision), "; ", strategy->Describe(), "; ", threads,
                   " BLAS thread(s) per rank"));
  if (data.test != nullptr && (config.data.eval_every_steps > 0 || data.test->info().context > 0)) {
    Say(absl::StrCat("evaluation: ", data.test->info().name, ", ", EvaluatedSamples(), " of its ",
                     data.test->size(), " samples",
                     config.data.eval_every_steps > 0
                         ? absl::StrCat(" every ", config.data.eval_every_steps, " steps")
                         : "",
                     config.data.eval_every_epoch ? ", after every data epoch" : "",
                     config.data.final_eval ? " and after the last step"
                                            : " (data.final_eval: false: not after the last step)",
                     data.test->info().context > 0 ? " (loss and perplexity)" : ""));
  }
  if (!BlasNote().empty()) Say(BlasNote());
  Say(absl::StrCat("optimizer: ", optimizer->Describe(), "; ", schedule->Describe(),
                   scaler ? absl::StrCat("; ", scaler->Describe()) : std::string()));
  if (groups.mesh) Say(absl::StrCat("mesh: ", groups.mesh->ToString()));
  if (SyncsBatchNorm(config) && config.overlap) {
    Say("parallelism.overlap: off, as model.resnet18.sync_batchnorm all-reduces BatchNorm sums "
        "during backward");
  }
  if (config.fingerprint_every > 0 && strategy->store() != nullptr &&
      strategy->replicated_parameters() == nullptr) {
    Say("fingerprints: none compared (diagnostics.fingerprint_every): under ZeRO-3 each "
        "parameter has one copy, its owner's, so no replicas can drift apart");
  }
  std::vector<std::string> gradient_notes;
  if (comm->backend() == "tcp") gradient_notes.push_back("staged through host memory");
  if (!why_backend.empty()) gradient_notes.push_back(why_backend);
  Say(device != nullptr
          ? absl::StrCat("device: ", device->Describe(), "; gradients over ", comm->backend(), " (",
                         absl::StrJoin(gradient_notes, "; "), ")")
          : absl::StrCat("device: cpu", why_cpu.empty() ? "" : absl::StrCat(" (", why_cpu, ")")));
}

// Restores the state (survivors' memory or a checkpoint), sets up the saves, and sends the
// state to the device.
absl::Status Trainer::State::RestoreAndCheckpoint() {
  const state::TensorTable& table = model->table();
  Env* env = options.checkpoint_env != nullptr ? options.checkpoint_env : Env::Default();
  RestoreOptions ro;
  ro.config = &config;
  ro.comm = hcomm;
  ro.op_timeout = options.op_timeout;
  ro.env = env;
  ro.table = &table;
  ro.params = &params;
  ro.optimizer_buffers = &view->optimizer();
  ro.optimizer = optimizer.get();
  ro.scaler = scaler ? &*scaler : nullptr;
  ro.resident = options.resident;
  ro.whole_state = strategy->whole_state_on_every_rank();
  if (strategy->store() != nullptr || pipeline != nullptr) {
    ro.param_pieces = strategy->held_pieces();
  }
  ro.total_steps = total_steps;
  ro.schedule = &*schedule;
  ro.say = [this](const std::string& line) { Say(line); };
  RM_ASSIGN_OR_RETURN(Restored restored, RestoreTrainingState(ro));
  if (!config.init_from.empty()) {
    // A checkpoint of this job (its own progress) wins over the weights it started from.
    if (restored.resumed_from_step >= 0) {
      Say(absl::StrCat("init_from: ", config.init_from, " not read: this job resumed at step ",
                       restored.resumed_from_step, " (a checkpoint of its own wins)"));
    } else {
      InitFromOptions io;
      io.path = config.init_from;
      io.table = &table;
      io.params = &params;
      io.pieces = ro.param_pieces;
      io.env = env;
      io.say = [this](const std::string& line) { Say(absl::StrCat("init_from: ", line)); };
      RM_RETURN_IF_ERROR(LoadInitialWeights(io));
    }
  }
  first_step = step = restored.step;
  sampler_state = restored.sampler;
  result.set_resumed_from_step(static_cast<int32_t>(restored.resumed_from_step));
  result.set_resumed_from_memory_of(restored.resumed_from_memory_of);
  if (options.on_resumed) options.on_resumed(restored);
  if (!config.checkpoint.dir.empty()) {
    CheckpointPolicyOptions co;
    co.config = &config;
    co.comm = hcomm;
    co.op_timeout = options.op_timeout;
    co.env = options.checkpoint_env;
    co.signalled_preemption_rate = options.preemption_rate_per_hour;
    co.table = &table;
    co.zero_stage = config.zero_stage;
    // The staging copy for a save: this rank's pieces of the parameters and each moment,
    // reserved now so the first save does not pay its page faults.
    const std::vector<state::PlacedRange> saved = strategy->saved_pieces();
    co.staging_reserve_bytes = state::PlacedElements(saved) * 4 *
                               (1 + static_cast<int64_t>(optimizer->state_buffers().size() /
                                                         std::max<size_t>(1, saved.size())));
    co.pull = [this] { return view->Pull(HostView::What::kEverything); };
    co.request = [this, saved](int64_t done) {
      const int64_t total = model->table().total_elements();
      checkpoint::SaveRequest req;
      req.step = done;
      for (const state::PlacedRange& p : saved) {
        req.buffers.push_back(
            {"params", total, p.range, params.span().subspan(p.at, p.range.size())});
      }
      // The optimizer's buffers, cut to the saved pieces (under ZeRO-0 every rank keeps all
      // of them and saves its part); every rank names each buffer, if only with nothing.
      for (StateBuffer& b : view->optimizer()) {
        for (const state::PlacedRange& p : saved) {
          const state::FlatRange part{std::max(b.range.begin, p.range.begin),
                                      std::min(b.range.end, p.range.end)};
          if (part.begin >= part.end) continue;
          req.buffers.push_back(
              {b.name, total, part, b.data.subspan(part.begin - b.range.begin, part.size())});
        }
        const bool named =
            std::any_of(req.buffers.begin(), req.buffers.end(),
                        [&](const checkpoint::BufferShard& x) { return x.name == b.name; });
        if (!named) req.buffers.push_back({b.name, total, {0, 0}, {}});
      }
      req.state.step = done;
      req.state.sampler = sampler_state;
      req.state.rng_seed = config.seed;
      if (scaler) req.state.loss_scaler = scaler->state();
      req.state.optimizer_step = optimizer->step();
      req.state.schedule_step = done;
      return req;
    };
    co.say = [this](const std::string& line) { Say(line); };
    co.on_checkpoint = options.on_checkpoint;
    allocating =
        absl::StrFormat("the checkpoint staging area (%d bytes)", co.staging_reserve_bytes);
    RM_ASSIGN_OR_RETURN(checkpoints, CheckpointPolicy::Create(co));
    allocating = "the trainer's working memory (batches, activations, buffers)";
    checkpoints->ReportLatestCommitted();
  }
  // The initial or restored state goes to the device (nothing to do on the CPU), and every
  // rank's parameters from it (ZeRO-2's compute copy).
  RM_RETURN_IF_ERROR(view->Push());
  if (strategy->store() != nullptr) RM_RETURN_IF_ERROR(strategy->AfterOptimizerStep(step_params));
  consistent_step = first_step;
  consistent_optimizer_step = optimizer->step();
  consistent_sampler = sampler_state;
  if (scaler) consistent_scaler = scaler->state();
  keep_resident = options.resident != nullptr && strategy->whole_state_on_every_rank();
  return absl::OkStatus();
}

absl::Status Trainer::State::Evaluate(int64_t done) {
  if (data.test == nullptr) return absl::OkStatus();
  const absl::Time start = absl::Now();
  absl::Status s = RunEvaluation(done);
  last_eval_time = absl::Now() - start;
  eval_time += last_eval_time;
  ++evaluations;
  reporter->ExcludeFromRates(last_eval_time);
  return s;
}

absl::Status Trainer::State::FinalEvaluation() {
  if (data.test == nullptr || !config.data.final_eval) return absl::OkStatus();
  const bool stale = (config.data.eval_every_steps > 0 || data.test->info().context > 0) &&
                     result.eval_step() != step;
  if (result.has_eval_accuracy() && !stale) return absl::OkStatus();
  RM_RETURN_IF_ERROR(Evaluate(step));
  const absl::Duration took = last_eval_time;
  result.set_final_eval_seconds(absl::ToDoubleSeconds(took));
  const bool language = data.test->info().context > 0;
  Say(absl::StrFormat(
      "evaluation after step %d: %s %.4f, loss %.4f (%d samples of %s, %.2f s, not counted in "
      "the training throughput; data.final_eval: false skips it)",
      step, language ? "perplexity" : "test accuracy",
      language ? result.eval_perplexity() : result.eval_accuracy(), result.eval_loss(),
      EvaluatedSamples(), data.test->info().name, absl::ToDoubleSeconds(took)));
  return absl::OkStatus();
}

absl::Status Trainer::State::RunEvaluation(int64_t done) {
  double stats[3] = {0, 0, 0};  // loss sum, terms, correct
  const int64_t eval_batch = EvaluationBatchSamples(config, plan);
  // data.eval_samples: n samples spread evenly over the data set (sample floor(i size / n)).
  const int64_t size = data.test->size();
  const int64_t n = EvaluatedSamples();
  // Under a mesh the ranks of a data-parallel replica evaluate its share together (the loss
  // on its last stage's ranks); without one dp is the whole job.
  const std::vector<data::Range> mine =
      data::EvaluationBatches(n, eval_batch, groups.dp_size, groups.dp_rank);
  ParameterStore* store = strategy->store();
  // With a store the ranks gather units together: every rank runs as many batches as the
  // rank with the most, the extra ones on a stand-in sample whose result is dropped.
  size_t batches = mine.size();
  if (store != nullptr) {
    for (int r = 0; r < groups.dp_size; ++r) {
      batches = std::max(batches, data::EvaluationBatches(n, eval_batch, groups.dp_size, r).size());
    }
  }
  RM_RETURN_IF_ERROR(view->Pull(HostView::What::kParams));
  for (size_t i = 0; i < batches; ++i) {
    const bool real = i < mine.size();
    std::vector<int64_t> idx = real ? data::RangeIndices(mine[i]) : std::vector<int64_t>{0};
    if (n < size) {
      for (int64_t& k : idx) k = k * size / n;
    }
    RM_RETURN_IF_ERROR(data.test->Gather(idx, &batch));
    absl::StatusOr<StepStats> s;
    if (pipeline != nullptr) {
      s = pipeline->Evaluate(batch, step_params, config.precision);
    } else if (store != nullptr) {
      RM_RETURN_IF_ERROR(strategy->MaterializeParameters(step_params));
      strategy->BeginPass(ParallelStrategy::Pass::kEvaluate);
      s = StepModel().Evaluate(batch, params, config.precision, store);
      RM_RETURN_IF_ERROR(strategy->EndEvaluation());
    } else {
      s = StepModel().Evaluate(batch, params, config.precision);
    }
    if (!s.ok()) return s.status();
    if (!real) continue;
    stats[0] += s->loss_sum;
    stats[1] += static_cast<double>(s->loss_terms);
    stats[2] += static_cast<double>(s->correct);
  }
  RM_RETURN_IF_ERROR(
      hcomm->AllReduce(stats, stats, 3, DataType::kFloat64, comm::ReduceOp::kSum, Deadline()));
  result.set_eval_loss(stats[0] / std::max(1.0, stats[1]));
  result.set_eval_accuracy(stats[2] / std::max(1.0, stats[1]));
  // A language model's perplexity: exp of the mean loss per token.
  if (data.test->info().context > 0) result.set_eval_perplexity(std::exp(result.eval_loss()));
  result.set_eval_step(static_cast<int32_t>(done));
  return absl::OkStatus();
}

// This rank's share of the global batch in micro-batches; the last one's gradients are
// handed to the strategy as backward finishes them. `stats`: loss sum, terms, correct.
absl::Status Trainer::State::ForwardBackward(const data::GlobalBatch& gb, bool measure,
                                             double stats[3]) {
  const int64_t count = static_cast<int64_t>(gb.indices.size());
  ForwardBackwardOptions fb;
  fb.loss_divisor = static_cast<double>(count * model->LossTermsPerSample());
  fb.loss_scale = scaler ? scaler->scale() : 1.0f;
  fb.precision = config.precision;
  const bool sync_batchnorm = SyncsBatchNorm(config);
  if (sync_batchnorm) {
    comm::Communicator* c = hcomm;
    const absl::Duration timeout = options.op_timeout;
    fb.sum_across_replicas = [c, timeout](absl::Span<double> values) {
      return c->AllReduce(values.data(), values.data(), values.size(), DataType::kFloat64,
                          comm::ReduceOp::kSum, absl::Now() + timeout);
    };
  }
  RM_RETURN_IF_ERROR(strategy->MaterializeParameters(step_params));
  strategy->BeginGradients(step_grads.data(), measure);
  if (pipeline != nullptr) {
    std::vector<bool> discarded;
    RM_RETURN_IF_ERROR(GatherPipelineMicroBatches(plan, gb, groups.dp_rank, *data.train,
                                                  &micro_batches, &discarded));
    RM_ASSIGN_OR_RETURN(StepStats s,
                        pipeline->RunStep(micro_batches, step_params, step_grads, fb, discarded));
    stats[0] += s.loss_sum;
    stats[1] += static_cast<double>(s.loss_terms);
    stats[2] += static_cast<double>(s.correct);
    RM_RETURN_IF_ERROR(strategy->ReduceGradients());
    comm_time += strategy->last_step().comm_time;
    exposed_comm += strategy->last_step().exposed_wait;
    return absl::OkStatus();
  }
  ParameterStore* store = strategy->store();
  fb.store = store;
  bool ran = false;
  for (int micro = 0; micro < plan.accumulation_steps; ++micro) {
    const data::Range r = plan.MicroBatch(count, groups.dp_rank, micro);
    // A short batch leaves this rank without samples: it contributes zeros. With a store it
    // still runs the micro-batch (on a stand-in sample whose gradients are dropped), since
    // every rank takes part in every unit's gathers and reductions.
    // With synchronized BatchNorm it runs an empty batch: its sums are collectives.
    if (r.empty() && store == nullptr && !sync_batchnorm) continue;
    const absl::Span<const int64_t> indices =
        r.empty() ? absl::MakeConstSpan(gb.indices).subspan(0, store != nullptr ? 1 : 0)
                  : absl::MakeConstSpan(gb.indices).subspan(r.begin, r.size());
    RM_RETURN_IF_ERROR(data.train->Gather(indices, &batch));
    fb.accumulate = ran && store == nullptr;
    if (micro == plan.accumulation_steps - 1) {
      ParallelStrategy* s = strategy.get();
      fb.on_grads_ready = [s](int64_t offset) { s->GradientsReady(offset); };
    } else {
      fb.on_grads_ready = nullptr;
    }
    strategy->BeginPass(r.empty() ? ParallelStrategy::Pass::kDiscard
                                  : ParallelStrategy::Pass::kTrain);
    RM_ASSIGN_OR_RETURN(StepStats s, device != nullptr
                                         ? device->ForwardBackward(batch, fb)
                                         : StepModel().ForwardBackward(batch, params, grads, fb));
    if (r.empty()) continue;
    ran = true;
    stats[0] += s.loss_sum;
    stats[1] += static_cast<double>(s.loss_terms);
    stats[2] += static_cast<double>(s.correct);
  }
  if (!ran && store == nullptr) RM_RETURN_IF_ERROR(ops->Zero(step_grads));
  RM_RETURN_IF_ERROR(strategy->ReduceGradients());
  comm_time += strategy->last_step().comm_time;
  exposed_comm += strategy->last_step().exposed_wait;
  return absl::OkStatus();
}

// fp16's unscaling and overflow check, clipping, and the optimizer on this rank's part of
// the reduced gradient; false when the step was skipped (fp16 overflow).
absl::StatusOr<bool> Trainer::State::Update(int64_t step, GradNorm& norm) {
  const state::FlatRange owned = strategy->update_window();
  absl::Span<float> g = state::Slice(step_grads, owned);
  bool apply = true;
  if (scaler) {
    RM_ASSIGN_OR_RETURN(StepVerdict v, scaler->UnscaleAndUpdate(g, strategy->sum(), ops));
    apply = v == StepVerdict::kApply;
  }
  if (apply) {
    RM_ASSIGN_OR_RETURN(norm, ClipGradNorm(g, {config.clip_grad_norm}, strategy->sum(), ops,
                                           strategy->duplicate_ranges()));
    apply = norm.finite();
    // Only fp16's loss scaler skips steps on purpose (and lowers its scale); elsewhere a
    // gradient that is not finite means the run diverged. The norm is global: every rank
    // stops here alike.
    if (!apply && !scaler) {
      return Diverged(
          config, step + 1,
          absl::StrCat("the gradient norm is ", norm.norm, " and ", PrecisionName(config.precision),
                       " has no loss scaler to skip such a step"),
          result.skipped_steps());
    }
  }
  // The optimizer writes the parameters and moments that a save begun after the last step
  // may still be copying (its copy overlapped this step's forward and backward).
  if (checkpoints != nullptr) checkpoints->FinishSnapshot();
  updating = true;
  if (apply) {
    RM_RETURN_IF_ERROR(optimizer->Step(schedule->LrAt(step), state::Slice(step_params, owned), g,
                                       strategy->sum()));
    view->Invalidate();
    RM_RETURN_IF_ERROR(strategy->AfterOptimizerStep(step_params));
  } else {
    result.set_skipped_steps(result.skipped_steps() + 1);
  }
  // The model's buffers (BatchNorm running statistics) from this step's forwards; every
  // rank takes rank 0's, as PyTorch DDP broadcasts its buffers from rank 0 (with
  // synchronized statistics they are the same already).
  const state::FlatRange buffers = model->buffer_range();
  if (buffers.size() > 0 && device == nullptr) {
    model->UpdateBuffers(params.span());
    RM_RETURN_IF_ERROR(hcomm->Broadcast(params.data() + buffers.begin,
                                        params.data() + buffers.begin, buffers.size(),
                                        DataType::kFloat32, 0, Deadline()));
  }
  return apply;
}

// After the update: one small all-reduce of the loss and the ranks' votes (to drain, to
// save now, and their own failed saves: signals and clocks differ between ranks; the sum
// makes every rank decide alike), then the saves, fingerprints, evaluation and reports the
// step triggers.
absl::Status Trainer::State::AfterStep(const data::GlobalBatch& gb, const double stats[3],
                                       bool applied, const GradNorm& norm, double lr,
                                       absl::Time step_start) {
  const int64_t done = step + 1;
  const bool last_step = done == total_steps;
  const bool drain_vote = (options.drain_requested != nullptr && options.drain_requested->load()) ||
                          (options.stop_at_step > 0 && done >= options.stop_at_step);
  bool save_vote = options.save_requested != nullptr && options.save_requested->exchange(false);
  if (checkpoints != nullptr && checkpoints->TimeToSave()) save_vote = true;
  double control[6] = {stats[0],
                       stats[1],
                       stats[2],
                       drain_vote ? 1.0 : 0.0,
                       save_vote ? 1.0 : 0.0,
                       checkpoints != nullptr ? checkpoints->own_failures() : 0.0};
  RM_RETURN_IF_ERROR(
      hcomm->AllReduce(control, control, 6, DataType::kFloat64, comm::ReduceOp::kSum, Deadline()));
  result.set_final_loss(control[0] / std::max(1.0, control[1]));
  // The loss is all-reduced: every rank stops here alike, before saving what diverged.
  if (!std::isfinite(result.final_loss())) {
    return Diverged(config, done, absl::StrCat("the loss is ", result.final_loss()),
                    result.skipped_steps());
  }
  const bool drain = control[3] > 0 && !last_step;
  if (checkpoints != nullptr) {
    RM_RETURN_IF_ERROR(checkpoints->AfterStep(done, drain, last_step, control[4], control[5]));
  }
  // The replicas the ranks compute with: the parameters, or ZeRO-2's compute copy (ZeRO-3
  // keeps none; SayStart said so).
  const float* replicas = pipeline != nullptr            ? nullptr
                          : strategy->store() == nullptr ? params.data()
                                                         : strategy->replicated_parameters();
  if (config.fingerprint_every > 0 && replicas != nullptr &&
      (done % config.fingerprint_every == 0 || last_step)) {
    RM_RETURN_IF_ERROR(view->Pull(HostView::What::kParams));
    state::FlatBuffer copy;  // ZeRO-2's compute copy on a GPU, read on the host
    if (replicas != params.data() && ops->device_memory()) {
      copy = state::FlatBuffer(model->table().total_elements());
      RM_RETURN_IF_ERROR(
          ops->CopyToHost({replicas, static_cast<size_t>(copy.size())}, copy.data()));
      replicas = copy.data();
    }
    RM_RETURN_IF_ERROR(
        CheckFingerprints(*hcomm, model->table(), replicas, result.final_loss(), done, Deadline()));
  }
  if (config.fingerprint_every > 0 && pipeline != nullptr &&
      (done % config.fingerprint_every == 0 || last_step)) {
    RM_RETURN_IF_ERROR(view->Pull(HostView::What::kParams));
    RM_RETURN_IF_ERROR(CheckMeshFingerprints(groups, *hcomm, *pipeline, params.span(),
                                             result.final_loss(), done, Deadline()));
  }
  const bool epoch_end = gb.next.epoch != gb.start.epoch;
  const bool evaluated = (epoch_end && config.data.eval_every_epoch) || EvaluationDueBySteps(done);
  if (evaluated) {
    RM_RETURN_IF_ERROR(Evaluate(done));
    if (last_step) result.set_final_eval_seconds(absl::ToDoubleSeconds(last_eval_time));
  }
  if (RecordsStep(gb, step)) {
    StepLine line;
    line.step = done;
    line.epoch = gb.start.epoch;
    line.loss = result.final_loss();
    line.lr = lr;
    line.grad_norm = norm.norm;
    line.local_grad_norm = strategy->last_step().local_grad_norm;
    if (scaler) line.loss_scale = scaler->scale();
    line.skipped_steps = result.skipped_steps();
    if (evaluated && result.has_eval_accuracy()) {
      line.test_loss = result.eval_loss();
      if (result.has_eval_perplexity()) {
        line.test_perplexity = result.eval_perplexity();
      } else {
        line.test_accuracy = result.eval_accuracy();
      }
    }
    reporter->Log(line, strategy->last_step());
  }
  Report(step, applied, norm, lr, step_start);
  if (drain) {
    result.set_drained(true);
    finished = true;
    Say(absl::StrCat("drained after step ", done, " of ", total_steps));
  }
  return absl::OkStatus();
}

// TrainerOptions::on_step.
void Trainer::State::Report(int64_t step, bool applied, const GradNorm& norm, double lr,
                            absl::Time step_start) const {
  if (!options.on_step) return;
  StepReport report;
  report.step = step + 1;
  report.total_steps = total_steps;
  report.loss = result.final_loss();
  report.grad_norm = applied ? norm.norm : 0;
  report.step_time = absl::Now() - step_start;
  report.comm_time = strategy->last_step().comm_time;
  const StepReporter::Rates rates = reporter->rates();
  report.steps_per_s = rates.steps_per_s;
  report.samples_per_s = rates.samples_per_s;
  report.tokens_per_s = rates.tokens_per_s;
  report.exposed_comm_fraction = reporter->last_window().exposed_comm_fraction;
  report.lr = lr;
  report.loss_scale = scaler ? scaler->scale() : 0;
  report.comm = CommCounters();
  report.buckets = strategy->bucket_counters();
  report.steps_run = step + 1 - first_step;
  if (leader && checkpoints != nullptr) {
    report.checkpoint_error_step = checkpoints->last_failed_step();
    report.checkpoint_error = checkpoints->last_failure();
  }
  options.on_step(report);
}

absl::StatusOr<TrainResult> Trainer::State::Finish() {
  // The steps' time, to the end of the last one: not its checkpoint, nor the final evaluation.
  const double training = std::max(1e-9, absl::ToDoubleSeconds(reporter->training_time()));
  if (checkpoints != nullptr) {
    const CheckpointTotals totals = checkpoints->Finish();
    result.set_checkpoints_saved(static_cast<int32_t>(totals.saved));
    result.set_checkpoint_failures(static_cast<int32_t>(totals.failed));
    result.set_checkpoints_skipped(static_cast<int32_t>(totals.skipped));
  }
  // The last evaluation is of the final parameters with data.eval_every_steps or for a
  // language model (a drained run evaluates where it stopped); a classifier keeps its last
  // epoch's.
  RM_RETURN_IF_ERROR(FinalEvaluation());
  result.set_elapsed_seconds(absl::ToDoubleSeconds(reporter->elapsed()));
  result.set_training_seconds(training);
  result.set_evaluations(evaluations);
  result.set_eval_seconds(absl::ToDoubleSeconds(eval_time));
  result.set_comm_seconds(absl::ToDoubleSeconds(comm_time));
  result.set_exposed_comm_seconds(absl::ToDoubleSeconds(exposed_comm));
  const int64_t steps_run = step - first_step;
  if (steps_run > 0) {
    const double steps = static_cast<double>(steps_run);
    result.set_comm_bytes_per_step(static_cast<double>(step_bytes_sent) / steps);
    result.set_pipeline_bytes_per_step(static_cast<double>(step_bytes_pipeline) / steps);
    result.set_tensor_parallel_bytes_per_step(static_cast<double>(step_bytes_tensor_parallel) /
                                              steps);
  }
  if (pipeline != nullptr) {
    const std::vector<state::PlacedRange> held = pipeline->held_pieces();
    result.set_block_parameters(static_cast<double>(BlockElements(model->table(), held)));
  } else {
    result.set_block_parameters(static_cast<double>(BlockElements(StepModel().table())));
  }
  result.set_gathered_bytes(static_cast<double>(step_bytes_gathered));
  result.set_reduced_bytes(static_cast<double>(step_bytes_reduced));
  result.set_samples_per_second(static_cast<double>(reporter->total_samples()) / training);
  if (data.train->info().context > 0) {
    result.set_tokens_per_second(result.samples_per_second() * data.train->info().context);
  }
  const int64_t activations = pipeline != nullptr ? pipeline->activation_bytes()
                              : device != nullptr ? device->activation_bytes()
                                                  : StepModel().memory().activation_bytes_peak;
  result.set_activation_bytes_peak(static_cast<double>(activations));
  if (pipeline != nullptr) {
    result.set_pipeline_bubble(pipeline->measured_bubble());
    result.set_pipeline_bubble_formula(pipeline->formula_bubble());
    result.set_pipeline_peak_in_flight(pipeline->peak_in_flight());
  }
  if (pipeline != nullptr && config.mesh.pp > 1) {  // a tp-only mesh has no pipeline to tell of
    const std::string line = absl::StrFormat(
        "pipeline on rank %d (stage-rank %d of %d): bubble %.1f %% measured (the schedule's "
        "formula %.1f %%), at most %d micro-batch(es) of activations in flight (%.2f MiB)",
        rank, pipeline->pp_rank(), config.mesh.pp, 100 * pipeline->measured_bubble(),
        100 * pipeline->formula_bubble(), pipeline->peak_in_flight(),
        static_cast<double>(activations) / (1 << 20));
    if (leader) {
      Say(line);
    } else {
      LOG(INFO) << line;
    }
  }
  // Memory held by this rank against the plan (train/memory_plan.h; `ringctl estimate
  // memory` prints it before a job runs).
  constexpr double kMiB = 1 << 20;
  std::string planned;
  TrainConfig on_cpu = config;  // the plan printed is a CPU rank's (device auto resolved)
  on_cpu.device = TrainConfig::Device::kCpu;
  if (auto p = PlanRankState(on_cpu, *model, world, rank, config.zero_stage, config.fsdp.wrap);
      p.ok() && device == nullptr && !groups.mesh) {
    planned = absl::StrFormat(
        "; planned for rank %d: parameters %.2f (+ copy %.2f), gradients %.2f, optimizer %.2f, "
        "unit buffers at most %.2f MiB",
        p->rank, p->parameter_bytes / kMiB, p->compute_copy_bytes / kMiB,
        p->gradient_bytes / kMiB, p->optimizer_bytes / kMiB, p->unit_buffer_bytes / kMiB);
  }
  const int64_t copy_bytes = pipeline != nullptr ? pipeline->parameter_copy_bytes()
                             : device != nullptr ? device->parameter_copy_bytes()
                                                 : 0;
  const int64_t units = strategy->unit_buffer_bytes_peak();
  const int64_t replica =
      strategy->store() != nullptr && strategy->replicated_parameters() != nullptr
          ? model->table().total_elements() * 4
          : 0;
  result.set_parameter_bytes(static_cast<double>(step_params.size() * 4 + replica));
  result.set_gradient_bytes(static_cast<double>(step_grads.size() * 4));
  result.set_unit_buffer_bytes(static_cast<double>(units));
  struct rusage usage;
  if (getrusage(RUSAGE_SELF, &usage) == 0) {
    result.set_peak_rss_bytes(static_cast<double>(usage.ru_maxrss) * 1024);  // KiB on Linux
  }
  Say(absl::StrFormat(
      "memory on rank %d (%s): parameters %.2f MiB%s%s, gradients %.2f MiB, optimizer state "
      "%.2f MiB, activations peak %.2f MiB%s, peak RSS %.1f MiB%s",
      rank, device != nullptr ? "GPU" : "host", step_params.size() * 4 / kMiB,
      strategy->store() != nullptr ? " (this rank's shard)" : "",
      copy_bytes > 0 ? absl::StrFormat(" (+ a 16-bit copy, %.2f MiB)", copy_bytes / kMiB)
      : replica > 0  ? absl::StrFormat(" (+ the whole compute copy, %.2f MiB)", replica / kMiB)
                     : std::string(),
      step_grads.size() * 4 / kMiB, result.optimizer_state_bytes() / kMiB,
      static_cast<double>(activations) / kMiB,
      units > 0 ? absl::StrFormat(", unit buffers peak %.2f MiB", units / kMiB) : std::string(),
      result.peak_rss_bytes() / kMiB, planned));
  RM_RETURN_IF_ERROR(GatherRanks());
  if (options.on_finish) {
    RM_RETURN_IF_ERROR(view->Pull(HostView::What::kParams));
    if (strategy->store() == nullptr && pipeline == nullptr) {
      options.on_finish(model->table(), params);
    } else {  // this rank holds pieces: the whole model, gathered
      state::FlatBuffer whole(model->table().total_elements());
      RM_RETURN_IF_ERROR(strategy->WholeParameters(step_params, whole.span()));
      options.on_finish(model->table(), whole);
    }
  }
  nccl_finished = true;
  return result;
}

absl::Status Trainer::State::GatherRanks() {
  RankResult mine = RankFigures(result);
  mine.set_rank(rank);
  if (groups.mesh) {
    const comm::MeshCoordinates at = groups.mesh->Coordinates(rank);
    mine.set_pp_rank(at[static_cast<int>(comm::MeshDim::kPp)]);
    mine.set_dp_rank(at[static_cast<int>(comm::MeshDim::kDp)]);
    mine.set_tp_rank(at[static_cast<int>(comm::MeshDim::kTp)]);
  } else {
    mine.set_dp_rank(rank);
  }
  RM_ASSIGN_OR_RETURN(std::vector<RankResult> all, GatherRankResults(mine, *hcomm, Deadline()));
  result.clear_ranks();
  if (leader) {
    for (RankResult& r : all) *result.add_ranks() = std::move(r);
  }
  return absl::OkStatus();
}

void Trainer::State::KeepResidentState() {
  // Not while an exception (std::bad_alloc) unwinds: it would allocate.
  if (!keep_resident || updating || std::uncaught_exceptions() > 0) return;
  if (absl::Status pulled = view->Pull(HostView::What::kEverything); !pulled.ok()) {
    LOG(WARNING) << "no state kept in memory: " << pulled;
    return;
  }
  KeepResident(*options.resident, consistent_step, config.checkpoint.spec_hash, model->table(),
               params, view->optimizer(), consistent_optimizer_step, consistent_sampler,
               consistent_scaler);
}

Trainer::Trainer(std::unique_ptr<State> state) : s_(std::move(state)) {}

Trainer::~Trainer() {
  s_->KeepResidentState();
  // An error exit aborts NCCL rather than wait for its orderly shutdown with peers that may
  // be gone.
  if (s_->nccl != nullptr && !s_->nccl_finished) s_->nccl->Abort();
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const TrainerOptions& options) {
  std::unique_ptr<Trainer> trainer(new Trainer(std::make_unique<State>()));
  State& t = *trainer->s_;
  t.options = options;
  try {
    const absl::Status setup = [&t]() -> absl::Status {
      RM_RETURN_IF_ERROR(t.CheckOptions());
      RM_RETURN_IF_ERROR(t.BuildMesh());
      RM_RETURN_IF_ERROR(t.LoadModel());
      RM_RETURN_IF_ERROR(t.ChooseGradientComm());
      RM_RETURN_IF_ERROR(t.BuildState());
      RM_RETURN_IF_ERROR(t.BuildSchedule());
      StepReporterOptions ro;
      ro.config = &t.config;
      ro.rank = t.rank;
      ro.total_steps = t.total_steps;
      ro.context = t.data.train->info().context;
      ro.progress = t.leader ? t.options.progress : nullptr;
      RM_ASSIGN_OR_RETURN(t.reporter, StepReporter::Create(ro));
      return absl::OkStatus();
    }();
    if (!setup.ok()) return ConfigurationError(setup);
    t.SayStart();
    t.result.set_world_size(t.world);
    t.result.set_gradient_backend(std::string(t.comm->backend()));
    t.result.set_parameters(static_cast<double>(t.model->table().parameter_count()));
    t.result.set_optimizer_state_bytes(static_cast<double>(t.optimizer->state_bytes()));
    t.result.set_resumed_from_step(-1);
    t.result.set_resumed_from_memory_of(-1);
    RM_RETURN_IF_ERROR(t.RestoreAndCheckpoint());
    t.reporter->StartAt(t.first_step);
    if (t.options.on_restored) RM_RETURN_IF_ERROR(t.options.on_restored(t.first_step));
    t.finished = t.step >= t.total_steps;
    return trainer;
  } catch (const std::bad_alloc&) {
    return OutOfMemory(t.allocating);
  }
}

int64_t Trainer::steps_done() const { return s_->step; }
int64_t Trainer::total_steps() const { return s_->total_steps; }
bool Trainer::finished() const { return s_->finished; }

absl::Status Trainer::Step() {
  State& t = *s_;
  if (!t.error.ok()) return t.error;  // the run ended with it; the communicator may be broken
  if (t.finished) return absl::FailedPreconditionError("Trainer::Step: the run has finished");
  t.error = StepOnce();
  return t.error;
}

absl::Status Trainer::StepOnce() {
  State& t = *s_;
  try {
    if (t.step == 0 && !t.evaluated_start && !t.config.init_from.empty() &&
        t.config.data.eval_every_steps > 0 && t.data.test != nullptr) {
      // The model the job starts from, on its validation data: what fine-tuning improves on.
      t.evaluated_start = true;
      RM_RETURN_IF_ERROR(t.Evaluate(0));
      t.Say(absl::StrCat(
          "validation at step 0 (the weights of init_from): loss ",
          absl::SixDigits(t.result.eval_loss()),
          t.result.has_eval_perplexity()
              ? absl::StrCat(" perplexity ", absl::SixDigits(t.result.eval_perplexity()))
              : absl::StrCat(" accuracy ", absl::SixDigits(t.result.eval_accuracy()))));
    }
    const absl::Time step_start = absl::Now();
    RM_ASSIGN_OR_RETURN(data::GlobalBatch gb,
                        t.sampler->NextGlobalBatch(t.sampler_state, t.config.global_batch));
    double stats[3] = {0, 0, 0};  // loss sum, terms, correct
    const StepSent sent_before = t.BytesSentInSteps();
    RM_RETURN_IF_ERROR(t.ForwardBackward(gb, t.RecordsStep(gb, t.step), stats));
    GradNorm norm;
    RM_ASSIGN_OR_RETURN(bool applied, t.Update(t.step, norm));
    const StepSent sent_after = t.BytesSentInSteps();
    t.step_bytes_sent += sent_after.all.all - sent_before.all.all;
    t.step_bytes_gathered += sent_after.all.gathered - sent_before.all.gathered;
    t.step_bytes_reduced += sent_after.all.reduced - sent_before.all.reduced;
    t.step_bytes_pipeline += sent_after.pipeline - sent_before.pipeline;
    t.step_bytes_tensor_parallel += sent_after.tensor_parallel - sent_before.tensor_parallel;
    t.sampler_state = gb.next;
    t.result.set_steps(static_cast<int32_t>(t.step + 1));
    t.updating = false;
    t.consistent_step = t.step + 1;
    t.consistent_optimizer_step = t.optimizer->step();
    t.consistent_sampler = t.sampler_state;
    if (t.scaler) t.consistent_scaler = t.scaler->state();
    t.reporter->Count(static_cast<int64_t>(gb.indices.size()), t.strategy->last_step());
    absl::Status after =
        t.AfterStep(gb, stats, applied, norm, t.schedule->LrAt(t.step), step_start);
    ++t.step;
    if (t.step >= t.total_steps) t.finished = true;
    return after;
  } catch (const std::bad_alloc&) {
    return OutOfMemory(t.allocating);
  }
}

absl::StatusOr<TrainResult> Trainer::Run() {
  while (!s_->finished) RM_RETURN_IF_ERROR(Step());
  try {
    return s_->Finish();
  } catch (const std::bad_alloc&) {
    return OutOfMemory(s_->allocating);
  }
}

absl::StatusOr<TrainResult> RunTraining(const TrainerOptions& options) {
  RM_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer, Trainer::Create(options));
  return trainer->Run();
}

}  // namespace ringmaster::train
