#include "spec/yaml_proto.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "spec/testdata/yaml_proto_test.pb.h"

namespace ringmaster::spec {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::ringmaster::spec::yaml_test::Everything;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::SizeIs;

absl::StatusOr<Everything> Parse(absl::string_view yaml, FieldLocations* locations = nullptr) {
  Everything message;
  const absl::Status status = MergeYamlIntoMessage(yaml, {"t.yaml"}, &message, locations);
  if (!status.ok()) return status;
  return message;
}

// The message of parsing `yaml`, which must fail with INVALID_ARGUMENT.
std::string ParseError(absl::string_view yaml) {
  const absl::StatusOr<Everything> message = Parse(yaml);
  EXPECT_EQ(message.status().code(), absl::StatusCode::kInvalidArgument) << yaml;
  return std::string(message.status().message());
}

absl::Status Set(Everything* message, absl::string_view path, absl::string_view value) {
  return SetFieldFromYaml(message, path, value, {"--set x"}, nullptr);
}

TEST(YamlProtoTest, ReadsEveryKindOfField) {
  const absl::StatusOr<Everything> m = Parse(R"(
i32: -7
i64: 9000000000
u32: 4000000000
u64: 18446744073709551615
real: 0.25
single: 1.5
flag: yes
text: hello world
color: dark_blue
numbers: [1, 2, 3]
items:
  - {count: 1, label: a}
  - count: 2
inner: {count: 5}
second: 12
maybe: 0
colors: [red, DARK_BLUE]
child: {child: {i32: 3}}
)");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->i32(), -7);
  EXPECT_EQ(m->i64(), 9000000000);
  EXPECT_EQ(m->u32(), 4000000000u);
  EXPECT_EQ(m->u64(), 18446744073709551615u);
  EXPECT_EQ(m->real(), 0.25);
  EXPECT_EQ(m->single(), 1.5f);
  EXPECT_TRUE(m->flag());
  EXPECT_EQ(m->text(), "hello world");
  EXPECT_EQ(m->color(), Everything::COLOR_DARK_BLUE);
  EXPECT_THAT(m->numbers(), ElementsAre(1, 2, 3));
  ASSERT_THAT(m->items(), SizeIs(2));
  EXPECT_EQ(m->items(0).label(), "a");
  EXPECT_EQ(m->items(1).count(), 2);
  EXPECT_EQ(m->inner().count(), 5);
  EXPECT_EQ(m->choice_case(), Everything::kSecond);
  EXPECT_EQ(m->second(), 12);
  EXPECT_TRUE(m->has_maybe());
  EXPECT_EQ(m->maybe(), 0);
  EXPECT_THAT(m->colors(), ElementsAre(Everything::COLOR_RED, Everything::COLOR_DARK_BLUE));
  EXPECT_EQ(m->child().child().i32(), 3);
}

TEST(YamlProtoTest, BooleansInEveryCommonSpelling) {
  for (const char* yes : {"true", "True", "yes", "on"}) {
    EXPECT_TRUE(Parse(absl::StrCat("flag: ", yes))->flag()) << yes;
  }
  for (const char* no : {"false", "FALSE", "no", "off"}) {
    EXPECT_FALSE(Parse(absl::StrCat("flag: ", no))->flag()) << no;
  }
}

TEST(YamlProtoTest, UnknownKeyDeepDownNamesPathLineColumnAndNearMiss) {
  EXPECT_EQ(ParseError("child:\n  child:\n    i33: 1\n"),
            "t.yaml:3:5: child.child.i33: unknown key \"i33\"; did you mean \"i32\"?");
}

// A spec with a great many unknown keys (issue 17, point 15) gets the first 20 errors and a
// count of the rest, not a message as long as the spec.
TEST(YamlProtoTest, ManyErrorsAreReportedBoundedWithACount) {
  std::string yaml;
  for (int i = 0; i < 100000; ++i) absl::StrAppend(&yaml, "unknown_", i, ": 1\n");
  const std::string error = ParseError(yaml);
  EXPECT_EQ(std::count(error.begin(), error.end(), '\n'), kMaxFieldErrors);
  EXPECT_THAT(error, HasSubstr("t.yaml:1:1: unknown_0: unknown key"));
  EXPECT_THAT(error, HasSubstr("... and 99980 more errors"));
  EXPECT_LT(error.size(), 20000u);
}

TEST(YamlProtoTest, UnknownKeyFarFromAnyListsTheKeys) {
  EXPECT_EQ(ParseError("inner: {zzz: 1}"),
            "t.yaml:1:9: inner.zzz: unknown key \"zzz\"; expected one of count, label");
}

TEST(YamlProtoTest, WrongTypesSayWhatWasExpected) {
  EXPECT_EQ(ParseError("i32: abc"), "t.yaml:1:6: i32: expected an integer, got \"abc\"");
  EXPECT_EQ(ParseError("i64: 1.5"), "t.yaml:1:6: i64: expected an integer, got \"1.5\"");
  EXPECT_EQ(ParseError("u64: -1"), "t.yaml:1:6: u64: expected a non-negative integer, got \"-1\"");
  EXPECT_EQ(ParseError("real: fast"), "t.yaml:1:7: real: expected a number, got \"fast\"");
  EXPECT_EQ(ParseError("real: nan"), "t.yaml:1:7: real: expected a finite number, got \"nan\"");
  EXPECT_EQ(ParseError("flag: maybe"), "t.yaml:1:7: flag: expected true or false, got \"maybe\"");
}

TEST(YamlProtoTest, OutOfRangeIntegersAndFloats) {
  EXPECT_EQ(ParseError("i32: 2147483648"),
            "t.yaml:1:6: i32: out of range: 2147483648 is not in [-2147483648, 2147483647]");
  EXPECT_EQ(ParseError("u32: 4294967296"),
            "t.yaml:1:6: u32: out of range: 4294967296 is not in [0, 4294967295]");
  EXPECT_THAT(ParseError("i64: 9223372036854775808"), HasSubstr("i64: out of range"));
  EXPECT_THAT(ParseError("single: 1e39"), HasSubstr("single: out of range: 1e39"));
}

TEST(YamlProtoTest, EnumsListTheAllowedNames) {
  EXPECT_EQ(ParseError("color: blue"),
            "t.yaml:1:8: color: expected one of red, dark_blue, got \"blue\"");
  EXPECT_EQ(ParseError("color: dark_bleu"),
            "t.yaml:1:8: color: expected one of red, dark_blue, got \"dark_bleu\"; did you mean "
            "\"dark_blue\"?");
  EXPECT_THAT(ParseError("color: unspecified"), HasSubstr("expected one of red, dark_blue"));
  EXPECT_THAT(ParseError("colors: [red, 2]"), HasSubstr("colors[1]: expected one of"));
}

TEST(YamlProtoTest, TwoMembersOfAOneofConflict) {
  EXPECT_EQ(ParseError("first: {count: 1}\nsecond: 2"),
            "t.yaml:2:1: second: conflicts with first (at 1:1): only one of first, second may "
            "be set");
}

TEST(YamlProtoTest, AnEmptyMessageSelectsItsOneofMemberAndAnEmptyScalarDoesNot) {
  absl::StatusOr<Everything> m = Parse("first:\n");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->choice_case(), Everything::kFirst);
  m = Parse("second: ~\nfirst: {count: 2}\n");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->first().count(), 2);
}

