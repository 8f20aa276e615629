// The manifest of a checkpoint (proto/checkpoint.proto) and the training state it carries:
// conversions, structural checks, reading, JSON and a readable description.
//
// Thread-safety: pure functions, except those taking an Env (as safe as the Env).
#ifndef RINGMASTER_CHECKPOINT_MANIFEST_H_
#define RINGMASTER_CHECKPOINT_MANIFEST_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/env.h"
#include "proto/checkpoint.pb.h"
#include "state/tensor.h"
#include "state/training_state.h"

namespace ringmaster::checkpoint {

// The format this build writes and reads.
inline constexpr uint32_t kFormatVersion = 1;
// Buffers are float32 for now; the manifest records the type so that others can follow.
inline constexpr absl::string_view kBufferDtype = "f32";
inline constexpr int64_t kElementBytes = 4;

// What the step loop needs, besides the buffers, to continue where it stopped.
struct TrainingState {
  int64_t step = 0;  // optimizer steps taken: the checkpoint's step
  state::SamplerState sampler;
  uint64_t rng_seed = 0;
  std::string rng_state;                              // opaque bytes for the trainer's generators
  std::optional<state::LossScalerState> loss_scaler;  // fp16 loss scaling only
  int64_t optimizer_step = 0;  // Optimizer::step(), for Optimizer::RestoreStep
  int64_t schedule_step = 0;   // argument of LrSchedule::LrAt for the next update

  bool operator==(const TrainingState&) const = default;
};

TrainingStateProto ToProto(const TrainingState& state);
TrainingState FromProto(const TrainingStateProto& proto);

// The tensor table as manifest entries (dtype f32).
std::vector<TensorEntry> TensorEntries(const state::TensorTable& table);
// OK when the manifest's tensors are `table`'s (names, shapes, offsets, in order);
// FAILED_PRECONDITION naming the first difference otherwise ("tensor 3: the checkpoint has
// fc2.weight [512, 10] at 401408, the model has fc2.weight [256, 10] at 200704"). A
// manifest without tensors (written without a table) matches any table.
absl::Status CheckTensorTable(const Manifest& manifest, const state::TensorTable& table);

// Structural problems of a manifest, one sentence each (empty when sound): unknown buffers
// or files, chunks outside their buffer or file, wrong lengths or block counts, and
// buffers whose chunks do not tile [0, elements) exactly.
std::vector<std::string> ManifestProblems(const Manifest& manifest);

// Reads <dir>/MANIFEST and checks it: NOT_FOUND when `dir` does not exist; DATA_LOSS naming
// the file and offset when MANIFEST is missing from an existing directory, corrupt, or
// structurally unsound; FAILED_PRECONDITION for a format this build does not read.
absl::StatusOr<Manifest> ReadManifest(Env* env, const std::string& dir);

// The manifest as manifest.json, for people: protobuf's JSON with the .proto field names,
// indented, of JsonMirror(manifest).
std::string ManifestToJson(const Manifest& manifest);
// The manifest without the per-block checksums (block_xxh3), which are machine data, only
// in MANIFEST: there can be thousands per buffer, and protobuf's JSON printer takes about
// 1.5 µs each, on the commit's critical path.
Manifest JsonMirror(const Manifest& manifest);
// Parses manifest.json. INVALID_ARGUMENT with the parser's message.
absl::StatusOr<Manifest> ManifestFromJson(absl::string_view json);

// A readable description for `ringctl checkpoint inspect`: job, step, spec hash, world size
// and ZeRO stage at save, time, training state, buffers, files and tensors.
std::string DescribeManifest(const Manifest& manifest);

// Bytes of the shard files together.
int64_t ManifestBytes(const Manifest& manifest);

// Number of blocks of `block_bytes` in `length` bytes (the last may be shorter).
int64_t BlockCount(int64_t length, int64_t block_bytes);

}  // namespace ringmaster::checkpoint

#endif  // RINGMASTER_CHECKPOINT_MANIFEST_H_
