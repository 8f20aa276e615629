#include "coordinator/coordinator.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/plural.h"
#include "common/status_macros.h"
#include "coordinator/auth.h"
#include "glog/logging.h"
#include "spec/defaults.h"
#include "spec/job_spec.h"
#include "spec/validate.h"

namespace ringmaster::coordinator {
namespace {

constexpr int kNoUpperLimit = 100000;
constexpr size_t kMaxMembersInJoin = 64;
// Bounds on what one caller can make the coordinator store and send to everyone: a job's
// spec travels in every start command and every List page, so it is kept small (a real
// spec is a few KiB); a job keeps its latest recoveries; one answer stays under gRPC's
// default 4 MiB receive limit.
constexpr size_t kMaxSpecBytes = 64 << 10;
constexpr int kMaxRecoveriesKept = 64;
constexpr size_t kMaxResponseBytes = 3 << 20;
constexpr int kDefaultPageSize = 100;
constexpr int kMaxPageSize = 500;
constexpr size_t kMaxStoreKeyBytes = 256;
constexpr size_t kMaxDetailBytes = 4096;

// A report's text (an error, a log line) as stored: at most kMaxDetailBytes.
std::string Bounded(absl::string_view text) {
  if (text.size() <= kMaxDetailBytes) return std::string(text);
  return absl::StrCat(text.substr(0, kMaxDetailBytes - 40), "... (",
                      text.size() - (kMaxDetailBytes - 40), " more bytes)");
}

absl::Status ValidateStoreKey(const std::string& key) {
  if (key.empty() || key.size() > kMaxStoreKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("key must be 1 to ", kMaxStoreKeyBytes, " characters, got ", key.size()));
  }
  return absl::OkStatus();
}

int64_t Ms(absl::Time t) { return t == absl::InfinitePast() ? 0 : absl::ToUnixMillis(t); }
absl::Time FromMs(int64_t ms) { return absl::FromUnixMillis(ms); }

ringmaster::JobPhase PhaseToProto(JobPhase phase) {
  switch (phase) {
    case JobPhase::kPending:
      return JOB_PHASE_PENDING;
    case JobPhase::kForming:
      return JOB_PHASE_FORMING;
    case JobPhase::kCommitted:
      return JOB_PHASE_COMMITTED;
    case JobPhase::kRunning:
      return JOB_PHASE_RUNNING;
    case JobPhase::kSucceeded:
      return JOB_PHASE_SUCCEEDED;
    case JobPhase::kFailed:
      return JOB_PHASE_FAILED;
    case JobPhase::kCancelled:
      return JOB_PHASE_CANCELLED;
  }
  return JOB_PHASE_UNSPECIFIED;
}

JobPhase PhaseFromProto(ringmaster::JobPhase phase) {
  switch (phase) {
    case JOB_PHASE_FORMING:
      return JobPhase::kForming;
    case JOB_PHASE_COMMITTED:
      return JobPhase::kCommitted;
    case JOB_PHASE_RUNNING:
      return JobPhase::kRunning;
    case JOB_PHASE_SUCCEEDED:
      return JobPhase::kSucceeded;
    case JOB_PHASE_FAILED:
      return JobPhase::kFailed;
    case JOB_PHASE_CANCELLED:
      return JobPhase::kCancelled;
    default:
      return JobPhase::kPending;
  }
}

EpochCause CauseFromName(const std::string& name) {
  for (EpochCause c : {EpochCause::kStart, EpochCause::kFailure, EpochCause::kDrain,
                       EpochCause::kGrow, EpochCause::kRestore, EpochCause::kResubmit}) {
    if (name == EpochCauseName(c)) return c;
  }
  return EpochCause::kStart;
}

SlotRef FromProto(const ringmaster::SlotRef& s) { return SlotRef{s.node(), s.slot()}; }
void ToProto(const SlotRef& s, ringmaster::SlotRef* out) {
  out->set_node(s.node);
  out->set_slot(s.slot);
}


// What a trainer's exit report says went wrong: the whole last non-empty line of its log
// tail (where a trainer prints its error) and where its full log is.
std::string ExitDetail(const TrainerExitedRequest& r) {
  absl::string_view text = absl::StripTrailingAsciiWhitespace(r.detail());
  const size_t nl = text.rfind('\n');
  if (nl != absl::string_view::npos) text = text.substr(nl + 1);
  std::string detail;
  if (!text.empty()) absl::StrAppend(&detail, "its last log line: ", text);
  if (!r.log_path().empty()) {
    absl::StrAppend(&detail, detail.empty() ? "" : " ", "(log: ", r.node(), ":", r.log_path(),
                    ")");
  }
  return Bounded(detail);
}

// Job.rank_slots from a committed epoch's members.
void SetRankSlots(std::vector<Member> members, Job* job) {
  std::sort(members.begin(), members.end(),
            [](const Member& a, const Member& b) { return a.rank < b.rank; });
  job->clear_rank_slots();
  for (const Member& m : members) ToProto(m.slot, job->add_rank_slots());
}

// What an agent's registration may say about it, bounded like every stored field.
absl::Status ValidateAgentInfo(const RegisterNodeRequest& r) {
  constexpr size_t kMaxAddress = 256;
  if (r.address().size() > kMaxAddress || r.log_address().size() > kMaxAddress) {
    return absl::InvalidArgumentError(absl::StrCat(
        "address and log_address must be at most ", kMaxAddress, " bytes, got ",
        r.address().size(), " and ", r.log_address().size()));
  }
  if (r.gpus_size() > kMaxSlotsPerNode) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpus: at most ", kMaxSlotsPerNode, " entries, got ", r.gpus_size()));
  }
  for (const std::string& gpu : r.gpus()) {
    if (gpu.size() > kMaxAddress) {
      return absl::InvalidArgumentError(
          absl::StrCat("gpus: a name is at most ", kMaxAddress, " bytes, got ", gpu.size()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

void ToProto(const RankFailure& f, ringmaster::RankFailure* out) {
  out->set_epoch(f.epoch);
  out->set_rank(f.rank);
  ToProto(f.slot, out->mutable_slot());
  out->set_program(f.program);
  out->set_how(f.how);
  out->set_exit_code(f.exit_code);
  out->set_signal(f.signal);
  out->set_signal_name(f.signal_name);
  out->set_error_message(f.error_message);
  out->set_last_output_line(f.last_output_line);
  out->set_failed_at_s(static_cast<double>(absl::ToUnixMicros(f.failed_at)) / 1e6);
  out->set_failed_at_from_error_file(f.failed_at_from_error_file);
  out->set_stopped_after(f.stopped_after);
}

// A runner's report, every text bounded as stored details are; a time that is not one (NaN, or
// 0: an older runner) is `now`.
RankFailure FromProto(const ringmaster::RankFailure& f, absl::Time now) {
  RankFailure out;
  out.epoch = f.epoch();
  out.rank = f.rank();
  out.slot = FromProto(f.slot());
  out.program = Bounded(f.program());
  out.how = Bounded(f.how());
  out.exit_code = f.exit_code();
  out.signal = f.signal();
  out.signal_name = Bounded(f.signal_name());
  out.error_message = Bounded(f.error_message());
  out.last_output_line = Bounded(f.last_output_line());
  const double at = f.failed_at_s();
  out.failed_at = at > 0 && at < 1e11 ? absl::FromUnixMicros(static_cast<int64_t>(at * 1e6)) : now;
  out.failed_at_from_error_file = f.failed_at_from_error_file();
  out.stopped_after = f.stopped_after();
  return out;
}

RankFailure FromProto(const ringmaster::RankFailure& f) { return FromProto(f, absl::UnixEpoch()); }

}  // namespace

void ToProto(const JobState& state, Job* job) {
  job->set_id(state.request.id);
  job->set_min_ranks(state.request.min_ranks);
  job->set_max_ranks(state.request.max_ranks);
  job->set_restart_budget(state.request.restart_budget);
  job->set_phase(PhaseToProto(state.phase));
  job->set_reason(state.reason);
  job->set_cannot_grow(state.request.cannot_grow);
  job->set_epoch(state.epoch);
  job->set_epoch_cause(EpochCauseName(state.cause));
  job->set_restarts(state.restarts);
  job->set_submitted_ms(Ms(state.submitted));
  job->set_phase_since_ms(Ms(state.phase_since));
  job->set_below_min_since_ms(Ms(state.below_min_since));
  job->set_ever_started(state.ever_started);
  job->set_resubmitted(state.resubmitted);
  job->clear_excluded_nodes();
  for (const std::string& node : state.excluded_nodes) job->add_excluded_nodes(node);
  job->clear_members();
  for (const Member& m : state.members) {
    ringmaster::Member* out = job->add_members();
    ToProto(m.slot, out->mutable_slot());
    out->set_rank(m.rank);
    out->set_joined(m.joined);
    out->set_ready(m.ready);
    out->set_finished(m.finished);
    out->set_step(m.step);
    out->set_last_progress_ms(Ms(m.last_progress));
  }
  if (state.first_failure.has_value()) {
    ToProto(*state.first_failure, job->mutable_first_failure());
  } else {
    job->clear_first_failure();
  }
}

// The ranks of one data-parallel replica of the spec's model-parallel layout: every world is
// a multiple of it.
int RankMultiple(const JobSpec& spec) {
  const MeshSpec& mesh = spec.parallelism().mesh();
  return std::max(1, mesh.tp()) * std::max(1, mesh.pp());
}

// Why a job with this spec cannot grow (JobRequest::cannot_grow): empty when it can.
std::string CannotGrow(const JobSpec& spec) {
  if (!spec.checkpoint().dir().empty() || spec::RanksHoldWholeState(spec)) return "";
  const MeshSpec& mesh = spec.parallelism().mesh();
  const std::string layout =
      spec.parallelism().zero_stage() > 0
          ? absl::StrCat("parallelism.zero_stage ", spec.parallelism().zero_stage())
          : absl::StrCat("parallelism.mesh tp ", std::max(1, mesh.tp()), " x pp ",
                         std::max(1, mesh.pp()));
  return absl::StrCat("it does not grow into free slots: its state is sharded over its ranks (",
                      layout, ") and it has no checkpoint.dir, so a new rank could not be "
                      "given its part; set checkpoint.dir to let it grow");
}

JobState FromProto(const Job& job) {
  JobState state;
  state.request.id = job.id();
  state.request.min_ranks = job.min_ranks();
  state.request.max_ranks = job.max_ranks();
  state.request.restart_budget = job.restart_budget();
  // What the stored spec says (applied at submission): a restarted coordinator keeps them.
  state.request.memory_per_rank = job.spec().resources().memory_per_rank_mib() << 20;
  state.request.rank_multiple = RankMultiple(job.spec());
  state.request.cannot_grow = CannotGrow(job.spec());
  state.phase = PhaseFromProto(job.phase());
  state.reason = job.reason();
  state.epoch = job.epoch();
  state.cause = CauseFromName(job.epoch_cause());
  state.restarts = job.restarts();
  state.submitted = FromMs(job.submitted_ms());
  state.phase_since = FromMs(job.phase_since_ms());
  state.below_min_since = FromMs(job.below_min_since_ms());
  state.ever_started = job.ever_started();
  state.resubmitted = job.resubmitted();
  state.excluded_nodes.insert(job.excluded_nodes().begin(), job.excluded_nodes().end());
  for (const ringmaster::Member& m : job.members()) {
    Member member;
    member.slot = FromProto(m.slot());
    member.rank = m.rank();
    member.joined = m.joined();
    member.ready = m.ready();
    member.finished = m.finished();
    member.step = m.step();
    member.last_progress = FromMs(m.last_progress_ms());
    state.members.push_back(member);
  }
  if (job.has_first_failure()) state.first_failure = FromProto(job.first_failure());
  return state;
}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(
    const CoordinatorOptions& options) {
  auto store = JobStore::Open(options.database, options.store);
  if (!store.ok()) return store.status();
  auto jobs = (*store)->LoadAll();
  if (!jobs.ok()) return jobs.status();
  auto secret = (*store)->GetOrCreateSetting("membership_secret", NewSecret());
  if (!secret.ok()) return secret.status();
  Clock* clock = options.clock != nullptr ? options.clock : Clock::Real();
  std::unique_ptr<Coordinator> c(
      new Coordinator(options, std::move(*store), clock, std::move(*secret)));
  absl::MutexLock lock(&c->mu_);
  std::vector<JobState> states;
  for (Job& job : *jobs) {
    states.push_back(FromProto(job));
    c->version_ = std::max(c->version_, job.version());
    for (const ringmaster::Member& m : job.members()) c->world_[job.id()] += m.rank() >= 0;
    if (job.rank_slots_size() > 0) {
      JobHistory::Epoch epoch{job.epoch(), CauseFromName(job.epoch_cause()), c->Now(), {}};
      for (const auto& slot : job.rank_slots()) epoch.ranks.push_back(FromProto(slot));
      c->HistoryOf(job.id()).AddEpoch(std::move(epoch));
    }
    c->jobs_[job.id()] = std::move(job);
  }
  if (absl::Status s = c->machine_.Restore(states, c->Now()); !s.ok()) {
    return absl::DataLossError(
        absl::StrCat("the job database ", options.database, " is inconsistent: ", s.message()));
  }
  LOG(INFO) << "coordinator: restored " << Plural(states.size(), "job") << " from "
            << options.database;
  return c;
}

Coordinator::Coordinator(const CoordinatorOptions& options, std::unique_ptr<JobStore> store,
                         Clock* clock, std::string secret)
    : options_(options),
      clock_(clock),
      store_(std::move(store)),
      secret_(std::move(secret)),
      machine_(options.membership) {}

std::string Coordinator::MembershipTokenFor(const std::string& job,
                                            const ringmaster::SlotRef& slot) const {
  return MembershipToken(secret_, job, slot.node(), slot.slot());
}

Coordinator::~Coordinator() { FailWaiters(); }

void Coordinator::FailWaiters() {
  Completions completions;
  {
    absl::MutexLock lock(&mu_);
    const absl::Status gone = absl::UnavailableError("the coordinator is shutting down");
    for (auto& w : joins_) completions.push_back([d = w.done, gone] { d(gone); });
    for (auto& w : store_waiters_) completions.push_back([d = w.done, gone] { d(gone); });
    for (auto& w : watches_) completions.push_back([d = w.done, gone] { d(gone); });
    joins_.clear();
    store_waiters_.clear();
    watches_.clear();
  }
  Run(completions);
}

void Coordinator::Run(Completions& completions) {
  for (auto& f : completions) f();
  completions.clear();
}

template <typename Fn>
absl::Status Coordinator::Decide(Fn&& decide) {
  Completions completions;
  {
    absl::MutexLock lock(&mu_);
    std::vector<Action> actions;
    if (absl::Status s = decide(&actions); !s.ok()) return s;
    Apply(actions, &completions);
  }
  Run(completions);
  return absl::OkStatus();
}

absl::StatusOr<Job*> Coordinator::FindJob(const std::string& id) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job \"", id, "\""));
  return &it->second;
}

void Coordinator::Bump(Job& job) { job.set_version(++version_); }

void Coordinator::Persist(const JobState& state) {
  Job& job = jobs_[state.request.id];
  ToProto(state, &job);
  // A recovery recorded on the survivors' report learns its culprit from the agent's exit
  // report that follows (Membership::BlameCulprit).
  if (job.recoveries_size() > 0) {
    Recovery* last = job.mutable_recoveries(job.recoveries_size() - 1);
    if (last->epoch() == state.epoch &&
        absl::StrContains(state.reason, "; the survivors saw: ") &&
        !absl::StrContains(last->reason(), "; the survivors saw: ")) {
      last->set_reason(state.reason);
    }
  }
  // A command job's recovery names the first failure of the epoch it left, which a later report
  // of an earlier failure may have changed (Membership::ProgramFailed: the earliest wins).
  if (state.first_failure.has_value()) {
    const std::string named =
        absl::StrCat(" failed first in membership epoch ", state.first_failure->epoch, ":");
    for (Recovery& r : *job.mutable_recoveries()) {
      if (r.epoch() > state.first_failure->epoch && absl::StartsWith(r.reason(), "rank ") &&
          absl::StrContains(r.reason(), named)) {
        // An in-process recovery's (Membership::LeaveToRejoin) keeps saying so.
        constexpr absl::string_view kInProcess = "; its peers recover in-process";
        r.set_reason(absl::StrCat(Describe(*state.first_failure),
                                  absl::EndsWith(r.reason(), kInProcess) ? kInProcess : ""));
      }
    }
  }
  Bump(job);
  // A decision that is not durable must not be announced: stop, and let the restarted
  // coordinator resume from the last durable state.
  absl::Status s = store_->Put(job);
  LOG_IF(FATAL, !s.ok()) << "cannot persist job " << state.request.id << ": " << s;
}

void Coordinator::Apply(const std::vector<Action>& actions, Completions* completions) {
  const absl::Time now = Now();
  for (const Action& action : actions) {
    VLOG(1) << "coordinator: " << ToString(action);
    if (const auto* a = std::get_if<PersistJob>(&action)) {
      Persist(a->job);
    } else if (const auto* a = std::get_if<StartTrainer>(&action)) {
      AgentCommand cmd;
      StartTrainerCommand* start = cmd.mutable_start();
      ToProto(a->slot, start->mutable_slot());
      start->set_job(a->job);
      start->set_epoch(a->epoch);
      *start->mutable_spec() = jobs_[a->job].spec();
      start->set_membership_token(MembershipToken(secret_, a->job, a->slot.node, a->slot.slot));
      commands_[a->slot.node].push_back(std::move(cmd));
    } else if (const auto* a = std::get_if<StopTrainer>(&action)) {
      AgentCommand cmd;
      StopTrainerCommand* stop = cmd.mutable_stop();
      ToProto(a->slot, stop->mutable_slot());
      stop->set_job(a->job);
      stop->set_reason(a->reason);
      commands_[a->slot.node].push_back(std::move(cmd));
    } else if (const auto* a = std::get_if<AnnounceEpoch>(&action)) {
      leaving_[a->job] = std::set<SlotRef>(a->leaving.begin(), a->leaving.end());
      Job& job = jobs_[a->job];
      if (job.recoveries_size() >= kMaxRecoveriesKept) {
        job.mutable_recoveries()->DeleteSubrange(0, job.recoveries_size() - kMaxRecoveriesKept + 1);
      }
      Recovery* r = job.add_recoveries();
      r->set_epoch(a->epoch);
      r->set_cause(EpochCauseName(a->cause));
      r->set_reason(a->reason);
      r->set_old_world(world_[a->job]);
      r->set_began_ms(Ms(now));
      if (a->failed_at != absl::InfinitePast() && a->failed_at <= now) {
        r->set_detect_s(absl::ToDoubleSeconds(now - a->failed_at));
      }
      r->set_lost_steps(-1);
      r->set_step_before(job.step());
      r->set_resumed_from_step(-1);
      Bump(job);
    } else if (const auto* a = std::get_if<CommitEpoch>(&action)) {
      Job& job = jobs_[a->job];
      world_[a->job] = static_cast<int>(a->members.size());
      SetRankSlots(a->members, &job);
      {
        JobHistory::Epoch epoch{a->epoch, EpochCause::kStart, now, {}};
        if (const JobState* state = machine_.job(a->job); state != nullptr) {
          epoch.cause = state->cause;
        }
        for (const ringmaster::SlotRef& slot : job.rank_slots()) {
          epoch.ranks.push_back(FromProto(slot));
        }
        HistoryOf(a->job).AddEpoch(std::move(epoch));
      }
      job.set_step(0);  // the new epoch restarts from a checkpoint: steps may go back
      job.set_steps_per_s(0);  // measured again in the new epoch
      kv_[a->job].clear();  // the previous epoch's bootstrap is void
      rank_stats_[a->job].clear();
      slow_reports_[a->job].clear();
      job.clear_stragglers();
      if (job.recoveries_size() > 0 && job.recoveries().rbegin()->epoch() == a->epoch) {
        Recovery* r = job.mutable_recoveries(job.recoveries_size() - 1);
        r->set_new_world(static_cast<int>(a->members.size()));
        r->set_rendezvous_s(absl::ToDoubleSeconds(now - FromMs(r->began_ms())));
      }
    } else if (const auto* a = std::get_if<JobEnded>(&action)) {
      LOG(INFO) << "coordinator: job " << a->job << " " << JobPhaseName(a->phase) << ": "
                << a->reason;
      kv_.erase(a->job);
      leaving_.erase(a->job);
    } else if (const auto* a = std::get_if<NodeGone>(&action)) {
      LOG(INFO) << "coordinator: node " << a->node << " gone: " << a->reason;
      commands_.erase(a->node);
    }
  }
  Resolve(completions);
}

JobEvent Coordinator::EventOf(const Job& job) {
  JobEvent event;
  event.set_version(job.version());
  *event.mutable_job() = job;
  auto stats = rank_stats_.find(job.id());
  if (stats != rank_stats_.end()) {
    for (const auto& [rank, s] : stats->second) *event.add_ranks() = s;
  }
  return event;
}

void Coordinator::Resolve(Completions* completions) {
  const absl::Time now = Now();
  // Joins: committed, superseded, ended, or out of time.
  std::erase_if(joins_, [&](JoinWaiter& w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const JoinRequest& r = w.request;
    const JobState* state = machine_.job(r.job());
    absl::StatusOr<JoinResponse> result;
    if (state == nullptr) {
      result = absl::NotFoundError(absl::StrCat("no job \"", r.job(), "\""));
    } else if (IsTerminal(state->phase)) {
      result = absl::FailedPreconditionError(
          absl::StrCat("job ", r.job(), " is ", JobPhaseName(state->phase), ": stop"));
    } else if (state->epoch > r.epoch()) {
      result = absl::AbortedError(absl::StrCat("epoch ", r.epoch(), " of job ", r.job(),
                                               " was superseded by epoch ", state->epoch,
                                               "; join it"));
    } else if (state->phase == JobPhase::kCommitted || state->phase == JobPhase::kRunning) {
      JoinResponse response;
      response.set_epoch(state->epoch);
      response.set_world_size(static_cast<int>(state->members.size()));
      response.set_rank(-1);
      for (const Member& m : state->members) {
        if (m.slot == FromProto(r.slot())) response.set_rank(m.rank);
      }
      if (response.rank() < 0) {
        result = absl::NotFoundError(absl::StrCat(ToString(FromProto(r.slot())),
                                                  " is not a member of job ", r.job(),
                                                  " epoch ", state->epoch));
      } else {
        // The member list costs O(world) per joiner, O(world^2) in all: small worlds only.
        if (state->members.size() <= kMaxMembersInJoin) {
          *response.mutable_members() = jobs_[r.job()].members();
        }
        response.set_store_prefix(absl::StrCat("epoch-", state->epoch, "/"));
        response.set_restore_step(-1);
        // A resubmitted job's first epoch starts as spec.resume says, like any first epoch.
        response.set_continues_run(state->cause != EpochCause::kStart &&
                                   state->cause != EpochCause::kResubmit);
        response.set_restarts(state->restarts);
        response.set_epoch_cause(EpochCauseName(state->cause));
        const Job& job = jobs_[r.job()];
        if (job.checkpoints_size() > 0) {
          response.set_restore_step(job.checkpoints(job.checkpoints_size() - 1).step());
        }
        if (job.recoveries_size() > 0 && job.recoveries().rbegin()->epoch() == state->epoch) {
          response.set_step_before(job.recoveries().rbegin()->step_before());
        }
        result = std::move(response);
      }
    } else if (now >= w.deadline) {
      result = absl::DeadlineExceededError(absl::StrCat(
          "epoch ", r.epoch(), " of job ", r.job(), " is still ", JobPhaseName(state->phase),
          state->reason.empty() ? "" : absl::StrCat(" (", state->reason, ")"), "; call again"));
    } else {
      return false;
    }
    completions->push_back([done = std::move(w.done), result = std::move(result)] {
      done(result);
    });
    return true;
  });
  // Bootstrap reads: every key present, or out of time.
  std::erase_if(store_waiters_, [&](StoreWaiter& w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const auto& kv = kv_[w.request.job()];
    StoreGetResponse response;
    std::vector<std::string> missing;
    for (const std::string& key : w.request.keys()) {
      auto it = kv.find(key);
      if (it == kv.end()) {
        missing.push_back(key);
      } else {
        response.add_values(it->second);
      }
    }
    absl::StatusOr<StoreGetResponse> result;
    if (missing.empty()) {
      result = std::move(response);
    } else if (now >= w.deadline) {
      result = absl::DeadlineExceededError(
          absl::StrCat("store keys of job ", w.request.job(), " still missing: ",
                       absl::StrJoin(missing, ", ")));
    } else {
      return false;
    }
    completions->push_back([done = std::move(w.done), result = std::move(result)] {
      done(result);
    });
    return true;
  });
  // Watches: a newer version, or out of time.
  std::erase_if(watches_, [&](WatchWaiter& w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = jobs_.find(w.job);
    absl::StatusOr<JobEvent> result;
    if (it == jobs_.end()) {
      result = absl::NotFoundError(absl::StrCat("no job \"", w.job, "\""));
    } else if (it->second.version() > w.after_version) {
      result = EventOf(it->second);
    } else if (now >= w.deadline) {
      result = absl::DeadlineExceededError(
          absl::StrCat("job ", w.job, " did not change; call again"));
    } else {
      return false;
    }
    completions->push_back([done = std::move(w.done), result = std::move(result)] {
      done(result);
    });
    return true;
  });
}

// ---------------------------------------------------------------------------------------
// JobService.

absl::StatusOr<Job> Coordinator::Submit(const JobSpec& submitted) {
  if (submitted.ByteSizeLong() > kMaxSpecBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the job spec is ", submitted.ByteSizeLong(), " bytes; at most ", kMaxSpecBytes,
        " are accepted (it travels to every trainer): shorten it"));
  }
  JobSpec spec = submitted;
  spec::ApplyJobSpecDefaults(&spec);
  if (absl::Status s = spec::ValidateJobSpec(spec); !s.ok()) return s;
  JobRequest request;
  request.id = spec.name();
  request.min_ranks = spec.elastic().min_ranks();
  request.max_ranks = spec.elastic().max_ranks() > 0 ? spec.elastic().max_ranks() : kNoUpperLimit;
  request.restart_budget = spec.elastic().restart_budget();
  request.memory_per_rank = spec.resources().memory_per_rank_mib() << 20;
  request.rank_multiple = RankMultiple(spec);
  request.cannot_grow = CannotGrow(spec);
  Completions completions;
  Job result;
  {
    absl::MutexLock lock(&mu_);
    // A job that has ended is replaced by its name submitted again (Membership::SubmitJob):
    // with the same checkpoint.dir, the new job resumes from the old one's checkpoints.
    std::optional<Job> replaced;
    if (auto it = jobs_.find(request.id); it != jobs_.end()) {
      const JobState* state = machine_.job(request.id);
      if (state != nullptr && !IsTerminal(state->phase)) {
        return absl::AlreadyExistsError(absl::StrCat(
            "job ", request.id, " already exists and is ", JobPhaseName(state->phase),
            ": choose another spec.name (or --set name=...), or cancel it first"));
      }
      replaced = std::move(it->second);
      jobs_.erase(it);
    }
    // A rank no registered node could hold would wait for ever: refused, with the numbers.
    if (const int64_t largest = machine_.LargestNodeMemory(Now());
        largest > 0 && request.memory_per_rank > largest) {
      return absl::InvalidArgumentError(absl::StrCat(
          "resources.memory_per_rank_mib: a rank of job ", request.id, " needs ",
          request.memory_per_rank >> 20, " MiB, and the largest node has ", largest >> 20,
          " MiB; make the model smaller, shard its state (parallelism.zero_stage) or add "
          "larger nodes"));
    }
    *jobs_[request.id].mutable_spec() = spec;
    std::vector<Action> actions;
    absl::Status s = machine_.SubmitJob(request, Now(), &actions);
    if (!s.ok()) {
      jobs_.erase(request.id);
      if (replaced) jobs_[request.id] = *std::move(replaced);
      return s;
    }
    if (replaced) {
      LOG(INFO) << "coordinator: job " << request.id << " submitted again: replaces the "
                << JobPhaseName(PhaseFromProto(replaced->phase())) << " one";
      ForgetJob(request.id);
    }
    Apply(actions, &completions);
    result = jobs_[request.id];
  }
  Run(completions);
  return result;
}

