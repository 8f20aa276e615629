// Fully sharded data parallelism over tensor-parallel shards (2D: FSDP along the mesh's dp,
// Megatron tensor parallelism along its tp): the ParallelStrategy of a job with mesh tp > 1,
// pp 1 and parallelism.zero_stage 3.
//
// Each rank runs its tensor-parallel shard of the GPT (nn::GptOptions tp_size / tp_rank: the
// heads and the MLP split, LayerNorms, row-parallel biases, embeddings and head replicated;
// the group's sums over tp_comm) as a whole model of its own: step_model(). That shard is
// then sharded along dp by the fully sharded strategy (train/fsdp.h) over dp_comm, the ranks
// of the same tp coordinate: units of the shard's blocks all-gathered for forward and
// backward, their gradients reduce-scattered, each rank keeping 1/dp of its shard's
// parameters, gradients and optimizer state. So a rank's state is 1/(tp·dp) of the model's
// split tensors (plus 1/dp of the replicated ones), and its gathered units a tp-th of
// ZeRO-3's without a mesh.
//
// The trainer still sees the whole model's flat space: update_pieces(), saved_pieces() and
// held_pieces() map the fully sharded strategy's pieces of the shard's table through the
// shard's places (train/tensor_places.h), so the optimizer, the checkpoints (in the whole
// model's coordinates: any mesh loads them) and the initialisation work as without a mesh.
// The update's partial sums are over the whole job (each tensor-parallel shard and each dp
// piece on one rank; a replicated tensor counted on tp rank 0: duplicate_ranges()).
//
// On a GPU the device runs the shard (TrainingDevice::RunTensorParallelShard) and the units
// live in its memory (options.sharded.ops); evaluation runs the CPU shard on host copies of
// the gathered units, as ZeRO-3 without a mesh does. Thread-safety as every strategy.
#ifndef RINGMASTER_TRAIN_TENSOR_PARALLEL_SHARDED_H_
#define RINGMASTER_TRAIN_TENSOR_PARALLEL_SHARDED_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "comm/communicator.h"
#include "state/range.h"
#include "state/tensor.h"
#include "train/fsdp.h"
#include "train/model.h"
#include "train/nn/gpt.h"
#include "train/parallel_strategy.h"
#include "train/tensor_places.h"

namespace ringmaster::train {

struct TensorParallelShardedOptions {
  // The whole model's options and table (the optimizer's and the checkpoints' flat space;
  // not owned, outlives the strategy).
  nn::GptOptions gpt;
  const state::TensorTable* whole_table = nullptr;
  // Host-memory communicators, not owned, outliving the strategy: the tensor-parallel group
  // (this rank at its tp coordinate), the data-parallel group (the ranks of the same tp
  // coordinate) and the whole job.
  comm::Communicator* tp_comm = nullptr;
  comm::Communicator* dp_comm = nullptr;
  comm::Communicator* world_comm = nullptr;
  // The fully sharded strategy's units, prefetch, resharding, precisions, timeout and memory
  // (ops, comm_ops: a GPU's when the shard runs there, TrainingDevice::RunTensorParallelShard)
  // (zero_stage must be 3; `table` and `groups` are filled in: the shard's).
  ShardedOptions sharded;
  // The dp group over device memory (NCCL's) for the gathers and reduce-scatters of a GPU's
  // units; null: dp_comm (staging device memory through the host).
  comm::Communicator* dp_gradients = nullptr;
};

class TensorParallelSharded final : public ParallelStrategy {
 public:
  // INVALID_ARGUMENT naming what does not fit: a null communicator or table, a stage other
  // than 3, a model the tensor-parallel group does not split (nn::GptModel::Create's error);
  // CreateShardedDataParallel's errors.
  static absl::StatusOr<std::unique_ptr<TensorParallelSharded>> Create(
      const TensorParallelShardedOptions& options);

  std::string Describe() const override;
  int64_t local_elements() const override { return fsdp_->local_elements(); }
  state::FlatRange update_window() const override { return fsdp_->update_window(); }
  std::vector<state::PlacedRange> update_pieces() const override {
    return MapPieces(fsdp_->update_pieces(), /*replicas=*/true);
  }
  std::vector<state::PlacedRange> saved_pieces() const override {
    return MapPieces(fsdp_->saved_pieces(), /*replicas=*/false);
  }
  // Every piece this rank holds (a restore fills them all, the replicated ones included).
  std::vector<state::PlacedRange> held_pieces() const override { return update_pieces(); }
  bool whole_state_on_every_rank() const override { return false; }
  const SumAcrossRanks& sum() const override { return sum_; }
  absl::Status MaterializeParameters(absl::Span<float> params) override {
    return fsdp_->MaterializeParameters(params);
  }
  ParameterStore* store() override { return fsdp_->store(); }
  void BeginPass(Pass pass) override { fsdp_->BeginPass(pass); }
  absl::Status EndEvaluation() override { return fsdp_->EndEvaluation(); }
  void BeginGradients(float* grads, bool measure_local_norm) override {
    fsdp_->BeginGradients(grads, measure_local_norm);
  }
  void GradientsReady(int64_t offset) override { fsdp_->GradientsReady(offset); }
  absl::Status ReduceGradients() override { return fsdp_->ReduceGradients(); }
  const GradientSyncStats& last_step() const override { return fsdp_->last_step(); }
  std::vector<BucketCounters> bucket_counters() const override { return fsdp_->bucket_counters(); }
  absl::Status AfterOptimizerStep(absl::Span<float> params) override {
    return fsdp_->AfterOptimizerStep(params);
  }
  // The shard's whole parameters gathered along dp, placed in `whole` (a replicated tensor
  // from tp rank 0), summed over the tensor-parallel group. Every rank calls it.
  absl::Status WholeParameters(absl::Span<float> params, absl::Span<float> whole) override;
  int64_t unit_buffer_bytes_peak() const override { return fsdp_->unit_buffer_bytes_peak(); }
  std::vector<state::FlatRange> duplicate_ranges() const override;
  Model* step_model() override { return shard_.get(); }

 private:
  TensorParallelSharded(const TensorParallelShardedOptions& options,
                        std::unique_ptr<nn::GptModel> shard)
      : options_(options), shard_(std::move(shard)) {}
  int tp_rank() const { return options_.tp_comm->rank(); }
  // `pieces` of the shard's flat space (`at` in the step's buffers) as pieces of the whole
  // model's; with replicas false a replicated tensor's count on tp rank 0 only.
  std::vector<state::PlacedRange> MapPieces(const std::vector<state::PlacedRange>& pieces,
                                            bool replicas) const;

  TensorParallelShardedOptions options_;
  std::unique_ptr<nn::GptModel> shard_;
  std::vector<TensorPlace> places_;  // the shard's tensors: `local` in the shard's flat space
  std::unique_ptr<ParallelStrategy> fsdp_;
  SumAcrossRanks sum_;
};

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_TENSOR_PARALLEL_SHARDED_H_
