#include "train/pipeline/schedule.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ringmaster::train::pipeline {
namespace {

std::string Name(const ScheduleOptions& o) {
  return absl::StrCat(ScheduleName(o.kind), " P=", o.ranks, " m=", o.micro_batches,
                      " v=", o.virtual_stages);
}

// Every schedule over a range of (P, m, v): the lists pass the check (each send has its
// receive, nothing computed twice or missing, no deadlock under queued sends and blocking
// receives), and their simulated bubble with unit costs (F = B = W = 1) is the formula's:
// exactly for gpipe, 1f1b and interleaved 1F1B, and for zero bubble ZB-H1's (P−1)(F+B−W)
// per rank once m >= P (with fewer micro-batches than ranks there is no steady state to fill:
// then no worse than 1F1B).
TEST(Schedule, EveryScheduleChecksAndItsBubbleIsTheFormulas) {
  int checked = 0;
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB,
                            ScheduleKind::kInterleaved1F1B, ScheduleKind::kZeroBubble}) {
    for (int p : {1, 2, 3, 4, 8}) {
      for (int m : {1, 2, 3, 4, 6, 8, 12, 16}) {
        for (int v : {1, 2, 3}) {
          const bool interleaved = kind == ScheduleKind::kInterleaved1F1B;
          if ((v > 1) != interleaved || (interleaved && m % p != 0)) continue;
          const ScheduleOptions o{kind, p, m, v};
          absl::StatusOr<Schedule> s = MakeSchedule(o);
          ASSERT_TRUE(s.ok()) << Name(o) << ": " << s.status();
          ASSERT_TRUE(CheckSchedule(*s).ok()) << Name(o) << ": " << CheckSchedule(*s);
          absl::StatusOr<Timeline> t = Simulate(*s);
          ASSERT_TRUE(t.ok()) << Name(o) << ": " << t.status();
          const double formula = FormulaBubble(o);
          if (kind == ScheduleKind::kZeroBubble && m < p) {
            EXPECT_LE(t->Bubble(), FormulaBubble({ScheduleKind::kOneFOneB, p, m, 1}) + 1e-12)
                << Name(o);
          } else {
            EXPECT_NEAR(t->Bubble(), formula, 1e-12) << Name(o);
          }
          // Every rank computes 3 units per micro-batch.
          for (double busy : t->busy) EXPECT_NEAR(busy, 3.0 * m, 1e-9) << Name(o);
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 100);
}

// The activations each rank keeps: GPipe all m; 1F1B at most P − r (the warm-up forwards and
// one more); zero bubble (ZB-H1) up to the first rank's 1F1B peak on every rank, P, and
// exactly that on the first; interleaved Megatron's warm-up + 1 chunk passes, each 1/v of a
// micro-batch.
TEST(Schedule, ActivationsKeptPerRank) {
  for (int p : {2, 4}) {
    for (int m : {4, 8}) {
      for (ScheduleKind kind :
           {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kZeroBubble}) {
        const ScheduleOptions o{kind, p, m, 1};
        absl::StatusOr<Timeline> t = Simulate(*MakeSchedule(o));
        ASSERT_TRUE(t.ok()) << Name(o);
        for (int r = 0; r < p; ++r) {
          const double one_f_one_b = std::min(p - r, m);
          if (kind == ScheduleKind::kGPipe) {
            EXPECT_EQ(t->peak_activations[r], m) << Name(o) << " rank " << r;
          } else if (kind == ScheduleKind::kOneFOneB) {
            EXPECT_EQ(t->peak_activations[r], one_f_one_b) << Name(o) << " rank " << r;
          } else {
            EXPECT_LE(t->peak_activations[r], std::min(p, m)) << Name(o) << " rank " << r;
            if (r == 0) {
              EXPECT_EQ(t->peak_activations[r], one_f_one_b) << Name(o);
            }
          }
        }
      }
      const int v = 2;
      const ScheduleOptions o{ScheduleKind::kInterleaved1F1B, p, m, v};
      absl::StatusOr<Timeline> t = Simulate(*MakeSchedule(o));
      ASSERT_TRUE(t.ok()) << Name(o);
      for (int r = 0; r < p; ++r) {
        const int warm = std::min((p - r - 1) * 2 + (v - 1) * p, m * v);
        EXPECT_DOUBLE_EQ(t->peak_activations[r], std::min(warm + 1, m * v) / 2.0)
            << Name(o) << " rank " << r;
      }
    }
  }
}

// The goal for the executor, here in the schedule itself: at m = 4 zero bubble's
// bubble is at most half of 1F1B's (a third, with unit costs), at P = 2 and 4.
TEST(Schedule, ZeroBubbleHalvesOneFOneBsBubble) {
  for (int p : {2, 4}) {
    const double one_f_one_b =
        Simulate(*MakeSchedule({ScheduleKind::kOneFOneB, p, 4, 1}))->Bubble();
    const double zero = Simulate(*MakeSchedule({ScheduleKind::kZeroBubble, p, 4, 1}))->Bubble();
    EXPECT_LE(zero, 0.5 * one_f_one_b) << "P=" << p << ": " << zero << " vs " << one_f_one_b;
    EXPECT_GT(zero, 0) << "P=" << p;
  }
}

// 1F1B on 2 ranks and 2 micro-batches, by hand: rank 0 runs F0 F1, waits for micro-batch 0's
// gradient until 4, B0, waits until 7 for micro-batch 1's; rank 1 starts when F0's output
// arrives. 9 time units, 6 busy on each rank: bubble 1/3 = (P−1)/(m+P−1).
TEST(Schedule, TimelineByHand) {
  absl::StatusOr<Schedule> s = MakeSchedule({ScheduleKind::kOneFOneB, 2, 2, 1});
  ASSERT_TRUE(s.ok());
  absl::StatusOr<Timeline> t = Simulate(*s);
  ASSERT_TRUE(t.ok());
  EXPECT_DOUBLE_EQ(t->makespan, 9);
  EXPECT_EQ(TimelineText(*s, *t),
            "rank 0   F0 F1 .  .  B0 B0 .  B1 B1\n"
            "rank 1   .  F0 B0 B0 F1 B1 B1 .  .\n"
            "bubble 33.3 % (formula 33.3 %); step 9 time units\n"
            "micro-batches of activations kept at most, per rank: 2 1\n");
  // The lists, with their messages.
  std::vector<std::string> rank1;
  for (const Action& a : s->ranks[1]) rank1.push_back(a.DebugString());
  EXPECT_EQ(rank1, (std::vector<std::string>{"recv act s0 m0 <- r0", "F0@s1", "B0@s1",
                                             "send grad s1 m0 -> r0", "recv act s0 m1 <- r0",
                                             "F1@s1", "B1@s1", "send grad s1 m1 -> r0"}));
  // A message that takes 1 time unit delays each hop.
  absl::StatusOr<Timeline> slow = Simulate(*s, {.message = 1});
  ASSERT_TRUE(slow.ok());
  EXPECT_GT(slow->makespan, t->makespan);
  const std::string svg = TimelineSvg(*s, *t);
  EXPECT_TRUE(absl::StartsWith(svg, "<svg")) << svg;
  EXPECT_TRUE(absl::StrContains(svg, "bubble 33.3 %")) << svg;
}

size_t Find(const std::vector<Action>& list, const std::string& what) {
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i].DebugString() == what) return i;
  }
  ADD_FAILURE() << what << " not found";
  return 0;
}

