// The trainer's mesh (parallelism.mesh): the communicators of a rank's pipeline and
// data-parallel groups, and pipeline parallelism's strategy and micro-batches. Kept apart
// from train/trainer.cc, which calls these at its phases.
#ifndef RINGMASTER_TRAIN_TRAINER_MESH_H_
#define RINGMASTER_TRAIN_TRAINER_MESH_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/communicator.h"
#include "comm/mesh.h"
#include "train/batch.h"
#include "train/config.h"
#include "train/data/dataset.h"
#include "train/data/partition.h"
#include "train/data/sampler.h"
#include "train/device.h"
#include "train/model.h"
#include "train/parallel_strategy.h"
#include "train/pipeline/schedule.h"
#include "train/pipeline_parallel.h"

namespace ringmaster::train {

// A rank's place on the job's mesh. Without model parallelism (pp = tp = 1) there is no mesh
// and the data-parallel group is the whole job.
struct MeshGroups {
  std::optional<comm::Mesh> mesh;
  std::unique_ptr<comm::Communicator> pp, dp, tp;  // host-memory groups (null without a mesh)
  // The same groups split from the gradients' NCCL communicator (BuildDeviceMeshGroups): a
  // GPU's stages exchange their messages, tensor-parallel sums and gradients through them.
  // Null where there is no NCCL (the host groups then stage device memory through the host).
  std::unique_ptr<comm::Communicator> pp_device, dp_device, tp_device;
  // The tensor-parallel group for device memory: NCCL's where there is one, else the host's.
  comm::Communicator* tp_for_device() const {
    return tp_device != nullptr ? tp_device.get() : tp.get();
  }
  int dp_rank = 0;
  int dp_size = 1;
};

// The mesh of `config` over `world` (host-memory collectives, every rank calls it): pp
// outermost, tp innermost (a tensor-parallel group is consecutive ranks: one host's).
// INVALID_ARGUMENT naming parallelism.mesh when the world is not a multiple of tp · pp.
absl::StatusOr<MeshGroups> BuildMeshGroups(const TrainConfig& config, comm::Communicator& world,
                                           absl::Duration op_timeout);

// The device groups of `groups` (a mesh's) split from `nccl` (the job's NCCL communicator,
// ncclCommSplit; every rank calls it). The communicator's errors.
absl::Status BuildDeviceMeshGroups(MeshGroups& groups, comm::Communicator& nccl,
                                   absl::Duration op_timeout);

// The strategy of a job with a mesh (mesh.pp or mesh.tp > 1; train/pipeline_parallel.h:
// with pp 1, one stage of the whole model per tensor-parallel rank, its micro-batches run one
// after the other) over the groups; `model` is the whole GPT (its table is the checkpoints'
// and the optimizer's flat space). With `device` (made with CudaDeviceOptions::stages) the
// stages, their messages and the gradients' reduction are in its memory, over the device
// groups where there are some. With zero_stage 3 (pp 1) the strategy is ZeRO-3 along dp over
// the tensor-parallel shards (train/tensor_parallel_sharded.h; with `device` the shard runs
// there). INVALID_ARGUMENT naming the field for what the mesh does not run: a model other
// than the GPT.
absl::StatusOr<std::unique_ptr<ParallelStrategy>> CreatePipelineStrategy(
    const TrainConfig& config, const Model& model, const MeshGroups& groups,
    comm::Communicator& world, absl::Duration op_timeout, TrainingDevice* device = nullptr);

// The pipeline schedule a rank of `config`'s mesh runs with `dp_size` data-parallel replicas:
// parallelism.pipeline's with pp > 1; with pp 1 (tensor parallelism alone) 1F1B over the one
// stage with data parallelism's micro-batches (one micro-batch's activations at a time).
// PlanPipelineBatches's errors.
absl::StatusOr<pipeline::ScheduleOptions> MeshSchedule(const TrainConfig& config, int dp_size);

// diagnostics.fingerprint_every under a mesh, at `step` (every rank of `world` calls it):
// the data-parallel replicas of each of this rank's stages compare all its tensors over the
// dp group, and the tensor-parallel group compares the tensors it replicates (LayerNorms,
// the row-parallel biases, embeddings and head; the shards differ by design); then the whole
// job learns whether any group found a difference, so every rank stops alike. INTERNAL on
// every rank when one did: naming the tensor, the two ranks of the job and the group where
// this rank's groups found it, else the lowest rank that did. The collectives' errors.
absl::Status CheckMeshFingerprints(const MeshGroups& groups, comm::Communicator& world,
                                   const PipelineParallel& pipeline, absl::Span<const float> params,
                                   double loss, int64_t step, absl::Time deadline);

// The batch plan of a job with a mesh: with pp > 1, each data-parallel replica's share of
// the global batch cut into parallelism.pipeline.micro_batches micro-batches; with pp 1
// (tensor parallelism alone), the plan of data parallelism over the replicas. INVALID_ARGUMENT
// (permanent) naming the fields when, with pp > 1, batch.accumulation is set (the pipeline's
// micro-batches replace it), a replica's share of a full global batch has fewer samples than
// micro-batches, or a micro-batch would be larger than batch.micro_max.
absl::StatusOr<data::BatchPlan> PlanPipelineBatches(const TrainConfig& config, int dp_size);

// The micro-batches of data-parallel replica `dp_rank` for global batch `gb` (the plan's
// count of them), gathered from `dataset`; an empty one (a short global batch) is a stand-in
// (the batch's first sample) marked in `discarded`.
absl::Status GatherPipelineMicroBatches(const data::BatchPlan& plan, const data::GlobalBatch& gb,
                                        int dp_rank, const data::Dataset& dataset,
                                        std::vector<Batch>* micro_batches,
                                        std::vector<bool>* discarded);

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_TRAINER_MESH_H_
