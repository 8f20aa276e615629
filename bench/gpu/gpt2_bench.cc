// The GPT-2 training step on one GPU (issue 7): ringmaster's GptCuda (train/nn/gpt_cuda.h)
// doing what bench/gpu/gpt2_torch.py does for PyTorch, to run in the same call and compare:
// forward and backward, gradient clipping at norm 1.0, and AdamW (lr 6e-4, betas 0.9/0.95,
// weight decay 0.1) over the flat parameters, on random tokens (4 fixed batches). The LM
// head is untied, as in ringmaster's model: pass --untied to gpt2_torch.py.
//
//   gpt2_bench --batch=16 --matmul=bf16 --torch=bench/gpu/gpt2_torch.py   # with the ratios
//   gpt2_bench --batch=8 --matmul=tf32 --steps=20
//   python3 bench/gpu/gpt2_torch.py --batch 8 --untied --precisions fp32 --tf32
//   gpt2_bench --batch=8 --matmul=bf16 --steps=20
//   python3 bench/gpu/gpt2_torch.py --batch 8 --untied --precisions bf16
//   gpt2_bench --batch=8 --matmul=bf16 --checkpoint_every=1   # seed exercise 35.11
//   gpt2_bench --batch=16 --matmul=bf16 --profile   # time per kind of work (CUDA events)
//   gpt2_bench --batch=8 --matmul=fp16 --loss_scale_mode=fixed --loss_scale=1024   # 35.17
//   python3 bench/gpu/gpt2_torch.py --batch 8 --untied --precisions fp16
//
// fp16 scales the loss and unscales the gradients with the trainer's LossScaler (on the GPU,
// through CudaVectorOps; a step whose gradients overflow is skipped, and in dynamic mode the
// scale halves), and reports how many steps overflowed (seed exercises 35.17, 35.18).
//
// Memory (seed exercise 35.15): the device memory each part takes, measured as the drop in
// cudaMemGetInfo's free bytes around its allocation (so the CUDA context is not counted and
// the allocator's 2 MiB granularity is), against the ZeRO paper's formula for the model
// states (train/memory_estimate.h: 16 bytes per parameter with Adam, fp32 or mixed) and
// Korthikanti et al.'s for the activations (34 s b h bytes per layer in 16-bit without the
// attention matrix, which memory-efficient attention never stores; doubled for fp32), plus
// the logits and their gradient (2 x s b V elements), which that formula leaves out.
//
// FLOPs per token as gpt2_torch.py counts them: 6 N (N without the position embedding) plus
// attention's 6 L T C. MFU against --peak_tflops (989.4: the H100/H200 SXM's dense bf16 peak,
// the yardstick, even for these fp32/TF32 runs). Timing: wall clock around each step
// with the device synchronised (each step waits for its loss anyway); the median of --steps
// after --warmup. Our step also uploads its tokens and builds the embedding index on the
// host; PyTorch's tokens are already on the GPU.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/matmul.h"
#include "state/range.h"
#include "state/tensor.h"
#include "train/memory_estimate.h"
#include "train/nn/gpt_cuda.h"
#include "train/optim/cuda_vector_ops.h"
#include "train/optim/loss_scaler.h"
#include "train/optim/sum_across_ranks.h"

ABSL_FLAG(int64_t, batch, 8, "samples per step");
ABSL_FLAG(int64_t, context, 1024, "tokens per sample");
ABSL_FLAG(int64_t, layers, 12, "blocks");
ABSL_FLAG(int64_t, heads, 12, "attention heads");
ABSL_FLAG(int64_t, width, 768, "channels");
ABSL_FLAG(int64_t, vocab, 50257, "vocabulary");
ABSL_FLAG(int64_t, logits_alignment, 64,
          "pad the logits' rows to a multiple of this many elements (GptCudaOptions::"
          "logits_row_alignment; 1: dense rows of --vocab)");
ABSL_FLAG(std::string, matmul, "tf32",
          "fp32 or tf32 (fp32 activations), or bf16 or fp16 (16-bit activations and products, "
          "fp32 master parameters and gradients; fp16 with loss scaling)");
