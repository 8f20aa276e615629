#include "train/parallel_strategy.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace ringmaster::train {
namespace {

class DataParallel final : public ParallelStrategy {
 public:
  DataParallel(comm::Communicator* comm, comm::Communicator* host_comm,
               const DataParallelOptions& options, int64_t padded,
               std::unique_ptr<GradientSync> sync)
      : comm_(comm), options_(options), padded_(padded), sync_(std::move(sync)) {
    const state::FlatRange shard = sync_->shard();
    // The shard clamped to the tensors: padding has no optimizer state.
    const state::FlatRange clamped{std::min(shard.begin, options.elements),
                                   std::min(shard.end, options.elements)};
    owned_ = options.zero_stage == 0 ? state::FlatRange{0, options.elements} : clamped;
    saved_ = clamped;
    // With plain data parallelism every rank holds the whole reduced gradient, so local sums
    // are already global; with ZeRO each rank sums its shard and the ranks add up.
    if (options.zero_stage == 0) {
      sum_ = SumOnOneRank;
    } else {
      const absl::Duration timeout = options.op_timeout;
      sum_ = [host_comm, timeout](absl::Span<double> values) {
        return host_comm->AllReduce(values.data(), values.data(), values.size(),
                                    DataType::kFloat64, comm::ReduceOp::kSum,
                                    absl::Now() + timeout);
      };
    }
  }

  std::string Describe() const override {
    return absl::StrCat("ZeRO-", options_.zero_stage, "; buckets ", sync_->num_buckets(), " (",
                        options_.bucket_mb, " MiB), overlap ", options_.overlap ? "on" : "off");
  }
  int64_t local_elements() const override { return padded_; }
  state::FlatRange update_window() const override { return owned_; }
  std::vector<state::PlacedRange> update_pieces() const override { return {{owned_, 0}}; }
  std::vector<state::PlacedRange> saved_pieces() const override {
    return {state::InPlace(saved_)};
  }
  bool whole_state_on_every_rank() const override { return options_.zero_stage == 0; }
  const SumAcrossRanks& sum() const override { return sum_; }

  // Every rank holds every parameter.
  absl::Status MaterializeParameters(absl::Span<float>) override { return absl::OkStatus(); }
  void BeginGradients(float* grads, bool measure_local_norm) override {
    sync_->Begin(grads, measure_local_norm ? GradientSync::StepDiagnostics::kLocalGradNorm
                                           : GradientSync::StepDiagnostics::kNone);
  }
  void GradientsReady(int64_t offset) override { sync_->Ready(offset); }
  absl::Status ReduceGradients() override { return sync_->Finish(); }
  const GradientSyncStats& last_step() const override { return sync_->last_step(); }
  std::vector<BucketCounters> bucket_counters() const override { return sync_->bucket_counters(); }

  absl::Status AfterOptimizerStep(absl::Span<float> params) override {
    if (options_.zero_stage == 0) return absl::OkStatus();
    // Each rank updated its shard: gather the others'. The collective does not wait for the
    // device's queue, so the update must be done first.
    RM_RETURN_IF_ERROR(options_.ops->Synchronize());
    const state::FlatRange shard = sync_->shard();
    return comm_->AllGather(params.data() + shard.begin, params.data(),
                            static_cast<size_t>(shard.size()), DataType::kFloat32,
                            absl::Now() + options_.op_timeout);
  }

 private:
  comm::Communicator* const comm_;
  const DataParallelOptions options_;
  const int64_t padded_;
  std::unique_ptr<GradientSync> sync_;
  state::FlatRange owned_, saved_;
  SumAcrossRanks sum_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ParallelStrategy>> CreateDataParallel(
    comm::Communicator* comm, comm::Communicator* host_comm, const DataParallelOptions& options) {
  if (comm == nullptr || host_comm == nullptr) {
    return absl::InvalidArgumentError("CreateDataParallel: a communicator is null");
  }
  if (options.zero_stage < 0 || options.zero_stage > 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallelism.zero_stage: ", options.zero_stage, " is not 0, 1 or 2"));
  }
  const int64_t padded = PaddedElements(options.elements, comm->size());
  GradientSyncOptions so;
  so.padded_elements = padded;
  so.bucket_elements = std::max<int64_t>(state::kAlignElements,
                                         static_cast<int64_t>(options.bucket_mb * (1 << 20) / 4));
  so.reduction = options.zero_stage == 2 ? GradientReduction::kReduceScatter
                                         : GradientReduction::kAllReduce;
  so.overlap = options.overlap;
  so.op_timeout = options.op_timeout;
  so.ops = options.ops;
  so.comm_ops = options.comm_ops;
  RM_ASSIGN_OR_RETURN(std::unique_ptr<GradientSync> sync, GradientSync::Create(comm, so));
  return std::unique_ptr<ParallelStrategy>(
      new DataParallel(comm, host_comm, options, padded, std::move(sync)));
}

}  // namespace ringmaster::train
