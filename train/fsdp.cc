#include "train/fsdp.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <new>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "kernels/half.h"
#include "train/optim/vector_ops.h"
#include "train/unit_buffer_pool.h"

namespace ringmaster::train {
namespace {

DataType WireType(Precision p) {
  return p == Precision::kBFloat16 ? DataType::kBFloat16 : DataType::kFloat16;
}

void Pack(Precision p, const float* x, uint16_t* y, int64_t n) {
  if (p == Precision::kBFloat16) {
    for (int64_t i = 0; i < n; ++i) y[i] = kernels::FloatToBFloat16(x[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = kernels::FloatToFloat16(x[i]);
  }
}

void Unpack(Precision p, const uint16_t* x, float* y, int64_t n) {
  if (p == Precision::kBFloat16) {
    for (int64_t i = 0; i < n; ++i) y[i] = kernels::BFloat16ToFloat(x[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = kernels::Float16ToFloat(x[i]);
  }
}

class ShardedDataParallel final : public ParallelStrategy, public ParameterStore {
 public:
  ShardedDataParallel(comm::Communicator* comm, comm::Communicator* host_comm,
                      const ShardedOptions& options, FsdpLayout layout)
      : comm_(comm),
        options_(options),
        layout_(std::move(layout)),
        rank_(comm->rank()),
        units_(layout_.units.size()) {
    const absl::Duration timeout = options.op_timeout;
    sum_ = [host_comm, timeout](absl::Span<double> values) {
      return host_comm->AllReduce(values.data(), values.data(), values.size(),
                                  DataType::kFloat64, comm::ReduceOp::kSum, absl::Now() + timeout);
    };
    if (options_.zero_stage == 2) full_ = state::FlatBuffer(options_.table->total_elements());
    const int64_t largest_shard = layout_.largest_unit / layout_.world;
    if (IsHalf(options_.compute) || IsHalf(options_.reduce)) {
      wire_unit_.resize(layout_.largest_unit);
      wire_shard_.resize(largest_shard);
    }
    shard_scratch_ = state::FlatBuffer(largest_shard);
    // One unit's gradients are reduced while the next unit's are written. (The reduction
    // queued before a prefetched gather has had a unit's compute to run: waiting for it
    // costs little, and two gradient buffers are what the unit buffers' bound counts.)
    max_reductions_ = 1;
    thread_ = std::thread([this] { Loop(); });
  }

  ~ShardedDataParallel() override {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }

  std::string Describe() const override {
    const std::string wire = absl::StrCat(
        options_.zero_stage == 3 ? absl::StrCat("gathers in ", PrecisionName(options_.compute), ", ")
                                 : std::string(),
        "reduce-scatters in ", PrecisionName(options_.reduce));
    if (options_.zero_stage == 2) {
      return absl::StrCat("ZeRO-2: gradients reduce-scattered in ", layout_.Describe(), " of ",
                          options_.bucket_mb, " MiB; ", wire);
    }
    const FsdpConfig& f = options_.fsdp;
    return absl::StrCat(
        "ZeRO-3 (fully sharded): ", layout_.Describe(), ", wrap ", WrapName(f.wrap),
        "; prefetch ", PrefetchName(f.prefetch),
        f.prefetch == FsdpConfig::Prefetch::kNone ? std::string()
                                                  : absl::StrCat(" (", f.prefetch_limit, " ahead)"),
        f.reshard_after_forward ? "; reshard after forward" : "; kept from forward to backward",
        "; ", wire);
  }
  int64_t local_elements() const override { return layout_.local_elements; }
  state::FlatRange update_window() const override { return {0, layout_.local_elements}; }
  std::vector<state::PlacedRange> update_pieces() const override {
    return layout_.Placement(rank_);
  }
  std::vector<state::PlacedRange> saved_pieces() const override {
    return layout_.Placement(rank_);
  }
  bool whole_state_on_every_rank() const override { return false; }
  const SumAcrossRanks& sum() const override { return sum_; }
  int64_t unit_buffer_bytes_peak() const override {
    return pool_.peak_bytes() + static_cast<int64_t>(wire_unit_.size() + wire_shard_.size()) * 2 +
           static_cast<int64_t>(shard_scratch_.bytes());
  }

  absl::Status MaterializeParameters(absl::Span<float> params) override {
    master_ = params.data();
    return absl::OkStatus();
  }
  ParameterStore* store() override { return this; }
  const float* replicated_parameters() const override {
    return options_.zero_stage == 2 ? full_.data() : nullptr;
  }

  void BeginGradients(float* grads, bool measure_local_norm) override {
    grads_ = grads;
    measure_ = measure_local_norm;
    gradient_passes_ = 0;
    stats_ = GradientSyncStats();
    exposed_ = absl::ZeroDuration();
    absl::MutexLock lock(&mu_);
    comm_time_ = absl::ZeroDuration();
    squares_ = 0;
  }

  void BeginPass(Pass pass) override {
    ReleaseAllParameters();
    pass_ = pass;
    backward_ = false;
    current_ = -1;
    for (UnitState& u : units_) {
      u.groups_done = 0;
      u.reduced = false;
    }
    if (pass != Pass::kEvaluate) {
      accumulate_ = gradient_passes_ > 0;
      ++gradient_passes_;
    }
  }

  // DP's announcement; the store's GradientsDone does this job here.
  void GradientsReady(int64_t) override {}

  absl::Status ReduceGradients() override {
    absl::Status missing;
    if (gradient_passes_ > 0) {
      for (size_t u = 0; u < units_.size(); ++u) {
        if (!units_[u].reduced && missing.ok()) {
          missing = absl::InternalError(absl::StrCat(
              "the model's backward did not finish the gradients of unit ", layout_.units[u].name));
        }
      }
    }
    const absl::Time start = absl::Now();
    absl::Status status = WaitAll();
    ReleaseAllParameters();
    exposed_ += absl::Now() - start;
    stats_.exposed_wait = exposed_;
    stats_.buckets = static_cast<int>(units_.size());
    absl::MutexLock lock(&mu_);
    stats_.comm_time = comm_time_;
    stats_.local_grad_norm = measure_ ? std::sqrt(squares_) : 0;
    if (!missing.ok()) return missing;
    return status;
  }
  const GradientSyncStats& last_step() const override { return stats_; }

  absl::Status EndEvaluation() override {
    absl::Status status = WaitAll();
    ReleaseAllParameters();
    return status;
  }

  absl::Status AfterOptimizerStep(absl::Span<float> params) override {
    master_ = params.data();
    if (options_.zero_stage == 3) return absl::OkStatus();
    // ZeRO-2: every rank's compute copy from the updated pieces, unit by unit through one
    // buffer.
    return GatherWhole(options_.compute, full_.span());
  }

  absl::Status WholeParameters(absl::Span<float> params, absl::Span<float> whole) override {
    master_ = params.data();
    return GatherWhole(Precision::kFloat32, whole);
  }

  // ParameterStore.
  const float* Parameters(int group) override {
    if (options_.zero_stage == 2) return full_.data();
    const int u = layout_.unit_of_group[group];
    const FsdpConfig& f = options_.fsdp;
    const bool ahead = f.prefetch == FsdpConfig::Prefetch::kBoth ||
                       f.prefetch == (backward_ ? FsdpConfig::Prefetch::kBackward
                                                : FsdpConfig::Prefetch::kForward);
    if (!backward_ && u != current_) {
      if (current_ >= 0 && f.reshard_after_forward) ReleaseParameters(current_);
      current_ = u;
    }
    Request(u);
    if (ahead) {
      const int step = backward_ ? -1 : 1;
      for (int k = 1; k <= f.prefetch_limit; ++k) {
        const int next = u + step * k;
        if (next < 0 || next >= static_cast<int>(units_.size()) || units_[next].reduced) break;
        if (backward_ && !layout_.units[next].backward_reads_parameters) continue;
        Request(next);
      }
    }
    Wait(units_[u].gather);
    return units_[u].params - layout_.units[u].range.begin;
  }

  void BeginBackward() override { backward_ = true; }

  float* Gradients(int group) override {
    const int u = layout_.unit_of_group[group];
    UnitState& s = units_[u];
    if (s.grads == nullptr) {
      WaitForReductions();
      s.grads = TakeBuffer(layout_.units[u].padded);
      std::fill_n(s.grads, layout_.units[u].padded, 0.0f);
    }
    return s.grads - layout_.units[u].range.begin;
  }

  void GradientsDone(int group) override {
    const int u = layout_.unit_of_group[group];
    UnitState& s = units_[u];
    const FsdpUnit& unit = layout_.units[u];
    if (++s.groups_done < unit.end_group - unit.first_group) return;
    Op op{Op::kReduceScatter, u, s.grads};
    op.accumulate = accumulate_;
    op.discard = pass_ == Pass::kDiscard;
    Enqueue(op);
    s.grads = nullptr;  // the communication thread gives it back
    s.reduced = true;
    if (options_.zero_stage == 3) ReleaseParameters(u);
  }

 private:
  struct Op {
    enum Kind { kGather, kGatherWhole, kReduceScatter };
    Kind kind = kGather;
    int unit = 0;
    float* buffer = nullptr;  // the unit buffer gathered into or reduced from (given back
                              // by the thread, but for kGather's)
    bool accumulate = false;  // kReduceScatter: add to the shard (else overwrite it)
    bool discard = false;     // kReduceScatter: contribute zeros
    float* whole = nullptr;   // kGatherWhole: every unit goes there, in table order
    Precision precision = Precision::kFloat32;  // kGatherWhole's
  };
  // The training thread's view of a unit in the current pass.
  struct UnitState {
    float* params = nullptr;  // gathered (or being gathered) parameters
    int64_t gather = -1;      // its op's sequence number
    float* grads = nullptr;   // the gradient buffer being written
    int groups_done = 0;
    bool reduced = false;  // its reduce-scatter is queued
  };

  // Every unit, gathered in `precision`, into `whole` (table order).
  absl::Status GatherWhole(Precision precision, absl::Span<float> whole) {
    Op op{Op::kGatherWhole, 0, TakeBuffer(layout_.largest_unit)};
    op.whole = whole.data();
    op.precision = precision;
    Enqueue(op);
    return WaitAll();
  }

  // A unit buffer from the pool (host memory: no stream to order with). Out of memory
  // throws std::bad_alloc, as the step's other host buffers do.
  float* TakeBuffer(int64_t elements) {
    absl::StatusOr<UnitBufferPool::Taken> taken = pool_.Take(elements);
    if (!taken.ok()) throw std::bad_alloc();
    return taken->data;
  }
  // A pool error (a buffer given twice: this strategy's bug) fails the step.
  void GiveBack(float* buffer) {
    absl::Status status = pool_.Give(buffer);
    if (status.ok()) return;
    absl::MutexLock lock(&mu_);
    if (error_.ok()) error_ = std::move(status);
  }

  int64_t Enqueue(const Op& op) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(op);
    if (op.kind == Op::kReduceScatter) ++reductions_queued_;
    return queued_++;
  }
  void Request(int u) {
    UnitState& s = units_[u];
    if (s.params != nullptr) return;
    s.params = TakeBuffer(layout_.units[u].padded);
    s.gather = Enqueue({Op::kGather, u, s.params});
  }
  // Blocks until op `seq` ran; the time counts as exposed communication.
  void Wait(int64_t seq) {
    const absl::Time start = absl::Now();
    {
      absl::MutexLock lock(&mu_);
      waiting_for_ = seq;
      mu_.Await(absl::Condition(this, &ShardedDataParallel::Ran));
    }
    exposed_ += absl::Now() - start;
  }
  bool Ran() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ > waiting_for_; }
  // Bounds the gradient buffers: before another one is taken, at most max_reductions_
  // reduce-scatters may still be queued (the wait counts as exposed communication).
  void WaitForReductions() {
    const absl::Time start = absl::Now();
    {
      absl::MutexLock lock(&mu_);
      reductions_allowed_ = reductions_queued_ - max_reductions_;
      mu_.Await(absl::Condition(this, &ShardedDataParallel::FewReductionsLeft));
    }
    exposed_ += absl::Now() - start;
  }
  bool FewReductionsLeft() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return reductions_done_ >= reductions_allowed_;
  }
  absl::Status WaitAll() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](ShardedDataParallel* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
          return s->done_ == s->queued_;
        },
        this));
    absl::Status status = error_;
    error_ = absl::OkStatus();
    return status;
  }
  void ReleaseParameters(int u) {
    UnitState& s = units_[u];
    if (s.params == nullptr) return;
    Wait(s.gather);  // the thread may still be writing it
    GiveBack(s.params);
    s.params = nullptr;
  }
  void ReleaseAllParameters() {
    for (size_t u = 0; u < units_.size(); ++u) ReleaseParameters(static_cast<int>(u));
  }

  void Loop() {
    while (true) {
      Op op;
      absl::Status status;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(
            +[](ShardedDataParallel* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
              return s->stop_ || !s->queue_.empty();
            },
            this));
        if (stop_) return;
        op = queue_.front();
        queue_.pop_front();
        status = error_;
      }
      // After an error the remaining ops are only counted (and their buffers given back):
      // the step is lost anyway.
      const absl::Time start = absl::Now();
      double squares = 0;
      if (status.ok()) status = Run(op, &squares);
      const absl::Duration took = absl::Now() - start;
      if (op.kind != Op::kGather) status.Update(pool_.Give(op.buffer));
      absl::MutexLock lock(&mu_);
      if (!status.ok() && error_.ok()) error_ = status;
      comm_time_ += took;
      squares_ += squares;
      if (op.kind == Op::kReduceScatter) ++reductions_done_;
      ++done_;
    }
  }

  absl::Status Run(const Op& op, double* squares) {
    const FsdpUnit& unit = layout_.units[op.unit];
    const absl::Time deadline = absl::Now() + options_.op_timeout;
    if (op.kind == Op::kReduceScatter) return ReduceScatter(unit, op, deadline, squares);
    if (op.kind == Op::kGatherWhole) {
      for (const FsdpUnit& u : layout_.units) {
        RM_RETURN_IF_ERROR(Gather(u, op.precision, op.buffer, deadline));
        std::copy_n(op.buffer, u.range.size(), op.whole + u.range.begin);
      }
      return absl::OkStatus();
    }
    return Gather(unit, options_.compute, op.buffer, deadline);
  }

  // An all-gather of the unit's pieces into `out`, in `precision` (16 bits on the wire for
  // bf16 and fp16).
  absl::Status Gather(const FsdpUnit& unit, Precision precision, float* out, absl::Time deadline) {
    const float* piece = master_ + unit.local;
    if (IsHalf(precision)) {
      Pack(precision, piece, wire_shard_.data(), unit.shard);
      RM_RETURN_IF_ERROR(comm_->AllGather(wire_shard_.data(), wire_unit_.data(), unit.shard,
                                          WireType(precision), deadline));
      Unpack(precision, wire_unit_.data(), out, unit.padded);
      return absl::OkStatus();
    }
    return comm_->AllGather(piece, out, unit.shard, DataType::kFloat32, deadline);
  }

  absl::Status ReduceScatter(const FsdpUnit& unit, const Op& op, absl::Time deadline,
                             double* squares) {
    float* g = op.buffer;
    if (op.discard) std::fill_n(g, unit.padded, 0.0f);
    if (measure_) {
      double sum = 0;
      for (int64_t i = 0; i < unit.padded; ++i) sum += static_cast<double>(g[i]) * g[i];
      *squares = sum;
    }
    float* reduced = shard_scratch_.data();
    if (IsHalf(options_.reduce)) {
      Pack(options_.reduce, g, wire_unit_.data(), unit.padded);
      RM_RETURN_IF_ERROR(comm_->ReduceScatter(wire_unit_.data(), wire_shard_.data(), unit.shard,
                                              WireType(options_.reduce), comm::ReduceOp::kSum,
                                              deadline));
      Unpack(options_.reduce, wire_shard_.data(), reduced, unit.shard);
    } else {
      RM_RETURN_IF_ERROR(comm_->ReduceScatter(g, reduced, unit.shard, DataType::kFloat32,
                                              comm::ReduceOp::kSum, deadline));
    }
    float* shard = grads_ + unit.local;
    if (op.accumulate) {
      for (int64_t i = 0; i < unit.shard; ++i) shard[i] += reduced[i];
    } else {
      std::copy_n(reduced, unit.shard, shard);
    }
    return absl::OkStatus();
  }

  comm::Communicator* const comm_;
  const ShardedOptions options_;
  const FsdpLayout layout_;
  const int rank_;
  SumAcrossRanks sum_;
  UnitBufferPool pool_{HostVectorOps()};
  state::FlatBuffer full_;  // ZeRO-2: the compute copy of every parameter

  // The training thread's.
  int64_t max_reductions_ = 1;
  std::vector<UnitState> units_;
  Pass pass_ = Pass::kTrain;
  bool backward_ = false;
  int current_ = -1;  // forward: the unit in use
  bool accumulate_ = false;
  int gradient_passes_ = 0;  // since BeginGradients
  bool measure_ = false;
  absl::Duration exposed_;
  GradientSyncStats stats_;

  // Read by the communication thread while ops are queued; set by the training thread
  // only when none is (between steps).
  float* master_ = nullptr;
  float* grads_ = nullptr;
  // The communication thread's scratch.
  std::vector<uint16_t> wire_unit_, wire_shard_;  // 16-bit gathers and reductions
  state::FlatBuffer shard_scratch_;               // a reduced shard before it is added

  absl::Mutex mu_;
  std::deque<Op> queue_ ABSL_GUARDED_BY(mu_);
  int64_t queued_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t done_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t waiting_for_ ABSL_GUARDED_BY(mu_) = 0;  // Wait's op
  int64_t reductions_queued_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t reductions_done_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t reductions_allowed_ ABSL_GUARDED_BY(mu_) = 0;  // WaitForReductions' target
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  absl::Duration comm_time_ ABSL_GUARDED_BY(mu_);
  double squares_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace

