#include "comm/tcp/sequencer.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace ringmaster::comm::tcp {

Sequencer::Sequencer(int resources) : resources_(resources) {}

int Sequencer::AddResource() {
  absl::MutexLock lock(&mu_);
  resources_.emplace_back();
  return static_cast<int>(resources_.size()) - 1;
}

Sequencer::Ticket Sequencer::Issue(absl::Span<const int> resources) {
  Ticket ticket;
  absl::MutexLock lock(&mu_);
  for (int id : resources) ticket.turns.push_back({id, resources_[id].next++});
  return ticket;
}

bool Sequencer::MyTurn(const Ticket& ticket) const {
  if (!stopped_.ok()) return true;
  for (const auto& [id, turn] : ticket.turns) {
    if (resources_[id].serving != turn) return false;
  }
  return true;
}

absl::Status Sequencer::AwaitTurn(const Ticket& ticket, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto my_turn = [this, &ticket]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return MyTurn(ticket); };
  const bool turn = mu_.AwaitWithDeadline(absl::Condition(&my_turn), deadline);
  if (!stopped_.ok()) return stopped_;
  if (turn) return absl::OkStatus();
  std::string waiting;
  for (const auto& [id, t] : ticket.turns) {
    if (resources_[id].serving != t) {
      absl::StrAppend(&waiting, waiting.empty() ? "" : ", ", "resource ", id, " (",
                      t - resources_[id].serving, " earlier operations)");
    }
  }
  return absl::DeadlineExceededError(
      absl::StrCat("the deadline passed while waiting for earlier operations that share its "
                   "connections to finish: ",
                   waiting));
}

void Sequencer::Release(const Ticket& ticket) {
  absl::MutexLock lock(&mu_);
  for (const auto& [id, turn] : ticket.turns) {
    Resource& r = resources_[id];
    if (turn != r.serving) {
      r.released.insert(turn);
      continue;
    }
    ++r.serving;
    while (!r.released.empty() && *r.released.begin() == r.serving) {
      r.released.erase(r.released.begin());
      ++r.serving;
    }
  }
}

void Sequencer::Stop(absl::Status why) {
  absl::MutexLock lock(&mu_);
  if (stopped_.ok()) stopped_ = std::move(why);
}

}  // namespace ringmaster::comm::tcp
