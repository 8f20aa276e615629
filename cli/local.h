// `ringctl local --workers N JOB.yaml [--set key=value ...] [--summary FILE] [--run_dir DIR]`:
// the embedded default. Starts a coordinator (ringmaster, its database in the run
// directory) and one node agent (ringworker) with N slots on this machine, submits the job
// to them (elastic: min 1, max N ranks, unless the spec says otherwise), prints rank 0's
// progress lines, and exits with the job's status: 0 succeeded, 1 failed, 2 bad usage or
// spec, 130 cancelled (Ctrl-C / SIGTERM: the trainers drain first, saving a checkpoint when
// the job has them).
//
// The summary (--summary, JSON) has the job's result (steps, loss, accuracy, throughput,
// world size, checkpoints), its status, and `recoveries`: one entry per membership change
// with its cause, the old and new world size, and the seconds of each phase.
#ifndef RINGMASTER_CLI_LOCAL_H_
#define RINGMASTER_CLI_LOCAL_H_

namespace ringmaster::cli {

// argv from the command word ("local") on.
int LocalCommand(int argc, char** argv);

}  // namespace ringmaster::cli

#endif  // RINGMASTER_CLI_LOCAL_H_
