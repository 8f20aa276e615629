// GradientSync: averages gradients across the data-parallel ranks in buckets, overlapped
// with backward (ARCHITECTURE.md: "DDP buckets are contiguous slices of the flat gradient
// buffer, reduced while backward still runs").
//
// The flat gradient buffer has `padded_elements` floats, a multiple of world × 16, split
// into equal contiguous shards: rank r owns [r·S, (r+1)·S), S = padded_elements / world.
//
//   kAllReduce (plain data parallelism and ZeRO-1): buckets are contiguous slices taken
//     from the top of the buffer down (backward finishes the highest offsets first); each
//     is all-reduced (SUM: the model already divided by the global count) as soon as every
//     gradient in it is final. Every rank ends with the whole summed gradient.
//   kReduceScatter (ZeRO-2): bucket k is a stripe — the k-th block of every shard — and is
//     reduce-scattered, so each rank ends with the sum of its own shard only. A stripe is
//     final once backward has passed its block in shard 0, so stripes overlap only the last
//     part of backward (the first layers); their order is still highest offset first.
//
// Every rank runs the same model, so every rank launches the same buckets in the same
// order: the collectives match. With `overlap`, a communication thread runs them while
// backward goes on; without it, Finish() runs them all after backward (for comparison).
//
// Thread-safety: Begin/Ready/Finish from the training thread only; Ready() only enqueues.
#ifndef RINGMASTER_TRAIN_GRAD_SYNC_H_
#define RINGMASTER_TRAIN_GRAD_SYNC_H_

#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "comm/communicator.h"
#include "state/range.h"
#include "train/optim/vector_ops.h"

namespace ringmaster::train {

enum class GradientReduction { kAllReduce, kReduceScatter };

struct GradientSyncOptions {
  // Elements of the flat gradient buffer; a multiple of world_size × kAlignElements (see
  // PaddedElements).
  int64_t padded_elements = 0;
  // Target elements per bucket (25 MiB of f32 by default, as PyTorch DDP).
  int64_t bucket_elements = 25 << 18;
  GradientReduction reduction = GradientReduction::kAllReduce;
  bool overlap = true;
  // Deadline of each collective, counted from its start.
  absl::Duration op_timeout = absl::Seconds(120);
  // The memory of the gradients (not owned). `ops` is the training thread's, whose work
  // produces the gradients: Ready() marks it, and a bucket is reduced once the work before
  // the mark is complete (a GPU's backward runs behind the host's calls). `comm_ops` are
  // used by the thread that reduces (kReduceScatter's staging copies, the local norm); for
  // a GPU, ops on a stream of their own, so that they do not wait for the backward.
  VectorOps* ops = HostVectorOps();
  VectorOps* comm_ops = HostVectorOps();
};

// `elements` rounded up to a multiple of world_size × kAlignElements.
int64_t PaddedElements(int64_t elements, int world_size);

struct GradientSyncStats {
  absl::Duration comm_time;     // time inside collectives this step
  absl::Duration exposed_wait;  // time Finish() blocked the training thread
  int buckets = 0;
  // L2 norm of this rank's own gradient before the reduction, when the step asked for it
  // (diagnostics: a rank whose gradients differ wildly from its peers' shows here).
  double local_grad_norm = 0;
};

// One gradient bucket's reductions since it was made (RankStats.buckets): measured by its
// communicator's counters around each call, with the formula of the algorithm that ran.
struct BucketCounters {
  int64_t payload_bytes = 0;  // of the last reduction (OpCounters::payload_bytes)
  uint64_t calls = 0;
  uint64_t bytes_sent = 0;
  uint64_t formula_bytes_sent = 0;
  absl::Duration time;  // inside the collective
};

// Per-bucket counters for a strategy's reductions (GradientSync's buckets, ZeRO-3's units).
// Thread-safety: any thread; one bucket's reductions come from one thread at a time, the
// one that issues its communicator's operations (communicator.h), so the change of the
// communicator's counters across Measure is that reduction's alone.
class BucketMeter {
 public:
  explicit BucketMeter(int buckets) : buckets_(buckets) {}

