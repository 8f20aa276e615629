#include "coordinator/membership.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/out_of_memory.h"
#include "common/plural.h"
#include "common/status_macros.h"

namespace ringmaster::coordinator {
namespace {

constexpr size_t kMaxIdLength = 128;
constexpr int kMaxRanks = 100000;

absl::Status ValidateId(const std::string& id, absl::string_view field) {
  if (id.empty() || id.size() > kMaxIdLength) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must be 1 to ", kMaxIdLength, " characters, got ", id.size()));
  }
  for (char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_' || c == '.';
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, " \"", id, "\" may hold only letters, digits, '-', '_' and '.'"));
    }
  }
  return absl::OkStatus();
}

std::string MembersString(const std::vector<Member>& members) {
  return absl::StrJoin(members, " ", [](std::string* out, const Member& m) {
    absl::StrAppend(out, ToString(m.slot));
    if (m.rank >= 0) absl::StrAppend(out, "#", m.rank);
  });
}

std::string SlotsString(const std::vector<SlotRef>& slots) {
  return absl::StrJoin(slots, " ",
                       [](std::string* out, const SlotRef& s) { absl::StrAppend(out, ToString(s)); });
}

struct ActionPrinter {
  std::string operator()(const PersistJob& a) const {
    return absl::StrCat("persist ", a.job.request.id, " ", JobPhaseName(a.job.phase),
                        " epoch=", a.job.epoch, " members=[", MembersString(a.job.members),
                        "] restarts=", a.job.restarts);
  }
  std::string operator()(const StartTrainer& a) const {
    return absl::StrCat("start ", ToString(a.slot), " ", a.job, " epoch=", a.epoch);
  }
  std::string operator()(const StopTrainer& a) const {
    return absl::StrCat("stop ", ToString(a.slot), " ", a.job, " (", a.reason, ")");
  }
  std::string operator()(const AnnounceEpoch& a) const {
    return absl::StrCat("announce ", a.job, " epoch=", a.epoch, " cause=", EpochCauseName(a.cause),
                        a.leaving.empty() ? "" : absl::StrCat(" leaving=[", SlotsString(a.leaving), "]"),
                        " (", a.reason, ")");
  }
  std::string operator()(const CommitEpoch& a) const {
    return absl::StrCat("commit ", a.job, " epoch=", a.epoch, " ranks=[", MembersString(a.members),
                        "]");
  }
  std::string operator()(const JobEnded& a) const {
    return absl::StrCat("ended ", a.job, " ", JobPhaseName(a.phase), " (", a.reason, ")");
  }
  std::string operator()(const NodeGone& a) const {
    return absl::StrCat("gone ", a.node, " (", a.reason, ")");
  }
};

}  // namespace

std::string ToString(const SlotRef& s) { return absl::StrCat(s.node, "/", s.slot); }

std::string Describe(const RankFailure& f) {
  std::string out = absl::StrCat("rank ", f.rank, " (node ", f.slot.node, ", slot ", f.slot.slot,
                                 ") failed first in membership epoch ", f.epoch, ": ", f.program,
                                 f.program.empty() ? "" : ": ", f.how);
  if (!f.error_message.empty()) absl::StrAppend(&out, "; its error file says: ", f.error_message);
  if (!f.last_output_line.empty() && f.last_output_line != f.error_message) {
    absl::StrAppend(&out, "; its last output line: ", f.last_output_line);
  }
  return out;
}

const char* JobPhaseName(JobPhase phase) {
  switch (phase) {
    case JobPhase::kPending:
      return "pending";
    case JobPhase::kForming:
      return "forming";
    case JobPhase::kCommitted:
      return "committed";
    case JobPhase::kRunning:
      return "running";
    case JobPhase::kSucceeded:
      return "succeeded";
    case JobPhase::kFailed:
      return "failed";
    case JobPhase::kCancelled:
      return "cancelled";
  }
  return "unknown";
}

bool IsTerminal(JobPhase phase) {
  return phase == JobPhase::kSucceeded || phase == JobPhase::kFailed ||
         phase == JobPhase::kCancelled;
}

const char* EpochCauseName(EpochCause cause) {
  switch (cause) {
    case EpochCause::kStart:
      return "start";
    case EpochCause::kFailure:
      return "failure";
    case EpochCause::kDrain:
      return "drain";
    case EpochCause::kGrow:
      return "grow";
    case EpochCause::kRestore:
      return "restore";
    case EpochCause::kResubmit:
      return "resubmit";
  }
  return "unknown";
}

std::string ToString(const Action& action) { return std::visit(ActionPrinter{}, action); }

Membership::Membership(const MembershipOptions& options) : options_(options) {}

Membership::NodeState* Membership::FindNode(const std::string& node) {
  auto it = nodes_.find(node);
  return it == nodes_.end() ? nullptr : &it->second;
}

JobState* Membership::FindJob(const std::string& job) {
  auto it = jobs_.find(job);
  return it == jobs_.end() ? nullptr : &it->second;
}

const JobState* Membership::job(const std::string& id) const {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second;
}

std::vector<std::string> Membership::job_ids() const { return order_; }

Member* Membership::FindMember(JobState& job, const SlotRef& slot) {
  for (Member& m : job.members) {
    if (m.slot == slot) return &m;
  }
  return nullptr;
}

absl::StatusOr<JobState*> Membership::LiveJob(const std::string& id, int64_t epoch) {
  RM_RETURN_IF_ERROR(CheckLiveEpoch(id, epoch));
  return FindJob(id);
}

