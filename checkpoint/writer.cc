#include "checkpoint/writer.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/framed_file.h"
#include "checkpoint/layout.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace ringmaster::checkpoint {
namespace {

constexpr int64_t kMinAutoBlock = 1 << 10;
constexpr int64_t kMaxAutoBlock = 1 << 20;
// A rank that needs 1/M of a buffer reads at most 2 blocks more than it needs: with
// blocks of buffer / 4096, that is within 5 % up to M = 100 (and better where the 1 MiB cap
// applies).
constexpr int64_t kAutoBlocksPerBuffer = 4096;
constexpr int64_t kStagingAlign = 4096;
constexpr size_t kStagingHugePage = size_t{2} << 20;
constexpr int64_t kMinBytesPerCopyThread = 16 << 20;
// The unit of the snapshot copy that threads take turns at (a multiple of kStagingAlign).
constexpr int64_t kCopyChunk = 4 << 20;
// Marks the status of a save that did not happen because a rank skipped it.
constexpr absl::string_view kSkippedPayload = "ringmaster.checkpoint/skipped";
// Marks the status of a save that failed because another rank failed (its report, its
// marker, ReportPeerFailure): that rank counts it among its own failures, rank 0 does not.
constexpr absl::string_view kPeerPayload = "ringmaster.checkpoint/peer";

int64_t AutoBlockBytes(int64_t elements) {
  const int64_t target = elements * kElementBytes / kAutoBlocksPerBuffer;
  int64_t block = kMinAutoBlock;  // the largest power of two <= target, within the bounds
  while (block * 2 <= target && block < kMaxAutoBlock) block *= 2;
  return block;
}

// Creates `path` and the directories above it that are missing.
absl::Status CreateDirs(Env* env, const std::string& path) {
  for (size_t slash = path.find('/', 1); slash != std::string::npos;
       slash = path.find('/', slash + 1)) {
    RM_RETURN_IF_ERROR(env->CreateDir(path.substr(0, slash)));
  }
  return env->CreateDir(path);
}

absl::Status StatusOfReport(const ShardReport& report) {
  return absl::Status(static_cast<absl::StatusCode>(report.status_code()), report.status_message());
}

// The failed report of `rank` for `step` that rank 0 makes up from what it learnt otherwise.
ShardReport FailedReport(int rank, int world, int64_t step, absl::StatusCode code,
                         absl::string_view message) {
  ShardReport report;
  report.set_rank(rank);
  report.set_world_size(world);
  report.set_step(step);
  report.set_status_code(static_cast<int>(code));
  report.set_status_message(std::string(message));
  return report;
}

// Reports are not synced: a machine crash loses the save anyway. The rename makes them
// appear whole.
absl::Status WriteReport(Env* env, const std::string& dir, const ShardReport& report) {
  const std::string name = ReportFileName(report.rank(), report.world_size());
  const std::string partial = JoinPath(dir, absl::StrCat(name, ".partial"));
  std::string payload;
  if (!report.SerializeToString(&payload)) return absl::InternalError("cannot serialize report");
  RM_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, env->NewWritableFile(partial, FileOptions()));
  RM_RETURN_IF_ERROR(file->PWrite(0, Frame(kReportMagic, payload)));
  RM_RETURN_IF_ERROR(file->Close());
  return env->RenameFile(partial, JoinPath(dir, name));
}

absl::Status CheckOptions(const CheckpointWriterOptions& o) {
  auto bad = [](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("CheckpointWriterOptions: ", what));
  };
  if (o.root.empty()) return bad("root is empty");
  if (o.job.empty() || o.job.find('/') != std::string::npos || o.job == "." || o.job == "..") {
    return bad(absl::StrCat("job must be a non-empty file name, got \"", o.job, "\""));
  }
  if (o.world_size < 1) return bad(absl::StrCat("world_size must be >= 1, got ", o.world_size));
  if (o.rank < 0 || o.rank >= o.world_size) {
    return bad(absl::StrCat("rank must be in [0, ", o.world_size, "), got ", o.rank));
  }
  if (o.retention.keep_last < 1) {
    return bad(absl::StrCat("retention.keep_last must be >= 1, got ", o.retention.keep_last));
  }
  if (o.retention.keep_every < 0) {
    return bad(absl::StrCat("retention.keep_every must be >= 0, got ", o.retention.keep_every));
  }
  if (o.block_bytes < 0 || o.block_bytes % kElementBytes != 0) {
    return bad(absl::StrCat("block_bytes must be 0 or a positive multiple of ", kElementBytes,
                            ", got ", o.block_bytes));
  }
  if (o.write_bytes <= 0) return bad(absl::StrCat("write_bytes must be > 0, got ", o.write_bytes));
  if (o.commit_timeout <= absl::ZeroDuration() || o.poll_interval <= absl::ZeroDuration()) {
    return bad("commit_timeout and poll_interval must be positive");
  }
  if (o.staging_reserve_bytes < 0) return bad("staging_reserve_bytes must be >= 0");
  if (o.snapshot_threads < 1) {
    return bad(absl::StrCat("snapshot_threads must be >= 1, got ", o.snapshot_threads));
  }
  if (o.env == nullptr || o.clock == nullptr) return bad("env and clock must be set");
  return absl::OkStatus();
}

}  // namespace