absl::StatusOr<Job> Coordinator::Get(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto job = FindJob(id);
  if (!job.ok()) return job.status();
  return **job;
}

absl::StatusOr<ListJobsResponse> Coordinator::List(const ListJobsRequest& request) {
  const int page_size = request.page_size() <= 0 ? kDefaultPageSize
                                                 : std::min(request.page_size(), kMaxPageSize);
  absl::MutexLock lock(&mu_);
  const std::vector<std::string> ids = machine_.job_ids();
  auto it = ids.begin();
  if (!request.page_token().empty()) {
    it = std::find(ids.begin(), ids.end(), request.page_token());
    if (it == ids.end()) {
      return absl::InvalidArgumentError(
          "page_token names no job (it was deleted meanwhile): list again from the start");
    }
    ++it;
  }
  ListJobsResponse response;
  size_t bytes = 0;
  for (; it != ids.end(); ++it) {
    const Job& job = jobs_[*it];
    const bool finished = job.phase() == JOB_PHASE_SUCCEEDED || job.phase() == JOB_PHASE_FAILED ||
                          job.phase() == JOB_PHASE_CANCELLED;
    if (finished && !request.include_finished()) continue;
    if (response.jobs_size() >= page_size ||
        (response.jobs_size() > 0 && bytes + job.ByteSizeLong() > kMaxResponseBytes)) {
      response.set_next_page_token(response.jobs(response.jobs_size() - 1).id());
      break;
    }
    bytes += job.ByteSizeLong();
    *response.add_jobs() = job;
  }
  return response;
}

