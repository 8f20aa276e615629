#include "coordinator/metrics.h"

#include <charconv>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/progress_rate.h"

namespace ringmaster::coordinator {
namespace {

using Labels = std::vector<std::pair<const char*, std::string>>;

// Go's ParseFloat reads what this writes: the shortest text that reads back exactly.
std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buffer[32];
  const auto [end, ec] = std::to_chars(buffer, buffer + sizeof(buffer), v);
  return std::string(buffer, end);
}

// Appends families to the exposition: each family's HELP and TYPE, then its samples.
class Writer {
 public:
  explicit Writer(std::string* out) : out_(out) {}

  void Family(absl::string_view name, absl::string_view type, absl::string_view help) {
    name_ = std::string(name);
    absl::StrAppend(out_, "# HELP ", name_, " ",
                    absl::StrReplaceAll(help, {{"\\", "\\\\"}, {"\n", "\\n"}}), "\n# TYPE ",
                    name_, " ", type, "\n");
  }
  // A sample of the current family; `suffix` is "_sum" or "_count" for a summary's.
  void Sample(const Labels& labels, double value, absl::string_view suffix = "") {
    absl::StrAppend(out_, name_, suffix);
    if (!labels.empty()) {
      out_->push_back('{');
      for (size_t i = 0; i < labels.size(); ++i) {
        absl::StrAppend(out_, i > 0 ? "," : "", labels[i].first, "=\"",
                        EscapeLabelValue(labels[i].second), "\"");
      }
      out_->push_back('}');
    }
    absl::StrAppend(out_, " ", FormatValue(value), "\n");
  }