state::FlatRange SaveSlice(int64_t elements, int rank, int world_size) {
  CHECK(world_size >= 1 && rank >= 0 && rank < world_size) << rank << " of " << world_size;
  int64_t per_rank = (elements + world_size - 1) / world_size;
  per_rank = (per_rank + state::kAlignElements - 1) / state::kAlignElements * state::kAlignElements;
  return {std::min(elements, rank * per_rank), std::min(elements, (rank + 1) * per_rank)};
}

std::vector<int64_t> StepsToDelete(std::vector<int64_t> steps, int64_t latest,
                                   const RetentionPolicy& policy) {
  std::sort(steps.begin(), steps.end(), std::greater<>());
  std::vector<int64_t> doomed;
  int kept = 0;
  for (int64_t step : steps) {
    if (step > latest) continue;
    const bool recent = kept < policy.keep_last;
    if (recent) ++kept;
    const bool milestone = policy.keep_every > 0 && step % policy.keep_every == 0;
    if (!recent && !milestone && step != latest) doomed.push_back(step);
  }
  std::sort(doomed.begin(), doomed.end());
  return doomed;
}

void CheckpointWriter::Staging::operator()(char* p) const { munmap(p, bytes); }

CheckpointWriter::CheckpointWriter(const CheckpointWriterOptions& options)
    : options_(options), job_dir_(JobDir(options.root, options.job)) {
  if (options.table != nullptr) tensors_ = TensorEntries(*options.table);
}

absl::StatusOr<std::unique_ptr<CheckpointWriter>> CheckpointWriter::Create(
    const CheckpointWriterOptions& options) {
  RM_RETURN_IF_ERROR(CheckOptions(options));
  std::unique_ptr<CheckpointWriter> writer(new CheckpointWriter(options));
  RM_RETURN_IF_ERROR(CreateDirs(options.env, writer->job_dir_));
  if (options.rank == 0) RM_RETURN_IF_ERROR(writer->CleanUpAtStart());
  if (options.staging_reserve_bytes > 0) {
    RM_RETURN_IF_ERROR(writer->EnsureStaging(options.staging_reserve_bytes));
    std::memset(writer->staging_.get(), 0, writer->staging_capacity_);
  }
  return writer;
}

CheckpointWriter::~CheckpointWriter() {
  {
    absl::MutexLock lock(&mu_);
    cancel_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

absl::Status CheckpointWriter::CleanUpAtStart() {
  Env* env = options_.env;
  RM_ASSIGN_OR_RETURN(std::vector<std::string> names, env->GetChildren(job_dir_));
  for (const std::string& name : names) {
    if (!absl::StartsWith(name, kTempPrefix)) continue;
    const std::string path = JoinPath(job_dir_, name);
    absl::Status s = env->IsDirectory(path);
    if (s.ok()) {
      RM_RETURN_IF_ERROR(DeleteRecursively(env, path));
    } else if (absl::IsFailedPrecondition(s)) {
      RM_RETURN_IF_ERROR(env->DeleteFile(path));
    } else if (!absl::IsNotFound(s)) {
      return s;
    }
  }
  return env->SyncDir(job_dir_);
}

absl::Status CheckpointWriter::CheckRequest(const SaveRequest& request) const {
  if (request.step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("SaveRequest: step ", request.step, " < 0"));
  }
  auto bad = [](absl::string_view name, absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("SaveRequest buffer \"", name, "\": ", what));
  };
  // A name may come several times (a rank's pieces of a buffer, ZeRO-2/3): its elements
  // agree and its ranges are disjoint.
  std::vector<std::string> names;  // in the order of first appearance
  absl::flat_hash_map<std::string, int64_t> elements;
  absl::flat_hash_map<std::string, std::vector<state::FlatRange>> ranges;
  for (const BufferShard& b : request.buffers) {
    if (b.name.empty()) return bad(b.name, "the name is empty");
    if (b.elements < 0) return bad(b.name, absl::StrCat("elements ", b.elements, " < 0"));
    if (b.range.begin < 0 || b.range.begin > b.range.end || b.range.end > b.elements) {
      return bad(b.name, absl::StrCat("range ", state::RangeString(b.range),
                                      " is not inside [0, ", b.elements, ")"));
    }
    if (static_cast<int64_t>(b.data.size()) != b.range.size()) {
      return bad(b.name, absl::StrCat("data has ", b.data.size(), " floats for a range of ",
                                      b.range.size()));
    }
    auto [it, first] = elements.emplace(b.name, b.elements);
    if (first) names.push_back(b.name);
    if (it->second != b.elements) {
      return bad(b.name, absl::StrCat("elements ", b.elements, " in the piece ",
                                      state::RangeString(b.range), ", ", it->second,
                                      " in an earlier piece (the pieces of one buffer are "
                                      "ranges of one flat space)"));
    }
    if (b.range.size() > 0) ranges[b.name].push_back(b.range);
  }
  for (const std::string& name : names) {
    std::vector<state::FlatRange>& pieces = ranges[name];
    std::stable_sort(pieces.begin(), pieces.end(),
                     [](state::FlatRange a, state::FlatRange b) { return a.begin < b.begin; });
    state::FlatRange reaching{0, 0};  // of the pieces so far, the one that ends last
    for (const state::FlatRange& r : pieces) {
      if (r.begin < reaching.end) {
        return bad(name, absl::StrCat("ranges ", state::RangeString(reaching), " and ",
                                      state::RangeString(r),
                                      " overlap (a rank's pieces of one buffer must be disjoint)"));
      }
      if (r.end > reaching.end) reaching = r;
    }
  }
  return absl::OkStatus();
}

