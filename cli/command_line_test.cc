#include "cli/command_line.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster::cli {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

ParsedCommandLine Parse(const std::string& command_line) {
  return ParseCommandLine(absl::StrSplit(command_line, ' ', absl::SkipEmpty()));
}

CommandLine Ok(const std::string& command_line) {
  ParsedCommandLine p = Parse(command_line);
  EXPECT_TRUE(p.line.has_value()) << command_line << ": " << p.err;
  return p.line.value_or(CommandLine{});
}

TEST(CommandLineTest, SubmitWithFlagsAnywhere) {
  // As tests/elastic_test.sh and deploy/k8s/submit-job.yaml call it.
  const CommandLine c = Ok(
      "submit job.yaml --set name=a --set epochs=2 --wait --coordinator=h:7070 "
      "--token_file /t/user.token");
  EXPECT_EQ(c.command, Command::kSubmit);
  EXPECT_EQ(c.target, "job.yaml");
  EXPECT_THAT(c.overrides, ElementsAre("name=a", "epochs=2"));
  EXPECT_TRUE(c.wait);
  EXPECT_EQ(c.connection.coordinator, "h:7070");
  EXPECT_EQ(c.connection.token_file, "/t/user.token");
  EXPECT_EQ(c.output, OutputFormat::kTable);
  // --set before the file does not swallow it.
  const CommandLine d = Ok("submit --set name=b job.yaml");
  EXPECT_EQ(d.target, "job.yaml");
  EXPECT_THAT(d.overrides, ElementsAre("name=b"));
}

TEST(CommandLineTest, OutputFormats) {
  EXPECT_EQ(Ok("list -o wide").output, OutputFormat::kWide);
  EXPECT_EQ(Ok("list --output=yaml --all").output, OutputFormat::kYaml);
  EXPECT_TRUE(Ok("list --all").all);
  EXPECT_EQ(Ok("status j -o json").output, OutputFormat::kJson);
  EXPECT_EQ(Ok("status j --json").output, OutputFormat::kJson);  // the old spelling
  EXPECT_EQ(Ok("status j --json -o json").output, OutputFormat::kJson);
  EXPECT_EQ(Ok("status j").target, "j");
  EXPECT_EQ(Ok("cancel j -o yaml").output, OutputFormat::kYaml);
  EXPECT_EQ(Ok("top j --json").output, OutputFormat::kJson);

  ParsedCommandLine p = Parse("status j --json -o yaml");
  EXPECT_EQ(p.exit_status, 2);
  EXPECT_THAT(p.err, HasSubstr("--json and -o yaml disagree"));
  p = Parse("list -o xml");
  EXPECT_EQ(p.exit_status, 2);
  EXPECT_THAT(p.err, AllOf(HasSubstr("--output"), HasSubstr("xml")));
  p = Parse("top j -o wide");  // top streams: json only
  EXPECT_EQ(p.exit_status, 2);
}

TEST(CommandLineTest, AllConnectionFlags) {
  const CommandLine c = Ok(
      "list --coordinator h:1 --token_file t --tls_ca ca --tls_client_cert cert "
      "--tls_client_key key --config cfg.yaml");
  EXPECT_EQ(c.connection.coordinator, "h:1");
  EXPECT_EQ(c.connection.token_file, "t");
  EXPECT_EQ(c.connection.tls_ca, "ca");
  EXPECT_EQ(c.connection.tls_client_cert, "cert");
  EXPECT_EQ(c.connection.tls_client_key, "key");
  EXPECT_EQ(c.connection.config, "cfg.yaml");
}

