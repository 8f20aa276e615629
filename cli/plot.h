// `ringctl plot`: training curves of one or more runs from their metrics files (the
// trainer's metrics.jsonl: one train/result.proto MetricsRecord a line), drawn into one SVG
// with a panel per quantity (plot/plot.h RenderPanels) and the runs overlaid in each panel,
// e.g. 1 vs 2 vs 4 ranks, or bf16 vs fp16. The flags are cli/command_line.h's PlotFlags.
//
// The panels, in this order (PlotFlags.panels picks some):
//   loss        training loss, and dashed the test loss of the runs that evaluated
//   accuracy    test accuracy (classifiers that evaluated)
//   perplexity  test perplexity, log scale (language models that evaluated)
//   lr          learning rate
//   throughput  tokens/s when every record drawn knows it (language models), else samples/s
//   grad_norm   global gradient norm (after unscaling)
//   loss_scale  fp16's loss scale (log scale), drawn when some run's scale is not 1
// A panel without data in any run is left out, and a note says so. A run whose curve in a
// panel is identical to another's (drawn exactly over it) is named so in the legend and in
// a note.
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

// A metrics file as the history of one run: one record per step, in step order, and what
// was left out.
struct MetricsHistory {
  std::vector<train::MetricsRecord> records;
  // One line per kind of thing left out, each starting with the file's name and saying
  // how many, where (lines, steps) and why.
  std::vector<std::string> dropped;
};

// A metrics file's text as the history of one run. A file may hold several runs (records
// name their job, run and configuration: train/result.proto MetricsRecord):
//  - the history is that of the last record's job and configuration; records of another
//    job or configuration are left out (another experiment appended to the same file);
//  - among the rest, a record for step s replaces every earlier record for s and after it
//    (a resumed run appends, and repeats the steps after its checkpoint; the same spec run
//    again starts over), so that the last run's records win;
//  - a line that is not a MetricsRecord or has no step is left out, and so is a last line
//    without its newline that is not JSON (a writer still at it).
// Each of these is said in `dropped`. Blank lines are skipped; keys a record does not have
// are left unset (only "step" is required); keys it does not know are ignored.
// INVALID_ARGUMENT "FILE:LINE: ..." when no line is a metrics record and some line is not
// (not a metrics file at all).
absl::StatusOr<MetricsHistory> ParseMetricsHistory(absl::string_view jsonl,
                                                   absl::string_view file);

struct PlotRun {
  std::string label;
  std::vector<train::MetricsRecord> records;  // as ParseMetricsHistory gives them
};

struct Curves {
  std::vector<plot::PlotSpec> panels;  // the panels with data, in kPlotPanels order
  // One per panel left out, saying why, and one per curve identical to another.
  std::vector<std::string> notes;
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
  std::string summary;  // for stdout: what was written
  // For stderr: what the files held that is not drawn (MetricsHistory.dropped), then the
  // panels left out and the identical curves (Curves.notes).
  std::vector<std::string> notes;
};

// The whole command: reads flags.files, draws, writes flags.out (atomically).
// NOT_FOUND and the like naming a file that cannot be read; INVALID_ARGUMENT "FILE:LINE: ..."
// for a file none of whose lines is a metrics record; FAILED_PRECONDITION naming the file
// that holds no record, or when no panel has data; the write's error naming flags.out.
absl::StatusOr<PlotResult> PlotCurves(const PlotFlags& flags);

}  // namespace ringmaster::cli

#endif  // RINGMASTER_CLI_PLOT_H_
