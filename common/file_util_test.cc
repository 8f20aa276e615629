#include "common/file_util.h"

#include <dirent.h>
#include <sys/stat.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ringmaster {
namespace {

std::string TmpPath(const std::string& name) {
  return absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
}

TEST(WriteFileAtomically, WritesAndReplaces) {
  std::string path = TmpPath("a.txt");
  ASSERT_TRUE(WriteFileAtomically(path, "first").ok());
  EXPECT_EQ(*ReadFile(path), "first");
  ASSERT_TRUE(WriteFileAtomically(path, std::string("sec\0nd", 6), {.durable = false}).ok());
  EXPECT_EQ(*ReadFile(path), std::string("sec\0nd", 6));
}

TEST(WriteFileAtomically, FailureNamesThePathAndLeavesNoTemporary) {
  absl::Status s = WriteFileAtomically("/proc/nonexistent/dir/x", "data");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("/proc/nonexistent/dir/x"), std::string::npos) << s;
  EXPECT_EQ(WriteFileAtomically("", "x").code(), absl::StatusCode::kInvalidArgument);
  // A directory where the file should go: rename fails, the temporary is removed.
  std::string dir = TmpPath("is-a-dir");
  ASSERT_EQ(system(absl::StrCat("mkdir -p ", dir, "/sub").c_str()), 0);
  EXPECT_FALSE(WriteFileAtomically(dir, "x").ok());
  DIR* d = opendir(std::getenv("TEST_TMPDIR"));
  ASSERT_NE(d, nullptr);
  while (dirent* e = readdir(d)) {
    EXPECT_EQ(std::string(e->d_name).find(".tmp."), std::string::npos) << e->d_name;
  }
  closedir(d);
}

TEST(ReadFile, MissingIsNotFound) {
  EXPECT_EQ(ReadFile(TmpPath("missing")).status().code(), absl::StatusCode::kNotFound);
}

// A token or key file: 0600 and 0640 (a Kubernetes secret's group) are read, a file any user
// may read is refused with the fix; the mode given to WriteFileAtomically is the file's from
// its creation.
TEST(ReadSecretFile, RefusesAFileOthersCanRead) {
  const std::string path = TmpPath("secret.token");
  ASSERT_TRUE(WriteFileAtomically(path, "s3cret", {.mode = 0600}).ok());
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
  EXPECT_EQ(*ReadSecretFile(path), "s3cret");
  ASSERT_EQ(chmod(path.c_str(), 0640), 0);
  EXPECT_TRUE(ReadSecretFile(path).ok());
  ASSERT_EQ(chmod(path.c_str(), 0644), 0);
  absl::StatusOr<std::string> read = ReadSecretFile(path);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(read.status().message().find("chmod 600 " + path), std::string::npos)
      << read.status();
  EXPECT_NE(read.status().message().find("0644"), std::string::npos) << read.status();
  EXPECT_EQ(ReadSecretFile(TmpPath("missing")).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace ringmaster
