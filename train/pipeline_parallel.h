// Pipeline parallelism for the GPT, composed with data parallelism: the ParallelStrategy of
// a job whose mesh has pp > 1 (ARCHITECTURE.md "one mesh"; comm/mesh.h).
//
// The model's blocks are split into P·v stages (train/pipeline/gpt_stage.h: the embeddings on
// the first, lnf, the LM head and the loss on the last); rank r of the pipeline group holds
// stages r, r + P, ... (v of them: the interleaved schedule's virtual stages). Each step runs
// the schedule (train/pipeline/schedule.h) over the rank's micro-batches with the executor
// (train/pipeline/executor.h), then the stages' gradients are all-reduced over the
// data-parallel group (the replicas of the same stages) as plain data parallelism does
// (train/parallel_strategy.h: buckets; ZeRO-1 shards the optimizer state along dp, ZeRO-2
// also reduce-scatters the gradients, Megatron's distributed optimizer: the gradient buffer
// stays whole, the micro-batches accumulate into it).
//
// The step's buffers hold this rank's stages back to back, each in its slice's layout. The
// trainer still sees the whole model's flat space: update_pieces(), saved_pieces() and
// held_pieces() place the stages' tensors in it, so the optimizer, the checkpoints (saved in
// the whole model's coordinates: any mesh loads them) and the initialisation (from the
// common seed) work as for fully sharded data parallelism.
//
// On a GPU (TrainingDevice::CreateStage, train/device.h) the stages are GptCudaStages: the
// step's buffers, the executor's messages (options.ops) and the data-parallel reduction are
// in the device's memory, and the pipeline messages, tensor-parallel sums and gradient
// reduction go over the device groups given (NCCL's, split from the job's), else over the
// host groups, which stage device buffers through the host.
//
// Thread-safety: from the training thread only, as every strategy.
#ifndef RINGMASTER_TRAIN_PIPELINE_PARALLEL_H_
#define RINGMASTER_TRAIN_PIPELINE_PARALLEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "comm/communicator.h"
#include "state/range.h"
#include "state/tensor.h"
#include "train/batch.h"
#include "train/model.h"
#include "train/nn/gpt.h"
#include "train/optim/vector_ops.h"
#include "train/parallel_strategy.h"
#include "train/pipeline/executor.h"
#include "train/pipeline/gpt_pipeline_stage.h"
#include "train/pipeline/gpt_stage.h"
#include "train/pipeline/schedule.h"
#include "train/tensor_places.h"

namespace ringmaster::train {

struct PipelineParallelOptions {
  // The whole model's options (first_block / end_block as for the whole model) and table:
  // the flat space of the optimizer and the checkpoints. Not owned; outlives the strategy.
  nn::GptOptions gpt;
  const state::TensorTable* whole_table = nullptr;
  // The schedule: ranks = the pipeline group's size P, micro_batches m, virtual_stages v.
  pipeline::ScheduleOptions schedule;
  // Host-memory communicators, not owned, outliving the strategy: the pipeline group (this
  // rank at its stage coordinate), the data-parallel group (the replicas of this rank's
  // stages) and the whole job (ZeRO-1's sums).
  comm::Communicator* pp_comm = nullptr;
  comm::Communicator* dp_comm = nullptr;
  comm::Communicator* world_comm = nullptr;
  // The tensor-parallel group (mesh tp): each stage's blocks split over it (nn::GptOptions
  // tp_size, this rank at its tp coordinate). Null: no tensor parallelism.
  comm::Communicator* tp_comm = nullptr;
  // zero_stage (0, 1 or 2), buckets, overlap, the timeout and the memory (ops, comm_ops) of
  // the data-parallel reduction; `elements` is filled in (this rank's stages).
  DataParallelOptions dp;
  // Where the stages run. Null: on the CPU (pipeline::GptStage, the tensor-parallel sums over
  // tp_comm). Else it makes the stage of a slice (a GPU's, with its tensor-parallel sums), and
  // `ops` is that memory's (the executor's messages and evaluation's, zeroing the padding).
  using StageFactory = std::function<absl::StatusOr<std::unique_ptr<pipeline::GptPipelineStage>>(
      const nn::GptOptions& slice)>;
  StageFactory make_stage;
  VectorOps* ops = HostVectorOps();
  // Groups that take the stages' memory, when it is a device's and the host groups above
  // would stage it through the host: the pipeline messages' (pp_comm's ranks) and the
  // gradients' reduction (dp_comm's). Null: pp_comm, dp_comm. Not owned.
  comm::Communicator* pp_messages = nullptr;
  comm::Communicator* dp_gradients = nullptr;
};

class PipelineParallel final : public ParallelStrategy {
 public:
  // INVALID_ARGUMENT naming what does not fit: a schedule the pipeline group's size does
  // not match, more stages than blocks, a ZeRO stage other than 0, 1 or 2, a null communicator.
  static absl::StatusOr<std::unique_ptr<PipelineParallel>> Create(
      const PipelineParallelOptions& options);

