#include "checkpoint/writer.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "checkpoint/inspect.h"
#include "checkpoint/layout.h"
#include "checkpoint/reader.h"
#include "checkpoint/testing.h"
#include "common/clock.h"
#include "common/fault_injection_env.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster::checkpoint {
namespace {

using testing::FreshDir;
using ::testing::HasSubstr;

constexpr int64_t kElements = 64 << 10;  // 256 KiB of params

std::vector<std::string> Children(const std::string& dir) {
  absl::StatusOr<std::vector<std::string>> names = Env::Default()->GetChildren(dir);
  EXPECT_TRUE(names.ok()) << names.status();
  std::vector<std::string> sorted = names.value_or(std::vector<std::string>{});
  std::sort(sorted.begin(), sorted.end());
  return sorted;
}

std::vector<std::string> Temporaries(const std::string& dir) {
  std::vector<std::string> tmp;
  for (const std::string& name : Children(dir)) {
    if (absl::StartsWith(name, kTempPrefix)) tmp.push_back(name);
  }
  return tmp;
}

std::vector<float> Data(int64_t step) {
  return testing::PatternBuffer("params", step, kElements, kElements);
}

// A whole buffer "params" saved by one rank, or rank `rank`'s SaveSlice of it.
SaveRequest Request(int64_t step, const std::vector<float>& data, int rank = 0, int world = 1) {
  SaveRequest request;
  request.step = step;
  request.state = testing::PatternState(step);
  state::FlatRange range = SaveSlice(kElements, rank, world);
  request.buffers.push_back(
      {"params", kElements, range, absl::MakeConstSpan(data).subspan(range.begin, range.size())});
  return request;
}

CheckpointWriterOptions Options(const std::string& root, int rank = 0, int world = 1) {
  CheckpointWriterOptions o;
  o.root = root;
  o.job = "job";
  o.rank = rank;
  o.world_size = world;
  o.poll_interval = absl::Milliseconds(1);
  return o;
}

std::unique_ptr<CheckpointWriter> MustCreate(const CheckpointWriterOptions& options) {
  absl::StatusOr<std::unique_ptr<CheckpointWriter>> w = CheckpointWriter::Create(options);
  EXPECT_TRUE(w.ok()) << w.status();
  return w.ok() ? *std::move(w) : nullptr;
}

// The params of `step` as LATEST (or `step`) holds them; the step loaded.
absl::StatusOr<int64_t> LoadParams(const std::string& root, std::vector<float>* out,
                                   std::optional<int64_t> step = std::nullopt) {
  out->assign(kElements, 0.0f);
  LoadOptions load;
  load.root = root;
  load.job = "job";
  load.step = step;
  RM_ASSIGN_OR_RETURN(LoadResult r,
                      LoadCheckpoint(load, {{"params", {0, kElements}, absl::MakeSpan(*out)}}));
  return r.checkpoint.manifest.step();
}

// Blocks the operations it matches until Open(): a disk that stops.
class Gate {
 public:
  explicit Gate(std::function<bool(const FileOp&)> match) : match_(std::move(match)) {}
  FileOpHook Hook() {
    return [this](const FileOp& op) {
      if (match_(op)) {
        if (!entered_.HasBeenNotified()) entered_.Notify();
        open_.WaitForNotification();
      }
      return absl::OkStatus();
    };
  }
  void WaitEntered() { entered_.WaitForNotification(); }
  void Open() { open_.Notify(); }

 private:
  std::function<bool(const FileOp&)> match_;
  absl::Notification entered_;
  absl::Notification open_;
};

// Writers for ranks 0 and 1 of 2 (rank 0's created first); rank 1's on `rank1_env`.
std::vector<std::unique_ptr<CheckpointWriter>> TwoRanks(const std::string& root, Env* rank1_env) {
  std::vector<std::unique_ptr<CheckpointWriter>> writers;
  writers.push_back(MustCreate(Options(root, 0, 2)));
  CheckpointWriterOptions o = Options(root, 1, 2);
  o.env = rank1_env;
  writers.push_back(MustCreate(o));
  return writers;
}

// Saves with two writers at once (SaveSync); the statuses of ranks 0 and 1.
std::pair<absl::Status, absl::Status> SaveBoth(
    const std::vector<std::unique_ptr<CheckpointWriter>>& writers, const SaveRequest& rank0,
    const SaveRequest& rank1) {
  absl::Status status1;
  std::thread other([&] { status1 = writers[1]->SaveSync(rank1, absl::InfiniteFuture()); });
  absl::Status status0 = writers[0]->SaveSync(rank0, absl::InfiniteFuture());
  other.join();
  return {status0, status1};
}

bool IsShardWrite(const FileOp& op, absl::string_view shard) {
  return op.kind == FileOp::Kind::kPWrite && absl::StrContains(op.path, shard);
}

// Three ranks saving `table` under `root` at `zero_stage` (in `units` pieces when > 0).
testing::WorldOptions ThreeRanks(const std::string& root, const state::TensorTable& table,
                                 int zero_stage, int units = 0) {
  testing::WorldOptions world;
  world.root = root;
  world.table = &table;
  world.world = 3;
  world.zero_stage = zero_stage;
  world.units = units;
  world.base.poll_interval = absl::Milliseconds(1);
  return world;
}

TEST(CheckpointWriter, CommittedDirectoryHoldsTheShardsAndTheManifestOnly) {
  const std::string root = FreshDir("writer-layout");
  const state::TensorTable table = testing::TestTable(1);
  const testing::WorldOptions world = ThreeRanks(root, table, /*zero_stage=*/1);
  for (const absl::Status& s : testing::SaveWorld(world, 12)) ASSERT_TRUE(s.ok()) << s;

  const std::string job_dir = JobDir(root, "job");
  EXPECT_EQ(Children(job_dir), (std::vector<std::string>{"LATEST", "step-12"}));
  EXPECT_EQ(*ReadFileToString(Env::Default(), JoinPath(job_dir, "LATEST")), "step-12\n");
  EXPECT_EQ(Children(JoinPath(job_dir, "step-12")),
            (std::vector<std::string>{"MANIFEST", "manifest.json", "shard-0-of-3.bin",
                                      "shard-1-of-3.bin", "shard-2-of-3.bin"}));
  absl::StatusOr<Manifest> m = ReadManifest(Env::Default(), JoinPath(job_dir, "step-12"));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->job(), "job");
  EXPECT_EQ(m->step(), 12);
  EXPECT_EQ(m->world_size(), 3);
  EXPECT_EQ(m->zero_stage(), 1);
  EXPECT_EQ(m->spec_hash(), world.spec_hash);
  EXPECT_EQ(m->tensors_size(), table.size());
  EXPECT_TRUE(CheckTensorTable(*m, table).ok());
  EXPECT_EQ(FromProto(m->training()), testing::PatternState(12));
  EXPECT_EQ(m->chunks_size(), 3 * 3);  // 3 buffers x 3 ranks
  absl::StatusOr<VerifyReport> v = VerifyCheckpoint(Env::Default(), JoinPath(job_dir, "step-12"));
  EXPECT_TRUE(v.ok()) << v.status();
}

