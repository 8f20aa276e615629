// What a job's rank needs, filled into its spec before it is submitted: the coordinator
// places ranks only where that much memory is free (proto/job_spec.proto ResourcesSpec).
#ifndef RINGMASTER_CLI_RESOURCES_H_
#define RINGMASTER_CLI_RESOURCES_H_

#include <string>

#include "proto/job_spec.pb.h"

namespace ringmaster::cli {

// When spec.resources.memory_per_rank_mib is 0 (not stated), sets it to the estimate of one
// rank's training state (train::EstimateRankStateBytes) at the job's smallest world
// (elastic.min_ranks: where sharded state is largest), rounded up to MiB. Returns a line
// for the user saying what was assumed; empty when the user stated it or the model cannot
// be described (the spec's own errors are reported when it is validated).
std::string FillMemoryEstimate(JobSpec* spec);

}  // namespace ringmaster::cli

#endif  // RINGMASTER_CLI_RESOURCES_H_
