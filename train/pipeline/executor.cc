#include "train/pipeline/executor.h"

#include <algorithm>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace ringmaster::train::pipeline {
namespace {

// A message's buffer: the activation leaving `stage`, or the gradient of its input.
using BufferKey = std::tuple<Payload, int, int>;  // payload, stage, micro-batch

class Run {
 public:
  explicit Run(const PipelineExecutorOptions& o) : o_(o), s_(*o.schedule) {}

  absl::StatusOr<PipelineRunStats> Go() {
    RM_RETURN_IF_ERROR(CheckOptions());
    const absl::Time start = absl::Now();
    const std::vector<Action>& list = s_.ranks[o_.rank];
    for (size_t i = 0; i < list.size();) {
      if (list[i].is_compute()) {
        const absl::Time t = absl::Now();
        RM_RETURN_IF_ERROR(Compute(list[i]));
        stats_.compute += absl::Now() - t;
        ++i;
        continue;
      }
      size_t end = i;
      while (end < list.size() && !list[end].is_compute()) ++end;
      const absl::Time t = absl::Now();
      RM_RETURN_IF_ERROR(Batch(absl::MakeConstSpan(list).subspan(i, end - i)));
      stats_.messages += absl::Now() - t;
      ++stats_.batches;
      i = end;
    }
    stats_.total = absl::Now() - start;
    if (!buffers_.empty()) {
      const auto& [payload, stage, micro] = buffers_.begin()->first;
      return absl::InternalError(absl::StrCat("rank ", o_.rank, "'s list ended with the ",
                                              PayloadName(payload), " of stage ", stage,
                                              " micro-batch ", micro, " never used"));
    }
    return stats_;
  }

