#include "common/logging.h"

#include <atomic>
#include <string>

#include "glog/logging.h"

namespace ringmaster {
namespace {
std::atomic<bool> initialized{false};
}  // namespace

void InitLogging(const LoggingOptions& options) {
  FLAGS_logtostderr = options.to_stderr_only;
  if (!options.log_dir.empty()) FLAGS_log_dir = options.log_dir;
  FLAGS_minloglevel = options.min_severity;
  FLAGS_v = options.verbosity;
  if (!initialized.exchange(true)) {
    // glog keeps the pointer: the name must outlive the process.
    static const std::string* const name =
        new std::string(options.program_name.empty() ? "ringmaster" : options.program_name);
    google::InitGoogleLogging(name->c_str());
    google::InstallFailureSignalHandler();
  }
}

}  // namespace ringmaster