ABSL_FLAG(std::string, loss_scale_mode, "dynamic", "fp16: dynamic or fixed loss scaling");
ABSL_FLAG(double, loss_scale, 65536, "fp16: the initial (or fixed) loss scale");
ABSL_FLAG(int64_t, growth_interval, 2000, "fp16, dynamic: good steps before the scale doubles");
ABSL_FLAG(int64_t, checkpoint_every, 0,
          "activation checkpointing: keep every k-th block's input and recompute the rest in "
          "backward (0: off)");
ABSL_FLAG(int, warmup, 3, "steps before timing");
ABSL_FLAG(int, steps, 20, "timed steps");
ABSL_FLAG(double, peak_tflops, 989.4, "the GPU's dense bf16 peak, for MFU");
ABSL_FLAG(std::string, torch, "",
          "path of bench/gpu/gpt2_torch.py: PyTorch runs the same model, shapes, precision and "
          "step first (python3), and the ratios are printed");
ABSL_FLAG(std::string, torch_modes, "eager,compile", "PyTorch's modes for --torch");
ABSL_FLAG(bool, profile, false,
          "time each kind of work in the forward and backward (CUDA events around every "
          "launch, which cost a little time themselves) and print the breakdown");

namespace ringmaster::train::nn {
namespace {

void CheckOk(const absl::Status& status, const char* what) {
  if (!status.ok()) {
    std::fprintf(stderr, "gpt2_bench: %s: %s\n", what, status.ToString().c_str());
    std::exit(1);
  }
}

void CheckCuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "gpt2_bench: %s: %s\n", what, cudaGetErrorString(err));
    std::exit(1);
  }
}

template <typename T>
T* DeviceAlloc(int64_t n) {
  void* p = nullptr;
  CheckCuda(cudaMalloc(&p, n * sizeof(T)), "cudaMalloc");
  return static_cast<T*>(p);
}

struct TorchRun {
  std::string mode;
  double step_ms = 0;
};

// Runs gpt2_torch.py on the same shapes and precision (its process exits, and with it its
// GPU memory, before ours allocates) and reads its JSON: each result's mode and median step.
// Empty when it failed (it says why on stderr).
std::vector<TorchRun> RunTorch(const std::string& script, const GptOptions& o, int64_t batch,
                               const std::string& matmul) {
  const char* tmp = std::getenv("TMPDIR");
  const std::string json =
      absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/gpt2_torch_", getpid(), ".json");
  const std::string precision = matmul == "tf32" ? "fp32" : matmul;
  const std::string command = absl::StrCat(
      "python3 ", script, " --batch ", batch, " --context ", o.context, " --vocab ", o.vocab,
      " --width ", o.width, " --layers ", o.layers, " --heads ", o.heads, " --untied --modes ",
      absl::GetFlag(FLAGS_torch_modes), " --precisions ", precision,
      matmul == "tf32" ? " --tf32" : "", " --steps ", absl::GetFlag(FLAGS_steps), " --json ",
      json);
  std::printf("$ %s\n", command.c_str());
  std::fflush(stdout);
  if (std::system(command.c_str()) != 0) {
    std::fprintf(stderr, "gpt2_bench: PyTorch's run failed; no ratios\n");
    return {};
  }
  std::ifstream in(json);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(json.c_str());
  std::vector<TorchRun> runs;
  for (size_t at = text.find("\"mode\": \""); at != std::string::npos;
       at = text.find("\"mode\": \"", at + 1)) {
    TorchRun r;
    const size_t begin = at + 9, end = text.find('"', begin);
    r.mode = text.substr(begin, end - begin);
    const size_t ms = text.find("\"step_ms_median\": ", at);
    if (ms == std::string::npos) break;
    r.step_ms = std::strtod(text.c_str() + ms + 18, nullptr);
    std::printf("pytorch %s: %.2f ms per step (median)\n", r.mode.c_str(), r.step_ms);
    runs.push_back(r);
  }
  return runs;
}