// Under ZeRO-2/3 a rank gives each buffer's name once per piece it holds: each piece is a
// chunk of its own in the rank's shard (the manifest lists them in flat order, `ringctl
// checkpoint inspect` counts them), the buffers are listed once, and it verifies and loads.
TEST(CheckpointWriter, ARankSavesEachPieceOfABufferAsAChunkOfItsOwn) {
  const std::string root = FreshDir("writer-pieces");
  const state::TensorTable table = testing::TestTable(1);
  const testing::WorldOptions world = ThreeRanks(root, table, /*zero_stage=*/3, /*units=*/4);
  for (const absl::Status& s : testing::SaveWorld(world, 12)) ASSERT_TRUE(s.ok()) << s;

  const std::string dir = JoinPath(JobDir(root, "job"), "step-12");
  EXPECT_EQ(Children(dir), (std::vector<std::string>{"MANIFEST", "manifest.json",
                                                     "shard-0-of-3.bin", "shard-1-of-3.bin",
                                                     "shard-2-of-3.bin"}));
  absl::StatusOr<Manifest> m = ReadManifest(Env::Default(), dir);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->buffers_size(), 3);
  for (int b = 0; b < 3; ++b) EXPECT_EQ(m->buffers(b).name(), testing::kBuffers[b]);
  ASSERT_EQ(m->chunks_size(), 3 * 4 * 3);  // 3 buffers x 4 units x 3 ranks
  const int64_t elements = testing::PaddedElements(table, 3);
  for (int c = 0; c < m->chunks_size(); ++c) {
    const ChunkEntry& chunk = m->chunks(c);
    const int b = c / 12, unit = c % 12 / 3, rank = c % 3;
    const state::FlatRange piece = testing::UnitPieces(elements, 4, rank, 3)[unit];
    EXPECT_EQ(chunk.buffer(), testing::kBuffers[b]) << c;
    EXPECT_EQ(chunk.rank(), rank) << c;
    EXPECT_EQ(chunk.begin(), piece.begin) << c;
    EXPECT_EQ(chunk.end(), piece.end) << c;
    // The request lists every buffer's piece u before any buffer's piece u + 1.
    int64_t offset = 0;
    for (int u = 0; u <= unit; ++u) {
      for (int other = 0; other < (u < unit ? 3 : b); ++other) {
        offset += testing::UnitPieces(elements, 4, rank, 3)[u].size() * 4;
      }
    }
    EXPECT_EQ(chunk.offset(), offset) << c;
  }
  EXPECT_THAT(DescribeManifest(*m), HasSubstr("in 12 chunks"));
  absl::StatusOr<VerifyReport> v = VerifyCheckpoint(Env::Default(), dir);
  EXPECT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->bytes, 3 * elements * 4);
}

// A rank's pieces of one buffer that overlap, or disagree on its size, are refused at once,
// naming the buffer and the ranges; empty pieces are allowed anywhere.
TEST(CheckpointWriter, PiecesOfOneBufferMustBeDisjointAndAgreeOnItsSize) {
  const std::string root = FreshDir("writer-overlap");
  std::unique_ptr<CheckpointWriter> writer = MustCreate(Options(root));
  const std::vector<float> data = Data(1);
  auto piece = [&](const std::string& name, int64_t begin, int64_t end,
                   int64_t elements = kElements) {
    return BufferShard{name, elements, {begin, end},
                       absl::MakeConstSpan(data).subspan(begin, end - begin)};
  };
  SaveRequest request;
  request.step = 1;
  request.buffers = {piece("params", 0, 64), piece("exp_avg", 0, 64),
                     piece("params", 4096, 8192), piece("params", 1000, 4100)};
  absl::Status s = writer->SaveAsync(request).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("SaveRequest buffer \"params\": ranges [1000, 4100) and [4096, 8192) "
                        "overlap"));
  // Not next to each other in flat order either: [0, 5000) reaches over [1000, 2000).
  request.buffers = {piece("params", 0, 5000), piece("params", 6000, 7000),
                     piece("params", 1000, 2000)};
  s = writer->SaveAsync(request).status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("ranges [0, 5000) and [1000, 2000) overlap"));
  request.buffers = {piece("params", 0, 64), piece("params", 64, 128, kElements - 16)};
  s = writer->SaveAsync(request).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("\"params\": elements 65520 in the piece "
                                                  "[64, 128), 65536 in an earlier piece"));
  EXPECT_EQ(writer->stats().started, 0);

  // Disjoint pieces, out of flat order, empty ones among them (at the same place too), and
  // together the whole buffer: saved, and loaded back whole.
  request.buffers = {piece("params", 32768, kElements), piece("params", 100, 100),
                     piece("params", 0, 100),           piece("params", 100, 100),
                     piece("params", 100, 32768)};
  ASSERT_TRUE(writer->SaveSync(request, absl::InfiniteFuture()).ok());
  std::vector<float> loaded;
  EXPECT_EQ(LoadParams(root, &loaded).value_or(-1), 1);
  EXPECT_EQ(loaded, data);
  absl::StatusOr<Manifest> m = ReadManifest(Env::Default(), JoinPath(JobDir(root, "job"), "step-1"));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->buffers_size(), 1);
  EXPECT_EQ(m->chunks_size(), 3);
}

