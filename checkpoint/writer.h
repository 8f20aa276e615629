// CheckpointWriter: one per rank; saves this rank's part of the flat training state in the
// background and, on rank 0, commits the checkpoint (ARCHITECTURE.md "Checkpoint on disk").
//
// In the trainer, every rank. Buffers are described over the table's flat space,
// n = table.total_elements() (the padding past it is not saved; a load pads with zeros):
// `range` is the optimizer's range under ZeRO 1/2 (its shard, clamped to n), or
// SaveSlice(n, rank, world) with ZeRO off, so that the ranks share the writing.
//
//   auto writer = CheckpointWriter::Create({.root = spec.checkpoint().dir(), .job = name,
//       .rank = rank, .world_size = world, .zero_stage = zero, .spec_hash = hash,
//       .table = &table, .staging_reserve_bytes = bytes_per_rank});  // before step 1
//   ...at the end of a step that is due (every_steps / every_seconds / on demand):
//   SaveRequest req{.step = step, .state = {step, sampler_state, seed, rng, scaler, ...}};
//   req.buffers.push_back({"params", n, range, Slice(params.span(), range)});
//   for (const StateBuffer& b : optimizer->state_buffers())  // b.range contains `range`
//     req.buffers.push_back({b.name, n, range,
//                            b.data.subspan(range.begin - b.range.begin, range.size())});
//   writer->BeginSave(req);   // the copy starts on the writer's thread; the next step's
//   ...forward and backward (they only read the state)...
//   writer->FinishSnapshot();  // before the optimizer writes: helps with the rest of the copy
//   (SaveAsync(req) instead copies in the caller, blocking for the whole copy)
//   ...each step: if (auto s = writer->Poll(); s && !s->ok()) report *s; training goes on
//   ...on SIGTERM: writer->SaveSync(req, now + drain_grace);
//
// A save of step N, numbered S among this writer's saves (every rank numbers them alike):
//   1. Snapshot: the request's buffer ranges are copied into one host staging area,
//      reused from save to save (the memory bound: one staging copy per rank). SaveAsync
//      copies on the caller's thread (the only part that blocks training); BeginSave and
//      FinishSnapshot let the copy run on the background thread while the caller does
//      work that only reads the buffers, and FinishSnapshot copies what is left alongside
//      it (the copy is taken in 4 MiB chunks by whichever thread is free). The staging
//      area asks for transparent huge pages (huge_pages): the shard is written from it
//      with O_DIRECT in fewer, larger device requests.
//   2. Background thread, every rank: in <root>/<job>/tmp-step-N-save-S/ write
//      shard-<r>-of-<W>.bin with large pwrites, each block checksummed (xxh3) on the way,
//      writeback started as it goes, then fdatasync; then report-<r>-of-<W>.pb (the
//      chunks: buffer, element range, byte range, block checksums) by write + rename. A
//      rank that fails or skips writes a report saying so.
//   3. Rank 0 waits (commit_timeout, on the Clock) for the W reports, checks that the
//      ranks' chunks tile every buffer, writes MANIFEST then manifest.json and syncs them,
//      removes the reports, syncs the directory, renames it to step-N, syncs <root>/<job>,
//      then replaces LATEST (write tmp-LATEST, sync, rename, sync directory). The save is
//      finished (Wait returns). Then, still in the background, rank 0 applies the retention
//      policy and removes older temporaries; the next save waits for that tidy-up.
// The ranks tell rank 0 about their shards through files in the temporary directory, not
// through the communicator: the background thread must not use a communicator while the
// training thread runs collectives on it, and the files work on any shared filesystem.
// A rank that cannot write its report (a full disk: ENOSPC on the report too) leaves an
// empty marker file instead; where even that fails, the training threads tell each other
// (the trainer exchanges stats().recent_own_failures over its communicator) and rank 0's
// caller passes the news on with ReportPeerFailure: rank 0 stops waiting for that rank
// and the save fails with its error at once, never after commit_timeout. WaitOwnPart lets
// the ranks wait for their own parts (not for rank 0's commit) before they agree.
//
// A committed checkpoint is never modified; it disappears only by retention (renamed out
// of view to tmp-deleting-step-N first). Killing any rank at any point leaves at most
// tmp-* entries, removed when rank 0's next writer starts or after its next save.
//
// What each rank saves: chunks are ranges of each named buffer's flat index space, so any
// split works and any split can be loaded (checkpoint/reader.h). ZeRO off, where every rank
// holds everything: pass SaveSlice(elements, rank, world) of each buffer, so the ranks
// share the work. ZeRO-1: each rank's optimizer range of the moments, and the same range
// of the parameters. ZeRO-2/3, where a rank holds a piece of every wrapping unit back to
// back in its shard buffer (state::PlacedRange): one BufferShard per piece, the same name
// given once per piece, each with its flat range and its data (local offsets [at, at +
// size) of the shard buffer); each piece becomes a chunk of its own in the shard file:
//   for (const state::PlacedRange& p : pieces)
//     req.buffers.push_back({"params", n, p.range, shard.subspan(p.at, p.range.size())});
// A rank's pieces of one name must be disjoint and agree on `elements` (INVALID_ARGUMENT
// naming the buffer and the two ranges, at once); empty ranges are allowed and save
// nothing. Every rank must pass the same buffer names (in the same order of first
// appearance) and sizes, and together the ranges of all ranks must cover each buffer
// exactly once (rank 0 checks: INVALID_ARGUMENT).
//
// Ranks must call SaveAsync / SaveSync for the same steps in the same order (like a
// collective), with the same on_busy policy; a skipped save is still a call. Saving a step
// that is committed already (a run killed between its commit and LATEST, resumed from the
// older LATEST) writes nothing: that checkpoint stays and LATEST names it.
//
// A save's outcome (Poll, Wait, SaveSync, stats().last_status) — training goes on either
// way, and a failed save leaves no step-N directory and LATEST as it was; rank 0 removes its
// temporary directory once every rank is done with it (all reported: at once; after a
// commit timeout: with the next save), and every tmp-* entry at Create:
//   RESOURCE_EXHAUSTED  a full disk (this rank's or, on rank 0, another rank's: "rank 2: ...");
//   DEADLINE_EXCEEDED   rank 0 waited commit_timeout for ranks' reports (they are named);
//   UNAVAILABLE         some rank skipped this save (OnBusy::kSkip): counted as skipped;
//   INVALID_ARGUMENT    the ranks' ranges do not tile a buffer, or their buffers differ;
//   CANCELLED           the writer was destroyed; other Env errors as they come.
// A checkpoint is committed but the save still fails when LATEST cannot be replaced (it
// then names the previous checkpoint until the next save).
//
// Thread-safety: SaveAsync, BeginSave, FinishSnapshot, SaveSync, Wait and WaitIdle from one
// thread (the training thread); Poll and stats from any thread.
#ifndef RINGMASTER_CHECKPOINT_WRITER_H_
#define RINGMASTER_CHECKPOINT_WRITER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "checkpoint/manifest.h"
#include "common/clock.h"
#include "common/env.h"
#include "state/range.h"
#include "state/tensor.h"

