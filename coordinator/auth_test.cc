#include "coordinator/auth.h"

#include "gtest/gtest.h"

namespace ringmaster::coordinator {
namespace {

TEST(Auth, MembershipTokenIsHmacSha256) {
  const std::string a = MembershipToken("secret", "job", "a", 0);
  EXPECT_EQ(a.size(), 64u);
  EXPECT_EQ(a, MembershipToken("secret", "job", "a", 0));
  EXPECT_NE(a, MembershipToken("secret", "job", "a", 1));
  EXPECT_NE(a, MembershipToken("secret", "job2", "a", 0));
  EXPECT_NE(a, MembershipToken("other", "job", "a", 0));
  // "job\na\n0" must not collide with a job named "job\na" on node "" etc.: the separator
  // cannot appear in ids (the state machine rejects it), so the encoding is unambiguous.
}

TEST(Auth, KnownVectors) {
  // Computed independently with Python:
  //   hmac.new(b"k", b"ringmaster membership token v2\nj\nn\n3", hashlib.sha256).hexdigest()
  EXPECT_EQ(MembershipToken("k", "j", "n", 3),
            "691a17c9c5e24e182cb4047f958078ece6eec5f1034b2d0970f9253a68ff0ea6");
  //   hmac.new(b"k", b"ringmaster node credential v2\nn", hashlib.sha256).hexdigest()
  EXPECT_EQ(NodeCredential("k", "n"),
            "30ae84dbeb0bd095621925bd10e4a7ecd4aab3a0ce2d5295ba27194a4bafdfbb");
}

// Issue 36 point 20: a job named "node" on slot 0 of node n once had n's credential as its
// membership token (both were HMAC("node\nn\n0")). Separate domains: no token of one kind
// passes as the other, for any job name.
TEST(Auth, NodeCredentialsAndMembershipTokensNeverCoincide) {
  for (const char* job : {"node", "Node", "n", ""}) {
    for (int slot : {0, 1}) {
      const std::string token = MembershipToken("secret", job, "n", slot);
      EXPECT_NE(token, NodeCredential("secret", "n")) << job << " slot " << slot;
      EXPECT_FALSE(CheckNodeCredential("secret", "n", token).ok()) << job << " slot " << slot;
    }
  }
  EXPECT_TRUE(CheckNodeCredential("secret", "n", NodeCredential("secret", "n")).ok());
  // Nor does a node's credential pass as a trainer's membership token.
  EXPECT_FALSE(CheckBearer("Bearer " + NodeCredential("secret", "n"),
                           MembershipToken("secret", "node", "n", 0), "membership token")
                   .ok());
}

TEST(Auth, CheckBearer) {
  EXPECT_TRUE(CheckBearer("", "", "user token").ok()) << "no token configured";
  EXPECT_EQ(CheckBearer("", "t0k", "user token").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(CheckBearer("Basic t0k", "t0k", "user token").code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(CheckBearer("Bearer t0x", "t0k", "user token").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(CheckBearer("Bearer t0", "t0k", "user token").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(CheckBearer("Bearer t0k", "t0k", "user token").ok());
  EXPECT_NE(CheckBearer("", "t0k", "node token").message().find("node token"), std::string::npos);
}

TEST(Auth, SecretsAreFreshAndLong) {
  const std::string a = NewSecret(), b = NewSecret();
  EXPECT_EQ(a.size(), 64u);
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace ringmaster::coordinator