// The pieces of two ranks must still tile each buffer together: a gap left between them is
// refused at the commit.
TEST(CheckpointWriter, PiecesOfRanksThatLeaveAGapAreRefused) {
  const std::string root = FreshDir("writer-pieces-gap");
  std::vector<std::unique_ptr<CheckpointWriter>> writers = TwoRanks(root, Env::Default());
  const std::vector<float> data = Data(1);
  auto request = [&](std::vector<state::FlatRange> ranges) {
    SaveRequest r;
    r.step = 1;
    for (state::FlatRange range : ranges) {
      r.buffers.push_back({"params", kElements, range,
                           absl::MakeConstSpan(data).subspan(range.begin, range.size())});
    }
    return r;
  };
  auto [s, s1] = SaveBoth(writers, request({{0, 16}, {32, 48}}),
                          request({{16, 32}, {64, kElements}}));
  EXPECT_TRUE(s1.ok()) << s1;
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("buffer params: elements [48, 64) are in no chunk"));
  writers.clear();
  EXPECT_TRUE(Children(JobDir(root, "job")).empty());
}

// The fake slow disk: every pwrite of the shard waits for the gate. SaveAsync returns while
// the write is stuck, so it blocked only for the snapshot; the snapshot is a copy, so the
// caller may change its buffers at once.
TEST(CheckpointWriter, AsyncSaveBlocksOnlyForTheSnapshot) {
  const std::string root = FreshDir("writer-async");
  Gate gate([](const FileOp& op) { return IsShardWrite(op, "shard-0"); });
  FaultInjectionEnv env(Env::Default(), gate.Hook());
  CheckpointWriterOptions o = Options(root);
  o.env = &env;
  o.on_busy = OnBusy::kSkip;
  std::unique_ptr<CheckpointWriter> writer = MustCreate(o);

  std::vector<float> data = Data(1);
  absl::StatusOr<SaveOutcome> started = writer->SaveAsync(Request(1, data));
  ASSERT_TRUE(started.ok()) << started.status();
  EXPECT_EQ(*started, SaveOutcome::kStarted);
  gate.WaitEntered();  // the background thread is inside its first pwrite, stuck
  EXPECT_EQ(writer->Poll(), std::nullopt);
  EXPECT_EQ(writer->Wait(absl::Now() + absl::Milliseconds(20)).code(),
            absl::StatusCode::kDeadlineExceeded);
  std::fill(data.begin(), data.end(), -1.0f);  // training goes on and changes the params
  started = writer->SaveAsync(Request(2, data));
  ASSERT_TRUE(started.ok());
  EXPECT_EQ(*started, SaveOutcome::kSkipped);
  EXPECT_EQ(writer->stats().skipped, 1);
  EXPECT_EQ(writer->stats().started, 1);

  gate.Open();
  EXPECT_TRUE(writer->Wait(absl::InfiniteFuture()).ok());
  EXPECT_EQ(writer->Poll(), absl::OkStatus());
  std::vector<float> loaded;
  ASSERT_EQ(LoadParams(root, &loaded).value_or(-1), 1);
  EXPECT_EQ(loaded, Data(1));
  WriterStats stats = writer->stats();
  EXPECT_EQ(stats.succeeded, 1);
  EXPECT_EQ(stats.last_committed_step, 1);
  EXPECT_EQ(stats.last_shard_bytes, kElements * 4);
  EXPECT_GE(stats.staging_bytes, kElements * 4);
}

// BeginSave: the background thread copies; FinishSnapshot waits for the copy only, not for
// the disk; then the buffers may change.
TEST(CheckpointWriter, BeginSaveCopiesInTheBackgroundAndFinishSnapshotWaitsForTheCopyOnly) {
  const std::string root = FreshDir("writer-begin");
  Gate gate([](const FileOp& op) { return IsShardWrite(op, "shard-0"); });
  FaultInjectionEnv env(Env::Default(), gate.Hook());
  CheckpointWriterOptions o = Options(root);
  o.env = &env;
  std::unique_ptr<CheckpointWriter> writer = MustCreate(o);
  std::vector<float> data = Data(1);
  ASSERT_EQ(*writer->BeginSave(Request(1, data)), SaveOutcome::kStarted);
  writer->FinishSnapshot();
  std::fill(data.begin(), data.end(), -1.0f);  // the optimizer step
  gate.WaitEntered();                          // the write is stuck, the copy is done
  EXPECT_EQ(writer->Poll(), std::nullopt);
  gate.Open();
  EXPECT_TRUE(writer->Wait(absl::InfiniteFuture()).ok());
  std::vector<float> loaded;
  ASSERT_EQ(LoadParams(root, &loaded).value_or(-1), 1);
  EXPECT_EQ(loaded, Data(1));
  writer->FinishSnapshot();  // nothing pending: returns
}

