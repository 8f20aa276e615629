// `ringctl estimate cost`: what training costs in GPU-hours, wall time and dollars, on demand
// and on spot machines that are preempted, and the checkpoint interval that loses the least
// (seed exercises 26.20, 26.21, 35.22 and chapter 26's quiz).
//
// The model, in hours (every term is printed, so that a person can check it):
//
//   work F        6·N·D FLOPs (N parameters, D tokens; Kaplan et al. 2020), or --flops, or
//                 --gpu_hours H measured on the GPU kind at the MFU (F = H·3600·R)
//   rate R        peak dense bf16 FLOP/s of one GPU × MFU
//   GPU-hours     H = F / R / 3600;  wall time T0 = H / G on G GPUs
//   on demand     H × price;  spot without preemptions: H × spot price
//   saves         a save of C hours every τ hours of work: T_work = T0 · (1 + C/τ)
//   preemptions   λ per hour of the job's wall time (any of its machines); each loses
//                 L = τ/2 + restart (half an interval of work on average, then the restart),
//                 or the given --lost_per_preemption. Preemptions also strike the redone work,
//                 so the spot run takes T = T_work / (1 − λL) and meets n = λT of them; it
//                 never ends when λL ≥ 1. Spot cost: T × G × spot price.
//   break-even    the rate λ* at which spot costs as much as on demand:
//                 T_work · s / (1 − λ*L) = T0 · p  →  λ* = (1 − T_work·s / (T0·p)) / L,
//                 and the preemptions the run then meets, n* = (T0·p/s − T_work) / L.
//   Young/Daly    the interval that minimises saves plus lost work: τ* = sqrt(2·C·MTBF),
//                 MTBF = 1/λ (Young 1974; Daly 2006's first-order term).
//   budget        the FLOPs a budget B buys: B/p · R · 3600 on demand; on spot the same at
//                 s, times (1 − λL) / (1 + C/τ).
//
// Thread-safety: the functions are pure but for reading the spec file.
#ifndef RINGMASTER_CLI_ESTIMATE_COST_H_
#define RINGMASTER_CLI_ESTIMATE_COST_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cli/command_line.h"
#include "cli/output.h"
#include "nlohmann/json.hpp"

namespace ringmaster::cli {

// A GPU kind of the built-in table (GpuKinds()).
struct GpuKind {
  std::string name;         // as --gpu names it: "a100"
  std::string description;  // "A100 SXM 80GB"
  double peak_tflops = 0;   // dense (not 2:4 sparse) bf16 tensor-core TFLOP/s, per GPU
  double memory_gb = 0;
  double price = 0;         // on demand, dollars per GPU-hour
  double spot_price = 0;    // spot, dollars per GPU-hour
};

// The table, in the order --help lists it; its comments say where each number comes from.
const std::vector<GpuKind>& GpuKinds();

// What the estimate is of, every flag resolved to a number.
struct CostInputs {
  std::string work;  // how the FLOPs were found, for the heading
  double flops = 0;
  double parameters = 0;  // 0 when the work was given as --flops or --gpu_hours
  double tokens = 0;
  GpuKind gpu;
  int gpus = 1;
  double mfu = 0;
  // Spot and preemptions, in hours; nullopt: not given.
  std::optional<double> preemptions_per_hour;  // λ of the job
  std::optional<double> checkpoint_interval;   // τ
  std::optional<double> checkpoint_save;       // C
  double restart = 0;
  std::optional<double> lost_per_preemption;   // L given directly (else τ/2 + restart)
  std::optional<double> budget;                // dollars
};

// What the model above gives. Hours and dollars; nullopt where an input is missing.
struct CostEstimate {
  double gpu_flops_per_second = 0;  // R
  double gpu_hours = 0;             // H
  double wall_hours = 0;            // T0
  double on_demand_dollars = 0;
  double spot_dollars = 0;  // without preemptions (nor saves)
  std::optional<double> lost_per_preemption;  // L
  double save_overhead = 0;                   // C/τ (0 without both)
  // With a preemption rate: the spot run's wall time, preemptions, lost GPU-hours and cost;
  // infinite (never ends) when λL >= 1.
  std::optional<double> spot_wall_hours;
  std::optional<double> expected_preemptions;
  std::optional<double> lost_gpu_hours;
  std::optional<double> spot_preempted_dollars;
  // With L: the break-even rate (per hour; 0 when spot never costs less) and count.
  std::optional<double> break_even_per_hour;
  std::optional<double> break_even_preemptions;
  // With C and λ: Young/Daly's interval.
  std::optional<double> young_daly_interval;
  // With a budget: the FLOPs it buys on demand and (with λ or saves) on spot.
  std::optional<double> budget_on_demand_flops;
  std::optional<double> budget_spot_flops;
};

CostEstimate EstimateCost(const CostInputs& in);

// The flags into inputs: the work (--params and --tokens, --flops, --gpu_hours, or --spec
// with its model's parameters and steps × batch.global × model.gpt.context tokens), the GPU
// kind with its overrides, the durations ("30m", "1.5h", "90s"). Errors: INVALID_ARGUMENT
// naming the flag (an unknown --gpu lists the kinds); a spec's errors start "--spec FILE: ".
absl::StatusOr<CostInputs> ResolveCostInputs(const EstimateCostFlags& flags);

// The table (kTable) or the document (kJson, kYaml), newline-terminated.
std::string FormatCost(const CostInputs& in, const CostEstimate& e, OutputFormat format);
nlohmann::ordered_json CostJson(const CostInputs& in, const CostEstimate& e);

// ResolveCostInputs, EstimateCost and FormatCost.
absl::StatusOr<std::string> EstimateCostText(const EstimateCostFlags& flags, OutputFormat format);

}  // namespace ringmaster::cli

#endif  // RINGMASTER_CLI_ESTIMATE_COST_H_
