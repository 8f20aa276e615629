#include "common/loopback.h"

#include "gtest/gtest.h"

namespace ringmaster {
namespace {

TEST(IsLoopbackAddress, LoopbackAddressesAreParsedNotMatchedByPrefix) {
  for (const char* yes : {"127.0.0.1:7070", "127.255.3.4:1", "127.0.0.1", "localhost:1",
                          "LocalHost:1", "localhost", "[::1]:7070", "::1",
                          "[::ffff:127.0.0.1]:80", "[0:0:0:0:0:0:0:1]:9"}) {
    EXPECT_TRUE(IsLoopbackAddress(yes)) << yes;
  }
  // Issue 36 point 21: a host NAME that starts with "127." resolves wherever its owner
  // says; so do names ending in "localhost" other than localhost itself.
  for (const char* no : {"127.example.com:7070", "127.0.0.1.nip.io:80", "127.evil:1",
                         "127.:1", "127.1:7070", "0.0.0.0:7070", "[::]:7070", "10.0.0.1:1",
                         "128.0.0.1:1", "[::ffff:10.0.0.1]:80", "localhost.example.com:1",
                         "", ":7070", "[::1", "host:1"}) {
    EXPECT_FALSE(IsLoopbackAddress(no)) << no;
  }
}

}  // namespace
}  // namespace ringmaster
