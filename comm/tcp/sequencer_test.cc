#include "comm/tcp/sequencer.h"

#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace ringmaster::comm::tcp {
namespace {

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

TEST(Sequencer, FirstTicketOnEachResourceRunsAtOnce) {
  Sequencer seq(3);
  const Sequencer::Ticket a = seq.Issue({0, 1});
  const Sequencer::Ticket b = seq.Issue({2});
  EXPECT_TRUE(seq.AwaitTurn(a, Soon()).ok());
  EXPECT_TRUE(seq.AwaitTurn(b, Soon()).ok());  // disjoint: runs while `a` holds its turns
  seq.Release(a);
  seq.Release(b);
}

TEST(Sequencer, LaterTicketOnASharedResourceWaitsForTheEarlierOne) {
  Sequencer seq(2);
  const Sequencer::Ticket first = seq.Issue({0, 1});
  const Sequencer::Ticket second = seq.Issue({1});
  ASSERT_TRUE(seq.AwaitTurn(first, Soon()).ok());
  // Not yet: `first` holds resource 1.
  absl::Status early = seq.AwaitTurn(second, absl::Now() + absl::Milliseconds(20));
  EXPECT_TRUE(absl::IsDeadlineExceeded(early)) << early;
  EXPECT_NE(early.message().find("resource 1"), std::string::npos) << early;

  absl::Notification ran;
  std::thread waiter([&] {
    EXPECT_TRUE(seq.AwaitTurn(second, Soon()).ok());
    ran.Notify();
    seq.Release(second);
  });
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_FALSE(ran.HasBeenNotified());
  seq.Release(first);
  EXPECT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(10)));
  waiter.join();
}

TEST(Sequencer, TurnsFollowIssueOrderNotAwaitOrder) {
  Sequencer seq(1);
  std::vector<Sequencer::Ticket> tickets;
  for (int i = 0; i < 8; ++i) tickets.push_back(seq.Issue({0}));
  std::vector<int> order;
  absl::Mutex mu;
  std::vector<std::thread> threads;
  // Started in reverse: each must still run after every ticket issued before it.
  for (int i = 7; i >= 0; --i) {
    threads.emplace_back([&, i] {
      ASSERT_TRUE(seq.AwaitTurn(tickets[i], Soon()).ok());
      {
        absl::MutexLock lock(&mu);
        order.push_back(i);
      }
      seq.Release(tickets[i]);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST(Sequencer, ATicketReleasedOutOfTurnStillHoldsItsPlace) {
  Sequencer seq(1);
  const Sequencer::Ticket a = seq.Issue({0});
  const Sequencer::Ticket b = seq.Issue({0});
  const Sequencer::Ticket c = seq.Issue({0});
  ASSERT_TRUE(seq.AwaitTurn(a, Soon()).ok());
  seq.Release(b);  // b gave up (say, its deadline passed) while a still runs
  EXPECT_TRUE(absl::IsDeadlineExceeded(seq.AwaitTurn(c, absl::Now() + absl::Milliseconds(10))));
  seq.Release(a);
  EXPECT_TRUE(seq.AwaitTurn(c, Soon()).ok());
  seq.Release(c);
}

TEST(Sequencer, StopWakesWaitersWithTheReason) {
  Sequencer seq(1);
  const Sequencer::Ticket a = seq.Issue({0});
  const Sequencer::Ticket b = seq.Issue({0});
  ASSERT_TRUE(seq.AwaitTurn(a, Soon()).ok());
  std::thread waiter([&] {
    absl::Status s = seq.AwaitTurn(b, Soon());
    EXPECT_TRUE(absl::IsAborted(s)) << s;
    EXPECT_EQ(s.message(), "aborted");
  });
  absl::SleepFor(absl::Milliseconds(10));
  seq.Stop(absl::AbortedError("aborted"));
  seq.Stop(absl::UnavailableError("later"));  // the first reason stays
  waiter.join();
  EXPECT_EQ(seq.AwaitTurn(seq.Issue({0}), Soon()).message(), "aborted");
}

TEST(Sequencer, AddedResourcesStartFree) {
  Sequencer seq(2);
  const int id = seq.AddResource();
  EXPECT_EQ(id, 2);
  const Sequencer::Ticket t = seq.Issue({id, 0});
  EXPECT_TRUE(seq.AwaitTurn(t, Soon()).ok());
  seq.Release(t);
}

}  // namespace
}  // namespace ringmaster::comm::tcp
