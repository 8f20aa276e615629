// Runs the peer benchmarks of bench/peers (Gloo C++, OpenMPI over TCP or over its shared
// memory) from ringbench, so that ringmaster and its peers are measured in the same run on
// the same machine, and compared over the same transport.
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
  // What carried its messages: "TCP" or "shared memory" (PeerTransport of the peer run),
  // as ringbench names its own (TransportName).
  std::string transport;
};

// What carries `peer`'s messages, as bench/peers/run_peer runs it: "TCP" for gloo (its TCP
// device on loopback) and mpi (OpenMPI's btl tcp,self on lo), "shared memory" for mpi_shm
// (OpenMPI's btl vader,self). Empty for another name.
std::string PeerTransport(absl::string_view peer);

// Runs `peer` ("gloo", "mpi" or "mpi_shm") with `ranks` processes over the given ops and sizes (the
// peer programs take the same --ops names and byte sizes), adding `extra_flags` to the
// peer program's command line. Blocks until it finishes.
// Errors: NOT_FOUND when the peer programs are not next to this binary (build
// //bench:ringbench, which carries them); INTERNAL when the peer run fails.
absl::StatusOr<std::vector<PeerRow>> RunPeer(const std::string& peer, int ranks,
                                             const std::string& ops,
                                             const std::vector<uint64_t>& sizes,
                                             const std::string& extra_flags = "");

// The fastest (lowest median time) peer row for this op and size among those over
// `transport` (ours, so that like is compared with like: shared memory with OpenMPI's vader,
// TCP with TCP), or null when no peer over it has one.
const PeerRow* BestPeer(const std::vector<PeerRow>& rows, absl::string_view op, uint64_t bytes,
                        absl::string_view transport);

// The lines ringbench prints before its table of ratios: our transport, each peer's (its
// name and impl as measured, and what carried it), and which of them the ratios compare
// with; when no peer ran over ours, a line saying so and how to get one (--peers mpi_shm
// for shared memory, --transport tcp for the TCP peers). Empty without peer rows.
std::string PeerTransportNote(const std::vector<PeerRow>& rows, absl::string_view ours);

// CSV with the header "op,ranks,bytes,time_us,algbw_gbps,busbw_gbps,impl,transport".
std::string PeersToCsv(const std::vector<PeerRow>& rows);

}  // namespace ringmaster::bench

#endif  // RINGMASTER_BENCH_PEERS_H_