namespace ringmaster::checkpoint {

struct RetentionPolicy {
  int keep_last = 3;       // >= 1: the newest keep_last checkpoints stay
  int64_t keep_every = 0;  // > 0: so does every checkpoint whose step is a multiple of it
};

// What a save does when the previous one is still being written.
enum class OnBusy {
  kWait,  // block until it is done (and tidied up), then snapshot
  kSkip,  // return kSkipped at once (counted in stats().skipped)
};

struct CheckpointWriterOptions {
  std::string root;  // checkpoint.dir, shared by every rank
  std::string job;   // checkpoints go to <root>/<job>/
  int rank = 0;
  int world_size = 1;
  // Recorded in the manifest (rank 0's values count).
  int zero_stage = 0;
  uint64_t spec_hash = 0;  // spec::TrainingSpecHash of the job
  std::string training_spec;  // spec::TrainingSpecText of the job (Manifest.training_spec)
  // The model's tensors, recorded in the manifest; null records none. Copied at Create.
  const state::TensorTable* table = nullptr;

  RetentionPolicy retention;
  OnBusy on_busy = OnBusy::kWait;
  // Checksummed block size of each buffer's chunks; a reader reads whole blocks, so it
  // bounds the excess read at each end of a wanted range. 0: per buffer, its size / 4096
  // rounded down to a power of two, within [1 KiB, 1 MiB]: a rank loading 1/M of a buffer
  // reads at most 2 blocks more than it needs, within 5 % up to M = 100 for buffers of
  // 4 MiB and more (smaller ones: at most 2 KiB more per range). Otherwise a multiple of 4.
  int64_t block_bytes = 0;
  // Bytes per pwrite, rounded up to a multiple of 4096 (the shard is written with direct
  // I/O where the filesystem has it: common/env.h FileOptions).
  int64_t write_bytes = 8 << 20;
  // Rank 0 waits this long (on `clock`) for the other ranks' reports, checking every
  // poll_interval.
  absl::Duration commit_timeout = absl::Minutes(5);
  absl::Duration poll_interval = absl::Milliseconds(10);
  // Staging bytes to allocate and touch at Create, so that the first snapshot does not
  // pay for page faults; 0: allocate on the first save. It grows when a save needs more.
  int64_t staging_reserve_bytes = 0;
  // Ask for transparent huge pages for the staging area (madvise; where THP is off, this
  // changes nothing). The shard is written from it with O_DIRECT, in fewer and larger
  // device requests so (see EnsureStaging).
  bool huge_pages = true;
  // Threads copying a snapshot (the caller's and helpers), for snapshots of 16 MiB and more
  // per thread: the copy is memory-bound and the caller waits for it anyway.
  int snapshot_threads = 2;