// A command job: what follows "--" is the program's argv, flags included, never ringctl's.
TEST(CommandLineTest, LocalWithAProgram) {
  const CommandLine c =
      Ok("local --workers 2 --set command.stop_grace_s=5 -- /usr/bin/python3 train.py "
         "--workers 9 --set x -- y");
  EXPECT_EQ(c.command, Command::kLocal);
  EXPECT_EQ(c.local.workers, 2);
  EXPECT_TRUE(c.local.spec_file.empty());
  EXPECT_THAT(c.local.overrides, ElementsAre("command.stop_grace_s=5"));
  EXPECT_THAT(c.local.command, ElementsAre("/usr/bin/python3", "train.py", "--workers", "9",
                                           "--set", "x", "--", "y"));
  EXPECT_THAT(Parse("local --workers 2").err, HasSubstr("give the job spec"));
  EXPECT_THAT(Parse("local --workers 2 --").err, HasSubstr("nothing after --"));
  EXPECT_THAT(Parse("local job.yaml -- python3 t.py").err,
              HasSubstr("give the job spec job.yaml or a program after --, not both"));
}

TEST(CommandLineTest, SubmitWithAProgram) {
  const CommandLine c = Ok("submit --set command.workdir=/srv --wait -- python3 train.py --wait x");
  EXPECT_EQ(c.command, Command::kSubmit);
  EXPECT_TRUE(c.target.empty());
  EXPECT_TRUE(c.wait);
  EXPECT_THAT(c.overrides, ElementsAre("command.workdir=/srv"));
  EXPECT_THAT(c.program, ElementsAre("python3", "train.py", "--wait", "x"));
  EXPECT_TRUE(Ok("submit job.yaml").program.empty());
}

// Both forms, a spec and a program after --, are in the Usage lines of local and submit.
TEST(CommandLineTest, LocalAndSubmitHelpShowBothForms) {
  for (const char* command : {"local", "submit"}) {
    const std::string help = Parse(absl::StrCat(command, " --help")).out;
    EXPECT_THAT(help, AllOf(HasSubstr(absl::StrCat("Usage: ringctl ", command,
                                                   " [OPTIONS] JOB_SPEC\n")),
                            HasSubstr(absl::StrCat("   or: ringctl ", command,
                                                   " [OPTIONS] -- PROGRAM [ARGS...]\n")),
                            HasSubstr("--set")))
        << help;
  }
  EXPECT_THAT(Parse("local --help").out,
              HasSubstr("ringctl local --workers 4 -- /usr/bin/python3 examples/torch_ddp/train.py"));
  EXPECT_THAT(Parse("--help").out, HasSubstr("ringctl submit [--set key=value ...] [--wait] -- "
                                             "PROGRAM [ARGS...]"));
}

TEST(CommandLineTest, Local) {
  const CommandLine c = Ok(
      "local --workers 2 job.yaml --set steps=120 --set a.b=1 --summary s.json --run_dir d "
      "--keep_run_dir");
  EXPECT_EQ(c.command, Command::kLocal);
  EXPECT_EQ(c.local.spec_file, "job.yaml");
  EXPECT_EQ(c.local.workers, 2);
  EXPECT_THAT(c.local.overrides, ElementsAre("steps=120", "a.b=1"));
  EXPECT_EQ(c.local.summary, "s.json");
  EXPECT_EQ(c.local.run_dir, "d");
  EXPECT_TRUE(c.local.keep_run_dir);
  EXPECT_FALSE(Ok("local job.yaml").local.keep_run_dir);
  EXPECT_EQ(Ok("local job.yaml").local.workers, 1);

  EXPECT_EQ(Ok("local job.yaml").local.rank_memory_limit_mib, 0) << "no limit unless asked";
  EXPECT_EQ(Ok("local job.yaml --rank_memory_limit 200M").local.rank_memory_limit_mib, 200);
  EXPECT_EQ(Ok("local job.yaml --rank_memory_limit=200MiB").local.rank_memory_limit_mib, 200);
  EXPECT_EQ(Ok("local job.yaml --rank_memory_limit 1.5G").local.rank_memory_limit_mib, 1536);
  EXPECT_EQ(Ok("local job.yaml --rank_memory_limit 2GiB").local.rank_memory_limit_mib, 2048);
  EXPECT_EQ(Ok("local job.yaml --rank_memory_limit 300").local.rank_memory_limit_mib, 300);
  for (const char* bad : {"200K", "M", "-5M", "0", "lots", "0.5M", "2T"}) {
    ParsedCommandLine limit = Parse(absl::StrCat("local job.yaml --rank_memory_limit ", bad));
    EXPECT_EQ(limit.exit_status, 2) << bad;
    EXPECT_THAT(limit.err, AllOf(HasSubstr("--rank_memory_limit"), HasSubstr(bad))) << bad;
  }
  ParsedCommandLine p = Parse("local --workers 0 job.yaml");
  EXPECT_EQ(p.exit_status, 2);
  EXPECT_THAT(p.err, HasSubstr("--workers"));
  p = Parse("local job.yaml --coordinator h:1");  // not a coordinator command
  EXPECT_EQ(p.exit_status, 2);
  EXPECT_THAT(p.err, HasSubstr("--coordinator"));
}