absl::Status Membership::CheckLiveEpoch(const std::string& id, int64_t epoch) const {
  const JobState* job = this->job(id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job \"", id, "\""));
  if (IsTerminal(job->phase)) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", id, " is ", JobPhaseName(job->phase), ": stop"));
  }
  if (epoch < job->epoch) {
    return absl::AbortedError(absl::StrCat("epoch ", epoch, " of job ", id,
                                           " is stale: the job is at epoch ", job->epoch,
                                           "; abort and join it"));
  }
  if (epoch > job->epoch) {
    return absl::InvalidArgumentError(absl::StrCat(
        "epoch ", epoch, " of job ", id, " does not exist yet (current ", job->epoch, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::pair<JobState*, Member*>> Membership::LiveMember(const std::string& id,
                                                                    int64_t epoch,
                                                                    const SlotRef& slot) {
  auto job = LiveJob(id, epoch);
  if (!job.ok()) return job.status();
  Member* m = FindMember(**job, slot);
  if (m == nullptr) {
    return absl::NotFoundError(absl::StrCat(ToString(slot), " is not a member of job ", id,
                                            " epoch ", epoch));
  }
  return std::make_pair(*job, m);
}

std::vector<SlotRef> Membership::FreeSlots(absl::Time now) const {
  std::vector<SlotRef> free;
  for (const auto& [id, node] : nodes_) {
    if (node.draining || node.lease_expiry <= now) continue;
    for (int s = 0; s < node.slots; ++s) {
      if (node.assigned.count(s) || node.exiting.count(s)) continue;
      auto b = node.backoff_until.find(s);
      if (b != node.backoff_until.end() && b->second > now) continue;
      free.push_back(SlotRef{id, s});
    }
  }
  return free;  // map order and ascending slots: (node, slot) order
}

std::vector<SlotRef> Membership::FreeSlotsFor(const JobState& job, absl::Time now) const {
  std::vector<SlotRef> free = FreeSlots(now);
  std::erase_if(free, [&](const SlotRef& s) { return job.excluded_nodes.count(s.node) > 0; });
  const int64_t need = job.request.memory_per_rank;
  if (need <= 0) return free;
  // Memory a node's ranks hold: those assigned and those still exiting.
  std::map<std::string, int64_t> taken;
  for (const auto& [id, node] : nodes_) {
    if (node.memory <= 0) continue;
    int64_t& t = taken[id];
    for (const auto& [slot, other] : node.assigned) t += MemoryPerRank(other);
    for (const auto& [slot, e] : node.exiting) t += MemoryPerRank(e.job);
  }
  std::erase_if(free, [&](const SlotRef& s) {
    const NodeState& node = nodes_.at(s.node);
    if (node.memory <= 0) return false;  // not reported: not checked
    if (taken[s.node] + need > node.memory) return true;
    taken[s.node] += need;
    return false;
  });
  return free;
}

int64_t Membership::MemoryPerRank(const std::string& job) const {
  auto it = jobs_.find(job);
  return it == jobs_.end() ? 0 : it->second.request.memory_per_rank;
}

int64_t Membership::LargestNodeMemory(absl::Time now) const {
  int64_t largest = 0;
  for (const auto& [id, node] : nodes_) {
    if (node.lease_expiry > now || node.restored) largest = std::max(largest, node.memory);
  }
  return largest;
}

int Membership::free_slots(absl::Time now) const {
  return static_cast<int>(FreeSlots(now).size());
}

void Membership::Release(const JobState& job, const SlotRef& slot, bool backoff,
                         bool trainer_gone, absl::Time now) {
  NodeState* node = FindNode(slot.node);
  if (node == nullptr) return;
  auto it = node->assigned.find(slot.slot);
  if (it == node->assigned.end() || it->second != job.request.id) return;
  node->assigned.erase(it);
  if (!trainer_gone) node->exiting[slot.slot] = NodeState::Exiting{job.request.id, now};
  if (backoff) node->backoff_until[slot.slot] = now + options_.slot_backoff;
}

int Membership::WorldFor(const JobState& job, int64_t available) {
  const int k = std::max(1, job.request.rank_multiple);
  const int64_t world = std::min<int64_t>(available, job.request.max_ranks) / k * k;
  return world >= std::max(job.request.min_ranks, k) ? static_cast<int>(world) : 0;
}

void Membership::TrainerGone(NodeState& node, int slot, const std::string& job) {
  auto it = node.exiting.find(slot);
  if (it != node.exiting.end() && it->second.job == job) node.exiting.erase(it);
}

// ---------------------------------------------------------------------------------------
// Forming epochs.

void Membership::Reform(JobState& job, EpochCause cause, const std::vector<SlotRef>& leaving,
                        const std::string& reason, absl::Time now,
                        std::vector<Action>* actions, absl::Time failed_at) {
  const bool was_live = job.phase == JobPhase::kCommitted || job.phase == JobPhase::kRunning;
  if (was_live || job.epoch == 0) {
    ++job.epoch;
    for (Member& m : job.members) {
      m.rank = -1;
      m.fresh = false;
      m.joined = m.ready = m.finished = false;
    }
  }
  std::erase_if(job.members, [&](const Member& m) {
    return std::find(leaving.begin(), leaving.end(), m.slot) != leaving.end();
  });
  job.cause = cause;

  const std::vector<SlotRef> free = FreeSlotsFor(job, now);
  const int have = static_cast<int>(job.members.size());
  const int world = WorldFor(job, have + static_cast<int64_t>(free.size()));
  const int k = std::max(1, job.request.rank_multiple);
  if (world == 0) {
    if (job.phase != JobPhase::kPending) job.below_min_since = now;
    job.phase = JobPhase::kPending;
    job.phase_since = now;
    job.reason = absl::StrCat(
        job.ever_started ? "below" : "waiting for", " min_ranks: ", have + free.size(), " of ",
        job.request.min_ranks, " slots available",
        k > 1 ? absl::StrCat(" (worlds of a multiple of ", k, " ranks: parallelism.mesh tp x pp)")
              : "",
        job.request.memory_per_rank > 0
            ? absl::StrCat(" with ", job.request.memory_per_rank >> 20, " MiB of memory each")
            : "",
        reason.empty() ? "" : "; ", reason);
    actions->push_back(PersistJob{job});
    if (was_live) {
      actions->push_back(
          AnnounceEpoch{job.request.id, job.epoch, cause, leaving, job.reason, failed_at});
    }
    return;
  }

  // Survivors beyond the world (the slots left are not a whole multiple of rank_multiple):
  // the last ones leave it; their trainers are stopped.
  std::vector<SlotRef> surplus;
  while (static_cast<int>(job.members.size()) > world) {
    surplus.push_back(job.members.back().slot);
    job.members.pop_back();
  }
  for (const SlotRef& s : surplus) Release(job, s, /*backoff=*/false, /*trainer_gone=*/false, now);
  std::vector<SlotRef> added;
  for (const SlotRef& s : free) {
    if (static_cast<int>(job.members.size()) >= world) break;
    nodes_[s.node].assigned[s.slot] = job.request.id;
    Member m;
    m.slot = s;
    m.fresh = true;
    m.last_progress = now;
    job.members.push_back(m);
    added.push_back(s);
  }
  std::sort(job.members.begin(), job.members.end(),
            [](const Member& a, const Member& b) { return a.slot < b.slot; });
  job.phase = JobPhase::kForming;
  job.phase_since = now;
  job.reason = reason;
  actions->push_back(PersistJob{job});
  if (was_live) {
    actions->push_back(
        AnnounceEpoch{job.request.id, job.epoch, cause, leaving, reason, failed_at});
  }
  for (const SlotRef& s : added) {
    nodes_[s.node].started[s.slot] = job.epoch;
    actions->push_back(StartTrainer{s, job.request.id, job.epoch});
  }
  for (const SlotRef& s : surplus) {
    actions->push_back(
        StopTrainer{s, job.request.id,
                    absl::StrCat("the world is ", world, " ranks, a multiple of ", k,
                                 " (parallelism.mesh tp x pp); this slot is not in it")});
  }
  MaybeCommit(job, now, actions);
}

void Membership::MaybeCommit(JobState& job, absl::Time now, std::vector<Action>* actions) {
  if (job.phase != JobPhase::kForming || job.members.empty()) return;
  for (const Member& m : job.members) {
    if (!m.joined) return;
  }
  for (size_t i = 0; i < job.members.size(); ++i) job.members[i].rank = static_cast<int>(i);
  job.phase = JobPhase::kCommitted;
  job.phase_since = now;
  job.ever_started = true;
  actions->push_back(PersistJob{job});
  actions->push_back(CommitEpoch{job.request.id, job.epoch, job.members});
}

void Membership::LoseMembers(JobState& job, const std::set<SlotRef>& lost, const Loss& loss,
                             absl::Time now, std::vector<Action>* actions) {
  bool lost_fresh = false;
  for (const Member& m : job.members) lost_fresh |= m.fresh && lost.count(m.slot) > 0;
  std::erase_if(job.members, [&](const Member& m) { return lost.count(m.slot) > 0; });
  std::vector<Action> stops;
  for (const SlotRef& s : lost) {
    NodeState* node = FindNode(s.node);
    if (loss.stop && node != nullptr && node->lease_expiry > now) {
      stops.push_back(StopTrainer{s, job.request.id, loss.reason});
    }
    if (!loss.keep_slots) Release(job, s, loss.backoff, loss.trainer_gone, now);
  }
  switch (job.phase) {
    case JobPhase::kCommitted:
    case JobPhase::kRunning:
      if (loss.cause == EpochCause::kFailure && ++job.restarts > job.request.restart_budget) {
        End(job, JobPhase::kFailed,
            absl::StrCat("restart budget of ", job.request.restart_budget,
                         " exhausted; last failure: ", loss.reason),
            now, actions);
      } else {
        Reform(job, loss.cause, {}, loss.reason, now, actions, loss.failed_at);
      }
      break;
    case JobPhase::kForming:
      if (loss.cause == EpochCause::kFailure && lost_fresh &&
          ++job.restarts > job.request.restart_budget) {
        End(job, JobPhase::kFailed,
            absl::StrCat("restart budget of ", job.request.restart_budget,
                         " exhausted; last failure: ", loss.reason),
            now, actions);
      } else if (static_cast<int>(job.members.size()) < job.request.min_ranks ||
                 job.members.size() % std::max(1, job.request.rank_multiple) != 0) {
        // The epoch being formed takes fewer members; its reason keeps what it says (the
        // survivors' report with this culprit named first, once BlameCulprit merged them).
        const bool merged = absl::StrContains(job.reason, loss.reason);
        Reform(job, loss.cause, {}, merged ? job.reason : loss.reason, now, actions);
      } else {
        actions->push_back(PersistJob{job});
        MaybeCommit(job, now, actions);
      }
      break;
    case JobPhase::kPending:
      actions->push_back(PersistJob{job});
      break;
    default:
      break;
  }
  actions->insert(actions->end(), stops.begin(), stops.end());
}

void Membership::End(JobState& job, JobPhase phase, const std::string& reason, absl::Time now,
                     std::vector<Action>* actions) {
  job.phase = phase;
  job.phase_since = now;
  job.reason = reason;
  actions->push_back(PersistJob{job});
  for (auto& [node_id, node] : nodes_) {
    for (auto it = node.assigned.begin(); it != node.assigned.end();) {
      if (it->second != job.request.id) {
        ++it;
        continue;
      }
      if (phase != JobPhase::kSucceeded && node.lease_expiry > now) {
        actions->push_back(StopTrainer{SlotRef{node_id, it->first}, job.request.id, reason});
      }
      // Stopped, or finishing by itself: the slot is free once the trainer has exited.
      node.exiting[it->first] = NodeState::Exiting{job.request.id, now};
      it = node.assigned.erase(it);
    }
  }
  actions->push_back(JobEnded{job.request.id, phase, reason});
}

void Membership::Schedule(absl::Time now, std::vector<Action>* actions) {
  for (const std::string& id : order_) {
    JobState& job = jobs_[id];
    if (job.phase != JobPhase::kPending) continue;
    const int64_t available =
        static_cast<int64_t>(job.members.size() + FreeSlotsFor(job, now).size());
    if (WorldFor(job, available) > 0) {
      const EpochCause first = job.resubmitted ? EpochCause::kResubmit : EpochCause::kStart;
      Reform(job, job.ever_started ? EpochCause::kFailure : first, {}, "", now, actions);
    }
  }
  for (const std::string& id : order_) {
    JobState& job = jobs_[id];
    const size_t free = FreeSlotsFor(job, now).size();
    // Growth only when the free slots make a larger world (a whole multiple more).
    if (job.phase != JobPhase::kRunning || job.finishing_epoch == job.epoch ||
        !job.request.cannot_grow.empty() ||
        now - job.phase_since < options_.grow_after ||
        WorldFor(job, static_cast<int64_t>(job.members.size() + free)) <=
            static_cast<int>(job.members.size())) {
      continue;
    }
    Reform(job, EpochCause::kGrow, {},
           absl::StrCat(free, " free slots; growing from ", job.members.size()), now, actions);
  }
}

// ---------------------------------------------------------------------------------------
// Events.

absl::Status Membership::RegisterNode(const std::string& node_id, int slots, absl::Time now,
                                      std::vector<Action>* actions, int64_t memory) {
  if (absl::Status s = ValidateId(node_id, "node"); !s.ok()) return s;
  if (slots < 1 || slots > kMaxSlotsPerNode) {
    return absl::InvalidArgumentError(absl::StrCat("slots must be between 1 and ",
                                                   kMaxSlotsPerNode, ", got ", slots));
  }
  if (memory < 0) {
    return absl::InvalidArgumentError(absl::StrCat("memory must be >= 0 bytes, got ", memory));
  }
  NodeState& node = nodes_[node_id];
  node.slots = slots;
  node.memory = memory;
  node.lease_expiry = now + options_.lease;
  node.draining = false;
  node.restored = false;
  // Assignments beyond the new slot count are lost with their trainers.
  std::map<std::string, std::set<SlotRef>> gone;
  for (const auto& [slot, job] : node.assigned) {
    if (slot >= slots) gone[job].insert(SlotRef{node_id, slot});
  }
  for (const auto& [job_id, lost] : gone) {
    JobState& job = jobs_[job_id];
    for (const SlotRef& s : lost) Release(job, s, false, /*trainer_gone=*/true, now);
    LoseMembers(job, lost,
                Loss{.reason = absl::StrCat("node ", node_id, " registered again with only ",
                                            Plural(slots, "slot"))},
                now, actions);
  }
  Schedule(now, actions);
  return absl::OkStatus();
}

absl::Status Membership::Heartbeat(const std::string& node_id,
                                   const std::vector<std::pair<int, std::string>>& running,
                                   absl::Time now, std::vector<Action>* actions) {
  NodeState* node = FindNode(node_id);
  if (node == nullptr || node->lease_expiry <= now || node->restored) {
    return absl::NotFoundError(absl::StrCat("node ", node_id,
                                            " is not registered (its lease expired, or the "
                                            "coordinator restarted): register again"));
  }
  node->lease_expiry = now + options_.lease;
  const std::set<std::pair<int, std::string>> runs(running.begin(), running.end());
  const size_t exiting = node->exiting.size();
  std::erase_if(node->exiting,
                [&](const auto& e) { return runs.count({e.first, e.second.job}) == 0; });
  for (const auto& [slot, job] : runs) {
    if (slot < 0 || slot >= node->slots) continue;
    const SlotRef ref{node_id, slot};
    auto assigned = node->assigned.find(slot);
    if (assigned != node->assigned.end() && assigned->second == job) continue;
    auto e = node->exiting.find(slot);
    if (e == node->exiting.end()) {
      node->exiting[slot] = NodeState::Exiting{job, now};
      actions->push_back(StopTrainer{
          ref, job,
          absl::StrCat("slot ", slot, " is not job ", job,
                       "'s any more (the job went on without this node while it was cut off, "
                       "or ended)")});
    } else if (e->second.job == job && now - e->second.since >= options_.lease) {
      actions->push_back(StopTrainer{
          ref, job,
          absl::StrCat("still running ", absl::FormatDuration(now - e->second.since),
                       " after the job let its slot go")});
      e->second.since = now;
    }
  }
  if (node->exiting.size() < exiting) Schedule(now, actions);
  return absl::OkStatus();
}

bool Membership::HoldsNode(const std::string& node_id, absl::Time now) const {
  auto it = nodes_.find(node_id);
  return it != nodes_.end() && (it->second.restored || it->second.lease_expiry > now);
}

std::string Membership::AssignedJob(const std::string& node_id, int slot) const {
  auto node = nodes_.find(node_id);
  if (node == nodes_.end()) return "";
  auto it = node->second.assigned.find(slot);
  return it == node->second.assigned.end() ? "" : it->second;
}

absl::Status Membership::DrainNode(const std::string& node_id, absl::Time now,
                                   std::vector<Action>* actions) {
  NodeState* node = FindNode(node_id);
  if (node == nullptr) return absl::NotFoundError(absl::StrCat("no node ", node_id));
  node->draining = true;
  const std::string reason = absl::StrCat("node ", node_id, " is draining");
  for (const std::string& id : order_) {
    JobState& job = jobs_[id];
    std::vector<SlotRef> leaving;
    for (const Member& m : job.members) {
      if (m.slot.node == node_id) leaving.push_back(m.slot);
    }
    if (leaving.empty() || IsTerminal(job.phase)) continue;
    // A rank finished the last step (the ranks step together, so all did): the trainers
    // are completing on their own; a new epoch would only make their Finished stale.
    if (job.finishing_epoch == job.epoch) continue;
    if (job.phase == JobPhase::kCommitted || job.phase == JobPhase::kRunning) {
      // The leavers keep their slots until their trainers exit after the drain save.
      Reform(job, EpochCause::kDrain, leaving, reason, now, actions);
    } else {
      LoseMembers(job, std::set<SlotRef>(leaving.begin(), leaving.end()),
                  Loss{.cause = EpochCause::kDrain, .reason = reason, .stop = true}, now, actions);
    }
  }
  if (node->assigned.empty()) {
    actions->push_back(NodeGone{node_id, "drained"});
    nodes_.erase(node_id);
  }
  Schedule(now, actions);
  return absl::OkStatus();
}

absl::Status Membership::TrainerExited(const SlotRef& slot, const std::string& job_id,
                                       int exit_code, absl::Time now,
                                       std::vector<Action>* actions, const std::string& detail,
                                       bool stopped, int64_t start_epoch) {
  NodeState* node = FindNode(slot.node);
  if (node == nullptr) return absl::NotFoundError(absl::StrCat("no node ", slot.node));
  JobState* job = FindJob(job_id);
  if (job == nullptr && ExitingFor(*node, slot.slot, job_id)) {
    // A trainer of a job deleted since it was told to stop: its slot is free now.
    TrainerGone(*node, slot.slot, job_id);
    Schedule(now, actions);
    return absl::OkStatus();
  }
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job \"", job_id, "\""));
  const auto assigned = node->assigned.find(slot.slot);
  const auto started = node->started.find(slot.slot);
  if (start_epoch > 0 && assigned != node->assigned.end() && assigned->second == job_id &&
      started != node->started.end() && start_epoch < started->second) {
    // An older trainer of the job on a slot it has started again since: not the member's.
    return absl::OkStatus();
  }
  const std::string how =
      exit_code < 0 ? absl::StrCat("was killed by signal ", -exit_code)
                    : absl::StrCat("exited with code ", exit_code);
  const std::string culprit =
      absl::StrCat("trainer on ", ToString(slot), " ", how, detail.empty() ? "" : "; ", detail);
  // The survivors often report a death first ("collective error on b/0: rank 0 closed its
  // connection"), a moment before the agent reports the exit that caused it: then the job's
  // reason names the member that died first, and what the survivors saw second. A trainer
  // the agent stopped as told is no culprit.
  const size_t exiting = node->exiting.size();
  TrainerGone(*node, slot.slot, job_id);
  const bool released = node->exiting.size() < exiting;
  auto it = node->assigned.find(slot.slot);
  const bool blamed = exit_code != 0 && !stopped &&
                      ((it != node->assigned.end() && it->second == job_id) || released) &&
                      BlameCulprit(*job, culprit, now);
  if (it == node->assigned.end() || it->second != job_id) {
    // A trainer that was stopped, or finished: its slot may take the next job now.
    if (blamed) actions->push_back(PersistJob{*job});
    if (released) Schedule(now, actions);
    return absl::OkStatus();
  }
  const Member* member = FindMember(*job, slot);
  if (member == nullptr || IsTerminal(job->phase)) {
    // A leaver after its drain save, or a trainer of a finished job, or a rejoining one
    // (LeaveToRejoin) that gave up: the slot is free again.
    node->assigned.erase(it);
    std::erase(job->rejoining, slot);
    if (blamed) actions->push_back(PersistJob{*job});
  } else if (exit_code == 0 && (member->finished || job->finishing_epoch == job->epoch)) {
    // It reported the last step and left before the others (or left cleanly once another
    // rank had reported it: a drain that came after the last step): nothing to recover. It
    // is no longer a member (a later epoch, should the others fail, cannot count on it).
    std::erase_if(job->members, [&](const Member& m) { return m.slot == slot; });
    node->assigned.erase(it);
    if (!job->members.empty() &&
        std::all_of(job->members.begin(), job->members.end(),
                    [](const Member& m) { return m.finished; })) {
      End(*job, JobPhase::kSucceeded,
          absl::StrCat("every rank of epoch ", job->epoch, " finished"), now, actions);
    } else {
      actions->push_back(PersistJob{*job});
    }
  } else if (exit_code == kExitCodePermanent) {
    // It met an error no restart can fix and could say so only by its exit status (memory
    // ran out on one of its threads): the job fails, spending no restart.
    node->assigned.erase(it);
    End(*job, JobPhase::kFailed,
        absl::StrCat(culprit, " (an error no restart can fix)"), now, actions);
  } else if (exit_code == 0) {
    // It left cleanly before the job's end: only SIGTERM does that (a trainer exits 0 when
    // the job finished or when it left after its ring's drain save). Its agent drained
    // without reaching the coordinator, or the signal was sent to it alone: nothing failed,
    // so the job re-forms as for a drain and spends no restart. (The slot rests for the
    // backoff: a draining agent would take no start there.)
    LoseMembers(*job, {slot},
                Loss{.cause = EpochCause::kDrain,
                     .reason = absl::StrCat("trainer on ", ToString(slot),
                                            " left after its drain save: it was sent SIGTERM"),
                     .backoff = true,
                     .trainer_gone = true},
                now, actions);
  } else {
    LoseMembers(*job, {slot}, Loss{.reason = culprit, .backoff = true, .trainer_gone = true},
                now, actions);
  }
  node = FindNode(slot.node);
  if (node != nullptr && node->draining && node->assigned.empty()) {
    actions->push_back(NodeGone{slot.node, "drained"});
    nodes_.erase(slot.node);
  }
  Schedule(now, actions);
  return absl::OkStatus();
}

void Membership::NodeLocalError(JobState& job, const SlotRef& slot, const std::string& detail,
                                absl::Time now, std::vector<Action>* actions) {
  const std::string what =
      absl::StrCat("error on ", ToString(slot), " that no restart on node ", slot.node,
                   " can fix: ", detail);
  if (!job.excluded_nodes.empty()) {
    End(job, JobPhase::kFailed,
        absl::StrCat(what, "; the job was already moved off node(s) ",
                     absl::StrJoin(job.excluded_nodes, ", "), " for such an error: fix it (is "
                     "the job's data on every node?) and submit the job again"),
        now, actions);
    return;
  }
  job.excluded_nodes.insert(slot.node);
  // Could the other nodes (their slots, busy or not) ever hold it?
  int elsewhere = 0;
  for (const auto& [id, node] : nodes_) {
    if (id != slot.node && !node.draining) elsewhere += node.slots;
  }
  if (elsewhere < job.request.min_ranks) {
    End(job, JobPhase::kFailed,
        absl::StrCat(what, "; no other node has the ", job.request.min_ranks,
                     " slot(s) it needs: fix it (is the job's data on every node?) and submit "
                     "the job again"),
        now, actions);
    return;
  }
  std::set<SlotRef> lost;
  for (const Member& m : job.members) {
    if (m.slot.node == slot.node) lost.insert(m.slot);
  }
  LoseMembers(job, lost,
              Loss{.cause = EpochCause::kFailure,
                   .reason = absl::StrCat(what, "; placing the job on other nodes"),
                   .stop = true},
              now, actions);
}

bool Membership::BlameCulprit(JobState& job, const std::string& culprit, absl::Time now) {
  constexpr char kSurvivors[] = "collective error on ";
  constexpr char kSaw[] = "; the survivors saw: ";
  const size_t at = job.reason.find(kSurvivors);
  if (at == std::string::npos || job.reason.find(kSaw) != std::string::npos ||
      now - job.phase_since > options_.blame_window) {
    return false;
  }
  job.reason = absl::StrCat(job.reason.substr(0, at), culprit, kSaw, job.reason.substr(at));
  return true;
}

absl::Status Membership::SubmitJob(const JobRequest& request, absl::Time now,
                                   std::vector<Action>* actions) {
  if (absl::Status s = ValidateId(request.id, "job id"); !s.ok()) return s;
  if (request.min_ranks < 1 || request.min_ranks > kMaxRanks) {
    return absl::InvalidArgumentError(absl::StrCat("min_ranks must be between 1 and ", kMaxRanks,
                                                   ", got ", request.min_ranks));
  }
  if (request.max_ranks < request.min_ranks || request.max_ranks > kMaxRanks) {
    return absl::InvalidArgumentError(absl::StrCat("max_ranks must be between min_ranks (",
                                                   request.min_ranks, ") and ", kMaxRanks,
                                                   ", got ", request.max_ranks));
  }
  if (request.restart_budget < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("restart_budget must be >= 0, got ", request.restart_budget));
  }
  if (request.rank_multiple < 1 || request.rank_multiple > request.max_ranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("the job's worlds are multiples of ", request.rank_multiple,
                     " ranks (parallelism.mesh tp x pp), but max_ranks is ", request.max_ranks,
                     ": no world fits; raise elastic.max_ranks or shrink the mesh"));
  }
  const JobState* old = FindJob(request.id);
  const bool replaces = old != nullptr;
  if (replaces) {
    if (!IsTerminal(old->phase)) {
      return absl::AlreadyExistsError(absl::StrCat("job ", request.id, " already exists (",
                                                   JobPhaseName(old->phase), ")"));
    }
    // Its name again, after it ended: a new job replaces the old one (which has ended, so
    // DeleteJob cannot fail).
    DeleteJob(request.id).IgnoreError();
  }
  JobState job;
  job.request = request;
  job.resubmitted = replaces;
  job.submitted = job.phase_since = job.below_min_since = now;
  job.reason = absl::StrCat(
      "waiting for ", request.min_ranks, " free slots",
      request.memory_per_rank > 0
          ? absl::StrCat(" with ", request.memory_per_rank >> 20, " MiB of memory each")
          : "");
  jobs_[request.id] = job;
  order_.push_back(request.id);
  actions->push_back(PersistJob{job});
  Schedule(now, actions);
  return absl::OkStatus();
}

