// The runner's side of in-process recovery (python/ringmaster/inprocess.py): a command job's
// program that said {"type":"hello","inprocess":true} keeps its process across membership
// epochs; the runner gives it each epoch's world on the program channel instead of stopping
// it and starting it again.
//
// How it fits the coordinator's epochs (coordinator/membership.h, LeaveToRejoin):
//   - A rank's program dies (kill -9, an exception). Its runner reports the error with
//     `rejoin`: the coordinator re-forms the job WITHOUT that slot at once (one restart of the
//     budget, as a whole-group restart costs), so the survivors go on among themselves at once
//     (a replacement's `import torch` alone takes over a second on a small machine).
//   - The survivors' runners see the new epoch, join it and send its world
//     ({"type":"world","epoch",...}); the programs, whose collectives raised when the peer
//     died (their process group's timeout bounds a frozen one), tear down their process group
//     and build the new one (Gloo or NCCL), rank 0's program hosting the store at the port its
//     runner picked, fresh for each epoch. They go on from the state they hold; where their
//     steps differ, the lowest rank holding the highest step sends its state to all.
//   - The dead rank's runner starts the program again (RINGMASTER_RESTART_REASON=failure);
//     the program imports what it needs, says hello and waits for a world. Then the runner
//     joins the job's current epoch, which grows the job by the slot (no budget spent); every
//     runner sends the grown epoch's world. The survivors switch at a step boundary they all
//     agree on (an all-reduce of the newest epoch each has received), and the newcomer gets
//     the state from the lowest surviving rank that holds the newest step.
//   - What is not an in-process program's failure goes as for any command job: a drain
//     (leave) or the job's end stops the program; a program that never said hello with
//     "inprocess" (or a world of one rank) is stopped and restarted with the whole group.
//
// Thread-safety: not synchronised; the runner's thread owns it.
#ifndef RINGMASTER_WORKER_INPROCESS_WORLD_H_
#define RINGMASTER_WORKER_INPROCESS_WORLD_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"
#include "worker/command_runner.h"
#include "worker/program_channel.h"

namespace ringmaster::worker {

// {"type":"world","epoch",rank,world_size,local_rank,local_world_size,group_rank,
//  group_world_size,master_addr,master_port,restart_count,reason}: what the program needs of
// the epoch's environment (torchrun's variables) to build its process group.
nlohmann::json WorldMessage(const CommandEnvInput& input);

// One program's in-process state, across the epochs its process lives through.
class InProcessWorld {
 public:
  // The epoch's world, sent now when the program has opted in (and is connected), else when
  // it says hello with "inprocess". FAILED_PRECONDITION or UNAVAILABLE: the channel's (the
  // program is gone, or not connected yet: its hello will bring the world).
  absl::Status SetWorld(const CommandEnvInput& input, ProgramChannel* channel);
  // A message from the program: a hello with "inprocess": true opts it in and is answered
  // with the current world; world_done records the epoch its process group was built for.
  void Take(const nlohmann::json& message, ProgramChannel* channel);

  // The program said hello with "inprocess": true (a new program's hello resets it).
  bool opted_in() const { return opted_in_; }
  // The epoch of the last world sent, and the last the program said it built (0: none).
  int64_t world_sent() const { return world_sent_; }
  int64_t world_done() const { return world_done_; }
  // Forgets the program (it exited) and its world: the next one must say hello again, and
  // gets the world of the epoch it is next given (SetWorld).
  void ProgramGone();

 private:
  absl::Status Send(ProgramChannel* channel);

  std::optional<nlohmann::json> world_;
  bool opted_in_ = false;
  int64_t world_sent_ = 0;
  int64_t world_done_ = 0;
};

}  // namespace ringmaster::worker

#endif  // RINGMASTER_WORKER_INPROCESS_WORLD_H_
