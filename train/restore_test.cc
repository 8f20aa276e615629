#include "train/restore.h"

#include <algorithm>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "checkpoint/writer.h"
#include "common/env.h"
#include "common/fault_injection_env.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "state/range.h"
#include "train/testing.h"

namespace ringmaster::train {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr uint64_t kSpecHash = testing::kTestSpecHash;

state::TensorTable Table() {
  state::TensorTable t;
  t.Add("w", {13, 7});
  t.Add("b", {13});
  t.Add("v", {5, 3});
  return t;
}

// Element i of buffer `b` (0: the parameters, then the optimizer's moments) after `step`.
float Value(int b, int64_t step, int64_t i) {
  return static_cast<float>(step * 1000 + b * 100 + i % 97);
}

// The resumable state after `step`: every field distinct and derived from the step.
checkpoint::TrainingState StateAfter(int64_t step) {
  checkpoint::TrainingState s;
  s.step = step;
  s.sampler = {static_cast<uint64_t>(step / 3), step * 32};
  s.rng_seed = 7;
  s.loss_scaler = state::LossScalerState{1024.0 * step, step % 5, step, step / 2};
  s.optimizer_step = step - 1;
  s.schedule_step = step;
  return s;
}

// One rank's state, as the trainer builds it before a restore (ZeRO-0, AdamW, fp16's loss
// scaler): the parameters hold their initial value, -7.
struct RankState {
  RankState() : params(table.total_elements() + state::kAlignElements) {
    for (float& x : params.span()) x = -7;
    optimizer = *CreateOptimizer(table, state::FullRange(table), AdamWOptions{});
    buffers = optimizer->state_buffers();
    scaler = *LossScaler::Create(LossScalerOptions{});
  }

  // Whether every buffer holds the values of `step` (the parameters' padding untouched).
  std::string Mismatch(int64_t step) const {
    const int64_t n = table.total_elements();
    for (int64_t i = 0; i < n; ++i) {
      if (params.data()[i] != Value(0, step, i)) return absl::StrCat("params[", i, "]");
    }
    if (params.data()[n] != -7) return "the parameters' padding";
    for (size_t b = 0; b < buffers.size(); ++b) {
      for (int64_t i = 0; i < n; ++i) {
        if (buffers[b].data[i] != Value(b + 1, step, i)) {
          return absl::StrCat(buffers[b].name, "[", i, "]");
        }
      }
    }
    if (optimizer->step() != StateAfter(step).optimizer_step) return "the optimizer's step";
    if (!(scaler->state() == *StateAfter(step).loss_scaler)) return "the loss scaler";
    return "";
  }

  // Fills the state with the values of `step` and keeps it in `resident`.
  void KeepAfter(int64_t step, ResidentState& resident) {
    const int64_t n = table.total_elements();
    for (int64_t i = 0; i < n; ++i) params.data()[i] = Value(0, step, i);
    for (size_t b = 0; b < buffers.size(); ++b) {
      for (int64_t i = 0; i < n; ++i) buffers[b].data[i] = Value(b + 1, step, i);
    }
    const checkpoint::TrainingState s = StateAfter(step);
    KeepResident(resident, step, kSpecHash, table, params, buffers, s.optimizer_step, s.sampler,
                 s.loss_scaler);
  }