absl::Status Membership::CancelJob(const std::string& id, absl::Time now,
                                   std::vector<Action>* actions) {
  JobState* job = FindJob(id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job \"", id, "\""));
  if (IsTerminal(job->phase)) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", id, " is already ", JobPhaseName(job->phase)));
  }
  if (job->phase == JobPhase::kRunning && job->finishing_epoch == job->epoch) {
    // Too late to cancel: the last step is done (a rank reported it; they step together).
    End(*job, JobPhase::kSucceeded,
        absl::StrCat("every rank of epoch ", job->epoch,
                     " finished the last step (the cancel came after it)"),
        now, actions);
  } else {
    End(*job, JobPhase::kCancelled, "cancelled by the user", now, actions);
  }
  Schedule(now, actions);
  return absl::OkStatus();
}

absl::Status Membership::Join(const std::string& id, int64_t epoch, const SlotRef& slot,
                              absl::Time now, std::vector<Action>* actions) {
  if (JobState* job = FindJob(id); job != nullptr && !IsTerminal(job->phase) &&
                                   std::find(job->rejoining.begin(), job->rejoining.end(),
                                             slot) != job->rejoining.end()) {
    return Rejoin(*job, epoch, slot, now, actions);
  }
  auto live = LiveMember(id, epoch, slot);
  if (!live.ok()) return live.status();
  auto [job_ptr, m] = *live;
  JobState& job = *job_ptr;
  m->joined = true;
  m->last_progress = now;
  MaybeCommit(job, now, actions);
  return absl::OkStatus();
}