  std::string Describe() const override;
  int64_t local_elements() const override { return dp_->local_elements(); }
  state::FlatRange update_window() const override { return dp_->update_window(); }
  std::vector<state::PlacedRange> update_pieces() const override;
  std::vector<state::PlacedRange> saved_pieces() const override;
  bool whole_state_on_every_rank() const override { return false; }
  const SumAcrossRanks& sum() const override { return sum_; }
  absl::Status MaterializeParameters(absl::Span<float>) override { return absl::OkStatus(); }
  void BeginGradients(float* grads, bool measure_local_norm) override {
    dp_->BeginGradients(grads, measure_local_norm);
  }
  void GradientsReady(int64_t offset) override { dp_->GradientsReady(offset); }
  absl::Status ReduceGradients() override { return dp_->ReduceGradients(); }
  const GradientSyncStats& last_step() const override { return dp_->last_step(); }
  std::vector<BucketCounters> bucket_counters() const override { return dp_->bucket_counters(); }
  absl::Status AfterOptimizerStep(absl::Span<float> params) override {
    return dp_->AfterOptimizerStep(params);
  }
  // Each rank writes its stages' tensors into `whole` (a replicated one from tensor-parallel
  // rank 0 only; `params` in the stages' memory, a GPU's copied to the host first), the
  // pipeline and tensor-parallel groups sum them.
  absl::Status WholeParameters(absl::Span<float> params, absl::Span<float> whole) override;
  PipelineParallel* pipeline() override { return this; }

  // Every tensor of this rank's stages: where it is in the step's buffers (the restore reads
  // them all; each data-parallel replica saves only its part, saved_pieces()).
  std::vector<state::PlacedRange> held_pieces() const override {
    return Map({0, stages_elements_}, 0, /*replicas=*/true);
  }
  // Under tensor parallelism, on tensor-parallel ranks other than 0: the replicated tensors'
  // ranges of the update window (offsets from its start), which rank 0 counts in the
  // gradients' norm (ClipGradNorm's duplicates); empty otherwise.
  std::vector<state::FlatRange> duplicate_ranges() const override;

  // One step's forward and backward over this rank's micro-batches (the data-parallel
  // replica's share of the global batch, m of them) through the pipeline: the stages'
  // gradients into `grads` (every one final when it returns; GradientsReady(0) is called).
  // The loss is the last stage's (zeros on the other ranks). `discarded` as
  // pipeline::GptStage::BeginStep's: stand-ins that count for nothing.
  absl::StatusOr<StepStats> RunStep(absl::Span<const Batch> micro_batches,
                                    absl::Span<const float> params, absl::Span<float> grads,
                                    const ForwardBackwardOptions& options,
                                    const std::vector<bool>& discarded = {});
  // A forward-only pass of `batch` through the pipeline (every rank of the pipeline group
  // calls it with the same batch): the loss on the rank of the last stage, zeros elsewhere.
  absl::StatusOr<StepStats> Evaluate(const Batch& batch, absl::Span<const float> params,
                                     Precision precision);

