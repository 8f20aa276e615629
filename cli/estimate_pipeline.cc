#include "cli/estimate_pipeline.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "train/pipeline/schedule.h"

namespace ringmaster::cli {
namespace {

namespace pp = train::pipeline;

// The schedule library names its options as the spec does; here they are flags.
absl::Status AsFlags(const absl::Status& status) {
  if (status.ok() || !absl::IsInvalidArgument(status)) return status;
  std::string message(status.message());
  for (const auto& [field, flag] : {std::pair<const char*, const char*>{"ranks", "--stages"},
                                    {"micro_batches", "--micro_batches"},
                                    {"virtual_stages", "--virtual_stages"}}) {
    if (absl::StartsWith(message, absl::StrCat(field, ": "))) {
      message = absl::StrCat(flag, message.substr(std::string(field).size()));
    }
  }
  return absl::InvalidArgumentError(message);
}

}  // namespace

absl::StatusOr<std::string> EstimatePipeline(const EstimatePipelineFlags& flags) {
  RM_ASSIGN_OR_RETURN(pp::ScheduleKind kind, pp::ParseScheduleKind(flags.schedule));
  std::string text, svg;
  if (flags.sweep) {
    absl::StatusOr<pp::BubbleSweep> sweep =
        pp::SweepBubble(kind, flags.stages, flags.virtual_stages);
    if (!sweep.ok()) return AsFlags(sweep.status());
    text = pp::SweepText(*sweep);
    svg = pp::SweepSvg(*sweep);
  } else {
    const pp::ScheduleOptions options{kind, flags.stages.at(0), flags.micro_batches,
                                      flags.virtual_stages};
    absl::StatusOr<pp::Schedule> schedule = pp::MakeSchedule(options);
    if (!schedule.ok()) return AsFlags(schedule.status());
    RM_RETURN_IF_ERROR(pp::CheckSchedule(*schedule));
    RM_ASSIGN_OR_RETURN(pp::Timeline timeline, pp::Simulate(*schedule));
    text = absl::StrCat(pp::ScheduleName(kind), " on ", options.ranks, " rank(s), ",
                        options.micro_batches, " micro-batch(es)",
                        options.virtual_stages > 1
                            ? absl::StrCat(", ", options.virtual_stages, " virtual stages")
                            : "",
                        ": a rank's forward takes 1 time unit, its backward 2",
                        options.virtual_stages > 1 ? " (a chunk's, 1/v of them)" : "",
                        kind == pp::ScheduleKind::kZeroBubble
                            ? " (b the input gradient, W the weight gradient, 1 each)"
                            : "",
                        "\n", pp::TimelineText(*schedule, timeline));
    svg = pp::TimelineSvg(*schedule, timeline);
  }
  if (!flags.svg.empty()) {
    absl::Status written = WriteFileAtomically(flags.svg, svg);
    if (!written.ok()) {
      return absl::Status(written.code(), absl::StrCat("-o ", flags.svg, ": ", written.message()));
    }
    absl::StrAppend(&text, "drawn in ", flags.svg, "\n");
  }
  return text;
}

}  // namespace ringmaster::cli
