#include "checkpoint/inspect.h"

#include <algorithm>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
#include "checkpoint/shard_reader.h"
#include "common/status_macros.h"
#include "google/protobuf/util/message_differencer.h"

namespace ringmaster::checkpoint {
namespace {

constexpr int kMaxProblems = 20;
constexpr int64_t kVerifyReadBytes = 8 << 20;

// Collects distinct problems in the order found.
class Problems {
 public:
  void Add(std::string problem) {
    if (seen_.insert(problem).second) list_.push_back(std::move(problem));
  }
  bool empty() const { return list_.empty(); }
  absl::Status ToStatus(const std::string& dir) const {
    std::vector<std::string> shown(list_.begin(),
                                   list_.begin() + std::min<size_t>(list_.size(), kMaxProblems));
    std::string more = list_.size() > kMaxProblems
                           ? absl::StrCat("\n... and ", list_.size() - kMaxProblems, " more")
                           : "";
    return absl::DataLossError(absl::StrCat("checkpoint ", dir, " is corrupt (", list_.size(),
                                            " problems):\n", absl::StrJoin(shown, "\n"), more));
  }

 private:
  std::vector<std::string> list_;
  absl::flat_hash_set<std::string> seen_;
};

void VerifyJson(Env* env, const std::string& dir, const Manifest& manifest, Problems* problems) {
  const std::string path = JoinPath(dir, kManifestJsonName);
  absl::StatusOr<std::string> json = ReadFileToString(env, path);
  if (!json.ok()) {
    problems->Add(absl::StrCat(path, ": ", json.status().message()));
    return;
  }
  const std::string expected = ManifestToJson(manifest);
  if (*json == expected) return;
  absl::StatusOr<Manifest> parsed = ManifestFromJson(*json);
  if (parsed.ok() &&
      google::protobuf::util::MessageDifferencer::Equals(*parsed, JsonMirror(manifest))) {
    return;  // printed differently (another protobuf version), same contents
  }
  const size_t at =
      std::mismatch(json->begin(), json->end(), expected.begin(), expected.end()).first -
      json->begin();
  problems->Add(
      absl::StrCat(path, ": differs from MANIFEST at offset ", at,
                   parsed.ok() ? "" : absl::StrCat(" (", parsed.status().message(), ")")));
}

}  // namespace

absl::StatusOr<VerifyReport> VerifyCheckpoint(Env* env, const std::string& dir) {
  RM_ASSIGN_OR_RETURN(Manifest manifest, ReadManifest(env, dir));
  VerifyReport report;
  report.step = manifest.step();
  Problems problems;
  ShardReader reader(env, dir, manifest);
  for (const ShardFile& f : manifest.files()) {
    absl::StatusOr<uint64_t> size = reader.FileSize(f.name());
    if (!size.ok()) {
      problems.Add(std::string(size.status().message()));
    } else if (static_cast<int64_t>(*size) != f.bytes()) {
      problems.Add(absl::StrCat(JoinPath(dir, f.name()), ": ", *size - f.bytes(),
                                " bytes after offset ", f.bytes(),
                                ", where the manifest says "
                                "the file ends"));
    }
  }
  std::vector<char> scratch;
  for (const ChunkEntry& c : manifest.chunks()) {
    const int64_t bs = c.block_bytes();
    const int64_t per_read = std::max<int64_t>(1, kVerifyReadBytes / bs);
    const int64_t blocks = c.block_xxh3_size();
    scratch.resize(per_read * bs);
    for (int64_t first = 0; first < blocks; first += per_read) {
      const int64_t end = std::min(blocks, first + per_read);
      if (reader.ReadBlocks(c, first, end, scratch.data()).ok()) continue;
      for (int64_t b = first; b < end; ++b) {  // find every bad block of this read
        absl::Status s = reader.ReadBlocks(c, b, b + 1, scratch.data());
        if (!s.ok()) problems.Add(std::string(s.message()));
      }
    }
  }
  VerifyJson(env, dir, manifest, &problems);
  if (!problems.empty()) return problems.ToStatus(dir);
  report.files = manifest.files_size();
  report.bytes = ManifestBytes(manifest);
  report.blocks = reader.blocks_read();
  return report;
}

absl::StatusOr<std::vector<CheckpointInfo>> ListCheckpoints(Env* env, const std::string& job_dir) {
  RM_ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListCommittedSteps(env, job_dir));
  absl::StatusOr<std::string> latest_dir = ResolveCheckpointDir(env, job_dir, std::nullopt);
  std::vector<CheckpointInfo> infos;
  for (int64_t step : steps) {
    CheckpointInfo& info = infos.emplace_back();
    info.step = step;
    info.dir = JoinPath(job_dir, StepDirName(step));
    info.latest = latest_dir.ok() && *latest_dir == info.dir;
    absl::StatusOr<Manifest> m = ReadManifest(env, info.dir);
    info.status = m.status();
    if (!m.ok()) continue;
    info.world_size = m->world_size();
    info.zero_stage = m->zero_stage();
    info.bytes = ManifestBytes(*m);
    info.spec_hash = m->spec_hash();
    info.created = absl::FromUnixMicros(m->created_unix_micros());
  }
  return infos;
}

std::string DescribeCheckpoints(const std::vector<CheckpointInfo>& checkpoints) {
  if (checkpoints.empty()) return "no checkpoints\n";
  std::string out = absl::StrFormat("%-12s %-6s %-5s %-14s %-24s %s\n", "STEP", "WORLD", "ZERO",
                                    "BYTES", "CREATED (UTC)", "");
  for (const CheckpointInfo& c : checkpoints) {
    if (!c.status.ok()) {
      absl::StrAppendFormat(&out, "%-12d unreadable: %s\n", c.step, c.status.message());
      continue;
    }
    absl::StrAppendFormat(&out, "%-12d %-6d %-5d %-14d %-24s %s\n", c.step, c.world_size,
                          c.zero_stage, c.bytes,
                          absl::FormatTime("%Y-%m-%d %H:%M:%S", c.created, absl::UTCTimeZone()),
                          c.latest ? "LATEST" : "");
  }
  return out;
}

}  // namespace ringmaster::checkpoint
