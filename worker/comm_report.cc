#include "worker/comm_report.h"

#include "absl/time/time.h"
#include "comm/communicator.h"

namespace ringmaster::worker {

void ProcessCommStats::Update(const train::StepReport& report) {
  absl::MutexLock lock(&mu_);
  current_.comm = report.comm;
  current_.buckets = report.buckets;
  current_.steps_run = report.steps_run;
}

void ProcessCommStats::EndEpoch() {
  absl::MutexLock lock(&mu_);
  AddEpoch(current_, &ops_, &buckets_, &steps_);
  current_ = train::StepReport();
}

void ProcessCommStats::AddEpoch(const train::StepReport& report, OpTotals* ops,
                                std::vector<BucketStats>* buckets, int64_t* steps) {
  for (const train::CommGroupCounters& group : report.comm) {
    for (int k = 0; k < comm::kNumOpKinds; ++k) {
      const comm::OpCounters& c = group.counters.ops[k];
      if (c.calls == 0) continue;
      CommOpStats& s = (*ops)[{group.group, k}];
      s.set_group(group.group);
      s.set_op(std::string(comm::OpKindName(static_cast<comm::OpKind>(k))));
      s.set_group_size(group.size);
      s.set_calls(s.calls() + static_cast<int64_t>(c.calls));
      s.set_errors(s.errors() + static_cast<int64_t>(c.errors));
      s.set_bytes_sent(s.bytes_sent() + static_cast<int64_t>(c.bytes_sent));
      s.set_bytes_received(s.bytes_received() + static_cast<int64_t>(c.bytes_received));
      s.set_seconds(s.seconds() + absl::ToDoubleSeconds(c.time));
      s.set_formula_bytes_sent(s.formula_bytes_sent() + static_cast<int64_t>(c.formula_bytes_sent));
      s.set_payload_bytes(s.payload_bytes() + static_cast<int64_t>(c.payload_bytes));
    }
  }
  // A new world size lays the buckets out anew: bucket b's payload is its latest.
  if (buckets->size() < report.buckets.size()) buckets->resize(report.buckets.size());
  for (size_t b = 0; b < report.buckets.size(); ++b) {
    const train::BucketCounters& c = report.buckets[b];
    BucketStats& s = (*buckets)[b];
    s.set_bucket(static_cast<int32_t>(b));
    if (c.payload_bytes > 0) s.set_bytes(c.payload_bytes);
    s.set_calls(s.calls() + static_cast<int64_t>(c.calls));
    s.set_bytes_sent(s.bytes_sent() + static_cast<int64_t>(c.bytes_sent));
    s.set_seconds(s.seconds() + absl::ToDoubleSeconds(c.time));
    s.set_formula_bytes_sent(s.formula_bytes_sent() + static_cast<int64_t>(c.formula_bytes_sent));
  }
  *steps += report.steps_run;
}

void ProcessCommStats::Fill(RankStats* stats) const {
  OpTotals ops;
  std::vector<BucketStats> buckets;
  int64_t steps = 0;
  {
    absl::MutexLock lock(&mu_);
    ops = ops_;
    buckets = buckets_;
    steps = steps_;
    AddEpoch(current_, &ops, &buckets, &steps);
  }
  stats->clear_comm_ops();
  for (auto& [key, op] : ops) *stats->add_comm_ops() = std::move(op);
  stats->clear_buckets();
  for (BucketStats& b : buckets) *stats->add_buckets() = std::move(b);
  stats->set_process_steps(steps);
}

}  // namespace ringmaster::worker