absl::StatusOr<Job> Coordinator::Cancel(const std::string& id) {
  RM_RETURN_IF_ERROR(Decide([&](std::vector<Action>* actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return machine_.CancelJob(id, Now(), actions);
  }));
  return Get(id);
}

void Coordinator::WatchNext(const std::string& job, int64_t after_version, absl::Time deadline,
                            Done<JobEvent> done) {
  Completions completions;
  {
    absl::MutexLock lock(&mu_);
    watches_.push_back(WatchWaiter{job, after_version, deadline, std::move(done)});
    Resolve(&completions);
  }
  Run(completions);
}

void Coordinator::ForgetJob(const std::string& id) {
  kv_.erase(id);
  rank_stats_.erase(id);
  slow_reports_.erase(id);
  leaving_.erase(id);
  world_.erase(id);
  history_.erase(id);
}

absl::StatusOr<DeleteJobResponse> Coordinator::Delete(const std::string& id) {
  Completions completions;
  DeleteJobResponse response;
  {
    absl::MutexLock lock(&mu_);
    auto job = FindJob(id);
    if (!job.ok()) return job.status();
    const JobState* state = machine_.job(id);
    if (state != nullptr && !IsTerminal(state->phase)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", id, " is ", JobPhaseName(state->phase), ": cancel it first (ringctl cancel ",
          id, ")"));
    }
    const std::string& dir = (*job)->spec().checkpoint().dir();
    if (!dir.empty()) response.set_checkpoints_kept(absl::StrCat(dir, "/", id));
    // The database first: a job the store still holds must not vanish from memory only.
    RM_RETURN_IF_ERROR(store_->Delete(id));
    if (state != nullptr) RM_RETURN_IF_ERROR(machine_.DeleteJob(id));
    jobs_.erase(id);
    ForgetJob(id);
    // Its agents remove the job's files (spec, tokens, logs) once its trainers are gone.
    for (const Membership::NodeView& node : machine_.Nodes(Now())) {
      AgentCommand forget;
      forget.mutable_forget()->set_job(id);
      commands_[node.node].push_back(std::move(forget));
    }
    LOG(INFO) << "coordinator: job " << id << " deleted";
    Resolve(&completions);  // its watchers learn that it is gone
  }
  Run(completions);
  return response;
}

