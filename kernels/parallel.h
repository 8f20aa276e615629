// Parts of one kernel call run at once on the rank's compute threads: the calling thread and a
// pool of workers kept for the process. While they run, OpenBLAS runs on one thread (each part
// calls it single-threaded, so that the parts' products do not also start OpenBLAS's own
// threads on the same cores); its thread count is restored after.
//
// For kernels whose work splits into independent parts (a convolution's chunks of images)
// where OpenBLAS would thread only the products and leave the rest on one thread.
// Thread-safe; a part must not call ParallelRun itself.
#ifndef RINGMASTER_KERNELS_PARALLEL_H_
#define RINGMASTER_KERNELS_PARALLEL_H_

#include <cstdint>
#include <functional>

namespace ringmaster::kernels {

// Calls part(i) for every i in [0, parts), all at once (one thread each: the caller runs
// part 0), and returns when every one has returned. parts <= 1 runs part(0) inline (nothing for
// parts <= 0). Calls from several threads run one after the other.
void ParallelRun(int parts, const std::function<void(int)>& part);

// Splits [0, n) into min(threads, n) contiguous ranges of ceil(n / threads) and runs
// body(begin, end) on each at once (ParallelRun).
void ParallelFor(int64_t threads, int64_t n, const std::function<void(int64_t, int64_t)>& body);

}  // namespace ringmaster::kernels

#endif  // RINGMASTER_KERNELS_PARALLEL_H_
