#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/gradient_check.h"

namespace ringmaster::kernels {
namespace {

using testing::FiniteDifference;
using testing::GradientMatches;
using testing::RandomFloats;
using testing::WeightedSum;

struct Shape {
  int64_t batch;
  int64_t seq_len;
  int64_t channels;
  int64_t heads;

  int64_t qkv_size() const { return batch * seq_len * 3 * channels; }
  int64_t out_size() const { return batch * seq_len * channels; }
};

std::string ShapeName(const Shape& s) {
  return "b" + std::to_string(s.batch) + "_t" + std::to_string(s.seq_len) + "_c" +
         std::to_string(s.channels) + "_nh" + std::to_string(s.heads);
}

void PrintTo(const Shape& s, std::ostream* os) { *os << ShapeName(s); }

enum class Form { kProbs, kLse };

std::string FormName(Form form) { return form == Form::kProbs ? "probs" : "lse"; }

constexpr float kSentinel = 12345.0f;
constexpr int64_t kGuard = 64;

// Runs one form of the kernels with buffers of exactly the advertised sizes, followed by
// guard floats that must survive every call.
class Runner {
 public:
  Runner(Shape s, Form form)
      : s_(s),
        form_(form),
        saved_(form == Form::kProbs ? AttentionProbsFloats(s.batch, s.seq_len, s.heads)
                                    : AttentionLseFloats(s.batch, s.seq_len, s.heads)),
        scratch_(AttentionScratchFloats(s.seq_len) + kGuard, kSentinel) {
    saved_.resize(saved_.size() + kGuard, kSentinel);
  }

  std::vector<float> Forward(const std::vector<float>& qkv) {
    std::vector<float> out(s_.out_size(), std::numeric_limits<float>::quiet_NaN());
    if (form_ == Form::kProbs) {
      AttentionForward(out.data(), saved_.data(), qkv.data(), s_.batch, s_.seq_len, s_.channels,
                       s_.heads);
    } else {
      AttentionForwardLse(out.data(), saved_.data(), qkv.data(), scratch_.data(), s_.batch,
                          s_.seq_len, s_.channels, s_.heads);
    }
    ExpectGuardsIntact();
    return out;
  }

  // Uses what the last Forward saved, so Forward(qkv) must come first.
  std::vector<float> Backward(const std::vector<float>& qkv, const std::vector<float>& dout) {
    // dqkv is overwritten: NaNs left in it would show.
    std::vector<float> dqkv(s_.qkv_size(), std::numeric_limits<float>::quiet_NaN());
    if (form_ == Form::kProbs) {
      AttentionBackward(dqkv.data(), dout.data(), qkv.data(), saved_.data(), scratch_.data(),
                        s_.batch, s_.seq_len, s_.channels, s_.heads);
    } else {
      AttentionBackwardLse(dqkv.data(), dout.data(), qkv.data(), saved_.data(), scratch_.data(),
                           s_.batch, s_.seq_len, s_.channels, s_.heads);
    }
    ExpectGuardsIntact();
    return dqkv;
  }

  const std::vector<float>& saved() const { return saved_; }

 private:
  void ExpectGuardsIntact() const {
    for (const auto* buf : {&saved_, &scratch_}) {
      EXPECT_TRUE(
          std::all_of(buf->end() - kGuard, buf->end(), [](float f) { return f == kSentinel; }))
          << "a kernel wrote past the end of its " << (buf == &saved_ ? "saved" : "scratch")
          << " buffer";
    }
  }