ListNodesResponse Coordinator::ListNodes() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = Now();
  ListNodesResponse response;
  for (const Membership::NodeView& view : machine_.Nodes(now)) {
    NodeInfo* node = response.add_nodes();
    node->set_node(view.node);
    node->set_draining(view.draining);
    node->set_awaiting_agent(view.restored);
    node->set_lease_left_s(absl::ToDoubleSeconds(view.lease_expiry - now));
    node->set_last_heartbeat_age_s(-1);
    const AgentInfo* agent = nullptr;
    if (auto it = agents_.find(view.node); it != agents_.end()) {
      agent = &it->second;
      node->set_address(agent->address);
      node->set_log_address(agent->log_address);
      if (agent->last_seen != absl::InfinitePast()) {
        node->set_last_heartbeat_age_s(absl::ToDoubleSeconds(now - agent->last_seen));
      }
    }
    for (int s = 0; s < view.slots; ++s) {
      SlotInfo* slot = node->add_slots();
      slot->set_slot(s);
      slot->set_rank(-1);
      if (agent != nullptr && s < static_cast<int>(agent->gpus.size())) {
        slot->set_gpu(agent->gpus[s]);
      }
      if (auto it = view.assigned.find(s); it != view.assigned.end()) {
        slot->set_job(it->second);
        if (const JobState* job = machine_.job(it->second); job != nullptr) {
          for (const Member& m : job->members) {
            if (m.slot == SlotRef{view.node, s}) slot->set_rank(m.rank);
          }
        }
      }
      if (auto it = view.exiting.find(s); it != view.exiting.end()) {
        slot->set_exiting_job(it->second);
      }
      if (auto it = view.backoff_until.find(s); it != view.backoff_until.end()) {
        slot->set_backoff_s(absl::ToDoubleSeconds(it->second - now));
      }
    }
  }
  return response;
}