// Device bytes in use now (total minus free), after the device has finished its work.
int64_t UsedBytes() {
  CheckCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  size_t free_bytes = 0, total = 0;
  CheckCuda(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo");
  return static_cast<int64_t>(total - free_bytes);
}

double GiB(double bytes) { return bytes / double(1 << 30); }

int Main() {
  namespace kc = kernels::cuda;
  GptOptions o;
  o.layers = absl::GetFlag(FLAGS_layers);
  o.heads = absl::GetFlag(FLAGS_heads);
  o.width = absl::GetFlag(FLAGS_width);
  o.context = absl::GetFlag(FLAGS_context);
  o.vocab = absl::GetFlag(FLAGS_vocab);
  o.checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every);
  const std::string matmul = absl::GetFlag(FLAGS_matmul);
  if (matmul != "fp32" && matmul != "tf32" && matmul != "bf16" && matmul != "fp16") {
    std::fprintf(stderr, "gpt2_bench: --matmul is %s; want fp32, tf32, bf16 or fp16\n",
                 matmul.c_str());
    return 2;
  }
  const std::string mode = absl::GetFlag(FLAGS_loss_scale_mode);
  if (mode != "dynamic" && mode != "fixed") {
    std::fprintf(stderr, "gpt2_bench: --loss_scale_mode is %s; want dynamic or fixed\n",
                 mode.c_str());
    return 2;
  }
  // PyTorch first, so that its GPU memory is gone before ours is taken.
  std::vector<TorchRun> torch;
  if (!absl::GetFlag(FLAGS_torch).empty()) {
    torch = RunTorch(absl::GetFlag(FLAGS_torch), o, absl::GetFlag(FLAGS_batch), matmul);
  }
  GptCudaOptions co;
  co.profile = absl::GetFlag(FLAGS_profile);
  co.logits_row_alignment = absl::GetFlag(FLAGS_logits_alignment);
  co.matmul = matmul == "bf16"   ? kc::MatMulType::kBFloat16
              : matmul == "fp16" ? kc::MatMulType::kFloat16
              : matmul == "tf32" ? kc::MatMulType::kTensorFloat32
                                 : kc::MatMulType::kFloat32;
  cudaStream_t stream;
  CheckCuda(cudaStreamCreate(&stream), "cudaStreamCreate");
  CheckCuda(cudaFree(nullptr), "CUDA context");
  const int64_t used_context = UsedBytes();
  absl::StatusOr<std::unique_ptr<GptCuda>> gpt = GptCuda::Create(o, co, stream);
  CheckOk(gpt.status(), "GptCuda::Create");
  // The cuBLASLt workspace and, in bf16, the parameters' bf16 copy.
  const int64_t used_model = UsedBytes();
  const state::TensorTable& table = (*gpt)->cpu_model().table();
  const int64_t n = table.total_elements();

  // Parameters, gradients and the two AdamW moments, flat on the device.
  state::FlatBuffer host_params(n);
  (*gpt)->cpu_model().Init(1, host_params);
  float* params = DeviceAlloc<float>(n);
  const int64_t used_params = UsedBytes();
  float* grads = DeviceAlloc<float>(n);
  const int64_t used_grads = UsedBytes();
  float* exp_avg = DeviceAlloc<float>(n);
  float* exp_avg_sq = DeviceAlloc<float>(n);
  const int64_t used_moments = UsedBytes();
  double* norm_scratch = DeviceAlloc<double>(kc::SumOfSquaresScratchDoubles());
  double* norm = DeviceAlloc<double>(1);
  int* overflow = DeviceAlloc<int>(1);
  CheckCuda(cudaMemcpy(params, host_params.data(), n * 4, cudaMemcpyHostToDevice), "upload");
  CheckCuda(cudaMemset(exp_avg, 0, n * 4), "memset");
  CheckCuda(cudaMemset(exp_avg_sq, 0, n * 4), "memset");

  const int64_t batch_size = absl::GetFlag(FLAGS_batch);
  std::vector<Batch> batches(4);
  std::mt19937 gen(7);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(o.vocab - 1));
  for (Batch& b : batches) {
    b.size = batch_size;
    b.context = o.context;
    b.tokens.resize(batch_size * (o.context + 1));
    for (int32_t& t : b.tokens) t = id(gen);
  }

  // fp16: the trainer's loss scaler, on the GPU.
  std::optional<LossScaler> scaler;
  absl::StatusOr<std::unique_ptr<CudaVectorOps>> ops = CudaVectorOps::Create(stream);
  CheckOk(ops.status(), "CudaVectorOps::Create");
  if (matmul == "fp16") {
    LossScalerOptions lso;
    lso.mode = mode == "fixed" ? LossScalerOptions::Mode::kFixed : LossScalerOptions::Mode::kDynamic;
    lso.initial_scale = absl::GetFlag(FLAGS_loss_scale);
    lso.growth_interval = absl::GetFlag(FLAGS_growth_interval);
    absl::StatusOr<LossScaler> s = LossScaler::Create(lso);
    CheckOk(s.status(), "--loss_scale*");
    scaler.emplace(*std::move(s));
  }
  ForwardBackwardOptions fb;
  fb.loss_divisor = static_cast<double>(batch_size * o.context);
  fb.precision = (*gpt)->precision();
  int64_t adam_step = 0;
  double last_loss = 0;
  auto step = [&](int i) {
    if (scaler) fb.loss_scale = scaler->scale();
    absl::StatusOr<StepStats> stats =
        (*gpt)->ForwardBackward(batches[i % batches.size()], params, grads, fb);
    CheckOk(stats.status(), "ForwardBackward");
    last_loss = stats->loss_sum / stats->loss_terms;
    if (scaler) {
      absl::StatusOr<StepVerdict> verdict =
          scaler->UnscaleAndUpdate(absl::MakeSpan(grads, n), SumOnOneRank, ops->get());
      CheckOk(verdict.status(), "UnscaleAndUpdate");
      if (*verdict == StepVerdict::kSkip) return;
    }
    // Clip at global norm 1.0 (one read-back of the norm, as PyTorch's clip_grad_norm_).
    CheckOk(kc::SumOfSquares(grads, n, norm_scratch, norm, stream), "SumOfSquares");
    double sum = 0;
    CheckCuda(cudaMemcpyAsync(&sum, norm, 8, cudaMemcpyDeviceToHost, stream), "norm");
    CheckCuda(cudaStreamSynchronize(stream), "sync");
    const double grad_norm = std::sqrt(sum);
    if (grad_norm > 1.0) {
      CheckOk(kc::ScaleAndFindNonFinite(grads, n, static_cast<float>(1.0 / grad_norm), overflow,
                                        stream),
              "clip");
    }
    kernels::AdamMomentArgs moments;
    moments.beta1 = 0.9f;
    moments.beta2 = 0.95f;
    moments.step = ++adam_step;
    CheckOk(kc::AdamWStep(moments, 6e-4f, 0.1f, params, grads, exp_avg, exp_avg_sq, n, stream),
            "AdamWStep");
    CheckCuda(cudaStreamSynchronize(stream), "sync");
  };

  const int64_t used_before_steps = UsedBytes();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < absl::GetFlag(FLAGS_warmup); ++i) step(i);
  const double warmup_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<double> times;
  for (int i = 0; i < absl::GetFlag(FLAGS_steps); ++i) {
    const auto start = std::chrono::steady_clock::now();
    step(absl::GetFlag(FLAGS_warmup) + i);
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  const double step_s = sorted[sorted.size() / 2];

  int64_t n_flop = table.parameter_count();
  if (absl::StatusOr<int> wpe = table.Find("wpe"); wpe.ok()) n_flop -= table.tensor(*wpe).numel;
  const double tokens = static_cast<double>(batch_size * o.context);
  const double flops_per_token =
      6.0 * n_flop + 6.0 * o.layers * o.context * static_cast<double>(o.width);
  const double tflops = flops_per_token * tokens / step_s / 1e12;
  cudaDeviceProp prop;
  CheckCuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf(
      "ringmaster %-7s %-5s checkpoint_every %lld, logits rows of %lld, batch %lld x %lld on %s: "
      "step %.2f ms median (min %.2f, max %.2f), "
      "%.0f tokens/s, %.1f TFLOP/s, MFU %.1f %% of %.1f; %lld parameters (%lld counted); "
      "activations %.2f GiB + parameters, gradients and moments %.2f GiB + 16-bit parameter "
      "copy %.2f GiB; warm-up %.1f s; loss %.4f%s\n",
      matmul == "bf16" || matmul == "fp16" ? matmul.c_str() : "fp32", matmul.c_str(),
      static_cast<long long>(o.checkpoint_every), static_cast<long long>((*gpt)->logits_stride()),
      static_cast<long long>(batch_size), static_cast<long long>(o.context), prop.name,
      step_s * 1e3, sorted.front() * 1e3, sorted.back() * 1e3, tokens / step_s, tflops,
      100 * tflops / absl::GetFlag(FLAGS_peak_tflops), absl::GetFlag(FLAGS_peak_tflops),
      static_cast<long long>(table.parameter_count()), static_cast<long long>(n_flop),
      (*gpt)->activation_bytes() / double(1 << 30), 4.0 * n * 4 / double(1 << 30),
      (*gpt)->parameter_copy_bytes() / double(1 << 30), warmup_s, last_loss,
      scaler ? absl::StrFormat("; %s loss scale: %d of %d steps overflowed and were skipped, "
                               "scale now %g",
                               mode, scaler->state().skipped_steps, scaler->state().steps,
                               scaler->scale())
                   .c_str()
             : "");

  // The memory breakdown against the formulas.
  const int64_t used_end = UsedBytes();
  const bool half = matmul == "bf16" || matmul == "fp16";
  MemoryEstimateOptions mo;
  mo.parameters = static_cast<double>(table.parameter_count());
  mo.mixed_precision = half;
  absl::StatusOr<MemoryEstimate> formula = EstimateMemory(mo);
  CheckOk(formula.status(), "EstimateMemory");
  const double psi = mo.parameters;
  const double sbh = tokens * static_cast<double>(o.width);
  const double act_bytes = half ? 2 : 4;
  const double activations_formula =
      o.layers * 34.0 * sbh * (act_bytes / 2) + 2.0 * tokens * o.vocab * act_bytes;
  std::printf(
      "ringmaster %-7s memory: parameters %.3f GiB (fp32, %.1f B/param) + 16-bit copy and "
      "cuBLASLt workspace %.3f GiB, gradients %.3f GiB (fp32), AdamW moments %.3f GiB; model "
      "states %.3f GiB = %.1f B/param against the formula's %.3f GiB = %.0f B/param "
      "(parameters %.0f + gradients %.0f + optimizer %.0f B/param%s); activations %.3f GiB "
      "measured (arena %.3f GiB) against %.3f GiB (34 s b h per layer x %d layers + 2 s b V "
      "logits, %.0f-byte activations); total in use after the steps %.3f GiB beyond the CUDA "
      "context's %.3f GiB\n",
      matmul.c_str(), GiB(used_params - used_model), (used_params - used_model) / psi,
      GiB(used_model - used_context), GiB(used_grads - used_params),
      GiB(used_moments - used_grads), GiB(used_moments - used_context),
      (used_moments - used_context) / psi, GiB(formula->total_bytes()),
      formula->bytes_per_parameter_unsharded, formula->parameter_bytes / psi,
      formula->gradient_bytes / psi, formula->optimizer_bytes / psi,
      half ? "; ours keeps fp32 gradients (+2) and a 16-bit parameter copy beside the fp32 "
             "master (the formula's optimizer term)"
           : "",
      GiB(used_end - used_before_steps), GiB((*gpt)->activation_bytes()),
      GiB(activations_formula), static_cast<int>(o.layers), act_bytes, GiB(used_end - used_context),
      GiB(used_context));
  if ((*gpt)->profiled_calls() > 0) {
    // Per step, largest first, as a share of the median step.
    std::vector<std::pair<double, std::string>> parts;
    double total = 0;
    for (const auto& [what, ms] : (*gpt)->profile_ms()) {
      parts.push_back({ms / (*gpt)->profiled_calls(), what});
      total += parts.back().first;
    }
    std::sort(parts.rbegin(), parts.rend());
    std::printf("ringmaster %-7s profile per step (forward and backward; %.2f ms of the %.2f ms "
                "step, the rest is the optimizer, the host and gaps):\n",
                matmul.c_str(), total, step_s * 1e3);
    for (const auto& [ms, what] : parts) {
      std::printf("  %-36s %8.3f ms  %5.1f %%\n", what.c_str(), ms, 100 * ms / (step_s * 1e3));
    }
  }
  for (const TorchRun& r : torch) {
    std::printf("ringmaster %-7s vs pytorch %-7s: %.2fx its tokens/s (%.2f ms against %.2f ms "
                "per step)\n",
                matmul.c_str(), r.mode.c_str(), r.step_ms / (step_s * 1e3), step_s * 1e3,
                r.step_ms);
  }
  return 0;
}

}  // namespace
}  // namespace ringmaster::train::nn

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ringmaster::train::nn::Main();
}
