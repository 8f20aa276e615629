#include "train/grad_sync.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "state/tensor.h"

namespace ringmaster::train {

int64_t PaddedElements(int64_t elements, int world_size) {
  const int64_t unit = static_cast<int64_t>(world_size) * state::kAlignElements;
  return std::max<int64_t>(unit, (elements + unit - 1) / unit * unit);
}

std::vector<BucketCounters> BucketMeter::Snapshot() const {
  absl::MutexLock lock(&mu_);
  return buckets_;
}

void BucketMeter::Add(int bucket, const comm::OpCounters& before, const comm::OpCounters& after,
                      absl::Duration took) {
  absl::MutexLock lock(&mu_);
  BucketCounters& b = buckets_[bucket];
  b.calls += after.calls - before.calls;
  b.bytes_sent += after.bytes_sent - before.bytes_sent;
  b.formula_bytes_sent += after.formula_bytes_sent - before.formula_bytes_sent;
  if (after.payload_bytes > before.payload_bytes) {
    b.payload_bytes = static_cast<int64_t>(after.payload_bytes - before.payload_bytes);
  }
  b.time += took;
}

absl::StatusOr<std::unique_ptr<GradientSync>> GradientSync::Create(
    comm::Communicator* comm, const GradientSyncOptions& options) {
  const int n = comm->size();
  if (options.padded_elements <= 0 || options.padded_elements % (n * state::kAlignElements) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GradientSyncOptions.padded_elements must be a positive multiple of world size x ",
        state::kAlignElements, " (", n * state::kAlignElements, "), got ",
        options.padded_elements));
  }
  if (options.bucket_elements <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GradientSyncOptions.bucket_elements must be positive, got ", options.bucket_elements));
  }
  if (options.ops == nullptr || options.comm_ops == nullptr) {
    return absl::InvalidArgumentError("GradientSyncOptions.ops and comm_ops must not be null");
  }
  std::unique_ptr<GradientSync> sync(new GradientSync(comm, options));
  if (options.reduction == GradientReduction::kReduceScatter) {
    int64_t block = 0;
    for (const Bucket& b : sync->buckets_) block = std::max(block, b.end - b.begin);
    RM_ASSIGN_OR_RETURN(sync->staging_, options.comm_ops->Allocate(block * n));
  }
  if (options.overlap) sync->thread_ = std::thread([s = sync.get()] { s->Loop(); });
  return sync;
}

GradientSync::GradientSync(comm::Communicator* comm, const GradientSyncOptions& options)
    : comm_(comm),
      options_(options),
      shard_elements_(options.padded_elements / comm->size()),
      buckets_(MakeBuckets(options, comm->size())),
      meter_(static_cast<int>(buckets_.size())) {}

std::vector<GradientSync::Bucket> GradientSync::MakeBuckets(const GradientSyncOptions& options,
                                                            int n) {
  std::vector<Bucket> buckets;
  const int64_t total = options.padded_elements;
  if (options.reduction == GradientReduction::kAllReduce) {
    const int64_t b = std::max<int64_t>(state::kAlignElements, options.bucket_elements);
    for (int64_t end = total; end > 0; end -= b) {
      const int64_t begin = std::max<int64_t>(0, end - b);
      buckets.push_back({begin, begin, end});
    }
  } else {
    // Blocks of a stripe: bucket_elements / world, whole cache lines, at most a shard.
    const int64_t shard = total / n;
    int64_t block = options.bucket_elements / n / state::kAlignElements * state::kAlignElements;
    block = std::clamp<int64_t>(block, state::kAlignElements, shard);
    const int64_t stripes = (shard + block - 1) / block;
    for (int64_t k = stripes - 1; k >= 0; --k) {
      const int64_t begin = k * block, end = std::min(shard, begin + block);
      buckets.push_back({begin, begin, end});
    }
  }
  return buckets;
}

GradientSync::~GradientSync() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

state::FlatRange GradientSync::shard() const {
  const int64_t begin = comm_->rank() * shard_elements_;
  return {begin, begin + shard_elements_};
}

void GradientSync::Begin(float* grads, StepDiagnostics diagnostics) {
  grads_ = grads;
  measure_norm_ = diagnostics == StepDiagnostics::kLocalGradNorm;
  launched_ = 0;
  stats_ = GradientSyncStats{};
  absl::MutexLock lock(&mu_);
  queued_ = 0;
  done_ = 0;
  comm_time_ = absl::ZeroDuration();
  local_sum_squares_ = 0;
}