absl::Status CheckpointWriter::EnsureStaging(int64_t bytes) {
  if (bytes <= staging_capacity_) return absl::OkStatus();
  // Fresh anonymous memory on 2 MiB boundaries, asking for transparent huge pages before
  // the first touch. The shard is written straight from here with O_DIRECT, and a device
  // request holds at most 254 segments of physically contiguous memory here (virtio-blk,
  // max_sectors_kb 4096): 300 MiB of 8 MiB pwrites went as 203 requests of 1.5 MiB from
  // 4 KiB pages, as 81 of 3.75 MiB from huge pages, and this virtual disk wrote them ~30 %
  // faster so (1.33 -> 1.71 GB/s, medians of 9). Where THP is off, ordinary memory.
  const size_t rounded =
      (static_cast<size_t>(bytes) + kStagingHugePage - 1) / kStagingHugePage * kStagingHugePage;
  void* mapped = mmap(nullptr, rounded + kStagingHugePage, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) {  // no restart finds more memory
    return MarkPermanent(
        ErrnoToStatus(errno, absl::StrCat("mapping ", rounded + kStagingHugePage,
                                          " bytes of checkpoint staging memory (", bytes,
                                          " bytes of this rank's snapshot)")));
  }
  char* const base = static_cast<char*>(mapped);
  char* const aligned = reinterpret_cast<char*>(
      (reinterpret_cast<uintptr_t>(base) + kStagingHugePage - 1) / kStagingHugePage *
      kStagingHugePage);
  if (aligned > base) munmap(base, aligned - base);
  if (const size_t tail = kStagingHugePage - (aligned - base); tail > 0) {
    munmap(aligned + rounded, tail);
  }
  if (options_.huge_pages) madvise(aligned, rounded, MADV_HUGEPAGE);  // EINVAL without THP
  staging_ = std::unique_ptr<char[], Staging>(aligned, Staging{rounded});
  staging_capacity_ = static_cast<int64_t>(rounded);
  absl::MutexLock lock(&mu_);
  stats_.staging_bytes = staging_capacity_;
  return absl::OkStatus();
}

absl::Status CheckpointWriter::Plan(const SaveRequest& request, Job* job) {
  int64_t offset = 0;
  for (const BufferShard& b : request.buffers) {
    job->layout.push_back(
        Layout{b.name, b.elements, b.range, offset,
               options_.block_bytes > 0 ? options_.block_bytes : AutoBlockBytes(b.elements)});
    offset += b.range.size() * kElementBytes;
  }
  job->bytes = offset;
  job->state = request.state;
  return EnsureStaging(offset);
}

std::shared_ptr<CheckpointWriter::SnapshotCopy> CheckpointWriter::PlanCopy(
    const SaveRequest& request, const Job& job) const {
  auto copy = std::make_shared<SnapshotCopy>();
  copy->sources = request.buffers;
  for (const Layout& l : job.layout) copy->offsets.push_back(l.offset);
  copy->bytes = job.bytes;
  copy->chunks = (job.bytes + kCopyChunk - 1) / kCopyChunk;
  copy->left = copy->chunks;
  copy->start = options_.clock->Now();
  return copy;
}

void CheckpointWriter::CopyChunks(SnapshotCopy& copy) {
  while (true) {
    const int64_t chunk = copy.next.fetch_add(1);
    if (chunk >= copy.chunks) return;
    // The staging area is the buffers back to back: copy its bytes [begin, end).
    const int64_t begin = chunk * kCopyChunk, end = std::min(copy.bytes, begin + kCopyChunk);
    // The sources lie back to back in ascending offsets: start at the last one that begins
    // at or before `begin` (a rank saving many pieces has thousands).
    const size_t first =
        std::upper_bound(copy.offsets.begin(), copy.offsets.end(), begin) - copy.offsets.begin();
    for (size_t i = first > 0 ? first - 1 : 0;
         i < copy.sources.size() && copy.offsets[i] < end; ++i) {
      const int64_t at = copy.offsets[i];
      const int64_t size = copy.sources[i].range.size() * kElementBytes;
      const int64_t from = std::max(begin, at), to = std::min(end, at + size);
      if (from >= to) continue;
      std::memcpy(staging_.get() + from,
                  reinterpret_cast<const char*>(copy.sources[i].data.data()) + (from - at),
                  to - from);
    }
    if (copy.left.fetch_sub(1) == 1) {
      absl::MutexLock lock(&mu_);
      copying_ = false;
      stats_.last_snapshot_time = options_.clock->Now() - copy.start;
    }
  }
}

absl::Status CheckpointWriter::WriteSkipReport(int64_t step, int64_t save) {
  const std::string dir = JoinPath(job_dir_, SaveDirName(step, save));
  RM_RETURN_IF_ERROR(options_.env->CreateDir(dir));
  ShardReport report;
  report.set_rank(options_.rank);
  report.set_world_size(options_.world_size);
  report.set_step(step);
  report.set_skipped(true);
  return WriteReport(options_.env, dir, report);
}

absl::StatusOr<SaveOutcome> CheckpointWriter::SaveAsync(const SaveRequest& request) {
  RM_ASSIGN_OR_RETURN(SaveOutcome outcome, BeginSave(request, CopyOn::kCaller));
  return outcome;
}

