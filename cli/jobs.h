// ringctl's commands that talk to a coordinator: submit, list, status, cancel, top,
// checkpoints. Each takes argv from the command word on and returns the exit status:
// 0 done, 1 the coordinator said no (the message says why), 2 bad usage; `submit --wait`
// returns the job's outcome (0 succeeded, 1 failed or cancelled).
//
// Common flags: --coordinator HOST:PORT (default 127.0.0.1:7070), --token_file F (the user
// token), --tls_ca F, --json (machine-readable output: the Job proto's JSON mapping).
#ifndef RINGMASTER_CLI_JOBS_H_
#define RINGMASTER_CLI_JOBS_H_

#include <string>

namespace ringmaster::cli {

int JobsCommand(const std::string& command, int argc, char** argv);

// True for the command words JobsCommand handles.
bool IsJobsCommand(const std::string& command);

// The usage lines of these commands.
extern const char kJobsUsage[];

}  // namespace ringmaster::cli

#endif  // RINGMASTER_CLI_JOBS_H_
