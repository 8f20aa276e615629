#include "train/fsdp_cuda.h"

#include "common/status_macros.h"
#include "kernels/optimizer.h"

namespace ringmaster::train {
namespace {

absl::Status WaitFor(VectorOps& ops, int token) {
  return token == UnitBufferPool::kNoToken ? absl::OkStatus() : ops.Wait(token);
}

}  // namespace

absl::Status GatherUnitOnDevice(comm::Communicator& comm, VectorOps& compute_ops,
                                const FsdpUnit& unit, const float* shards, int shards_written,
                                const UnitBufferPool::Taken& into, absl::Time deadline) {
  RM_RETURN_IF_ERROR(WaitFor(compute_ops, into.token));
  RM_RETURN_IF_ERROR(WaitFor(compute_ops, shards_written));
  return comm.AllGather(shards + unit.local, into.data, unit.shard, DataType::kFloat32, deadline);
}

absl::Status ReduceScatterUnitOnDevice(comm::Communicator& comm, VectorOps& compute_ops,
                                       VectorOps& comm_ops, const FsdpUnit& unit,
                                       const float* unit_grads, int written, bool accumulate,
                                       float* scratch, float* shards, absl::Time deadline) {
  RM_RETURN_IF_ERROR(WaitFor(compute_ops, written));
  float* piece = shards + unit.local;
  if (!accumulate) {
    return comm.ReduceScatter(unit_grads, piece, unit.shard, DataType::kFloat32,
                              comm::ReduceOp::kSum, deadline);
  }
  RM_RETURN_IF_ERROR(comm.ReduceScatter(unit_grads, scratch, unit.shard, DataType::kFloat32,
                                        comm::ReduceOp::kSum, deadline));
  // piece += scratch, exactly: an SGD step of learning rate -1 (p -= -1 · g) without momentum
  // or decay. (VectorOps has no add yet; a dedicated one would say it plainly.)
  const auto n = static_cast<size_t>(unit.shard);
  RM_RETURN_IF_ERROR(comm_ops.SgdStep({.lr = -1.0f}, {piece, n}, {scratch, n}, {}));
  return comm_ops.Synchronize();
}

}  // namespace ringmaster::train