CoordinatorSnapshot Coordinator::Snapshot() {
  CoordinatorSnapshot snapshot;
  snapshot.nodes = ListNodes();
  absl::MutexLock lock(&mu_);
  snapshot.taken = Now();
  for (const std::string& id : machine_.job_ids()) {
    snapshot.jobs.push_back(jobs_[id]);
    if (auto it = rank_stats_.find(id); it != rank_stats_.end()) {
      std::vector<RankStats>& ranks = snapshot.ranks[id];
      for (const auto& [rank, stats] : it->second) ranks.push_back(stats);
    }
  }
  for (const auto& [node, agent] : agents_) {
    if (agent.heartbeat_rtt_s > 0) snapshot.heartbeat_rtt_s[node] = agent.heartbeat_rtt_s;
  }
  return snapshot;
}

absl::StatusOr<Coordinator::LogSource> Coordinator::FindLog(const LogsRequest& r) {
  absl::MutexLock lock(&mu_);
  auto found = FindJob(r.job());
  if (!found.ok()) return found.status();
  const Job& job = **found;
  LogSource source;
  if (r.has_slot()) {
    source.slot = r.slot();
  } else {
    const int rank = r.target_case() == LogsRequest::kRank ? r.rank() : 0;
    if (job.rank_slots_size() == 0) {
      return absl::NotFoundError(absl::StrCat(
          "job ", r.job(), " has no ranks yet (", JobPhaseName(PhaseFromProto(job.phase())),
          job.reason().empty() ? "" : absl::StrCat(": ", job.reason()),
          "); name a slot (--slot NODE/SLOT) to read the log of a trainer that was started"));
    }
    if (rank < 0 || rank >= job.rank_slots_size()) {
      return absl::NotFoundError(absl::StrCat("job ", r.job(), " has no rank ", rank,
                                              ": its ranks are 0 to ",
                                              job.rank_slots_size() - 1));
    }
    source.slot = job.rank_slots(rank);
  }
  const std::string where =
      absl::StrCat("the log is on node ", source.slot.node(), " in its agent's work directory, at ",
                   r.job(), "/slot-", source.slot.slot(), ".log");
  auto agent = agents_.find(source.slot.node());
  if (agent == agents_.end()) {
    return absl::UnavailableError(absl::StrCat("the agent of node ", source.slot.node(),
                                               " has not registered since the coordinator "
                                               "started; ", where));
  }
  if (agent->second.log_address.empty()) {
    return absl::UnavailableError(absl::StrCat("the agent of node ", source.slot.node(),
                                               " serves no logs (ringworker --log_listen); ",
                                               where));
  }
  source.log_address = agent->second.log_address;
  return source;
}

