// TrainingDevice: where a rank's model runs when it is not the CPU — one CUDA GPU holding the
// flat parameters and gradients in its memory (ARCHITECTURE.md: "flat buffers"), running the
// model's forward and backward there, with VectorOps for the optimizer step on the same
// memory (train/optim/vector_ops.h). The trainer keeps host copies only for checkpoints,
// fingerprints, evaluation and the state kept between an elastic job's epochs.
//
// The GPT (train/nn/gpt_cuda.h: fp32 activations with fp32 or TF32 products, or bf16 or fp16
// activations) and the classifiers (train/nn/sequential_cuda.h: fp32, fp32 or TF32 products)
// have CUDA paths.
//
//   auto device = CreateCudaDevice(model, padded_elements, {.gpu = 0});
//   sync options: ops = device->ops(), comm_ops = device->comm_ops()
//   device->ForwardBackward(batch, fb);   // on device->params(), into device->grads()
//
// Under pipeline or tensor parallelism (CudaDeviceOptions::stages) the device makes the GPT's
// stages instead (CreateStage; train/pipeline_parallel.h runs them) and its step buffers are
// sized by the strategy (ResizeBuffers).
//
// Not thread-safe except as VectorOps allows (GradientSync's comm thread uses comm_ops and
// waits on ops' marks).
#ifndef RINGMASTER_TRAIN_DEVICE_H_
#define RINGMASTER_TRAIN_DEVICE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "comm/communicator.h"
#include "comm/store.h"
#include "train/batch.h"
#include "train/model.h"
#include "train/nn/gpt.h"
#include "train/optim/vector_ops.h"
#include "train/pipeline/gpt_pipeline_stage.h"

namespace ringmaster::train {

class TrainingDevice {
 public:
  virtual ~TrainingDevice() = default;

  // E.g. "cuda:0 (NVIDIA H100 80GB HBM3, 79.1 GiB free), tf32 products".
  virtual std::string Describe() const = 0;
  // The compute stream's ops (the model's work and the optimizer's), and a second stream's
  // for the gradient reduction thread.
  virtual VectorOps* ops() = 0;
  virtual VectorOps* comm_ops() = 0;
  // The flat buffers in device memory, padded_elements floats each (zero when made).
  virtual absl::Span<float> params() = 0;
  virtual absl::Span<float> grads() = 0;
  // As Model::ForwardBackward over params() and grads(); on_grads_ready is called as the
  // model enqueues each group's gradients (GradientSync marks ops() there).
  virtual absl::StatusOr<StepStats> ForwardBackward(const Batch& batch,
                                                    const ForwardBackwardOptions& options) = 0;
  // Device bytes held: the activations' arena at its largest so far.
  virtual int64_t activation_bytes() const = 0;
  // Device bytes of the 16-bit copy of the parameters the products read (0 in fp32).
  virtual int64_t parameter_copy_bytes() const { return 0; }