absl::Status Membership::Ready(const std::string& id, int64_t epoch, const SlotRef& slot,
                               absl::Time now, std::vector<Action>* actions) {
  auto live = LiveMember(id, epoch, slot);
  if (!live.ok()) return live.status();
  auto [job_ptr, m] = *live;
  JobState& job = *job_ptr;
  if (job.phase != JobPhase::kCommitted && job.phase != JobPhase::kRunning) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", id, " epoch ", epoch, " is ", JobPhaseName(job.phase), ", not committed"));
  }
  m->ready = true;
  m->last_progress = now;
  if (job.phase == JobPhase::kRunning) return absl::OkStatus();
  for (const Member& other : job.members) {
    if (!other.ready) return absl::OkStatus();
  }
  job.phase = JobPhase::kRunning;
  job.phase_since = now;
  job.reason.clear();
  actions->push_back(PersistJob{job});
  return absl::OkStatus();
}

absl::Status Membership::Progress(const std::string& id, int64_t epoch, const SlotRef& slot,
                                  int64_t step, absl::Time now, std::vector<Action>* actions,
                                  absl::Duration step_time) {
  auto live = LiveMember(id, epoch, slot);
  if (!live.ok()) return live.status();
  Member* m = live->second;
  m->step = std::max(m->step, step);  // step -1: a keep-alive
  m->last_progress = now;
  if (step >= 0 && step_time > absl::ZeroDuration()) {
    std::vector<absl::Duration>& times = live->first->step_times;
    if (times.size() >= 64) times.erase(times.begin());
    times.push_back(step_time);
  }
  return absl::OkStatus();
}

