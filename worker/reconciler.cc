#include "worker/reconciler.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ringmaster::worker {
namespace {

absl::Status Occupied(int slot, const Reconciler::Trainer& trainer) {
  return absl::FailedPreconditionError(absl::StrCat("slot ", slot, " still runs a trainer of job ",
                                                    trainer.job, " (pid ", trainer.pid, ")"));
}

}  // namespace

std::vector<AgentAction> Reconciler::Want(const AgentCommand& command, absl::Time now) {
  if (command.has_start()) return Start(command.start(), now);
  if (command.has_stop()) return Stop(command.stop());
  if (command.has_forget()) {
    forget_.insert(command.forget().job());
    return Tick(now);
  }
  return {};
}

std::vector<AgentAction> Reconciler::Start(const StartTrainerCommand& start, absl::Time now) {
  if (draining_) return {};  // a draining node takes no work
  const int slot = start.slot().slot();
  if (slot < 0 || slot >= options_.slots) {
    return {RefuseStart{
        start, absl::InvalidArgumentError(absl::StrCat("slot ", slot, " is not on this node"))}};
  }
  auto it = trainers_.find(slot);
  if (it == trainers_.end()) {
    waiting_.erase(slot);
    return {StartTrainer{start}};
  }
  if (it->second.stopping) {
    // Told to stop a moment ago (the same heartbeat's stop, say) and being killed: started
    // once its exit is seen.
    waiting_[slot] = Waiting{start, now + options_.stop_wait};
    return {};
  }
  if (it->second.job == start.job() && it->second.epoch < start.epoch()) {
    // The coordinator starts this job here again for a later epoch: it has counted the
    // trainer still running as gone (a partition cut this node off and it came back). That
    // trainer is stale; it is stopped, and the new one starts once it has exited.
    it->second.stopping = true;
    waiting_[slot] = Waiting{start, now + options_.stop_wait};
    return {StopTrainer{
        slot, it->second.pid, it->second.job,
        absl::StrCat("superseded: the job started this slot again for epoch ", start.epoch(),
                     " (this trainer was started for epoch ", it->second.epoch, ")")}};
  }
  return {RefuseStart{start, Occupied(slot, it->second)}};
}

std::vector<AgentAction> Reconciler::Stop(const StopTrainerCommand& stop) {
  const int slot = stop.slot().slot();
  std::vector<AgentAction> actions;
  if (auto w = waiting_.find(slot); w != waiting_.end() && w->second.command.job() == stop.job()) {
    // It never started: what the coordinator hears is what a start killed at once says.
    actions.push_back(ReportExit{.slot = slot,
                                 .job = stop.job(),
                                 .exit_code = -9,
                                 .stopped = true,
                                 .detail = "stopped before it started"});
    waiting_.erase(w);
  }
  auto it = trainers_.find(slot);
  if (it != trainers_.end() && it->second.job == stop.job() && !it->second.stopping) {
    it->second.stopping = true;
    actions.push_back(StopTrainer{slot, it->second.pid, it->second.job, stop.reason()});
  }
  return actions;
}

void Reconciler::Started(const StartTrainerCommand& command, int64_t pid, std::string log_path) {
  trainers_[command.slot().slot()] =
      Trainer{pid, command.job(), command.epoch(), std::move(log_path)};
  forget_.erase(command.job());  // its name is in use again: its files are the new job's
}

std::vector<AgentAction> Reconciler::Exited(int64_t pid, int exit_code) {
  for (auto it = trainers_.begin(); it != trainers_.end(); ++it) {
    if (it->second.pid != pid) continue;
    ReportExit exit{.slot = it->first,
                    .job = it->second.job,
                    .exit_code = exit_code,
                    .stopped = it->second.stopping,
                    .start_epoch = it->second.epoch,
                    .log_path = it->second.log_path};
    trainers_.erase(it);
    return {std::move(exit)};
  }
  return {};
}

std::vector<AgentAction> Reconciler::Tick(absl::Time now) {
  std::vector<AgentAction> actions;
  if (draining_) waiting_.clear();  // a draining node takes no work
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    const int slot = it->first;
    auto running = trainers_.find(slot);
    if (running == trainers_.end()) {
      actions.push_back(StartTrainer{std::move(it->second.command)});
    } else if (now >= it->second.give_up) {
      actions.push_back(
          RefuseStart{std::move(it->second.command), Occupied(slot, running->second)});
    } else {
      ++it;
      continue;
    }
    it = waiting_.erase(it);
  }
  for (auto it = forget_.begin(); it != forget_.end();) {
    const std::string& job = *it;
    const bool running = std::any_of(trainers_.begin(), trainers_.end(),
                                     [&](const auto& t) { return t.second.job == job; });
    if (running) {
      ++it;
      continue;
    }
    actions.push_back(ForgetJob{job});
    it = forget_.erase(it);
  }
  return actions;
}

}  // namespace ringmaster::worker
