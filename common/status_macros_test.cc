#include "common/status_macros.h"

#include <fcntl.h>
#include <unistd.h>

#include "gtest/gtest.h"

namespace ringmaster {
namespace {

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd");
  return x / 2;
}

absl::StatusOr<int> Quarter(int x) {
  RM_ASSIGN_OR_RETURN(int half, Half(x));
  RM_ASSIGN_OR_RETURN(auto quarter, Half(half));
  return quarter;
}

absl::Status CheckEven(int x) {
  RM_RETURN_IF_ERROR(Half(x).status());
  return absl::OkStatus();
}

absl::Status OpenMissing() {
  RM_RETURN_IF_SYSCALL_ERROR(open("/nonexistent/ringmaster", O_RDONLY), "open /nonexistent");
  return absl::OkStatus();
}

TEST(StatusMacros, AssignOrReturnPropagatesErrors) {
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_EQ(Quarter(6).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Quarter(3).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(StatusMacros, ReturnIfError) {
  EXPECT_TRUE(CheckEven(4).ok());
  EXPECT_EQ(CheckEven(5).code(), absl::StatusCode::kInvalidArgument);
}

TEST(StatusMacros, SyscallErrorNamesTheCallAndErrno) {
  absl::Status s = OpenMissing();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("open /nonexistent"), std::string::npos) << s;
  EXPECT_NE(s.message().find("errno 2"), std::string::npos) << s;
}

TEST(StatusMacros, ErrnoMapping) {
  EXPECT_EQ(ErrnoToStatus(ECONNREFUSED, "x").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ErrnoToStatus(ECONNRESET, "x").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ErrnoToStatus(ETIMEDOUT, "x").code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(ErrnoToStatus(ENOSPC, "x").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoToStatus(EIO, "x").code(), absl::StatusCode::kInternal);
}

TEST(StatusMacros, PermanentIsAMarkThatKeepsCodeAndMessage) {
  const absl::Status plain = absl::FailedPreconditionError("the checkpoint is another job's");
  EXPECT_FALSE(IsPermanent(plain));
  const absl::Status marked = MarkPermanent(plain);
  EXPECT_TRUE(IsPermanent(marked));
  EXPECT_EQ(marked.code(), plain.code());
  EXPECT_EQ(marked.message(), plain.message());
  EXPECT_TRUE(MarkPermanent(absl::OkStatus()).ok());
  EXPECT_FALSE(IsPermanent(MarkPermanent(absl::OkStatus())));
  // Passed on unchanged through the macros; gone from a status rebuilt from code and message.
  auto pass = [&]() -> absl::Status {
    RM_RETURN_IF_ERROR(marked);
    return absl::OkStatus();
  };
  EXPECT_TRUE(IsPermanent(pass()));
  EXPECT_FALSE(IsPermanent(absl::Status(marked.code(), marked.message())));
}

TEST(StatusMacros, NodeLocalIsAMarkApartFromPermanent) {
  const absl::Status plain = absl::NotFoundError("open /data/x: No such file or directory");
  EXPECT_FALSE(IsNodeLocal(plain));
  const absl::Status marked = MarkNodeLocal(plain);
  EXPECT_TRUE(IsNodeLocal(marked));
  EXPECT_FALSE(IsPermanent(marked));
  EXPECT_EQ(marked.code(), plain.code());
  EXPECT_EQ(marked.message(), plain.message());
  EXPECT_FALSE(IsNodeLocal(MarkPermanent(plain)));
  EXPECT_TRUE(MarkNodeLocal(absl::OkStatus()).ok());
}

}  // namespace
}  // namespace ringmaster