  const state::TensorTable table = Table();
  state::FlatBuffer params;
  std::unique_ptr<Optimizer> optimizer;
  std::vector<StateBuffer> buffers;
  std::optional<LossScaler> scaler;
};

constexpr const char* kNames[] = {"params", "exp_avg", "exp_avg_sq"};

// Saves the state after `step` with one rank per entry of `ranks`, rank r saving the ranges
// ranks[r] of every buffer (piece by piece: each range of all three buffers before the
// next range), each rank's writer on a thread of its own.
void SaveByRanks(const TrainConfig& config, int64_t step,
                 const std::vector<std::vector<state::FlatRange>>& ranks,
                 uint64_t hash = kSpecHash) {
  const state::TensorTable table = Table();
  const int64_t n = table.total_elements();
  const int world = static_cast<int>(ranks.size());
  std::vector<std::unique_ptr<checkpoint::CheckpointWriter>> writers;
  for (int r = 0; r < world; ++r) {  // rank 0 first: it cleans up
    checkpoint::CheckpointWriterOptions wo;
    wo.root = config.checkpoint.dir;
    wo.job = config.name;
    wo.rank = r;
    wo.world_size = world;
    wo.spec_hash = hash;
    wo.table = &table;
    wo.poll_interval = absl::Milliseconds(1);
    absl::StatusOr<std::unique_ptr<checkpoint::CheckpointWriter>> w =
        checkpoint::CheckpointWriter::Create(wo);
    ASSERT_TRUE(w.ok()) << w.status();
    writers.push_back(*std::move(w));
  }
  std::vector<std::vector<float>> data(3, std::vector<float>(n));
  for (int b = 0; b < 3; ++b) {
    for (int64_t i = 0; i < n; ++i) data[b][i] = Value(b, step, i);
  }
  std::vector<absl::Status> saved(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      checkpoint::SaveRequest req;
      req.step = step;
      req.state = StateAfter(step);
      for (const state::FlatRange& range : ranks[r]) {
        for (int b = 0; b < 3; ++b) {
          req.buffers.push_back({kNames[b], n, range, state::Slice(absl::MakeConstSpan(data[b]),
                                                                   range)});
        }
      }
      saved[r] = writers[r]->SaveSync(req, absl::Now() + absl::Seconds(30));
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < world; ++r) ASSERT_TRUE(saved[r].ok()) << "rank " << r << ": " << saved[r];
}

// Saves the state after `step` as one rank of `config`'s job, with its spec hash `hash`.
void SaveCheckpoint(const TrainConfig& config, int64_t step, uint64_t hash = kSpecHash) {
  SaveByRanks(config, step, {{state::FullRange(Table())}}, hash);
}

struct Said {
  std::vector<std::string> lines;
  std::string all() const { return absl::StrJoin(lines, "\n"); }
};

RestoreOptions Options(const TrainConfig& config, RankState& s, Said& said,
                       comm::Communicator* comm = nullptr, ResidentState* resident = nullptr) {
  RestoreOptions o;
  o.config = &config;
  o.comm = comm;
  o.op_timeout = absl::Seconds(30);
  o.env = Env::Default();
  o.table = &s.table;
  o.params = &s.params;
  o.optimizer_buffers = &s.buffers;
  o.optimizer = s.optimizer.get();
  o.scaler = &*s.scaler;
  o.resident = resident;
  o.say = [&said](const std::string& line) { said.lines.push_back(line); };
  return o;
}

TEST(Restore, FromTheLatestCheckpoint) {
  const TrainConfig config = testing::CheckpointedJob("latest");
  SaveCheckpoint(config, 3);
  SaveCheckpoint(config, 7);
  RankState s;
  Said said;
  absl::StatusOr<Restored> r = RestoreTrainingState(Options(config, s, said));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step, 7);
  EXPECT_EQ(r->resumed_from_step, 7);
  EXPECT_EQ(r->resumed_from_memory_of, -1);
  EXPECT_EQ(r->sampler, StateAfter(7).sampler);
  EXPECT_EQ(s.Mismatch(7), "");
  EXPECT_THAT(said.all(), HasSubstr(absl::StrCat("resumed from ", config.checkpoint.dir,
                                                 "/job/step-7 (step 7, saved by 1 rank,")));
}

TEST(Restore, FromTheStepResumeNames) {
  TrainConfig config = testing::CheckpointedJob("step");
  SaveCheckpoint(config, 3);
  SaveCheckpoint(config, 7);
  config.checkpoint.resume = {ResumeConfig::Kind::kStep, 3, "3"};
  RankState s;
  Said said;
  absl::StatusOr<Restored> r = RestoreTrainingState(Options(config, s, said));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step, 3);
  EXPECT_EQ(s.Mismatch(3), "");

  // A step that was never saved is not "from scratch".
  config.checkpoint.resume = {ResumeConfig::Kind::kStep, 5, "5"};
  RankState t;
  r = RestoreTrainingState(Options(config, t, said));
  EXPECT_TRUE(absl::IsNotFound(r.status())) << r.status();
  EXPECT_FALSE(IsPermanent(r.status())) << r.status();
}