  Env* env = Env::Default();     // not owned
  Clock* clock = Clock::Real();  // not owned: commit deadline, poll sleeps, timestamps
};

// This rank's part of one named flat buffer, or one piece of that part (a name may come
// once per piece: see "What each rank saves" above).
struct BufferShard {
  std::string name;              // "params", "momentum", "exp_avg", "exp_avg_sq", ...
  int64_t elements = 0;          // the whole buffer's flat size, the same on every rank
  state::FlatRange range;        // the flat indices this rank saves (in this piece)
  absl::Span<const float> data;  // range.size() floats; read only during the snapshot
};

struct SaveRequest {
  int64_t step = 0;  // >= 0
  std::vector<BufferShard> buffers;
  TrainingState state;  // rank 0's is recorded
};

enum class SaveOutcome {
  kStarted,  // snapshot taken; the write goes on in the background
  kSkipped,  // OnBusy::kSkip and the previous save was still running
};

// A save that failed by a rank's own doing (WriterStats::recent_own_failures).
struct SaveFailure {
  int64_t step = -1;
  absl::Status status;  // as it came (no "checkpoint step N (rank r)" prefix)
};

// A checkpoint rank 0 committed (WriterStats::recent_commits).
struct CommittedSave {
  int64_t step = -1;
  int64_t bytes = 0;  // its shard files together
  absl::Time time;    // as its manifest records it
  // From BeginSave (waiting for the previous save included) to the commit, and how long
  // the caller was blocked by it (WriterStats::last_blocked_time).
  absl::Duration save_time;
  absl::Duration blocked_time;
};

struct WriterStats {
  int64_t started = 0;
  // Saves finished OK: on rank 0, checkpoints committed (or found committed already); on
  // other ranks, shards written and reported.
  int64_t succeeded = 0;
  int64_t failed = 0;
  int64_t skipped = 0;
  absl::Status last_status;            // of the last finished save
  int64_t last_step = -1;              // of the last finished save
  absl::Status last_failure;           // of the last save that failed (OK: none has)
  int64_t last_failed_step = -1;       // of the last save that failed
  int64_t last_committed_step = -1;    // rank 0
  int64_t last_committed_bytes = 0;    // rank 0: its shard files' bytes together
  absl::Time last_committed_time;      // rank 0: as its manifest records it
  // Rank 0: the last kRecentCommits checkpoints committed (or found committed), oldest
  // first, for a caller that tells others of each commit and looks once a step.
  std::vector<CommittedSave> recent_commits;
  // Saves that failed by this rank's own doing: its shard or report (any rank), or on rank
  // 0 its shard, collecting the reports (a commit timeout) or the commit. A failure that
  // another rank reported (by file or ReportPeerFailure) or a skip is that rank's, not
  // counted here: summed over the ranks, every failed save is counted once or more.
  int64_t own_failures = 0;
  std::vector<SaveFailure> recent_own_failures;  // the last kRecentOwnFailures, oldest first
  absl::Duration last_blocked_time;    // how long the last SaveAsync (or BeginSave and
                                       // FinishSnapshot together) blocked its caller
  absl::Duration last_snapshot_time;   // copying into the staging area (on either thread)
  absl::Duration last_write_time;      // from the end of the snapshot until finished, of which:
  absl::Duration last_shard_time;      //   until this rank's shard was durable
  absl::Duration last_commit_time;     //   rank 0: then until LATEST named it (waiting for the
                                       //   other ranks included): durable and visible
  absl::Duration last_retention_time;  // rank 0: removing old checkpoints after the last save
  int64_t last_shard_bytes = 0;
  int64_t staging_bytes = 0;        // allocated
  int64_t deleted_checkpoints = 0;  // by retention (rank 0)
  absl::Status retention_status;    // of the last retention pass; a failure there does not
                                    // fail the save
};

class CheckpointWriter {
 public:
  // WriterStats::recent_own_failures keeps this many. A rank finishes at most one save
  // between two steps' boundaries and begins at most one, so two cover what a rank must
  // tell the others at each boundary.
  static constexpr int kRecentOwnFailures = 2;
  static constexpr int kRecentCommits = 2;  // (likewise)