TEST(CommandLineTest, Export) {
  CommandLine c = Ok("export /ck/job -o model.safetensors");
  EXPECT_EQ(c.command, Command::kExport);
  EXPECT_EQ(c.target, "/ck/job");
  EXPECT_EQ(c.export_flags.out, "model.safetensors");
  EXPECT_EQ(c.export_flags.dtype, "f32");
  EXPECT_EQ(Ok("export --dtype bf16 /ck/job/step-4 --output m.st").export_flags.dtype, "bf16");
  ParsedCommandLine p = Parse("export /ck/job");
  EXPECT_EQ(p.exit_status, 2);
  EXPECT_THAT(p.err, HasSubstr("--output"));
  p = Parse("export /ck/job -o m.st --dtype f16");
  EXPECT_EQ(p.exit_status, 2);
  EXPECT_THAT(p.err, HasSubstr("--dtype"));
}

TEST(CommandLineTest, CheckpointAndEstimate) {
  CommandLine c = Ok("checkpoint verify /ck/job");
  EXPECT_EQ(c.command, Command::kCheckpointVerify);
  EXPECT_EQ(c.target, "/ck/job");
  EXPECT_EQ(Ok("checkpoint list /ck/job").command, Command::kCheckpointList);
  EXPECT_EQ(Ok("checkpoint inspect /ck/job/step-5").command, Command::kCheckpointInspect);
  EXPECT_EQ(Ok("checkpoints j").command, Command::kCheckpoints);

  c = Ok("estimate memory --params 7B --world 8 --zero 3 --precision fp32 --optimizer sgd");
  EXPECT_EQ(c.command, Command::kEstimateMemory);
  EXPECT_DOUBLE_EQ(c.estimate.parameters, 7e9);
  EXPECT_EQ(c.estimate.world_size, 8);
  EXPECT_EQ(c.estimate.zero_stage, 3);
  EXPECT_FALSE(c.estimate.mixed_precision);
  EXPECT_EQ(c.estimate.optimizer, train::MemoryEstimateOptions::Optimizer::kSgdMomentum);

  ParsedCommandLine p = Parse("estimate memory --params 7Q");
  EXPECT_EQ(p.exit_status, 2);
  EXPECT_THAT(p.err, HasSubstr("--params"));
  p = Parse("estimate memory --params 7B --zero 4");
  EXPECT_EQ(p.exit_status, 2);
  EXPECT_THAT(p.err, HasSubstr("--zero"));
}