// A snapshot of several chunks, buffer boundaries inside chunks: the writer's thread and
// FinishSnapshot (called at once, so both take chunks) copy it together, with and without
// huge pages for the staging area; every byte arrives.
TEST(CheckpointWriter, FinishSnapshotSharesTheCopyOfALargeSnapshot) {
  const std::vector<std::pair<std::string, int64_t>> shapes = {
      {"params", 1234567}, {"exp_avg", 3000001}, {"exp_avg_sq", 777777}};  // ~19 MiB
  for (bool huge : {true, false}) {
    const std::string root = FreshDir(absl::StrCat("writer-chunks-", huge));
    CheckpointWriterOptions o = Options(root);
    o.huge_pages = huge;
    std::unique_ptr<CheckpointWriter> writer = MustCreate(o);
    std::vector<std::vector<float>> data;
    SaveRequest request;
    request.step = 1;
    request.state = testing::PatternState(1);
    for (const auto& [name, elements] : shapes) {
      data.push_back(testing::PatternBuffer(name, 1, elements, elements));
    }
    for (size_t i = 0; i < shapes.size(); ++i) {
      request.buffers.push_back(
          {shapes[i].first, shapes[i].second, {0, shapes[i].second}, absl::MakeConstSpan(data[i])});
    }
    ASSERT_EQ(*writer->BeginSave(request), SaveOutcome::kStarted);
    writer->FinishSnapshot();
    for (std::vector<float>& d : data) std::fill(d.begin(), d.end(), -1.0f);
    ASSERT_TRUE(writer->Wait(absl::InfiniteFuture()).ok());
    EXPECT_GE(writer->stats().staging_bytes, 5 * 1000 * 1000 * 4);
    std::vector<std::vector<float>> loaded;
    std::vector<LoadTarget> targets;
    for (const auto& [name, elements] : shapes) loaded.emplace_back(elements, 0.0f);
    for (size_t i = 0; i < shapes.size(); ++i) {
      targets.push_back({shapes[i].first, {0, shapes[i].second}, absl::MakeSpan(loaded[i])});
    }
    LoadOptions load;
    load.root = root;
    load.job = "job";
    ASSERT_TRUE(LoadCheckpoint(load, targets).ok());
    for (size_t i = 0; i < shapes.size(); ++i) {
      EXPECT_EQ(loaded[i], testing::PatternBuffer(shapes[i].first, 1, shapes[i].second,
                                                  shapes[i].second))
          << shapes[i].first << " huge_pages=" << huge;
    }
  }
}

// A rank whose slice is empty (a buffer smaller than one alignment unit, two ranks) has
// nothing to copy: BeginSave and FinishSnapshot return, and the save commits.
TEST(CheckpointWriter, AnEmptySnapshotNeitherBlocksNorFails) {
  const std::string root = FreshDir("writer-empty-slice");
  constexpr int64_t kTiny = 10;
  ASSERT_EQ(SaveSlice(kTiny, 1, 2).size(), 0);
  const std::vector<float> tiny = testing::PatternBuffer("params", 1, kTiny, kTiny);
  std::vector<std::unique_ptr<CheckpointWriter>> writers;
  for (int r = 0; r < 2; ++r) writers.push_back(MustCreate(Options(root, r, 2)));
  for (int r = 1; r >= 0; --r) {
    SaveRequest request;
    request.step = 1;
    request.state = testing::PatternState(1);
    const state::FlatRange range = SaveSlice(kTiny, r, 2);
    request.buffers.push_back({"params", kTiny, range,
                               absl::MakeConstSpan(tiny).subspan(range.begin, range.size())});
    ASSERT_EQ(*writers[r]->BeginSave(request), SaveOutcome::kStarted);
    writers[r]->FinishSnapshot();
  }
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(writers[r]->Wait(absl::InfiniteFuture()).ok()) << r;
  std::vector<float> loaded(kTiny);
  LoadOptions load;
  load.root = root;
  load.job = "job";
  ASSERT_TRUE(LoadCheckpoint(load, {{"params", {0, kTiny}, absl::MakeSpan(loaded)}}).ok());
  EXPECT_EQ(loaded, tiny);
}

TEST(CheckpointWriter, WaitPolicyBlocksTheNextSaveUntilThePreviousIsDone) {
  const std::string root = FreshDir("writer-wait");
  Gate gate([](const FileOp& op) { return IsShardWrite(op, "step-1-"); });
  FaultInjectionEnv env(Env::Default(), gate.Hook());
  CheckpointWriterOptions o = Options(root);
  o.env = &env;
  std::unique_ptr<CheckpointWriter> writer = MustCreate(o);
  const std::vector<float> one = Data(1), two = Data(2);
  ASSERT_TRUE(writer->SaveAsync(Request(1, one)).ok());
  gate.WaitEntered();
  std::atomic<bool> returned{false};
  std::thread second([&] {
    EXPECT_EQ(writer->SaveAsync(Request(2, two)).value_or(SaveOutcome::kSkipped),
              SaveOutcome::kStarted);
    returned = true;
  });
  // It cannot return while the first save is stuck (it may not have been called yet).
  EXPECT_FALSE(returned.load());
  gate.Open();
  second.join();
  EXPECT_TRUE(writer->Wait(absl::InfiniteFuture()).ok());
  EXPECT_EQ(writer->stats().succeeded, 2);
  std::vector<float> loaded;
  EXPECT_EQ(LoadParams(root, &loaded).value_or(-1), 2);
  EXPECT_EQ(loaded, two);
  EXPECT_EQ(LoadParams(root, &loaded, 1).value_or(-1), 1);
  EXPECT_EQ(loaded, one);
}

// A disk that fills up and is freed again.
struct FullDisk {
  std::atomic<bool> full{false};
  std::function<bool(const FileOp&)> where = [](const FileOp&) { return true; };
  FileOpHook Hook() {
    return [this](const FileOp& op) -> absl::Status {
      if (op.kind != FileOp::Kind::kPWrite || !full.load() || !where(op)) {
        return absl::OkStatus();
      }
      return ErrnoToStatus(ENOSPC, absl::StrCat("pwrite at offset ", op.offset, " of ", op.path));
    };
  }
};

