// `ringctl estimate pipeline`: a pipeline schedule (train/pipeline/schedule.h) laid out in time
// with unit costs (a stage's forward, input-gradient and weight-gradient parts each 1): every
// rank's timeline as text, the bubble simulated and by formula, the activations each rank
// keeps; with --sweep the bubble against the micro-batches for several pipeline sizes and the
// smallest number of micro-batches below 10 % (seed exercises 35.9 and 26.6). With -o FILE the
// same drawn as an SVG.
//
//   $ ringctl estimate pipeline --stages 2 --micro-batches 2
//   1f1b on 2 ranks, 2 micro-batches: ...
//   rank 0   F0 F1 .  .  B0 B0 .  B1 B1
//   rank 1   .  F0 B0 B0 F1 B1 B1 .  .
//   bubble 33.3 % (formula 33.3 %); step 9 time units
//
// Thread-safety: pure but for writing the SVG file.
#ifndef RINGMASTER_CLI_ESTIMATE_PIPELINE_H_
#define RINGMASTER_CLI_ESTIMATE_PIPELINE_H_

#include <string>

#include "absl/status/statusor.h"
#include "cli/command_line.h"

namespace ringmaster::cli {

// The text to print. INVALID_ARGUMENT naming the flag (--micro-batches, --virtual-stages,
// --stages) for a combination the schedule does not take; the file's error when the SVG
// cannot be written.
absl::StatusOr<std::string> EstimatePipeline(const EstimatePipelineFlags& flags);

}  // namespace ringmaster::cli

#endif  // RINGMASTER_CLI_ESTIMATE_PIPELINE_H_