absl::Duration Membership::SilenceBound(const JobState& job) const {
  absl::Duration bound = options_.silence_floor;
  if (!job.step_times.empty()) {
    std::vector<absl::Duration> sorted = job.step_times;
    std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
    bound = std::max(bound, options_.silence_step_multiple * sorted[sorted.size() / 2]);
  }
  return std::min(bound, options_.hang_timeout);
}

absl::Status Membership::CollectiveError(const std::string& id, int64_t epoch, const SlotRef& slot,
                                         const std::string& detail, absl::Time now,
                                         std::vector<Action>* actions, ErrorScope scope) {
  auto live = LiveMember(id, epoch, slot);
  if (!live.ok()) return live.status();
  JobState& job = *live->first;
  if (job.phase != JobPhase::kCommitted && job.phase != JobPhase::kRunning) {
    return absl::OkStatus();  // already re-forming
  }
  const std::string reason = absl::StrCat("collective error on ", ToString(slot), ": ", detail);
  if (scope == ErrorScope::kNodeLocal) {
    NodeLocalError(job, slot, detail, now, actions);
  } else if (scope == ErrorScope::kPermanent) {
    End(job, JobPhase::kFailed,
        absl::StrCat("error on ", ToString(slot), " that no restart can fix: ", detail), now,
        actions);
  } else if (++job.restarts > job.request.restart_budget) {
    End(job, JobPhase::kFailed,
        absl::StrCat("restart budget of ", job.request.restart_budget,
                     " exhausted; last failure: ", reason),
        now, actions);
  } else {
    Reform(job, EpochCause::kFailure, {}, reason, now, actions);
  }
  Schedule(now, actions);
  return absl::OkStatus();
}