ShardedOptions ShardedOptionsFor(const TrainConfig& config, const Model& model) {
  ShardedOptions o;
  o.table = &model.table();
  o.groups = model.parameter_groups();
  o.zero_stage = config.zero_stage;
  o.fsdp = config.fsdp;
  o.bucket_mb = config.bucket_mb;
  o.compute = config.precision;
  o.reduce = config.reduce_precision;
  return o;
}

absl::StatusOr<FsdpLayout> ShardedLayout(const ShardedOptions& options, int world) {
  if (options.table == nullptr) return absl::InvalidArgumentError("ShardedOptions.table is null");
  if (options.zero_stage == 2) {
    const int64_t bucket = std::max<int64_t>(
        state::kAlignElements, static_cast<int64_t>(options.bucket_mb * (1 << 20) / 4));
    return MakeBucketLayout(*options.table, options.groups, bucket, world);
  }
  return MakeFsdpLayout(*options.table, options.groups, options.fsdp.wrap, world);
}

absl::StatusOr<std::unique_ptr<ParallelStrategy>> CreateShardedDataParallel(
    comm::Communicator* comm, comm::Communicator* host_comm, const ShardedOptions& options) {
  if (comm == nullptr || host_comm == nullptr) {
    return absl::InvalidArgumentError("CreateShardedDataParallel: a communicator is null");
  }
  if (options.zero_stage != 2 && options.zero_stage != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallelism.zero_stage: ", options.zero_stage, " is not 2 or 3 (sharded)"));
  }
  if (options.reduce != Precision::kFloat32 && options.reduce != Precision::kBFloat16) {
    return absl::InvalidArgumentError(absl::StrCat("precision.reduce: ",
                                                   PrecisionName(options.reduce),
                                                   " is not fp32 or bf16"));
  }
  if (options.fsdp.prefetch_limit < 1) {
    return absl::InvalidArgumentError(absl::StrCat("parallelism.fsdp.prefetch_limit: ",
                                                   options.fsdp.prefetch_limit, " < 1"));
  }
  RM_ASSIGN_OR_RETURN(FsdpLayout layout, ShardedLayout(options, comm->size()));
  return std::unique_ptr<ParallelStrategy>(
      new ShardedDataParallel(comm, host_comm, options, std::move(layout)));
}

}  // namespace ringmaster::train
