#include "comm/tcp/shm_ring.h"

#include <sys/mman.h>

#include <cstdint>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace ringmaster::comm::tcp {
namespace {

TEST(ShmRing, OpenChecksNameNonceAndCapacity) {
  auto ring = ShmRing::Create(4096);
  ASSERT_TRUE(ring.ok()) << ring.status();
  const std::string name = (*ring)->name();
  EXPECT_TRUE(ShmRing::Open(name, 4096, (*ring)->nonce()).ok());
  EXPECT_EQ(ShmRing::Open(name, 4096, (*ring)->nonce() + 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ShmRing::Open(name, 8192, (*ring)->nonce()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ShmRing::Open(name, 1000, (*ring)->nonce()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  (*ring)->Unlink();
  auto gone = ShmRing::Open(name, 4096, (*ring)->nonce());
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(gone.status().message().find(name), std::string::npos);
}

TEST(ShmRing, NameIsRemovedWhenTheCreatorGoes) {
  std::string name;
  {
    auto ring = ShmRing::Create(4096);
    ASSERT_TRUE(ring.ok());
    name = (*ring)->name();
  }
  EXPECT_EQ(ShmRing::Open(name, 4096, 0).status().code(), absl::StatusCode::kNotFound);
}

TEST(ShmRing, EventcountArmsOnlyWhenUnusable) {
  auto producer = ShmRing::Create(4096);
  ASSERT_TRUE(producer.ok());
  auto consumer = ShmRing::Open((*producer)->name(), 4096, (*producer)->nonce());
  ASSERT_TRUE(consumer.ok());
  ShmRing& tx = **producer;
  ShmRing& rx = **consumer;

  EXPECT_TRUE(rx.ArmConsumerWait());  // empty: sleep
  char byte = 7;
  tx.WriteAt(0, &byte, 1);
  EXPECT_TRUE(tx.Publish(8));          // the consumer was asleep: wake it
  EXPECT_FALSE(tx.Publish(0));         // only once
  EXPECT_FALSE(rx.ArmConsumerWait());  // data there: do not sleep
  EXPECT_EQ(rx.Available(), 8u);

  std::vector<char> fill(4096 - 8);
  tx.WriteAt(0, fill.data(), fill.size());
  tx.Publish(fill.size());
  EXPECT_EQ(tx.Space(), 0u);
  EXPECT_TRUE(tx.ArmProducerWait());  // full: sleep
  EXPECT_TRUE(rx.Release(4));         // any release wakes a sleeping producer...
  EXPECT_TRUE(tx.ArmProducerWait());  // ...which sleeps again: 4 bytes are no room
  EXPECT_TRUE(rx.Release(4));
  EXPECT_FALSE(tx.ArmProducerWait());  // 8 bytes: go on
}

TEST(ShmRing, FutexSleeperIsWokenByAPublishAndTimesOutWithout) {
  auto producer = ShmRing::Create(4096);
  ASSERT_TRUE(producer.ok());
  auto consumer = ShmRing::Open((*producer)->name(), 4096, (*producer)->nonce());
  ASSERT_TRUE(consumer.ok());
  ShmRing& tx = **producer;
  ShmRing& rx = **consumer;

  // Nothing published: the wait ends at its timeout.
  ASSERT_TRUE(rx.ArmConsumerFutexWait());
  const absl::Time start = absl::Now();
  EXPECT_FALSE(rx.FutexWaitConsumer(absl::Milliseconds(20)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(15));
  rx.DisarmConsumerWait();

  // A publish from another thread wakes the sleeper long before its (long) timeout, and
  // asks for no wake-up byte: the futex did it.
  ASSERT_TRUE(rx.ArmConsumerFutexWait());
  bool needs_byte = true;
  std::thread publisher([&] {
    absl::SleepFor(absl::Milliseconds(20));
    char byte = 1;
    tx.WriteAt(0, &byte, 1);
    needs_byte = tx.Publish(8);
  });
  const absl::Time before = absl::Now();
  EXPECT_TRUE(rx.FutexWaitConsumer(absl::Seconds(10)));
  EXPECT_LT(absl::Now() - before, absl::Seconds(5));
  rx.DisarmConsumerWait();
  publisher.join();
  EXPECT_FALSE(needs_byte);
  EXPECT_EQ(rx.Available(), 8u);
  // Data there: the futex sleeper does not sleep.
  EXPECT_FALSE(rx.ArmConsumerFutexWait());
}

// A producer thread streams a known byte sequence through a small ring with odd write
// sizes; the consumer reads it back across many wrap-arounds.
TEST(ShmRing, StreamsAcrossWrapAround) {
  auto producer = ShmRing::Create(4096);
  ASSERT_TRUE(producer.ok());
  auto consumer = ShmRing::Open((*producer)->name(), 4096, (*producer)->nonce());
  ASSERT_TRUE(consumer.ok());
  constexpr size_t kTotal = 3 << 20;
  auto value = [](size_t i) { return static_cast<char>((i * 131) ^ (i >> 9)); };
  std::thread writer([&] {
    ShmRing& tx = **producer;
    std::vector<char> chunk(1500);
    size_t sent = 0, step = 1;
    while (sent < kTotal) {
      size_t n = std::min({tx.Space(), kTotal - sent, (step++ * 37) % 1500 + 1});
      if (n == 0) continue;
      for (size_t i = 0; i < n; ++i) chunk[i] = value(sent + i);
      tx.WriteAt(0, chunk.data(), n);
      tx.Publish(n);
      sent += n;
    }
  });
  ShmRing& rx = **consumer;
  size_t received = 0, mismatches = 0;
  std::vector<char> out(4096);
  while (received < kTotal) {
    size_t n = rx.Available();
    if (n == 0) continue;
    n = std::min(n, size_t{999});
    rx.ReadAt(0, out.data(), n);
    for (size_t i = 0; i < n; ++i) mismatches += out[i] != value(received + i);
    rx.Release(n);
    received += n;
  }
  writer.join();
  EXPECT_EQ(mismatches, 0u);
  EXPECT_EQ(rx.Available(), 0u);
}

}  // namespace
}  // namespace ringmaster::comm::tcp
