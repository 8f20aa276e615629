// The coordinator's web dashboard: HTML pages with inline SVG charts, drawn on the server
// (no JavaScript; each page reloads itself every few seconds through a
// <meta http-equiv="refresh">, so an open page follows a running job).
//
//   /               the jobs (phase and why, step, loss, throughput, world, epoch, restarts,
//                   checkpoints) and the nodes (slots, what runs on them, heartbeat age)
//   /jobs/<id>      one job: summary, live curves against step (loss, throughput,
//                   communication share), the recovery timeline, the members of each epoch,
//                   the current members with their latest figures (stragglers marked), its
//                   checkpoints
//
// Anything else is a 404 page, as is a job the coordinator does not know. Every text that
// comes from users, nodes or trainers (job names, reasons, paths, node names) is
// HTML-escaped.
//
// Thread-safety: Render is pure; Serve takes the coordinator's lock briefly (for its
// Snapshot and History) and renders outside it. Both may be called from any thread.
#ifndef RINGMASTER_COORDINATOR_DASHBOARD_H_
#define RINGMASTER_COORDINATOR_DASHBOARD_H_

#include <map>
#include <string>
#include <vector>

#include "coordinator/coordinator.h"
#include "coordinator/http_server.h"
#include "coordinator/job_history.h"
#include "proto/coordinator.pb.h"

namespace ringmaster::coordinator::dashboard {

inline constexpr char kHtmlContentType[] = "text/html; charset=utf-8";

struct DashboardOptions {
  // How often an open page reloads itself (seconds); 0: never.
  int refresh_s = 5;
};

// What the pages draw: the coordinator's state at one moment (`state.taken` is "now").
struct Snapshot {
  CoordinatorSnapshot state;
  // The history of the job a page shows (JobOfPath); others may be absent.
  std::map<std::string, JobHistory::View> histories;
};

// The page at `path` (the URL's path, without query) for `snapshot`: 200 with HTML, or 404
// with an HTML page that says what is not there.
HttpResponse Render(const std::string& path, const Snapshot& snapshot,
                    const DashboardOptions& options = {});

// The job the page at `path` shows ("" for none): "/jobs/mlp" -> "mlp".
std::string JobOfPath(const std::string& path);

// Render over a snapshot taken from `coordinator` now (Coordinator::Snapshot, and the
// History of JobOfPath(path)).
HttpResponse Serve(const std::string& path, Coordinator& coordinator,
                   const DashboardOptions& options = {});

// The HTTP port's routes for the dashboard: "/" and everything under "/jobs", served by
// Serve. `coordinator` must outlive the server that serves them.
std::vector<HttpRoute> DashboardRoutes(Coordinator* coordinator,
                                       const DashboardOptions& options = {});

}  // namespace ringmaster::coordinator::dashboard

#endif  // RINGMASTER_COORDINATOR_DASHBOARD_H_
