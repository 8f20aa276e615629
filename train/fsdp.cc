#include "train/fsdp.h"

#include <algorithm>
#include <cmath>
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
#include "train/optim/vector_ops.h"
#include "train/unit_buffer_pool.h"

namespace ringmaster::train {
namespace {

DataType WireType(Precision p) {
  return p == Precision::kBFloat16 ? DataType::kBFloat16 : DataType::kFloat16;
}

class ShardedDataParallel final : public ParallelStrategy, public ParameterStore {
 public:
  ShardedDataParallel(comm::Communicator* comm, comm::Communicator* host_comm,
                      const ShardedOptions& options, FsdpLayout layout)
      : comm_(comm),
        options_(options),
        layout_(std::move(layout)),
        rank_(comm->rank()),
        ops_(options.ops),
        comm_ops_(options.comm_ops),
        on_host_(!options.ops->device_memory()),
        pool_(options.ops),
        meter_(static_cast<int>(layout_.units.size())),
        units_(layout_.units.size()),
        gathered_(layout_.units.size(), nullptr) {
    const absl::Duration timeout = options.op_timeout;
    sum_ = [host_comm, timeout](absl::Span<double> values) {
      return host_comm->AllReduce(values.data(), values.data(), values.size(),
                                  DataType::kFloat64, comm::ReduceOp::kSum, absl::Now() + timeout);
    };
  }

  // The buffers (RESOURCE_EXHAUSTED when the memory is not there), then the thread.
  absl::Status Start() {
    const int64_t largest_shard = layout_.largest_unit / layout_.world;
    if (options_.zero_stage == 2) {
      RM_ASSIGN_OR_RETURN(full_, ops_->Allocate(options_.table->total_elements()));
    }
    if (IsHalf(options_.compute) || IsHalf(options_.reduce)) {
      RM_ASSIGN_OR_RETURN(wire_unit_, comm_ops_->Allocate((layout_.largest_unit + 1) / 2));
      RM_ASSIGN_OR_RETURN(wire_shard_, comm_ops_->Allocate((largest_shard + 1) / 2));
    }
    // One unit's gradients are reduced while the next unit's are written. (The reduction
    // queued before a prefetched gather has had a unit's compute to run: waiting for it
    // costs little, and two gradient buffers are what the unit buffers' bound counts.)
    max_reductions_ = 1;
    thread_ = std::thread([this] { Loop(); });
    return absl::OkStatus();
  }

  ~ShardedDataParallel() override {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    if (thread_.joinable()) thread_.join();
    // No work of either stream may still use a buffer freed below.
    (void)ops_->Synchronize();
    (void)comm_ops_->Synchronize();
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
    return pool_.peak_bytes() +
           (wire_unit_.size() + wire_shard_.size() + shard_scratch_.size()) *
               static_cast<int64_t>(sizeof(float));
  }

  absl::Status MaterializeParameters(absl::Span<float> params) override {
    SetMaster(params);
    return absl::OkStatus();
  }
  ParameterStore* store() override { return this; }
  const float* replicated_parameters() const override {
    return options_.zero_stage == 2 ? full_.data() : nullptr;
  }

