#include "worker/log_service.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/loopback.h"
#include "proto/coordinator.grpc.pb.h"
#include "spec/validate.h"

namespace ringmaster::worker {
namespace {

constexpr int kDefaultReadBytes = 64 << 10;
constexpr int kMaxReadBytes = 1 << 20;

grpc::Status Error(grpc::StatusCode code, const std::string& message) {
  return grpc::Status(code, message);
}

// Compares in time that depends on the lengths only.
bool SameToken(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// Closes a descriptor on scope exit.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

}  // namespace

bool LogService::IsJobId(const std::string& job) { return spec::IsValidJobName(job); }

class LogService::Service final : public AgentService::CallbackService {
 public:
  Service(LogService* owner, const LogServiceOptions& options)
      : owner_(owner), options_(options) {}

  grpc::ServerUnaryReactor* ReadLog(grpc::CallbackServerContext* ctx,
                                    const ReadLogRequest* request,
                                    ReadLogResponse* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    grpc::Status s = Authenticate(ctx);
    if (s.ok()) s = Read(*request, response);
    reactor->Finish(s);
    return reactor;
  }

 private:
  grpc::Status Authenticate(const grpc::CallbackServerContext* ctx) const {
    if (options_.node_token.empty()) return grpc::Status::OK;
    auto it = ctx->client_metadata().find("authorization");
    if (it == ctx->client_metadata().end()) {
      return Error(grpc::StatusCode::UNAUTHENTICATED, "the node token is missing");
    }
    const std::string header(it->second.data(), it->second.size());
    if (!absl::StartsWith(header, "Bearer ")) {
      return Error(grpc::StatusCode::UNAUTHENTICATED,
                   "authorization must be \"Bearer <node token>\"");
    }
    if (!SameToken(header.substr(7), options_.node_token)) {
      return Error(grpc::StatusCode::PERMISSION_DENIED, "wrong node token");
    }
    return grpc::Status::OK;
  }

  grpc::Status Read(const ReadLogRequest& r, ReadLogResponse* response) const {
    if (!IsJobId(r.job())) {
      return Error(grpc::StatusCode::INVALID_ARGUMENT,
                   absl::StrCat("job \"", r.job().substr(0, 200),
                                "\" is not a job id (letters, digits, '-', '_' and '.')"));
    }
    if (r.slot() < 0) {
      return Error(grpc::StatusCode::INVALID_ARGUMENT,
                   absl::StrCat("slot must be >= 0, got ", r.slot()));
    }
    if (r.max_bytes() < 0) {
      return Error(grpc::StatusCode::INVALID_ARGUMENT,
                   absl::StrCat("max_bytes must be >= 0, got ", r.max_bytes()));
    }
    const std::string name = absl::StrCat(r.job(), "/slot-", r.slot(), ".log");
    {
      absl::MutexLock lock(&owner_->mu_);
      auto it = owner_->served_.find({r.job(), r.slot()});
      if (it == owner_->served_.end()) {
        return Error(grpc::StatusCode::NOT_FOUND,
                     absl::StrCat("this agent ran no trainer of job ", r.job(), " on slot ",
                                  r.slot(), " (or the job was deleted)"));
      }
      response->set_running(it->second);
    }
    // Relative to the work directory, following no symbolic link on the way.
    Fd dir{open(options_.work_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
    Fd job{dir.fd < 0 ? -1
                      : openat(dir.fd, r.job().c_str(),
                               O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)};
    const std::string file = absl::StrCat("slot-", r.slot(), ".log");
    Fd log{job.fd < 0 ? -1 : openat(job.fd, file.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC)};
    struct stat st;
    if (log.fd < 0 || fstat(log.fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      return Error(grpc::StatusCode::NOT_FOUND,
                   absl::StrCat("cannot read ", options_.work_dir, "/", name, ": ",
                                log.fd < 0 ? strerror(errno) : "not a regular file"));
    }
    const int64_t size = st.st_size;
    int64_t offset = r.offset() >= 0 ? std::min<int64_t>(r.offset(), size)
                                     : std::max<int64_t>(0, size + r.offset());
    const int64_t want = std::min<int64_t>(
        size - offset, r.max_bytes() == 0 ? kDefaultReadBytes : std::min(r.max_bytes(), kMaxReadBytes));
    std::string data(static_cast<size_t>(want), '\0');
    const ssize_t got = want > 0 ? pread(log.fd, data.data(), data.size(), offset) : 0;
    if (got < 0) {
      return Error(grpc::StatusCode::INTERNAL,
                   absl::StrCat("cannot read ", options_.work_dir, "/", name, ": ", strerror(errno)));
    }
    data.resize(static_cast<size_t>(got));
    response->set_data(std::move(data));
    response->set_offset(offset);
    response->set_size(size);
    return grpc::Status::OK;
  }

  LogService* const owner_;
  const LogServiceOptions options_;
};

absl::StatusOr<std::unique_ptr<LogService>> LogService::Start(const LogServiceOptions& options) {
  if (options.work_dir.empty()) {
    return absl::InvalidArgumentError("the log service needs the agent's work directory");
  }
  if (options.node_token.empty() && !IsLoopbackAddress(options.listen)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--log_listen ", options.listen,
        " is not a loopback address: give --node_token_file (the coordinator presents the "
        "node token to read logs), or listen on 127.0.0.1"));
  }
  std::unique_ptr<LogService> service(new LogService());
  // The logs that earlier runs of this agent wrote stay readable.
  if (DIR* d = opendir(options.work_dir.c_str())) {
    absl::MutexLock lock(&service->mu_);
    while (const dirent* job = readdir(d)) {
      const std::string name = job->d_name;
      if (!IsJobId(name)) continue;
      DIR* j = opendir(absl::StrCat(options.work_dir, "/", name).c_str());
      if (j == nullptr) continue;
      while (const dirent* file = readdir(j)) {
        absl::string_view f = file->d_name;
        int slot = -1;
        if (absl::ConsumePrefix(&f, "slot-") && absl::ConsumeSuffix(&f, ".log") &&
            absl::SimpleAtoi(f, &slot) && slot >= 0) {
          service->served_[{name, slot}] = false;
        }
      }
      closedir(j);
    }
    closedir(d);
  }
  service->service_ = std::make_unique<Service>(service.get(), options);
  grpc::ServerBuilder builder;
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(options.listen, grpc::InsecureServerCredentials(), &service->port_);
  builder.RegisterService(service->service_.get());
  service->server_ = builder.BuildAndStart();
  if (service->server_ == nullptr || service->port_ == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", options.listen,
        " for the trainers' logs (--log_listen): the port is in use or the host is not an "
        "address of this machine"));
  }
  return service;
}

LogService::~LogService() {
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    server_->Wait();
  }
}

void LogService::Add(const std::string& job, int slot) {
  absl::MutexLock lock(&mu_);
  served_[{job, slot}] = true;
}

void LogService::SetRunning(const std::string& job, int slot, bool running) {
  absl::MutexLock lock(&mu_);
  auto it = served_.find({job, slot});
  if (it != served_.end()) it->second = running;
}

void LogService::Forget(const std::string& job) {
  absl::MutexLock lock(&mu_);
  std::erase_if(served_, [&](const auto& entry) { return entry.first.first == job; });
}

}  // namespace ringmaster::worker