TEST(YamlProtoTest, ListsAndScalarsMixedUp) {
  EXPECT_EQ(ParseError("numbers: 5"), "t.yaml:1:10: numbers: expected a list, got \"5\"");
  EXPECT_EQ(ParseError("i32: [1, 2]"), "t.yaml:1:6: i32: expected an integer, got a list");
  EXPECT_EQ(ParseError("inner: 5"),
            "t.yaml:1:8: inner: expected a mapping with keys count, label, got \"5\"");
  EXPECT_EQ(ParseError("numbers: [1, x]"),
            "t.yaml:1:14: numbers[1]: expected an integer, got \"x\"");
  EXPECT_EQ(ParseError("items:\n  - count: x\n"),
            "t.yaml:2:12: items[0].count: expected an integer, got \"x\"");
  EXPECT_EQ(ParseError("text: {a: 1}"), "t.yaml:1:7: text: expected a string, got a mapping");
}

TEST(YamlProtoTest, DuplicateKeys) {
  EXPECT_EQ(ParseError("i32: 1\ni32: 2"), "t.yaml:2:1: i32: duplicate key (first at 1:1)");
}

TEST(YamlProtoTest, SyntaxErrorsHaveLineAndColumn) {
  EXPECT_THAT(ParseError("i32: 1\nnumbers: [1, 2\nreal: 3\n"),
              HasSubstr("t.yaml:3:5: YAML syntax error: "));
  EXPECT_EQ(ParseError("i32: 1\n  real: 2\n"), "t.yaml:2:7: YAML syntax error: illegal map value");
}

