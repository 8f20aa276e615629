// Micro-benchmark: training-step throughput of the classifiers on CPU.
//
// Times Model::ForwardBackward of the 784-512-512-10 MLP at batch 128 with one BLAS thread
// by default: the model and setting of BENCHMARKS.md "Training step on CPU", where PyTorch
// with OpenBLAS runs 15–18k samples/s on one core. PyTorch's figure includes its optimizer
// step, so a second line adds a plain SGD-with-momentum update over the flat buffers (a
// stand-in for train/optim) to each step.
//
//   bazel run //train/nn:mlp_step_bench -- [--batch=128] [--threads=1] [--precision=fp32]
//                                          [--model=mlp|cnn] [--steps=200] [--repetitions=5]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "kernels/matmul.h"
#include "state/tensor.h"
#include "train/model.h"
#include "train/nn/classifiers.h"
#include "train/nn/random.h"

ABSL_FLAG(int64_t, batch, 128, "samples per step");
ABSL_FLAG(int, threads, 1, "BLAS threads");
ABSL_FLAG(std::string, precision, "fp32", "compute precision: fp32, bf16 or fp16 (emulated)");
ABSL_FLAG(std::string, model, "mlp", "mlp (784-512-512-10) or cnn (conv16-conv32-fc128)");
ABSL_FLAG(int, steps, 200, "timed steps per repetition");
ABSL_FLAG(int, repetitions, 5, "repetitions; the median is reported");

namespace ringmaster::train::nn {
namespace {

using Clock = std::chrono::steady_clock;

int Run() {
  ForwardBackwardOptions options;
  const std::string precision = absl::GetFlag(FLAGS_precision);
  if (precision == "bf16") {
    options.precision = Precision::kBFloat16;
  } else if (precision == "fp16") {
    options.precision = Precision::kFloat16;
  } else if (precision != "fp32") {
    std::fprintf(stderr, "--precision must be fp32, bf16 or fp16, not %s\n", precision.c_str());
    return 2;
  }
  ModelOptions model_options;
  if (absl::GetFlag(FLAGS_model) == "cnn") {
    model_options.kind = ModelKind::kCnn;
  } else if (absl::GetFlag(FLAGS_model) != "mlp") {
    std::fprintf(stderr, "--model must be mlp or cnn\n");
    return 2;
  }
  absl::StatusOr<std::unique_ptr<Model>> created = CreateModel(model_options);
  if (!created.ok()) {
    std::fprintf(stderr, "%s\n", created.status().ToString().c_str());
    return 1;
  }
  Model& model = **created;
  const auto& classifier = dynamic_cast<const SequentialClassifier&>(model);
  kernels::SetBlasThreads(absl::GetFlag(FLAGS_threads));

  const int64_t n = absl::GetFlag(FLAGS_batch);
  Batch batch;
  batch.size = n;
  batch.feature_dim = classifier.input_size();
  batch.features.resize(n * batch.feature_dim);
  SplitMix64 rng(1);
  for (float& x : batch.features) x = rng.NextUnit();
  for (int64_t i = 0; i < n; ++i) batch.labels.push_back(static_cast<int32_t>(i % 10));
  options.loss_divisor = static_cast<double>(n);

  const int64_t size = model.table().total_elements();
  state::FlatBuffer params(size), grads(size), momentum(size);
  model.Init(1, params);

  auto time_steps = [&](bool with_update) {
    std::vector<double> rates;
    for (int r = 0; r < absl::GetFlag(FLAGS_repetitions); ++r) {
      const Clock::time_point start = Clock::now();
      for (int s = 0; s < absl::GetFlag(FLAGS_steps); ++s) {
        if (!model.ForwardBackward(batch, params, grads, options).ok()) std::abort();
        if (!with_update) continue;
        float* p = params.data();
        float* g = grads.data();
        float* v = momentum.data();
        for (int64_t i = 0; i < size; ++i) {
          v[i] = 0.9f * v[i] + g[i];
          p[i] -= 1e-3f * v[i];
        }
      }
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      rates.push_back(absl::GetFlag(FLAGS_steps) * n / seconds);
    }
    std::sort(rates.begin(), rates.end());
    return std::vector<double>{rates.front(), rates[rates.size() / 2], rates.back()};
  };

  for (int s = 0; s < 20; ++s) (void)model.ForwardBackward(batch, params, grads, options);
  std::printf("%s, batch %lld, %d BLAS thread(s), %s, %d x %d steps\n", model.Describe().c_str(),
              static_cast<long long>(n), kernels::BlasThreads(), precision.c_str(),
              absl::GetFlag(FLAGS_repetitions), absl::GetFlag(FLAGS_steps));
  const std::vector<double> fb = time_steps(false);
  std::printf("ForwardBackward:          %8.0f samples/s median (min %.0f, max %.0f)\n", fb[1],
              fb[0], fb[2]);
  const std::vector<double> step = time_steps(true);
  std::printf("ForwardBackward + SGD-m:  %8.0f samples/s median (min %.0f, max %.0f)\n", step[1],
              step[0], step[2]);
  std::printf("activation memory peak: %lld bytes\n",
              static_cast<long long>(model.memory().activation_bytes_peak));
  return 0;
}

}  // namespace
}  // namespace ringmaster::train::nn

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ringmaster::train::nn::Run();
}