absl::StatusOr<SaveOutcome> CheckpointWriter::BeginSave(const SaveRequest& request) {
  return BeginSave(request, CopyOn::kBackground);
}

absl::StatusOr<SaveOutcome> CheckpointWriter::BeginSave(const SaveRequest& request,
                                                        CopyOn copy_on) {
  RM_RETURN_IF_ERROR(CheckRequest(request));
  const absl::Time start = options_.clock->Now();
  bool skip = false;
  {
    absl::MutexLock lock(&mu_);
    if (busy_ && options_.on_busy == OnBusy::kSkip) {
      ++stats_.skipped;
      skip = true;
    } else {
      auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !busy_; };
      mu_.Await(absl::Condition(&idle));
    }
  }
  if (skip) {
    // Tell rank 0 at once, so that it does not wait for this rank's shard until its commit
    // timeout. Only rank 0 commits, so rank 0's own skip needs no report.
    const int64_t save = next_save_++;
    if (options_.rank != 0) {
      absl::Status s = WriteSkipReport(request.step, save);
      LOG_IF(WARNING, !s.ok()) << "checkpoint step " << request.step
                               << ": cannot report the skipped save to rank 0: " << s;
    }
    return SaveOutcome::kSkipped;
  }
  if (thread_.joinable()) thread_.join();
  Job job;
  job.step = request.step;
  job.save = next_save_++;
  job.begun = start;
  RM_RETURN_IF_ERROR(Plan(request, &job));
  std::shared_ptr<SnapshotCopy> copy = PlanCopy(request, job);
  if (copy_on == CopyOn::kCaller) {
    // Memory bandwidth grows with threads up to a point (2 cores: 17 -> 27 GB/s); small
    // snapshots are not worth a thread.
    const int threads = static_cast<int>(std::clamp<int64_t>(
        job.bytes / kMinBytesPerCopyThread, 1, options_.snapshot_threads));
    std::vector<std::thread> helpers;
    for (int t = 1; t < threads; ++t) helpers.emplace_back([this, copy] { CopyChunks(*copy); });
    CopyChunks(*copy);
    for (std::thread& h : helpers) h.join();
  } else if (copy->chunks > 0) {
    // The writer's thread copies while the caller goes on; FinishSnapshot joins in.
    job.copy = copy;
  }
  {
    absl::MutexLock lock(&mu_);
    busy_ = true;
    saving_ = true;
    own_part_done_ = false;
    own_part_status_ = absl::OkStatus();
    peer_failures_.clear();  // about earlier saves: this one has not begun anywhere before
    copying_ = job.copy != nullptr;
    if (copying_) snapshot_ = std::move(copy);
    if (copy != nullptr && copy->chunks == 0) stats_.last_snapshot_time = absl::ZeroDuration();
    ++stats_.started;
    stats_.last_blocked_time = options_.clock->Now() - start;
  }
  thread_ = std::thread([this, job = std::move(job)]() mutable { Run(std::move(job)); });
  return SaveOutcome::kStarted;
}

void CheckpointWriter::FinishSnapshot() {
  const absl::Time start = options_.clock->Now();
  std::shared_ptr<SnapshotCopy> copy;
  {
    absl::MutexLock lock(&mu_);
    copy = std::move(snapshot_);
  }
  // What the writer's thread has not taken yet is copied here as well, so the rest takes
  // two threads' time; then the chunks in the writer's hands are waited for.
  if (copy != nullptr) CopyChunks(*copy);
  absl::MutexLock lock(&mu_);
  auto copied = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !copying_; };
  mu_.Await(absl::Condition(&copied));
  stats_.last_blocked_time += options_.clock->Now() - start;
}

absl::Status CheckpointWriter::SaveSync(const SaveRequest& request, absl::Time deadline) {
  RM_RETURN_IF_ERROR(SaveWhenIdle(request, deadline));
  return Wait(deadline);
}

absl::Status CheckpointWriter::SaveWhenIdle(const SaveRequest& request, absl::Time deadline) {
  RM_RETURN_IF_ERROR(CheckRequest(request));
  {
    absl::MutexLock lock(&mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !busy_; };
    if (!mu_.AwaitWithDeadline(absl::Condition(&idle), deadline)) {
      return absl::DeadlineExceededError(
          absl::StrCat("checkpoint step ", request.step,
                       ": the previous save was still running at the deadline"));
    }
  }
  // Nothing runs now, so SaveAsync starts whatever the OnBusy policy.
  return SaveAsync(request).status();
}

absl::Status CheckpointWriter::Wait(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto finished = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !saving_; };
  if (!mu_.AwaitWithDeadline(absl::Condition(&finished), deadline)) {
    return absl::DeadlineExceededError("the checkpoint save is still running");
  }
  return stats_.last_status;
}

absl::Status CheckpointWriter::WaitIdle(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !busy_; };
  if (!mu_.AwaitWithDeadline(absl::Condition(&idle), deadline)) {
    return absl::DeadlineExceededError("the checkpoint writer is still busy");
  }
  return stats_.last_status;
}

absl::Status CheckpointWriter::WaitOwnPart(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return own_part_done_; };
  if (!mu_.AwaitWithDeadline(absl::Condition(&done), deadline)) {
    return absl::DeadlineExceededError(
        "this rank's shard of the checkpoint is still being written (a slow or stuck disk "
        "under checkpoint.dir?)");
  }
  return own_part_status_;
}