  // Creates <root>/<job>/ (and <root>) if needed. Rank 0 also removes every tmp-* entry
  // left by earlier writers: call Create on rank 0 before any rank starts saving (e.g.
  // before the step loop's first collective).
  // INVALID_ARGUMENT for bad options (naming the field); RESOURCE_EXHAUSTED (permanent) when
  // staging_reserve_bytes cannot be had; the Env's errors.
  static absl::StatusOr<std::unique_ptr<CheckpointWriter>> Create(
      const CheckpointWriterOptions& options);

  // Cancels a running save (it stops within one pwrite or poll; it is not committed and its
  // temporary directory is removed by a later writer), lets a running tidy-up finish, and
  // joins the thread. Call Wait first to let a save finish.
  ~CheckpointWriter();

  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Takes the snapshot and starts writing in the background. Blocks for the copy, and with
  // OnBusy::kWait also until the previous save and its tidy-up are done. The request's spans may be
  // modified as soon as it returns. INVALID_ARGUMENT for a bad request (naming the buffer:
  // a range outside it, data of another size, pieces of one name that overlap or disagree on
  // its elements); nothing is started then. The save's own outcome comes from Poll / Wait.
  absl::StatusOr<SaveOutcome> SaveAsync(const SaveRequest& request);

  // SaveAsync in two halves, so that the copy overlaps work that only reads the buffers
  // (the next step's forward and backward read the parameters; only the optimizer writes
  // them and the moments): BeginSave returns at once (with OnBusy::kWait, once the previous
  // save is done) and the background thread copies the snapshot; FinishSnapshot blocks
  // until the copy is done. Between the two the request's buffers must not be modified;
  // call FinishSnapshot before the next optimizer step. Every BeginSave that returns
  // kStarted needs its FinishSnapshot before the next BeginSave or SaveAsync.
  absl::StatusOr<SaveOutcome> BeginSave(const SaveRequest& request);
  void FinishSnapshot();