TEST(CommandLineTest, DataPrepare) {
  CommandLine c = Ok("data prepare a.txt docs/ -o out/x.bin --validation_fraction 0.1");
  EXPECT_EQ(c.command, Command::kDataPrepare);
  EXPECT_EQ(c.data_prepare.tokenizer, "gpt2");
  EXPECT_THAT(c.data_prepare.inputs, ElementsAre("a.txt", "docs/"));
  EXPECT_EQ(c.data_prepare.output, "out/x.bin");
  EXPECT_DOUBLE_EQ(c.data_prepare.validation_fraction, 0.1);
  EXPECT_TRUE(c.data_prepare.corpus.empty());

  c = Ok("data prepare --tokenizer bytes --corpus sotu -o s.bin");
  EXPECT_EQ(c.data_prepare.tokenizer, "bytes");
  EXPECT_EQ(c.data_prepare.corpus, "sotu");
  EXPECT_TRUE(c.data_prepare.inputs.empty());
  EXPECT_EQ(c.data_prepare.validation_fraction, 0);

  for (const char* bad :
       {"data prepare a.txt", "data prepare -o x.bin",
        "data prepare a.txt -o x.bin --tokenizer gpt3", "data prepare a.txt -o x.bin --corpus wiki",
        "data prepare a.txt -o x.bin --validation_fraction 1"}) {
    const ParsedCommandLine p = Parse(bad);
    EXPECT_EQ(p.exit_status, 2) << bad;
    EXPECT_FALSE(p.line.has_value()) << bad;
    EXPECT_THAT(p.err, HasSubstr("data prepare")) << bad;
  }
  EXPECT_THAT(Parse("data prepare --help").out, HasSubstr("_train.bin"));
}

TEST(CommandLineTest, EstimateMemoryOfASpec) {
  CommandLine c = Ok("estimate memory --spec job.yaml --world 4 --set batch.global=64 -o json");
  EXPECT_EQ(c.command, Command::kEstimateMemory);
  EXPECT_EQ(c.estimate_spec.spec_file, "job.yaml");
  EXPECT_EQ(c.estimate_spec.world, 4);
  EXPECT_THAT(c.estimate_spec.overrides, ElementsAre("batch.global=64"));
  EXPECT_EQ(c.output, OutputFormat::kJson);
  EXPECT_EQ(Ok("estimate memory --spec job.yaml").estimate_spec.world, 0);  // the spec's
  EXPECT_EQ(Ok("estimate memory --params 7B").estimate_spec.spec_file, "");

  for (const auto& [line, flag] : std::vector<std::pair<std::string, std::string>>{
           {"estimate memory --spec job.yaml --world 0", "--world"},
           {"estimate memory --spec job.yaml --params 7B", "--params"},
           {"estimate memory --spec job.yaml --zero 3", "--zero"},
           {"estimate memory --spec job.yaml --optimizer sgd", "--optimizer"},
           {"estimate memory --params 7B --set a=b", "--set"},
           {"estimate memory --params 7B -o json", "-o"},
           {"estimate memory --world 2", "--spec"},
       }) {
    const ParsedCommandLine p = Parse(line);
    EXPECT_EQ(p.exit_status, 2) << line;
    EXPECT_THAT(p.err, HasSubstr(flag)) << line;
  }
}

TEST(CommandLineTest, HelpAndVersionExitZero) {
  for (const char* line : {"--help", "-h", "help", "status --help", "status -h", "help status",
                           "submit --help", "local -h", "checkpoint verify --help",
                           "estimate memory --help"}) {
    const ParsedCommandLine p = Parse(line);
    EXPECT_FALSE(p.line.has_value()) << line;
    EXPECT_EQ(p.exit_status, 0) << line;
    EXPECT_THAT(p.out, HasSubstr("Usage: ringctl")) << line;
  }
  EXPECT_THAT(Parse("status --help").out, AllOf(HasSubstr("--coordinator"), HasSubstr("-o,--output")));
  // The top-level help names every flag (deploy/deploy_test.py checks flags against it).
  EXPECT_THAT(Parse("--help").out,
              AllOf(HasSubstr("--coordinator"), HasSubstr("--token_file"), HasSubstr("--wait"),
                    HasSubstr("--tls_ca"), HasSubstr("--run_dir"), HasSubstr("--keep_run_dir")));
  const ParsedCommandLine v = Parse("--version");
  EXPECT_EQ(v.exit_status, 0);
  EXPECT_THAT(v.out, StartsWith("ringctl 0."));
  EXPECT_THAT(v.out, HasSubstr("(build "));
}