void CheckpointWriter::ReportPeerFailure(int rank, int64_t step, const absl::Status& status) {
  if (options_.rank != 0 || rank <= 0 || rank >= options_.world_size || status.ok()) return;
  absl::MutexLock lock(&mu_);
  peer_failures_[rank] = SaveFailure{step, status};
}

std::optional<absl::Status> CheckpointWriter::Poll() const {
  absl::MutexLock lock(&mu_);
  if (saving_) return std::nullopt;
  return stats_.last_status;
}

WriterStats CheckpointWriter::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

bool CheckpointWriter::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancel_;
}

void CheckpointWriter::Run(Job job) {
  if (job.copy != nullptr) {  // BeginSave: the snapshot is copied here (and by FinishSnapshot)
    CopyChunks(*job.copy);
    job.copy.reset();
    absl::MutexLock lock(&mu_);
    auto copied = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !copying_; };
    mu_.Await(absl::Condition(&copied));  // chunks FinishSnapshot took
  }
  const absl::Time start = options_.clock->Now();
  Tidy tidy;
  absl::Status status = Persist(job, &tidy);
  {
    absl::MutexLock lock(&mu_);
    const bool own = !status.ok() && !status.GetPayload(kPeerPayload).has_value() &&
                     !status.GetPayload(kSkippedPayload).has_value();
    if (!own_part_done_) {
      // Other ranks' part ends here; rank 0's ended here when it returned early.
      own_part_done_ = true;
      own_part_status_ = own ? status : absl::OkStatus();
      if (own) CountOwnFailure(job.step, status);
    } else if (own && own_part_status_.ok()) {  // rank 0: collecting or committing failed
      CountOwnFailure(job.step, status);
    }
  }
  status.ErasePayload(kPeerPayload);  // counted: it has told what it had to
  if (!status.ok()) {
    absl::Status prefixed(status.code(), absl::StrCat("checkpoint step ", job.step, " (rank ",
                                                      options_.rank, "): ", status.message()));
    status.ForEachPayload([&](absl::string_view url, const absl::Cord& payload) {
      prefixed.SetPayload(url, payload);
    });
    status = std::move(prefixed);
    LOG(WARNING) << status;
  }
  Finish(job, std::move(status), options_.clock->Now() - start);
  TidyUp(job, tidy);
  absl::MutexLock lock(&mu_);
  busy_ = false;
}

void CheckpointWriter::TidyUp(const Job& job, const Tidy& tidy) {
  if (tidy.retention) ApplyRetention(job.step);
  if (tidy.remove_dir) {
    const std::string dir = JoinPath(job_dir_, SaveDirName(job.step, job.save));
    absl::Status s = DeleteRecursively(options_.env, dir);
    LOG_IF(WARNING, !s.ok()) << "removing " << dir << ": " << s;
  }
  if (tidy.remove_older) RemoveTemporariesBefore(job.save + 1);
}

void CheckpointWriter::Finish(const Job& job, absl::Status status, absl::Duration write_time) {
  absl::MutexLock lock(&mu_);
  saving_ = false;
  stats_.last_step = job.step;
  stats_.last_write_time = write_time;
  stats_.last_shard_bytes = job.bytes;
  if (status.ok()) {
    ++stats_.succeeded;
    if (options_.rank == 0) {
      stats_.last_committed_step = job.step;
      std::vector<CommittedSave>& recent = stats_.recent_commits;
      recent.push_back({job.step, stats_.last_committed_bytes, stats_.last_committed_time,
                        options_.clock->Now() - job.begun, stats_.last_blocked_time});
      if (recent.size() > static_cast<size_t>(kRecentCommits)) recent.erase(recent.begin());
    }
  } else if (status.GetPayload(kSkippedPayload).has_value()) {
    ++stats_.skipped;
  } else {
    ++stats_.failed;
    stats_.last_failure = status;
    stats_.last_failed_step = job.step;
  }
  stats_.last_status = std::move(status);
}

void CheckpointWriter::FinishOwnPart(int64_t step, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  own_part_done_ = true;
  own_part_status_ = status;
  if (!status.ok()) CountOwnFailure(step, status);
}

void CheckpointWriter::CountOwnFailure(int64_t step, const absl::Status& status) {
  ++stats_.own_failures;
  std::vector<SaveFailure>& recent = stats_.recent_own_failures;
  recent.push_back(SaveFailure{step, status});
  if (recent.size() > static_cast<size_t>(kRecentOwnFailures)) recent.erase(recent.begin());
}

void CheckpointWriter::Record(absl::Duration WriterStats::*field, absl::Duration value) {
  absl::MutexLock lock(&mu_);
  stats_.*field = value;
}