// ---------------------------------------------------------------------------------------
// Agents.

std::string Coordinator::NodeCredentialFor(const std::string& node) const {
  return NodeCredential(secret_, node);
}

absl::StatusOr<RegisterNodeResponse> Coordinator::RegisterNode(const RegisterNodeRequest& r) {
  RM_RETURN_IF_ERROR(ValidateAgentInfo(r));
  RM_RETURN_IF_ERROR(Decide([&](std::vector<Action>* actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (machine_.HoldsNode(r.node(), Now())) {
      if (absl::Status s = CheckNodeCredential(secret_, r.node(), r.node_credential()); !s.ok()) {
        return absl::PermissionDeniedError(absl::StrCat(
            "node ", r.node(), " is registered and its lease is live; only its own agent may "
            "register it again (its credential is in that agent's work directory). Give this "
            "node another --node name, or stop the other agent and wait ",
            absl::FormatDuration(options_.membership.lease), " for its lease to lapse"));
      }
    }
    RM_RETURN_IF_ERROR(machine_.RegisterNode(r.node(), r.slots(), Now(), actions, r.memory_bytes()));
    agents_[r.node()] = AgentInfo{r.address(), r.log_address(),
                                  {r.gpus().begin(), r.gpus().end()}, Now()};
    return absl::OkStatus();
  }));
  RegisterNodeResponse response;
  response.set_node_credential(NodeCredentialFor(r.node()));
  response.set_heartbeat_interval_s(absl::ToDoubleSeconds(options_.heartbeat_interval));
  response.set_lease_s(absl::ToDoubleSeconds(options_.membership.lease));
  return response;
}

absl::StatusOr<HeartbeatResponse> Coordinator::Heartbeat(const HeartbeatRequest& r) {
  RM_RETURN_IF_ERROR(CheckNodeCredential(secret_, r.node(), r.node_credential()));
  if (r.trainers_size() > kMaxSlotsPerNode) {
    return absl::InvalidArgumentError(absl::StrCat("trainers: at most ", kMaxSlotsPerNode,
                                                   " entries, got ", r.trainers_size()));
  }
  Completions completions;
  HeartbeatResponse response;
  {
    absl::MutexLock lock(&mu_);
    std::vector<Action> actions;
    std::vector<std::pair<int, std::string>> running;
    for (const RunningTrainer& t : r.trainers()) running.emplace_back(t.slot(), t.job());
    if (absl::Status s = machine_.Heartbeat(r.node(), running, Now(), &actions); !s.ok()) {
      return s;
    }
    agents_[r.node()].last_seen = Now();
    if (const double rtt = r.last_heartbeat_rtt_s(); rtt > 0 && rtt < 3600) {
      agents_[r.node()].heartbeat_rtt_s = rtt;
    }
    // Stops of stale trainers, and the placements that slots freed by this heartbeat allow.
    Apply(actions, &completions);
    auto it = commands_.find(r.node());
    if (it != commands_.end()) {
      // In order, as many as one answer carries; the rest go with the next heartbeat.
      std::vector<AgentCommand>& queued = it->second;
      size_t taken = 0, bytes = 0;
      for (; taken < queued.size(); ++taken) {
        bytes += queued[taken].ByteSizeLong();
        if (taken > 0 && bytes > kMaxResponseBytes) break;
        *response.add_commands() = std::move(queued[taken]);
      }
      queued.erase(queued.begin(), queued.begin() + taken);
      if (queued.empty()) commands_.erase(it);
    }
  }
  Run(completions);
  return response;
}

absl::Status Coordinator::DrainNode(const DrainNodeRequest& r) {
  RM_RETURN_IF_ERROR(CheckNodeCredential(secret_, r.node(), r.node_credential()));
  return Decide([&](std::vector<Action>* actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (r.preemption_notice()) preemptions_.Record(Now());
    return machine_.DrainNode(r.node(), Now(), actions);
  });
}

absl::Status Coordinator::TrainerExited(const TrainerExitedRequest& r) {
  RM_RETURN_IF_ERROR(CheckNodeCredential(secret_, r.node(), r.node_credential()));
  return Decide([&](std::vector<Action>* actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return machine_.TrainerExited(SlotRef{r.node(), r.slot()}, r.job(), r.exit_code(), Now(),
                                  actions, ExitDetail(r), r.stopped(), r.start_epoch());
  });
}

// ---------------------------------------------------------------------------------------
// Trainers.

void Coordinator::Join(const JoinRequest& r, absl::Time deadline, Done<JoinResponse> done) {
  Completions completions;
  absl::Status error;
  {
    absl::MutexLock lock(&mu_);
    std::vector<Action> actions;
    error = machine_.Join(r.job(), r.epoch(), FromProto(r.slot()), Now(), &actions);
    if (error.ok()) {
      joins_.push_back(JoinWaiter{r, deadline, std::move(done)});
      Apply(actions, &completions);
    }
  }
  if (!error.ok()) {
    done(error);
    return;
  }
  Run(completions);
}

absl::Status Coordinator::Ready(const ReadyRequest& r) {
  Completions completions;
  {
    absl::MutexLock lock(&mu_);
    std::vector<Action> actions;
    absl::Status s = machine_.Ready(r.job(), r.epoch(), FromProto(r.slot()), Now(), &actions);
    if (!s.ok()) return s;
    // The recovery's restore phase ends when the job runs again.
    const JobState* state = machine_.job(r.job());
    Job& job = jobs_[r.job()];
    if (state->phase == JobPhase::kRunning && job.recoveries_size() > 0) {
      Recovery* rec = job.mutable_recoveries(job.recoveries_size() - 1);
      if (rec->epoch() == r.epoch() && rec->restore_s() == 0) {
        rec->set_restore_s(absl::ToDoubleSeconds(Now() - FromMs(rec->began_ms())) -
                           rec->rendezvous_s());
      }
    }
    RecordRestore(job, r);
    Apply(actions, &completions);
  }
  Run(completions);
  return absl::OkStatus();
}

