// ringctl's commands that talk to a coordinator: submit, list, status, cancel, delete,
// logs, nodes, top, checkpoints (cli/command_line.h has their flags, cli/output.h what
// they print). Each returns the exit status: 0 done, 1 the coordinator said no or could not
// be reached (the message says why), 2 bad input; `submit --wait` returns the job's outcome (0
// succeeded, 1 failed or cancelled).
//
// `logs` writes the log's bytes as they come (with -f until the job has ended and its
// trainer is gone, or Ctrl-C). `delete` says where the job's checkpoints stay.
//
// `top` redraws in place (clears the screen) when stdout is a terminal and prints plain
// frames one after the other when it is not; `top -o json` prints one JSON line per event.
#ifndef RINGMASTER_CLI_JOBS_H_
#define RINGMASTER_CLI_JOBS_H_

#include <cstdio>

#include "cli/command_line.h"
#include "client/coordinator.h"
#include "client/grpc_coordinator_client.h"

namespace ringmaster::cli {

// Runs `line` (a command above) against the coordinator `client` reaches. Blocks (Watch)
// for `submit --wait` and `top`, and (Logs) for `logs -f`.
int JobsCommand(const CommandLine& line, const client::CoordinatorClientOptions& client);

// The same against `coordinator` (not owned), printing to `out` and `err`.
int JobsCommand(const CommandLine& line, client::UserCalls& coordinator, FILE* out, FILE* err);

}  // namespace ringmaster::cli

#endif  // RINGMASTER_CLI_JOBS_H_