 private:
  absl::Status CheckOptions() const {
    if (o_.comm == nullptr)
      return absl::InvalidArgumentError("PipelineExecutorOptions.comm is null");
    if (o_.ops == nullptr) {
      return absl::InvalidArgumentError(
          "PipelineExecutorOptions.ops is null (HostVectorOps() for host memory)");
    }
    if (o_.comm->size() != s_.options.ranks || o_.comm->rank() != o_.rank) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the pipeline group's communicator is rank ", o_.comm->rank(), " of ", o_.comm->size(),
          ", but the schedule runs rank ", o_.rank, " of ", s_.options.ranks));
    }
    for (int st = o_.rank; st < s_.stages(); st += s_.options.ranks) {
      auto it = o_.stages.find(st);
      if (it == o_.stages.end() || it->second == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("rank ", o_.rank, " holds model stage ", st,
                                                       " but was given no stage for it"));
      }
    }
    return absl::OkStatus();
  }

  PipelineStage& StageAt(int stage) const { return *o_.stages.at(stage); }

  // A buffer of `elements` floats in the ops' memory (empty for 0), zeroed unless a receive
  // will overwrite it (`zero` false): one the pool kept, else a new one.
  absl::StatusOr<absl::Span<float>> Make(const BufferKey& key, int64_t elements, bool zero) {
    OpsBuffer b;
    if (o_.pool != nullptr) {
      bool reused = false;
      RM_ASSIGN_OR_RETURN(b, o_.pool->Take(*o_.ops, elements, &reused));
      // On the ops' stream, before the stage's work that writes it (a receive writes it
      // whole, on the communicator's stream, which would not wait for a memset).
      if (reused && zero) RM_RETURN_IF_ERROR(o_.ops->Zero(b.span()));
    } else {
      RM_ASSIGN_OR_RETURN(b, o_.ops->Allocate(elements));
    }
    OpsBuffer& held = buffers_[key] = std::move(b);
    held_ += elements * static_cast<int64_t>(sizeof(float));
    stats_.peak_buffer_bytes = std::max(stats_.peak_buffer_bytes, held_);
    return held.span();
  }
  absl::StatusOr<OpsBuffer*> Find(const BufferKey& key) {
    auto it = buffers_.find(key);
    if (it == buffers_.end()) {
      const auto& [payload, stage, micro] = key;
      return absl::InternalError(absl::StrCat("rank ", o_.rank, ": the ", PayloadName(payload),
                                              " of stage ", stage, " micro-batch ", micro,
                                              " is not here (a schedule that did not pass "
                                              "CheckSchedule?)"));
    }
    return &it->second;
  }
  void Free(const BufferKey& key) {
    auto it = buffers_.find(key);
    if (it == buffers_.end()) return;
    held_ -= it->second.size() * static_cast<int64_t>(sizeof(float));
    if (o_.pool != nullptr) o_.pool->Give(std::move(it->second));
    buffers_.erase(it);
  }

  absl::Status Compute(const Action& a) {
    const int st = a.stage, mb = a.micro_batch, last = s_.stages() - 1;
    PipelineStage& stage = StageAt(st);
    if (a.kind == ActionKind::kBackwardWeight) return stage.BackwardWeight(mb);
    if (a.kind == ActionKind::kForward) {
      absl::Span<const float> input;
      const BufferKey in{Payload::kActivation, st - 1, mb};
      if (st > 0) {
        RM_ASSIGN_OR_RETURN(OpsBuffer * b, Find(in));
        input = b->span();
      }
      absl::Span<float> output;
      if (st < last) {
        RM_ASSIGN_OR_RETURN(output,
                            Make({Payload::kActivation, st, mb}, stage.output_elements(mb), true));
      }
      RM_RETURN_IF_ERROR(stage.Forward(mb, input, output));
      Free(in);
      return absl::OkStatus();
    }
    absl::Span<const float> output_grad;
    const BufferKey out{Payload::kGradient, st + 1, mb};
    if (st < last) {
      RM_ASSIGN_OR_RETURN(OpsBuffer * b, Find(out));
      output_grad = b->span();
    }
    absl::Span<float> input_grad;
    if (st > 0) {
      RM_ASSIGN_OR_RETURN(input_grad,
                          Make({Payload::kGradient, st, mb}, stage.input_elements(mb), true));
    }
    RM_RETURN_IF_ERROR(a.kind == ActionKind::kBackward
                           ? stage.Backward(mb, output_grad, input_grad)
                           : stage.BackwardInput(mb, output_grad, input_grad));
    Free(out);
    return absl::OkStatus();
  }

  absl::Status Batch(absl::Span<const Action> actions) {
    std::vector<comm::PointToPoint> ops;
    std::vector<BufferKey> sent;
    for (const Action& a : actions) {
      const BufferKey key{a.payload, a.stage, a.micro_batch};
      comm::PointToPoint op;
      op.peer = a.peer;
      op.type = DataType::kFloat32;
      if (a.kind == ActionKind::kSend) {
        RM_ASSIGN_OR_RETURN(OpsBuffer * b, Find(key));
        op.kind = comm::PointToPoint::Kind::kSend;
        op.send = b->data();
        op.count = static_cast<size_t>(b->size());
        sent.push_back(key);
      } else {
        // Sized by the stage here that takes it: the next stage's input, or the previous
        // stage's output.
        const bool activation = a.payload == Payload::kActivation;
        const int64_t elements = activation ? StageAt(a.stage + 1).input_elements(a.micro_batch)
                                            : StageAt(a.stage - 1).output_elements(a.micro_batch);
        op.kind = comm::PointToPoint::Kind::kRecv;
        RM_ASSIGN_OR_RETURN(absl::Span<float> recv, Make(key, elements, /*zero=*/false));
        op.recv = recv.data();
        op.count = recv.size();
      }
      ops.push_back(op);
    }
    RM_RETURN_IF_ERROR(o_.comm->SendRecv(ops, absl::Now() + o_.op_timeout));
    for (const BufferKey& key : sent) Free(key);
    return absl::OkStatus();
  }

  const PipelineExecutorOptions& o_;
  const Schedule& s_;
  std::map<BufferKey, OpsBuffer> buffers_;
  int64_t held_ = 0;
  PipelineRunStats stats_;
};

}  // namespace

absl::StatusOr<OpsBuffer> MessagePool::Take(VectorOps& ops, int64_t elements, bool* reused) {
  *reused = false;
  if (elements == 0) return OpsBuffer();
  auto it = free_.find(elements);
  if (it == free_.end()) return ops.Allocate(elements);
  OpsBuffer b = std::move(it->second);
  free_.erase(it);
  bytes_ -= elements * static_cast<int64_t>(sizeof(float));
  *reused = true;
  return b;
}

void MessagePool::Give(OpsBuffer buffer) {
  if (buffer.size() == 0) return;
  bytes_ += buffer.size() * static_cast<int64_t>(sizeof(float));
  free_.emplace(buffer.size(), std::move(buffer));
}

absl::StatusOr<PipelineRunStats> RunPipeline(const PipelineExecutorOptions& options) {
  if (options.schedule == nullptr) {
    return absl::InvalidArgumentError("PipelineExecutorOptions.schedule is null");
  }
  if (options.rank < 0 || options.rank >= options.schedule->options.ranks) {
    return absl::InvalidArgumentError(absl::StrCat("PipelineExecutorOptions.rank ", options.rank,
                                                   " is not a rank of the schedule's ",
                                                   options.schedule->options.ranks));
  }
  Run run(options);
  return run.Go();
}

}  // namespace ringmaster::train::pipeline