TEST(CheckpointWriter, FullDiskFailsTheSaveLeavesNothingAndALaterSaveSucceeds) {
  // Wherever the disk fills: the shard, manifest.json, MANIFEST.
  for (const std::string where : {"shard-0", "manifest.json", "MANIFEST"}) {
    SCOPED_TRACE(where);
    const std::string root = FreshDir("writer-full");
    const std::string job_dir = JobDir(root, "job");
    FullDisk disk;
    disk.where = [where](const FileOp& op) { return absl::StrContains(op.path, where); };
    FaultInjectionEnv env(Env::Default(), disk.Hook());
    CheckpointWriterOptions o = Options(root);
    o.env = &env;
    std::unique_ptr<CheckpointWriter> writer = MustCreate(o);
    const std::vector<float> one = Data(1), two = Data(2), three = Data(3);
    ASSERT_TRUE(writer->SaveSync(Request(1, one), absl::InfiniteFuture()).ok());

    disk.full = true;
    ASSERT_EQ(*writer->SaveAsync(Request(2, two)), SaveOutcome::kStarted);  // training goes on
    absl::Status s = writer->Wait(absl::InfiniteFuture());
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("checkpoint step 2"));
    EXPECT_EQ(writer->stats().failed, 1);
    EXPECT_EQ(writer->stats().own_failures, 1);  // rank 0's shard or commit: its own
    EXPECT_EQ(*ListCommittedSteps(Env::Default(), job_dir), std::vector<int64_t>{1});
    std::vector<float> loaded;
    EXPECT_EQ(LoadParams(root, &loaded).value_or(-1), 1);

    disk.full = false;
    EXPECT_TRUE(writer->SaveSync(Request(3, three), absl::InfiniteFuture()).ok());
    // The last finished save is step 3's, OK; the last failure stays on record.
    const WriterStats stats = writer->stats();
    EXPECT_TRUE(stats.last_status.ok()) << stats.last_status;
    EXPECT_EQ(stats.last_step, 3);
    EXPECT_EQ(stats.last_failed_step, 2);
    EXPECT_EQ(stats.last_failure.code(), absl::StatusCode::kResourceExhausted)
        << stats.last_failure;
    EXPECT_EQ(LoadParams(root, &loaded).value_or(-1), 3);
    EXPECT_EQ(loaded, three);
    writer.reset();  // lets the tidy-up after the last save finish
    EXPECT_EQ(Children(job_dir), (std::vector<std::string>{"LATEST", "step-1", "step-3"}));
  }
}

// Another rank's full disk fails rank 0's commit with that rank's error, promptly (its
// report says so), and rank 0 removes the directory since every rank is done with it.
TEST(CheckpointWriter, AnotherRanksFullDiskFailsTheCommit) {
  const std::string root = FreshDir("writer-full-rank1");
  FaultInjectionEnv env(Env::Default(), DiskFullAfter(1000));
  std::vector<std::unique_ptr<CheckpointWriter>> writers = TwoRanks(root, &env);
  const std::vector<float> data = Data(4);
  auto [s, s1] = SaveBoth(writers, Request(4, data, 0, 2), Request(4, data, 1, 2));
  EXPECT_EQ(s1.code(), absl::StatusCode::kResourceExhausted) << s1;
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank 1"));
  writers.clear();  // lets rank 0's tidy-up finish
  EXPECT_TRUE(Children(JobDir(root, "job")).empty());
}

// A disk with room for rank 1's shard and none for its report: rank 1 leaves a marker and
// rank 0 fails the save at once with rank 1's code (it waited out commit_timeout before).
TEST(CheckpointWriter, ARankWhoseShardFitsButNotItsReportFailsTheCommitAtOnce) {
  const std::string root = FreshDir("writer-full-report");
  FaultInjectionEnv env(Env::Default(), [](const FileOp& op) -> absl::Status {
    if (op.kind != FileOp::Kind::kPWrite || !absl::StrContains(op.path, "report-1-of-2")) {
      return absl::OkStatus();
    }
    return ErrnoToStatus(ENOSPC, absl::StrCat("pwrite of ", op.path));
  });
  std::vector<std::unique_ptr<CheckpointWriter>> writers = TwoRanks(root, &env);
  const std::vector<float> data = Data(4);
  ASSERT_EQ(*writers[1]->SaveAsync(Request(4, data, 1, 2)), SaveOutcome::kStarted);
  ASSERT_EQ(*writers[0]->SaveAsync(Request(4, data, 0, 2)), SaveOutcome::kStarted);
  absl::Status s1 = writers[1]->Wait(absl::Now() + absl::Seconds(20));
  EXPECT_EQ(s1.code(), absl::StatusCode::kResourceExhausted) << s1;
  absl::Status s = writers[0]->Wait(absl::Now() + absl::Seconds(20));  // commit_timeout: 5 min
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank 1"));
  // The failure is rank 1's own, not rank 0's.
  EXPECT_EQ(writers[1]->stats().own_failures, 1);
  EXPECT_EQ(writers[0]->stats().own_failures, 0);
  EXPECT_EQ(writers[0]->stats().failed, 1);
  writers.clear();
  EXPECT_TRUE(Children(JobDir(root, "job")).empty());
}