absl::Status Membership::LeaveToRejoin(const std::string& id, int64_t epoch,
                                       const SlotRef& slot, const std::string& detail,
                                       absl::Time now, std::vector<Action>* actions,
                                       std::optional<RankFailure> failure) {
  auto live = LiveMember(id, epoch, slot);
  if (!live.ok()) return live.status();
  JobState& job = *live->first;
  job.rejoining.push_back(slot);
  std::string cause = absl::StrCat("program on ", ToString(slot), " failed (", detail, ")");
  if (failure.has_value()) {
    failure->epoch = epoch;
    failure->slot = slot;
    // The epoch's earliest failure wins, as in ProgramFailed.
    if (!job.first_failure.has_value() || job.first_failure->epoch != epoch ||
        failure->failed_at < job.first_failure->failed_at) {
      job.first_failure = *std::move(failure);
    }
    cause = Describe(*job.first_failure);
  }
  // As any member's failure: one restart for a live epoch; in a forming one only when the
  // slot was new to it (LoseMembers).
  LoseMembers(job, {slot},
              Loss{.reason = absl::StrCat(cause, "; its peers recover in-process"),
                   .keep_slots = true},
              now, actions);
  if (IsTerminal(job.phase)) job.rejoining.clear();  // the budget ran out: the job failed
  Schedule(now, actions);
  return absl::OkStatus();
}