TEST(Restore, ResumeNeverIgnoresCheckpointsAndMemory) {
  TrainConfig config = testing::CheckpointedJob("never");
  SaveCheckpoint(config, 4);
  config.checkpoint.resume = {ResumeConfig::Kind::kNever, 0, "never"};
  RankState s;
  ResidentState resident;
  RankState().KeepAfter(9, resident);
  Said said;
  absl::StatusOr<Restored> r =
      RestoreTrainingState(Options(config, s, said, /*comm=*/nullptr, &resident));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step, 0);
  EXPECT_EQ(r->resumed_from_step, -1);
  EXPECT_EQ(s.params.data()[0], -7);  // the initial parameters
  EXPECT_EQ(s.optimizer->step(), 0);
  EXPECT_EQ(resident.step, -1);  // not held twice while training
  EXPECT_TRUE(said.lines.empty()) << said.all();
}

TEST(Restore, AutoWithoutACheckpointStartsFromScratchAndSaysSo) {
  const TrainConfig config = testing::CheckpointedJob("empty");
  RankState s;
  Said said;
  absl::StatusOr<Restored> r = RestoreTrainingState(Options(config, s, said));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step, 0);
  EXPECT_EQ(r->resumed_from_step, -1);
  EXPECT_EQ(s.params.data()[0], -7);
  EXPECT_THAT(said.all(),
              HasSubstr(absl::StrCat("resume: auto: no checkpoint of job job in ",
                                     config.checkpoint.dir, " yet; starting from scratch")));
}

TEST(Restore, WithoutACheckpointDirStartsFromScratchSilently) {
  TrainConfig config = testing::CheckpointedJob("nodir");
  config.checkpoint.dir.clear();
  RankState s;
  Said said;
  absl::StatusOr<Restored> r = RestoreTrainingState(Options(config, s, said));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step, 0);
  EXPECT_TRUE(said.lines.empty()) << said.all();
}

TEST(Restore, AnotherJobsCheckpointIsPermanentlyRefused) {
  const TrainConfig config = testing::CheckpointedJob("other");
  SaveCheckpoint(config, 4, /*hash=*/0xbad);
  RankState s;
  Said said;
  absl::StatusOr<Restored> r = RestoreTrainingState(Options(config, s, said));
  EXPECT_TRUE(absl::IsFailedPrecondition(r.status())) << r.status();
  EXPECT_TRUE(IsPermanent(r.status())) << r.status();
  EXPECT_THAT(r.status().message(),
              HasSubstr("resuming cannot work until checkpoint.dir points elsewhere or resume "
                        "is set to never"));
}

// Flips a byte in the middle of `step`'s shard of `config`'s one-rank checkpoint; returns
// the shard's path.
std::string DamageShard(const TrainConfig& config, int64_t step) {
  const std::string shard =
      absl::StrCat(config.checkpoint.dir, "/job/step-", step, "/shard-0-of-1.bin");
  std::fstream file(shard, std::ios::in | std::ios::out | std::ios::binary);
  EXPECT_TRUE(file.good()) << shard;
  file.seekg(0, std::ios::end);
  const std::streamoff middle = file.tellg() / 2;
  char byte = 0;
  file.seekg(middle);
  file.get(byte);
  file.seekp(middle);
  file.put(static_cast<char>(byte ^ 0x5a));
  return shard;
}

// Issue 36 point 21: a corrupt shard was caught precisely, but restartable: every restart
// read it again until the budget ran out, and the job's reason led with the budget. With no
// checkpoint before it, it is permanent, the damage named first.
TEST(Restore, ADamagedCheckpointIsPermanentAndNamedFirst) {
  const TrainConfig config = testing::CheckpointedJob("damaged");
  SaveCheckpoint(config, 4);
  const std::string shard = DamageShard(config, 4);
  RankState s;
  Said said;
  absl::StatusOr<Restored> r = RestoreTrainingState(Options(config, s, said));
  EXPECT_TRUE(absl::IsDataLoss(r.status())) << r.status();
  EXPECT_TRUE(IsPermanent(r.status())) << r.status();
  EXPECT_THAT(std::string(r.status().message()),
              StartsWith("the checkpoint to resume from is damaged: "));
  EXPECT_THAT(r.status().message(), HasSubstr(shard));
}