  Shape s_;
  Form form_;
  std::vector<float> saved_;
  std::vector<float> scratch_;
};

struct Reference {
  std::vector<double> out;    // [B, T, C]
  std::vector<double> probs;  // [B, NH, T, T], zero above the diagonal
  std::vector<double> lse;    // [B, NH, T]
};

// Attention written out loop by loop in double, with an explicit mask.
Reference NaiveAttention(const std::vector<float>& qkv, const Shape& s) {
  const int64_t t_len = s.seq_len, c = s.channels, hs = c / s.heads;
  Reference ref{std::vector<double>(s.out_size(), 0.0),
                std::vector<double>(s.batch * s.heads * t_len * t_len, 0.0),
                std::vector<double>(s.batch * s.heads * t_len, 0.0)};
  auto at = [&](int64_t b, int64_t t, int64_t part, int64_t h, int64_t e) {
    return static_cast<double>(qkv[(b * t_len + t) * 3 * c + part * c + h * hs + e]);
  };
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads; ++h) {
      for (int64_t i = 0; i < t_len; ++i) {
        std::vector<double> score(t_len);
        double max = -INFINITY;
        for (int64_t j = 0; j < t_len; ++j) {
          if (j > i) {
            score[j] = -INFINITY;  // masked: a future position
            continue;
          }
          double dot = 0;
          for (int64_t e = 0; e < hs; ++e) dot += at(b, i, 0, h, e) * at(b, j, 1, h, e);
          score[j] = dot / std::sqrt(static_cast<double>(hs));
          max = std::max(max, score[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < t_len; ++j) sum += std::exp(score[j] - max);
        const int64_t row = (b * s.heads + h) * t_len + i;
        ref.lse[row] = max + std::log(sum);
        for (int64_t j = 0; j < t_len; ++j) {
          const double p = std::exp(score[j] - max) / sum;
          ref.probs[row * t_len + j] = p;
          for (int64_t e = 0; e < hs; ++e) {
            ref.out[(b * t_len + i) * c + h * hs + e] += p * at(b, j, 2, h, e);
          }
        }
      }
    }
  }
  return ref;
}

void ExpectNear(const std::vector<float>& got, const std::vector<double>& want, double tol,
                const std::string& what) {
  ASSERT_LE(want.size(), got.size()) << what;
  int reported = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!(std::abs(got[i] - want[i]) <= tol) && ++reported <= 5) {
      ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", want " << want[i];
    }
  }
}

void ExpectNear(const std::vector<float>& got, const std::vector<float>& want, double rtol,
                const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int reported = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!(std::abs(got[i] - want[i]) <= rtol * (1 + std::abs(want[i]))) && ++reported <= 5) {
      ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", want " << want[i];
    }
  }
}

class AttentionTest : public ::testing::TestWithParam<Shape> {
 protected:
  // Scores of a few units: the softmax is neither flat nor one-hot.
  std::vector<float> Qkv(uint32_t seed) const {
    return RandomFloats(GetParam().qkv_size(), seed, -2.0f, 2.0f);
  }
};

TEST_P(AttentionTest, ForwardMatchesNaiveReference) {
  const Shape s = GetParam();
  const std::vector<float> qkv = Qkv(51);
  const Reference ref = NaiveAttention(qkv, s);
  Runner probs_form(s, Form::kProbs), lse_form(s, Form::kLse);
  ExpectNear(probs_form.Forward(qkv), ref.out, 1e-5, "out (probs form)");
  ExpectNear(probs_form.saved(), ref.probs, 1e-6, "probs");
  ExpectNear(lse_form.Forward(qkv), ref.out, 1e-5, "out (lse form)");
  ExpectNear(lse_form.saved(), ref.lse, 1e-5, "lse");
  // Above the diagonal the saved probabilities are exactly zero.
  const int64_t t_len = s.seq_len;
  for (int64_t row = 0; row < s.batch * s.heads * t_len; ++row) {
    for (int64_t j = row % t_len + 1; j < t_len; ++j) {
      ASSERT_EQ(probs_form.saved()[row * t_len + j], 0.0f) << "row " << row << " key " << j;
    }
  }
}

TEST_P(AttentionTest, BothFormsGiveTheSameOutputsAndGradients) {
  const Shape s = GetParam();
  const std::vector<float> qkv = Qkv(52), dout = RandomFloats(s.out_size(), 53);
  Runner probs_form(s, Form::kProbs), lse_form(s, Form::kLse);
  ExpectNear(lse_form.Forward(qkv), probs_form.Forward(qkv), 1e-6, "out");
  ExpectNear(lse_form.Backward(qkv, dout), probs_form.Backward(qkv, dout), 1e-5, "dqkv");
}

