// A count with its noun, in the noun's number: "1 worker", "2 workers", "0 jobs". For every
// count a person reads (progress lines, summaries, the dashboard), so that none says
// "1 workers".
//
// Thread-safety: pure functions.
#ifndef RINGMASTER_COMMON_PLURAL_H_
#define RINGMASTER_COMMON_PLURAL_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace ringmaster {

// `n` and `one` when n is 1, else `n` and `many`; `many` empty: `one` and an "s"
// ("worker" → "workers"). Plural(3, "recovery", "recoveries") → "3 recoveries".
std::string Plural(int64_t n, absl::string_view one, absl::string_view many = "");

// Only the noun: PluralNoun(1, "node") → "node", PluralNoun(2, "node") → "nodes".
std::string PluralNoun(int64_t n, absl::string_view one, absl::string_view many = "");

}  // namespace ringmaster

#endif  // RINGMASTER_COMMON_PLURAL_H_