// Rank 1 can write nothing at all, not even the marker: its trainer tells rank 0's
// (ReportPeerFailure, as the ranks' all-gather does), and the save fails at once with
// rank 1's own words, naming the cause and the file; the temporary directory goes.
TEST(CheckpointWriter, RankZeroStopsWaitingForARankThatReportedItsFailureOtherwise) {
  const std::string root = FreshDir("writer-full-told");
  FaultInjectionEnv env(Env::Default(), [](const FileOp& op) -> absl::Status {
    if (op.kind == FileOp::Kind::kPWrite ||
        (op.kind == FileOp::Kind::kOpenWrite && absl::StrContains(op.path, ".failed-"))) {
      return ErrnoToStatus(ENOSPC, absl::StrCat("pwrite of ", op.path));
    }
    return absl::OkStatus();
  });
  std::vector<std::unique_ptr<CheckpointWriter>> writers = TwoRanks(root, &env);
  const std::vector<float> data = Data(6);
  ASSERT_EQ(*writers[0]->SaveAsync(Request(6, data, 0, 2)), SaveOutcome::kStarted);
  ASSERT_EQ(*writers[1]->SaveAsync(Request(6, data, 1, 2)), SaveOutcome::kStarted);
  // Each rank's own part: rank 0's shard is written, rank 1's failed.
  EXPECT_TRUE(writers[0]->WaitOwnPart(absl::Now() + absl::Seconds(20)).ok());
  absl::Status part1 = writers[1]->WaitOwnPart(absl::Now() + absl::Seconds(20));
  EXPECT_EQ(part1.code(), absl::StatusCode::kResourceExhausted) << part1;
  EXPECT_EQ(writers[0]->Poll(), std::nullopt);  // rank 0 waits for rank 1's report
  const WriterStats stats1 = writers[1]->stats();
  ASSERT_EQ(stats1.own_failures, 1);
  ASSERT_EQ(stats1.recent_own_failures.size(), 1u);
  const SaveFailure& told = stats1.recent_own_failures[0];
  EXPECT_EQ(told.step, 6);
  writers[0]->ReportPeerFailure(1, 5, told.status);  // another save's news: ignored
  EXPECT_EQ(writers[0]->Wait(absl::Now() + absl::Milliseconds(100)).code(),
            absl::StatusCode::kDeadlineExceeded);
  writers[0]->ReportPeerFailure(1, told.step, told.status);
  absl::Status s = writers[0]->Wait(absl::Now() + absl::Seconds(20));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("checkpoint step 6 (rank 0): rank 1: pwrite of"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("shard-1-of-2.bin: No space left on device"));
  EXPECT_EQ(writers[0]->stats().own_failures, 0);
  ASSERT_TRUE(writers[0]->WaitIdle(absl::Now() + absl::Seconds(20)).code() ==
              absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(Temporaries(JobDir(root, "job")).empty());
}

// Staging memory that cannot be had is a named error, not a crash.
TEST(CheckpointWriter, StagingMemoryThatCannotBeMappedIsResourceExhausted) {
  CheckpointWriterOptions o = Options(FreshDir("writer-staging"));
  o.staging_reserve_bytes = int64_t{1} << 52;  // 4 PiB
  absl::Status s = CheckpointWriter::Create(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("staging memory"));
}

// The checkpoint is complete when only LATEST cannot be replaced: it stays (a committed
// checkpoint is never modified), LATEST names the previous one, and the save says why.
TEST(CheckpointWriter, FullDiskAtLatestKeepsTheOldLatest) {
  const std::string root = FreshDir("writer-full-latest");
  FullDisk disk;
  disk.where = [](const FileOp& op) { return absl::StrContains(op.path, "tmp-LATEST"); };
  FaultInjectionEnv env(Env::Default(), disk.Hook());
  CheckpointWriterOptions o = Options(root);
  o.env = &env;
  std::unique_ptr<CheckpointWriter> writer = MustCreate(o);
  const std::vector<float> one = Data(1), two = Data(2);
  ASSERT_TRUE(writer->SaveSync(Request(1, one), absl::InfiniteFuture()).ok());
  disk.full = true;
  EXPECT_EQ(writer->SaveSync(Request(2, two), absl::InfiniteFuture()).code(),
            absl::StatusCode::kResourceExhausted);
  std::vector<float> loaded;
  EXPECT_EQ(LoadParams(root, &loaded).value_or(-1), 1);
  EXPECT_TRUE(VerifyCheckpoint(Env::Default(), JoinPath(JobDir(root, "job"), "step-2")).ok());
  writer.reset();
  EXPECT_TRUE(Temporaries(JobDir(root, "job")).empty());
}

TEST(CheckpointWriter, RetentionKeepsTheLastKAndEveryMth) {
  const std::string root = FreshDir("writer-retention");
  CheckpointWriterOptions o = Options(root);
  o.retention = {.keep_last = 2, .keep_every = 4};
  std::unique_ptr<CheckpointWriter> writer = MustCreate(o);
  const std::vector<float> data = Data(0);
  for (int64_t step = 1; step <= 10; ++step) {
    ASSERT_TRUE(writer->SaveSync(Request(step, data), absl::InfiniteFuture()).ok()) << step;
  }
  EXPECT_TRUE(writer->WaitIdle(absl::InfiniteFuture()).ok());  // the last retention pass
  EXPECT_EQ(writer->stats().deleted_checkpoints, 6);
  EXPECT_TRUE(writer->stats().retention_status.ok());
  EXPECT_EQ(Children(JobDir(root, "job")),
            (std::vector<std::string>{"LATEST", "step-10", "step-4", "step-8", "step-9"}));
}

TEST(StepsToDelete, KeepsRecentMilestonesLatestAndTheAbandonedFuture) {
  EXPECT_EQ(StepsToDelete({1, 2, 3, 4, 5}, 5, {.keep_last = 2}), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(StepsToDelete({5, 1, 3, 2, 4}, 5, {.keep_last = 1, .keep_every = 2}),
            (std::vector<int64_t>{1, 3}));
  // Resumed from step 2 while 3..5 exist: only steps up to 2 count.
  EXPECT_EQ(StepsToDelete({1, 2, 3, 4, 5}, 2, {.keep_last = 1}), (std::vector<int64_t>{1}));
  EXPECT_TRUE(StepsToDelete({}, 0, {.keep_last = 1}).empty());
}

TEST(CheckpointWriter, RankZeroRemovesTemporariesAtStart) {
  const std::string root = FreshDir("writer-cleanup");
  const std::string job_dir = JobDir(root, "job");
  std::unique_ptr<CheckpointWriter> first = MustCreate(Options(root));
  const std::vector<float> data = Data(5);
  ASSERT_TRUE(first->SaveSync(Request(5, data), absl::InfiniteFuture()).ok());
  first.reset();
  Env* env = Env::Default();
  for (const std::string dir : {"tmp-step-6-save-0", "tmp-deleting-step-2"}) {
    ASSERT_TRUE(env->CreateDir(JoinPath(job_dir, dir)).ok());
    ASSERT_TRUE(WriteFileDurably(env, JoinPath(job_dir, dir + "/shard-0-of-1.bin"), "x").ok());
  }
  ASSERT_TRUE(WriteFileDurably(env, JoinPath(job_dir, "tmp-LATEST"), "step-6\n").ok());

  MustCreate(Options(root, 1, 2));  // rank 1 leaves them
  EXPECT_EQ(Temporaries(job_dir).size(), 3u);
  MustCreate(Options(root));
  EXPECT_EQ(Children(job_dir), (std::vector<std::string>{"LATEST", "step-5"}));
  std::vector<float> loaded;
  EXPECT_EQ(LoadParams(root, &loaded).value_or(-1), 5);
}

// Rank 0 gives up on a rank that never reports, at the deadline of the fake clock.
TEST(CheckpointWriter, CommitTimesOutWhenARankNeverReports) {
  const std::string root = FreshDir("writer-timeout");
  FakeClock clock;
  CheckpointWriterOptions o = Options(root, 0, 2);
  o.clock = &clock;
  o.commit_timeout = absl::Minutes(5);
  o.poll_interval = absl::Minutes(1);
  std::unique_ptr<CheckpointWriter> writer = MustCreate(o);
  const std::vector<float> data = Data(3);
  ASSERT_TRUE(writer->SaveAsync(Request(3, data, 0, 2)).ok());
  for (int minute = 0; minute < 5; ++minute) {
    while (clock.sleepers() == 0) std::this_thread::yield();  // rank 0 polls, then sleeps
    EXPECT_EQ(writer->Poll(), std::nullopt) << minute;
    clock.Advance(absl::Minutes(1));
  }
  absl::Status s = writer->Wait(absl::InfiniteFuture());
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("shards of ranks 1"));
  EXPECT_EQ(ListCommittedSteps(Env::Default(), JobDir(root, "job"))->size(), 0u);
}

// After rank 0 gave up on rank 1 (still writing), rank 1 skips the next save and says so:
// rank 0 learns it at once instead of waiting out another timeout. A later save commits
// and removes the abandoned directories.
TEST(CheckpointWriter, SkippedSaveOfAnotherRankIsReportedAtOnce) {
  const std::string root = FreshDir("writer-skip");
  FakeClock clock;
  Gate gate([](const FileOp& op) { return IsShardWrite(op, "step-1-"); });
  FaultInjectionEnv slow(Env::Default(), gate.Hook());
  std::vector<std::unique_ptr<CheckpointWriter>> writers;
  for (int r = 0; r < 2; ++r) {
    CheckpointWriterOptions o = Options(root, r, 2);
    o.clock = &clock;
    o.on_busy = OnBusy::kSkip;
    o.commit_timeout = absl::Minutes(1);
    o.poll_interval = absl::Minutes(1);
    if (r == 1) o.env = &slow;
    writers.push_back(MustCreate(o));
  }
  const std::vector<float> data = Data(1);
  ASSERT_EQ(*writers[1]->SaveAsync(Request(1, data, 1, 2)), SaveOutcome::kStarted);
  gate.WaitEntered();
  ASSERT_EQ(*writers[0]->SaveAsync(Request(1, data, 0, 2)), SaveOutcome::kStarted);
  while (clock.sleepers() == 0) std::this_thread::yield();
  clock.Advance(absl::Minutes(1));
  EXPECT_EQ(writers[0]->Wait(absl::InfiniteFuture()).code(), absl::StatusCode::kDeadlineExceeded);

  EXPECT_EQ(*writers[1]->SaveAsync(Request(2, data, 1, 2)), SaveOutcome::kSkipped);
  // Wait returns before the save's follow-up work (retention) ends; until then a kSkip
  // writer is still busy and would skip.
  (void)writers[0]->WaitIdle(absl::InfiniteFuture());
  ASSERT_EQ(*writers[0]->SaveAsync(Request(2, data, 0, 2)), SaveOutcome::kStarted);
  absl::Status s = writers[0]->Wait(absl::InfiniteFuture());  // no clock advance needed
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank 1 skipped"));
  EXPECT_EQ(writers[0]->stats().skipped, 1);
  EXPECT_EQ(writers[0]->stats().failed, 1);

  gate.Open();
  EXPECT_TRUE(writers[1]->Wait(absl::InfiniteFuture()).ok());
  // As above: step 2's follow-up work may still hold rank 0's kSkip writer.
  (void)writers[0]->WaitIdle(absl::InfiniteFuture());
  ASSERT_EQ(*writers[0]->SaveAsync(Request(3, data, 0, 2)), SaveOutcome::kStarted);
  EXPECT_TRUE(writers[1]->SaveSync(Request(3, data, 1, 2), absl::InfiniteFuture()).ok());
  while (!writers[0]->Poll()) {  // rank 0 may be asleep until its next poll
    if (clock.sleepers() > 0) clock.Advance(absl::Minutes(1));
    std::this_thread::yield();
  }
  EXPECT_TRUE(writers[0]->Wait(absl::InfiniteFuture()).ok());
  writers.clear();
  EXPECT_EQ(Children(JobDir(root, "job")), (std::vector<std::string>{"LATEST", "step-3"}));
}

TEST(CheckpointWriter, SavingACommittedStepAgainChangesNothing) {
  const std::string root = FreshDir("writer-again");
  const std::string dir = JoinPath(JobDir(root, "job"), "step-5");
  const std::vector<float> five = Data(5), six = Data(6);
  ASSERT_TRUE(MustCreate(Options(root))->SaveSync(Request(5, five), absl::InfiniteFuture()).ok());
  const std::string manifest = *ReadFileToString(Env::Default(), JoinPath(dir, "MANIFEST"));
  ASSERT_TRUE(MustCreate(Options(root))->SaveSync(Request(6, six), absl::InfiniteFuture()).ok());
  // A drain save at a step that exists (e.g. resumed from an older LATEST).
  std::unique_ptr<CheckpointWriter> writer = MustCreate(Options(root));
  EXPECT_TRUE(writer->SaveSync(Request(5, six), absl::InfiniteFuture()).ok());
  EXPECT_EQ(*ReadFileToString(Env::Default(), JoinPath(dir, "MANIFEST")), manifest);
  std::vector<float> loaded;
  EXPECT_EQ(LoadParams(root, &loaded).value_or(-1), 5);
  EXPECT_EQ(loaded, five);
}

TEST(CheckpointWriter, BadRequestsAndOptionsAreInvalidArgument) {
  const std::string root = FreshDir("writer-bad");
  std::unique_ptr<CheckpointWriter> writer = MustCreate(Options(root));
  const std::vector<float> data = Data(1);
  SaveRequest request = Request(1, data);
  request.buffers[0].range = {0, kElements + 16};
  absl::StatusOr<SaveOutcome> r = writer->SaveAsync(request);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("\"params\""));
  request = Request(1, data);
  request.buffers.push_back(request.buffers[0]);
  r = writer->SaveAsync(request);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("\"params\": ranges [0, 65536) and [0, 65536) overlap"));
  request = Request(1, data);
  request.buffers[0].data.remove_suffix(1);
  EXPECT_EQ(writer->SaveAsync(request).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(writer->stats().started, 0);

  CheckpointWriterOptions o = Options(root);
  o.retention.keep_last = 0;
  absl::Status s = CheckpointWriter::Create(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("keep_last"));
  o = Options(root, 2, 2);
  EXPECT_THAT(std::string(CheckpointWriter::Create(o).status().message()), HasSubstr("rank"));
}