// The check catches what an executor would trip over.
TEST(Schedule, CheckFindsBrokenLists) {
  const Schedule good = *MakeSchedule({ScheduleKind::kOneFOneB, 2, 2, 1});
  ASSERT_TRUE(CheckSchedule(good).ok());

  Schedule missing = good;  // rank 1 forgets to receive micro-batch 1's input
  missing.ranks[1].erase(missing.ranks[1].begin() + Find(missing.ranks[1], "recv act s0 m1 <- r0"));
  absl::Status st = CheckSchedule(missing);
  EXPECT_TRUE(absl::StrContains(st.message(), "neither computed here nor received")) << st;

  Schedule deadlock = good;  // rank 0 waits for micro-batch 0's gradient before sending its input
  std::vector<Action>& r0 = deadlock.ranks[0];
  const Action wait = r0[Find(r0, "recv grad s1 m0 <- r1")];
  r0.erase(r0.begin() + Find(r0, "recv grad s1 m0 <- r1"));
  r0.insert(r0.begin() + Find(r0, "send act s0 m0 -> r1"), wait);
  st = CheckSchedule(deadlock);
  EXPECT_TRUE(absl::StrContains(st.message(), "deadlocks")) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "rank 0 at action")) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "rank 1 at action")) << st;

  Schedule twice = good;  // a forward computed twice
  twice.ranks[0].push_back(twice.ranks[0][Find(twice.ranks[0], "F0@s0")]);
  EXPECT_TRUE(absl::StrContains(CheckSchedule(twice).message(), "computed twice"));

  Schedule wrong_rank = good;  // stage 1's forward on rank 0
  wrong_rank.ranks[0][Find(wrong_rank.ranks[0], "F1@s0")].stage = 1;
  EXPECT_TRUE(absl::StrContains(CheckSchedule(wrong_rank).message(), "is rank 1's"));

  Schedule unsent = good;  // rank 1 never sends micro-batch 1's gradient
  unsent.ranks[1].erase(unsent.ranks[1].begin() + Find(unsent.ranks[1], "send grad s1 m1 -> r0"));
  EXPECT_FALSE(CheckSchedule(unsent).ok());

  // GPipe's rank 1 taking micro-batch 1's input (and forward) before micro-batch 0's.
  Schedule swapped = *MakeSchedule({ScheduleKind::kGPipe, 2, 2, 1});
  std::vector<Action>& r1s = swapped.ranks[1];
  std::swap(r1s[Find(r1s, "recv act s0 m0 <- r0")], r1s[Find(r1s, "recv act s0 m1 <- r0")]);
  std::swap(r1s[Find(r1s, "F0@s1")], r1s[Find(r1s, "F1@s1")]);
  EXPECT_TRUE(absl::StrContains(CheckSchedule(swapped).message(), "out of order"))
      << CheckSchedule(swapped);

  Schedule early = good;  // a gradient sent before its backward
  std::vector<Action>& r1 = early.ranks[1];
  const Action send = r1[Find(r1, "send grad s1 m0 -> r0")];
  r1.erase(r1.begin() + Find(r1, "send grad s1 m0 -> r0"));
  r1.insert(r1.begin(), send);
  EXPECT_TRUE(absl::StrContains(CheckSchedule(early).message(), "sent before it is computed"));
}

