// Semantic checks of a job spec: required parts present, values in range, parts that fit
// together (GPT needs text data, the classifiers Fashion-MNIST; heads divide width; ...).
// Run on the effective spec, after ApplyJobSpecDefaults; LoadJobSpecFile does both.
#ifndef RINGMASTER_SPEC_VALIDATE_H_
#define RINGMASTER_SPEC_VALIDATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/job_spec.pb.h"
#include "spec/yaml_proto.h"

namespace ringmaster::spec {

// The longest job name (the job's id; the coordinator's limit too).
inline constexpr size_t kMaxJobNameLength = 128;

// The most all-gathers parallelism.fsdp.prefetch_limit may keep in flight.
inline constexpr int32_t kMaxFsdpPrefetchLimit = 8;

// A job name as ValidateJobSpec accepts it: 1 to kMaxJobNameLength letters, digits, '.',
// '_' and '-', not "." or ".." (it names directories).
bool IsValidJobName(absl::string_view name);

// Whether a command job's command.env may not set `name`: the variables of torchrun's worker
// environment (RANK, WORLD_SIZE, MASTER_ADDR, ...) and every RINGMASTER_* name, which the
// trainer sets for each rank (worker/command_runner.h).
bool IsReservedCommandEnvName(absl::string_view name);

// Whether argv is [PYTHON, SCRIPT, ARGS...], what command.preload needs: PYTHON's file name is
// python, python3 or python3.11 (any directory) and SCRIPT does not start with '-' (not -m,
// -c, -u...).
bool IsPythonScriptArgv(const std::vector<std::string>& argv);

// Every problem found; each names the field's path and the reason. The
// locations are empty (the spec does not know where its fields were written; the loader
// fills them in).
std::vector<FieldError> FindJobSpecErrors(const JobSpec& spec);

// OK, or INVALID_ARGUMENT listing every problem of FindJobSpecErrors, one per line:
//   "optimizer.adamw.beta1: must be in [0, 1), got 1.5".
absl::Status ValidateJobSpec(const JobSpec& spec);

}  // namespace ringmaster::spec

#endif  // RINGMASTER_SPEC_VALIDATE_H_
