#include "state/training_state.h"

#include "absl/strings/str_cat.h"

namespace ringmaster::state {

std::string SamplerStateString(const SamplerState& state) {
  return absl::StrCat("epoch ", state.epoch, " cursor ", state.cursor);
}

}  // namespace ringmaster::state
