// The project's version, and the manners every binary's command line shares.
//
//   ringmaster --version   ->  ringmaster 0.1.0 (build 8a6249347c58, 2026-11-25)
//
// The build (git commit and date) comes from Bazel's stamping: a plain `bazel build` is not
// stamped (the line says "build unknown", and nothing is rebuilt when the commit changes);
// `bazel build --config=stamp` stamps (tools/workspace_status.sh supplies the commit).
//
// Thread-safety: VersionLine may be called from any thread; ParseFlagsWithUsage from main
// only, before any other thread starts.
#ifndef RINGMASTER_COMMON_VERSION_H_
#define RINGMASTER_COMMON_VERSION_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace ringmaster {

// The release version, "MAJOR.MINOR.PATCH".
extern const char kVersion[];

// "<program> <version> (build <commit or unknown>[, <YYYY-MM-DD>])": the commit carries
// "-modified" when the working tree had uncommitted changes; the date is the build's (UTC),
// known only in a stamped build.
std::string VersionLine(absl::string_view program);

// absl::ParseCommandLine with a command line's manners, for the binaries whose flags are
// Abseil flags (ringmaster, ringworker, ringtrainer, ringbench):
//   --help, -h, --helpfull, --helpshort, --helppackage, --help=SUBSTRING
//       print the usage (Abseil's text for those flags) on stdout and exit 0;
//   --version
//       prints VersionLine(program) on stdout and exits 0.
// Bad usage (an unknown flag, a flag without its value, a value the flag cannot take) prints
// "<program>: <what is wrong, naming the flag>" and a pointer to --help on stderr and exits 2.
// Anything else is absl::ParseCommandLine's. Returns the positional arguments, argv[0] first.
std::vector<char*> ParseFlagsWithUsage(int argc, char** argv, absl::string_view program);

}  // namespace ringmaster

#endif  // RINGMASTER_COMMON_VERSION_H_
