// How a rank's training state is spread over the ranks and how a step's gradients become
// every rank's update: the part of a step that data, fully sharded, tensor and pipeline
// parallelism each do their own way (ARCHITECTURE.md "trainer").
//
// A step with a strategy, on the training thread:
//   MaterializeParameters()              the parameters the forward needs are in place
//   BeginGradients(grads, diagnostics)   the backward starts writing `grads`
//   GradientsReady(offset)               ... every gradient at offset >= `offset` is final
//   ReduceGradients()                    this rank holds the reduced gradient of owned()
//   (unscale, clip with sum(), the optimizer on owned())
//   AfterOptimizerStep(params)           every rank's parameters are current again
// Every rank calls the same sequence: the collectives inside match.
//
// Thread-safety: from the training thread only.
#ifndef RINGMASTER_TRAIN_PARALLEL_STRATEGY_H_
#define RINGMASTER_TRAIN_PARALLEL_STRATEGY_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "comm/communicator.h"
#include "state/range.h"
#include "state/tensor.h"
#include "train/grad_sync.h"
#include "train/optim/sum_across_ranks.h"
#include "train/optim/vector_ops.h"

namespace ringmaster::train {

class ParallelStrategy {
 public:
  virtual ~ParallelStrategy() = default;

  // For the start-up line, e.g. "ZeRO-1; buckets 3 (25 MiB), overlap on".
  virtual std::string Describe() const = 0;
  // Elements of the flat buffers this rank allocates (the table's, padded).
  virtual int64_t padded_elements() const = 0;
  // The part of the flat index space whose optimizer state this rank keeps and updates.
  virtual state::FlatRange owned() const = 0;
  // The part this rank writes to a checkpoint (each rank saves a disjoint part, so the
  // save work is split N ways; any world size can load them).
  virtual state::FlatRange saved() const = 0;
  // Whether every rank holds the whole training state (the survivors of an elastic job can
  // then restore from any one rank's memory).
  virtual bool whole_state_on_every_rank() const = 0;
  // Adds per-rank partial sums up over the ranks that share an update (clipping's norm,
  // LAMB's trust ratios, the loss scaler's overflow vote).
  virtual const SumAcrossRanks& sum() const = 0;

  // The parameters the forward reads are in place.
  virtual absl::Status MaterializeParameters() = 0;
  virtual void BeginGradients(float* grads, bool measure_local_norm) = 0;
  virtual void GradientsReady(int64_t offset) = 0;
  // Blocks until this rank holds the reduced gradient of owned(); the communicator's error
  // otherwise (the step must not be applied).
  virtual absl::Status ReduceGradients() = 0;
  virtual const GradientSyncStats& last_step() const = 0;
  // After the optimizer updated owned() of `params` (the step's memory, padded): every rank's
  // parameters are whole and current.
  virtual absl::Status AfterOptimizerStep(absl::Span<float> params) = 0;
};

struct DataParallelOptions {
  // Elements of the model's table (unpadded).
  int64_t elements = 0;
  // 0: every rank keeps the whole state; 1: each keeps the optimizer state of its shard;
  // 2: and only its shard of the reduced gradient (reduce-scatter).
  int zero_stage = 0;
  double bucket_mb = 25;
  bool overlap = true;
  absl::Duration op_timeout = absl::Seconds(120);
  // The step's memory (the device's, or the host's) and the reducing thread's.
  VectorOps* ops = HostVectorOps();
  VectorOps* comm_ops = HostVectorOps();
};

// Data parallelism (with ZeRO-1/2): every rank runs the whole model on its share of the
// batch, the gradients are summed in buckets overlapped with backward over `comm` (device
// memory when the step runs on a GPU), partial sums over `host_comm` (host memory). Neither
// is owned; both outlive the strategy and have the same ranks.
absl::StatusOr<std::unique_ptr<ParallelStrategy>> CreateDataParallel(
    comm::Communicator* comm, comm::Communicator* host_comm, const DataParallelOptions& options);

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_PARALLEL_STRATEGY_H_