// The interleaved schedule with each message right at its compute (the receive just before
// the compute that needs it, the send just after the one that makes it), not batched as
// Megatron batches them: it runs when sends are buffered, but deadlocks when a message moves
// only while both ends are posted, which the check also rules out.
Schedule WithMessagesAtTheirComputes(const Schedule& batched) {
  Schedule s = batched;
  const int last = s.stages() - 1;
  for (int r = 0; r < s.options.ranks; ++r) {
    std::vector<Action> list;
    for (const Action& a : batched.ranks[r]) {
      if (!a.is_compute()) continue;
      const bool forward = a.kind == ActionKind::kForward;
      const int from = forward ? a.stage - 1 : a.stage + 1;  // what it needs
      const int to = forward ? a.stage + 1 : a.stage - 1;    // who needs what it makes
      if (from >= 0 && from <= last && s.RankOfStage(from) != r) {
        list.push_back({ActionKind::kReceive, from, a.micro_batch,
                        forward ? Payload::kActivation : Payload::kGradient, s.RankOfStage(from)});
      }
      list.push_back(a);
      if (to >= 0 && to <= last && s.RankOfStage(to) != r) {
        list.push_back({ActionKind::kSend, a.stage, a.micro_batch,
                        forward ? Payload::kActivation : Payload::kGradient, s.RankOfStage(to)});
      }
    }
    s.ranks[r] = list;
  }
  return s;
}

