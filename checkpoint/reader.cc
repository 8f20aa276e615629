#include "checkpoint/reader.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "checkpoint/layout.h"
#include "checkpoint/shard_reader.h"
#include "common/status_macros.h"

namespace ringmaster::checkpoint {
namespace {

struct BufferChunks {
  int64_t elements = 0;
  std::vector<const ChunkEntry*> chunks;  // by begin; they tile [0, elements)
};

absl::flat_hash_map<std::string, BufferChunks> IndexChunks(const Manifest& manifest) {
  absl::flat_hash_map<std::string, BufferChunks> index;
  for (const BufferEntry& b : manifest.buffers()) index[b.name()].elements = b.elements();
  for (const ChunkEntry& c : manifest.chunks()) index[c.buffer()].chunks.push_back(&c);
  for (auto& [name, entry] : index) {
    std::sort(entry.chunks.begin(), entry.chunks.end(),
              [](const ChunkEntry* a, const ChunkEntry* b) { return a->begin() < b->begin(); });
  }
  return index;
}

absl::Status CheckTarget(const LoadTarget& t) {
  if (t.range.begin < 0 || t.range.end < t.range.begin) {
    return absl::InvalidArgumentError(absl::StrCat("load target ", t.name, ": range ",
                                                   state::RangeString(t.range), " is invalid"));
  }
  if (static_cast<int64_t>(t.out.size()) != t.range.size()) {
    return absl::InvalidArgumentError(absl::StrCat("load target ", t.name, ": out has ",
                                                   t.out.size(), " floats for a range of ",
                                                   t.range.size()));
  }
  return absl::OkStatus();
}

// "path: value" lines (spec::TrainingSpecText) by path.
std::map<std::string, std::string> FieldsOf(absl::string_view text) {
  std::map<std::string, std::string> fields;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    const size_t colon = line.find(": ");
    if (colon == absl::string_view::npos) continue;
    fields[std::string(line.substr(0, colon))] = std::string(line.substr(colon + 2));
  }
  return fields;
}

// The checkpoint's spec hash differs from the job's: loads it when the fields that differ
// may (setting spec_changes), else FAILED_PRECONDITION naming them.
absl::Status AcceptSpecChanges(const LoadOptions& options, OpenedCheckpoint* opened) {
  const Manifest& m = opened->manifest;
  const std::string hashes = absl::StrFormat(
      "%s was written by another job: its spec hash is %#018x (job %s), this job's is %#018x",
      opened->dir, m.spec_hash(), m.job(), *options.spec_hash);
  if (m.training_spec().empty() || options.training_spec.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        hashes, " (a different model, data, optimizer, schedule, batch, seed or length)"));
  }
  const std::map<std::string, std::string> saved = FieldsOf(m.training_spec());
  const std::map<std::string, std::string> ours = FieldsOf(options.training_spec);
  std::set<std::string> paths;
  for (const auto& fields : {&saved, &ours}) {
    for (const auto& [path, value] : *fields) paths.insert(path);
  }
  std::vector<std::string> refused, allowed;
  for (const std::string& path : paths) {
    auto a = saved.find(path);
    auto b = ours.find(path);
    const std::string was = a == saved.end() ? "(unset)" : a->second;
    const std::string is = b == ours.end() ? "(unset)" : b->second;
    if (was == is) continue;
    if (options.spec_changes_allowed.count(path)) {
      allowed.push_back(absl::StrCat(path, ": ", was, " -> ", is));
      continue;
    }
    std::string line = absl::StrCat(path, ": ", was, " in the checkpoint, ", is, " here");
    if (auto hint = options.spec_change_hints.find(path); hint != options.spec_change_hints.end()) {
      absl::StrAppend(&line, " (", hint->second, ")");
    }
    refused.push_back(std::move(line));
  }
  if (!refused.empty()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s was written with another spec: the fields that differ: %s (its spec hash is %#018x, "
        "job %s; this job's is %#018x)",
        opened->dir, absl::StrJoin(refused, "; "), m.spec_hash(), m.job(), *options.spec_hash));
  }
  if (allowed.empty()) {
    // Equal fields, other hashes: a field this build does not print (a newer writer).
    return absl::FailedPreconditionError(
        absl::StrCat(hashes, " (their specs print alike: written by another version?)"));
  }
  opened->spec_changes = std::move(allowed);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<OpenedCheckpoint> OpenCheckpoint(const LoadOptions& options) {
  OpenedCheckpoint opened;
  RM_ASSIGN_OR_RETURN(
      opened.dir,
      ResolveCheckpointDir(options.env, JobDir(options.root, options.job), options.step));
  absl::StatusOr<Manifest> manifest = ReadManifest(options.env, opened.dir);
  if (absl::IsNotFound(manifest.status())) {
    // The directory was listed a moment ago: removed since, by retention or by hand.
    return absl::DataLossError(
        absl::StrCat(opened.dir, " disappeared while being opened: ", manifest.status().message()));
  }
  RM_RETURN_IF_ERROR(manifest.status());
  opened.manifest = *std::move(manifest);
  if (options.spec_hash && *options.spec_hash != opened.manifest.spec_hash()) {
    RM_RETURN_IF_ERROR(AcceptSpecChanges(options, &opened));
  }
  if (options.table != nullptr) {
    absl::Status s = CheckTensorTable(opened.manifest, *options.table);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat(opened.dir, ": ", s.message()));
  }
  opened.state = FromProto(opened.manifest.training());
  return opened;
}

