#include "common/env.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/fault_injection_env.h"
#include "gtest/gtest.h"

namespace ringmaster {
namespace {

std::string FreshDir(const std::string& name) {
  std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
  EXPECT_TRUE(DeleteRecursively(Env::Default(), dir).ok());
  EXPECT_TRUE(Env::Default()->CreateDir(dir).ok());
  return dir;
}

std::vector<std::string> Sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return v;
}

TEST(Env, WritesAtOffsetsAndReadsBack) {
  Env* env = Env::Default();
  std::string path = JoinPath(FreshDir("rw"), "f");
  auto file = env->NewWritableFile(path, FileOptions());
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE((*file)->PWrite(3, "def").ok());
  ASSERT_TRUE((*file)->PWrite(0, "abc").ok());
  ASSERT_TRUE((*file)->StartWriteback(0, 6).ok());
  ASSERT_TRUE((*file)->Sync().ok());
  ASSERT_TRUE((*file)->Close().ok());
  EXPECT_EQ(*ReadFileToString(env, path), "abcdef");

  auto in = env->NewRandomAccessFile(path);
  ASSERT_TRUE(in.ok());
  EXPECT_EQ(*(*in)->Size(), 6u);
  char buf[8];
  auto n = (*in)->PRead(4, 8, buf);  // short at the end of the file
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(std::string(buf, *n), "ef");
}

// Direct I/O takes the aligned writes; the rest (an unaligned tail, offset or address) goes
// through the page cache; the file holds exactly what was written, in both directories
// (tmpfs has no O_DIRECT: everything through the page cache there).
TEST(Env, DirectWritesMixWithUnalignedOnes) {
  Env* env = Env::Default();
  std::vector<std::string> dirs = {FreshDir("direct")};
  if (Env::Default()->IsDirectory("/dev/shm").ok()) {
    std::string shm = JoinPath("/dev/shm", absl::StrCat("ringmaster-env-test-", getpid()));
    ASSERT_TRUE(DeleteRecursively(env, shm).ok());
    ASSERT_TRUE(env->CreateDir(shm).ok());
    dirs.push_back(shm);
  }
  for (const std::string& dir : dirs) {
    SCOPED_TRACE(dir);
    const size_t kBytes = 3 * 4096 + 100;
    std::unique_ptr<char, decltype(&std::free)> buffer(
        static_cast<char*>(std::aligned_alloc(4096, 4 * 4096)), &std::free);
    for (size_t i = 0; i < 4 * 4096; ++i) buffer.get()[i] = static_cast<char>(i * 7 + i / 251);
    const std::string path = JoinPath(dir, "f");
    FileOptions options;
    options.direct_io = true;
    auto file = env->NewWritableFile(path, options);
    ASSERT_TRUE(file.ok()) << file.status();
    const absl::string_view all(buffer.get(), kBytes);
    ASSERT_TRUE((*file)->PWrite(0, all.substr(0, 8192)).ok());        // aligned: direct
    ASSERT_TRUE((*file)->PWrite(12288, all.substr(12288)).ok());      // the tail
    ASSERT_TRUE((*file)->PWrite(8192, all.substr(8192, 10)).ok());    // short
    ASSERT_TRUE((*file)->PWrite(8202, all.substr(8202, 4086)).ok());  // odd offset
    ASSERT_TRUE((*file)->Sync().ok());
    ASSERT_TRUE((*file)->Close().ok());
    EXPECT_EQ(*ReadFileToString(env, path), std::string(all));
    // Rewriting a prefix directly after a buffered write of it reads back the new bytes.
    auto again = env->NewWritableFile(path, options);
    ASSERT_TRUE(again.ok());
    ASSERT_TRUE((*again)->PWrite(0, all.substr(1, 4096)).ok());  // unaligned address
    ASSERT_TRUE((*again)->PWrite(0, all.substr(4096, 4096)).ok());
    ASSERT_TRUE((*again)->Close().ok());
    EXPECT_EQ(*ReadFileToString(env, path), std::string(all.substr(4096, 4096)));
  }
  if (dirs.size() > 1) {
    EXPECT_TRUE(DeleteRecursively(env, dirs[1]).ok());
  }
}

TEST(Env, ErrorsCarryTheCodeAndThePath) {
  Env* env = Env::Default();
  std::string dir = FreshDir("errors");
  absl::Status s = env->NewRandomAccessFile(JoinPath(dir, "missing")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("missing"), std::string::npos) << s;
  EXPECT_EQ(env->FileExists(JoinPath(dir, "missing")).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(WriteFileDurably(env, JoinPath(dir, "file"), "x").ok());
  EXPECT_EQ(env->IsDirectory(JoinPath(dir, "file")).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(env->IsDirectory(dir).ok());
  EXPECT_TRUE(env->CreateDir(dir).ok());  // exists already: fine
  EXPECT_FALSE(env->CreateDir(JoinPath(dir, "file")).ok());
  EXPECT_EQ(env->DeleteDir(JoinPath(dir, "nope")).code(), absl::StatusCode::kNotFound);
}

TEST(Env, ReplaceFileDurablyReplacesWhole) {
  Env* env = Env::Default();
  std::string dir = FreshDir("replace");
  std::string path = JoinPath(dir, "LATEST");
  ASSERT_TRUE(ReplaceFileDurably(env, path, JoinPath(dir, "tmp-LATEST"), "one").ok());
  ASSERT_TRUE(ReplaceFileDurably(env, path, JoinPath(dir, "tmp-LATEST"), "two").ok());
  EXPECT_EQ(*ReadFileToString(env, path), "two");
  EXPECT_EQ(Sorted(*env->GetChildren(dir)), std::vector<std::string>{"LATEST"});
}

TEST(Env, ReplaceFileDurablyKeepsTheOldFileWhenTheRenameFails) {
  std::string dir = FreshDir("replace-fails");
  std::string path = JoinPath(dir, "LATEST");
  ASSERT_TRUE(ReplaceFileDurably(Env::Default(), path, JoinPath(dir, "t"), "old").ok());
  FaultInjectionEnv env(Env::Default(), [](const FileOp& op) {
    return op.kind == FileOp::Kind::kRename ? absl::InternalError("injected") : absl::OkStatus();
  });
  EXPECT_EQ(ReplaceFileDurably(&env, path, JoinPath(dir, "t"), "new").code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(*ReadFileToString(&env, path), "old");
  EXPECT_EQ(Sorted(*env.GetChildren(dir)), std::vector<std::string>{"LATEST"});
}

TEST(Env, DeleteRecursivelyRemovesATree) {
  Env* env = Env::Default();
  std::string dir = FreshDir("tree");
  ASSERT_TRUE(env->CreateDir(JoinPath(dir, "a")).ok());
  ASSERT_TRUE(env->CreateDir(JoinPath(dir, "a/b")).ok());
  ASSERT_TRUE(WriteFileDurably(env, JoinPath(dir, "a/b/f"), "x").ok());
  ASSERT_TRUE(WriteFileDurably(env, JoinPath(dir, "a/g"), "y").ok());
  ASSERT_TRUE(DeleteRecursively(env, JoinPath(dir, "a")).ok());
  EXPECT_EQ(env->FileExists(JoinPath(dir, "a")).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(DeleteRecursively(env, JoinPath(dir, "a")).ok());  // absent: fine
}

TEST(FaultInjectionEnv, SeesEveryOperationInOrder) {
  std::string dir = FreshDir("hooked");
  std::vector<std::string> seen;
  FaultInjectionEnv env(Env::Default(), [&](const FileOp& op) {
    seen.push_back(absl::StrCat(op.index, ":", FileOpKindName(op.kind)));
    return absl::OkStatus();
  });
  ASSERT_TRUE(WriteFileDurably(&env, JoinPath(dir, "f"), "abc").ok());
  EXPECT_EQ(seen, (std::vector<std::string>{"0:open-write", "1:pwrite", "2:sync", "3:close"}));
  EXPECT_EQ(env.operations(), 4);
  EXPECT_EQ(env.bytes_written(), 3u);
}

TEST(FaultInjectionEnv, DiskFullIsResourceExhaustedAtTheBudget) {
  std::string dir = FreshDir("full");
  FaultInjectionEnv env(Env::Default(), DiskFullAfter(5));
  auto file = env.NewWritableFile(JoinPath(dir, "f"), FileOptions());
  ASSERT_TRUE(file.ok());
  EXPECT_TRUE((*file)->PWrite(0, "abc").ok());
  EXPECT_TRUE((*file)->PWrite(3, "de").ok());
  absl::Status s = (*file)->PWrite(5, "f");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("offset 5"), std::string::npos) << s;
  EXPECT_EQ(env.bytes_written(), 5u);
}

}  // namespace
}  // namespace ringmaster