absl::Status CheckpointWriter::Persist(const Job& job, Tidy* tidy) {
  Env* env = options_.env;
  const absl::Time start = options_.clock->Now();
  const std::string dir = JoinPath(job_dir_, SaveDirName(job.step, job.save));
  const std::string committed = JoinPath(job_dir_, StepDirName(job.step));
  if (env->FileExists(JoinPath(committed, kManifestName)).ok()) {
    // Saved before this writer started (a run killed after its commit and before LATEST,
    // then resumed from the older LATEST): that checkpoint holds this step already.
    if (options_.rank != 0) return absl::OkStatus();
    if (absl::StatusOr<Manifest> m = ReadManifest(env, committed); m.ok()) {
      absl::MutexLock lock(&mu_);
      stats_.last_committed_bytes = ManifestBytes(*m);
      stats_.last_committed_time = absl::FromUnixMicros(m->created_unix_micros());
    }
    absl::StatusOr<int64_t> latest = ReadLatest(env, job_dir_);
    if (!latest.ok() || *latest != job.step) {
      RM_RETURN_IF_ERROR(ReplaceFileDurably(env, JoinPath(job_dir_, kLatestName),
                                            JoinPath(job_dir_, kLatestTempName),
                                            absl::StrCat(StepDirName(job.step), "\n")));
    }
    tidy->retention = true;
    return absl::OkStatus();
  }
  // A rank that fails, even here, still tries to report (rank 0 may have made the directory).
  absl::Status made = env->CreateDir(dir);
  absl::StatusOr<ShardReport> mine = made.ok() ? WriteShard(job, dir) : made;
  const absl::Time shard_done = options_.clock->Now();
  Record(&WriterStats::last_shard_time, shard_done - start);
  if (options_.rank == 0) FinishOwnPart(job.step, mine.status());
  if (options_.rank != 0) {
    ShardReport report;
    if (mine.ok()) {
      report = *std::move(mine);
    } else {
      report.set_rank(options_.rank);
      report.set_world_size(options_.world_size);
      report.set_step(job.step);
      report.set_status_code(static_cast<int>(mine.status().code()));
      report.set_status_message(std::string(mine.status().message()));
    }
    absl::Status reported = WriteReport(env, dir, report);
    const absl::Status failed = mine.ok() ? reported : mine.status();
    if (!reported.ok()) {
      // Perhaps the disk is full (the shard may have fitted, and not the report): a name
      // needs no data block. Where even that fails, the trainer tells rank 0 otherwise
      // (ReportPeerFailure).
      const std::string marker =
          FailedMarkerName(options_.rank, options_.world_size, static_cast<int>(failed.code()));
      absl::StatusOr<std::unique_ptr<WritableFile>> file =
          env->NewWritableFile(JoinPath(dir, marker), FileOptions());
      absl::Status marked = file.ok() ? (*file)->Close() : file.status();
      LOG_IF(WARNING, !marked.ok())
          << "checkpoint step " << job.step << ": cannot tell rank 0 that this rank failed ("
          << failed << ") through the directory either: " << marked;
    }
    return failed;
  }
  // Rank 0 collects the reports even when its own shard failed: once every rank has
  // reported, no one writes in this directory any more.
  absl::StatusOr<std::vector<ShardReport>> others = CollectReports(job, dir);
  RM_RETURN_IF_ERROR(others.status());
  absl::Status status = mine.status();
  bool someone_skipped = false;
  for (const ShardReport& r : *others) {
    someone_skipped = someone_skipped || r.skipped();
    if (!status.ok()) continue;
    if (r.skipped()) {
      status = absl::UnavailableError(
          absl::StrCat("rank ", r.rank(), " skipped this save (its previous one was running)"));
      status.SetPayload(kSkippedPayload, absl::Cord("1"));
    } else if (!StatusOfReport(r).ok()) {
      status = absl::Status(StatusOfReport(r).code(),
                            absl::StrCat("rank ", r.rank(), ": ", r.status_message()));
      status.SetPayload(kPeerPayload, absl::Cord("1"));
    }
  }
  if (status.ok()) {
    std::vector<ShardReport> reports;
    reports.push_back(*std::move(mine));
    for (ShardReport& r : *others) reports.push_back(std::move(r));
    status = Commit(job, dir, reports);
    if (status.ok()) Record(&WriterStats::last_commit_time, options_.clock->Now() - shard_done);
  }
  tidy->retention = status.ok();
  // A rank that skipped may still be writing an older save: only this directory can go.
  // Otherwise every rank ran this save, so each has finished the older ones.
  tidy->remove_dir = someone_skipped;
  tidy->remove_older = !someone_skipped;
  return status;
}

