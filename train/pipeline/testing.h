// Test helpers for the pipeline: schedules run on forked ranks (TCP communicator).
#ifndef RINGMASTER_TRAIN_PIPELINE_TESTING_H_
#define RINGMASTER_TRAIN_PIPELINE_TESTING_H_

#include <functional>
#include <initializer_list>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "comm/tcp/tcp_communicator.h"
#include "comm/testing/multiproc.h"
#include "gtest/gtest.h"
#include "train/pipeline/schedule.h"

namespace ringmaster::train::pipeline::testing {

inline std::string Name(const ScheduleOptions& o) {
  return absl::StrCat(ScheduleName(o.kind), " P=", o.ranks, " m=", o.micro_batches,
                      " v=", o.virtual_stages);
}

// Makes and checks `o`'s schedule, then runs `rank_body` on o.ranks forked ranks; a rank's
// error fails the test, naming the schedule and the rank.
inline void RunOnRanks(
    const ScheduleOptions& o,
    const std::function<absl::Status(comm::TcpCommunicator&, const Schedule&)>& rank_body) {
  absl::StatusOr<Schedule> schedule = MakeSchedule(o);
  ASSERT_TRUE(schedule.ok()) << Name(o) << ": " << schedule.status();
  ASSERT_TRUE(CheckSchedule(*schedule).ok()) << Name(o);
  comm::testing::MultiProcOptions mp;
  mp.world_size = o.ranks;
  auto results = comm::testing::RunRanks(
      mp, [&](comm::TcpCommunicator& comm, absl::Duration*) -> absl::Status {
        return rank_body(comm, *schedule);
      });
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_TRUE(results[r].status.ok()) << Name(o) << " rank " << r << ": " << results[r].status;
  }
}

// Every schedule kind for P in `ranks` and m in `micro_batches` (the interleaved one with
// v = 2 where P divides m and 2 P <= max_stages; the others with v = 1 where P <= max_stages).
inline void ForEachLayout(std::initializer_list<int> ranks,
                          std::initializer_list<int> micro_batches, int max_stages,
                          const std::function<void(const ScheduleOptions&)>& fn) {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB,
                            ScheduleKind::kInterleaved1F1B, ScheduleKind::kZeroBubble}) {
    const bool interleaved = kind == ScheduleKind::kInterleaved1F1B;
    for (int p : ranks) {
      for (int m : micro_batches) {
        const int v = interleaved ? 2 : 1;
        if ((interleaved && m % p != 0) || p * v > max_stages) continue;
        fn({kind, p, m, v});
      }
    }
  }
}

}  // namespace ringmaster::train::pipeline::testing

#endif  // RINGMASTER_TRAIN_PIPELINE_TESTING_H_
