// train/device.h on a CUDA GPU (--config=cuda builds): the GPT through train/nn/gpt_cuda.h,
// the classifiers through train/nn/sequential_cuda.h, the optimizer's passes through
// CudaVectorOps, on two streams of the chosen device.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "comm/nccl/nccl_communicator.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "train/device.h"
#include "train/nn/gpt.h"
#include "train/nn/gpt_cuda.h"
#include "train/nn/sequential.h"
#include "train/nn/sequential_cuda.h"
#include "train/optim/cuda_vector_ops.h"
#include "train/pipeline/gpt_cuda_stage.h"

namespace ringmaster::train {
namespace {

namespace kc = kernels::cuda;

// Owns a stream; destroys it last (declared first in CudaDevice).
struct Stream {
  cudaStream_t stream = nullptr;
  ~Stream() {
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

class CudaDevice final : public TrainingDevice {
 public:
  // `model` is a GptModel or a SequentialClassifier (the caller checked).
  static absl::StatusOr<std::unique_ptr<CudaDevice>> Create(const Model& model, int64_t padded,
                                                            const CudaDeviceOptions& options) {
    auto d = absl::WrapUnique(new CudaDevice);
    d->gpu_ = options.gpu;
    d->type_ = options.precision == Precision::kBFloat16  ? kc::MatMulType::kBFloat16
               : options.precision == Precision::kFloat16 ? kc::MatMulType::kFloat16
               : options.tf32                             ? kc::MatMulType::kTensorFloat32
                                                          : kc::MatMulType::kFloat32;
    RM_RETURN_IF_CUDA_ERROR(cudaSetDevice(options.gpu));
    // Blocking streams (the default flags): the TCP backend's staging copies run on the
    // legacy default stream, which then orders itself with them.
    RM_RETURN_IF_CUDA_ERROR(cudaStreamCreate(&d->compute_.stream));
    RM_RETURN_IF_CUDA_ERROR(cudaStreamCreate(&d->comm_.stream));
    RM_ASSIGN_OR_RETURN(d->ops_, CudaVectorOps::Create(d->compute_.stream));
    RM_ASSIGN_OR_RETURN(d->comm_ops_, CudaVectorOps::Create(d->comm_.stream));
    RM_RETURN_IF_ERROR(d->ResizeBuffers(padded));
    d->stages_ = options.stages;
    if (const auto* gpt = dynamic_cast<const nn::GptModel*>(&model)) {
      nn::GptCudaOptions go;
      go.matmul = d->type_;
      go.flat_parameters = options.flat_parameters;
      if (options.stages) {
        // Its slices or shards run (CreateStage, RunTensorParallelShard): no whole model
        // here, which need not fit on this GPU; only whether it has a CUDA path.
        RM_RETURN_IF_ERROR(nn::GptCuda::CheckSupported(gpt->options(), go));
      } else {
        RM_ASSIGN_OR_RETURN(d->gpt_, nn::GptCuda::Create(gpt->options(), go, d->compute_.stream));
      }
    } else if (options.stages) {
      return absl::UnimplementedError(absl::StrCat(
          "model ", model.Describe(), " has no pipeline or tensor-parallel stages (a GPT has)"));
    } else {
      RM_ASSIGN_OR_RETURN(d->classifier_, nn::SequentialCuda::Create(
                                              dynamic_cast<const nn::SequentialClassifier&>(model),
                                              {.matmul = d->type_}, d->compute_.stream));
    }
    return d;
  }

  std::string Describe() const override {
    cudaDeviceProp prop{};
    size_t free_bytes = 0, total = 0;
    const bool named = cudaGetDeviceProperties(&prop, gpu_) == cudaSuccess;
    const bool sized = cudaMemGetInfo(&free_bytes, &total) == cudaSuccess;
    return absl::StrFormat(
        "cuda:%d (%s%s), %s%s", gpu_, named ? prop.name : "unnamed",
        sized ? absl::StrFormat(", %.1f GiB free", free_bytes / 1073741824.0) : std::string(),
        kc::MatMulTypeName(type_),
        kc::ElementBytes(type_) != 2 ? " products"
        : gpt_ != nullptr || stages_ ? " activations and products"
                                     : " values in fp32 storage, tf32 products (exact for them)");
  }
  VectorOps* ops() override { return ops_.get(); }
  VectorOps* comm_ops() override { return comm_ops_.get(); }
  absl::Span<float> params() override { return params_.span(); }
  absl::Span<float> grads() override { return grads_.span(); }
  absl::StatusOr<StepStats> ForwardBackward(const Batch& batch,
                                            const ForwardBackwardOptions& options) override {
    if (stages_) {
      return absl::FailedPreconditionError(
          "TrainingDevice::ForwardBackward on a device of pipeline stages (CreateStage)");
    }
    if (gpt_ == nullptr) {
      return classifier_->ForwardBackward(batch, params_.data(), grads_.data(), options);
    }
    return gpt_->ForwardBackward(batch, params_.data(), grads_.data(), options);
  }
  int64_t activation_bytes() const override {
    return gpt_ != nullptr          ? gpt_->activation_bytes()
           : classifier_ != nullptr ? classifier_->activation_bytes()
                                    : 0;
  }
  int64_t parameter_copy_bytes() const override {
    return gpt_ != nullptr ? gpt_->parameter_copy_bytes() : 0;
  }

  absl::StatusOr<std::unique_ptr<pipeline::GptPipelineStage>> CreateStage(
      const nn::GptOptions& slice, comm::Communicator* tp, absl::Duration op_timeout) override {
    if (!stages_) {
      return absl::FailedPreconditionError(
          "TrainingDevice::CreateStage on a device made without CudaDeviceOptions::stages");
    }
    nn::GptCudaOptions go;
    go.matmul = type_;
    RM_ASSIGN_OR_RETURN(std::unique_ptr<pipeline::GptCudaStage> stage,
                        pipeline::GptCudaStage::Create(slice, go, compute_.stream));
    if (slice.tp_size > 1) {
      RM_ASSIGN_OR_RETURN(nn::GptCuda::DeviceSum sum, TensorParallelSum(slice, tp, op_timeout));
      stage->set_tensor_parallel_sum(std::move(sum));
    }
    return std::unique_ptr<pipeline::GptPipelineStage>(std::move(stage));
  }

  absl::Status RunTensorParallelShard(const nn::GptOptions& shard, comm::Communicator* tp,
                                      absl::Duration op_timeout) override {
    if (!stages_) {
      return absl::FailedPreconditionError(
          "TrainingDevice::RunTensorParallelShard on a device made without "
          "CudaDeviceOptions::stages");
    }
    nn::GptCudaOptions go;
    go.matmul = type_;
    go.flat_parameters = false;  // from the fully sharded strategy's store
    RM_ASSIGN_OR_RETURN(std::unique_ptr<nn::GptCuda> model,
                        nn::GptCuda::Create(shard, go, compute_.stream));
    if (shard.tp_size > 1) {
      RM_ASSIGN_OR_RETURN(nn::GptCuda::DeviceSum sum, TensorParallelSum(shard, tp, op_timeout));
      model->set_tensor_parallel_sum(std::move(sum));
    }
    gpt_ = std::move(model);
    stages_ = false;  // ForwardBackward runs the shard
    return absl::OkStatus();
  }

  absl::Status ResizeBuffers(int64_t elements) override {
    params_ = OpsBuffer();
    grads_ = OpsBuffer();
    RM_ASSIGN_OR_RETURN(params_, ops_->Allocate(elements));
    RM_ASSIGN_OR_RETURN(grads_, ops_->Allocate(elements));
    return absl::OkStatus();
  }

 private:
  CudaDevice() = default;

  // The tensor-parallel sum of a shard (`part`'s tp_size ranks) over `tp`: an all-reduce of
  // device memory (NCCL's group, or a host group staging through the host).
  static absl::StatusOr<nn::GptCuda::DeviceSum> TensorParallelSum(const nn::GptOptions& part,
                                                                  comm::Communicator* tp,
                                                                  absl::Duration op_timeout) {
    if (tp == nullptr || tp->size() != part.tp_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("a tensor-parallel shard of ", part.tp_size,
                       " needs a tensor-parallel group of that size"));
    }
    return nn::GptCuda::DeviceSum(
        [tp, op_timeout](float* data, int64_t count, cudaStream_t stream) -> absl::Status {
          // The group's stream (NCCL's own, or the TCP backend's staging copies) does not
          // wait for the model's: the partial sums first.
          RM_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream));
          return tp->AllReduce(data, data, count, DataType::kFloat32, comm::ReduceOp::kSum,
                               absl::Now() + op_timeout);
        });
  }

