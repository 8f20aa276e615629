#include "common/plural.h"

#include "gtest/gtest.h"

namespace ringmaster {
namespace {

TEST(Plural, OneIsSingularEveryOtherCountPlural) {
  EXPECT_EQ(Plural(1, "worker"), "1 worker");
  EXPECT_EQ(Plural(2, "worker"), "2 workers");
  EXPECT_EQ(Plural(0, "job"), "0 jobs");
  EXPECT_EQ(Plural(-1, "step"), "-1 steps");
  EXPECT_EQ(Plural(1, "recovery", "recoveries"), "1 recovery");
  EXPECT_EQ(Plural(4, "recovery", "recoveries"), "4 recoveries");
  EXPECT_EQ(PluralNoun(1, "node"), "node");
  EXPECT_EQ(PluralNoun(3, "node"), "nodes");
}

}  // namespace
}  // namespace ringmaster
