// What rank 0 tells about a run as it goes (diagnostics.log_every, metrics.jsonl): the
// start-up lines, a progress line every log_every steps and at epoch ends (loss, lr,
// gradient norm, throughput, communication share, elapsed time and ETA: the rate and ETA of
// common/progress_rate.h, over the last 30 s of steps, as everywhere else), one JSON record
// per logged step appended to the metrics file (the job's history: a resumed run appends,
// each record carries its step), the same records as scalars in TensorBoard event files
// (metrics.tensorboard: a new file per run, train/tensorboard_writer.h), and the memory
// report at the end.
//
// Thread-safety: from the training thread only.
#ifndef RINGMASTER_TRAIN_STEP_REPORTER_H_
#define RINGMASTER_TRAIN_STEP_REPORTER_H_

#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/progress_rate.h"
#include "train/config.h"
#include "train/grad_sync.h"
#include "train/tensorboard_writer.h"

namespace ringmaster::train {

struct StepReporterOptions {
  const TrainConfig* config = nullptr;
  int rank = 0;
  int64_t total_steps = 0;
  int64_t context = 0;      // tokens per sample (language models), else 0
  // Where rank 0's lines go (also to the log). Empty: the log only.
  std::function<void(const std::string&)> progress;
};

// One logged step, as the progress line and the metrics record show it.
struct StepLine {
  int64_t step = 0;  // 1-based: steps done
  uint64_t epoch = 0;  // the data epoch (passes over the training data): "data_epoch"
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  double local_grad_norm = 0;
  std::optional<double> loss_scale;  // fp16
  int64_t skipped_steps = 0;
  // After an evaluation (an epoch end, data.eval_every_steps): a classifier's accuracy, or a
  // language model's perplexity; the loss of both.
  std::optional<double> test_accuracy, test_loss, test_perplexity;
};

class StepReporter {
 public:
  // Rank 0 opens metrics_jsonl and starts a file in metrics_tensorboard (FAILED_PRECONDITION
  // naming the file or directory when it cannot be written).
  static absl::StatusOr<std::unique_ptr<StepReporter>> Create(const StepReporterOptions& options);

  // Logs the line on every rank; rank 0 also hands it to `progress`.
  void Say(const std::string& line) const;

  // The run's first step (after a restore): the clock, the rate's window and the ETA start
  // here.
  void StartAt(int64_t first_step);

  // Whether step `step` (0-based) is logged (epoch ends are logged too).
  bool Logged(int64_t step) const;

  // Every step: its samples (the global batch) and gradient collectives, for the rates.
  void Count(int64_t samples, const GradientSyncStats& stats);

  // A logged step: the progress line, the metrics record (rank 0: a line of metrics_jsonl,
  // and an event of scalars named as the record's fields, but step, in metrics_tensorboard),
  // a debug line with this rank's own gradient norm and communication; starts the next
  // window. A failed TensorBoard write is logged and ends the event file; training goes on.
  void Log(const StepLine& line, const GradientSyncStats& last);

  // Time spent outside the training steps (an evaluation) just now: not counted in the
  // window's rates nor in training_time().
  void ExcludeFromRates(absl::Duration d) {
    window_start_ += d;
    excluded_ += d;
    rate_.Exclude(d);
    sample_rate_.Exclude(d);
  }

  // The run's samples and wall time so far.
  int64_t total_samples() const { return total_samples_; }
  // The rate now (common/progress_rate.h: over the last 30 s of steps), all ranks together:
  // steps per second, samples per second (the samples the window's steps took, over its
  // time: the global batch times the steps' rate but where a data epoch's last step took a
  // smaller batch) and tokens per second (times the context; 0 but for language models).
  // Zeros before the first step.
  struct Rates {
    double steps_per_s = 0;
    double samples_per_s = 0;
    double tokens_per_s = 0;
  };
  Rates rates() const;
  // The figures of the last logged window: samples and tokens per second over the window
  // since the previous progress line (the metrics record's), all ranks together (tokens:
  // language models; else 0), and the share of the window this rank spent in collectives and
  // waited for them. Zeros before the first.
  struct Window {
    double samples_per_s = 0;
    double tokens_per_s = 0;
    double comm_fraction = 0;
    double exposed_comm_fraction = 0;
  };
  const Window& last_window() const { return last_window_; }
  absl::Duration elapsed() const { return absl::Now() - start_; }
  // The steps' time: from StartAt to the end of the last step counted (Count), less the time
  // excluded from the rates (ExcludeFromRates) before it; what follows the last step (its
  // checkpoint, the final evaluation) is not in it, as it is in no rate. Zero before a step.
  absl::Duration training_time() const { return training_time_; }

 private:
  explicit StepReporter(const StepReporterOptions& options);

  StepReporterOptions options_;
  const int64_t log_every_;
  std::ofstream metrics_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  int64_t first_step_ = 0;
  absl::Time start_;
  absl::Time window_start_;
  int64_t window_samples_ = 0, total_samples_ = 0;
  ProgressRate rate_;
  // The samples done, over the same window: a data epoch's last step may take a smaller
  // batch, so samples per second are counted, not the steps' rate times the last batch.
  ProgressRate sample_rate_;
  int64_t counted_step_ = 0;  // steps done as of the last Count
  int64_t batch_ = 0;         // the last step's samples
  absl::Duration window_comm_, window_exposed_;
  absl::Duration excluded_;       // since StartAt
  absl::Duration training_time_;  // as of the last Count
  Window last_window_;
};

// "42s", "3m05s", "1h02m": a duration for a progress line.
std::string ShortDuration(absl::Duration d);

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_STEP_REPORTER_H_
