#include "common/file_util.h"

#include <dirent.h>

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

}  // namespace
}  // namespace ringmaster
