// Reference arithmetic for the tests of the communicators: expected results computed in
// double precision, sharing no code with the backends' reduction kernels.
#ifndef RINGMASTER_COMM_TESTING_REFERENCE_H_
#define RINGMASTER_COMM_TESTING_REFERENCE_H_

#include <algorithm>

#include "comm/communicator.h"

namespace ringmaster::comm::testing {

// acc op x (avg accumulates the sum; the caller divides).
inline double ReduceStep(ReduceOp op, double acc, double x) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return acc + x;
    case ReduceOp::kProd:
      return acc * x;
    case ReduceOp::kMin:
      return std::min(acc, x);
    case ReduceOp::kMax:
      return std::max(acc, x);
  }
  return acc;
}

}  // namespace ringmaster::comm::testing

#endif  // RINGMASTER_COMM_TESTING_REFERENCE_H_