  int gpu_ = 0;
  bool stages_ = false;
  kc::MatMulType type_ = kc::MatMulType::kFloat32;
  // Destroyed in reverse: the model and buffers before the ops, the ops before the streams.
  Stream compute_, comm_;
  std::unique_ptr<CudaVectorOps> ops_, comm_ops_;
  OpsBuffer params_, grads_;
  std::unique_ptr<nn::GptCuda> gpt_;  // one of the two
  std::unique_ptr<nn::SequentialCuda> classifier_;
};

}  // namespace

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

int CudaOrdinalForSlot(int slot) { return std::max(0, slot) % std::max(1, CudaDeviceCount()); }

absl::StatusOr<std::string> CudaDeviceUuid(int gpu) {
  cudaDeviceProp prop;
  RM_RETURN_IF_CUDA_ERROR(cudaGetDeviceProperties(&prop, gpu));
  std::string hex;
  for (char byte : prop.uuid.bytes) absl::StrAppendFormat(&hex, "%02x", static_cast<uint8_t>(byte));
  return hex;
}

absl::StatusOr<std::unique_ptr<comm::Communicator>> CreateNcclGradients(
    const NcclGradientsOptions& options) {
  comm::NcclCommunicatorOptions o;
  o.rank = options.rank;
  o.size = options.size;
  o.store = options.store;
  o.prefix = options.prefix;
  o.device = options.gpu;
  o.init_timeout = options.init_timeout;
  RM_ASSIGN_OR_RETURN(std::unique_ptr<comm::NcclCommunicator> nccl,
                      comm::NcclCommunicator::Create(o));
  return std::unique_ptr<comm::Communicator>(std::move(nccl));
}

absl::StatusOr<std::unique_ptr<TrainingDevice>> CreateCudaDevice(
    const Model& model, int64_t padded_elements, const CudaDeviceOptions& options) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        "no CUDA GPU is visible to this process (check nvidia-smi, the driver and "
        "CUDA_VISIBLE_DEVICES), or set device: cpu");
  }
  if (options.gpu < 0 || options.gpu >= n) {
    return absl::FailedPreconditionError(
        absl::StrCat("GPU ", options.gpu, " asked for, but this process sees ", n,
                     " (CUDA_VISIBLE_DEVICES and the node's slots must agree)"));
  }
  if (dynamic_cast<const nn::GptModel*>(&model) == nullptr &&
      dynamic_cast<const nn::SequentialClassifier*>(&model) == nullptr) {
    return absl::UnimplementedError(
        absl::StrCat("model ", model.Describe(), " has no CUDA path yet"));
  }
  RM_ASSIGN_OR_RETURN(std::unique_ptr<CudaDevice> device,
                      CudaDevice::Create(model, padded_elements, options));
  return std::unique_ptr<TrainingDevice>(std::move(device));
}

}  // namespace ringmaster::train