  void BeginGradients(float* grads, bool measure_local_norm) override {
    grads_ = grads;
    grads_free_ = ops_->Mark();  // the last step's readers of `grads` (the optimizer)
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
      // A backward that stopped before a unit's gradients were done (an error) leaves its
      // gradient buffer: a separate one goes back to the pool (an in-place one went with
      // the parameters above).
      if (u.grads != nullptr && !u.grads_in_place) Check(pool_.Give(u.grads, ops_->Mark()));
      u.grads = nullptr;
      u.grads_in_place = false;
      u.groups_done = 0;
      u.reduced = false;
    }
    if (pass != Pass::kEvaluate) {
      accumulate_ = gradient_passes_ > 0;
      ++gradient_passes_;
      // A micro-batch after the first adds its reduced shard through a scratch shard, made
      // the first time (before the first op that reads it is queued).
      if (accumulate_ && shard_scratch_.size() == 0) {
        absl::StatusOr<OpsBuffer> scratch =
            ops_->Allocate(layout_.largest_unit / layout_.world);
        if (!scratch.ok()) throw std::bad_alloc();
        shard_scratch_ = *std::move(scratch);
      }
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
  std::vector<BucketCounters> bucket_counters() const override { return meter_.Snapshot(); }

  absl::Status EndEvaluation() override {
    absl::Status status = WaitAll();
    ReleaseAllParameters();
    return status;
  }

  absl::Status AfterOptimizerStep(absl::Span<float> params) override {
    SetMaster(params);
    if (options_.zero_stage == 3) return absl::OkStatus();
    // ZeRO-2: every rank's compute copy from the updated pieces, unit by unit through one
    // buffer.
    host_full_current_ = false;
    return GatherWhole(options_.compute, full_.data(), /*to_host=*/false);
  }

  absl::Status WholeParameters(absl::Span<float> params, absl::Span<float> whole) override {
    SetMaster(params);
    return GatherWhole(Precision::kFloat32, whole.data(), /*to_host=*/true);
  }

  // ParameterStore.
  const float* Parameters(int group) override {
    if (options_.zero_stage == 2) return EvaluatingOnHost() ? HostFull() : full_.data();
    const int u = layout_.unit_of_group[group];
    const FsdpConfig& f = options_.fsdp;
    const bool ahead = f.prefetch == FsdpConfig::Prefetch::kBoth ||
                       f.prefetch == (backward_ ? FsdpConfig::Prefetch::kBackward
                                                : FsdpConfig::Prefetch::kForward);
    const bool kept = layout_.units[u].kept_through_pass;
    if (kept && units_[u].requested && u != current_) {
      // The LM head reads a tied embedding again: it is still here, nothing moves.
      if (EvaluatingOnHost()) return HostUnit(u);
      return Gathered(u) - layout_.units[u].range.begin;
    }
    if (!backward_ && u != current_) {
      if (current_ >= 0 && f.reshard_after_forward && !layout_.units[current_].kept_through_pass) {
        ReleaseParameters(current_);
      }
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
    if (EvaluatingOnHost()) return HostUnit(u);
    return Gathered(u) - layout_.units[u].range.begin;
  }

  void BeginBackward() override { backward_ = true; }

  float* Gradients(int group) override {
    const int u = layout_.unit_of_group[group];
    UnitState& s = units_[u];
    const FsdpUnit& unit = layout_.units[u];
    // Not in device memory: the GPU models' backward (gpt_cuda.h) makes no such promise.
    if (s.grads == nullptr && options_.zero_stage == 3 && unit.gradients_in_place && on_host_ &&
        s.requested) {
      // Over the gathered parameters: each group's as the model asks for it (it reads them
      // no more); the gaps between tensors are zeroed for the reduction.
      s.grads = Gathered(u);
      s.grads_in_place = true;
      for (const state::FlatRange& gap : unit.gaps) {
        Check(ops_->Zero(
            {s.grads + (gap.begin - unit.range.begin), static_cast<size_t>(gap.size())}));
      }
    } else if (s.grads == nullptr) {
      WaitForReductions();
      // The buffer's last user was the model's stream (released parameters) or the
      // communication thread, done with it: the zeroing on the model's stream needs no wait.
      s.grads = TakeBuffer(unit.padded).data;
      Check(ops_->Zero({s.grads, static_cast<size_t>(unit.padded)}));
    }
    return s.grads - unit.range.begin;
  }

  void GradientsDone(int group) override {
    const int u = layout_.unit_of_group[group];
    UnitState& s = units_[u];
    const FsdpUnit& unit = layout_.units[u];
    if (++s.groups_done < unit.end_group - unit.first_group) return;
    Op op{Op::kReduceScatter, u, s.grads};
    op.token = ops_->Mark();  // the model's writes of these gradients
    op.accumulate = accumulate_;
    op.discard = pass_ == Pass::kDiscard;
    Enqueue(op);
    s.grads = nullptr;  // the communication thread gives it back
    s.reduced = true;
    if (s.grads_in_place) {  // the parameters' buffer went with them
      s.grads_in_place = false;
      s.requested = false;
      s.params = nullptr;
    } else if (options_.zero_stage == 3) {
      ReleaseParameters(u);
    }
  }

 private:
  struct Op {
    enum Kind { kGather, kGatherWhole, kReduceScatter };
    Kind kind = kGather;
    int unit = 0;
    float* buffer = nullptr;  // the unit buffer reduced from or gathered into (given back by
                              // the thread; kGather's is taken by the thread and handed to
                              // the training thread through gathered_)
    // The model's stream's mark to wait for before the buffer is touched: kGatherWhole, the
    // buffer's last reader (UnitBufferPool's token); kReduceScatter, the gradients' writers.
    int token = UnitBufferPool::kNoToken;
    bool accumulate = false;  // kReduceScatter: add to the shard (else overwrite it)
    bool discard = false;     // kReduceScatter: contribute zeros
    float* whole = nullptr;   // kGatherWhole: every unit goes there, in table order
    bool whole_on_host = false;                 // kGatherWhole: `whole` is host memory
    Precision precision = Precision::kFloat32;  // kGatherWhole's
  };
  // The training thread's view of a unit in the current pass.
  struct UnitState {
    bool requested = false;   // its gather is queued (or done) and its buffer not given back
    int64_t gather = -1;      // that op's sequence number
    float* params = nullptr;  // the gathered parameters, once Gathered() waited for them
    float* grads = nullptr;   // the gradient buffer being written
    bool grads_in_place = false;  // grads is the parameters' buffer (gradients_in_place)
    int groups_done = 0;
    bool reduced = false;  // its reduce-scatter is queued
  };

  // The step's parameter buffer the gathers read, written by the model's stream's work
  // before now (the optimizer step, a restore).
  void SetMaster(absl::Span<float> params) {
    master_ = params.data();
    master_written_ = ops_->Mark();
  }

  // Every unit, gathered in `precision`, into `whole` (table order; the strategy's memory,
  // or the host's with `to_host`).
  absl::Status GatherWhole(Precision precision, float* whole, bool to_host) {
    UnitBufferPool::Taken buffer = TakeBuffer(layout_.largest_unit);
    Op op{Op::kGatherWhole, 0, buffer.data};
    op.token = buffer.token;
    op.whole = whole;
    op.whole_on_host = to_host;
    op.precision = precision;
    Enqueue(op);
    return WaitAll();
  }

  // An evaluation pass of a strategy in device memory hands the model host copies of the
  // parameters (the trainer evaluates with the CPU model, as under data parallelism).
  bool EvaluatingOnHost() const { return pass_ == Pass::kEvaluate && !on_host_; }
  const float* HostUnit(int u) {
    const FsdpUnit& unit = layout_.units[u];
    if (host_unit_of_ != u) {
      host_unit_.resize(layout_.largest_unit);
      Check(ops_->CopyToHost({Gathered(u), static_cast<size_t>(unit.range.size())},
                             host_unit_.data()));
      host_unit_of_ = u;
    }
    return host_unit_.data() - unit.range.begin;
  }
  const float* HostFull() {
    if (!host_full_current_) {
      host_full_.resize(full_.size());
      Check(ops_->CopyToHost(full_.span(), host_full_.data()));
      host_full_current_ = true;
    }
    return host_full_.data();
  }

  // A unit buffer from the pool (the model's memory), with the token of its last reader.
  // Out of memory throws std::bad_alloc, as the step's other buffers do.
  UnitBufferPool::Taken TakeBuffer(int64_t elements) {
    absl::StatusOr<UnitBufferPool::Taken> taken = pool_.Take(elements);
    if (!taken.ok()) throw std::bad_alloc();
    return *taken;
  }
  // A failure of the training thread's own calls (a pool error: this strategy's bug; a
  // device error) fails the step.
  void Check(absl::Status status) {
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
  // Queues unit u's gather unless it is queued or here. The communication thread takes its
  // buffer from the pool when it gets to it, so a buffer the reductions queued before it give
  // back serves it (in backward, a unit's reduce-scatter then its predecessor's gather share
  // one buffer).
  void Request(int u) {
    UnitState& s = units_[u];
    if (s.requested) return;
    s.requested = true;
    s.params = nullptr;
    s.gather = Enqueue(Op{Op::kGather, u});
  }
  // Unit u's buffer (requested), once its gather ran: null when the communication thread
  // could not take one.
  float* GatheredBuffer(int u) {
    UnitState& s = units_[u];
    if (s.params != nullptr) return s.params;
    Wait(s.gather);
    absl::MutexLock lock(&mu_);
    s.params = gathered_[u];
    gathered_[u] = nullptr;
    return s.params;
  }
  // Unit u's gathered parameters (requested). Out of memory for its buffer throws
  // std::bad_alloc, as TakeBuffer does.
  float* Gathered(int u) {
    float* params = GatheredBuffer(u);
    if (params == nullptr) throw std::bad_alloc();
    return params;
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
    if (!s.requested) return;
    s.requested = false;
    float* params = GatheredBuffer(u);  // the thread may still be writing it
    s.params = nullptr;
    if (host_unit_of_ == u) host_unit_of_ = -1;
    // The model's work enqueued so far may still read it: its next writer waits for this.
    if (params != nullptr) Check(pool_.Give(params, ops_->Mark()));
  }
  void ReleaseAllParameters() {
    for (size_t u = 0; u < units_.size(); ++u) ReleaseParameters(static_cast<int>(u));
  }

  void Loop() {
    const absl::Status bound = comm_ops_->BindThread();
    if (!bound.ok()) {
      absl::MutexLock lock(&mu_);
      error_ = bound;
    }
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
      // A gather's buffer, taken even after an error: the model reads it whatever it holds.
      if (op.kind == Op::kGather) {
        absl::StatusOr<UnitBufferPool::Taken> taken = pool_.Take(layout_.units[op.unit].padded);
        if (taken.ok()) {
          op.buffer = taken->data;
          op.token = taken->token;
          absl::MutexLock lock(&mu_);
          gathered_[op.unit] = op.buffer;
        } else if (status.ok()) {
          status = taken.status();
        }
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
    RM_RETURN_IF_ERROR(WaitForModel(op.token));
    RM_RETURN_IF_ERROR(WaitForModel(master_written_));
    if (op.kind == Op::kGatherWhole) {
      for (const FsdpUnit& u : layout_.units) {
        RM_RETURN_IF_ERROR(Gather(u, op.precision, op.buffer, deadline));
        const absl::Span<const float> gathered{op.buffer, static_cast<size_t>(u.range.size())};
        RM_RETURN_IF_ERROR(op.whole_on_host
                               ? comm_ops_->CopyToHost(gathered, op.whole + u.range.begin)
                               : comm_ops_->Copy(gathered, {op.whole + u.range.begin,
                                                            gathered.size()}));
        RM_RETURN_IF_ERROR(comm_ops_->Synchronize());  // before the next gather overwrites it
      }
      return absl::OkStatus();
    }
    return Gather(unit, options_.compute, op.buffer, deadline);
  }

  // Waits on the host for the model's stream to reach `token` (nothing to wait for in host
  // memory).
  absl::Status WaitForModel(int token) {
    return token == UnitBufferPool::kNoToken ? absl::OkStatus() : ops_->Wait(token);
  }
  uint16_t* Wire(OpsBuffer& buffer) { return reinterpret_cast<uint16_t*>(buffer.data()); }

  // An all-gather of the unit's pieces into `out`, in `precision` (16 bits on the wire for
  // bf16 and fp16), complete when it returns. The communicator's collectives return once
  // their result is complete; our own kernels before them are synchronized first.
  absl::Status Gather(const FsdpUnit& unit, Precision precision, float* out, absl::Time deadline) {
    const float* piece = master_ + unit.local;
    const auto shard = static_cast<size_t>(unit.shard);
    if (IsHalf(precision)) {
      const bool bf16 = precision == Precision::kBFloat16;
      RM_RETURN_IF_ERROR(comm_ops_->ToHalf(bf16, {piece, shard}, Wire(wire_shard_)));
      RM_RETURN_IF_ERROR(comm_ops_->Synchronize());
      RM_RETURN_IF_ERROR(comm_->AllGather(Wire(wire_shard_), Wire(wire_unit_), unit.shard,
                                          WireType(precision), deadline));
      RM_RETURN_IF_ERROR(
          comm_ops_->FromHalf(bf16, Wire(wire_unit_), {out, static_cast<size_t>(unit.padded)}));
      return comm_ops_->Synchronize();
    }
    return comm_->AllGather(piece, out, unit.shard, DataType::kFloat32, deadline);
  }

  absl::Status ReduceScatter(const FsdpUnit& unit, const Op& op, absl::Time deadline,
                             double* squares) {
    RM_RETURN_IF_ERROR(WaitForModel(op.token));
    RM_RETURN_IF_ERROR(WaitForModel(grads_free_));
    const absl::Span<float> g{op.buffer, static_cast<size_t>(unit.padded)};
    if (op.discard) RM_RETURN_IF_ERROR(comm_ops_->Zero(g));
    if (measure_) {
      RM_ASSIGN_OR_RETURN(*squares, comm_ops_->SumOfSquares(g));
    }
    const absl::Span<float> shard{grads_ + unit.local, static_cast<size_t>(unit.shard)};
    // The sum goes straight to the shard, or through the scratch when it is added to it.
    const absl::Span<float> reduced =
        op.accumulate ? shard_scratch_.span().first(shard.size()) : shard;
    if (IsHalf(options_.reduce)) {
      const bool bf16 = options_.reduce == Precision::kBFloat16;
      RM_RETURN_IF_ERROR(comm_ops_->ToHalf(bf16, g, Wire(wire_unit_)));
      RM_RETURN_IF_ERROR(comm_ops_->Synchronize());
      RM_RETURN_IF_ERROR(meter_.Measure(op.unit, *comm_, comm::OpKind::kReduceScatter, [&] {
        return comm_->ReduceScatter(Wire(wire_unit_), Wire(wire_shard_), unit.shard,
                                    WireType(options_.reduce), comm::ReduceOp::kSum, deadline);
      }));
      RM_RETURN_IF_ERROR(comm_ops_->FromHalf(bf16, Wire(wire_shard_), reduced));
    } else {
      RM_RETURN_IF_ERROR(comm_ops_->Synchronize());  // the discard's zeros
      RM_RETURN_IF_ERROR(meter_.Measure(op.unit, *comm_, comm::OpKind::kReduceScatter, [&] {
        return comm_->ReduceScatter(g.data(), reduced.data(), unit.shard, DataType::kFloat32,
                                    comm::ReduceOp::kSum, deadline);
      }));
    }
    if (op.accumulate) RM_RETURN_IF_ERROR(comm_ops_->Add(reduced, shard));
    return comm_ops_->Synchronize();
  }

  comm::Communicator* const comm_;
  const ShardedOptions options_;
  const FsdpLayout layout_;
  const int rank_;
  VectorOps* const ops_;       // the model's stream: the step's buffers, the unit buffers
  VectorOps* const comm_ops_;  // the communication thread's
  const bool on_host_;
  SumAcrossRanks sum_;
  UnitBufferPool pool_;
  BucketMeter meter_;  // each unit's reduce-scatters
  OpsBuffer full_;  // ZeRO-2: the compute copy of every parameter

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

  // Evaluation on the host of a strategy in device memory (EvaluatingOnHost).
  std::vector<float> host_unit_, host_full_;
  int host_unit_of_ = -1;
  bool host_full_current_ = false;

  // Read by the communication thread while ops are queued; set by the training thread
  // only when none is (between steps), with the model's stream's marks after their writers
  // and readers.
  float* master_ = nullptr;
  int master_written_ = UnitBufferPool::kNoToken;
  float* grads_ = nullptr;
  int grads_free_ = UnitBufferPool::kNoToken;
  // The communication thread's scratch, in comm_ops' memory.
  OpsBuffer wire_unit_, wire_shard_;  // 16-bit values of a unit and a shard
  OpsBuffer shard_scratch_;  // a reduced shard before it is added (with accumulation)

  absl::Mutex mu_;
  std::deque<Op> queue_ ABSL_GUARDED_BY(mu_);
  // Per unit: the buffer its last gather went into, until the training thread takes it.
  std::vector<float*> gathered_ ABSL_GUARDED_BY(mu_);
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
  if (options.ops == nullptr || options.comm_ops == nullptr) {
    return absl::InvalidArgumentError("CreateShardedDataParallel: ShardedOptions.ops is null");
  }
  RM_ASSIGN_OR_RETURN(FsdpLayout layout, ShardedLayout(options, comm->size()));
  auto strategy =
      std::make_unique<ShardedDataParallel>(comm, host_comm, options, std::move(layout));
  RM_RETURN_IF_ERROR(strategy->Start());
  return std::unique_ptr<ParallelStrategy>(std::move(strategy));
}

}  // namespace ringmaster::train
