// A job spec as the trainer's options: the one place that turns the wire type (JobSpec,
// proto/job_spec.proto) into train::TrainConfig, so that train/ never reads proto/ or spec/.
// Used by ringtrainer (worker/), ringctl (cli/: memory estimates) and the trainer's tests.
#ifndef RINGMASTER_CONFIG_TRAIN_CONFIG_H_
#define RINGMASTER_CONFIG_TRAIN_CONFIG_H_

#include <string>

#include "absl/status/statusor.h"
#include "proto/job_spec.pb.h"
#include "train/config.h"

namespace ringmaster::config {

// `spec` must be validated with its defaults applied (spec::LoadJobSpecFile does both).
// INVALID_ARGUMENT, naming the field, for what the engine cannot run (e.g.
// model.mlp.activation: gelu) or a field left unset that the engine needs (no model, data or
// optimizer kind).
absl::StatusOr<train::TrainConfig> TrainConfigFromSpec(const JobSpec& spec);

// The fingerprint a metrics record carries (TrainConfig::config_fingerprint): 16 hex digits
// of spec::TrainingSpecHash with the length fields (spec::kLengthFields) cleared, so that a
// run extended with `resume: extend` keeps it and a change to the model, data, optimizer,
// schedule, batch, precision or seed gives another.
std::string ConfigFingerprint(const JobSpec& spec);

}  // namespace ringmaster::config

#endif  // RINGMASTER_CONFIG_TRAIN_CONFIG_H_
