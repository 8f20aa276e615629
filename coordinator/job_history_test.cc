// JobHistory: the bounded, evenly thinned series of rank 0's reports, a job that goes back
// to a checkpoint, and the members of each epoch.
#include "coordinator/job_history.h"

#include <vector>

#include "gtest/gtest.h"

namespace ringmaster::coordinator {
namespace {

JobHistory::Point At(int64_t step, int64_t epoch = 1) {
  JobHistory::Point p;
  p.time = absl::FromUnixSeconds(1000 + step);
  p.epoch = epoch;
  p.step = step;
  p.loss = 1.0 / step;
  return p;
}

std::vector<int64_t> Steps(const JobHistory::View& view) {
  std::vector<int64_t> steps;
  for (const JobHistory::Point& p : view.points) steps.push_back(p.step);
  return steps;
}

TEST(JobHistoryTest, KeepsEveryReportUntilFull) {
  JobHistory history(JobHistoryOptions{.max_points = 8});
  for (int step = 1; step <= 8; ++step) history.AddPoint(At(step));
  EXPECT_EQ(Steps(history.Snapshot()), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(history.Snapshot().points[2].loss, 1.0 / 3);
  EXPECT_EQ(history.stride(), 1);
}

TEST(JobHistoryTest, AFullSeriesIsThinnedEvenlyAndShowsTheLatestReport) {
  JobHistory history(JobHistoryOptions{.max_points = 8});
  // 9 reports: the 9th overflows; the newest and every other one before it stay
  // (9, 7, 5, 3, 1), and from then on every 2nd report is kept.
  for (int step = 1; step <= 9; ++step) history.AddPoint(At(step));
  EXPECT_EQ(Steps(history.Snapshot()), (std::vector<int64_t>{1, 3, 5, 7, 9}));
  EXPECT_EQ(history.stride(), 2);
  history.AddPoint(At(10));  // not kept, but shown as the latest
  EXPECT_EQ(Steps(history.Snapshot()), (std::vector<int64_t>{1, 3, 5, 7, 9, 10}));
  history.AddPoint(At(11));
  EXPECT_EQ(Steps(history.Snapshot()), (std::vector<int64_t>{1, 3, 5, 7, 9, 11}));

  // A long run: the kept points are evenly spaced (by the stride), start near the
  // beginning, end with the latest report, and never exceed the bound.
  for (int step = 12; step <= 1000; ++step) history.AddPoint(At(step));
  const std::vector<int64_t> steps = Steps(history.Snapshot());
  ASSERT_LE(steps.size(), 9u);  // 8 kept + the latest
  ASSERT_GE(steps.size(), 4u);
  EXPECT_EQ(steps.back(), 1000);
  const int64_t stride = history.stride();
  // The series overflows at report 1 + 8 * s with stride s, and the stride doubles then:
  // the last overflow before report 1000 is at 513 = 1 + 8 * 64.
  EXPECT_EQ(stride, 128);
  EXPECT_LE(steps.front(), stride);
  for (size_t i = 1; i + 1 < steps.size(); ++i) {
    EXPECT_EQ(steps[i] - steps[i - 1], stride) << "between points " << i - 1 << " and " << i;
  }
  EXPECT_LE(steps.back() - steps[steps.size() - 2], stride);
}

TEST(JobHistoryTest, GoingBackToACheckpointReplacesTheRedoneSteps) {
  JobHistory history(JobHistoryOptions{.max_points = 100});
  for (int step = 1; step <= 20; ++step) history.AddPoint(At(step, 1));
  // Epoch 2 restored step 10: its first step is 11.
  for (int step = 11; step <= 15; ++step) history.AddPoint(At(step, 2));
  const JobHistory::View view = history.Snapshot();
  std::vector<int64_t> expected;
  for (int step = 1; step <= 15; ++step) expected.push_back(step);
  EXPECT_EQ(Steps(view), expected);
  EXPECT_EQ(view.points[9].epoch, 1);   // step 10
  EXPECT_EQ(view.points[10].epoch, 2);  // step 11, done again
  EXPECT_EQ(view.points.back().epoch, 2);
}

TEST(JobHistoryTest, KeepsTheNewestEpochsAndReplacesOneCommittedAgain) {
  JobHistory history(JobHistoryOptions{.max_epochs = 2});
  history.AddEpoch({1, EpochCause::kStart, absl::FromUnixSeconds(1), {{"a", 0}, {"b", 0}}});
  history.AddEpoch({2, EpochCause::kFailure, absl::FromUnixSeconds(2), {{"a", 0}}});
  history.AddEpoch({3, EpochCause::kGrow, absl::FromUnixSeconds(3), {{"a", 0}, {"c", 1}}});
  JobHistory::View view = history.Snapshot();
  ASSERT_EQ(view.epochs.size(), 2u);
  EXPECT_EQ(view.epochs[0].epoch, 2);
  EXPECT_EQ(view.epochs[0].cause, EpochCause::kFailure);
  EXPECT_EQ(view.epochs[1].ranks[1], (SlotRef{"c", 1}));

  history.AddEpoch({3, EpochCause::kRestore, absl::FromUnixSeconds(9), {{"c", 1}}});
  view = history.Snapshot();
  ASSERT_EQ(view.epochs.size(), 2u);
  EXPECT_EQ(view.epochs[1].cause, EpochCause::kRestore);
  EXPECT_EQ(view.epochs[1].ranks.size(), 1u);
}

}  // namespace
}  // namespace ringmaster::coordinator