// Issue 36 point 21: the newest checkpoint damaged, the one before it intact: the job resumes
// from that one and says why; a resume that names the damaged step gets its error.
TEST(Restore, FallsBackFromADamagedCheckpointToTheOneBefore) {
  TrainConfig config = testing::CheckpointedJob("fallback");
  SaveCheckpoint(config, 3);
  SaveCheckpoint(config, 7);
  const std::string shard = DamageShard(config, 7);
  RankState s;
  Said said;
  absl::StatusOr<Restored> r = RestoreTrainingState(Options(config, s, said));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step, 3);
  EXPECT_EQ(r->resumed_from_step, 3);
  EXPECT_EQ(s.Mismatch(3), "");
  EXPECT_THAT(said.all(), HasSubstr("checkpoint step-7 is damaged (" + shard));
  EXPECT_THAT(said.all(), HasSubstr("): resuming from step-3, the newest before it"));

  config.checkpoint.resume = {ResumeConfig::Kind::kStep, 7, "7"};
  RankState t;
  r = RestoreTrainingState(Options(config, t, said));
  EXPECT_TRUE(absl::IsDataLoss(r.status())) << r.status();
  EXPECT_TRUE(IsPermanent(r.status())) << r.status();
}

// The damage seen by one rank only (its reads of step 7's shard fail with DATA_LOSS): both
// ranks pass over step 7 together, and both resume from step 3.
TEST(Restore, RanksFallBackTogetherWhenOneFindsTheCheckpointDamaged) {
  const TrainConfig config = testing::CheckpointedJob("fallback2");
  SaveCheckpoint(config, 3);
  SaveCheckpoint(config, 7);
  testing::ExpectOkOnRanks(2, [&](comm::TcpCommunicator& comm) -> absl::Status {
    FaultInjectionEnv damaging(Env::Default(), [&comm](const FileOp& op) {
      const bool hit = comm.rank() == 1 && op.kind == FileOp::Kind::kPRead &&
                       absl::StrContains(op.path, "step-7/shard");
      return hit ? absl::DataLossError(absl::StrCat(op.path, ": checksum mismatch (injected)"))
                 : absl::OkStatus();
    });
    RankState s;
    Said said;
    RestoreOptions o = Options(config, s, said, &comm);
    o.env = &damaging;
    RM_ASSIGN_OR_RETURN(Restored r, RestoreTrainingState(o));
    const std::string why = comm.rank() == 1 ? "checksum mismatch (injected)" : "on another rank";
    if (r.step != 3 || !s.Mismatch(3).empty() ||
        said.all().find("checkpoint step-7 is damaged (") == std::string::npos ||
        said.all().find(why) == std::string::npos) {
      return absl::InternalError(absl::StrCat("rank ", comm.rank(), " restored step ", r.step,
                                              ": ", said.all()));
    }
    return absl::OkStatus();
  });
}

TEST(Restore, KeepResidentKeepsTheTablesElementsAndTheState) {
  RankState s;
  ResidentState resident;
  s.KeepAfter(5, resident);
  EXPECT_EQ(resident.step, 5);
  EXPECT_EQ(resident.spec_hash, kSpecHash);
  EXPECT_EQ(static_cast<int64_t>(resident.params.size()), s.table.total_elements());
  EXPECT_EQ(resident.params[1], Value(0, 5, 1));
  ASSERT_EQ(resident.optimizer.size(), 2u);
  EXPECT_EQ(resident.optimizer[1].first, "exp_avg_sq");
  EXPECT_EQ(resident.optimizer[1].second[1], Value(2, 5, 1));
  EXPECT_EQ(resident.optimizer_step, 4);
  EXPECT_EQ(resident.sampler, StateAfter(5).sampler);
  EXPECT_EQ(resident.loss_scaler, StateAfter(5).loss_scaler);
}