TEST(YamlProtoTest, DocumentShape) {
  EXPECT_THAT(ParseError("i32: 1\n---\ni32: 2\n"),
              HasSubstr("expected one YAML document, found 2"));
  EXPECT_THAT(ParseError("hello"),
              HasSubstr("t.yaml:1:1: expected a mapping with keys i32, i64, u32"));
  const absl::StatusOr<Everything> empty = Parse("# nothing but a comment\n");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->ByteSizeLong(), 0u);
}

TEST(YamlProtoTest, EveryErrorIsReportedOnItsOwnLine) {
  const std::string message = ParseError("i32: x\nreal: y\nzzz: 1\ninner: {count: z}\n");
  EXPECT_THAT(absl::StrSplit(message, '\n'),
              ElementsAre(HasSubstr("1:6: i32:"), HasSubstr("2:7: real:"), HasSubstr("3:1: zzz:"),
                          HasSubstr("4:16: inner.count:")));
}

TEST(YamlProtoTest, EmptyValuesLeaveScalarsAndListsUnset) {
  const absl::StatusOr<Everything> m = Parse("maybe: ~\ntext:\nnumbers:\n");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_FALSE(m->has_maybe());
  EXPECT_EQ(m->text(), "");
  EXPECT_TRUE(m->numbers().empty());
}

TEST(YamlProtoTest, MergeReplacesWrittenFieldsAndKeepsTheRest) {
  Everything message;
  message.set_i32(5);
  message.add_numbers(1);
  message.add_numbers(2);
  ASSERT_TRUE(MergeYamlIntoMessage("numbers: [3]", {}, &message, nullptr).ok());
  EXPECT_EQ(message.i32(), 5);
  EXPECT_THAT(message.numbers(), ElementsAre(3));
}

TEST(YamlProtoTest, LocationsOfFieldsAndTheirNearestEnclosingField) {
  FieldLocations locations;
  ASSERT_TRUE(Parse("inner:\n  count: 5\nnumbers: [1, 2]\n", &locations).ok());
  EXPECT_EQ(locations.Find("inner.count"), "t.yaml:2:10");
  EXPECT_EQ(locations.Find("numbers[1]"), "t.yaml:3:14");
  EXPECT_EQ(locations.Find("numbers"), "t.yaml:3:1");
  EXPECT_EQ(locations.Find("inner.label"), "t.yaml:1:1");
  EXPECT_EQ(locations.Find("real"), "");
}

TEST(SetFieldFromYamlTest, ScalarsListsAndElements) {
  Everything message;
  ASSERT_TRUE(Set(&message, "i32", "42").ok());
  EXPECT_EQ(message.i32(), 42);
  ASSERT_TRUE(Set(&message, "numbers", "[4, 5]").ok());
  EXPECT_THAT(message.numbers(), ElementsAre(4, 5));
  ASSERT_TRUE(Set(&message, "numbers[1]", "9").ok());
  EXPECT_THAT(message.numbers(), ElementsAre(4, 9));
  message.add_items()->set_count(1);
  ASSERT_TRUE(Set(&message, "items[0].label", "x").ok());
  EXPECT_EQ(message.items(0).label(), "x");
  EXPECT_EQ(message.items(0).count(), 1);
  ASSERT_TRUE(Set(&message, "child.child.color", "red").ok());
  EXPECT_EQ(message.child().child().color(), Everything::COLOR_RED);
}

TEST(SetFieldFromYamlTest, AMessageIsReplacedWhole) {
  Everything message;
  message.mutable_inner()->set_count(1);
  message.mutable_inner()->set_label("a");
  ASSERT_TRUE(Set(&message, "inner", "{label: b}").ok());
  EXPECT_EQ(message.inner().count(), 0);
  EXPECT_EQ(message.inner().label(), "b");
}