TEST(Schedule, CheckRulesOutDeadlocksOfUnbufferedSends) {
  const Schedule batched = *MakeSchedule({ScheduleKind::kInterleaved1F1B, 2, 4, 2});
  ASSERT_TRUE(CheckSchedule(batched).ok());
  const Schedule naive = WithMessagesAtTheirComputes(batched);
  EXPECT_TRUE(Simulate(naive).ok());  // with buffered sends it runs
  const absl::Status st = CheckSchedule(naive);
  EXPECT_TRUE(absl::StrContains(st.message(), "both posted")) << st;
}

TEST(Schedule, BadOptionsNameTheField) {
  EXPECT_TRUE(
      absl::StrContains(MakeSchedule({ScheduleKind::kGPipe, 0, 4, 1}).status().message(), "ranks"));
  EXPECT_TRUE(absl::StrContains(MakeSchedule({ScheduleKind::kOneFOneB, 2, 0, 1}).status().message(),
                                "micro_batches"));
  EXPECT_TRUE(absl::StrContains(MakeSchedule({ScheduleKind::kOneFOneB, 2, 4, 2}).status().message(),
                                "virtual_stages"));
  EXPECT_TRUE(
      absl::StrContains(MakeSchedule({ScheduleKind::kInterleaved1F1B, 2, 4, 1}).status().message(),
                        "virtual_stages"));
  EXPECT_TRUE(
      absl::StrContains(MakeSchedule({ScheduleKind::kInterleaved1F1B, 4, 6, 2}).status().message(),
                        "not a multiple of the 4 pipeline ranks"));
  EXPECT_EQ(ParseScheduleKind("zero_bubble").value(), ScheduleKind::kZeroBubble);
  EXPECT_TRUE(absl::StrContains(ParseScheduleKind("zb").status().message(), "gpipe, 1f1b"));
  EXPECT_FALSE(Simulate(*MakeSchedule({ScheduleKind::kGPipe, 2, 2, 1}), {.forward = -1}).ok());
}

// Seed exercise 26.6: the 1F1B bubble against m for P = 4, 8, 16; below 10 % from
// m = 9(P − 1) + 1, where (P−1)/(m+P−1) < 0.1 first holds.
TEST(Schedule, SweepFindsTheSmallestMBelowTenPercent) {
  absl::StatusOr<BubbleSweep> sweep = SweepBubble(ScheduleKind::kOneFOneB, {4, 8, 16});
  ASSERT_TRUE(sweep.ok()) << sweep.status();
  ASSERT_EQ(sweep->smallest_below.size(), 3u);
  for (const auto& [p, m] : sweep->smallest_below) EXPECT_EQ(m, 9 * (p - 1) + 1) << "P=" << p;
  for (const BubbleSweep::Point& pt : sweep->points) {
    EXPECT_NEAR(pt.bubble, pt.formula, 1e-12) << pt.ranks << " " << pt.micro_batches;
  }
  const std::string text = SweepText(*sweep);
  EXPECT_TRUE(absl::StrContains(text, "P=4: the bubble is below 10 % from m = 28")) << text;
  EXPECT_TRUE(absl::StrContains(text, "P=16: the bubble is below 10 % from m = 136")) << text;
  EXPECT_TRUE(absl::StrContains(SweepSvg(*sweep), "<polyline"));
  // Zero bubble gets there sooner.
  absl::StatusOr<BubbleSweep> zb = SweepBubble(ScheduleKind::kZeroBubble, {4});
  ASSERT_TRUE(zb.ok());
  EXPECT_LT(zb->smallest_below[0].second, 28);
  EXPECT_FALSE(SweepBubble(ScheduleKind::kOneFOneB, {4}, 1, 1.5).ok());
}

}  // namespace
}  // namespace ringmaster::train::pipeline
