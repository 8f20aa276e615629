#include "common/proto_json.h"

#include <cmath>
#include <limits>
#include <string>

#include "common/testdata/json_test.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::JsonOuter;

TEST(ToJsonLine, SnakeCaseDefaultsWrittenOneLine) {
  JsonOuter m;
  m.set_count(3);
  m.set_name("a \"b\"\nc");
  EXPECT_EQ(ToJsonLine(m),
            R"({"count":3,"plain":0,"name":"a \"b\"\nc","flag":false,"items":[]})");
}

TEST(ToJsonLine, LeavesOutOptionalDoublesThatAreNotFinite) {
  JsonOuter m;
  m.set_measured(std::nan(""));
  m.add_items()->set_value(std::numeric_limits<double>::infinity());
  m.add_items()->set_value(0.5);
  m.mutable_inner()->set_value(-std::numeric_limits<double>::infinity());
  const std::string json = ToJsonLine(m);
  EXPECT_THAT(json, Not(HasSubstr("measured")));
  EXPECT_THAT(json, HasSubstr(R"("items":[{},{"value":0.5}])"));
  EXPECT_THAT(json, HasSubstr(R"("inner":{})"));
  EXPECT_TRUE(std::isnan(m.measured())) << "the message itself is left as it was";
}

TEST(FromJson, ReadsBackAndIgnoresUnknownKeys) {
  JsonOuter m;
  m.set_count(7);
  m.set_measured(0.25);
  m.set_flag(true);
  JsonOuter back;
  back.set_plain(9);  // cleared first
  std::string json = ToJsonLine(m);
  json.insert(1, R"("newer_field":[1,2],)");
  ASSERT_TRUE(FromJson(json, &back, "x").ok());
  EXPECT_EQ(back.count(), 7);
  EXPECT_TRUE(back.has_measured());
  EXPECT_EQ(back.measured(), 0.25);
  EXPECT_EQ(back.plain(), 0);
  EXPECT_TRUE(back.flag());
}

TEST(FromJson, NamesWhatIsNotJson) {
  JsonOuter m;
  absl::Status s = FromJson("{\"count\": \"many\"}", &m, "summary.json");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("summary.json: not a JsonOuter in JSON"));
  EXPECT_FALSE(FromJson("{\"count\": 1", &m, "x").ok());
}

}  // namespace
}  // namespace ringmaster
