#include "checkpoint/manifest.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "checkpoint/framed_file.h"
#include "checkpoint/layout.h"
#include "common/status_macros.h"
#include "google/protobuf/util/json_util.h"

namespace ringmaster::checkpoint {
namespace {

std::string Bytes(int64_t bytes) {
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  if (bytes < (int64_t{1} << 20)) return absl::StrFormat("%.1f KiB", bytes / 1024.0);
  if (bytes < (int64_t{1} << 30)) return absl::StrFormat("%.1f MiB", bytes / 1048576.0);
  return absl::StrFormat("%.2f GiB", bytes / 1073741824.0);
}

std::string Shape(const TensorEntry& t) {
  return absl::StrCat("[", absl::StrJoin(t.shape(), ", "), "]");
}

std::string TensorString(const TensorEntry& t) {
  return absl::StrCat(t.name(), " ", Shape(t), " at ", t.offset());
}

// Where chunks of one buffer leave a gap or overlap.
void CheckTiling(const std::string& buffer, int64_t elements,
                 std::vector<std::pair<int64_t, int64_t>> ranges,
                 std::vector<std::string>* problems) {
  std::sort(ranges.begin(), ranges.end());
  int64_t covered = 0;
  for (const auto& [begin, end] : ranges) {
    if (begin > covered) {
      problems->push_back(absl::StrCat("buffer ", buffer, ": elements [", covered, ", ", begin,
                                       ") are in no chunk"));
    } else if (begin < covered) {
      problems->push_back(absl::StrCat("buffer ", buffer, ": elements [", begin, ", ",
                                       std::min(covered, end), ") are in more than one chunk"));
    }
    covered = std::max(covered, end);
  }
  if (covered < elements) {
    problems->push_back(absl::StrCat("buffer ", buffer, ": elements [", covered, ", ", elements,
                                     ") are in no chunk"));
  }
}

}  // namespace

TrainingStateProto ToProto(const TrainingState& state) {
  TrainingStateProto p;
  p.set_step(state.step);
  p.set_sampler_epoch(state.sampler.epoch);
  p.set_sampler_cursor(state.sampler.cursor);
  p.set_rng_seed(state.rng_seed);
  p.set_rng_state(state.rng_state);
  if (state.loss_scaler) {
    LossScalerProto* s = p.mutable_loss_scaler();
    s->set_scale(state.loss_scaler->scale);
    s->set_good_steps(state.loss_scaler->good_steps);
    s->set_steps(state.loss_scaler->steps);
    s->set_skipped_steps(state.loss_scaler->skipped_steps);
  }
  p.set_optimizer_step(state.optimizer_step);
  p.set_schedule_step(state.schedule_step);
  return p;
}

TrainingState FromProto(const TrainingStateProto& p) {
  TrainingState state;
  state.step = p.step();
  state.sampler.epoch = p.sampler_epoch();
  state.sampler.cursor = p.sampler_cursor();
  state.rng_seed = p.rng_seed();
  state.rng_state = p.rng_state();
  if (p.has_loss_scaler()) {
    const LossScalerProto& s = p.loss_scaler();
    state.loss_scaler =
        state::LossScalerState{s.scale(), s.good_steps(), s.steps(), s.skipped_steps()};
  }
  state.optimizer_step = p.optimizer_step();
  state.schedule_step = p.schedule_step();
  return state;
}

std::vector<TensorEntry> TensorEntries(const state::TensorTable& table) {
  std::vector<TensorEntry> entries;
  for (const state::TensorSpec& t : table.tensors()) {
    TensorEntry& e = entries.emplace_back();
    e.set_name(t.name);
    e.set_dtype(std::string(kBufferDtype));
    for (int64_t d : t.shape) e.add_shape(d);
    e.set_offset(t.offset);
    e.set_numel(t.numel);
  }
  return entries;
}

absl::Status CheckTensorTable(const Manifest& manifest, const state::TensorTable& table) {
  if (manifest.tensors().empty()) return absl::OkStatus();
  std::vector<TensorEntry> model = TensorEntries(table);
  const int n = std::max<int>(manifest.tensors_size(), model.size());
  for (int i = 0; i < n; ++i) {
    std::string saved = i < manifest.tensors_size() ? TensorString(manifest.tensors(i)) : "none";
    std::string ours = i < static_cast<int>(model.size()) ? TensorString(model[i]) : "none";
    if (saved != ours) {
      return absl::FailedPreconditionError(
          absl::StrCat("the checkpoint's tensors differ from the model's: tensor ", i,
                       ": the checkpoint has ", saved, ", the model has ", ours));
    }
  }
  return absl::OkStatus();
}

int64_t BlockCount(int64_t length, int64_t block_bytes) {
  return block_bytes <= 0 ? 0 : (length + block_bytes - 1) / block_bytes;
}

std::vector<std::string> ManifestProblems(const Manifest& manifest) {
  std::vector<std::string> problems;
  absl::flat_hash_map<std::string, int64_t> elements;
  for (const BufferEntry& b : manifest.buffers()) {
    if (b.name().empty() || b.elements() < 0 || b.dtype() != kBufferDtype) {
      problems.push_back(absl::StrCat("buffer \"", b.name(), "\" (", b.dtype(), ", ", b.elements(),
                                      " elements) is not a valid f32 buffer"));
    }
    if (!elements.emplace(b.name(), b.elements()).second) {
      problems.push_back(absl::StrCat("buffer ", b.name(), " is listed twice"));
    }
  }
  absl::flat_hash_map<std::string, int64_t> file_bytes;
  for (const ShardFile& f : manifest.files()) {
    if (f.name().empty() || f.name().find('/') != std::string::npos || f.bytes() < 0 ||
        !file_bytes.emplace(f.name(), f.bytes()).second) {
      problems.push_back(absl::StrCat("file \"", f.name(), "\" is invalid or listed twice"));
    }
  }
  absl::flat_hash_map<std::string, std::vector<std::pair<int64_t, int64_t>>> ranges;
  for (int i = 0; i < manifest.chunks_size(); ++i) {
    const ChunkEntry& c = manifest.chunks(i);
    const std::string what =
        absl::StrCat("chunk ", i, " (", c.buffer(), " [", c.begin(), ", ", c.end(), ") at offset ",
                     c.offset(), " of ", c.file(), ")");
    auto buffer = elements.find(c.buffer());
    auto file = file_bytes.find(c.file());
    if (buffer == elements.end()) {
      problems.push_back(absl::StrCat(what, ": no such buffer"));
      continue;
    }
    if (file == file_bytes.end()) {
      problems.push_back(absl::StrCat(what, ": no such file"));
      continue;
    }
    if (c.begin() < 0 || c.end() <= c.begin() || c.end() > buffer->second) {
      problems.push_back(absl::StrCat(what, ": not a non-empty range of the buffer's ",
                                      buffer->second, " elements"));
      continue;
    }
    if (c.length() != (c.end() - c.begin()) * kElementBytes || c.offset() < 0 ||
        c.offset() + c.length() > file->second) {
      problems.push_back(absl::StrCat(what, ": length ", c.length(), " does not fit the range or ",
                                      "the file's ", file->second, " bytes"));
      continue;
    }
    if (c.block_bytes() <= 0 || c.block_bytes() % kElementBytes != 0 ||
        c.block_xxh3_size() != BlockCount(c.length(), c.block_bytes())) {
      problems.push_back(absl::StrCat(what, ": ", c.block_xxh3_size(), " checksums for ",
                                      c.length(), " bytes in blocks of ", c.block_bytes()));
      continue;
    }
    ranges[c.buffer()].emplace_back(c.begin(), c.end());
  }
  for (const BufferEntry& b : manifest.buffers()) {
    auto it = ranges.find(b.name());
    CheckTiling(b.name(), b.elements(),
                it == ranges.end() ? std::vector<std::pair<int64_t, int64_t>>{} : it->second,
                &problems);
  }
  return problems;
}

absl::StatusOr<Manifest> ReadManifest(Env* env, const std::string& dir) {
  RM_RETURN_IF_ERROR(env->IsDirectory(dir));
  const std::string path = JoinPath(dir, kManifestName);
  Manifest manifest;
  absl::Status s = ReadFramedProto(env, path, kManifestMagic, &manifest);
  if (absl::IsNotFound(s)) {
    return absl::DataLossError(absl::StrCat(path, " is missing (", s.message(), ")"));
  }
  RM_RETURN_IF_ERROR(s);
  if (manifest.format_version() != kFormatVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": format version ", manifest.format_version(),
                     "; this build reads version ", kFormatVersion));
  }
  std::vector<std::string> problems = ManifestProblems(manifest);
  if (!problems.empty()) {
    return absl::DataLossError(absl::StrCat(
        path, ": ", problems.front(),
        problems.size() > 1 ? absl::StrCat(" (and ", problems.size() - 1, " more problems)") : ""));
  }
  return manifest;
}