  const pipeline::Schedule& schedule() const { return schedule_; }
  const pipeline::PipelineRunStats& last_run() const { return last_run_; }
  // Over every RunStep so far: 1 − (time in this rank's stage computations) ÷ (time in the
  // pipeline), the bubble as this rank saw it (0 before the first step); and the schedule's
  // formula for it (pipeline::FormulaBubble).
  double measured_bubble() const;
  double formula_bubble() const;
  // The most micro-batches any of this rank's stages held in flight at once.
  int peak_in_flight() const;
  // The stages' activation memory (every micro-batch in flight at once).
  int64_t activation_bytes() const;
  int pp_rank() const { return options_.pp_comm->rank(); }

  // The 16-bit parameter copies the stages' micro-batches keep (a GPU's stages in bf16/fp16).
  int64_t parameter_copy_bytes() const;

  // This rank's stages, for diagnostics (fingerprints): the global stage, its model (whose
  // table lays the stage out in the step's buffers from `base`).
  struct StageView {
    int index = 0;
    const nn::GptModel* model = nullptr;
    int64_t base = 0;
  };
  std::vector<StageView> stage_views() const {
    std::vector<StageView> views;
    for (const Stage& s : stages_) views.push_back({s.index, &s.stage->layout(), s.base});
    return views;
  }

 private:
  struct Stage {
    int index = 0;  // the global stage
    std::unique_ptr<pipeline::GptPipelineStage> stage;
    int64_t base = 0;  // where its slice starts in the step's buffers
    int64_t elements = 0;
  };
  PipelineParallel(const PipelineParallelOptions& options, pipeline::Schedule schedule)
      : options_(options), schedule_(std::move(schedule)) {}
  // The pieces of the whole flat space inside `local` (step-buffer offsets), `at` counted
  // from `origin`. With replicas false, a replicated tensor's runs count on tensor-parallel
  // rank 0 only.
  std::vector<state::PlacedRange> Map(state::FlatRange local, int64_t origin, bool replicas) const {
    return MapTensorPlaces(places_, local, origin, replicas, tp_rank());
  }
  int tp_rank() const { return options_.tp_comm != nullptr ? options_.tp_comm->rank() : 0; }
  int tp_size() const { return options_.tp_comm != nullptr ? options_.tp_comm->size() : 1; }
  // The group the pipeline's messages go through.
  comm::Communicator* messages() const {
    return options_.pp_messages != nullptr ? options_.pp_messages : options_.pp_comm;
  }
  // One message to or from `peer` of the pipeline group.
  absl::Status Message(comm::PointToPoint::Kind kind, int peer, absl::Span<float> data);
  // A tied LM head (nn::GptOptions::tied_head): the first stage's wte gradient and the last
  // stage's copy's are exchanged and each replaced by their sum (a + b = b + a: the copies
  // take the same steps and stay equal). Nothing on the other ranks.
  absl::Status SumTiedGradients(absl::Span<float> grads);

  PipelineParallelOptions options_;
  pipeline::Schedule schedule_;
  std::vector<Stage> stages_;
  std::vector<TensorPlace> places_;  // in increasing local (and whole) order
  // A tied head's wte on the first pipeline rank or its copy on the last: its run in the
  // step's buffers and the other rank (-1: neither here).
  state::FlatRange tied_run_;
  int tied_peer_ = -1;
  OpsBuffer tied_received_;
  int64_t stages_elements_ = 0;
  std::unique_ptr<ParallelStrategy> dp_;
  SumAcrossRanks sum_;
  pipeline::PipelineRunStats last_run_;
  pipeline::MessagePool pool_;              // the executor's messages, kept from step to step
  absl::Duration compute_sum_, total_sum_;  // over the steps run
};

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_PIPELINE_PARALLEL_H_
