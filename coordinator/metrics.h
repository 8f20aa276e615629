// The coordinator's figures in Prometheus' text exposition format (version 0.0.4), served at
// /metrics on its HTTP port (http_server.h). A pure function of a CoordinatorSnapshot, so
// one scrape target covers the cluster: the trainers report their figures to the
// coordinator (WorkerService.Progress), the agents their heartbeats.
//
// Families (every name starts with ringmaster_; labels in braces):
//   jobs{phase}                             jobs in each phase (every phase, 0 included)
//   job_info{job,phase}                     1 per job
//   job_members, job_epoch (the membership epoch), job_step, job_total_steps, job_loss,
//   job_steps_per_second, job_eta_seconds (common/progress_rate.h: over the last 30 s of
//   steps, as the progress line says them), job_samples_per_second (steps per second times
//   the global batch), job_tokens_per_second, job_learning_rate, job_loss_scale,
//   job_comm_fraction, job_exposed_comm_fraction (the ranks' mean)            {job}
//   job_restarts_total, job_lost_steps_total, recoveries_total{job,cause}
//   recovery_phase_seconds{job,cause,phase}  summary (_sum, _count) of the recoveries'
//                                            detect, rendezvous, restore and first_step
//                                            phases, each counted once it is measured (> 0)
//   job_checkpoints, job_checkpoint_step, job_checkpoint_bytes,
//   job_checkpoint_save_seconds, job_checkpoint_blocked_seconds,
//   job_checkpoint_timestamp_seconds (the newest), job_checkpoint_error,
//   job_checkpoint_error_step                                                 {job}
//   rank_info{job,rank,node,slot}, rank_step, rank_step_seconds, rank_loss,
//   rank_comm_fraction, rank_exposed_comm_fraction, rank_slowdown, rank_straggler,
//   rank_samples_per_second, rank_tokens_per_second, rank_process_steps      {job,rank}
//   comm_calls_total, comm_errors_total, comm_sent_bytes_total, comm_received_bytes_total,
//   comm_seconds_total, comm_formula_sent_bytes_total, comm_payload_bytes_total
//                                           {job,rank,group,op}  (RankStats.comm_ops)
//   bucket_calls_total, bucket_sent_bytes_total, bucket_seconds_total,
//   bucket_formula_sent_bytes_total, bucket_bytes          {job,rank,bucket} (.buckets)
//   nodes, slots{state}                     cluster totals; state busy, free, unavailable
//   node_slots{node,state}, node_draining, node_heartbeat_age_seconds,
//   node_lease_left_seconds, node_heartbeat_rtt_seconds                       {node}
// Nothing is labelled by step: a job's series number grows with its ranks, communicators
// and buckets only.
#ifndef RINGMASTER_COORDINATOR_METRICS_H_
#define RINGMASTER_COORDINATOR_METRICS_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "coordinator/coordinator.h"
#include "coordinator/http_server.h"

namespace ringmaster::coordinator {

// The exposition's Content-Type.
inline constexpr char kPrometheusContentType[] = "text/plain; version=0.0.4; charset=utf-8";

// The text exposition of `snapshot`. Thread-compatible; no I/O.
std::string PrometheusText(const CoordinatorSnapshot& snapshot);

// The HTTP port's routes for monitoring: /metrics (PrometheusText of a fresh snapshot) and
// /healthz ("ok"). `coordinator` must outlive the server that serves them.
std::vector<HttpRoute> MonitoringRoutes(Coordinator* coordinator);

// A label value escaped for the exposition: backslash, double quote and newline become
// \\, \" and \n.
std::string EscapeLabelValue(absl::string_view value);

}  // namespace ringmaster::coordinator

#endif  // RINGMASTER_COORDINATOR_METRICS_H_
