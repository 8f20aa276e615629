#include "train/pipeline_parallel.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace ringmaster::train {

absl::StatusOr<std::unique_ptr<PipelineParallel>> PipelineParallel::Create(
    const PipelineParallelOptions& o) {
  if (o.whole_table == nullptr || o.pp_comm == nullptr || o.dp_comm == nullptr ||
      o.world_comm == nullptr) {
    return absl::InvalidArgumentError(
        "PipelineParallelOptions: the whole table and the pp, dp and world communicators are "
        "required");
  }
  if (o.schedule.ranks != o.pp_comm->size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the pipeline schedule is for ", o.schedule.ranks,
                     " ranks; the pipeline group (mesh pp) has ", o.pp_comm->size()));
  }
  if (o.dp.zero_stage < 0 || o.dp.zero_stage > 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallelism.zero_stage is ", o.dp.zero_stage,
                     " with a mesh; want 0, 1 or 2 (ZeRO-3 composes with data parallelism alone)"));
  }
  RM_ASSIGN_OR_RETURN(pipeline::Schedule schedule, pipeline::MakeSchedule(o.schedule));
  RM_RETURN_IF_ERROR(pipeline::CheckSchedule(schedule));
  RM_ASSIGN_OR_RETURN(auto blocks, pipeline::SplitBlocks(o.gpt.layers, schedule.stages()));
  std::unique_ptr<PipelineParallel> p(new PipelineParallel(o, std::move(schedule)));
  const int rank = o.pp_comm->rank();
  const int tp = p->tp_size();
  PipelineParallelOptions::StageFactory make_stage = o.make_stage;
  if (!make_stage) {  // on the CPU
    nn::GptModel::TensorParallelSum tp_sum;
    if (tp > 1) {
      comm::Communicator* group = o.tp_comm;
      const absl::Duration timeout = o.dp.op_timeout;
      tp_sum = [group, timeout](absl::Span<float> x) {
        return group->AllReduce(x.data(), x.data(), x.size(), DataType::kFloat32,
                                comm::ReduceOp::kSum, absl::Now() + timeout);
      };
    }
    make_stage = [tp_sum](const nn::GptOptions& slice)
        -> absl::StatusOr<std::unique_ptr<pipeline::GptPipelineStage>> {
      RM_ASSIGN_OR_RETURN(std::unique_ptr<pipeline::GptStage> stage,
                          pipeline::GptStage::Create(slice));
      if (slice.tp_size > 1) stage->set_tensor_parallel_sum(tp_sum);
      return std::unique_ptr<pipeline::GptPipelineStage>(std::move(stage));
    };
  }
  for (int st = rank; st < p->schedule_.stages(); st += o.schedule.ranks) {
    nn::GptOptions slice = pipeline::StageOptions(o.gpt, blocks, st);
    slice.tp_size = tp;
    slice.tp_rank = p->tp_rank();
    Stage s;
    s.index = st;
    RM_ASSIGN_OR_RETURN(s.stage, make_stage(slice));
    const nn::GptModel& model = s.stage->layout();
    s.base = p->stages_elements_;
    s.elements = model.table().total_elements();
    if (absl::Status placed =
            AppendTensorPlaces(model, *o.whole_table, s.base, tp > 1, &p->places_);
        !placed.ok()) {
      return absl::InternalError(absl::StrCat("stage ", st, ": ", placed.message()));
    }
    p->stages_elements_ += s.elements;
    p->stages_.push_back(std::move(s));
  }
  if (o.gpt.tied_head && o.schedule.ranks > 1) {
    // wte on stage 0 (pipeline rank 0), its copy on the last stage (rank pp - 1).
    const int last_rank = (p->schedule_.stages() - 1) % o.schedule.ranks;
    RM_ASSIGN_OR_RETURN(const int wte_index, o.whole_table->Find("wte"));
    const state::TensorSpec& wte = o.whole_table->tensor(wte_index);
    for (const TensorPlace& t : p->places_) {
      if (t.whole.begin != wte.offset || t.whole.size() != wte.numel) continue;
      p->tied_run_ = {t.local, t.local + t.whole.size()};
      p->tied_peer_ = t.tied_copy ? 0 : last_rank;
    }
    if (p->tied_peer_ == rank) {
      return absl::InternalError(
          absl::StrCat("pipeline rank ", rank, " holds both wte and its tied copy"));
    }
  }
  DataParallelOptions dp = o.dp;
  dp.elements = p->stages_elements_;
  RM_ASSIGN_OR_RETURN(
      p->dp_,
      CreateDataParallel(o.dp_gradients != nullptr ? o.dp_gradients : o.dp_comm, o.dp_comm, dp));
  // The update's partial sums (clipping's norm, LAMB's trust ratios, the overflow vote): each
  // tensor is on one stage and each tensor-parallel shard on one rank of its group (a
  // replicated tensor is counted on the group's rank 0: duplicate_ranges()), so the
  // pipeline and tensor-parallel groups add up; under ZeRO-1 each data-parallel replica also
  // holds only its shard, so the whole job does.
  std::vector<comm::Communicator*> sums = {o.world_comm};
  if (o.dp.zero_stage == 0) sums = {o.pp_comm, o.tp_comm};
  const absl::Duration timeout = o.dp.op_timeout;
  p->sum_ = [sums, timeout](absl::Span<double> values) {
    for (comm::Communicator* group : sums) {
      if (group == nullptr || group->size() == 1) continue;
      RM_RETURN_IF_ERROR(group->AllReduce(values.data(), values.data(), values.size(),
                                          DataType::kFloat64, comm::ReduceOp::kSum,
                                          absl::Now() + timeout));
    }
    return absl::OkStatus();
  };
  return p;
}

