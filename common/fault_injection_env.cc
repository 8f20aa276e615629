#include "common/fault_injection_env.h"

#include <cerrno>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ringmaster {
namespace {

using Kind = FileOp::Kind;

FileOp Op(Kind kind, const std::string& path, uint64_t offset = 0, uint64_t size = 0) {
  FileOp op;
  op.kind = kind;
  op.path = path;
  op.offset = offset;
  op.size = size;
  return op;
}

class HookedWritableFile final : public WritableFile {
 public:
  HookedWritableFile(FaultInjectionEnv* env, std::unique_ptr<WritableFile> file)
      : env_(env), file_(std::move(file)) {}

  absl::Status PWrite(uint64_t offset, absl::string_view data) override {
    RM_RETURN_IF_ERROR(env_->Check(Op(Kind::kPWrite, path(), offset, data.size())));
    env_->CountWritten(data.size());
    return file_->PWrite(offset, data);
  }
  absl::Status StartWriteback(uint64_t offset, uint64_t length) override {
    RM_RETURN_IF_ERROR(env_->Check(Op(Kind::kStartWriteback, path(), offset, length)));
    return file_->StartWriteback(offset, length);
  }
  absl::Status Sync() override {
    RM_RETURN_IF_ERROR(env_->Check(Op(Kind::kSync, path())));
    return file_->Sync();
  }
  absl::Status Close() override {
    RM_RETURN_IF_ERROR(env_->Check(Op(Kind::kClose, path())));
    return file_->Close();
  }
  const std::string& path() const override { return file_->path(); }

 private:
  FaultInjectionEnv* const env_;
  std::unique_ptr<WritableFile> file_;
};

class HookedRandomAccessFile final : public RandomAccessFile {
 public:
  HookedRandomAccessFile(FaultInjectionEnv* env, std::unique_ptr<RandomAccessFile> file)
      : env_(env), file_(std::move(file)) {}

  absl::StatusOr<size_t> PRead(uint64_t offset, size_t n, char* scratch) const override {
    RM_RETURN_IF_ERROR(env_->Check(Op(Kind::kPRead, path(), offset, n)));
    return file_->PRead(offset, n, scratch);
  }
  absl::StatusOr<uint64_t> Size() const override { return file_->Size(); }
  const std::string& path() const override { return file_->path(); }

 private:
  FaultInjectionEnv* const env_;
  std::unique_ptr<RandomAccessFile> file_;
};

}  // namespace

const char* FileOpKindName(FileOp::Kind kind) {
  switch (kind) {
    case Kind::kOpenWrite:
      return "open-write";
    case Kind::kOpenRead:
      return "open-read";
    case Kind::kPWrite:
      return "pwrite";
    case Kind::kStartWriteback:
      return "start-writeback";
    case Kind::kSync:
      return "sync";
    case Kind::kClose:
      return "close";
    case Kind::kPRead:
      return "pread";
    case Kind::kCreateDir:
      return "mkdir";
    case Kind::kDeleteFile:
      return "unlink";
    case Kind::kDeleteDir:
      return "rmdir";
    case Kind::kRename:
      return "rename";
    case Kind::kSyncDir:
      return "sync-dir";
    case Kind::kGetChildren:
      return "list";
    case Kind::kExists:
      return "stat";
  }
  return "?";
}

FaultInjectionEnv::FaultInjectionEnv(Env* target, FileOpHook hook)
    : EnvWrapper(target), hook_(std::move(hook)) {}

absl::Status FaultInjectionEnv::Check(FileOp op) {
  op.index = next_index_++;
  return hook_ ? hook_(op) : absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<WritableFile>> FaultInjectionEnv::NewWritableFile(
    const std::string& path, const FileOptions& options) {
  RM_RETURN_IF_ERROR(Check(Op(Kind::kOpenWrite, path)));
  RM_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file,
                      target()->NewWritableFile(path, options));
  return std::make_unique<HookedWritableFile>(this, std::move(file));
}

absl::StatusOr<std::unique_ptr<RandomAccessFile>> FaultInjectionEnv::NewRandomAccessFile(
    const std::string& path) {
  RM_RETURN_IF_ERROR(Check(Op(Kind::kOpenRead, path)));
  RM_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, target()->NewRandomAccessFile(path));
  return std::make_unique<HookedRandomAccessFile>(this, std::move(file));
}

absl::Status FaultInjectionEnv::CreateDir(const std::string& path) {
  return Guarded(Op(Kind::kCreateDir, path), [&] { return target()->CreateDir(path); });
}

absl::Status FaultInjectionEnv::DeleteFile(const std::string& path) {
  return Guarded(Op(Kind::kDeleteFile, path), [&] { return target()->DeleteFile(path); });
}

absl::Status FaultInjectionEnv::DeleteDir(const std::string& path) {
  return Guarded(Op(Kind::kDeleteDir, path), [&] { return target()->DeleteDir(path); });
}

absl::Status FaultInjectionEnv::RenameFile(const std::string& from, const std::string& to) {
  FileOp op = Op(Kind::kRename, from);
  op.to = to;
  return Guarded(std::move(op), [&] { return target()->RenameFile(from, to); });
}

absl::Status FaultInjectionEnv::SyncDir(const std::string& path) {
  return Guarded(Op(Kind::kSyncDir, path), [&] { return target()->SyncDir(path); });
}

absl::StatusOr<std::vector<std::string>> FaultInjectionEnv::GetChildren(const std::string& dir) {
  return Guarded(Op(Kind::kGetChildren, dir), [&] { return target()->GetChildren(dir); });
}

absl::Status FaultInjectionEnv::FileExists(const std::string& path) {
  return Guarded(Op(Kind::kExists, path), [&] { return target()->FileExists(path); });
}

absl::Status FaultInjectionEnv::IsDirectory(const std::string& path) {
  return Guarded(Op(Kind::kExists, path), [&] { return target()->IsDirectory(path); });
}

FileOpHook DiskFullAfter(uint64_t budget) {
  auto used = std::make_shared<std::atomic<uint64_t>>(0);
  return [used, budget](const FileOp& op) -> absl::Status {
    if (op.kind != Kind::kPWrite) return absl::OkStatus();
    uint64_t before = used->fetch_add(op.size);
    if (before + op.size <= budget) return absl::OkStatus();
    return ErrnoToStatus(ENOSPC, absl::StrCat("pwrite at offset ", op.offset, " of ", op.path));
  };
}

}  // namespace ringmaster
