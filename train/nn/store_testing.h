// Test helpers of the CUDA models' ParameterStore tests (gpt_cuda_test, sequential_cuda_test):
// stores that keep each parameter group in a buffer of its own, with a gradient buffer of its
// own, and check every call against train/model.h's ParameterStore contract; one in device
// memory for the CUDA models, one in host memory for their CPU twins, so that the two models'
// calls can be compared. Each store serves one pass (one ForwardBackward).
//
// The rules checked (a violation is a gtest failure that names the call):
//   - forward asks for the groups in forward order (a group asked again is fine, and a group
//     read again by a tied LM head, ParameterGroup::read_again_by_head, at any time after its
//     first), all of them;
//   - BeginBackward once, after forward;
//   - in backward the groups are done one at a time, from the last down to the first:
//     Gradients(g) once, then GradientsDone(g) once, g being the last group not yet done;
//   - Parameters(g) in backward only for a group whose backward reads its parameters
//     (ParameterGroup::backward_reads_parameters) and that is not done yet;
//   - at EndPass every group is done.
// So that a read the calls do not announce shows in the results, the store poisons a group's
// parameters (NaN) once the model may no longer read them: at GradientsDone, and at
// BeginBackward for the groups backward does not read; the device store first waits for the
// model's stream, so only work enqueued after the call sees the poison. The gradient buffers
// start as NaN (a gradient the model leaves unwritten shows) with the padding between a
// group's tensors zero (which the model must leave alone). A group's buffers keep the flat
// buffer's alignment to 256 bytes (the group starts at its first offset modulo 64 floats), so
// that on a GPU cuBLASLt picks the algorithms it picks for the flat buffers and the results
// can be compared bit for bit.
#ifndef RINGMASTER_TRAIN_NN_STORE_TESTING_H_
#define RINGMASTER_TRAIN_NN_STORE_TESTING_H_

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "gtest/gtest.h"
#include "kernels/cuda/testing.h"
#include "state/tensor.h"
#include "train/model.h"

namespace ringmaster::train::nn::testing {

class CheckedStore : public ParameterStore {
 public:
  CheckedStore(const state::TensorTable& table, std::vector<ParameterGroup> groups)
      : table_(table),
        groups_(std::move(groups)),
        asked_in_forward_(groups_.size(), false),
        next_done_(static_cast<int>(groups_.size()) - 1) {}

  const float* Parameters(int group) final {
    CheckGroup(group);
    if (!in_backward_) {
      if (!groups_[group].read_again_by_head || !asked_in_forward_[group]) {
        EXPECT_GE(group, last_forward_group_)
            << "forward asked for " << Name(group) << " after " << Name(last_forward_group_);
        last_forward_group_ = std::max(last_forward_group_, group);
      }
      asked_in_forward_[group] = true;
    } else {
      EXPECT_LE(group, next_done_) << "Parameters(" << Name(group) << ") after GradientsDone";
      EXPECT_TRUE(groups_[group].backward_reads_parameters)
          << "backward read " << Name(group) << ", whose backward_reads_parameters is false";
    }
    const std::string entry = absl::StrCat("P", group);
    if (log_.empty() || log_.back() != entry) log_.push_back(entry);
    return ParameterBase(group);
  }

  void BeginBackward() final {
    EXPECT_FALSE(in_backward_) << "BeginBackward twice";
    for (size_t g = 0; g < groups_.size(); ++g) {
      EXPECT_TRUE(asked_in_forward_[g]) << "forward never asked for " << Name(g);
    }
    in_backward_ = true;
    log_.push_back("B");
    for (size_t g = 0; g < groups_.size(); ++g) {
      if (!groups_[g].backward_reads_parameters) Poison(static_cast<int>(g));
    }
  }

  float* Gradients(int group) final {
    CheckGroup(group);
    EXPECT_TRUE(in_backward_) << "Gradients(" << Name(group) << ") before BeginBackward";
    EXPECT_EQ(group, next_done_) << "Gradients(" << Name(group) << ") while "
                                 << Name(next_done_) << " is the group to finish next";
    EXPECT_NE(gradients_of_, group) << "Gradients(" << Name(group) << ") twice";
    gradients_of_ = group;
    log_.push_back(absl::StrCat("G", group));
    return GradientBase(group);
  }

  void GradientsDone(int group) final {
    CheckGroup(group);
    EXPECT_EQ(gradients_of_, group) << "GradientsDone(" << Name(group) << ") without Gradients";
    EXPECT_EQ(group, next_done_) << "GradientsDone(" << Name(group) << ") while "
                                 << Name(next_done_) << " is the group to finish next";
    next_done_ = group - 1;
    log_.push_back(absl::StrCat("D", group));
    Poison(group);
  }

  // The pass is over: every group's gradients were done.
  void EndPass() {
    EXPECT_TRUE(in_backward_) << "no BeginBackward";
    EXPECT_EQ(next_done_, -1) << "the pass ended before " << Name(next_done_) << " was done";
  }

  // The calls so far: "P<g>" (consecutive Parameters of one group once), "B", "G<g>", "D<g>".
  const std::vector<std::string>& log() const { return log_; }