  // A device made with CudaDeviceOptions::stages: a stage of the GPT (`slice`: the whole
  // model's options with the stage's blocks and tensor-parallel shard) on this device's
  // compute stream and in its precision, for PipelineParallelOptions::make_stage; with
  // slice.tp_size > 1 its tensor-parallel sums are all-reduces over `tp` (in device memory:
  // NCCL's group, or a host group, which stages through the host), each within `op_timeout`.
  // FAILED_PRECONDITION on a device made without `stages` (or that has none);
  // nn::GptCuda::Create's errors.
  virtual absl::StatusOr<std::unique_ptr<pipeline::GptPipelineStage>> CreateStage(
      const nn::GptOptions& slice, comm::Communicator* tp, absl::Duration op_timeout) {
    return absl::FailedPreconditionError(absl::StrCat(Describe(), " runs no pipeline stages"));
  }
  // A device made with CudaDeviceOptions::stages, for ZeRO-3 over tensor-parallel shards
  // (train/tensor_parallel_sharded.h): from now on ForwardBackward runs `shard` (the GPT's
  // options with its tp_size and tp_rank) on this device, its parameters and gradients
  // through the ParameterStore of ForwardBackwardOptions::store, its tensor-parallel sums as
  // CreateStage's over `tp`. FAILED_PRECONDITION on a device made without `stages`;
  // nn::GptCuda::Create's errors.
  virtual absl::Status RunTensorParallelShard(const nn::GptOptions& shard, comm::Communicator* tp,
                                              absl::Duration op_timeout) {
    return absl::FailedPreconditionError(
        absl::StrCat(Describe(), " runs no tensor-parallel shard"));
  }
  // Replaces params() and grads() by zeroed buffers of `elements` floats each (a mesh's step
  // buffers: their size is the strategy's, known after the device is made).
  // RESOURCE_EXHAUSTED when they do not fit; FAILED_PRECONDITION where the device cannot.
  virtual absl::Status ResizeBuffers(int64_t elements) {
    return absl::FailedPreconditionError(absl::StrCat(Describe(), " cannot resize its buffers"));
  }
};

struct CudaDeviceOptions {
  // The CUDA device ordinal; must be < the GPUs this process sees.
  int gpu = 0;
  // fp32 storage with TF32 tensor-core products (10-bit mantissas) instead of full fp32.
  bool tf32 = false;
  // The activations' precision: kFloat32, or kBFloat16 / kFloat16 (16-bit activations and
  // products; fp32 master parameters, gradients and optimizer state). ForwardBackward takes
  // this precision. A 16-bit precision overrides tf32.
  Precision precision = Precision::kFloat32;
  // Whether ForwardBackward reads the flat params() (data parallelism) rather than a
  // ParameterStore (ForwardBackwardOptions::store: ZeRO-2/3, params() then holds this rank's
  // pieces). In bf16 and fp16 the GPT keeps a 16-bit copy of every parameter for the first,
  // of one parameter group for the second (train/nn/gpt_cuda.h).
  bool flat_parameters = true;
  // The GPT runs as pipeline and tensor-parallel stages (CreateStage) rather than as one
  // whole model: `model` must be a GPT (its CUDA path is checked here); ForwardBackward is
  // then FAILED_PRECONDITION, and the buffers are sized by ResizeBuffers (padded_elements may
  // be 0).
  bool stages = false;
};

// The GPUs this process sees; 0 in a build without CUDA or on error (never fails).
int CudaDeviceCount();
inline bool CudaDeviceAvailable() { return CudaDeviceCount() > 0; }

// The ordinal a rank's slot trains on: slot % (GPUs this process sees), so a node with
// fewer GPUs than ranks shares them. 0 when there is no GPU or slot < 0.
int CudaOrdinalForSlot(int slot);

// GPU `gpu`'s UUID, as 32 hex digits: the same physical GPU gives the same string in every
// process, whatever ordinal CUDA_VISIBLE_DEVICES gives it there.
//   FAILED_PRECONDITION: a build without --config=cuda; INTERNAL: CUDA's error.
absl::StatusOr<std::string> CudaDeviceUuid(int gpu);

struct NcclGradientsOptions {
  int rank = -1;
  int size = 0;
  comm::Store* store = nullptr;  // not owned; where rank 0 publishes the unique id
  std::string prefix;            // fresh for each communicator (e.g. "<epoch prefix>nccl")
  int gpu = 0;                   // CUDA ordinal
  absl::Duration init_timeout = absl::Seconds(60);
};

// An NCCL communicator (comm/nccl) of one rank per GPU, for the gradients.
//   FAILED_PRECONDITION: a build without --config=cuda; else NcclCommunicator::Create's.
absl::StatusOr<std::unique_ptr<comm::Communicator>> CreateNcclGradients(
    const NcclGradientsOptions& options);

// The GPU twin of `model` with its flat buffers on options.gpu.
//   FAILED_PRECONDITION: a build without --config=cuda, no GPU visible, or gpu out of range;
//   UNIMPLEMENTED: the model (or its settings: e.g. a GPT whose heads the attention kernels
//   do not take) has no CUDA path yet (says which);
//   RESOURCE_EXHAUSTED: the GPU's memory does not hold the buffers.
absl::StatusOr<std::unique_ptr<TrainingDevice>> CreateCudaDevice(const Model& model,
                                                                 int64_t padded_elements,
                                                                 const CudaDeviceOptions& options);

}  // namespace ringmaster::train

#endif  // RINGMASTER_TRAIN_DEVICE_H_