TEST(SetFieldFromYamlTest, EnteringAOneofMemberSelectsIt) {
  Everything message;
  message.set_second(5);
  ASSERT_TRUE(Set(&message, "first.count", "2").ok());
  EXPECT_EQ(message.choice_case(), Everything::kFirst);
  EXPECT_EQ(message.first().count(), 2);
  ASSERT_TRUE(Set(&message, "second", "3").ok());
  EXPECT_EQ(message.choice_case(), Everything::kSecond);
}

TEST(SetFieldFromYamlTest, EmptyValueUnsets) {
  Everything message;
  message.set_maybe(3);
  message.set_i32(3);
  ASSERT_TRUE(Set(&message, "maybe", "").ok());
  ASSERT_TRUE(Set(&message, "i32", "").ok());
  EXPECT_FALSE(message.has_maybe());
  EXPECT_EQ(message.i32(), 0);
}

TEST(SetFieldFromYamlTest, BadPathsAndValuesLeaveTheMessageUnchanged) {
  Everything message;
  message.set_second(5);
  message.add_numbers(1);
  const Everything before = message;
  EXPECT_EQ(Set(&message, "inner.cont", "1").message(),
            "--set x: inner.cont: unknown field \"cont\"; did you mean \"count\"?");
  EXPECT_EQ(Set(&message, "first.count", "x").message(),
            "--set x: first.count: expected an integer, got \"x\"");
  EXPECT_EQ(Set(&message, "i32.x", "1").message(),
            "--set x: i32: holds an integer, not fields; it cannot be followed by '.'");
  EXPECT_EQ(Set(&message, "numbers[3]", "1").message(),
            "--set x: numbers[3]: no such element; the list has 1");
  EXPECT_EQ(Set(&message, "i32[0]", "1").message(), "--set x: i32: is not a list; remove [0]");
  EXPECT_EQ(Set(&message, "items.count", "1").message(),
            "--set x: items: is a list; name an element, e.g. items[0]");
  EXPECT_THAT(Set(&message, "a..b", "1").message(), HasSubstr("bad field path \"a..b\""));
  EXPECT_THAT(Set(&message, "numbers", "[1, 2").message(),
              HasSubstr("--set x: numbers: YAML syntax error in \"[1, 2\""));
  EXPECT_EQ(Set(&message, "numbers", "[1, x]").message(),
            "--set x: numbers[1]: expected an integer, got \"x\"");
  EXPECT_TRUE(MessageDifferencer::Equals(message, before)) << message.DebugString();
}

TEST(SetFieldFromYamlTest, RecordsTheOverrideAsTheLocation) {
  Everything message;
  FieldLocations locations;
  ASSERT_TRUE(SetFieldFromYaml(&message, "inner.count", "1", {"--set a"}, &locations).ok());
  EXPECT_EQ(locations.Find("inner.count"), "--set a");
}

TEST(ClearFieldAtPathTest, ClearsWithoutSelectingOneofMembers) {
  Everything message;
  message.set_second(5);
  message.mutable_inner()->set_count(2);
  message.mutable_inner()->set_label("a");
  ASSERT_TRUE(ClearFieldAtPath(&message, "first.count").ok());
  EXPECT_EQ(message.choice_case(), Everything::kSecond);
  ASSERT_TRUE(ClearFieldAtPath(&message, "inner.label").ok());
  EXPECT_EQ(message.inner().count(), 2);
  EXPECT_EQ(message.inner().label(), "");
  EXPECT_EQ(ClearFieldAtPath(&message, "inner.nope").code(), absl::StatusCode::kInvalidArgument);
}

TEST(MessageToYamlTest, RoundTripsEveryKindOfField) {
  Everything message;
  message.set_i32(-7);
  message.set_i64(std::numeric_limits<int64_t>::min());
  message.set_u32(std::numeric_limits<uint32_t>::max());
  message.set_u64(std::numeric_limits<uint64_t>::max());
  message.set_real(1.0 / 3);
  message.set_single(0.1f);
  message.set_flag(true);
  message.set_text("multi\nline: with # and 'quotes\"");
  message.set_color(Everything::COLOR_DARK_BLUE);
  message.add_numbers(1);
  message.add_numbers(-2);
  message.add_items()->set_label("~");
  message.add_items()->set_count(3);
  message.mutable_inner();  // present and empty
  message.set_second(0);
  message.set_maybe(0);
  message.add_colors(Everything::COLOR_RED);
  message.mutable_child()->set_real(1e-8);
  const std::string yaml = MessageToYaml(message);
  const absl::StatusOr<Everything> back = Parse(yaml);
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << yaml;
  EXPECT_TRUE(MessageDifferencer::Equals(*back, message)) << yaml;
  EXPECT_THAT(yaml, HasSubstr("numbers: [1, -2]"));
  EXPECT_THAT(yaml, HasSubstr("color: dark_blue"));
  EXPECT_THAT(yaml, HasSubstr("single: 0.1\n"));
}