// Two ranks of an elastic job's new epoch, with a checkpoint of step 4 on disk: rank 1
// kept the state after `kept` in memory, rank 0 (a newcomer) nothing. Each rank checks
// what it restored: a survivor's memory when it is at least as recent as the checkpoint
// and every rank holds the whole state, else the checkpoint.
void RestoreOnTwoRanks(const std::string& name, int64_t kept, bool whole_state) {
  const TrainConfig config = testing::CheckpointedJob(name);
  SaveCheckpoint(config, 4);
  testing::ExpectOkOnRanks(2, [&](comm::TcpCommunicator& comm) -> absl::Status {
    RankState s;
    ResidentState resident;
    if (comm.rank() == 1) RankState().KeepAfter(kept, resident);
    Said said;
    RestoreOptions o = Options(config, s, said, &comm, &resident);
    o.whole_state = whole_state;
    RM_ASSIGN_OR_RETURN(Restored r, RestoreTrainingState(o));
    const bool from_memory = whole_state && kept >= 4;
    const int64_t step = from_memory ? kept : 4;
    const std::string what = absl::StrCat("restored step ", r.step, " from rank ",
                                          r.resumed_from_memory_of, ": ", said.all());
    if (r.step != step || r.resumed_from_step != step ||
        r.resumed_from_memory_of != (from_memory ? 1 : -1) ||
        !(r.sampler == StateAfter(step).sampler)) {
      return absl::InternalError(what);
    }
    if (std::string m = s.Mismatch(step); !m.empty()) {
      return absl::InternalError(absl::StrCat(m, " differs; ", what));
    }
    if (resident.step != -1) return absl::InternalError("the memory is still held");
    // Where it came from, and why not from memory when not (Recovery.lost_because).
    const std::string from = from_memory ? "rank 1's memory" : "step 4's checkpoint";
    const std::string why =
        from_memory   ? ""
        : whole_state ? absl::StrCat("the newest state kept in memory (step ", kept,
                                     ") is older than the latest checkpoint")
                      : "its state is sharded over the ranks: a rank keeps only its own "
                        "shards, and those of the ranks that left are gone";
    if (RestoredFromText(r) != from || r.not_from_memory != why) {
      return absl::InternalError(absl::StrCat("from \"", RestoredFromText(r), "\" because \"",
                                              r.not_from_memory, "\"; ", what));
    }
    const std::string line =
        from_memory ? absl::StrCat("restored step ", kept, " from the memory of rank 1 (",
                                   state::SamplerStateString(StateAfter(kept).sampler),
                                   "; latest checkpoint: step 4)")
                    : "resumed from";
    if (said.all().find(line) == std::string::npos) {
      return absl::InternalError(absl::StrCat("said: ", said.all()));
    }
    return absl::OkStatus();
  });
}

TEST(Restore, FromASurvivorsMemoryNewerThanTheCheckpoint) {
  RestoreOnTwoRanks("memory_newer", /*kept=*/6, /*whole_state=*/true);
}

// Nothing is read from disk that memory holds already.
TEST(Restore, FromASurvivorsMemoryAsRecentAsTheCheckpoint) {
  RestoreOnTwoRanks("memory_same", /*kept=*/4, /*whole_state=*/true);
}

TEST(Restore, FromTheCheckpointWhenItIsNewerThanAnyMemory) {
  RestoreOnTwoRanks("memory_older", /*kept=*/3, /*whole_state=*/true);
}

TEST(Restore, FromTheCheckpointWhenNoRankHoldsTheWholeState) {
  RestoreOnTwoRanks("memory_sharded", /*kept=*/6, /*whole_state=*/false);
}

// Every trainer of the epoch started anew (none kept a state): the checkpoint, and why.
TEST(Restore, FromTheCheckpointWhenNoTrainerKeptAState) {
  const TrainConfig config = testing::CheckpointedJob("memory_none");
  SaveCheckpoint(config, 4);
  testing::ExpectOkOnRanks(2, [&](comm::TcpCommunicator& comm) -> absl::Status {
    RankState s;
    ResidentState resident;
    Said said;
    RM_ASSIGN_OR_RETURN(Restored r,
                        RestoreTrainingState(Options(config, s, said, &comm, &resident)));
    if (r.step != 4 || RestoredFromText(r) != "step 4's checkpoint" ||
        r.not_from_memory !=
            "no trainer of this epoch kept the state in memory (each one started anew)") {
      return absl::InternalError(absl::StrCat("restored step ", r.step, " from ",
                                              RestoredFromText(r), ": ", r.not_from_memory));
    }
    return absl::OkStatus();
  });
}