absl::Status Membership::Rejoin(JobState& job, int64_t epoch, const SlotRef& slot,
                                absl::Time now, std::vector<Action>* actions) {
  RM_RETURN_IF_ERROR(CheckLiveEpoch(job.request.id, epoch));
  std::erase(job.rejoining, slot);
  if (const NodeState* node = FindNode(slot.node); node == nullptr || node->draining) {
    return absl::FailedPreconditionError(absl::StrCat(
        "node ", slot.node, " is draining or gone: ", ToString(slot), " does not rejoin job ",
        job.request.id));
  }
  Member m;
  m.slot = slot;
  m.fresh = true;
  m.last_progress = now;
  if (job.phase == JobPhase::kForming || job.phase == JobPhase::kPending) {
    // An epoch not yet committed takes it as it is: it joined that epoch.
    m.joined = true;
    job.members.push_back(m);
    std::sort(job.members.begin(), job.members.end(),
              [](const Member& a, const Member& b) { return a.slot < b.slot; });
    actions->push_back(PersistJob{job});
    if (job.phase == JobPhase::kForming) {
      MaybeCommit(job, now, actions);
    } else {
      Schedule(now, actions);
    }
    return absl::OkStatus();
  }
  job.members.push_back(m);
  Reform(job, EpochCause::kGrow, {},
         absl::StrCat(ToString(slot), " rejoins: its program is up again"), now, actions);
  if (Member* back = FindMember(job, slot); back != nullptr) back->fresh = true;
  // The Join asked for the epoch just superseded: the service answers it ABORTED (join the
  // new one), as every waiting Join of a superseded epoch.
  return absl::OkStatus();
}

absl::Status Membership::ProgramFailed(const std::string& id, int64_t epoch, const SlotRef& slot,
                                       RankFailure failure, absl::Time now,
                                       std::vector<Action>* actions, ErrorScope scope) {
  failure.epoch = epoch;
  failure.slot = slot;
  JobState* job = FindJob(id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job \"", id, "\""));
  if (IsTerminal(job->phase) || epoch < job->epoch || failure.stopped_after) {
    // A late report of an epoch that failed already: the earliest failure wins. (One of a
    // program that ringmaster stopped re-forms nothing, even in the epoch it ran in: a drain's
    // stop is no failure.)
    if (job->first_failure.has_value() && job->first_failure->epoch == epoch &&
        failure.failed_at < job->first_failure->failed_at) {
      const std::string was = Describe(*job->first_failure);
      job->first_failure = std::move(failure);
      job->reason = absl::StrReplaceAll(job->reason, {{was, Describe(*job->first_failure)}});
      actions->push_back(PersistJob{*job});
    }
    // Taken (OK: the service carries out the persist), whether or not it was the earliest.
    return absl::OkStatus();
  }
  auto live = LiveMember(id, epoch, slot);
  if (!live.ok()) return live.status();
  if (job->phase != JobPhase::kCommitted && job->phase != JobPhase::kRunning) {
    return absl::OkStatus();  // already re-forming
  }
  job->first_failure = std::move(failure);
  const std::string reason = Describe(*job->first_failure);
  if (scope == ErrorScope::kNodeLocal) {
    NodeLocalError(*job, slot, reason, now, actions);
  } else if (scope == ErrorScope::kPermanent) {
    End(*job, JobPhase::kFailed,
        absl::StrCat("error on ", ToString(slot), " that no restart can fix: ", reason), now,
        actions);
  } else if (++job->restarts > job->request.restart_budget) {
    End(*job, JobPhase::kFailed,
        absl::StrCat("restart budget of ", job->request.restart_budget,
                     " exhausted; last failure: ", reason),
        now, actions);
  } else {
    Reform(*job, EpochCause::kFailure, {}, reason, now, actions);
  }
  Schedule(now, actions);
  return absl::OkStatus();
}

absl::Status Membership::Finished(const std::string& id, int64_t epoch, const SlotRef& slot,
                                  absl::Time now, std::vector<Action>* actions) {
  auto live = LiveMember(id, epoch, slot);
  if (!live.ok()) return live.status();
  auto [job_ptr, m] = *live;
  JobState& job = *job_ptr;
  if (job.phase != JobPhase::kRunning) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", id, " is ", JobPhaseName(job.phase), ", not running"));
  }
  m->finished = true;
  job.finishing_epoch = job.epoch;
  for (const Member& other : job.members) {
    if (!other.finished) return absl::OkStatus();
  }
  End(job, JobPhase::kSucceeded, absl::StrCat("every rank of epoch ", job.epoch, " finished"),
      now, actions);
  Schedule(now, actions);
  return absl::OkStatus();
}

