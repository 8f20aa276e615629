// `ringctl plot`: training curves of one or more runs from their metrics files (the
// trainer's metrics.jsonl: one train/result.proto MetricsRecord a line), drawn into one SVG
// with a panel per quantity (plot/plot.h RenderPanels) and the runs overlaid in each panel,
// e.g. 1 vs 2 vs 4 ranks, or bf16 vs fp16. The flags are cli/command_line.h's PlotFlags.
//
// The panels, in this order (PlotFlags.panels picks some):
//   loss        training loss, and dashed the test loss of the runs that evaluated
//   lr          learning rate
//   throughput  tokens/s when every record drawn knows it (language models), else samples/s
//   grad_norm   global gradient norm (after unscaling)
//   loss_scale  fp16's loss scale (log scale), drawn when some run's scale is not 1
// A panel without data in any run is left out, and a note says so.
//
// Thread-safety: pure functions, except PlotCurves, which reads and writes files.
#ifndef RINGMASTER_CLI_PLOT_H_
#define RINGMASTER_CLI_PLOT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cli/command_line.h"
#include "plot/plot.h"
#include "train/result.pb.h"

namespace ringmaster::cli {

// A metrics file's text as the history of one job: one record per step, in step order. The
// file holds every run of the job (a resumed run appends, and repeats the steps after its
// checkpoint): a record for step s replaces every earlier record for s and after it, so the
// last run's records win. Blank lines are skipped; a last line without its newline that is
// not JSON (a writer still at it) is dropped. Keys a record does not have are left unset
// (only "step" is required); keys it does not know are ignored.
// INVALID_ARGUMENT "FILE:LINE: ..." for a line that is not a MetricsRecord or has no step.
absl::StatusOr<std::vector<train::MetricsRecord>> ParseMetricsHistory(absl::string_view jsonl,
                                                                      absl::string_view file);

struct PlotRun {
  std::string label;
  std::vector<train::MetricsRecord> records;  // as ParseMetricsHistory gives them
};

struct Curves {
  std::vector<plot::PlotSpec> panels;  // the panels with data, in kPlotPanels order
  std::vector<std::string> notes;      // one per panel left out, saying why
};

// The panels of `flags.panels` (all when empty) with `flags.x` as x axis: in each, one
// series per run with data for it (the loss panel also a dashed test-loss series per run
// that evaluated), a run in the same colour in every panel. `flags.panels` and `flags.x`
// must hold known names (ParseCommandLine checks them); others are ignored.
Curves DrawCurves(const std::vector<PlotRun>& runs, const PlotFlags& flags);

// The default label of each file: its name without the directory and the ".jsonl" and
// ".metrics" endings; where two files would get the same label, their paths as given.
std::vector<std::string> DefaultLabels(const std::vector<std::string>& files);

struct PlotResult {
  std::string summary;             // for stdout: what was written
  std::vector<std::string> notes;  // for stderr: the panels left out
};

// The whole command: reads flags.files, draws, writes flags.out (atomically).
// NOT_FOUND and the like naming a file that cannot be read; INVALID_ARGUMENT "FILE:LINE: ..."
// for a bad line; FAILED_PRECONDITION naming the file that holds no record, or when no
// panel has data; the write's error naming flags.out.
absl::StatusOr<PlotResult> PlotCurves(const PlotFlags& flags);

}  // namespace ringmaster::cli

#endif  // RINGMASTER_CLI_PLOT_H_
