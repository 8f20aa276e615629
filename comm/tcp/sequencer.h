// Sequencer: runs operations that share a resource in the order they were issued, and
// operations on disjoint resources concurrently.
//
// The TCP backend's groups share their parent's links (one per peer): two operations that
// use the same link must put their messages on it in the same order on both ranks, so each
// takes a turn on every resource it may use when it is issued (Issue, under one lock, so
// turns never cross), waits for those turns when it runs (AwaitTurn) and gives them back
// when done (Release). An operation waits only for operations issued before it, so a
// thread running queued operations in issue order never waits for a later one.
//
// Thread-safety: every method may be called from any thread.
#ifndef RINGMASTER_COMM_TCP_SEQUENCER_H_
#define RINGMASTER_COMM_TCP_SEQUENCER_H_

#include <cstdint>
#include <deque>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace ringmaster::comm::tcp {

class Sequencer {
 public:
  // One operation's turns: (resource, turn) pairs.
  struct Ticket {
    absl::InlinedVector<std::pair<int, uint64_t>, 8> turns;
  };

  explicit Sequencer(int resources = 0);

  // Adds a resource and returns its id (ids count up from 0).
  int AddResource();

  // Takes the next turn on each of `resources` (valid, distinct ids).
  Ticket Issue(absl::Span<const int> resources);

  // Blocks until every ticket issued earlier on the same resources has been released.
  // DEADLINE_EXCEEDED when `deadline` passes first; after Stop(why), returns `why` at once.
  absl::Status AwaitTurn(const Ticket& ticket, absl::Time deadline);

  // Gives the ticket's turns back; call once per ticket, whether or not its turn came
  // (a ticket released early still counts as taken until every earlier one is released).
  void Release(const Ticket& ticket);

  // Makes AwaitTurn return `why` (not OK) from now on, waking the waiters. The first
  // status stays.
  void Stop(absl::Status why);

 private:
  struct Resource {
    uint64_t next = 0;     // the turn the next Issue gets
    uint64_t serving = 0;  // every turn before this one is released
    absl::btree_set<uint64_t> released;  // released turns after `serving`
  };
  bool MyTurn(const Ticket& ticket) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::deque<Resource> resources_ ABSL_GUARDED_BY(mu_);  // deque: AddResource keeps refs
  absl::Status stopped_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ringmaster::comm::tcp

#endif  // RINGMASTER_COMM_TCP_SEQUENCER_H_