absl::StatusOr<ProgressResponse> Coordinator::Progress(const ProgressRequest& r) {
  Completions completions;
  ProgressResponse response;
  {
    absl::MutexLock lock(&mu_);
    std::vector<Action> actions;
    const SlotRef slot = FromProto(r.slot());
    const JobState* state = machine_.job(r.job());
    if (state == nullptr) return absl::NotFoundError(absl::StrCat("no job \"", r.job(), "\""));
    if (IsTerminal(state->phase)) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", r.job(), " is ", JobPhaseName(state->phase), ": stop"));
    }
    // A report without a step (step < 0, sent while a step takes long) still shows that
    // the trainer process is alive: a stopped or frozen process sends nothing and is hung
    // after hang_timeout. (A trainer alive but blocked in a collective is not hung: its
    // peers' collectives time out and they report the error.)
    const bool stale = r.epoch() < state->epoch;
    if (!stale) {
      RM_RETURN_IF_ERROR(machine_.Progress(r.job(), r.epoch(), slot, r.stats().step(), Now(),
                                           &actions,
                                           absl::Seconds(std::max(0.0, r.stats().step_time_s()))));
    }
    response.set_epoch(state->epoch);
    {
      // The cluster's preemptions per node-hour, times the nodes this job runs on.
      std::set<std::string> nodes;
      for (const ringmaster::Member& m : jobs_[r.job()].members()) nodes.insert(m.slot().node());
      response.set_preemption_rate_per_hour(
          preemptions_.PerNodeHour(Now(), static_cast<int>(agents_.size())) *
          static_cast<double>(std::max<size_t>(1, nodes.size())));
    }
    if (stale) {
      // A newer epoch forms: leavers save and exit; the others save when newcomers need
      // the current state (drain, growth) and their ring is still whole.
      response.set_leave(leaving_[r.job()].count(slot) > 0);
      response.set_save_now(state->cause == EpochCause::kDrain ||
                            state->cause == EpochCause::kGrow);
    } else if (r.stats().step() >= 0) {
      Job& job = jobs_[r.job()];
      RecordStep(job, slot, r.stats(), r.total_steps());
      UpdateStragglers(job);
      if (!r.checkpoint_error().empty()) {
        // A failed save, as rank 0 tells it (its cause and path), bounded like every
        // stored text.
        job.set_checkpoint_error_step(r.checkpoint_error_step());
        job.set_checkpoint_error(Bounded(r.checkpoint_error()));
      }
      for (ringmaster::Member& m : *job.mutable_members()) {
        if (FromProto(m.slot()) == slot) {
          m.set_step(r.stats().step());
          m.set_last_progress_ms(Ms(Now()));
        }
      }
      // The first step of a new epoch closes its recovery's timeline.
      if (job.recoveries_size() > 0) {
        Recovery* rec = job.mutable_recoveries(job.recoveries_size() - 1);
        if (rec->epoch() == r.epoch() && rec->first_step_s() == 0 && rec->restore_s() > 0) {
          rec->set_first_step_s(absl::ToDoubleSeconds(Now() - FromMs(rec->began_ms())) -
                                rec->rendezvous_s() - rec->restore_s());
          // The first step taken after restoring is step() (1-based): the epoch started
          // from step() - 1.
          if (rec->resumed_from().empty()) {  // the trainers did not say (RecordRestore)
            rec->set_lost_steps(
                std::max<int64_t>(0, rec->step_before() - (r.stats().step() - 1)));
          }
        }
      }
      Bump(job);
      Resolve(&completions);
    }
  }
  Run(completions);
  return response;
}

void Coordinator::RecordRestore(Job& job, const ReadyRequest& r) {
  if (r.restored_from().empty() || job.recoveries_size() == 0) return;
  Recovery* rec = job.mutable_recoveries(job.recoveries_size() - 1);
  // The first trainer to say it (every rank restores the same step).
  if (rec->epoch() != r.epoch() || !rec->resumed_from().empty()) return;
  rec->set_resumed_from_step(r.restored_step());
  rec->set_resumed_from(Bounded(r.restored_from()));
  rec->set_lost_because(Bounded(r.restore_note()));
  rec->set_lost_steps(std::max<int64_t>(0, rec->step_before() - r.restored_step()));
  Bump(job);
}

void Coordinator::RecordStep(Job& job, const SlotRef& slot, const RankStats& reported,
                             int64_t total_steps) {
  RankStats& stats = rank_stats_[job.id()][reported.rank()];
  stats = reported;
  ToProto(slot, stats.mutable_slot());
  if (reported.rank() == 0 || job.step() < reported.step()) {
    job.set_step(std::max(job.step(), reported.step()));
    job.set_loss(reported.loss());
  }
  // Rank 0's rate as its progress line says it (common/progress_rate.h), so that every view
  // of the job shows the same figure; its samples/s are this times the global batch.
  if (reported.rank() == 0 && reported.steps_per_s() > 0) {
    job.set_steps_per_s(reported.steps_per_s());
  }
  if (total_steps > 0) job.set_total_steps(total_steps);
  if (reported.rank() == 0) {
    HistoryOf(job.id()).AddPoint(JobHistory::Point{
        Now(), job.epoch(), reported.step(), reported.loss(), reported.step_time_s(),
        reported.samples_per_s(), reported.tokens_per_s(), reported.comm_fraction(),
        reported.exposed_comm_fraction()});
  }
}

JobHistory& Coordinator::HistoryOf(const std::string& job) {
  return history_.try_emplace(job, options_.history).first->second;
}

JobHistory::View Coordinator::History(const std::string& job) {
  absl::MutexLock lock(&mu_);
  auto it = history_.find(job);
  return it == history_.end() ? JobHistory::View{} : it->second.Snapshot();
}

void Coordinator::UpdateStragglers(Job& job) {
  // A straggler computes half again as long as the median rank, in kSlowReports reports in a
  // row (one slow step is noise: a page fault, a neighbour's burst).
  constexpr double kSlowdown = 1.5;
  constexpr int kSlowReports = 5;
  std::map<int, RankStats>& ranks = rank_stats_[job.id()];
  if (ranks.size() < 2) return;
  std::vector<double> compute;
  for (const auto& [rank, s] : ranks) {
    compute.push_back(s.step_time_s() * std::clamp(1 - s.comm_fraction(), 0.0, 1.0));
  }
  std::nth_element(compute.begin(), compute.begin() + compute.size() / 2, compute.end());
  const double median = compute[compute.size() / 2];
  if (median <= 0) return;
  job.clear_stragglers();
  for (auto& [rank, s] : ranks) {
    s.set_slowdown(s.step_time_s() * std::clamp(1 - s.comm_fraction(), 0.0, 1.0) / median);
    int& slow = slow_reports_[job.id()][rank];
    slow = s.slowdown() >= kSlowdown ? slow + 1 : 0;
    s.set_straggler(slow >= kSlowReports);
    if (s.straggler()) {
      job.add_stragglers(absl::StrFormat("%s/%d (rank %d, compute %.1fx the median)",
                                         s.slot().node(), s.slot().slot(), rank, s.slowdown()));
    }
  }
}

