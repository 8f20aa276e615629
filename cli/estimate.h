// `ringctl estimate memory --spec JOB.yaml --world N`: the memory one CPU rank of the job
// holds under each ZeRO stage and wrapping, planned without training it (seed exercise
// 26.14; train/memory_plan.h says what each column counts). For people, a table in MiB:
//
//   tiny_gpt: gpt 4 layers x 4 heads x 128 wide, ... (833536 parameters) on 4 ranks
//   bf16, adamw; B=32 W=4: 1 micro-batches of <= 8 per rank; ...
//   PER RANK (MiB)  PARAMETERS  GRADIENTS  OPTIMIZER  UNIT BUFFERS  ACTIVATIONS  TOTAL
//   ZeRO-0          ...
//
// and with -o json or yaml the same as a document whose rows have every term in bytes.
//
// Thread-safety: the functions are pure but for reading the spec file.
#ifndef RINGMASTER_CLI_ESTIMATE_H_
#define RINGMASTER_CLI_ESTIMATE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cli/command_line.h"
#include "cli/output.h"
#include "nlohmann/json.hpp"
#include "train/memory_plan.h"
#include "train/mesh_memory.h"

namespace ringmaster::cli {

// What the job is, for the lines above the table (and the document's fields).
struct EstimateHeading {
  std::string job;          // the spec's name
  std::string model;        // Model::Describe()
  int64_t parameters = 0;   // the model's parameter count
  int world = 1;
  std::string precision;    // "bf16"
  std::string optimizer;    // "adamw"
  std::string batch;        // BatchPlan::DebugString()
  std::string strategies;   // ZeRO-2's buckets, ZeRO-3's prefetch and resharding
};

// The table (kTable, kWide) or the document (kJson, kYaml) of `plans`, newline-terminated.
std::string FormatMemoryPlans(const EstimateHeading& heading,
                              const std::vector<train::RankMemoryPlan>& plans,
                              OutputFormat format);
nlohmann::ordered_json MemoryPlansJson(const EstimateHeading& heading,
                                       const std::vector<train::RankMemoryPlan>& plans);

// A job with a mesh (parallelism.mesh tp × pp): one row per (pp, tp) coordinate of
// train::PlanMeshMemory, for the job's ZeRO stage along dp; `heading.batch` describes the
// replicas' micro-batches and `heading.strategies` the mesh and schedule.
std::string FormatMeshPlans(const EstimateHeading& heading,
                            const std::vector<train::MeshRankPlan>& plans, OutputFormat format);

// Loads the spec (with `flags.overrides`), plans every configuration for flags.world ranks
// (the spec's elastic.min_ranks when 0) and formats them. Errors, each starting with
// "--spec FILE: ": the spec loader's (NOT_FOUND for a missing file, INVALID_ARGUMENT listing
// the YAML's problems by line), INVALID_ARGUMENT naming a field the engine cannot run or
// the batch that does not fit the world, RESOURCE_EXHAUSTED when one micro-batch's
// activations do not fit this machine. A job with a mesh gets FormatMeshPlans's rows
// instead (its ranks hold different parts; ZeRO-3 does not compose with a mesh).
absl::StatusOr<std::string> EstimateSpecMemory(const EstimateSpecFlags& flags,
                                               OutputFormat format);

}  // namespace ringmaster::cli

#endif  // RINGMASTER_CLI_ESTIMATE_H_
