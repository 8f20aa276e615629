#include "common/version.h"

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/internal/parse.h"
#include "absl/flags/internal/usage.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

// From common/build_stamp.cc, the linkstamp.
extern const char kRingmasterBuildRevision[];
extern const char kRingmasterBuildStatus[];
extern const long long kRingmasterBuildTimestamp;

namespace ringmaster {

const char kVersion[] = "0.1.0";

std::string VersionLine(absl::string_view program) {
  // An unstamped build has the redacted values: revision "0", status "redacted".
  const std::string revision = kRingmasterBuildRevision;
  const std::string status = kRingmasterBuildStatus;
  const bool stamped = !revision.empty() && revision != "0" && status != "redacted";
  std::string build = stamped ? revision : "unknown";
  if (stamped && status == "modified") absl::StrAppend(&build, "-modified");
  if (kRingmasterBuildTimestamp > 0) {
    absl::StrAppend(&build, ", ",
                    absl::FormatTime("%Y-%m-%d", absl::FromUnixSeconds(kRingmasterBuildTimestamp),
                                     absl::UTCTimeZone()));
  }
  return absl::StrCat(program, " ", kVersion, " (build ", build, ")");
}

std::vector<char*> ParseFlagsWithUsage(int argc, char** argv, absl::string_view program) {
  absl::FlagsUsageConfig config;
  config.version_string = [name = std::string(program)] { return VersionLine(name) + "\n"; };
  // --help lists the program's own flags wherever they are defined (Abseil's default looks
  // for a file named after the program, which ringtrainer's trainer_main.cc is not), and
  // leaves Abseil's own (--flagfile, ...) to --helpfull.
  config.contains_help_flags = [](absl::string_view file) {
    return !absl::StrContains(file, "absl/");
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  absl::SetFlagsUsageConfig(config);
  // -h is no Abseil flag: it means --help. Nothing after "--" is a flag.
  static char help[] = "--help";
  std::vector<char*> args(argv, argv + argc);
  for (size_t i = 1; i < args.size() && strcmp(args[i], "--") != 0; ++i) {
    if (strcmp(args[i], "-h") == 0) args[i] = help;
  }
  std::vector<char*> positional = absl::flags_internal::ParseCommandLineImpl(
      static_cast<int>(args.size()), args.data(),
      absl::flags_internal::ArgvListAction::kRemoveParsedArgs,
      absl::flags_internal::UsageFlagsAction::kIgnoreUsage,
      absl::flags_internal::OnUndefinedFlag::kAbortIfUndefined);
  // Abseil's own handling exits 1 after the help (0 after --version): asked-for help is
  // no failure.
  if (absl::flags_internal::HandleUsageFlags(std::cout, absl::ProgramUsageMessage()) != -1) {
    std::cout.flush();
    std::exit(0);
  }
  return positional;
}

}  // namespace ringmaster
