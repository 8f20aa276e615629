// What every collectives benchmark here shares (ringbench and the peer programs in
// bench/peers): the operations, their command-line names, message sizes, and nccl-tests'
// bus-bandwidth factors.
#ifndef RINGMASTER_BENCH_COLLECTIVES_H_
#define RINGMASTER_BENCH_COLLECTIVES_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ringmaster::bench {

enum class CollectiveOp { kAllReduce, kAllGather, kReduceScatter, kBroadcast };
inline constexpr CollectiveOp kAllCollectiveOps[] = {
    CollectiveOp::kAllReduce, CollectiveOp::kAllGather, CollectiveOp::kReduceScatter,
    CollectiveOp::kBroadcast};

// "all_reduce", "all_gather", "reduce_scatter", "broadcast": the names used by --ops and
// in the CSVs' `op` column.
absl::string_view CollectiveName(CollectiveOp op);

// Parses --ops: a comma list of the names above in the order given, without repeats, or
// "all". INVALID_ARGUMENT names the flag and the bad entry.
absl::StatusOr<std::vector<CollectiveOp>> ParseOps(absl::string_view text);

// Parses --sizes: "1K,64K,4M" (K/M/G = powers of 1024) and geometric ranges
// "1K,4K,...,1G". INVALID_ARGUMENT names the flag and the bad entry.
absl::StatusOr<std::vector<uint64_t>> ParseSizes(absl::string_view text);

// busbw / algbw: 2(N-1)/N for all-reduce, (N-1)/N for all-gather and reduce-scatter, 1 for
// broadcast.
double BusFactor(CollectiveOp op, int ranks);

}  // namespace ringmaster::bench

#endif  // RINGMASTER_BENCH_COLLECTIVES_H_
