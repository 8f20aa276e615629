#include "common/version.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/internal/parse.h"
#include "absl/flags/commandlineflag.h"
#include "absl/flags/internal/usage.h"
#include "absl/flags/reflection.h"
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

namespace {

// Abseil's own flags (usage, flag files), which its parse handles: not checked here.
bool IsAbseilFlag(absl::string_view name) {
  for (const char* own : {"help", "helpfull", "helpshort", "helppackage", "helpon", "helpmatch",
                          "version", "only_check_args", "flagfile", "fromenv", "tryfromenv"}) {
    if (name == own) return true;
  }
  return false;
}

// What Abseil's parse would refuse with exit status 1 (an unknown flag, a flag without its
// value, a value the flag cannot take), as a message naming the flag; nullopt when the line
// is sound. Abseil's parse sets the flags afterwards (a value parsed here is set twice, to the
// same). With --undefok on the line, unknown flags are Abseil's to judge: nothing is checked.
std::optional<std::string> FlagUsageError(const std::vector<char*>& args) {
  for (size_t i = 1; i < args.size(); ++i) {
    if (absl::StartsWith(args[i], "--undefok")) return std::nullopt;
  }
  for (size_t i = 1; i < args.size(); ++i) {
    absl::string_view arg = args[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') continue;  // a positional argument, or "-"
    arg.remove_prefix(arg[1] == '-' ? 2 : 1);
    absl::string_view name = arg, value;
    const size_t eq = arg.find('=');
    const bool has_value = eq != absl::string_view::npos;
    if (has_value) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    }
    if (IsAbseilFlag(name)) continue;
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && absl::StartsWith(name, "no")) {  // --noFLAG of a boolean FLAG
      absl::CommandLineFlag* negated = absl::FindCommandLineFlag(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>()) {
        if (has_value) return absl::StrCat("--", name, " takes no value, got \"", value, "\"");
        continue;
      }
    }
    if (flag == nullptr) return absl::StrCat("unknown flag --", name);
    if (flag->IsRetired()) continue;
    if (!has_value) {
      if (flag->IsOfType<bool>()) continue;
      if (i + 1 == args.size()) return absl::StrCat("--", name, " needs a value");
      value = args[++i];
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) return absl::StrCat("--", name, ": ", error);
  }
  return std::nullopt;
}

}  // namespace

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
  // Bad usage exits 2, naming the flag (Abseil's parse would exit 1).
  if (std::optional<std::string> error = FlagUsageError(args)) {
    fprintf(stderr, "%s: %s\nRun `%s --help` for the flags.\n", std::string(program).c_str(),
            error->c_str(), std::string(program).c_str());
    std::exit(2);
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
