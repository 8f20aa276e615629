// Test helpers of the NCCL backend's tests (nccl_communicator_test.cc, one rank;
// nccl_multirank_test.cc, forked ranks): element values encoded per DataType independently
// of CUDA's headers, and the host reference of each reduction computed from every rank's
// inputs alone.
#ifndef RINGMASTER_COMM_NCCL_NCCL_TEST_UTIL_H_
#define RINGMASTER_COMM_NCCL_NCCL_TEST_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "common/dtype.h"

namespace ringmaster::comm::testing {

// `values` as elements of `type` (fp16 and bf16 exact for small integers).
std::vector<uint8_t> Encode(DataType type, const std::vector<double>& values);
std::vector<double> Decode(DataType type, const std::vector<uint8_t>& bytes);

// Small integers, exact in every type (non-negative for u8), different per rank.
std::vector<double> Input(DataType type, size_t count, int rank);
// Smaller ones, -3..3 (0..3 for u8): a product over four ranks stays exact in every type
// (in bf16 and u8 too).
std::vector<double> SmallInput(DataType type, size_t count, int rank);

// What a reduction of `op` over `inputs` (one vector per rank) must produce: avg of integer
// types is the sum divided by N, truncated.
std::vector<double> ReduceReference(DataType type, ReduceOp op,
                                    const std::vector<std::vector<double>>& inputs);

// "" when `got` decodes to `want`; else how many elements differ and the first.
std::string Mismatch(DataType type, const std::vector<uint8_t>& got,
                     const std::vector<double>& want);

}  // namespace ringmaster::comm::testing

#endif  // RINGMASTER_COMM_NCCL_NCCL_TEST_UTIL_H_