  // The drain save: waits for a running save (and tidy-up), snapshots, writes and (rank 0)
  // commits, all by `deadline`; retention runs after it returns. Returns the save's status, or
  // DEADLINE_EXCEEDED (the save goes on in the background; Wait or the destructor ends it).
  absl::Status SaveSync(const SaveRequest& request, absl::Time deadline);
  // SaveSync's first half: waits by `deadline` until nothing runs (a save, its tidy-up),
  // then starts this save (SaveAsync; whatever the OnBusy policy, it is not skipped). Then
  // the ranks may agree on their parts (WaitOwnPart) before rank 0 Waits for the commit.
  absl::Status SaveWhenIdle(const SaveRequest& request, absl::Time deadline);

  // Blocks until the last save is finished (on rank 0: committed and named by LATEST, or
  // failed) or `deadline` (real time) passes. Returns the status of the last finished save
  // (OK when there was none), or DEADLINE_EXCEEDED. Retention may still be running.
  absl::Status Wait(absl::Time deadline);

  // Blocks until the background thread has nothing left to do: the last save finished and
  // its tidy-up (retention, removal of temporaries) done, e.g. before the process exits.
  // Returns the last save's status, or DEADLINE_EXCEEDED.
  absl::Status WaitIdle(absl::Time deadline);

  // Blocks until this rank's own part of the last save is done: on rank 0 its shard
  // written (the commit may still wait for the other ranks), on the others their shard and
  // report. Returns that part's status (OK when no save ran), or DEADLINE_EXCEEDED at
  // `deadline` (real time).
  absl::Status WaitOwnPart(absl::Time deadline);

  // Rank 0: rank `rank` failed its part of the save of `step` with `status` (the ranks told
  // each other, e.g. over their communicator, because it could write neither its report
  // nor a marker). The commit of that save stops waiting for that rank and fails with
  // "rank <rank>: <status>". Ignored for a save of another step; on other ranks, ignored.
  // Thread-safe.
  void ReportPeerFailure(int rank, int64_t step, const absl::Status& status);

  // nullopt while a save is running; otherwise the status of the last finished save.
  std::optional<absl::Status> Poll() const;

  WriterStats stats() const;
  const std::string& job_dir() const { return job_dir_; }

 private:
  struct Layout {  // where one buffer's range lies in the staging area and the shard
    std::string name;
    int64_t elements = 0;
    state::FlatRange range;
    int64_t offset = 0;  // bytes
    int64_t block_bytes = 0;
  };
  // A snapshot being copied into the staging area in chunks that any thread may take:
  // the writer's thread (BeginSave), the caller (SaveAsync, FinishSnapshot) and helpers.
  struct SnapshotCopy {
    std::vector<BufferShard> sources;
    std::vector<int64_t> offsets;  // where each source starts in the staging area
    int64_t bytes = 0;
    int64_t chunks = 0;
    absl::Time start;
    std::atomic<int64_t> next{0};  // the next chunk to take
    std::atomic<int64_t> left{0};  // chunks not copied yet
  };
  struct Job {  // one save, for the background thread
    int64_t step = 0;
    int64_t save = 0;
    std::vector<Layout> layout;
    std::shared_ptr<SnapshotCopy> copy;  // BeginSave's, still to copy; null once copied
    int64_t bytes = 0;
    TrainingState state;
    absl::Time begun;  // BeginSave was called
  };
  struct Staging {  // unmaps the staging area (see EnsureStaging)
    void operator()(char* p) const;
    size_t bytes;  // (no initializer: the enclosing class must be complete for that)
  };