TEST(MessageToYamlTest, StringsThatLookLikeOtherThingsRoundTrip) {
  for (const char* text : {"", "~", "null", "true", "123", "- dash", "[x]", "#hash", " pad ",
                           "a: b", "{}", "\"dq", "'sq"}) {
    Everything message;
    message.set_text(text);
    const std::string yaml = MessageToYaml(message);
    const absl::StatusOr<Everything> back = Parse(yaml);
    ASSERT_TRUE(back.ok()) << back.status() << "\n" << yaml;
    EXPECT_EQ(back->text(), text) << yaml;
  }
}

TEST(MessageToYamlTest, LeavesOutUnsetFieldsWithPresenceAndEnumZero) {
  Everything message;
  message.set_i32(0);
  const std::string yaml = MessageToYaml(message);
  EXPECT_THAT(yaml, HasSubstr("i32: 0"));
  EXPECT_THAT(yaml, Not(HasSubstr("color")));
  EXPECT_THAT(yaml, Not(HasSubstr("maybe")));
  EXPECT_THAT(yaml, Not(HasSubstr("inner")));
  EXPECT_THAT(yaml, Not(HasSubstr("numbers")));
}

// Map fields (JobSpec.command.env): a YAML mapping of scalars, keys sorted on the way out.
TEST(YamlProtoTest, MapsReadAndWriteAsMappings) {
  const absl::StatusOr<Everything> m =
      Parse("labels: {b: \"2\", a: x y, c: 3}\ncounts: {one: 1}\n");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->labels().size(), 3u);
  EXPECT_EQ(m->labels().at("a"), "x y");
  EXPECT_EQ(m->labels().at("c"), "3");
  EXPECT_EQ(m->counts().at("one"), 1);
  const std::string yaml = MessageToYaml(*m);
  EXPECT_THAT(yaml, HasSubstr("labels:\n  a: \"x y\"\n  b: \"2\"\n  c: \"3\""));
  const absl::StatusOr<Everything> back = Parse(yaml);
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << yaml;
  EXPECT_TRUE(MessageDifferencer::Equals(*back, *m)) << yaml;
  EXPECT_THAT(absl::StrSplit(MessageToFieldLines(*m), '\n'),
              ::testing::IsSupersetOf({"labels.a: x y", "labels.b: 2", "counts.one: 1"}));

  EXPECT_THAT(ParseError("labels: [a, b]"), HasSubstr("labels: expected a mapping, got"));
  EXPECT_THAT(ParseError("counts: {one: x}"), HasSubstr("counts.one:"));
  EXPECT_THAT(ParseError("labels: {a: [1]}"), HasSubstr("labels.a: expected"));
}

TEST(FormatNumberTest, ShortestTextThatReadsBackExactly) {
  EXPECT_EQ(FormatNumber(0.05), "0.05");
  EXPECT_EQ(FormatNumber(25), "25");
  EXPECT_EQ(FormatNumber(65536), "65536");
  EXPECT_EQ(FormatNumber(600), "600");
  EXPECT_EQ(FormatNumber(-2e6), "-2000000");
  EXPECT_EQ(FormatNumber(1e300), "1e+300");
  EXPECT_EQ(FormatNumber(-0.0), "-0");
  EXPECT_EQ(FormatNumber(1e-8), "1e-08");
  EXPECT_EQ(FormatNumber(0.1 + 0.2), "0.30000000000000004");
}

TEST(EnumValueYamlNameTest, DropsTheEnumPrefixAndLowercases) {
  const auto* color = Everything::Color_descriptor();
  EXPECT_EQ(EnumValueYamlName(*color->FindValueByNumber(2)), "dark_blue");
}

}  // namespace
}  // namespace ringmaster::spec