void Membership::Tick(absl::Time now, std::vector<Action>* actions) {
  // Leases.
  std::vector<std::string> expired;
  for (const auto& [id, node] : nodes_) {
    if (node.lease_expiry <= now) expired.push_back(id);
  }
  for (const std::string& node_id : expired) {
    const std::string reason = absl::StrCat("node ", node_id, " lease expired");
    for (const std::string& id : order_) {
      JobState& job = jobs_[id];
      std::set<SlotRef> lost;
      for (const Member& m : job.members) {
        if (m.slot.node == node_id) lost.insert(m.slot);
      }
      if (!lost.empty() && !IsTerminal(job.phase)) {
        // Its last heartbeat, unless its lease is the grace a restart gave it.
        const NodeState& node = nodes_[node_id];
        LoseMembers(job, lost,
                    Loss{.reason = reason,
                         .failed_at = node.restored ? absl::InfinitePast()
                                                    : node.lease_expiry - options_.lease},
                    now, actions);
      }
    }
    actions->push_back(NodeGone{node_id, "lease expired"});
    nodes_.erase(node_id);
  }
  // Backoffs.
  for (auto& [id, node] : nodes_) {
    std::erase_if(node.backoff_until, [&](const auto& kv) { return kv.second <= now; });
  }
  // Joins, readiness, hangs, below-min waits.
  for (const std::string& id : order_) {
    JobState& job = jobs_[id];
    std::set<SlotRef> lost;
    std::string reason;
    absl::Time failed_at = absl::InfinitePast();  // known for a hang: the last progress
    if (job.phase == JobPhase::kForming && now - job.phase_since >= options_.join_timeout) {
      for (const Member& m : job.members) {
        if (!m.joined) lost.insert(m.slot);
      }
      reason = absl::StrCat("did not join epoch ", job.epoch, " within ",
                            absl::FormatDuration(options_.join_timeout));
    } else if (job.phase == JobPhase::kCommitted &&
               now - job.phase_since >= options_.ready_timeout) {
      for (const Member& m : job.members) {
        if (!m.ready) lost.insert(m.slot);
      }
      reason = absl::StrCat("not ready in epoch ", job.epoch, " within ",
                            absl::FormatDuration(options_.ready_timeout));
    } else if (job.phase == JobPhase::kRunning && options_.hang_timeout > absl::ZeroDuration()) {
      const absl::Duration bound = SilenceBound(job);
      for (const Member& m : job.members) {
        if (now - m.last_progress >= bound) {
          lost.insert(m.slot);
          failed_at = failed_at == absl::InfinitePast() ? m.last_progress
                                                        : std::min(failed_at, m.last_progress);
        }
      }
      reason = absl::StrCat("sent nothing for ", absl::FormatDuration(bound),
                            ", not even a keep-alive (stopped or frozen: hung)");
    } else if (job.phase == JobPhase::kPending && job.ever_started &&
               now - job.below_min_since >= options_.rendezvous_timeout) {
      End(job, JobPhase::kFailed,
          absl::StrCat(job.reason, " for longer than the rendezvous timeout (",
                       absl::FormatDuration(options_.rendezvous_timeout), ")"),
          now, actions);
      continue;
    }
    if (lost.empty()) continue;
    std::string who = absl::StrJoin(lost, ", ", [](std::string* out, const SlotRef& s) {
      absl::StrAppend(out, ToString(s));
    });
    LoseMembers(job, lost,
                Loss{.reason = absl::StrCat(who, " ", reason),
                     .backoff = true,
                     .stop = true,
                     .failed_at = failed_at},
                now, actions);
  }
  Schedule(now, actions);
}

absl::Status Membership::Restore(const std::vector<JobState>& jobs, absl::Time now) {
  std::map<std::string, JobState> restored;
  std::map<std::string, NodeState> nodes;
  std::vector<const JobState*> by_submission;
  for (const JobState& job : jobs) {
    if (!restored.emplace(job.request.id, job).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("persisted state holds job ", job.request.id, " twice"));
    }
  }
  for (auto& [id, job] : restored) {
    by_submission.push_back(&job);
    if (IsTerminal(job.phase)) continue;
    if (job.phase == JobPhase::kForming || job.phase == JobPhase::kCommitted) {
      job.phase_since = now;
    }
    if (job.phase == JobPhase::kPending) job.below_min_since = now;
    for (Member& m : job.members) {
      // Trainers reconnect too: their hang clock starts after the grace.
      m.last_progress = now + options_.restore_grace;
      NodeState& node = nodes[m.slot.node];
      node.slots = std::max(node.slots, m.slot.slot + 1);
      node.lease_expiry = now + std::max(options_.lease, options_.restore_grace);
      node.restored = true;
      if (!node.assigned.emplace(m.slot.slot, id).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            "persisted state gives slot ", ToString(m.slot), " to two jobs"));
      }
    }
  }
  std::stable_sort(by_submission.begin(), by_submission.end(),
                   [](const JobState* a, const JobState* b) { return a->submitted < b->submitted; });
  order_.clear();
  for (const JobState* job : by_submission) order_.push_back(job->request.id);
  jobs_ = std::move(restored);
  nodes_ = std::move(nodes);
  return absl::OkStatus();
}

absl::Status Membership::DeleteJob(const std::string& id) {
  const JobState* job = FindJob(id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job \"", id, "\""));
  if (!IsTerminal(job->phase)) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", id, " is ", JobPhaseName(job->phase), ": cancel it first"));
  }
  jobs_.erase(id);
  std::erase(order_, id);
  return absl::OkStatus();
}

bool Membership::ExitingFor(const NodeState& node, int slot, const std::string& job) {
  auto it = node.exiting.find(slot);
  return it != node.exiting.end() && it->second.job == job;
}

std::vector<Membership::NodeView> Membership::Nodes(absl::Time now) const {
  std::vector<NodeView> views;
  for (const auto& [id, node] : nodes_) {
    NodeView v;
    v.node = id;
    v.slots = node.slots;
    v.draining = node.draining;
    v.restored = node.restored;
    v.lease_expiry = node.lease_expiry;
    v.assigned = node.assigned;
    for (const auto& [slot, e] : node.exiting) v.exiting[slot] = e.job;
    for (const auto& [slot, until] : node.backoff_until) {
      if (until > now) v.backoff_until[slot] = until;
    }
    views.push_back(std::move(v));
  }
  return views;
}

std::string Membership::DebugString(absl::Time now) const {
  std::string out;
  for (const std::string& id : order_) {
    const JobState& job = jobs_.at(id);
    absl::StrAppend(&out, "job ", id, ": ", JobPhaseName(job.phase), " epoch=", job.epoch,
                    " members=[", MembersString(job.members), "] restarts=", job.restarts);
    if (!job.rejoining.empty()) {
      absl::StrAppend(&out, " rejoining=[",
                      absl::StrJoin(job.rejoining, " ",
                                    [](std::string* o, const SlotRef& s) {
                                      absl::StrAppend(o, ToString(s));
                                    }),
                      "]");
    }
    if (!job.reason.empty()) absl::StrAppend(&out, " (", job.reason, ")");
    absl::StrAppend(&out, "\n");
  }
  for (const auto& [id, node] : nodes_) {
    absl::StrAppend(&out, "node ", id, ": slots=", node.slots,
                    node.memory > 0 ? absl::StrCat(" memory=", node.memory >> 20, "MiB") : "",
                    node.draining ? " draining" : "",
                    node.lease_expiry <= now ? " expired" : "");
    for (const auto& [slot, job] : node.assigned) absl::StrAppend(&out, " ", slot, "=", job);
    for (const auto& [slot, e] : node.exiting) absl::StrAppend(&out, " ", slot, ":exiting=", e.job);
    for (const auto& [slot, until] : node.backoff_until) {
      if (until > now) {
        absl::StrAppend(&out, " ", slot, ":backoff ", absl::FormatDuration(until - now));
      }
    }
    absl::StrAppend(&out, "\n");
  }
  return out;
}

}  // namespace ringmaster::coordinator
