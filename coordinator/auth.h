// Who may call what (issue 5, "Security"):
//   - JobService: the user token ("authorization: Bearer <token>");
//   - the agents' WorkerService calls (RegisterNode, Heartbeat, DrainNode, TrainerExited):
//     the node token;
//   - the trainers' calls (Join, Ready, Progress, ReportError, Finished, ReportCheckpoint,
//     Store*): a membership token, HMAC-SHA256(secret, job, node, slot), handed to the
//     trainer by its agent in the StartTrainer command. It lets a trainer act for its own
//     job and slot only; the epoch is checked by the state machine (a stale one is ABORTED).
// The secret is generated once and kept in the job database, so tokens survive a
// coordinator restart. User and node tokens are optional: without them the coordinator
// must listen on loopback only (ringmaster_main enforces it).
#ifndef RINGMASTER_COORDINATOR_AUTH_H_
#define RINGMASTER_COORDINATOR_AUTH_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ringmaster::coordinator {

// Hex HMAC-SHA256 of "job\nnode\nslot" under `secret`.
std::string MembershipToken(absl::string_view secret, absl::string_view job,
                            absl::string_view node, int slot);

// Checks an "authorization" metadata value against the expected token in constant time.
// `expected` empty means no token is configured: anything passes.
// UNAUTHENTICATED when the header is missing or not "Bearer ..."; PERMISSION_DENIED when
// the token is wrong. `what` names the token in the message ("user token", ...).
absl::Status CheckBearer(absl::string_view header, absl::string_view expected,
                         absl::string_view what);

// 32 random bytes from the OS, hex-encoded.
std::string NewSecret();

}  // namespace ringmaster::coordinator

#endif  // RINGMASTER_COORDINATOR_AUTH_H_
