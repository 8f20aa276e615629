#include "cli/estimate_pipeline.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "cli/command_line.h"
#include "common/file_util.h"
#include "gtest/gtest.h"

namespace ringmaster::cli {
namespace {

ParsedCommandLine Parse(const std::string& command_line) {
  return ParseCommandLine(absl::StrSplit(command_line, ' ', absl::SkipEmpty()));
}

// The flags, parsed as ringctl does, then the command's output.
absl::StatusOr<std::string> Estimate(const std::string& command_line) {
  ParsedCommandLine p = Parse(command_line);
  EXPECT_TRUE(p.line.has_value()) << command_line << ": " << p.err;
  if (!p.line) return absl::InvalidArgumentError(p.err);
  EXPECT_EQ(p.line->command, Command::kEstimatePipeline);
  return EstimatePipeline(p.line->pipeline);
}

TEST(EstimatePipeline, TimelineOfOneFOneB) {
  absl::StatusOr<std::string> text = Estimate("estimate pipeline --stages 2 --micro-batches 2");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_TRUE(absl::StrContains(*text, "1f1b on 2 rank(s), 2 micro-batch(es)")) << *text;
  EXPECT_TRUE(absl::StrContains(*text,
                                "rank 0   F0 F1 .  .  B0 B0 .  B1 B1\n"
                                "rank 1   .  F0 B0 B0 F1 B1 B1 .  .\n"
                                "bubble 33.3 % (formula 33.3 %)"))
      << *text;
}

// Seed exercise 35.9's numbers: GPipe's bubble on 2 ranks for 1, 2, 4 and 8 micro-batches is
// 1/2, 1/3, 1/5 and 1/9; zero bubble's at m = 4 a third of 1F1B's.
TEST(EstimatePipeline, BubblesOfEachSchedule) {
  for (const auto& [m, percent] : std::vector<std::pair<int, std::string>>{
           {1, "50.0 %"}, {2, "33.3 %"}, {4, "20.0 %"}, {8, "11.1 %"}}) {
    absl::StatusOr<std::string> text = Estimate(
        "estimate pipeline --schedule gpipe --stages 2 "
        "--micro-batches " +
        std::to_string(m));
    ASSERT_TRUE(text.ok()) << text.status();
    EXPECT_TRUE(absl::StrContains(*text, "bubble " + percent + " (formula " + percent + ")"))
        << m << ": " << *text;
    EXPECT_TRUE(
        absl::StrContains(*text, "per rank: " + std::to_string(m) + " " + std::to_string(m)))
        << *text;  // GPipe keeps every micro-batch's activations
  }
  absl::StatusOr<std::string> zb =
      Estimate("estimate pipeline --schedule zero_bubble --stages 2 --micro-batches 4");
  ASSERT_TRUE(zb.ok()) << zb.status();
  EXPECT_TRUE(absl::StrContains(*zb, "bubble 7.7 % (formula 7.7 %)")) << *zb;
  EXPECT_TRUE(absl::StrContains(*zb, "W0")) << *zb;
  absl::StatusOr<std::string> interleaved =
      Estimate("estimate pipeline --schedule interleaved_1f1b --stages 2 --micro-batches 4");
  ASSERT_TRUE(interleaved.ok()) << interleaved.status();
  EXPECT_TRUE(absl::StrContains(*interleaved, "2 virtual stages")) << *interleaved;
  EXPECT_TRUE(absl::StrContains(*interleaved, "F0.1")) << *interleaved;
  EXPECT_TRUE(absl::StrContains(*interleaved, "bubble 11.1 % (formula 11.1 %)")) << *interleaved;
}

TEST(EstimatePipeline, SweepAndSvg) {
  const std::string svg = std::string(std::getenv("TEST_TMPDIR")) + "/sweep.svg";
  absl::StatusOr<std::string> text = Estimate("estimate pipeline --sweep -o " + svg);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_TRUE(absl::StrContains(*text, "P=8: the bubble is below 10 % from m = 64")) << *text;
  EXPECT_TRUE(absl::StrContains(*text, "drawn in " + svg)) << *text;
  absl::StatusOr<std::string> drawn = ReadFile(svg);
  ASSERT_TRUE(drawn.ok()) << drawn.status();
  EXPECT_TRUE(absl::StartsWith(*drawn, "<svg")) << *drawn;
  EXPECT_TRUE(absl::StrContains(*drawn, "P = 16")) << *drawn;
}

// Every other flag is spelt with underscores; the hyphenated spellings stay accepted.
TEST(EstimatePipeline, TakesTheFlagsWithUnderscoresAndWithHyphens) {
  for (const char* args : {"estimate pipeline --stages 4 --micro_batches 8 --schedule "
                           "interleaved_1f1b --virtual_stages 3",
                           "estimate pipeline --stages 4 --micro-batches 8 --schedule "
                           "interleaved_1f1b --virtual-stages 3"}) {
    ParsedCommandLine p = Parse(args);
    ASSERT_TRUE(p.line.has_value()) << args << ": " << p.err;
    EXPECT_EQ(p.line->pipeline.micro_batches, 8) << args;
    EXPECT_EQ(p.line->pipeline.virtual_stages, 3) << args;
  }
}

TEST(EstimatePipeline, BadUsageNamesTheFlag) {
  ParsedCommandLine p = Parse("estimate pipeline --stages 4");
  EXPECT_EQ(p.exit_status, 2);
  EXPECT_TRUE(absl::StrContains(p.err, "--micro_batches")) << p.err;
  p = Parse("estimate pipeline --stages 4,8 --micro-batches 4");
  EXPECT_TRUE(absl::StrContains(p.err, "--stages: one count")) << p.err;
  p = Parse("estimate pipeline --stages 4 --micro-batches 4 --schedule zb");
  EXPECT_EQ(p.exit_status, 2);
  EXPECT_TRUE(absl::StrContains(p.err, "--schedule")) << p.err;
  absl::StatusOr<std::string> text =
      Estimate("estimate pipeline --schedule interleaved_1f1b --stages 4 --micro-batches 6");
  EXPECT_TRUE(absl::IsInvalidArgument(text.status()));
  EXPECT_TRUE(absl::StartsWith(text.status().message(), "--micro_batches: 6 is not a multiple"))
      << text.status();
  text = Estimate("estimate pipeline --stages 2 --micro-batches 2 --virtual-stages 2");
  EXPECT_TRUE(absl::StartsWith(text.status().message(), "--virtual_stages")) << text.status();
  text = Estimate("estimate pipeline --stages 2 --micro-batches 2 -o /nonexistent/dir/x.svg");
  EXPECT_FALSE(text.ok());
  EXPECT_TRUE(absl::StrContains(text.status().message(), "-o /nonexistent/dir/x.svg"))
      << text.status();
}

}  // namespace
}  // namespace ringmaster::cli
