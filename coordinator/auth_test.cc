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

TEST(Auth, KnownVector) {
  // Computed independently with Python:
  //   hmac.new(b"k", b"j\nn\n3", hashlib.sha256).hexdigest()
  EXPECT_EQ(MembershipToken("k", "j", "n", 3),
            "ae841ebc595a5bc7181eafa6d83d328a413daec3e520bf375f975124fd0b2b3a");
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
