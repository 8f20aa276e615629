#include "client/testing/fake_coordinator.h"

#include <thread>

#include "gtest/gtest.h"

namespace ringmaster::client::testing {
namespace {

TEST(FakeCoordinatorTest, QueuedAnswersComeInOrderThenTheFallback) {
  FakeCoordinator fake;
  Job first, second;
  first.set_id("a");
  second.set_id("b");
  fake.get.Then(first).Then(absl::NotFoundError("no job b")).Always(second);
  EXPECT_EQ(fake.Get("x")->id(), "a");
  EXPECT_TRUE(absl::IsNotFound(fake.Get("y").status()));
  EXPECT_EQ(fake.Get("z")->id(), "b");
  EXPECT_EQ(fake.Get("w")->id(), "b");
  ASSERT_EQ(fake.get.calls(), 4);
  EXPECT_EQ(fake.get.requests()[1].job(), "y");
}

TEST(FakeCoordinatorTest, AnUnscriptedCallIsUnimplementedAndNamed) {
  FakeCoordinator fake;
  absl::Status s = fake.Ready(ReadyRequest());
  EXPECT_TRUE(absl::IsUnimplemented(s));
  EXPECT_NE(s.message().find("Ready"), absl::string_view::npos);
}

TEST(FakeCoordinatorTest, AStreamStopsWhenTheCallbackSaysSo) {
  FakeCoordinator fake;
  Stream<LogChunk> stream;
  for (const char* data : {"one", "two", "three"}) stream.items.emplace_back().set_data(data);
  stream.status = absl::UnavailableError("agent gone");
  fake.logs.Then(stream).Then(stream);
  std::string seen;
  EXPECT_TRUE(
      absl::IsUnavailable(fake.Logs(LogsRequest(), absl::InfiniteFuture(), [&](const LogChunk& c) {
        seen += c.data();
        return true;
      })));
  EXPECT_EQ(seen, "onetwothree");
  seen.clear();
  EXPECT_TRUE(fake.Logs(LogsRequest(), absl::InfiniteFuture(),
                        [&](const LogChunk& c) {
                          seen += c.data();
                          return seen.size() < 6;
                        })
                  .ok());
  EXPECT_EQ(seen, "onetwo");
}

TEST(FakeCoordinatorTest, StoreIsPerJobAndGetWaitsForASetOnAnotherThread) {
  FakeCoordinator fake;
  StoreAddRequest add;
  add.set_job("j");
  add.set_key("n");
  add.set_delta(2);
  EXPECT_EQ(fake.StoreAdd(add)->value(), 2);
  EXPECT_EQ(fake.StoreAdd(add)->value(), 4);
  StoreGetRequest get;
  get.set_job("other");
  get.add_keys("n");
  EXPECT_TRUE(absl::IsDeadlineExceeded(fake.StoreGet(get, absl::Now()).status()));
  get.set_job("j");
  get.add_keys("late");
  std::thread setter([&] {
    StoreSetRequest set;
    set.set_job("j");
    set.set_key("late");
    set.set_value("v");
    ASSERT_TRUE(fake.StoreSet(set).ok());
  });
  auto got = fake.StoreGet(get, absl::Now() + absl::Seconds(30));
  setter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->values_size(), 2);
  EXPECT_EQ(got->values(0), "4");
  EXPECT_EQ(got->values(1), "v");
}

TEST(FakeCoordinatorTest, AwaitCallsMeetsACallFromAnotherThread) {
  FakeCoordinator fake;
  fake.drain_node.Always(DrainNodeResponse());
  std::thread caller([&] { ASSERT_TRUE(fake.DrainNode(DrainNodeRequest()).ok()); });
  EXPECT_TRUE(fake.drain_node.AwaitCalls(1));
  caller.join();
  EXPECT_FALSE(fake.drain_node.AwaitCalls(2, absl::ZeroDuration()));
}

}  // namespace
}  // namespace ringmaster::client::testing