void GradientSync::Ready(int64_t offset) {
  int ready = launched_;
  while (ready < num_buckets() && offset <= buckets_[ready].ready_at) ++ready;
  if (ready == launched_) return;
  const int mark = options_.ops->Mark();
  for (int b = launched_; b < ready; ++b) buckets_[b].mark = mark;
  launched_ = ready;
  if (!options_.overlap) return;  // Finish() runs them
  absl::MutexLock lock(&mu_);
  queued_ = ready;
}

absl::Status GradientSync::Reduce(int index) {
  const absl::Time start = absl::Now();
  double squares = 0;
  absl::Status status = ReduceBucket(index, start + options_.op_timeout, &squares);
  absl::MutexLock lock(&mu_);
  comm_time_ += absl::Now() - start;
  local_sum_squares_ += squares;
  return status;
}

absl::Status GradientSync::ReduceBucket(int index, absl::Time deadline, double* squares) {
  const Bucket& bucket = buckets_[index];
  const size_t len = static_cast<size_t>(bucket.end - bucket.begin);
  VectorOps* ops = options_.comm_ops;
  // The reduction may run only once the gradients it reads are complete.
  RM_RETURN_IF_ERROR(options_.ops->Wait(bucket.mark));
  if (options_.reduction == GradientReduction::kAllReduce) {
    float* p = grads_ + bucket.begin;
    if (measure_norm_) {
      RM_ASSIGN_OR_RETURN(*squares, ops->SumOfSquares({p, len}));
    }
    return meter_.Measure(index, *comm_, comm::OpKind::kAllReduce, [&] {
      return comm_->AllReduce(p, p, len, DataType::kFloat32, comm::ReduceOp::kSum, deadline);
    });
  }
  const int n = comm_->size();
  for (int r = 0; r < n; ++r) {
    RM_RETURN_IF_ERROR(ops->Copy({grads_ + r * shard_elements_ + bucket.begin, len},
                                 staging_.span().subspan(r * len, len)));
  }
  // The collective does not wait for the ops' queue (a GPU's stream): finish the copies.
  RM_RETURN_IF_ERROR(ops->Synchronize());
  if (measure_norm_) {
    RM_ASSIGN_OR_RETURN(*squares, ops->SumOfSquares({staging_.data(), len * n}));
  }
  return meter_.Measure(index, *comm_, comm::OpKind::kReduceScatter, [&] {
    return comm_->ReduceScatter(staging_.data(),
                                grads_ + comm_->rank() * shard_elements_ + bucket.begin, len,
                                DataType::kFloat32, comm::ReduceOp::kSum, deadline);
  });
}

void GradientSync::Loop() {
  // This thread's CUDA calls go to the reducing stream's device (not ordinal 0's by default).
  if (absl::Status bound = options_.comm_ops->BindThread(); !bound.ok()) {
    absl::MutexLock lock(&mu_);
    error_ = bound;
  }
  while (true) {
    int next;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](GradientSync* s)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) { return s->stop_ || s->done_ < s->queued_; },
          this));
      if (stop_) return;
      next = done_;
    }
    // After an error the remaining buckets are only counted: the step is lost anyway.
    absl::Status status;
    {
      absl::MutexLock lock(&mu_);
      status = error_;
    }
    if (status.ok()) status = Reduce(next);
    absl::MutexLock lock(&mu_);
    if (!status.ok() && error_.ok()) error_ = status;
    ++done_;
  }
}

absl::Status GradientSync::Finish() {
  Ready(0);
  const absl::Time start = absl::Now();
  absl::Status status;
  if (options_.overlap) {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](GradientSync* s)
             ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) { return s->done_ == s->num_buckets(); },
        this));
    status = error_;
    error_ = absl::OkStatus();
  } else {
    for (int b = 0; b < num_buckets(); ++b) {
      status = Reduce(b);
      if (!status.ok()) break;
    }
  }
  stats_.exposed_wait = absl::Now() - start;
  stats_.buckets = num_buckets();
  absl::MutexLock lock(&mu_);
  stats_.comm_time = comm_time_;
  stats_.local_grad_norm = std::sqrt(local_sum_squares_);
  return status;
}

}  // namespace ringmaster::train