  explicit CheckpointWriter(const CheckpointWriterOptions& options);
  absl::Status CleanUpAtStart();
  absl::Status CheckRequest(const SaveRequest& request) const;
  // RESOURCE_EXHAUSTED, marked permanent, when the memory cannot be mapped.
  absl::Status EnsureStaging(int64_t bytes);
  enum class CopyOn { kCaller, kBackground };
  absl::StatusOr<SaveOutcome> BeginSave(const SaveRequest& request, CopyOn copy_on);
  // Lays the request out in the staging area (allocating it), without copying.
  absl::Status Plan(const SaveRequest& request, Job* job);
  // The copy of a request's buffers into the staging area, as laid out in `job`.
  std::shared_ptr<SnapshotCopy> PlanCopy(const SaveRequest& request, const Job& job) const;
  // Copies chunks of `copy` until none is left to take. Whoever copies the last chunk
  // clears copying_ and records the snapshot time.
  void CopyChunks(SnapshotCopy& copy);
  absl::Status WriteSkipReport(int64_t step, int64_t save);
  void Run(Job job);
  struct Tidy {                 // what rank 0 cleans up once a save is finished
    bool retention = false;     // a checkpoint was committed: apply the retention policy
    bool remove_dir = false;    // this save's directory
    bool remove_older = false;  // the temporaries of this save and the older ones
  };
  absl::Status Persist(const Job& job, Tidy* tidy);
  void TidyUp(const Job& job, const Tidy& tidy);
  absl::StatusOr<ShardReport> WriteShard(const Job& job, const std::string& dir);
  absl::StatusOr<std::vector<ShardReport>> CollectReports(const Job& job, const std::string& dir);
  absl::Status Commit(const Job& job, const std::string& dir,
                      const std::vector<ShardReport>& reports);
  void ApplyRetention(int64_t latest);
  void RemoveTemporariesBefore(int64_t save);
  bool cancelled() const;
  void Finish(const Job& job, absl::Status status, absl::Duration write_time);
  // This rank's own part of the save of `step` is done with `status` (WaitOwnPart).
  void FinishOwnPart(int64_t step, const absl::Status& status);
  void CountOwnFailure(int64_t step, const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets one duration of stats_ (the background thread, as it goes).
  void Record(absl::Duration WriterStats::*field, absl::Duration value);

  const CheckpointWriterOptions options_;
  const std::string job_dir_;
  std::vector<TensorEntry> tensors_;

  // Training thread only.
  std::unique_ptr<char[], Staging> staging_;
  int64_t staging_capacity_ = 0;
  int64_t next_save_ = 0;
  std::thread thread_;

  mutable absl::Mutex mu_;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;     // the thread has work: a save or its tidy-up
  bool saving_ ABSL_GUARDED_BY(mu_) = false;   // a save is not finished
  bool copying_ ABSL_GUARDED_BY(mu_) = false;  // BeginSave's snapshot is not copied yet
  bool own_part_done_ ABSL_GUARDED_BY(mu_) = true;  // of the running save (WaitOwnPart)
  absl::Status own_part_status_ ABSL_GUARDED_BY(mu_);
  // Rank 0: ReportPeerFailure's news, by rank: the step and the status.
  absl::flat_hash_map<int, SaveFailure> peer_failures_ ABSL_GUARDED_BY(mu_);
  // BeginSave's copy, until FinishSnapshot takes a hand in it.
  std::shared_ptr<SnapshotCopy> snapshot_ ABSL_GUARDED_BY(mu_);
  bool cancel_ ABSL_GUARDED_BY(mu_) = false;
  WriterStats stats_ ABSL_GUARDED_BY(mu_);
};

// [r·S, (r+1)·S) ∩ [0, elements) with S = ceil(elements / world) rounded up to
// train::kAlignElements: the slice of an unsharded buffer that rank r saves.
state::FlatRange SaveSlice(int64_t elements, int rank, int world_size);

// The checkpoints retention removes from `steps` (committed, any order) once `latest` is
// committed: of the steps up to `latest`, all but the newest keep_last, except `latest`
// and multiples of keep_every. Steps after `latest` (a future abandoned by resuming from
// an older step) are left alone. Ascending.
std::vector<int64_t> StepsToDelete(std::vector<int64_t> steps, int64_t latest,
                                   const RetentionPolicy& policy);

}  // namespace ringmaster::checkpoint

#endif  // RINGMASTER_CHECKPOINT_WRITER_H_