absl::StatusOr<ShardReport> CheckpointWriter::WriteShard(const Job& job, const std::string& dir) {
  const std::string name = ShardFileName(options_.rank, options_.world_size);
  ShardReport report;
  report.set_rank(options_.rank);
  report.set_world_size(options_.world_size);
  report.set_step(job.step);
  // The shard file is the staging area byte for byte. Its blocks' checksums are computed
  // on a helper thread while this one writes: with direct I/O the device reads the staging
  // memory itself and this thread mostly waits, so the hashing costs the disk no time, and
  // the page cache neither copies nor holds the shard.
  std::vector<std::vector<uint64_t>> hashes(job.layout.size());
  std::atomic<bool> hashing_stopped{false};
  std::thread hasher([&] {
    for (size_t i = 0; i < job.layout.size(); ++i) {
      const Layout& l = job.layout[i];
      const int64_t length = l.range.size() * kElementBytes;
      hashes[i].reserve(static_cast<size_t>((length + l.block_bytes - 1) / l.block_bytes));
      for (int64_t b = 0; b < length; b += l.block_bytes) {
        if (hashing_stopped.load(std::memory_order_relaxed)) return;
        const int64_t n = std::min(l.block_bytes, length - b);
        hashes[i].push_back(Xxh3(absl::string_view(staging_.get() + l.offset + b, n)));
      }
    }
  });
  auto write = [&]() -> absl::Status {
    FileOptions direct;
    direct.direct_io = true;
    RM_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file,
                        options_.env->NewWritableFile(JoinPath(dir, name), direct));
    const int64_t piece = (options_.write_bytes + kStagingAlign - 1) / kStagingAlign * kStagingAlign;
    for (int64_t pos = 0; pos < job.bytes; pos += piece) {
      if (cancelled()) return absl::CancelledError("the writer is being destroyed");
      const int64_t n = std::min(piece, job.bytes - pos);
      RM_RETURN_IF_ERROR(file->PWrite(pos, absl::string_view(staging_.get() + pos, n)));
      RM_RETURN_IF_ERROR(file->StartWriteback(pos, n));
    }
    RM_RETURN_IF_ERROR(file->Sync());
    return file->Close();
  };
  absl::Status written = write();
  if (!written.ok()) hashing_stopped = true;
  hasher.join();
  RM_RETURN_IF_ERROR(written);
  RM_RETURN_IF_ERROR(options_.env->SyncDir(dir));
  absl::flat_hash_set<std::string> listed;  // each buffer once, however many pieces it has
  for (size_t i = 0; i < job.layout.size(); ++i) {
    const Layout& l = job.layout[i];
    if (listed.insert(l.name).second) {
      BufferEntry* buffer = report.add_buffers();
      buffer->set_name(l.name);
      buffer->set_dtype(std::string(kBufferDtype));
      buffer->set_elements(l.elements);
    }
    if (l.range.size() == 0) continue;
    ChunkEntry* chunk = report.add_chunks();
    chunk->set_buffer(l.name);
    chunk->set_begin(l.range.begin);
    chunk->set_end(l.range.end);
    chunk->set_file(name);
    chunk->set_offset(l.offset);
    chunk->set_length(l.range.size() * kElementBytes);
    chunk->set_block_bytes(l.block_bytes);
    chunk->set_rank(options_.rank);
    *chunk->mutable_block_xxh3() = {hashes[i].begin(), hashes[i].end()};
  }
  ShardFile* shard = report.mutable_file();
  shard->set_name(name);
  shard->set_bytes(job.bytes);
  shard->set_rank(options_.rank);
  return report;
}

absl::StatusOr<std::vector<ShardReport>> CheckpointWriter::CollectReports(const Job& job,
                                                                          const std::string& dir) {
  const int world = options_.world_size;
  std::vector<ShardReport> reports(world - 1);
  std::vector<int> pending;
  for (int r = 1; r < world; ++r) pending.push_back(r);
  const absl::Time deadline = options_.clock->Now() + options_.commit_timeout;
  while (true) {
    RM_ASSIGN_OR_RETURN(std::vector<std::string> names, options_.env->GetChildren(dir));
    absl::flat_hash_set<std::string> present(names.begin(), names.end());
    std::vector<int> still;
    for (int r : pending) {
      const std::string name = ReportFileName(r, world);
      ShardReport& report = reports[r - 1];
      if (!present.contains(name)) {
        std::optional<int> failed;
        for (const std::string& n : names) {
          if (!failed) failed = ParseFailedMarker(n, r, world);
        }
        std::optional<SaveFailure> told;
        {
          absl::MutexLock lock(&mu_);
          auto it = peer_failures_.find(r);
          if (it != peer_failures_.end() && it->second.step == job.step) told = it->second;
        }
        if (told) {  // the ranks told each other: rank r's own words
          report = FailedReport(r, world, job.step, told->status.code(), told->status.message());
        } else if (failed) {
          const auto code = static_cast<absl::StatusCode>(*failed);
          report = FailedReport(r, world, job.step, code,
                                absl::StrCat("failed with ", absl::StatusCodeToString(code),
                                             " and could not write its report (see its log)"));
        } else {
          still.push_back(r);
        }
        continue;
      }
      RM_RETURN_IF_ERROR(ReadFramedProto(options_.env, JoinPath(dir, name), kReportMagic, &report));
      if (report.rank() != r || report.world_size() != world || report.step() != job.step) {
        return absl::InternalError(absl::StrCat(JoinPath(dir, name), " is rank ", report.rank(),
                                                " of ", report.world_size(), " for step ",
                                                report.step()));
      }
    }
    pending = std::move(still);
    if (pending.empty()) return reports;
    if (cancelled()) return absl::CancelledError("the writer is being destroyed");
    const absl::Time now = options_.clock->Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("rank 0 waited ", absl::FormatDuration(options_.commit_timeout),
                       " for the shards of ranks ", absl::StrJoin(pending, ", "), " in ", dir));
    }
    options_.clock->SleepUntil(std::min(now + options_.poll_interval, deadline));
  }
}