  // Runs `reduce` (one collective of `kind` on `comm`) and adds it to `bucket`.
  template <typename Fn>
  absl::Status Measure(int bucket, comm::Communicator& comm, comm::OpKind kind, Fn&& reduce) {
    const comm::OpCounters before = comm.counters().of(kind);
    const absl::Time start = absl::Now();
    absl::Status status = reduce();
    Add(bucket, before, comm.counters().of(kind), absl::Now() - start);
    return status;
  }
  // A snapshot, in bucket order.
  std::vector<BucketCounters> Snapshot() const;

 private:
  void Add(int bucket, const comm::OpCounters& before, const comm::OpCounters& after,
           absl::Duration took);

  mutable absl::Mutex mu_;
  std::vector<BucketCounters> buckets_ ABSL_GUARDED_BY(mu_);
};

class GradientSync {
 public:
  // `comm` is not owned and must outlive this object. INVALID_ARGUMENT for bad options.
  static absl::StatusOr<std::unique_ptr<GradientSync>> Create(comm::Communicator* comm,
                                                              const GradientSyncOptions& options);
  ~GradientSync();

  // This rank's shard [r·S, (r+1)·S) of the padded flat index space.
  state::FlatRange shard() const;
  int num_buckets() const { return static_cast<int>(buckets_.size()); }

  // Starts a step over `grads` (padded_elements floats of the ops' memory, not owned). With kLocalGradNorm the
  // step also measures this rank's own gradient norm before the reduction (one more pass
  // over the gradients: ask for it on logged steps only).
  enum class StepDiagnostics { kNone, kLocalGradNorm };
  void Begin(float* grads, StepDiagnostics diagnostics = StepDiagnostics::kNone);
  // Every gradient at flat offset >= `offset` is final (the model's on_grads_ready).
  void Ready(int64_t offset);
  // Launches the buckets not yet launched, waits for all of them and returns the first
  // error (the communicator's: ABORTED, UNAVAILABLE, DEADLINE_EXCEEDED). After an error
  // the communicator is broken; the step must not be applied.
  absl::Status Finish();
  const GradientSyncStats& last_step() const { return stats_; }
  // Every bucket's reductions since Create, in launch order (bucket 0 the highest
  // offsets). Any thread.
  std::vector<BucketCounters> bucket_counters() const { return meter_.Snapshot(); }

 private:
  struct Bucket {
    int64_t ready_at = 0;  // launch once Ready(offset) has offset <= ready_at
    int64_t begin = 0;     // kAllReduce: the slice; kReduceScatter: the block in shard 0
    int64_t end = 0;
    int mark = 0;          // options.ops->Mark() when it became ready (this step)
  };
  GradientSync(comm::Communicator* comm, const GradientSyncOptions& options);
  static std::vector<Bucket> MakeBuckets(const GradientSyncOptions& options, int world_size);
  absl::Status Reduce(int index);
  // The collective of one bucket; adds this rank's sum of squares when measuring.
  absl::Status ReduceBucket(int index, absl::Time deadline, double* squares);
  void Loop();

  comm::Communicator* const comm_;
  const GradientSyncOptions options_;
  const int64_t shard_elements_;
  std::vector<Bucket> buckets_;  // in launch order
  OpsBuffer staging_;            // kReduceScatter: one stripe, contiguous (comm_ops memory)
  float* grads_ = nullptr;
  bool measure_norm_ = false;
  int launched_ = 0;  // buckets handed over this step (training thread only)
  GradientSyncStats stats_;
  BucketMeter meter_;

  absl::Mutex mu_;
  int queued_ ABSL_GUARDED_BY(mu_) = 0;  // buckets the thread may run
  int done_ ABSL_GUARDED_BY(mu_) = 0;    // buckets it has run
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  absl::Duration comm_time_ ABSL_GUARDED_BY(mu_);
  double local_sum_squares_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_GRAD_SYNC_H_
