#include "train/host_view.h"

#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "state/range.h"

namespace ringmaster::train {
namespace {

state::TensorTable Table() {
  state::TensorTable t;
  t.Add("w", {7, 5});
  t.Add("b", {7});
  return t;
}

std::unique_ptr<Optimizer> AdamW(const state::TensorTable& table) {
  absl::StatusOr<std::unique_ptr<Optimizer>> o =
      CreateOptimizer(table, state::FullRange(table), AdamWOptions{});
  EXPECT_TRUE(o.ok()) << o.status();
  return *std::move(o);
}

void Fill(absl::Span<float> x, float base) {
  for (size_t i = 0; i < x.size(); ++i) x[i] = base + static_cast<float>(i);
}

bool Equal(absl::Span<const float> a, absl::Span<const float> b) {
  return std::vector<float>(a.begin(), a.end()) == std::vector<float>(b.begin(), b.end());
}

enum class Memory { kSame, kCopy };

// The view's buffers are the optimizer's by name and range, in the same memory or a copy.
void ExpectViewOf(HostView& view, Optimizer& optimizer, Memory memory) {
  std::vector<StateBuffer> own = optimizer.state_buffers();
  ASSERT_EQ(view.optimizer().size(), own.size());
  ASSERT_FALSE(own.empty());
  for (size_t i = 0; i < own.size(); ++i) {
    EXPECT_EQ(view.optimizer()[i].name, own[i].name);
    EXPECT_EQ(view.optimizer()[i].range, own[i].range);
    EXPECT_EQ(view.optimizer()[i].data.size(), own[i].data.size());
    EXPECT_EQ(view.optimizer()[i].data.data() == own[i].data.data(), memory == Memory::kSame)
        << own[i].name;
  }
}

TEST(HostView, OnTheCpuItIsTheOptimizersOwnState) {
  const state::TensorTable table = Table();
  state::FlatBuffer params(table.total_elements());
  std::unique_ptr<Optimizer> optimizer = AdamW(table);
  HostView view(params, *optimizer, /*device=*/nullptr);
  ExpectViewOf(view, *optimizer, Memory::kSame);
}

TEST(HostView, OnTheCpuPullAndPushDoNothing) {
  const state::TensorTable table = Table();
  state::FlatBuffer params(table.total_elements());
  std::unique_ptr<Optimizer> optimizer = AdamW(table);
  HostView view(params, *optimizer, /*device=*/nullptr);
  Fill(params.span(), 1);
  Fill(optimizer->state_buffers()[0].data, 100);
  const std::vector<float> before(params.data(), params.data() + params.size());

  // An optimizer step leaves nothing stale on the CPU.
  view.Invalidate();
  EXPECT_TRUE(view.Pull(HostView::What::kParams).ok());
  EXPECT_TRUE(view.Pull(HostView::What::kEverything).ok());
  EXPECT_TRUE(view.Push().ok());
  EXPECT_TRUE(Equal(params.span(), before));
  std::vector<float> moment(optimizer->state_buffers()[0].data.size());
  Fill(absl::MakeSpan(moment), 100);
  EXPECT_TRUE(Equal(optimizer->state_buffers()[0].data, moment));
}

// A device whose "device memory" is host memory of its own: enough to see what HostView
// copies where and when.
class FakeDevice final : public TrainingDevice {
 public:
  explicit FakeDevice(int64_t elements) : params_(elements), grads_(elements) {}
  std::string Describe() const override { return "fake"; }
  VectorOps* ops() override { return HostVectorOps(); }
  VectorOps* comm_ops() override { return HostVectorOps(); }
  absl::Span<float> params() override { return params_.span(); }
  absl::Span<float> grads() override { return grads_.span(); }
  absl::StatusOr<StepStats> ForwardBackward(const Batch&, const ForwardBackwardOptions&) override {
    return absl::UnimplementedError("fake");
  }
  int64_t activation_bytes() const override { return 0; }

 private:
  state::FlatBuffer params_, grads_;
};

TEST(HostView, WithADeviceTheHostHoldsCopiesThatPullAndPushMove) {
  const state::TensorTable table = Table();
  const int64_t n = table.total_elements();
  state::FlatBuffer params(n);
  FakeDevice device(n);
  // The optimizer's state lives in the device's memory.
  std::unique_ptr<Optimizer> optimizer = AdamW(table);
  HostView view(params, *optimizer, &device);
  ExpectViewOf(view, *optimizer, Memory::kCopy);
  std::vector<StateBuffer> on_device = optimizer->state_buffers();

  // Push: the host's state (a restore) goes to the device.
  Fill(params.span(), 1);
  for (size_t i = 0; i < view.optimizer().size(); ++i)
    Fill(view.optimizer()[i].data, 100 * (i + 1));
  ASSERT_TRUE(view.Push().ok());
  EXPECT_TRUE(Equal(device.params(), params.span()));
  for (size_t i = 0; i < on_device.size(); ++i) {
    EXPECT_TRUE(Equal(on_device[i].data, view.optimizer()[i].data)) << on_device[i].name;
  }

  // The device moves on (an optimizer step). Until told so, the host copies count as current.
  Fill(device.params(), 1000);
  for (size_t i = 0; i < on_device.size(); ++i) Fill(on_device[i].data, 5000 * (i + 1));
  ASSERT_TRUE(view.Pull(HostView::What::kEverything).ok());
  EXPECT_EQ(params.data()[0], 1);
  view.Invalidate();
  // kParams: the parameters only.
  ASSERT_TRUE(view.Pull(HostView::What::kParams).ok());
  EXPECT_TRUE(Equal(params.span(), device.params()));
  EXPECT_EQ(view.optimizer()[0].data[0], 100);
  ASSERT_TRUE(view.Pull(HostView::What::kEverything).ok());
  for (size_t i = 0; i < on_device.size(); ++i) {
    EXPECT_TRUE(Equal(view.optimizer()[i].data, on_device[i].data)) << on_device[i].name;
  }
}

}  // namespace
}  // namespace ringmaster::train
