#!/usr/bin/env bash
# Checks ARCHITECTURE.md's "Who may depend on whom" with bazel query: each forbidden path
# between libraries must be empty (tests and benchmarks may link what they measure, so only
# cc_library targets are the sources). Bazel visibility refuses a new such edge at build
# time; this says which rule a change would break, by name. Prints one line per rule and
# exits 1 when any path exists.
set -uo pipefail
cd "$(dirname "$0")/.."

libs() { echo "kind(cc_library, $1)"; }
rules=(
  "checkpoint/ includes nothing of train/|$(libs //checkpoint/...)|//train/..."
  "state/ depends on neither train/ nor checkpoint/|$(libs //state/...)|//train/... + //checkpoint/..."
  "comm/ knows nothing of train/, proto/, the coordinator or worker/|$(libs //comm/...)|//train/... + //proto/... + //coordinator/... + //worker/..."
  "train/ reads neither proto/job_spec nor spec/|$(libs //train/...)|//proto:job_spec_proto + //spec/..."
  "the coordinator links no train/, kernels/ or comm/|$(libs //coordinator/...)|//train/... + //kernels/... + //comm/..."
  "client/ depends on no worker/, cli/ or coordinator/|$(libs //client/...)|//worker/... + //cli/... + //coordinator/..."
  "no library depends on worker/, cli/ or coordinator/ from outside|$(libs //train/... + //comm/... + //checkpoint/... + //state/... + //client/... + //config/... + //kernels/... + //common/...)|//worker/... + //cli/... + //coordinator/..."
)
failed=0
for rule in "${rules[@]}"; do
  IFS='|' read -r what from to <<<"$rule"
  errors=$(mktemp)
  path=$(bazel query --noshow_progress "somepath($from, $to)" 2>"$errors")
  if [ $? -ne 0 ]; then
    echo "layering: FAILED (query error): $what"; tail -3 "$errors"; failed=1
  elif [ -n "$path" ]; then
    echo "layering: FAILED: $what; a path: $(echo $path | tr '\n' ' ')"; failed=1
  else
    echo "layering: ok: $what"
  fi
  rm -f "$errors"
done
exit $failed
