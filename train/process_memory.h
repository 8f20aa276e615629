// Whether one rank's training state fits this process's memory limit, checked before the
// state is allocated: a rank run under a limit (ringworker --trainer_memory_limit_mib,
// ringctl local --rank_memory_limit, `ulimit -d`) that cannot hold its share of the model
// fails at once with a message that says what it needs and what to do, instead of failing
// an allocation half-way (or, in the BLAS library, looping for ever on one).
//
// The limit is the process's soft RLIMIT_DATA (or RLIMIT_AS, the smaller when both are
// set). The kernel counts against it every private writable mapping: the heap, but also
// thread stacks and the BLAS library's reserved workspace, most of which is never touched.
// So the check adds up what the process has mapped already (VmData, or VmSize for
// RLIMIT_AS: the kernel's own count, taken after the BLAS library mapped this thread's
// workspace, which it does at the first product: made to happen first, when it fits) and
// the state it is about to allocate. Activations, batches and checkpoint snapshots come
// later and are left out (the check refuses only what cannot fit); the message says so.
//
// Thread-safety: the functions are thread-safe (they read the process's limits and
// /proc/self/status).
#ifndef RINGMASTER_TRAIN_PROCESS_MEMORY_H_
#define RINGMASTER_TRAIN_PROCESS_MEMORY_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "train/config.h"
#include "train/model.h"
#include "train/parallel_strategy.h"

namespace ringmaster::train {

// What the BLAS library (OpenBLAS) maps for each thread that calls it: its BUFFER_SIZE on
// x86-64, at the thread's first product. When it cannot, OpenBLAS retries for ever.
inline constexpr int64_t kBlasWorkspaceBytes = int64_t{128} << 20;

struct ProcessMemoryLimit {
  int64_t bytes = 0;
  // Where it comes from, for messages: "RLIMIT_DATA (...)" or "RLIMIT_AS (...)".
  std::string source;
  // The /proc/self/status line the kernel compares with it: "VmData" (RLIMIT_DATA) or
  // "VmSize" (RLIMIT_AS).
  std::string counted = "VmData";
};

// This process's soft RLIMIT_DATA or RLIMIT_AS, the smaller of those that are set; nullopt
// when neither is.
std::optional<ProcessMemoryLimit> ReadProcessMemoryLimit();

// What this process has mapped by `limit`'s count (its `counted` line of
// /proc/self/status: the private writable memory for RLIMIT_DATA, everything for
// RLIMIT_AS), bytes; 0 when it cannot be read.
int64_t ProcessMappedBytes(const ProcessMemoryLimit& limit);

// One rank's training state, bytes, as it will be allocated.
struct RankStateBytes {
  int64_t parameters = 0;    // fp32: the flat buffer, or this rank's shard (ZeRO-2/3)
  int64_t gradients = 0;     // fp32, the same size; 0 when they live on a GPU
  int64_t optimizer = 0;     // the moments over update_window(); 0 on a GPU
  int moments = 0;           // per element: SGD 1 with momentum, else 0; AdamW, LAMB 2
  int64_t unit_buffers = 0;  // ZeRO-2/3: the bound of the strategy's unit buffer pool
  // ZeRO-2: every parameter, whole, on every rank. The strategy allocated it when it was
  // made, so the process's data size holds it already: shown, not added again.
  int64_t compute_copy = 0;
  // With checkpoints (checkpoint.dir): the host memory a save maps to stage this rank's
  // snapshot (its saved pieces' parameters and optimizer moments; checkpoint/writer.cc maps
  // it at the first save, rounded up to 2 MiB pages, and one page more to align them).
  int64_t checkpoint_staging = 0;

  // What is still to be allocated.
  int64_t total() const {
    return parameters + gradients + optimizer + unit_buffers + checkpoint_staging;
  }
};

struct RankStateInputs {
  const TrainConfig* config = nullptr;
  const Model* model = nullptr;  // its table and parameter groups
  // Created, its step buffers not yet allocated.
  const ParallelStrategy* strategy = nullptr;
  int world = 1;
  // Gradients and optimizer state in host memory (CPU training); false: on a GPU.
  bool state_on_host = true;
};

// The state the trainer allocates for `inputs`: the strategy's local_elements() of
// parameters (and of gradients on the host), update_window() × the optimizer's moments,
// and the unit buffers' bound as train/memory_plan.h plans it (train/fsdp.h); ZeRO-2's
// compute copy. INVALID_ARGUMENT for missing inputs; the
// layout's errors.
absl::StatusOr<RankStateBytes> PlanRankState(const RankStateInputs& inputs);

// RESOURCE_EXHAUSTED, marked permanent (no restart can fix it), when `in_use` (bytes mapped
// already) + state.total() + `blas_workspace` (what the BLAS library will still map) is
// more than limit.bytes; the message
// names the parts in MiB, the limit and where it comes from, and what to do (ZeRO-3 over
// more ranks, or a higher limit). OK otherwise.
absl::Status CheckRankStateFits(const RankStateBytes& state, int64_t in_use,
                                int64_t blas_workspace, const ProcessMemoryLimit& limit,
                                int world, int zero_stage);

// The trainer's check before it allocates the state, on the thread that trains: OK when the
// process has no limit; else PlanRankState, the BLAS workspace mapped for this thread when
// it fits, and CheckRankStateFits against the limit and the process's data size.
absl::Status CheckProcessMemoryLimit(const RankStateInputs& inputs);

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_PROCESS_MEMORY_H_