std::string PipelineParallel::Describe() const {
  const pipeline::ScheduleOptions& s = options_.schedule;
  // A mesh without pipeline stages (pp 1: tensor parallelism alone, or with data
  // parallelism): one stage runs every micro-batch, and nothing of a pipeline is said.
  if (s.ranks == 1 && schedule_.stages() == 1) {
    return absl::StrCat("pp 1: every block on each rank, ", s.micro_batches,
                        " micro-batch(es) a step; data parallel over ", options_.dp_comm->size(),
                        ": ", dp_->Describe());
  }
  std::vector<std::string> mine;
  for (const Stage& st : stages_) mine.push_back(absl::StrCat(st.index));
  return absl::StrCat("pipeline ", pipeline::ScheduleName(s.kind), " over ", s.ranks,
                      " stages-ranks x ", s.virtual_stages, " (", schedule_.stages(),
                      " stages; this rank's: ", absl::StrJoin(mine, ","), "), ", s.micro_batches,
                      " micro-batches; data parallel over ", options_.dp_comm->size(), ": ",
                      dp_->Describe());
}

std::vector<state::PlacedRange> PipelineParallel::update_pieces() const {
  const state::FlatRange window = dp_->update_window();
  return Map(window, window.begin, /*replicas=*/true);
}

std::vector<state::PlacedRange> PipelineParallel::saved_pieces() const {
  // The data-parallel strategy's own saved part of the step's buffers (its shard: the
  // replicas split the save N ways), in the whole model's coordinates.
  std::vector<state::PlacedRange> out;
  for (const state::PlacedRange& p : dp_->saved_pieces()) {
    for (const state::PlacedRange& q : Map({p.at, p.at + p.range.size()}, 0, false)) {
      out.push_back(q);
    }
  }
  return out;
}

absl::Status PipelineParallel::WholeParameters(absl::Span<float> params, absl::Span<float> whole) {
  // The stages' buffer, read on the host (a GPU's copied there first).
  std::vector<float> host;
  const float* local = params.data();
  if (options_.ops->device_memory()) {
    host.resize(params.size());
    RM_RETURN_IF_ERROR(options_.ops->CopyToHost(params, host.data()));
    local = host.data();
  }
  ScatterToWhole(places_, local, tp_rank(), whole);
  for (comm::Communicator* group : {options_.pp_comm, options_.tp_comm}) {
    if (group == nullptr || group->size() == 1) continue;
    RM_RETURN_IF_ERROR(group->AllReduce(whole.data(), whole.data(), whole.size(),
                                        DataType::kFloat32, comm::ReduceOp::kSum,
                                        absl::Now() + options_.dp.op_timeout));
  }
  return absl::OkStatus();
}

std::vector<state::FlatRange> PipelineParallel::duplicate_ranges() const {
  return ReplicatedRanges(places_, dp_->update_window(), tp_rank());
}

absl::StatusOr<StepStats> PipelineParallel::RunStep(absl::Span<const Batch> micro_batches,
                                                    absl::Span<const float> params,
                                                    absl::Span<float> grads,
                                                    const ForwardBackwardOptions& options,
                                                    const std::vector<bool>& discarded) {
  if (static_cast<int>(micro_batches.size()) != options_.schedule.micro_batches) {
    return absl::InvalidArgumentError(
        absl::StrCat("PipelineParallel::RunStep: ", micro_batches.size(),
                     " micro-batches for a schedule of ", options_.schedule.micro_batches));
  }
  pipeline::PipelineExecutorOptions eo;
  eo.schedule = &schedule_;
  eo.rank = pp_rank();
  eo.comm = messages();
  eo.op_timeout = options_.dp.op_timeout;
  eo.ops = options_.ops;
  eo.pool = &pool_;
  for (Stage& s : stages_) {
    RM_RETURN_IF_ERROR(s.stage->BeginStep(micro_batches, params.subspan(s.base, s.elements),
                                          grads.subspan(s.base, s.elements), options, discarded));
    eo.stages[s.index] = s.stage.get();
  }
  // The padding after the stages is reduced with the rest: zero.
  RM_RETURN_IF_ERROR(options_.ops->Zero(grads.subspan(stages_elements_)));
  RM_ASSIGN_OR_RETURN(last_run_, pipeline::RunPipeline(eo));
  for (Stage& s : stages_) RM_RETURN_IF_ERROR(s.stage->EndStep());
  RM_RETURN_IF_ERROR(SumTiedGradients(grads));
  compute_sum_ += last_run_.compute;
  total_sum_ += last_run_.total;
  StepStats stats;
  for (const Stage& s : stages_) {
    stats.loss_sum += s.stage->stats().loss_sum;
    stats.loss_terms += s.stage->stats().loss_terms;
    stats.correct += s.stage->stats().correct;
  }
  dp_->GradientsReady(0);
  return stats;
}

