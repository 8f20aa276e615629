// What the command runner's tests share (command_runner_test, command_runner_channel_test,
// command_runner_preload_test): a rank-0-of-1 world on node n1 slot 0, and a fixture that runs
// RunCommandJob against a scripted coordinator (client/testing/fake_coordinator.h) with real
// programs in a directory of its own.
#ifndef RINGMASTER_WORKER_COMMAND_RUNNER_TEST_UTIL_H_
#define RINGMASTER_WORKER_COMMAND_RUNNER_TEST_UTIL_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/testing/fake_coordinator.h"
#include "gtest/gtest.h"
#include "proto/coordinator.pb.h"
#include "worker/command_runner.h"

namespace ringmaster::worker::testing {

ringmaster::SlotRef Slot(const std::string& node, int slot);

// An environment ("NAME=value" strings) as a map.
std::map<std::string, std::string> EnvMap(const std::vector<std::string>& env);

// Epoch `epoch` of a world of one: this rank (0) on node n1 slot 0, store prefix "epoch-N/".
JoinResponse Joined(int64_t epoch);

// The coordinator's answer to a keep-alive: the job is at `epoch`.
ProgressResponse AtEpoch(int64_t epoch);

// A shell command (for sh -c) that writes torchelastic's @record error file
// ($TORCHELASTIC_ERROR_FILE) with this message and timestamp.
std::string WriteErrorFileShell(absl::string_view message, absl::string_view timestamp);

// RunCommandJob against fake_, its files in dir_ (a new directory under /tmp named after
// `dir_prefix`, removed afterwards). fake_ answers Ready, Finished and every keep-alive (at
// epoch 1) and records each error report in errors_; a test scripts its Joins.
class RunCommandJobFixture : public ::testing::Test {
 protected:
  explicit RunCommandJobFixture(std::string dir_prefix) : dir_prefix_(std::move(dir_prefix)) {}
  void SetUp() override;
  void TearDown() override;

  // Job "cmd", rank n1/0 running `argv` in dir_ (its error files there too), stop grace 30 s,
  // restart budget 3, PATH=/usr/bin:/bin, keep-alives every 50 ms, joins waited 10 s.
  CommandRunnerOptions Options(const std::vector<std::string>& argv);

  // Join: epoch 1, then epoch 2 after a failure (restart 1); keep-alives: epoch 1 once, then 2.
  void ScriptEpochTwoAfterAFailure();
  // Keep-alives answer epoch 2 once dir_/name exists, epoch 1 before.
  void ScriptEpochTwoOnceExists(const std::string& name);
  // RunCommandJob(o), its trainer asked to leave (o.leave_requested) once dir_/name exists
  // (or after 5 s).
  absl::StatusOr<CommandResult> RunLeavingOnceExists(CommandRunnerOptions o,
                                                     const std::string& name);

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  bool Exists(const std::string& name) const;
  std::string Read(const std::string& name) const;
  void Write(const std::string& name, const std::string& text) const;
  // dir_/name opened for writing (created, truncated, close-on-exec): -1 when it cannot be.
  int OpenForOutput(const std::string& name) const;

  client::testing::FakeCoordinator fake_;
  std::string dir_;
  std::vector<ReportErrorRequest> errors_;

 private:
  std::string dir_prefix_;
};

}  // namespace ringmaster::worker::testing

#endif  // RINGMASTER_WORKER_COMMAND_RUNNER_TEST_UTIL_H_
