// Job specs: load from YAML, override fields by path, print, hash.
//
//   absl::StatusOr<JobSpec> spec =
//       spec::LoadJobSpecFile("examples/fashion_mnist_mlp.yaml", {"optimizer.lr=0.01"});
//   if (!spec.ok()) { std::cerr << spec.status().message(); return 2; }  // one error a line
//   std::cout << spec::JobSpecToYaml(*spec);                           // the effective spec
//
// Loading parses the YAML onto the JobSpec proto field by field (spec/yaml_proto.h), applies
// the overrides in order, fills the defaults (spec/defaults.h) and validates
// (spec/validate.h). Every error names the field path as written (`model.mlp.hidden[1]`)
// and where it was written (`job.yaml:7:12`, or the override `--set optimizer.lr=x`); all
// the errors of the parse, or of validation, are reported together, one per line.
//
// Thread-safety: the functions are pure; call them from any thread.
#ifndef RINGMASTER_SPEC_JOB_SPEC_H_
#define RINGMASTER_SPEC_JOB_SPEC_H_

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/job_spec.pb.h"
#include "spec/yaml_proto.h"

namespace ringmaster::spec {

// Reads the YAML file at `path`, applies `overrides` ("path=value", see ApplyOverride),
// fills defaults (an unset name becomes the file's name without its extension, with
// characters other than [A-Za-z0-9._-] replaced by '_') and validates.
// Errors: NOT_FOUND when the file does not exist (other read errors carry their errno's
// code); INVALID_ARGUMENT listing every problem, one per line, as
// "<path>:<line>:<column>: <field path>: <what is wrong>".
absl::StatusOr<JobSpec> LoadJobSpecFile(const std::string& path,
                                        absl::Span<const std::string> overrides = {});

// LoadJobSpecText: the same for YAML text; error locations are "<line>:<column>" and an
// unset name becomes kDefaultJobName.
absl::StatusOr<JobSpec> LoadJobSpecText(absl::string_view yaml,
                                        absl::Span<const std::string> overrides = {});

// Applies one override, "path=value" (as `ringctl ... --set path=value`): the value is a
// YAML scalar or flow collection and is checked like the file's values.
//   "optimizer.lr=0.01"                  a scalar
//   "model.mlp.hidden=[256, 256]"        a list (replaced whole)
//   "model.mlp.hidden[1]=1024"           one existing element
//   "optimizer.sgd.momentum=0.8"         selects sgd in the optimizer oneof, then sets it
//   "resume=1200", "checkpoint.dir="     an empty value unsets the field (its default
//                                        applies again)
// Runs before defaults and validation (values are checked for type, not range). On error
// `spec` is unchanged. `locations` (may be null) records "--set <assignment>" as where
// the fields it writes came from.
// Errors: INVALID_ARGUMENT "--set <assignment>: <field path>: <what is wrong>" for a
// missing '=', an unknown path (with a near-miss suggestion), or a bad value.
absl::Status ApplyOverride(JobSpec* spec, absl::string_view assignment,
                           FieldLocations* locations = nullptr);

// The spec as readable YAML, fields in .proto order; LoadJobSpecText of it gives back an
// equal spec.
std::string JobSpecToYaml(const JobSpec& spec);

// The spec as JSON by protobuf's printer (field names as in YAML, enum values by their
// full proto names: "DECAY_COSINE").
// Errors: INTERNAL if the printer fails (a string field that is not UTF-8).
absl::StatusOr<std::string> JobSpecToJson(const JobSpec& spec);

// xxh3-64 of the spec's deterministic binary serialization. Equal specs have equal hashes,
// on any machine and in any run, whatever the order of the keys in the YAML; hash the
// effective spec (after defaults), so that writing a default or leaving it out agree.
// Fields a spec leaves unset do not contribute, so adding a field to the .proto does not
// change the hashes of existing specs.
uint64_t JobSpecHash(const JobSpec& spec);

// The fields that change how or where a job runs but not what it computes; a resumed job
// may change them (`--set checkpoint.every_steps=...`, a new world size, ZeRO stage or FSDP
// wrapping and prefetch (all of `parallelism`), the gradients' reduction precision, the data
// moved to another directory). precision.reduce is among them although bf16 rounds the
// reduced gradients (as bucket_mb reorders their sums): it belongs to ZeRO-2 and 3 (filled
// for them only), and a checkpoint resumes under any stage.
inline constexpr std::array<absl::string_view, 21> kOperationalFields = {
    "name",
    "backend",
    "device",
    "batch.micro_max",
    "batch.accumulation",
    "parallelism",
    "precision.reduce",
    "checkpoint",
    "resume",
    "diagnostics",
    "metrics",
    "elastic",
    "data.eval_every_epoch",
    "data.fashion_mnist.dir",
    "data.text.path",
    "data.tokens.train",
    "data.tokens.validation",
    "data.mnist.dir",
    "data.eval_every_steps",
    "data.eval_samples",
    "data.final_eval",
};

// JobSpecHash of the spec without kOperationalFields: what a checkpoint records to
// recognise a manifest written by another job (a different model, data, optimizer,
// schedule, batch.global, precision, seed, steps or epochs).
uint64_t TrainingSpecHash(const JobSpec& spec);

// The same fields as text, one "path: value" line each (spec/yaml_proto.h
// MessageToFieldLines): what a checkpoint records beside the hash, so that a resume refused
// for another spec can name the fields that differ.
std::string TrainingSpecText(const JobSpec& spec);

// Whether every rank of the job holds its whole training state (parameters, gradients and
// optimizer state): plain data parallelism, parallelism.zero_stage 0 with no tensor or
// pipeline split of parallelism.mesh. Only then can a rank that joins a running job be given
// the state from a survivor's memory; any other layout needs checkpoint.dir to change its
// world.
bool RanksHoldWholeState(const JobSpec& spec);

// The fields that say how long a job trains. `resume: extend` resumes a checkpoint whose
// spec differs from the job's in these only (a job trained longer).
inline constexpr std::array<absl::string_view, 2> kLengthFields = {"steps", "epochs"};

// The `resume` field: "auto", "never", "extend" (any case) or a step number. "extend" is
// "auto" that also accepts a checkpoint of the same job with another length (kLengthFields).
struct ResumePoint {
  enum class Kind { kAuto, kNever, kStep, kExtend };
  Kind kind = Kind::kAuto;
  int64_t step = 0;  // for kStep
};
// Errors: INVALID_ARGUMENT "expected auto, never, extend or a step number, got ...".
absl::StatusOr<ResumePoint> ParseResume(absl::string_view text);

}  // namespace ringmaster::spec

#endif  // RINGMASTER_SPEC_JOB_SPEC_H_