absl::StatusOr<ReadStats> ReadBuffers(const LoadOptions& options,
                                      const OpenedCheckpoint& checkpoint,
                                      absl::Span<const LoadTarget> targets) {
  const absl::flat_hash_map<std::string, BufferChunks> index = IndexChunks(checkpoint.manifest);
  for (const LoadTarget& t : targets) {
    RM_RETURN_IF_ERROR(CheckTarget(t));
    if (!index.contains(t.name)) {
      std::vector<std::string> names;
      for (const BufferEntry& b : checkpoint.manifest.buffers()) names.push_back(b.name());
      return absl::FailedPreconditionError(absl::StrCat(checkpoint.dir, " has no buffer \"", t.name,
                                                        "\" (it has ", absl::StrJoin(names, ", "),
                                                        ")"));
    }
  }
  ShardReader reader(options.env, checkpoint.dir, checkpoint.manifest);
  ReadStats stats;
  std::vector<char> scratch;
  for (const LoadTarget& t : targets) {
    const BufferChunks& buffer = index.at(t.name);
    const int64_t saved_end = std::min(t.range.end, buffer.elements);
    if (saved_end < t.range.end) {
      const int64_t from = std::max(t.range.begin, saved_end);
      std::fill(t.out.begin() + (from - t.range.begin), t.out.end(), 0.0f);
    }
    if (saved_end <= t.range.begin) continue;
    stats.bytes_needed += (saved_end - t.range.begin) * kElementBytes;
    // The first chunk that ends after the range begins.
    auto it = std::upper_bound(buffer.chunks.begin(), buffer.chunks.end(), t.range.begin,
                               [](int64_t index, const ChunkEntry* c) { return index < c->end(); });
    for (; it != buffer.chunks.end() && (*it)->begin() < saved_end; ++it) {
      const ChunkEntry& c = **it;
      const int64_t lo = std::max(t.range.begin, c.begin());  // elements wanted from c
      const int64_t hi = std::min(saved_end, c.end());
      const int64_t bs = c.block_bytes();
      const int64_t lo_byte = (lo - c.begin()) * kElementBytes;
      const int64_t hi_byte = (hi - c.begin()) * kElementBytes;
      const int64_t blocks_per_read = std::max<int64_t>(1, options.read_bytes / bs);
      scratch.resize(blocks_per_read * bs);
      for (int64_t first = lo_byte / bs, last = (hi_byte + bs - 1) / bs; first < last;
           first += blocks_per_read) {
        const int64_t end = std::min(last, first + blocks_per_read);
        RM_RETURN_IF_ERROR(reader.ReadBlocks(c, first, end, scratch.data()));
        // Copy the wanted part of these blocks.
        const int64_t from = std::max(lo_byte, first * bs);
        const int64_t to = std::min(hi_byte, end * bs);
        std::memcpy(reinterpret_cast<char*>(t.out.data()) +
                        ((c.begin() - t.range.begin) * kElementBytes + from),
                    scratch.data() + (from - first * bs), to - from);
      }
    }
  }
  stats.bytes_read = reader.bytes_read();
  stats.blocks_read = reader.blocks_read();
  stats.files_opened = reader.files_opened();
  return stats;
}

absl::StatusOr<LoadResult> LoadCheckpoint(const LoadOptions& options,
                                          absl::Span<const LoadTarget> targets) {
  LoadResult result;
  RM_ASSIGN_OR_RETURN(result.checkpoint, OpenCheckpoint(options));
  RM_ASSIGN_OR_RETURN(result.stats, ReadBuffers(options, result.checkpoint, targets));
  return result;
}

}  // namespace ringmaster::checkpoint