 protected:
  const state::TensorTable& table() const { return table_; }
  const std::vector<ParameterGroup>& groups() const { return groups_; }
  // A group's buffer holds Lead(g) elements, then the flat offsets from First(g) (its first
  // tensor's) to the end of its last tensor (Span(g) elements): element k of the buffer is
  // flat offset k - Lead(g) + First(g).
  int64_t First(int group) const { return table_.tensor(groups_[group].first_tensor).offset; }
  int64_t Span(int group) const {
    const state::TensorSpec& last = table_.tensor(groups_[group].end_tensor - 1);
    return last.offset + last.numel - First(group);
  }
  int64_t Lead(int group) const { return First(group) % 64; }
  // The group's parameter buffer, from flat parameters (the lead zero).
  std::vector<float> GroupParameters(int group, const float* flat) const {
    std::vector<float> p(Lead(group), 0.0f);
    p.insert(p.end(), flat + First(group), flat + First(group) + Span(group));
    return p;
  }
  // A group's gradient buffer as it starts: NaN in the tensors, zero elsewhere.
  std::vector<float> FreshGradients(int group) const {
    std::vector<float> g(Lead(group) + Span(group), 0.0f);
    for (int i = groups_[group].first_tensor; i < groups_[group].end_tensor; ++i) {
      const state::TensorSpec& t = table_.tensor(i);
      std::fill_n(g.begin() + Lead(group) + (t.offset - First(group)), t.numel,
                  std::numeric_limits<float>::quiet_NaN());
    }
    return g;
  }
  // Places a group's gradient buffer into `flat` (what is not a tensor must still be zero).
  void Place(int group, const std::vector<float>& g, std::vector<float>& flat) const {
    std::vector<bool> in_tensor(g.size(), false);
    for (int i = groups_[group].first_tensor; i < groups_[group].end_tensor; ++i) {
      const state::TensorSpec& t = table_.tensor(i);
      std::fill_n(in_tensor.begin() + Lead(group) + (t.offset - First(group)), t.numel, true);
    }
    for (size_t k = 0; k < g.size(); ++k) {
      if (in_tensor[k]) {
        flat[k - Lead(group) + First(group)] = g[k];
      } else {
        EXPECT_EQ(g[k], 0.0f) << "the padding of " << Name(group) << " was written";
      }
    }
  }
  // The base (tensor i of the group at base + its offset) of a group's buffer.
  template <typename T>
  T* Base(int group, T* buffer) const {
    return buffer + Lead(group) - First(group);
  }

  // The bases (tensor i of the group at base + its offset) of the group's buffers.
  virtual const float* ParameterBase(int group) = 0;
  virtual float* GradientBase(int group) = 0;
  // Fills the group's parameters with NaN, after the work already asked of the model.
  virtual void Poison(int group) = 0;

 private:
  void CheckGroup(int group) const {
    CHECK(group >= 0 && group < static_cast<int>(groups_.size())) << "no group " << group;
  }
  std::string Name(int group) const {
    return group >= 0 && group < static_cast<int>(groups_.size())
               ? absl::StrCat("group ", group, " (", groups_[group].name, ")")
               : absl::StrCat("group ", group);
  }

  const state::TensorTable& table_;
  const std::vector<ParameterGroup> groups_;
  std::vector<bool> asked_in_forward_;
  int last_forward_group_ = 0;
  bool in_backward_ = false;
  int next_done_;           // the group whose gradients come next (groups done: above it)
  int gradients_of_ = -1;   // the group Gradients was called for last
  std::vector<std::string> log_;
};

// The store in host memory, for the CPU models (train/nn/gpt.h, sequential.h).
class HostStore final : public CheckedStore {
 public:
  HostStore(const state::TensorTable& table, std::vector<ParameterGroup> groups,
            const float* flat_params)
      : CheckedStore(table, std::move(groups)) {
    for (int g = 0; g < static_cast<int>(this->groups().size()); ++g) {
      params_.push_back(GroupParameters(g, flat_params));
      grads_.push_back(FreshGradients(g));
    }
  }

 private:
  const float* ParameterBase(int group) override { return Base(group, params_[group].data()); }
  float* GradientBase(int group) override { return Base(group, grads_[group].data()); }
  void Poison(int group) override {
    std::fill(params_[group].begin(), params_[group].end(),
              std::numeric_limits<float>::quiet_NaN());
  }

  std::vector<std::vector<float>> params_, grads_;
};

// The store in device memory, for the CUDA models; `stream` is the model's.
class DeviceStore final : public CheckedStore {
 public:
  DeviceStore(const state::TensorTable& table, std::vector<ParameterGroup> groups,
              const std::vector<float>& flat_params, cudaStream_t stream)
      : CheckedStore(table, std::move(groups)), stream_(stream) {
    for (int g = 0; g < static_cast<int>(this->groups().size()); ++g) {
      params_.push_back(std::make_unique<Device<float>>(GroupParameters(g, flat_params.data())));
      grads_.push_back(std::make_unique<Device<float>>(FreshGradients(g)));
    }
  }

  // Every group's gradients at their flat offsets (table().total_elements(); zero elsewhere).
  std::vector<float> FlatGradients() const {
    std::vector<float> flat(table().total_elements(), 0.0f);
    for (int g = 0; g < static_cast<int>(groups().size()); ++g) Place(g, grads_[g]->Host(), flat);
    return flat;
  }

 private:
  template <typename T>
  using Device = kernels::cuda::testing::Device<T>;

  const float* ParameterBase(int group) override { return Base(group, params_[group]->get()); }
  float* GradientBase(int group) override { return Base(group, grads_[group]->get()); }
  void Poison(int group) override {
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    EXPECT_EQ(cudaMemset(params_[group]->get(), 0xff, (Lead(group) + Span(group)) * sizeof(float)),
              cudaSuccess);
  }

  cudaStream_t stream_;
  std::vector<std::unique_ptr<Device<float>>> params_, grads_;
};

}  // namespace ringmaster::train::nn::testing

#endif  // RINGMASTER_TRAIN_NN_STORE_TESTING_H_
