// What `ringctl local` refuses before it starts anything,
// so that a mistake costs a message instead of a coordinator, an agent, a restart budget or a
// whole training run:
//   - --workers that the job's mesh cannot use all of: every rank group is tp × pp ranks
//     (parallelism.mesh), so N workers must be a multiple of that (else the leftover workers
//     idle, and the job said nothing of it);
//   - device: cuda on a build or machine without a CUDA GPU (each trainer would fail at
//     start);
//   - a --summary file that cannot be written (found after the training otherwise).
//
// Thread-safety: CheckLocalRun only reads the file system (whether --summary's directory
// takes a file).
#ifndef RINGMASTER_CLI_LOCAL_CHECKS_H_
#define RINGMASTER_CLI_LOCAL_CHECKS_H_

#include <string>

#include "absl/status/status.h"
#include "proto/job_spec.pb.h"

namespace ringmaster::cli {

struct LocalChecks {
  int workers = 1;      // --workers
  std::string summary;  // --summary; empty: none
  // CUDA GPUs this build and machine can train on (train::CudaDeviceCount()); asked only of
  // a job with device: cuda.
  int cuda_devices = 0;
};

// OK, or INVALID_ARGUMENT naming the flag or the spec field and what to do. `spec` is the
// effective job spec (defaults filled, validated).
absl::Status CheckLocalRun(const JobSpec& spec, const LocalChecks& checks);

}  // namespace ringmaster::cli

#endif  // RINGMASTER_CLI_LOCAL_CHECKS_H_
