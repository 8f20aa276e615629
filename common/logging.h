// Logging set-up for ringmaster's binaries (glog). Call once from main, after flags are
// parsed; libraries only use LOG()/VLOG() and never configure logging themselves.
#ifndef RINGMASTER_COMMON_LOGGING_H_
#define RINGMASTER_COMMON_LOGGING_H_

#include <string>

namespace ringmaster {

struct LoggingOptions {
  // argv[0], used by glog for file names.
  std::string program_name;
  // Log to stderr only (the default: systemd/journald and kubectl logs collect it).
  // When false, glog writes files under `log_dir`.
  bool to_stderr_only = true;
  std::string log_dir;
  // Minimum severity printed: 0 INFO, 1 WARNING, 2 ERROR.
  int min_severity = 0;
  // glog verbosity for VLOG(n).
  int verbosity = 0;
};

// Initialises glog and installs its failure signal handler (stack trace on crash).
// Idempotent: later calls only update the destination, severity and verbosity.
void InitLogging(const LoggingOptions& options);

}  // namespace ringmaster

#endif  // RINGMASTER_COMMON_LOGGING_H_
