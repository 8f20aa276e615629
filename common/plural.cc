#include "common/plural.h"

#include "absl/strings/str_cat.h"

namespace ringmaster {

std::string PluralNoun(int64_t n, absl::string_view one, absl::string_view many) {
  if (n == 1) return std::string(one);
  return many.empty() ? absl::StrCat(one, "s") : std::string(many);
}

std::string Plural(int64_t n, absl::string_view one, absl::string_view many) {
  return absl::StrCat(n, " ", PluralNoun(n, one, many));
}

}  // namespace ringmaster