absl::Status Coordinator::ReportError(const ReportErrorRequest& r) {
  return Decide([&](std::vector<Action>* actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (r.rejoin() && !r.permanent() && !r.node_local()) {
      return machine_.LeaveToRejoin(
          r.job(), r.epoch(), FromProto(r.slot()), Bounded(r.detail()), Now(), actions,
          r.has_failure() ? std::make_optional(FromProto(r.failure(), Now())) : std::nullopt);
    }
    if (r.has_failure()) {
      return machine_.ProgramFailed(r.job(), r.epoch(), FromProto(r.slot()),
                                    FromProto(r.failure(), Now()), Now(), actions,
                                    r.permanent()    ? ErrorScope::kPermanent
                                    : r.node_local() ? ErrorScope::kNodeLocal
                                                     : ErrorScope::kRestartable);
    }
    return machine_.CollectiveError(r.job(), r.epoch(), FromProto(r.slot()), Bounded(r.detail()),
                                    Now(), actions,
                                    r.permanent()    ? ErrorScope::kPermanent
                                    : r.node_local() ? ErrorScope::kNodeLocal
                                                     : ErrorScope::kRestartable);
  });
}

absl::Status Coordinator::Finished(const FinishedRequest& r) {
  return Decide([&](std::vector<Action>* actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // The last step's figures first: the job's end (persisted below) keeps them.
    const JobState* state = machine_.job(r.job());
    if (r.stats().step() >= 0 && r.has_stats() && state != nullptr && !IsTerminal(state->phase) &&
        state->epoch == r.epoch()) {
      RecordStep(jobs_[r.job()], FromProto(r.slot()), r.stats(), r.total_steps());
    }
    return machine_.Finished(r.job(), r.epoch(), FromProto(r.slot()), Now(), actions);
  });
}

absl::Status Coordinator::ReportCheckpoint(const ReportCheckpointRequest& r) {
  // Bounds of what is stored: a path as long as Linux's PATH_MAX, and the newest entries.
  constexpr size_t kMaxCheckpointPath = 4096;
  constexpr int kMaxCheckpointsListed = 100;
  const CheckpointInfo& c = r.checkpoint();
  if (c.step() < 0) return absl::InvalidArgumentError("checkpoint.step must be >= 0");
  if (c.world_size() < 1 || c.bytes() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint.world_size must be >= 1 and checkpoint.bytes >= 0, got ",
                     c.world_size(), " and ", c.bytes()));
  }
  if (c.path().empty() || c.path().size() > kMaxCheckpointPath) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint.path must be 1 to ", kMaxCheckpointPath, " bytes, got ", c.path().size()));
  }
  Completions completions;
  {
    absl::MutexLock lock(&mu_);
    RM_RETURN_IF_ERROR(machine_.CheckLiveEpoch(r.job(), r.epoch()));
    auto job = FindJob(r.job());
    if (!job.ok()) return job.status();
    // Newest last; a step reported again (the latest, at the start of an epoch) replaces
    // its entry.
    auto* list = (*job)->mutable_checkpoints();
    for (int i = 0; i < list->size(); ++i) {
      if (list->Get(i).step() == c.step()) {
        list->DeleteSubrange(i, 1);
        break;
      }
    }
    *list->Add() = c;
    std::stable_sort(
        list->begin(), list->end(),
        [](const CheckpointInfo& a, const CheckpointInfo& b) { return a.step() < b.step(); });
    if (list->size() > kMaxCheckpointsListed) {
      list->DeleteSubrange(0, list->size() - kMaxCheckpointsListed);
    }
    Bump(**job);
    if (absl::Status s = store_->Put(**job); !s.ok()) return s;
    Resolve(&completions);
  }
  Run(completions);
  return absl::OkStatus();
}

absl::Status Coordinator::StoreSet(const StoreSetRequest& r) {
  if (static_cast<int64_t>(r.value().size()) > options_.max_store_value_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("value of store key ", r.key(), " is ",
                                                   r.value().size(), " bytes; at most ",
                                                   options_.max_store_value_bytes));
  }
  RM_RETURN_IF_ERROR(ValidateStoreKey(r.key()));
  Completions completions;
  {
    absl::MutexLock lock(&mu_);
    RM_RETURN_IF_ERROR(CheckStoreCaller(r.job(), r.epoch()));
    auto& kv = kv_[r.job()];
    if (static_cast<int64_t>(kv.size()) >= options_.max_store_keys && !kv.count(r.key())) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "job ", r.job(), " has ", kv.size(), " store keys already (the limit)"));
    }
    kv[r.key()] = r.value();
    Resolve(&completions);
  }
  Run(completions);
  return absl::OkStatus();
}

void Coordinator::StoreGet(const StoreGetRequest& r, absl::Time deadline,
                           Done<StoreGetResponse> done) {
  if (r.keys().empty()) {
    done(absl::InvalidArgumentError("keys is empty"));
    return;
  }
  Completions completions;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckStoreCaller(r.job(), r.epoch()); !s.ok()) {
      completions.push_back([done, s] { done(s); });
    } else {
      store_waiters_.push_back(StoreWaiter{r, deadline, std::move(done)});
      Resolve(&completions);
    }
  }
  Run(completions);
}

absl::Status Coordinator::CheckStoreCaller(const std::string& job, int64_t epoch) {
  // Every trainer sends the epoch it joined, and epochs start at 1. Epoch 0 once meant "not
  // checked" (for trainers older than the field): a caller from any epoch could write into
  // the current one's bootstrap keys.
  if (epoch < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "epoch ", epoch, " of job ", job, ": a store call must carry the membership epoch "
        "its trainer joined (JoinResponse.epoch, 1 or more)"));
  }
  return machine_.CheckLiveEpoch(job, epoch);
}

absl::StatusOr<StoreAddResponse> Coordinator::StoreAdd(const StoreAddRequest& r) {
  RM_RETURN_IF_ERROR(ValidateStoreKey(r.key()));
  Completions completions;
  StoreAddResponse response;
  {
    absl::MutexLock lock(&mu_);
    RM_RETURN_IF_ERROR(CheckStoreCaller(r.job(), r.epoch()));
    auto& kv = kv_[r.job()];
    auto it = kv.find(r.key());
    if (it == kv.end() && static_cast<int64_t>(kv.size()) >= options_.max_store_keys) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "job ", r.job(), " has ", kv.size(), " store keys already (the limit)"));
    }
    int64_t current = 0;
    if (it != kv.end() && !absl::SimpleAtoi(it->second, &current)) {
      return absl::FailedPreconditionError(
          absl::StrCat("store key ", r.key(), " does not hold an integer"));
    }
    if (__builtin_add_overflow(current, r.delta(), &current)) {
      return absl::OutOfRangeError(absl::StrCat("store key ", r.key(), ": adding ", r.delta(),
                                                " to its value would overflow int64"));
    }
    kv[r.key()] = absl::StrCat(current);
    response.set_value(current);
    Resolve(&completions);
  }
  Run(completions);
  return response;
}

void Coordinator::Tick() {
  // Apply also expires the waiting calls.
  Decide([&](std::vector<Action>* actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    machine_.Tick(Now(), actions);
    return absl::OkStatus();
  }).IgnoreError();
}

}  // namespace ringmaster::coordinator
