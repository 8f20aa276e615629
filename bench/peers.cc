#include "bench/peers.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace ringmaster::bench {
namespace {

// The peer launcher travels in ringbench's runfiles (Bazel data dependency).
absl::StatusOr<std::string> FindLauncher() {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return absl::InternalError("cannot read /proc/self/exe");
  self[n] = '\0';
  std::vector<std::string> candidates = {
      absl::StrCat(self, ".runfiles/ringmaster/bench/peers/run_peer"),
  };
  if (const char* runfiles = getenv("RUNFILES_DIR")) {
    candidates.push_back(absl::StrCat(runfiles, "/ringmaster/bench/peers/run_peer"));
  }
  std::string dir(self);
  dir = dir.substr(0, dir.find_last_of('/'));
  candidates.push_back(dir + "/peers/run_peer");
  for (const std::string& c : candidates) {
    if (access(c.c_str(), X_OK) == 0) return c;
  }
  return absl::NotFoundError(absl::StrCat(
      "the peer benchmarks are not next to this binary (looked at ",
      absl::StrJoin(candidates, ", "), "); build them: bazel build //bench:ringbench"));
}

}  // namespace

std::string PeerTransport(absl::string_view peer) {
  if (peer == "gloo" || peer == "mpi") return "TCP";
  if (peer == "mpi_shm") return "shared memory";
  return "";
}

absl::StatusOr<std::vector<PeerRow>> RunPeer(const std::string& peer, int ranks,
                                             const std::string& ops,
                                             const std::vector<uint64_t>& sizes,
                                             const std::string& extra_flags) {
  auto launcher = FindLauncher();
  if (!launcher.ok()) return launcher.status();
  // Wrong results of one implementation (Gloo's reduce-scatter at >= 64 MiB, now and
  // then) leave that line out and are reported on stderr; the other lines still count.
  std::string command = absl::StrCat(
      "'", *launcher, "' ", peer, " --ranks ", ranks, " -- --ops ", ops, " --sizes ",
      absl::StrJoin(sizes, ","), peer == "gloo" ? " --nofail_on_wrong_result " : " ", extra_flags);
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return absl::InternalError(absl::StrCat("cannot run ", command));
  std::string output;
  char buf[4096];
  size_t got;
  while ((got = fread(buf, 1, sizeof(buf), pipe)) > 0) output.append(buf, got);
  int status = pclose(pipe);
  if (status != 0) {
    return absl::InternalError(
        absl::StrCat(peer, " benchmark failed (exit status ", WEXITSTATUS(status), "): ", command));
  }
  std::vector<PeerRow> rows;
  for (absl::string_view line : absl::StrSplit(output, '\n', absl::SkipEmpty())) {
    std::vector<std::string> f = absl::StrSplit(line, ',');
    PeerRow r;
    if (f.size() != 7 || !absl::SimpleAtoi(f[1], &r.ranks) || !absl::SimpleAtoi(f[2], &r.bytes) ||
        !absl::SimpleAtod(f[3], &r.time_us) || !absl::SimpleAtod(f[4], &r.algbw_gbps) ||
        !absl::SimpleAtod(f[5], &r.busbw_gbps)) {
      continue;  // the header, or a line that is not a result
    }
    r.op = f[0];
    r.impl = f[6];
    r.transport = PeerTransport(peer);
    rows.push_back(r);
  }
  if (rows.empty()) return absl::InternalError(absl::StrCat(peer, " printed no results"));
  return rows;
}

const PeerRow* BestPeer(const std::vector<PeerRow>& rows, absl::string_view op, uint64_t bytes,
                        absl::string_view transport) {
  const PeerRow* best = nullptr;
  for (const PeerRow& r : rows) {
    if (r.op == op && r.bytes == bytes && r.transport == transport &&
        (best == nullptr || r.time_us < best->time_us)) {
      best = &r;
    }
  }
  return best;
}

std::string PeerTransportNote(const std::vector<PeerRow>& rows, absl::string_view ours) {
  if (rows.empty()) return "";
  // Each impl once, in the order measured, with its transport.
  std::vector<std::string> impls;
  bool same = false;
  for (const PeerRow& r : rows) {
    const std::string impl = absl::StrCat(r.impl, " (", r.transport.empty() ? "?" : r.transport, ")");
    if (std::find(impls.begin(), impls.end(), impl) == impls.end()) impls.push_back(impl);
    same = same || r.transport == ours;
  }
  std::string out = absl::StrCat("ours over ", ours, "; peers: ", absl::StrJoin(impls, ", "), "\n");
  if (same) {
    absl::StrAppend(&out, "ratios against the fastest peer over ", ours,
                    " only (like with like); the others are in --peers_csv\n");
  } else {
    absl::StrAppend(&out, "no peer ran over ", ours, ", so no ratio: ",
                    ours == "shared memory"
                        ? "--peers mpi_shm compares with OpenMPI's shared memory (btl self,vader)"
                        : "--peers gloo,mpi compare with TCP peers",
                    ", or --transport ", ours == "shared memory" ? "tcp" : "shm",
                    " measures ours over the peers' transport\n");
  }
  return out;
}

std::string PeersToCsv(const std::vector<PeerRow>& rows) {
  std::string out = "op,ranks,bytes,time_us,algbw_gbps,busbw_gbps,impl,transport\n";
  for (const PeerRow& r : rows) {
    absl::StrAppend(&out, r.op, ",", r.ranks, ",", r.bytes, ",",
                    absl::StrFormat("%.2f,%.4f,%.4f", r.time_us, r.algbw_gbps, r.busbw_gbps), ",",
                    r.impl, ",", r.transport, "\n");
  }
  return out;
}

}  // namespace ringmaster::bench