absl::Status CheckpointWriter::Commit(const Job& job, const std::string& dir,
                                      const std::vector<ShardReport>& reports) {
  Env* env = options_.env;
  Manifest m;
  m.set_format_version(kFormatVersion);
  m.set_job(options_.job);
  m.set_spec_hash(options_.spec_hash);
  m.set_training_spec(options_.training_spec);
  m.set_step(job.step);
  m.set_world_size(options_.world_size);
  m.set_zero_stage(options_.zero_stage);
  for (const TensorEntry& t : tensors_) *m.add_tensors() = t;
  *m.mutable_buffers() = reports[0].buffers();
  std::vector<ChunkEntry> chunks;
  for (const ShardReport& r : reports) {
    if (r.buffers_size() != m.buffers_size() ||
        !std::equal(r.buffers().begin(), r.buffers().end(), m.buffers().begin(),
                    [](const BufferEntry& a, const BufferEntry& b) {
                      return a.name() == b.name() && a.elements() == b.elements();
                    })) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", r.rank(), " saved other buffers than rank 0 (names or sizes differ)"));
    }
    chunks.insert(chunks.end(), r.chunks().begin(), r.chunks().end());
    *m.add_files() = r.file();
    // The shard must be there as reported (it was not, when a second rank 0 removed the
    // directory under a rank that had written it already).
    const std::string path = JoinPath(dir, r.file().name());
    absl::StatusOr<std::unique_ptr<RandomAccessFile>> shard = env->NewRandomAccessFile(path);
    absl::StatusOr<uint64_t> size = shard.ok() ? (*shard)->Size() : shard.status();
    if (!size.ok() || static_cast<int64_t>(*size) != r.file().bytes()) {
      return absl::DataLossError(absl::StrCat(
          path, ", reported by rank ", r.rank(), " with ", r.file().bytes(), " bytes, ",
          size.ok() ? absl::StrCat("has ", *size) : std::string(size.status().message())));
    }
  }
  absl::flat_hash_map<std::string, int> order;
  for (int i = 0; i < m.buffers_size(); ++i) order[m.buffers(i).name()] = i;
  std::sort(chunks.begin(), chunks.end(), [&](const ChunkEntry& a, const ChunkEntry& b) {
    return std::make_pair(order[a.buffer()], a.begin()) <
           std::make_pair(order[b.buffer()], b.begin());
  });
  for (ChunkEntry& c : chunks) *m.add_chunks() = std::move(c);
  *m.mutable_training() = ToProto(job.state);
  m.set_created_unix_micros(absl::ToUnixMicros(options_.clock->Now()));
  std::vector<std::string> problems = ManifestProblems(m);
  if (!problems.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("the ranks' shards do not form a checkpoint: ",
                                                   absl::StrJoin(problems, "; ")));
  }

  // The directory is invisible until the rename, so the order inside it is free; MANIFEST
  // goes last all the same.
  RM_RETURN_IF_ERROR(WriteFileDurably(env, JoinPath(dir, kManifestJsonName), ManifestToJson(m)));
  RM_RETURN_IF_ERROR(WriteFramedProto(env, JoinPath(dir, kManifestName), kManifestMagic, m));
  for (int r = 1; r < options_.world_size; ++r) {
    RM_RETURN_IF_ERROR(env->DeleteFile(JoinPath(dir, ReportFileName(r, options_.world_size))));
  }
  RM_RETURN_IF_ERROR(env->SyncDir(dir));
  RM_RETURN_IF_ERROR(env->RenameFile(dir, JoinPath(job_dir_, StepDirName(job.step))));
  RM_RETURN_IF_ERROR(env->SyncDir(job_dir_));
  {
    absl::MutexLock lock(&mu_);
    stats_.last_committed_bytes = ManifestBytes(m);
    stats_.last_committed_time = absl::FromUnixMicros(m.created_unix_micros());
  }
  RM_RETURN_IF_ERROR(ReplaceFileDurably(env, JoinPath(job_dir_, kLatestName),
                                        JoinPath(job_dir_, kLatestTempName),
                                        absl::StrCat(StepDirName(job.step), "\n")));
  return absl::OkStatus();
}

void CheckpointWriter::ApplyRetention(int64_t latest) {
  Env* env = options_.env;
  const absl::Time start = options_.clock->Now();
  absl::Status status = [&]() -> absl::Status {
    RM_ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListCommittedSteps(env, job_dir_));
    std::vector<int64_t> doomed = StepsToDelete(steps, latest, options_.retention);
    if (doomed.empty()) return absl::OkStatus();
    // Out of view first, durably, so that a crash never leaves a half-deleted step-N.
    for (int64_t step : doomed) {
      RM_RETURN_IF_ERROR(env->RenameFile(JoinPath(job_dir_, StepDirName(step)),
                                         JoinPath(job_dir_, DeletingDirName(step))));
    }
    RM_RETURN_IF_ERROR(env->SyncDir(job_dir_));
    for (int64_t step : doomed) {
      RM_RETURN_IF_ERROR(DeleteRecursively(env, JoinPath(job_dir_, DeletingDirName(step))));
      absl::MutexLock lock(&mu_);
      ++stats_.deleted_checkpoints;
    }
    return absl::OkStatus();
  }();
  LOG_IF(WARNING, !status.ok()) << "checkpoint retention in " << job_dir_ << ": " << status;
  absl::MutexLock lock(&mu_);
  stats_.retention_status = status;
  stats_.last_retention_time = options_.clock->Now() - start;
}

void CheckpointWriter::RemoveTemporariesBefore(int64_t save) {
  Env* env = options_.env;
  absl::StatusOr<std::vector<std::string>> names = env->GetChildren(job_dir_);
  if (!names.ok()) return;
  for (const std::string& name : *names) {
    std::optional<int64_t> number = ParseSaveDirNumber(name);
    if ((number && *number < save) || absl::StartsWith(name, kDeletingPrefix)) {
      absl::Status s = DeleteRecursively(env, JoinPath(job_dir_, name));
      LOG_IF(WARNING, !s.ok()) << "removing the temporary " << name << ": " << s;
    }
  }
}

}  // namespace ringmaster::checkpoint
