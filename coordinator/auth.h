// Who may call what (issue 5, "Security"):
//   - JobService: the user token ("authorization: Bearer <token>");
//   - the agents' WorkerService calls (RegisterNode, Heartbeat, DrainNode, TrainerExited):
//     the node token, and a node credential bound to the node's name (NodeCredential),
//     given at registration and carried by every later call for that node: holding the node
//     token does not let one agent act for another node (heartbeat it, report or stop its
//     trainers, or register under its name while its lease lives);
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
#include "common/loopback.h"

namespace ringmaster::coordinator {

// The two kinds of credential derived from the secret have separate HMAC domains: the
// input's first line is the kind's name, so the inputs of the two kinds differ whatever the
// job and node names, and no token of one kind is valid as the other (before, a job named
// "node" on a node's slot 0 got that node's credential as its membership token).
inline constexpr absl::string_view kMembershipTokenDomain = "ringmaster membership token v2";
inline constexpr absl::string_view kNodeCredentialDomain = "ringmaster node credential v2";

// Hex HMAC-SHA256 of "<kMembershipTokenDomain>\njob\nnode\nslot" under `secret`.
std::string MembershipToken(absl::string_view secret, absl::string_view job,
                            absl::string_view node, int slot);

// Hex HMAC-SHA256 of "<kNodeCredentialDomain>\nNODE" under `secret`: the credential the
// coordinator gives a node's agent when it registers. The node token says "some node"; this
// says which one. Derived (not stored), so it survives a coordinator restart.
std::string NodeCredential(absl::string_view secret, absl::string_view node);

// Checks the credential a call for `node` carries: PERMISSION_DENIED (naming the node)
// when it is missing or wrong. Constant time.
absl::Status CheckNodeCredential(absl::string_view secret, absl::string_view node,
                                 absl::string_view credential);

// Checks an "authorization" metadata value against the expected token in constant time.
// `expected` empty means no token is configured: anything passes.
// UNAUTHENTICATED when the header is missing or not "Bearer ..."; PERMISSION_DENIED when
// the token is wrong. `what` names the token in the message ("user token", ...).
absl::Status CheckBearer(absl::string_view header, absl::string_view expected,
                         absl::string_view what);

// common/loopback.h: 127.0.0.0/8, ::1 and "localhost" (with a port), parsed as addresses.
using ::ringmaster::IsLoopbackAddress;

// 32 random bytes from the OS, hex-encoded.
std::string NewSecret();

// The shortest user or node token accepted: 16 characters (e.g. `openssl rand -hex 16` makes
// 32).
inline constexpr size_t kMinTokenLength = 16;

// The tokens a coordinator is configured with (empty: none): each at least kMinTokenLength
// characters, and the user and node tokens differ (else either could do the other's work).
// INVALID_ARGUMENT naming the flag and how to make a good token.
absl::Status CheckConfiguredTokens(absl::string_view user_token, absl::string_view node_token);

// Checks TLS material before a server uses it, so that a bad file is named instead of
// surfacing as "cannot listen": `cert` must hold a PEM certificate, `key` a PEM private key
// that belongs to it, `client_ca` (optional) PEM certificates; a certificate comes with its
// key, and a client CA with a certificate (all empty: plaintext). INVALID_ARGUMENT naming the
// flag (--tls_cert, --tls_key, --tls_client_ca) and what is wrong.
absl::Status CheckTlsMaterial(absl::string_view cert, absl::string_view key,
                              absl::string_view client_ca);

}  // namespace ringmaster::coordinator

#endif  // RINGMASTER_COORDINATOR_AUTH_H_
