// Runs the peer benchmarks of bench/peers (Gloo C++, OpenMPI over TCP) from ringbench, so
// that ringmaster and its peers are measured in the same run on the same machine.
#ifndef RINGMASTER_BENCH_PEERS_H_
#define RINGMASTER_BENCH_PEERS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ringmaster::bench {

struct PeerRow {
  std::string op;
  int ranks = 0;
  uint64_t bytes = 0;
  double time_us = 0;
  double algbw_gbps = 0;
  double busbw_gbps = 0;
  std::string impl;  // e.g. "gloo:halving_doubling:busy_poll", "openmpi"
};

// Runs `peer` ("gloo" or "mpi") with `ranks` processes over the given ops and sizes (the
// peer programs take the same --ops names and byte sizes), adding `extra_flags` to the
// peer program's command line. Blocks until it finishes.
// Errors: NOT_FOUND when the peer programs are not next to this binary (build
// //bench:ringbench, which carries them); INTERNAL when the peer run fails.
absl::StatusOr<std::vector<PeerRow>> RunPeer(const std::string& peer, int ranks,
                                             const std::string& ops,
                                             const std::vector<uint64_t>& sizes,
                                             const std::string& extra_flags = "");

// The fastest (lowest median time) peer row for this op and size, or null.
const PeerRow* BestPeer(const std::vector<PeerRow>& rows, absl::string_view op, uint64_t bytes);

// CSV with the header "op,ranks,bytes,time_us,algbw_gbps,busbw_gbps,impl".
std::string PeersToCsv(const std::vector<PeerRow>& rows);

}  // namespace ringmaster::bench

#endif  // RINGMASTER_BENCH_PEERS_H_