TEST(CommandLineTest, DeleteLogsNodesAndExtend) {
  CommandLine c = Ok("delete j -o json");
  EXPECT_EQ(c.command, Command::kDelete);
  EXPECT_EQ(c.target, "j");
  EXPECT_EQ(c.output, OutputFormat::kJson);
  c = Ok("logs j");
  EXPECT_EQ(c.command, Command::kLogs);
  EXPECT_EQ(c.target, "j");
  EXPECT_FALSE(c.follow);
  EXPECT_FALSE(c.rank.has_value());
  EXPECT_FALSE(c.slot.has_value());
  c = Ok("logs -f j --rank 3 --tail_bytes=100");
  EXPECT_TRUE(c.follow);
  EXPECT_EQ(c.rank, 3);
  EXPECT_EQ(c.tail_bytes, 100);
  c = Ok("logs j --follow --slot node-1.example/2");
  EXPECT_TRUE(c.follow);
  ASSERT_TRUE(c.slot.has_value());
  EXPECT_EQ(c.slot->first, "node-1.example");
  EXPECT_EQ(c.slot->second, 2);
  c = Ok("nodes -o wide --coordinator h:1");
  EXPECT_EQ(c.command, Command::kNodes);
  EXPECT_EQ(c.output, OutputFormat::kWide);
  EXPECT_EQ(c.connection.coordinator, "h:1");
  c = Ok("submit job.yaml --extend --set steps=20");
  EXPECT_TRUE(c.extend);
  EXPECT_FALSE(Ok("submit job.yaml").extend);
}

TEST(CommandLineTest, BadUsageExitsTwoNamingTheProblem) {
  struct Case {
    const char* line;
    const char* want;
  };
  const Case cases[] = {
      {"", "A subcommand is required"},
      {"frob", "unknown command \"frob\""},
      {"status", "JOB is required"},
      {"status a b", "not expected: b"},
      {"list --bogus", "--bogus"},
      {"list --set a=1", "--set"},
      {"submit job.yaml --set", "--set"},
      {"submit", "give the job spec (ringctl submit JOB.yaml) or the program to run after --"},
      {"submit --", "nothing after --"},
      {"submit job.yaml -- python3 t.py", "give the job spec job.yaml or a program after --, not both"},
      {"checkpoint", "A subcommand is required"},
      {"checkpoint frob d", "frob"},
      {"delete", "JOB is required"},
      {"logs j --rank 1 --slot a/0", "excludes"},
      {"logs j --slot a", "--slot: expected NODE/SLOT"},
      {"logs j --slot a/x", "--slot: expected NODE/SLOT"},
      {"logs j --rank -1", "--rank"},
      {"nodes extra", "not expected: extra"},
      {"nodes -o table2", "-o"},
      // Issue 36 point 13: the unknown flag is named, not the spec after its value.
      {"local --nproc_per_node 2 spec.yaml", "unknown flag --nproc_per_node; ringctl local "
                                             "starts --workers N trainer processes"},
      {"local spec.yaml --nproc_per_node=2", "unknown flag --nproc_per_node"},
      {"submit job.yaml --workers 2", "unknown flag --workers"},
      {"estimate pipeline --stages 2 --microbatches 4", "unknown flag --microbatches"},
  };
  for (const Case& c : cases) {
    const ParsedCommandLine p = Parse(c.line);
    EXPECT_FALSE(p.line.has_value()) << c.line;
    EXPECT_EQ(p.exit_status, 2) << c.line;
    EXPECT_THAT(p.err, HasSubstr(c.want)) << c.line;
    EXPECT_THAT(p.err, HasSubstr("--help")) << c.line;
  }
}

}  // namespace
}  // namespace ringmaster::cli