// Ranges that do not cover a buffer exactly once are the caller's mistake; rank 0 refuses
// to commit them.
TEST(CheckpointWriter, RanksWhoseRangesDoNotTileTheBufferAreRefused) {
  const std::string root = FreshDir("writer-tiling");
  std::vector<std::unique_ptr<CheckpointWriter>> writers = TwoRanks(root, Env::Default());
  const std::vector<float> data = Data(1);
  // Rank 1 saves rank 0's slice too.
  auto [s, s1] = SaveBoth(writers, Request(1, data, 0, 2), Request(1, data, 0, 2));
  EXPECT_TRUE(s1.ok()) << s1;
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("more than one chunk"));
  writers.clear();
  EXPECT_TRUE(Children(JobDir(root, "job")).empty());
}

// A shard that is gone by the time rank 0 commits (removed under the rank that wrote it)
// fails the save instead of making a checkpoint that cannot load.
TEST(CheckpointWriter, AShardMissingAtCommitFailsTheSave) {
  const std::string root = FreshDir("writer-vanished");
  FaultInjectionEnv vanishing(Env::Default(), [](const FileOp& op) {
    if (op.kind == FileOp::Kind::kRename && absl::EndsWith(op.to, "report-1-of-2.pb")) {
      const std::string dir = op.to.substr(0, op.to.rfind('/'));
      EXPECT_TRUE(Env::Default()->DeleteFile(JoinPath(dir, "shard-1-of-2.bin")).ok());
    }
    return absl::OkStatus();
  });
  std::vector<std::unique_ptr<CheckpointWriter>> writers = TwoRanks(root, &vanishing);
  const std::vector<float> data = Data(1);
  auto [s, s1] = SaveBoth(writers, Request(1, data, 0, 2), Request(1, data, 1, 2));
  EXPECT_TRUE(s1.ok()) << s1;
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("shard-1-of-2.bin, reported by rank 1"));
  EXPECT_TRUE(ListCommittedSteps(Env::Default(), JobDir(root, "job"))->empty());
}

