#include "cli/config.h"

#include <sys/stat.h>

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster::cli {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(getenv("TEST_TMPDIR"), "/",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    mkdir(dir_.c_str(), 0755);
  }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = absl::StrCat(dir_, "/", name);
    EXPECT_TRUE(WriteFileAtomically(path, text, {.mode = 0600}).ok());
    return path;
  }
  std::string dir_;
};

TEST_F(ConfigTest, DefaultsWithoutFlagsEnvironmentOrFile) {
  auto s = ResolveConnection({}, {{"HOME", dir_}});  // no ~/.config/ringmaster/config.yaml
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->coordinator.value, "127.0.0.1:7070");
  EXPECT_EQ(s->coordinator.source, "default");
  EXPECT_EQ(s->token_file.value, "");
  EXPECT_EQ(s->tls_ca.value, "");
}

TEST_F(ConfigTest, FlagBeatsEnvironmentBeatsConfigFilePerSetting) {
  const std::string config = Write("config.yaml",
                                   "coordinator: file-host:7070\n"
                                   "token_file: /file/user.token\n"
                                   "tls_ca: /file/ca.pem\n"
                                   "tls_client_cert: /file/client.pem\n");
  const Environment env = {{"RINGMASTER_CONFIG", config},
                           {"RINGMASTER_ADDRESS", "env-host:7070"},
                           {"RINGMASTER_TOKEN_FILE", "/env/user.token"}};
  ConnectionFlags flags;
  flags.coordinator = "flag-host:7070";
  auto s = ResolveConnection(flags, env);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->coordinator.value, "flag-host:7070");
  EXPECT_EQ(s->coordinator.source, "--coordinator");
  EXPECT_EQ(s->token_file.value, "/env/user.token");
  EXPECT_EQ(s->token_file.source, "$RINGMASTER_TOKEN_FILE");
  EXPECT_EQ(s->tls_ca.value, "/file/ca.pem");
  EXPECT_EQ(s->tls_ca.source, config + ": tls_ca");
  EXPECT_EQ(s->tls_client_cert.value, "/file/client.pem");
  EXPECT_EQ(s->tls_client_key.value, "");

  // Without the flag the environment wins; without both, the file.
  s = ResolveConnection({}, env);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->coordinator.value, "env-host:7070");
  s = ResolveConnection({}, {{"RINGMASTER_CONFIG", config}});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->coordinator.value, "file-host:7070");
  EXPECT_EQ(s->token_file.value, "/file/user.token");
}

TEST_F(ConfigTest, ConfigFlagBeatsTheVariableAndTheDefaultFile) {
  const std::string named = Write("named.yaml", "coordinator: named:1\n");
  const std::string other = Write("other.yaml", "coordinator: other:1\n");
  mkdir((dir_ + "/.config").c_str(), 0755);
  mkdir((dir_ + "/.config/ringmaster").c_str(), 0755);
  Write(".config/ringmaster/config.yaml", "coordinator: home:1\n");
  ConnectionFlags flags;
  flags.config = named;
  auto s = ResolveConnection(flags, {{"RINGMASTER_CONFIG", other}, {"HOME", dir_}});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->coordinator.value, "named:1");
  s = ResolveConnection({}, {{"RINGMASTER_CONFIG", other}, {"HOME", dir_}});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->coordinator.value, "other:1");
  s = ResolveConnection({}, {{"HOME", dir_}});  // ~/.config/ringmaster/config.yaml
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->coordinator.value, "home:1");
  // $XDG_CONFIG_HOME replaces ~/.config.
  s = ResolveConnection({}, {{"HOME", dir_}, {"XDG_CONFIG_HOME", dir_ + "/nowhere"}});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->coordinator.value, "127.0.0.1:7070");
}

TEST_F(ConfigTest, RelativePathsInTheFileAreRelativeToIt) {
  const std::string config = Write("config.yaml", "token_file: user.token\ntls_ca: /abs/ca.pem\n");
  auto s = ResolveConnection({}, {{"RINGMASTER_CONFIG", config}});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->token_file.value, dir_ + "/user.token");
  EXPECT_EQ(s->tls_ca.value, "/abs/ca.pem");
}

TEST_F(ConfigTest, BadConfigFilesNameTheFileAndTheKey) {
  struct Case {
    std::string text;
    std::string want;
  };
  const Case cases[] = {
      {"coordinator: a:1\ntokn_file: x\n", ":2:1: unknown key \"tokn_file\""},
      {"coordinator: [a, b]\n", ":1:14: coordinator: expected a string"},
      {"coordinator: a:1\ncoordinator: b:1\n", ":2:1: coordinator: given twice"},
      {"- coordinator\n", ":1:1: expected a mapping of the keys coordinator, token_file"},
      {"coordinator: {a: [\n", "not valid YAML"},
  };
  for (const Case& c : cases) {
    const std::string path = Write("bad.yaml", c.text);
    auto s = ResolveConnection({}, {{"RINGMASTER_CONFIG", path}});
    ASSERT_FALSE(s.ok()) << c.text;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.status().message(), AllOf(HasSubstr(path), HasSubstr(c.want))) << c.text;
  }
  auto s = ResolveConnection({}, {{"RINGMASTER_CONFIG", dir_ + "/missing.yaml"}});
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(),
              AllOf(HasSubstr("$RINGMASTER_CONFIG"), HasSubstr("missing.yaml")));
  // An empty file is fine.
  EXPECT_TRUE(ResolveConnection({}, {{"RINGMASTER_CONFIG", Write("empty.yaml", "")}}).ok());
}

TEST_F(ConfigTest, ClientOptionsReadTheFilesAndNameWhereTheyCameFrom) {
  const std::string token = Write("user.token", "  s3cret-token-value\n");
  const std::string ca = Write("ca.pem", "-----BEGIN CERTIFICATE-----\n");
  ConnectionSettings settings;
  settings.coordinator = {"h:1", "--coordinator"};
  settings.token_file = {token, "--token_file"};
  settings.tls_ca = {ca, "$RINGMASTER_TLS_CA"};
  auto o = ClientOptions(settings);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->address, "h:1");
  EXPECT_EQ(o->token, "s3cret-token-value");
  EXPECT_EQ(o->tls_ca, "-----BEGIN CERTIFICATE-----\n");

  settings.tls_ca = {dir_ + "/absent.pem", "/etc/config.yaml: tls_ca"};
  o = ClientOptions(settings);
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(o.status().message(),
              AllOf(HasSubstr("/etc/config.yaml: tls_ca"), HasSubstr("absent.pem")));

  // A token every user may read is refused, saying how to fix it (issue 17, point 5).
  settings.tls_ca = {};
  ASSERT_EQ(chmod(token.c_str(), 0644), 0);
  o = ClientOptions(settings);
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(o.status().message(), AllOf(HasSubstr("--token_file"), HasSubstr("chmod 600")));

  settings.token_file = {Write("blank.token", "\n"), "$RINGMASTER_TOKEN_FILE"};
  o = ClientOptions(settings);
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(o.status().message(),
              AllOf(HasSubstr("$RINGMASTER_TOKEN_FILE"), HasSubstr("empty")));
}

}  // namespace
}  // namespace ringmaster::cli