// ZeRO-3 on `world` ranks, one unit per tensor: rank r's piece of each unit (the unit
// [offset of tensor u, offset of tensor u + 1) cut in `world` parts), back to back in its
// local shard buffer. Some pieces may be empty.
std::vector<state::PlacedRange> UnitPieces(const state::TensorTable& table, int rank, int world) {
  std::vector<state::PlacedRange> pieces;
  int64_t at = 0;
  for (int u = 0; u < table.size(); ++u) {
    const int64_t begin = table.tensor(u).offset;
    const int64_t end = u + 1 < table.size() ? table.tensor(u + 1).offset : table.total_elements();
    const int64_t part = (end - begin + world - 1) / world;
    const int64_t lo = std::min(end, begin + rank * part), hi = std::min(end, lo + part);
    pieces.push_back({{lo, hi}, at});
    at += hi - lo;
  }
  return pieces;
}

// One rank's state under ZeRO-3 before a restore: its pieces of the parameters and of
// AdamW's moments, each in a local buffer (the parameters' with 5 elements to spare at the
// end), everything -7; the optimizer's buffers one StateBuffer per piece and moment.
struct ShardedRankState {
  ShardedRankState(int rank, int world)
      : pieces(UnitPieces(table, rank, world)),
        params(state::PlacedElements(pieces) + 5),
        moments(2, std::vector<float>(state::PlacedElements(pieces), -7)) {
    for (float& x : params.span()) x = -7;
    optimizer = *CreateOptimizer(table, state::FullRange(table), AdamWOptions{});
    for (const state::PlacedRange& p : pieces) {
      for (int m = 0; m < 2; ++m) {
        buffers.push_back({kNames[m + 1], p.range,
                           absl::MakeSpan(moments[m]).subspan(p.at, p.range.size())});
      }
    }
    scaler = *LossScaler::Create(LossScalerOptions{});
  }

  // Whether every piece holds the values of `step` (and the spare elements are untouched).
  std::string Mismatch(int64_t step) const {
    for (const state::PlacedRange& p : pieces) {
      for (int64_t i = p.range.begin; i < p.range.end; ++i) {
        const int64_t local = p.at + i - p.range.begin;
        if (params.data()[local] != Value(0, step, i)) return absl::StrCat("params[", i, "]");
        for (int m = 0; m < 2; ++m) {
          if (moments[m][local] != Value(m + 1, step, i)) {
            return absl::StrCat(kNames[m + 1], "[", i, "]");
          }
        }
      }
    }
    for (int64_t i = params.size() - 5; i < params.size(); ++i) {
      if (params.data()[i] != -7) return "the spare elements after the pieces";
    }
    if (optimizer->step() != StateAfter(step).optimizer_step) return "the optimizer's step";
    if (!(scaler->state() == *StateAfter(step).loss_scaler)) return "the loss scaler";
    return "";
  }

  RestoreOptions Options(const TrainConfig& config, Said& said) {
    RestoreOptions o;
    o.config = &config;
    o.env = Env::Default();
    o.table = &table;
    o.params = &params;
    o.param_pieces = pieces;
    o.optimizer_buffers = &buffers;
    o.optimizer = optimizer.get();
    o.scaler = &*scaler;
    o.whole_state = false;
    o.say = [&said](const std::string& line) { said.lines.push_back(line); };
    return o;
  }

  const state::TensorTable table = Table();
  const std::vector<state::PlacedRange> pieces;
  state::FlatBuffer params;
  std::vector<std::vector<float>> moments;  // exp_avg, exp_avg_sq
  std::unique_ptr<Optimizer> optimizer;
  std::vector<StateBuffer> buffers;
  std::optional<LossScaler> scaler;
};