// The destructor ends a save that waits for a rank that will never report.
TEST(CheckpointWriter, DestructorCancelsAWaitingSave) {
  const std::string root = FreshDir("writer-cancel");
  CheckpointWriterOptions o = Options(root, 0, 2);
  o.commit_timeout = absl::Hours(1);
  std::unique_ptr<CheckpointWriter> writer = MustCreate(o);
  const std::vector<float> data = Data(1);
  ASSERT_TRUE(writer->SaveAsync(Request(1, data, 0, 2)).ok());
  writer.reset();  // returns: the test would time out otherwise
  EXPECT_EQ(ListCommittedSteps(Env::Default(), JobDir(root, "job"))->size(), 0u);
}

// Snapshots of 32 MiB and more are copied by several threads, cut in the middle of a
// buffer; what is saved is still exactly the buffers.
TEST(CheckpointWriter, LargeSnapshotsCopiedByHelperThreadsAreExact) {
  const std::string root = FreshDir("writer-threads");
  CheckpointWriterOptions o = Options(root);
  o.snapshot_threads = 3;
  std::unique_ptr<CheckpointWriter> writer = MustCreate(o);
  const std::vector<int64_t> sizes = {3000001, 4999999, 2500000};  // 42 MB: two threads
  std::vector<std::vector<float>> buffers;
  SaveRequest request;
  request.step = 9;
  for (size_t b = 0; b < sizes.size(); ++b) {
    const std::string name = absl::StrCat("b", b);
    buffers.push_back(testing::PatternBuffer(name, 9, sizes[b], sizes[b]));
    request.buffers.push_back({name, sizes[b], {0, sizes[b]}, buffers.back()});
  }
  ASSERT_TRUE(writer->SaveSync(request, absl::InfiniteFuture()).ok());
  for (size_t b = 0; b < sizes.size(); ++b) {
    std::vector<float> out(sizes[b]);
    LoadOptions load;
    load.root = root;
    load.job = "job";
    const std::string name = absl::StrCat("b", b);
    ASSERT_TRUE(LoadCheckpoint(load, {{name, {0, sizes[b]}, absl::MakeSpan(out)}}).ok());
    EXPECT_EQ(out, buffers[b]) << name;
  }
}

TEST(SaveSlice, SplitsIntoAlignedSlicesThatTile) {
  for (int64_t elements : {0, 1, 15, 16, 17, 1000, 4096, 100003}) {
    for (int world = 1; world <= 9; ++world) {
      int64_t next = 0;
      for (int r = 0; r < world; ++r) {
        state::FlatRange s = SaveSlice(elements, r, world);
        EXPECT_EQ(s.begin, next) << elements << " " << r << "/" << world;
        EXPECT_TRUE(s.begin % state::kAlignElements == 0 || s.begin == elements);
        next = s.end;
      }
      EXPECT_EQ(next, elements);
    }
  }
}

}  // namespace
}  // namespace ringmaster::checkpoint