// Loss = sum w * out, step 1e-2. The worst error seen is 1.4e-4 (T = 130), mostly float
// rounding of the loss (hundreds of outputs) divided by 2h; a wrong term is off by O(0.1).
TEST_P(AttentionTest, BackwardMatchesFiniteDifferences) {
  const Shape s = GetParam();
  std::vector<float> qkv = Qkv(54);
  const std::vector<float> w = RandomFloats(s.out_size(), 55);
  for (Form form : {Form::kProbs, Form::kLse}) {
    Runner runner(s, form);
    runner.Forward(qkv);
    const std::vector<float> dqkv = runner.Backward(qkv, w);
    auto loss = [&] { return WeightedSum(w, runner.Forward(qkv).data()); };
    EXPECT_TRUE(GradientMatches(loss, qkv, dqkv, FiniteDifference{.atol = 1e-3, .rtol = 5e-3},
                                "dqkv (" + FormName(form) + " form)"));
  }
}

// Changing everything at position t (its q, k and v) leaves the outputs at positions < t
// bit-identical, and a loss on positions < t sends no gradient to positions >= t.
TEST_P(AttentionTest, IsCausal) {
  const Shape s = GetParam();
  const std::vector<float> qkv = Qkv(56);
  const int64_t row = 3 * s.channels;
  for (int64_t t : {s.seq_len - 1, s.seq_len / 2, int64_t{0}}) {
    std::vector<float> changed = qkv;
    for (int64_t b = 0; b < s.batch; ++b) {
      for (int64_t e = 0; e < row; ++e) changed[(b * s.seq_len + t) * row + e] += 5.0f + e;
    }
    std::vector<float> dout = RandomFloats(s.out_size(), 57);
    for (int64_t b = 0; b < s.batch; ++b) {
      std::fill(dout.begin() + (b * s.seq_len + t) * s.channels,
                dout.begin() + (b + 1) * s.seq_len * s.channels, 0.0f);
    }
    for (Form form : {Form::kProbs, Form::kLse}) {
      Runner runner(s, form);
      const std::vector<float> before = runner.Forward(qkv);
      const std::vector<float> after = runner.Forward(changed);
      const std::vector<float> dqkv = runner.Backward(changed, dout);
      for (int64_t b = 0; b < s.batch; ++b) {
        for (int64_t i = 0; i < s.seq_len; ++i) {
          const int64_t out_row = (b * s.seq_len + i) * s.channels;
          const int64_t qkv_row = (b * s.seq_len + i) * row;
          for (int64_t e = 0; i < t && e < s.channels; ++e) {
            ASSERT_EQ(after[out_row + e], before[out_row + e])
                << FormName(form) << " t " << t << " position " << i << " channel " << e;
          }
          for (int64_t e = 0; i >= t && e < row; ++e) {
            ASSERT_EQ(dqkv[qkv_row + e], 0.0f)
                << FormName(form) << " t " << t << " position " << i << " column " << e;
          }
        }
      }
      // Position t itself does change, or the test above proved nothing.
      EXPECT_NE(after[t * s.channels], before[t * s.channels]);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionTest,
                         ::testing::Values(Shape{2, 5, 12, 3},    // hs = 4
                                           Shape{2, 1, 12, 3},    // one token
                                           Shape{2, 70, 8, 2},    // past one 64-row block
                                           Shape{1, 130, 6, 1}),  // three blocks, one head
                         [](const auto& info) { return ShapeName(info.param); });

TEST(AttentionDeathTest, HeadsMustDivideChannels) {
  std::vector<float> qkv(3 * 10), out(10), probs(4);
  EXPECT_DEATH(AttentionForward(out.data(), probs.data(), qkv.data(), 1, 1, 10, 4), "must divide");
}

}  // namespace
}  // namespace ringmaster::kernels