// A checkpoint saved by 2 ranks holding contiguous ranges restores into 3 ranks holding a
// piece of every unit (parameters and moments, each piece into its place of the rank's
// shard), and their checkpoint, a chunk per piece, restores into 2 ranks holding the whole
// parameters and contiguous ranges of the moments (ZeRO-1).
TEST(Restore, ContiguousRangesOfTwoRanksIntoUnitPiecesOfThreeAndBack) {
  const TrainConfig config = testing::CheckpointedJob("pieces");
  const state::TensorTable table = Table();
  const int64_t n = table.total_elements();
  SaveByRanks(config, 5, {{{0, 48}}, {{48, n}}});
  std::vector<std::vector<state::FlatRange>> pieces_of(3);
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r, " of 3"));
    ShardedRankState s(r, 3);
    ASSERT_GT(s.pieces.size(), 1u);
    Said said;
    absl::StatusOr<Restored> restored = RestoreTrainingState(s.Options(config, said));
    ASSERT_TRUE(restored.ok()) << restored.status();
    EXPECT_EQ(restored->step, 5);
    EXPECT_EQ(restored->sampler, StateAfter(5).sampler);
    EXPECT_EQ(s.Mismatch(5), "");
    EXPECT_THAT(said.all(), HasSubstr("(step 5, saved by 2 ranks"));
    for (const state::PlacedRange& p : s.pieces) pieces_of[r].push_back(p.range);
  }

  SaveByRanks(config, 9, pieces_of);
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r, " of 2"));
    const state::FlatRange range = r == 0 ? state::FlatRange{0, 64} : state::FlatRange{64, n};
    RankState s;
    std::vector<std::vector<float>> moments(2, std::vector<float>(range.size(), -7));
    std::vector<StateBuffer> buffers;
    for (int m = 0; m < 2; ++m) buffers.push_back({kNames[m + 1], range, absl::MakeSpan(moments[m])});
    Said said;
    RestoreOptions o = Options(config, s, said);
    o.optimizer_buffers = &buffers;
    o.whole_state = false;
    absl::StatusOr<Restored> restored = RestoreTrainingState(o);
    ASSERT_TRUE(restored.ok()) << restored.status();
    EXPECT_EQ(restored->step, 9);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(s.params.data()[i], Value(0, 9, i)) << i;
    EXPECT_EQ(s.params.data()[n], -7);  // the padding
    for (int m = 0; m < 2; ++m) {
      for (int64_t i = range.begin; i < range.end; ++i) {
        ASSERT_EQ(moments[m][i - range.begin], Value(m + 1, 9, i)) << kNames[m + 1] << i;
      }
    }
    EXPECT_THAT(said.all(), HasSubstr("(step 9, saved by 3 ranks"));
  }
}

// Pieces that do not fit the rank's buffer, overlap, or come with whole_state are the
// caller's mistake: refused before anything is read.
TEST(Restore, ParamPiecesThatDoNotFitAreInvalidArgument) {
  const TrainConfig config = testing::CheckpointedJob("bad_pieces");
  SaveCheckpoint(config, 5);
  struct Case {
    std::vector<state::PlacedRange> pieces;
    bool whole_state;
    const char* says;
  };
  const std::vector<Case> cases = {
      {{{{0, 16}, 0}, {{32, 48}, 8}}, false, "local spans [0, 16) and [8, 24) overlap"},
      {{{{0, 16}, 0}, {{32, 48}, 200}}, false, "not inside a buffer of"},
      {{{{32, 48}, 0}, {{0, 16}, 16}}, false, "comes before the previous piece"},
      {{{{0, 16}, 0}}, true, "set whole_state = false"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.says);
    ShardedRankState s(0, 3);
    Said said;
    RestoreOptions o = s.Options(config, said);
    o.param_pieces = c.pieces;
    o.whole_state = c.whole_state;
    absl::StatusOr<Restored> restored = RestoreTrainingState(o);
    EXPECT_EQ(restored.status().code(), absl::StatusCode::kInvalidArgument) << restored.status();
    EXPECT_THAT(restored.status().message(), HasSubstr(c.says));
    EXPECT_EQ(s.params.data()[0], -7);
    EXPECT_EQ(s.optimizer->step(), 0);
  }
}

}  // namespace
}  // namespace ringmaster::train