absl::Status PipelineParallel::Message(comm::PointToPoint::Kind kind, int peer,
                                       absl::Span<float> data) {
  comm::PointToPoint op;
  op.kind = kind;
  op.peer = peer;
  op.type = DataType::kFloat32;
  if (kind == comm::PointToPoint::Kind::kSend) {
    op.send = data.data();
  } else {
    op.recv = data.data();
  }
  op.count = data.size();
  return messages()->SendRecv(absl::MakeSpan(&op, 1), absl::Now() + options_.dp.op_timeout);
}

absl::Status PipelineParallel::SumTiedGradients(absl::Span<float> grads) {
  if (tied_peer_ < 0) return absl::OkStatus();
  const int64_t n = tied_run_.size();
  if (tied_received_.size() != n) {
    RM_ASSIGN_OR_RETURN(tied_received_, options_.ops->Allocate(n));
  }
  absl::Span<float> mine = grads.subspan(tied_run_.begin, n);
  comm::PointToPoint ops[2];
  ops[0].kind = comm::PointToPoint::Kind::kSend;
  ops[0].send = mine.data();
  ops[1].kind = comm::PointToPoint::Kind::kRecv;
  ops[1].recv = tied_received_.data();
  for (comm::PointToPoint& op : ops) {
    op.peer = tied_peer_;
    op.type = DataType::kFloat32;
    op.count = n;
  }
  RM_RETURN_IF_ERROR(
      messages()->SendRecv(absl::MakeSpan(ops, 2), absl::Now() + options_.dp.op_timeout));
  return options_.ops->Add(tied_received_.span(), mine);
}

absl::StatusOr<StepStats> PipelineParallel::Evaluate(const Batch& batch,
                                                     absl::Span<const float> params,
                                                     Precision precision) {
  const int ranks = options_.schedule.ranks, me = pp_rank(), last = schedule_.stages() - 1;
  const int64_t elements = batch.size * options_.gpt.context * options_.gpt.width;
  // The boundary activations, in the stages' memory (a GPU's on a device).
  OpsBuffer in, out;
  StepStats stats;
  for (const Stage& s : stages_) {
    const int from = (s.index - 1) % ranks, to = (s.index + 1) % ranks;
    if (s.index > 0 && from != me) {
      RM_ASSIGN_OR_RETURN(in, options_.ops->Allocate(elements));
      RM_RETURN_IF_ERROR(Message(comm::PointToPoint::Kind::kRecv, from, in.span()));
    }
    RM_ASSIGN_OR_RETURN(out, options_.ops->Allocate(s.index < last ? elements : 0));
    RM_ASSIGN_OR_RETURN(StepStats st,
                        s.stage->Evaluate(batch, params.subspan(s.base, s.elements), precision,
                                          s.index > 0 ? absl::Span<const float>(in.span())
                                                      : absl::Span<const float>(),
                                          out.span()));
    stats.loss_sum += st.loss_sum;
    stats.loss_terms += st.loss_terms;
    stats.correct += st.correct;
    if (s.index < last && to != me) {
      RM_RETURN_IF_ERROR(Message(comm::PointToPoint::Kind::kSend, to, out.span()));
    } else {
      in = std::move(out);  // the next stage is this rank's too
    }
  }
  return stats;
}

double PipelineParallel::measured_bubble() const {
  if (total_sum_ <= absl::ZeroDuration()) return 0;
  return std::max(0.0, 1.0 - absl::FDivDuration(compute_sum_, total_sum_));
}

double PipelineParallel::formula_bubble() const {
  return pipeline::FormulaBubble(options_.schedule);
}

int PipelineParallel::peak_in_flight() const {
  int peak = 0;
  for (const Stage& s : stages_) peak = std::max(peak, s.stage->peak_in_flight());
  return peak;
}

int64_t PipelineParallel::parameter_copy_bytes() const {
  int64_t bytes = 0;
  for (const Stage& s : stages_) bytes += s.stage->parameter_copy_bytes();
  return bytes;
}

int64_t PipelineParallel::activation_bytes() const {
  int64_t bytes = 0;
  for (const Stage& s : stages_) bytes += s.stage->activation_bytes();
  return bytes;
}

}  // namespace ringmaster::train