 private:
  std::string* out_;
  std::string name_;
};

// "JOB_PHASE_RUNNING" → "running".
std::string PhaseLabel(ringmaster::JobPhase phase) {
  std::string name = JobPhase_Name(phase);
  constexpr absl::string_view kPrefix = "JOB_PHASE_";
  if (absl::StartsWith(name, kPrefix)) name = name.substr(kPrefix.size());
  return absl::AsciiStrToLower(name);
}

// A job with its ranks' reports: what the per-job figures are computed from.
struct JobView {
  const Job* job;
  const std::vector<RankStats>* ranks;  // may be empty
  // Rank 0's report (its throughput counts every rank, as the progress line does); null
  // before it has reported.
  const RankStats* rank0 = nullptr;
};

// The mean of a per-rank figure over the ranks that reported; nullopt when none did.
std::optional<double> MeanOverRanks(const JobView& v, double (RankStats::*field)() const) {
  if (v.ranks->empty()) return std::nullopt;
  double sum = 0;
  for (const RankStats& r : *v.ranks) sum += (r.*field)();
  return sum / v.ranks->size();
}

std::optional<double> FromRank0(const JobView& v, double (RankStats::*field)() const) {
  if (v.rank0 == nullptr) return std::nullopt;
  return (v.rank0->*field)();
}

struct JobFigure {
  const char* name;
  const char* type;
  const char* help;
  std::function<std::optional<double>(const JobView&)> value;  // nullopt: no sample
};

std::vector<JobFigure> JobFigures() {
  using R = RankStats;
  return {
      {"ringmaster_job_members", "gauge", "Trainers in the job's current epoch.",
       [](const JobView& v) { return std::optional<double>(v.job->members_size()); }},
      {"ringmaster_job_epoch", "gauge",
       "The job's current membership epoch: its rendezvous round, grown with every "
       "re-formation (not a pass over the data: the trainers' data_epoch).",
       [](const JobView& v) { return std::optional<double>(v.job->epoch()); }},
      {"ringmaster_job_restarts_total", "counter",
       "Restarts after failures the job has used of its restart budget.",
       [](const JobView& v) { return std::optional<double>(v.job->restarts()); }},
      {"ringmaster_job_step", "gauge", "The last training step the job reported.",
       [](const JobView& v) { return std::optional<double>(v.job->step()); }},
      {"ringmaster_job_total_steps", "gauge", "The steps the job trains for (0: not known yet).",
       [](const JobView& v) { return std::optional<double>(v.job->total_steps()); }},
      {"ringmaster_job_loss", "gauge", "The training loss of the last reported step.",
       [](const JobView& v) {
         return v.job->step() > 0 ? std::optional<double>(v.job->loss()) : std::nullopt;
       }},
      {"ringmaster_job_steps_per_second", "gauge",
       "Training steps per second as rank 0's progress line says it, over the last 30 s of "
       "steps (common/progress_rate.h; 0: not measured yet in this membership epoch).",
       [](const JobView& v) { return std::optional<double>(v.job->steps_per_s()); }},
      {"ringmaster_job_eta_seconds", "gauge",
       "Seconds until the last step at ringmaster_job_steps_per_second (running jobs whose "
       "rate and length are known).",
       [](const JobView& v) -> std::optional<double> {
         if (v.job->phase() != ringmaster::JOB_PHASE_RUNNING) return std::nullopt;
         return EtaSeconds(v.job->step(), v.job->total_steps(), v.job->steps_per_s());
       }},
      {"ringmaster_job_samples_per_second", "gauge",
       "Samples per second, all ranks together: ringmaster_job_steps_per_second times the "
       "global batch (rank 0's, from the same window).",
       [](const JobView& v) { return FromRank0(v, &R::samples_per_s); }},
      {"ringmaster_job_tokens_per_second", "gauge",
       "Tokens per second, all ranks together: samples per second times the context "
       "(language models; 0 otherwise).",
       [](const JobView& v) { return FromRank0(v, &R::tokens_per_s); }},
      {"ringmaster_job_learning_rate", "gauge", "The learning rate of the last step (rank 0's).",
       [](const JobView& v) { return FromRank0(v, &R::lr); }},
      {"ringmaster_job_loss_scale", "gauge", "fp16's loss scale (0: the job has none).",
       [](const JobView& v) { return FromRank0(v, &R::loss_scale); }},
      {"ringmaster_job_comm_fraction", "gauge",
       "Share of the step time spent in collectives, the ranks' mean.",
       [](const JobView& v) { return MeanOverRanks(v, &R::comm_fraction); }},
      {"ringmaster_job_exposed_comm_fraction", "gauge",
       "Share of the step time the training thread waited for collectives (not overlapped), "
       "the ranks' mean.",
       [](const JobView& v) { return MeanOverRanks(v, &R::exposed_comm_fraction); }},
      {"ringmaster_job_lost_steps_total", "counter",
       "Steps trained again after recoveries (a lower bound; measured ones only).",
       [](const JobView& v) {
         double lost = 0;
         for (const Recovery& r : v.job->recoveries()) lost += std::max<int64_t>(0, r.lost_steps());
         return std::optional<double>(lost);
       }},
      {"ringmaster_job_checkpoints", "gauge", "Committed checkpoints the job lists.",
       [](const JobView& v) { return std::optional<double>(v.job->checkpoints_size()); }},
      {"ringmaster_job_checkpoint_step", "gauge", "The step of the newest committed checkpoint.",
       [](const JobView& v) -> std::optional<double> {
         if (v.job->checkpoints().empty()) return std::nullopt;
         return v.job->checkpoints().rbegin()->step();
       }},
      {"ringmaster_job_checkpoint_bytes", "gauge", "The size of the newest committed checkpoint.",
       [](const JobView& v) -> std::optional<double> {
         if (v.job->checkpoints().empty()) return std::nullopt;
         return v.job->checkpoints().rbegin()->bytes();
       }},
      {"ringmaster_job_checkpoint_save_seconds", "gauge",
       "How long the newest checkpoint took, from its step to its commit (0: not measured).",
       [](const JobView& v) -> std::optional<double> {
         if (v.job->checkpoints().empty()) return std::nullopt;
         return v.job->checkpoints().rbegin()->save_seconds();
       }},
      {"ringmaster_job_checkpoint_blocked_seconds", "gauge",
       "How long the newest checkpoint blocked the training loop (0: not measured).",
       [](const JobView& v) -> std::optional<double> {
         if (v.job->checkpoints().empty()) return std::nullopt;
         return v.job->checkpoints().rbegin()->blocked_seconds();
       }},
      {"ringmaster_job_checkpoint_timestamp_seconds", "gauge",
       "When the newest checkpoint was committed, seconds since the Unix epoch.",
       [](const JobView& v) -> std::optional<double> {
         if (v.job->checkpoints().empty()) return std::nullopt;
         return v.job->checkpoints().rbegin()->committed_ms() / 1e3;
       }},
      {"ringmaster_job_checkpoint_error", "gauge",
       "1 when the job's last failed checkpoint save is recorded (Job.checkpoint_error).",
       [](const JobView& v) {
         return std::optional<double>(v.job->checkpoint_error().empty() ? 0 : 1);
       }},
      {"ringmaster_job_checkpoint_error_step", "gauge",
       "The step whose checkpoint save failed last.",
       [](const JobView& v) -> std::optional<double> {
         if (v.job->checkpoint_error().empty()) return std::nullopt;
         return v.job->checkpoint_error_step();
       }},
  };
}

struct RankFigure {
  const char* name;
  const char* help;
  std::function<double(const RankStats&)> value;
};

std::vector<RankFigure> RankFigures() {
  return {
      {"ringmaster_rank_step", "The last step the rank reported.",
       [](const RankStats& r) { return r.step(); }},
      {"ringmaster_rank_step_seconds", "The rank's last step time.",
       [](const RankStats& r) { return r.step_time_s(); }},
      {"ringmaster_rank_loss", "The rank's loss at its last step.",
       [](const RankStats& r) { return r.loss(); }},
      {"ringmaster_rank_comm_fraction", "Share of the rank's step time in collectives.",
       [](const RankStats& r) { return r.comm_fraction(); }},
      {"ringmaster_rank_exposed_comm_fraction",
       "Share of the rank's step time its training thread waited for collectives.",
       [](const RankStats& r) { return r.exposed_comm_fraction(); }},
      {"ringmaster_rank_slowdown", "The rank's compute time over the ranks' median.",
       [](const RankStats& r) { return r.slowdown(); }},
      {"ringmaster_rank_straggler", "1 when the rank is consistently slower than the others.",
       [](const RankStats& r) { return r.straggler() ? 1 : 0; }},
      {"ringmaster_rank_samples_per_second", "Samples per second as the rank measured them.",
       [](const RankStats& r) { return r.samples_per_s(); }},
      {"ringmaster_rank_tokens_per_second", "Tokens per second as the rank measured them.",
       [](const RankStats& r) { return r.tokens_per_s(); }},
      {"ringmaster_rank_process_steps", "Steps the rank's trainer process has taken.",
       [](const RankStats& r) { return r.process_steps(); }},
  };
}

struct CommFigure {
  const char* name;
  const char* help;
  std::function<double(const CommOpStats&)> value;
};

std::vector<CommFigure> CommFigures() {
  return {
      {"ringmaster_comm_calls_total", "Operations of a kind on a rank's communicator.",
       [](const CommOpStats& c) { return c.calls(); }},
      {"ringmaster_comm_errors_total", "Operations that failed.",
       [](const CommOpStats& c) { return c.errors(); }},
      {"ringmaster_comm_sent_bytes_total", "Payload bytes the rank sent (measured).",
       [](const CommOpStats& c) { return c.bytes_sent(); }},
      {"ringmaster_comm_received_bytes_total", "Payload bytes the rank received (measured).",
       [](const CommOpStats& c) { return c.bytes_received(); }},
      {"ringmaster_comm_seconds_total", "Wall time inside the operations.",
       [](const CommOpStats& c) { return c.seconds(); }},
      {"ringmaster_comm_formula_sent_bytes_total",
       "Bytes the algorithm sends for these calls by its formula, e.g. 2(N-1)/N x B for a "
       "ring all-reduce (0 where none applies).",
       [](const CommOpStats& c) { return c.formula_bytes_sent(); }},
      {"ringmaster_comm_payload_bytes_total", "The calls' buffer sizes, summed.",
       [](const CommOpStats& c) { return c.payload_bytes(); }},
  };
}

struct BucketFigure {
  const char* name;
  const char* type;
  const char* help;
  std::function<double(const BucketStats&)> value;
};

std::vector<BucketFigure> BucketFigures() {
  return {
      {"ringmaster_bucket_calls_total", "counter", "Reductions of a gradient bucket.",
       [](const BucketStats& b) { return b.calls(); }},
      {"ringmaster_bucket_sent_bytes_total", "counter", "Bytes the rank sent for the bucket.",
       [](const BucketStats& b) { return b.bytes_sent(); }},
      {"ringmaster_bucket_seconds_total", "counter", "Wall time of the bucket's reductions.",
       [](const BucketStats& b) { return b.seconds(); }},
      {"ringmaster_bucket_formula_sent_bytes_total", "counter",
       "Bytes the reduction algorithm sends for the bucket by its formula.",
       [](const BucketStats& b) { return b.formula_bytes_sent(); }},
      {"ringmaster_bucket_bytes", "gauge", "The bucket's payload per reduction.",
       [](const BucketStats& b) { return b.bytes(); }},
  };
}

void WriteJobs(const CoordinatorSnapshot& snapshot, Writer& w) {
  static const std::vector<RankStats> kNoRanks;
  std::vector<JobView> views;
  for (const Job& job : snapshot.jobs) {
    JobView v{&job, &kNoRanks};
    if (auto it = snapshot.ranks.find(job.id()); it != snapshot.ranks.end()) {
      v.ranks = &it->second;
      for (const RankStats& r : it->second) {
        if (r.rank() == 0) v.rank0 = &r;
      }
    }
    views.push_back(v);
  }

  w.Family("ringmaster_jobs", "gauge", "Jobs by phase.");
  for (int p = JOB_PHASE_PENDING; p <= JOB_PHASE_CANCELLED; ++p) {
    double n = 0;
    for (const Job& job : snapshot.jobs) n += job.phase() == p ? 1 : 0;
    w.Sample({{"phase", PhaseLabel(static_cast<ringmaster::JobPhase>(p))}}, n);
  }
  w.Family("ringmaster_job_info", "gauge", "1 per job, labelled with its phase.");
  for (const Job& job : snapshot.jobs) {
    w.Sample({{"job", job.id()}, {"phase", PhaseLabel(job.phase())}}, 1);
  }
  for (const JobFigure& figure : JobFigures()) {
    w.Family(figure.name, figure.type, figure.help);
    for (const JobView& v : views) {
      if (std::optional<double> value = figure.value(v)) w.Sample({{"job", v.job->id()}}, *value);
    }
  }

  w.Family("ringmaster_recoveries_total", "counter",
           "Recoveries (re-formations of a job) by cause: failure, drain, grow.");
  for (const Job& job : snapshot.jobs) {
    std::map<std::string, double> by_cause;
    for (const Recovery& r : job.recoveries()) by_cause[r.cause()] += 1;
    for (const auto& [cause, n] : by_cause) w.Sample({{"job", job.id()}, {"cause", cause}}, n);
  }
  w.Family("ringmaster_recovery_phase_seconds", "summary",
           "The phases of recoveries: detect (failure to detection, where the failure time is "
           "known), rendezvous (to the epoch's commit), restore (to every member ready), "
           "first_step (to the new epoch's first step); each counted once measured.");
  const std::pair<const char*, double (Recovery::*)() const> kPhases[] = {
      {"detect", &Recovery::detect_s},
      {"rendezvous", &Recovery::rendezvous_s},
      {"restore", &Recovery::restore_s},
      {"first_step", &Recovery::first_step_s},
  };
  for (const Job& job : snapshot.jobs) {
    // cause → phase → (sum, count), in label order.
    std::map<std::string, std::map<std::string, std::pair<double, double>>> phases;
    for (const Recovery& r : job.recoveries()) {
      for (const auto& [phase, field] : kPhases) {
        const double seconds = (r.*field)();
        std::pair<double, double>& sum_count = phases[r.cause()][phase];
        if (seconds > 0) sum_count = {sum_count.first + seconds, sum_count.second + 1};
      }
    }
    for (const auto& [cause, by_phase] : phases) {
      for (const auto& [phase, sum_count] : by_phase) {
        const Labels labels = {{"job", job.id()}, {"cause", cause}, {"phase", phase}};
        w.Sample(labels, sum_count.first, "_sum");
        w.Sample(labels, sum_count.second, "_count");
      }
    }
  }

  w.Family("ringmaster_rank_info", "gauge", "1 per rank of a job's current epoch, with its slot.");
  for (const JobView& v : views) {
    for (const RankStats& r : *v.ranks) {
      w.Sample({{"job", v.job->id()},
                {"rank", absl::StrCat(r.rank())},
                {"node", r.slot().node()},
                {"slot", absl::StrCat(r.slot().slot())}},
               1);
    }
  }
  for (const RankFigure& figure : RankFigures()) {
    w.Family(figure.name, "gauge", figure.help);
    for (const JobView& v : views) {
      for (const RankStats& r : *v.ranks) {
        w.Sample({{"job", v.job->id()}, {"rank", absl::StrCat(r.rank())}}, figure.value(r));
      }
    }
  }
  for (const CommFigure& figure : CommFigures()) {
    w.Family(figure.name, "counter", figure.help);
    for (const JobView& v : views) {
      for (const RankStats& r : *v.ranks) {
        for (const CommOpStats& c : r.comm_ops()) {
          w.Sample({{"job", v.job->id()},
                    {"rank", absl::StrCat(r.rank())},
                    {"group", c.group()},
                    {"op", c.op()}},
                   figure.value(c));
        }
      }
    }
  }
  for (const BucketFigure& figure : BucketFigures()) {
    w.Family(figure.name, figure.type, figure.help);
    for (const JobView& v : views) {
      for (const RankStats& r : *v.ranks) {
        for (const BucketStats& b : r.buckets()) {
          w.Sample({{"job", v.job->id()},
                    {"rank", absl::StrCat(r.rank())},
                    {"bucket", absl::StrCat(b.bucket())}},
                   figure.value(b));
        }
      }
    }
  }
}

// A slot's state: busy (a job's), free (a job could be placed there now), or unavailable
// (its trainer is exiting, it rests after a failure, its node drains or its agent is away).
absl::string_view SlotState(const NodeInfo& node, const SlotInfo& slot) {
  if (!slot.job().empty()) return "busy";
  if (!slot.exiting_job().empty() || slot.backoff_s() > 0 || node.draining() ||
      node.awaiting_agent() || node.lease_left_s() < 0) {
    return "unavailable";
  }
  return "free";
}

void WriteNodes(const CoordinatorSnapshot& snapshot, Writer& w) {
  const char* kStates[] = {"busy", "free", "unavailable"};
  w.Family("ringmaster_nodes", "gauge", "Nodes the coordinator knows.");
  w.Sample({}, snapshot.nodes.nodes_size());
  w.Family("ringmaster_slots", "gauge", "Slots of every node by state: busy, free, unavailable.");
  for (const char* state : kStates) {
    double n = 0;
    for (const NodeInfo& node : snapshot.nodes.nodes()) {
      for (const SlotInfo& slot : node.slots()) n += SlotState(node, slot) == state ? 1 : 0;
    }
    w.Sample({{"state", state}}, n);
  }
  w.Family("ringmaster_node_slots", "gauge", "A node's slots by state.");
  for (const NodeInfo& node : snapshot.nodes.nodes()) {
    for (const char* state : kStates) {
      double n = 0;
      for (const SlotInfo& slot : node.slots()) n += SlotState(node, slot) == state ? 1 : 0;
      w.Sample({{"node", node.node()}, {"state", state}}, n);
    }
  }
  w.Family("ringmaster_node_draining", "gauge", "1 while the node drains.");
  for (const NodeInfo& node : snapshot.nodes.nodes()) {
    w.Sample({{"node", node.node()}}, node.draining() ? 1 : 0);
  }
  w.Family("ringmaster_node_heartbeat_age_seconds", "gauge",
           "Since the node's agent last registered or heartbeat (absent: not since this "
           "coordinator started).");
  for (const NodeInfo& node : snapshot.nodes.nodes()) {
    if (node.last_heartbeat_age_s() >= 0) {
      w.Sample({{"node", node.node()}}, node.last_heartbeat_age_s());
    }
  }
  w.Family("ringmaster_node_lease_left_seconds", "gauge",
           "Until the node's lease expires (negative: expired).");
  for (const NodeInfo& node : snapshot.nodes.nodes()) {
    w.Sample({{"node", node.node()}}, node.lease_left_s());
  }
  w.Family("ringmaster_node_heartbeat_rtt_seconds", "gauge",
           "The round trip of the agent's last heartbeat, as the agent measured it.");
  for (const auto& [node, rtt] : snapshot.heartbeat_rtt_s) w.Sample({{"node", node}}, rtt);
}

}  // namespace

std::string EscapeLabelValue(absl::string_view value) {
  return absl::StrReplaceAll(value, {{"\\", "\\\\"}, {"\"", "\\\""}, {"\n", "\\n"}});
}

std::string PrometheusText(const CoordinatorSnapshot& snapshot) {
  std::string out;
  Writer w(&out);
  WriteJobs(snapshot, w);
  WriteNodes(snapshot, w);
  return out;
}

std::vector<HttpRoute> MonitoringRoutes(Coordinator* coordinator) {
  HttpRoute metrics;
  metrics.path = "/metrics";
  metrics.handler = [coordinator](const HttpRequest&) {
    HttpResponse response;
    response.content_type = kPrometheusContentType;
    response.body = PrometheusText(coordinator->Snapshot());
    return response;
  };
  HttpRoute healthz;
  healthz.path = "/healthz";
  healthz.handler = [](const HttpRequest&) {
    HttpResponse response;
    response.body = "ok\n";
    return response;
  };
  return {metrics, healthz};
}

}  // namespace ringmaster::coordinator
