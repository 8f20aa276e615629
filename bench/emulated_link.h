// An emulated network link between ranks forked on one machine, for benchmarks that need
// communication to cost wire time (fsdp_traffic --link_gbit): the ranks' shared-memory rings
// make a 3 MB all-gather a memcpy, a network does not.
//
// Layout: a hub process in a new network namespace with a bridge; every rank in a namespace
// of its own, which the hub joins to the bridge by a veth pair. The rank's end,
// kLinkInterface, carries LinkAddress(rank) and limits its egress with tc's token bucket
// filter (tbf) to the link's rate, so a rank sends at most `gbit` Gbit/s (headers included),
// as through a NIC of that rate; what a rank receives is limited by its senders' egress (in
// a ring, one neighbour's). No delay: this
// kernel has no netem (the rate is the point). The ranks' communicator must listen on
// LinkAddress (TcpCommunicatorOptions::listen_host) with shared_memory off: the loopback of
// a rank's namespace is down and nothing else leads to the other ranks.
//
// Nothing is created in the machine's own network namespace, so its interfaces (loopback
// included) are never touched; the namespaces have no names and belong to their processes
// alone, and the kernel removes them, their veth pairs and qdiscs when those processes exit
// (a crash or SIGKILL included): there is nothing to clean up.
//
// Needs root (CAP_SYS_ADMIN for unshare(CLONE_NEWNET), CAP_NET_ADMIN in the namespaces) and
// ip and tc (Debian's iproute2), found in /usr/sbin, /sbin, /usr/bin or /bin.
//
//   RM_RETURN_IF_ERROR(RunRanksOnLink(2, {.gbit = 1}, [&](int rank) -> absl::Status {
//     options.listen_host = LinkAddress(rank);
//     options.shared_memory = false;
//     ... TcpCommunicator::Create(options), train ...
//   }));
//
// Each ip/tc command is bounded by a deadline of its own (10 s).
#ifndef RINGMASTER_BENCH_EMULATED_LINK_H_
#define RINGMASTER_BENCH_EMULATED_LINK_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ringmaster::bench {

// The interface of a rank's end of its link, in the rank's namespace.
inline constexpr char kLinkInterface[] = "link0";
// The most ranks one hub joins (LinkAddress's /24).
inline constexpr int kMaxLinkRanks = 250;

struct EmulatedLinkOptions {
  // Egress rate of every rank's end, in Gbit/s (10^9 bits), headers included.
  double gbit = 1;
  // The token bucket's depth: how many bytes may leave at once above the rate. 0: the larger
  // of 64 KiB (a TSO segment) and 1 ms at the rate.
  int64_t burst_bytes = 0;
};

// Whether this machine can make the link: ip and tc found, and this process may create
// network namespaces (tried in a child process, which makes one and exits). OK, or
// FAILED_PRECONDITION saying what is missing and what to do (install iproute2; run as root).
absl::Status CheckLinkSupport();

// What a rank runs once its end of the link is up; its error is reported by RunRanksOnLink.
using LinkRankFn = std::function<absl::Status(int rank)>;

// Runs `fn` on `ranks` processes joined by the link. A hub process is forked (the caller
// stays in its namespace), which moves into a new namespace with a bridge and forks the
// ranks; each rank moves into a namespace of its own, waits until the hub has joined it to
// the bridge (a veth pair, kLinkInterface in the rank's namespace with LinkAddress(rank)/24,
// up, its egress limited to options.gbit by tbf), then runs fn(rank) and exits. The hub and
// the ranks die with their parent (PR_SET_PDEATHSIG), so a killed caller leaves nothing
// running. Blocks until every rank has exited (no deadline of its own: bound fn's work by
// deadlines of its own). Call from a single-threaded process (it forks; fn runs in the
// forked rank). The ranks' stdout and stderr are the caller's.
// Errors: CheckLinkSupport's; INVALID_ARGUMENT for `ranks` outside [1, kMaxLinkRanks] or a
// rate that is not positive; INTERNAL with the messages of every rank that failed (its fn's
// error, or its exit) and of the link's set-up (naming the ip or tc command and its output).
absl::Status RunRanksOnLink(int ranks, const EmulatedLinkOptions& options, const LinkRankFn& fn);

// Rank `rank`'s address on the link ("10.231.0.<rank + 1>").
std::string LinkAddress(int rank);

// What this process's namespace's `interface` has sent and its root qdisc dropped so far
// (/proc/self/net/dev and `tc -s qdisc show`). NOT_FOUND when there is no such interface.
struct LinkCounters {
  int64_t tx_bytes = 0;  // bytes sent on the interface, Ethernet/IP/TCP headers included
  int64_t tx_packets = 0;
  int64_t qdisc_drops = 0;  // packets the token bucket dropped (queue full)
};
absl::StatusOr<LinkCounters> ReadLinkCounters(const std::string& interface = kLinkInterface);

}  // namespace ringmaster::bench

#endif  // RINGMASTER_BENCH_EMULATED_LINK_H_
