#include "worker/command_runner_test_util.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace ringmaster::worker::testing {

ringmaster::SlotRef Slot(const std::string& node, int slot) {
  ringmaster::SlotRef s;
  s.set_node(node);
  s.set_slot(slot);
  return s;
}

std::map<std::string, std::string> EnvMap(const std::vector<std::string>& env) {
  std::map<std::string, std::string> m;
  for (const std::string& e : env) m[e.substr(0, e.find('='))] = e.substr(e.find('=') + 1);
  return m;
}

JoinResponse Joined(int64_t epoch) {
  JoinResponse j;
  j.set_epoch(epoch);
  j.set_rank(0);
  j.set_world_size(1);
  j.set_store_prefix(absl::StrCat("epoch-", epoch, "/"));
  Member* m = j.add_members();
  *m->mutable_slot() = Slot("n1", 0);
  m->set_rank(0);
  return j;
}

ProgressResponse AtEpoch(int64_t epoch) {
  ProgressResponse p;
  p.set_epoch(epoch);
  return p;
}

std::string WriteErrorFileShell(absl::string_view message, absl::string_view timestamp) {
  return absl::StrCat(R"(printf '{"message": {"message": ")", message,
                      R"(", "extraInfo": {"py_callstack": "Traceback...", "timestamp": ")",
                      timestamp, R"("}}}' > "$TORCHELASTIC_ERROR_FILE")");
}

void RunCommandJobFixture::SetUp() {
  std::string tmpl = absl::StrCat("/tmp/", dir_prefix_, "-XXXXXX");
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
  dir_ = tmpl;
  fake_.ready.Always(ReadyResponse());
  fake_.finished.Always(FinishedResponse());
  fake_.report_error.Otherwise([this](const ReportErrorRequest& r) {
    errors_.push_back(r);
    return ReportErrorResponse();
  });
  fake_.progress.Always(AtEpoch(1));
}

void RunCommandJobFixture::TearDown() {
  if (!dir_.empty()) std::filesystem::remove_all(dir_);
}

CommandRunnerOptions RunCommandJobFixture::Options(const std::vector<std::string>& argv) {
  CommandRunnerOptions o;
  o.client = &fake_;
  o.job = "cmd";
  o.slot = Slot("n1", 0);
  o.spec.mutable_command()->mutable_argv()->Assign(argv.begin(), argv.end());
  o.spec.mutable_command()->set_stop_grace_s(30);
  o.spec.mutable_command()->set_workdir(dir_);
  o.spec.mutable_elastic()->set_restart_budget(3);
  o.base_env = {"PATH=/usr/bin:/bin"};
  o.error_file_dir = dir_;
  o.progress_interval = absl::Milliseconds(50);
  o.join_timeout = absl::Seconds(10);
  return o;
}

void RunCommandJobFixture::ScriptEpochTwoAfterAFailure() {
  JoinResponse second = Joined(2);
  second.set_restarts(1);
  second.set_epoch_cause("failure");
  fake_.join.Then(Joined(1)).Then(second);
  fake_.progress.Then(AtEpoch(1)).Always(AtEpoch(2));
}

void RunCommandJobFixture::ScriptEpochTwoOnceExists(const std::string& name) {
  fake_.progress.Otherwise([path = Path(name)](const ProgressRequest&) {
    return AtEpoch(access(path.c_str(), F_OK) == 0 ? 2 : 1);
  });
}

absl::StatusOr<CommandResult> RunCommandJobFixture::RunLeavingOnceExists(
    CommandRunnerOptions o, const std::string& name) {
  std::atomic<bool> leave{false};
  o.leave_requested = &leave;
  std::thread trigger([&leave, path = Path(name)] {
    for (int i = 0; i < 200 && access(path.c_str(), F_OK) != 0; ++i) {
      absl::SleepFor(absl::Milliseconds(25));
    }
    leave = true;
  });
  absl::StatusOr<CommandResult> result = RunCommandJob(o);
  trigger.join();
  return result;
}

bool RunCommandJobFixture::Exists(const std::string& name) const {
  return access(Path(name).c_str(), F_OK) == 0;
}

std::string RunCommandJobFixture::Read(const std::string& name) const {
  std::ifstream in(Path(name));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void RunCommandJobFixture::Write(const std::string& name, const std::string& text) const {
  std::ofstream(Path(name)) << text;
}

int RunCommandJobFixture::OpenForOutput(const std::string& name) const {
  return open(Path(name).c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
}

}  // namespace ringmaster::worker::testing
