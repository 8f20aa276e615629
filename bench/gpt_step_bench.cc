// Micro-benchmark: what activation checkpointing costs and saves (seed exercise 35.11).
//
// Times GptModel::ForwardBackward of a 12-layer GPT (width 192, 4 heads, context 128, vocab
// 256) at batch 8 with checkpointing off and every 1, 2 and 4 blocks, and prints tokens/s
// and MemoryStats.activation_bytes_peak for each, with the time added and memory saved
// against no checkpointing (the first value of --every), and whether the gradients are
// bit-identical to that run's.
//
//   bazel run -c opt //bench:gpt_step_bench -- [--layers=12] [--width=192] [--heads=4]
//       [--context=128] [--batch=8] [--every=0,1,2,4] [--threads=1]
//       [--probabilities] [--steps=4] [--repetitions=3]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "kernels/matmul.h"
#include "state/tensor.h"
#include "train/model.h"
#include "train/nn/gpt.h"
#include "train/nn/random.h"

ABSL_FLAG(int64_t, layers, 12, "blocks");
ABSL_FLAG(int64_t, width, 192, "channels");
ABSL_FLAG(int64_t, heads, 4, "attention heads");
ABSL_FLAG(int64_t, context, 128, "tokens per sample");
ABSL_FLAG(int64_t, vocab, 256, "vocabulary");
ABSL_FLAG(int64_t, batch, 8, "samples per step");
ABSL_FLAG(std::string, every, "0,1,2,4", "checkpoint_every values to compare; 0 = off");
ABSL_FLAG(int, threads, 1, "BLAS threads");
ABSL_FLAG(bool, probabilities, false, "attention keeps its probabilities (not memory-efficient)");
ABSL_FLAG(int, steps, 4, "timed steps per repetition");
ABSL_FLAG(int, repetitions, 3, "repetitions; the median is reported");

namespace ringmaster::train::nn {
namespace {

using Clock = std::chrono::steady_clock;

struct Result {
  int64_t every;
  double tokens_per_second;  // median
  double min;
  double max;
  int64_t activation_bytes;
  std::vector<float> grads;  // of the last step
};

Result Measure(GptOptions options, const ForwardBackwardOptions& fb) {
  absl::StatusOr<std::unique_ptr<GptModel>> created = GptModel::Create(options);
  if (!created.ok()) {
    std::fprintf(stderr, "%s\n", created.status().ToString().c_str());
    std::exit(1);
  }
  GptModel& model = **created;
  const int64_t n = absl::GetFlag(FLAGS_batch);
  Batch batch;
  batch.size = n;
  batch.context = options.context;
  SplitMix64 rng(1);
  for (int64_t i = 0; i < n * (options.context + 1); ++i) {
    batch.tokens.push_back(static_cast<int32_t>(rng.Next() % options.vocab));
  }
  state::FlatBuffer params(model.table().total_elements()), grads(model.table().total_elements());
  model.Init(1, params);
  auto step = [&] {
    if (!model.ForwardBackward(batch, params, grads, fb).ok()) std::abort();
  };
  step();  // grows the buffers
  std::vector<double> rates;
  for (int r = 0; r < absl::GetFlag(FLAGS_repetitions); ++r) {
    const Clock::time_point start = Clock::now();
    for (int s = 0; s < absl::GetFlag(FLAGS_steps); ++s) step();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    rates.push_back(absl::GetFlag(FLAGS_steps) * n * options.context / seconds);
  }
  std::sort(rates.begin(), rates.end());
  return {options.checkpoint_every,
          rates[rates.size() / 2],
          rates.front(),
          rates.back(),
          model.memory().activation_bytes_peak,
          std::vector<float>(grads.data(), grads.data() + grads.size())};
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

int Run() {
  std::vector<int64_t> every;
  for (absl::string_view v : absl::StrSplit(absl::GetFlag(FLAGS_every), ',')) {
    int64_t k;
    if (!absl::SimpleAtoi(v, &k) || k < 0) {
      std::fprintf(stderr, "--every must list numbers >= 0\n");
      return 2;
    }
    every.push_back(k);
  }
  kernels::SetBlasThreads(absl::GetFlag(FLAGS_threads));
  GptOptions options{.layers = absl::GetFlag(FLAGS_layers),
                     .heads = absl::GetFlag(FLAGS_heads),
                     .width = absl::GetFlag(FLAGS_width),
                     .context = absl::GetFlag(FLAGS_context),
                     .vocab = absl::GetFlag(FLAGS_vocab),
                     .memory_efficient_attention = !absl::GetFlag(FLAGS_probabilities)};
  ForwardBackwardOptions fb;  // fp32
  fb.loss_divisor = static_cast<double>(absl::GetFlag(FLAGS_batch) * options.context);

  std::printf("%s, batch %lld, %d BLAS thread(s), fp32, %d x %d steps\n",
              GptModel::Create(options).value()->Describe().c_str(),
              static_cast<long long>(absl::GetFlag(FLAGS_batch)), kernels::BlasThreads(),
              absl::GetFlag(FLAGS_repetitions), absl::GetFlag(FLAGS_steps));
  std::printf("%-18s %12s %20s %14s %12s %12s  %s\n", "checkpointing", "tokens/s", "(min..max)",
              "activations", "time added", "mem saved", "gradients");
  std::vector<Result> results;
  for (int64_t k : every) {
    options.checkpoint_every = k;
    const Result r = Measure(options, fb);
    results.push_back(r);
    const Result& base = results.front();  // the first listed: off by default
    const std::string name = k == 0 ? "off" : "every " + std::to_string(k) + " blocks";
    std::printf("%-18s %12.0f %9.0f..%-9.0f %10.1f MiB %11.1f%% %11.1f%%  %s\n", name.c_str(),
                r.tokens_per_second, r.min, r.max, r.activation_bytes / 1048576.0,
                100 * (base.tokens_per_second / r.tokens_per_second - 1),
                100 * (1 - static_cast<double>(r.activation_bytes) / base.activation_bytes),
                SameBits(r.grads, base.grads) ? "identical" : "DIFFERENT");
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace ringmaster::train::nn

int main(int argc, char** argv) {
  const std::string blas = ringmaster::kernels::UseBestBlasKernels(argv);
  absl::ParseCommandLine(argc, argv);
  if (!blas.empty()) printf("%s\n", blas.c_str());
  return ringmaster::train::nn::Run();
}
