// Test helpers shared by the tests of the trainer's parts (testonly).
#ifndef RINGMASTER_TRAIN_TESTING_H_
#define RINGMASTER_TRAIN_TESTING_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "comm/tcp/tcp_communicator.h"
#include "train/config.h"

namespace ringmaster::train::testing {

inline constexpr uint64_t kTestSpecHash = 0x5eed;

// A job named "job" with spec hash kTestSpecHash whose checkpoint.dir is an empty directory
// $TEST_TMPDIR/<dir_name> (removed first if it exists).
TrainConfig CheckpointedJob(absl::string_view dir_name);

// Runs `fn` on `world` forked ranks (comm/testing/multiproc.h) and expects (gtest) every
// rank to return OK; a failure names the world size and the rank.
void ExpectOkOnRanks(int world, const std::function<absl::Status(comm::TcpCommunicator&)>& fn);

}  // namespace ringmaster::train::testing

#endif  // RINGMASTER_TRAIN_TESTING_H_
