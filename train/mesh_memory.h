// The memory each rank of a job with a mesh (parallelism.mesh tp × pp, data parallelism over
// the rest) holds, planned without training it: `ringctl estimate memory --spec` for such a
// job. The ranks of a mesh hold different parts of the model (pipeline stages, tensor-parallel
// shards), so the plan is one row per (pp, tp) coordinate; the data-parallel replicas of a
// coordinate hold the same.
#ifndef RINGMASTER_TRAIN_MESH_MEMORY_H_
#define RINGMASTER_TRAIN_MESH_MEMORY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "train/config.h"

namespace ringmaster::train {

struct MeshRankPlan {
  int pp_rank = 0;
  int tp_rank = 0;
  int64_t elements = 0;        // the rank's stages' tensors (its shards of them under tp)
  int64_t block_elements = 0;  // of which the transformer blocks'
  // fp32 parameters and gradients of those elements; the optimizer's moments over them,
  // divided along dp under ZeRO-1/2.
  int64_t parameter_bytes = 0;
  int64_t gradient_bytes = 0;
  int64_t optimizer_bytes = 0;
  // In bf16/fp16: the stages' parameters rounded once a step (pipeline::GptStage), shared by
  // the models in flight.
  int64_t compute_copy_bytes = 0;
  // ZeRO-3 over tensor-parallel shards (pp 1): parameters, gradients and optimizer state are
  // the rank's 1/dp pieces of its shard, and its units are gathered into unit buffers
  // (PlanRankState's for the shard over dp ranks); 0 otherwise.
  int64_t unit_buffer_bytes = 0;
  // Computed: one micro-batch's activations through each of the rank's stages (summed;
  // nn::GptModel::ActivationBytesFor, what a run of the stage measures), and
  // the schedule's peak of micro-batches in flight on this rank (pipeline::Simulate; a
  // chunk of an interleaved schedule counted as 1/v); activation_bytes is their product.
  int64_t activation_bytes_per_micro_batch = 0;
  double peak_in_flight = 0;
  int64_t activation_bytes = 0;

  int64_t total_bytes() const {
    return parameter_bytes + gradient_bytes + optimizer_bytes + compute_copy_bytes +
           unit_buffer_bytes + activation_bytes;
  }
};

// Every (pp, tp) coordinate's plan for `config` (HasMesh) on `world` ranks, pp-major. The
// activations are computed from each stage's buffer sizes for one micro-batch of the job's
// size (nothing is run or allocated: a model of any size plans at once), under zero_bubble
// with the linear layers' output gradients each micro-batch keeps for its deferred weights
// (train/pipeline/schedule.h). INVALID_ARGUMENT naming parallelism.mesh when the world is
// not a multiple of tp × pp, or the batch fields the pipeline's plan refuses; the model's
// errors.
absl::StatusOr<std::vector<MeshRankPlan>> PlanMeshMemory(const TrainConfig& config, int world);

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_MESH_MEMORY_H_