Manifest JsonMirror(const Manifest& manifest) {
  Manifest mirror = manifest;
  for (ChunkEntry& c : *mirror.mutable_chunks()) c.clear_block_xxh3();
  return mirror;
}

std::string ManifestToJson(const Manifest& manifest) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  // Printing a message without unknown types or invalid UTF-8 cannot fail; names come from
  // the job spec, which is validated UTF-8.
  (void)google::protobuf::util::MessageToJsonString(JsonMirror(manifest), &json, options);
  return json;
}

absl::StatusOr<Manifest> ManifestFromJson(absl::string_view json) {
  Manifest manifest;
  auto s = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), &manifest);
  if (!s.ok()) return absl::InvalidArgumentError(std::string(s.message()));
  return manifest;
}

int64_t ManifestBytes(const Manifest& manifest) {
  int64_t total = 0;
  for (const ShardFile& f : manifest.files()) total += f.bytes();
  return total;
}

std::string DescribeManifest(const Manifest& m) {
  std::string out = absl::StrFormat(
      "checkpoint of job %s at step %d (format %d)\n"
      "  spec hash %#018x; written by %d ranks, ZeRO stage %d, at %s\n",
      m.job(), m.step(), m.format_version(), m.spec_hash(), m.world_size(), m.zero_stage(),
      absl::FormatTime("%Y-%m-%d %H:%M:%E3S UTC", absl::FromUnixMicros(m.created_unix_micros()),
                       absl::UTCTimeZone()));
  const TrainingState s = FromProto(m.training());
  absl::StrAppend(&out, "  training: step ", s.step, ", ", state::SamplerStateString(s.sampler),
                  ", optimizer step ", s.optimizer_step, ", schedule step ", s.schedule_step,
                  ", rng seed ", s.rng_seed, " (", s.rng_state.size(),
                  " bytes of generator state)");
  if (s.loss_scaler) {
    absl::StrAppend(&out, ", loss scale ", s.loss_scaler->scale, " (", s.loss_scaler->good_steps,
                    " good steps in a row, ", s.loss_scaler->skipped_steps, " of ",
                    s.loss_scaler->steps, " steps skipped)");
  }
  absl::StrAppend(&out, "\n  buffers:\n");
  for (const BufferEntry& b : m.buffers()) {
    int chunks = 0;
    int64_t blocks = 0;
    for (const ChunkEntry& c : m.chunks()) {
      if (c.buffer() != b.name()) continue;
      ++chunks;
      blocks += c.block_xxh3_size();
    }
    absl::StrAppendFormat(
        &out, "    %-12s %s %d elements (%s) in %d chunks, %d checksummed blocks\n", b.name(),
        b.dtype(), b.elements(), Bytes(b.elements() * kElementBytes), chunks, blocks);
  }
  absl::StrAppend(&out, "  files (", Bytes(ManifestBytes(m)), " together):\n");
  for (const ShardFile& f : m.files()) {
    absl::StrAppendFormat(&out, "    %s  %d bytes (%s), rank %d\n", f.name(), f.bytes(),
                          Bytes(f.bytes()), f.rank());
  }
  absl::StrAppend(&out, "  tensors (", m.tensors_size(), "):\n");
  for (const TensorEntry& t : m.tensors()) {
    absl::StrAppendFormat(&out, "    %-32s %s %-16s offset %d, %d elements\n", t.name(), t.dtype(),
                          Shape(t), t.offset(), t.numel());
  }
  return out;
}

}  // namespace ringmaster::checkpoint
