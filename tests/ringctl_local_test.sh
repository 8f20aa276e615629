#!/usr/bin/env bash
# End to end: `ringctl local` runs a job on this machine and exits with its status.
#   1. the Fashion-MNIST example on 2 workers succeeds and its summary says so;
#   2. a bad spec or override is refused before anything runs, naming the field;
#   3. a job whose trainers fail ends "failed" with exit status 1;
#   4. SIGTERM to ringctl cancels the job (exit 130) and leaves no trainer behind;
#   5. with checkpoints, SIGTERM drains (a checkpoint of the last step), the job resumes on
#      another number of workers, and `ringctl checkpoint` lists, verifies and catches a
#      flipped byte;
#   6. the same checkpoint.dir under a changed spec fails at once, spending no restart; so do
#      a damaged checkpoint with none before it (with one before it, the job resumes from
#      that) and a configuration error that only a trainer finds;
#   7. `ringctl local` prints where its coordinator listens, and `ringctl status` and `top`
#      work on it; its temporary run directory is removed at the end unless --keep_run_dir
#      is given, --run_dir was given or the job failed, and it says so; `ringctl checkpoint
#      verify` on a job directory verifies each of its checkpoints.
set -uo pipefail

RINGCTL="$TEST_SRCDIR/ringmaster/cli/ringctl"
SPEC="$TEST_SRCDIR/ringmaster/examples/fashion_mnist_mlp.yaml"
WORK="${TEST_TMPDIR:-/tmp}/ringctl_local_test"
rm -rf "$WORK" && mkdir -p "$WORK/tmp"
export TMPDIR="$WORK/tmp"  # where `ringctl local` makes its temporary run directories
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
# Runs `ringctl local ...` in the background with its output in $1, sends it SIGTERM once a
# line matching $2 appears, and sets rc to its exit status.
# `after_start`, when set, runs once the pattern is there.
after_start=""
run_then_term() {
  local out="$1" pattern="$2" pid
  shift 2
  "$RINGCTL" local "$@" >"$out" 2>&1 &
  pid=$!
  for _ in $(seq 1 300); do
    grep -q "$pattern" "$out" 2>/dev/null && break
    sleep 0.1
  done
  [ -n "$after_start" ] && "$after_start" "$out"
  kill -TERM "$pid"
  wait "$pid"
  rc=$?
}
# The run directory and the coordinator's address `ringctl local` printed in $1.
run_dir_of() { grep -o "run directory [^ ]*" "$1" | head -1 | cut -d' ' -f3; }
address_of() { grep -o "coordinator at 127.0.0.1:[0-9]*" "$1" | head -1 | cut -d' ' -f3; }
field() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }

if [ ! -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  echo "SKIP: Debian's dataset-fashion-mnist is not installed (tools/setup.sh installs it)"
  exit 0
fi

# 1. A short job on 2 workers.
"$RINGCTL" local --workers 2 "$SPEC" --set steps=120 --set schedule.warmup_steps=10 \
  --set parallelism.bucket_mb=1 --summary "$WORK/ok.json" --run_dir "$WORK/ok" >"$WORK/ok.out" 2>&1
rc=$?
[ "$rc" -eq 0 ] || fail "the example job exited with $rc: $(tail -5 "$WORK/ok.out")"
[ "$(field "$WORK/ok.json" status)" = succeeded ] || fail "summary status: $(cat "$WORK/ok.json")"
[ "$(field "$WORK/ok.json" steps)" = 120 ] || fail "summary steps: $(cat "$WORK/ok.json")"
[ "$(field "$WORK/ok.json" world_size)" = 2 ] || fail "summary world_size: $(cat "$WORK/ok.json")"
python3 -c 'import json,sys; a=json.load(open(sys.argv[1]))["eval_accuracy"]; sys.exit(0 if a > 0.75 else 1)' \
  "$WORK/ok.json" || fail "test accuracy after 120 steps: $(cat "$WORK/ok.json")"
grep -q "test_accuracy" "$WORK/ok.out" || fail "no progress line with the test accuracy"
# The memory, traffic and times the README promises in the summary, against what this job
# must have: the MLP 784-512-512-10's 669,706 parameters in fp32 (padded a little for the
# world), gradients as many, SGD's momentum as many, no unit buffers (ZeRO-0); a ring
# all-reduce on 2 ranks sends each rank's whole gradient once a step; the throughput is
# 120 steps' samples (an epoch of 60,000 ends in a short batch) over the training time, the
# evaluations timed apart.
if ! python3 - "$WORK/ok.json" >"$WORK/ok.figures" 2>&1 <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
params = 784 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10
per_epoch = -(-60000 // 512)
samples = sum(60000 - (i % per_epoch) * 512 if i % per_epoch == per_epoch - 1 else 512
              for i in range(120))
p = s.get("parameter_bytes", 0)
checks = {
    "parameters": s.get("parameters") == params,
    "parameter_bytes": 4 * params <= p <= 4 * params + 4096,
    "gradient_bytes": s.get("gradient_bytes") == p,
    "optimizer_state_bytes": 4 * params <= s.get("optimizer_state_bytes", 0) <= p,
    "unit_buffer_bytes": s.get("unit_buffer_bytes") == 0,
    "activation_bytes_peak": s.get("activation_bytes_peak", 0) > 0,
    "peak_rss_bytes": 3 * p < s.get("peak_rss_bytes", 0) < 4 << 30,
    "comm_bytes_per_step": 0.99 * p <= s.get("comm_bytes_per_step", 0) <= 1.05 * p,
    "samples_per_second": abs(s.get("samples_per_second", 0) * s.get("training_seconds", 0)
                              - samples) < 1,
    "evaluations": s.get("evaluations", 0) >= 1 and s.get("eval_seconds", 0) > 0,
    "elapsed_seconds": s.get("training_seconds", 0) + s.get("eval_seconds", 0)
                       <= s.get("elapsed_seconds", 0) * 1.001,
}
bad = [k for k, ok in checks.items() if not ok]
if bad:
    print("wrong or missing:", ", ".join(bad), json.dumps(s))
    sys.exit(1)
PY
then
  fail "the summary's figures: $(cat "$WORK/ok.figures")"
fi
grep -q "s training, .* s in 1 evaluation" "$WORK/ok.out" ||
  fail "the final line does not give the training and evaluation times: $(tail -2 "$WORK/ok.out")"
[ -n "$(address_of "$WORK/ok.out")" ] || fail "no coordinator address: $(head -3 "$WORK/ok.out")"
[ -f "$WORK/ok/job.yaml" ] && grep -q "kept the run directory $WORK/ok" "$WORK/ok.out" ||
  fail "the --run_dir was not kept: $(tail -3 "$WORK/ok.out")"

# 2. Bad input is refused before anything runs, naming the field.
"$RINGCTL" local --workers 2 "$SPEC" --set optimizer.lr=-1 >"$WORK/bad.out" 2>&1
rc=$?
[ "$rc" -eq 2 ] || fail "a negative learning rate exited with $rc, expected 2"
grep -q "optimizer.lr" "$WORK/bad.out" || fail "the error does not name optimizer.lr: $(cat "$WORK/bad.out")"
"$RINGCTL" local --workers 2 "$SPEC" --set optimizer.sgd.momentom=0.5 >"$WORK/typo.out" 2>&1
[ $? -eq 2 ] || fail "a misspelt field was accepted"
grep -q 'did you mean "momentum"' "$WORK/typo.out" || fail "no suggestion for momentom: $(cat "$WORK/typo.out")"
"$RINGCTL" local --workers 0 "$SPEC" >"$WORK/workers.out" 2>&1
[ $? -eq 2 ] || fail "--workers 0 was accepted"
grep -q -- "--workers" "$WORK/workers.out" || fail "the error does not name --workers"

# 3. Trainers that fail (no data there) make the job fail.
"$RINGCTL" local --workers 2 "$SPEC" --set data.fashion_mnist.dir="$WORK/nowhere" \
  --summary "$WORK/failed.json" >"$WORK/failed.out" 2>&1
rc=$?
[ "$rc" -eq 1 ] || fail "a job whose data is missing exited with $rc, expected 1"
[ "$(field "$WORK/failed.json" status)" = failed ] || fail "summary: $(cat "$WORK/failed.json")"
failed_dir="$(run_dir_of "$WORK/failed.out")"
[ -d "$failed_dir" ] && grep -q "the job failed, its logs say why" "$WORK/failed.out" ||
  fail "a failed job's temporary run directory was not kept: $(tail -3 "$WORK/failed.out")"
grep -q "nowhere" "$WORK/failed.out" || fail "the failure does not name the missing data: $(cat "$WORK/failed.out")"

# 4. SIGTERM cancels.
run_then_term "$WORK/cancel.out" "^step" --workers 2 "$SPEC" \
  --summary "$WORK/cancel.json" --run_dir "$WORK/cancel"
[ "$rc" -eq 130 ] || fail "a cancelled job exited with $rc, expected 130"
[ "$(field "$WORK/cancel.json" status)" = cancelled ] || fail "summary: $(cat "$WORK/cancel.json")"
sleep 0.5
if pgrep -f "ringtrainer.*$WORK/cancel" >/dev/null; then
  fail "trainers still running after the cancel"
  pkill -KILL -f "ringtrainer.*$WORK/cancel"
fi

# 5. Drain, resume elsewhere, verify.
CK="$WORK/checkpoints"
# While it runs: ringctl status and top on the coordinator it printed (7).
query_running() {
  local addr
  addr="$(address_of "$1")"
  [ -n "$addr" ] || { fail "no coordinator address printed: $(head -3 "$1")"; return; }
  "$RINGCTL" status fashion_mnist_mlp --coordinator "$addr" -o json >"$WORK/query.json" 2>&1
  python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); sys.exit(j["phase"] != "JOB_PHASE_RUNNING")' \
    "$WORK/query.json" || fail "ringctl status on the local coordinator: $(head -5 "$WORK/query.json")"
  timeout 5 "$RINGCTL" top fashion_mnist_mlp --coordinator "$addr" 2>&1 | head -4 >"$WORK/top.out"
  grep -q "RANK *SLOT *STEP" "$WORK/top.out" || fail "ringctl top on the local coordinator: $(head -5 "$WORK/top.out")"
}
after_start=query_running
run_then_term "$WORK/drain.out" "^step 30/" --workers 2 "$SPEC" \
  --set checkpoint.dir="$CK" --set checkpoint.every_steps=25 --set epochs=1 \
  --set diagnostics.log_every=5 --summary "$WORK/drain.json"
after_start=""
[ "$rc" -eq 130 ] || fail "the drained job exited with $rc, expected 130"
grep -q "drained after step" "$WORK/drain.out" || fail "no drain: $(tail -5 "$WORK/drain.out")"
drain_dir="$(run_dir_of "$WORK/drain.out")"
[ -n "$drain_dir" ] && [ ! -e "$drain_dir" ] && grep -q "removed the run directory $drain_dir" "$WORK/drain.out" ||
  fail "the temporary run directory $drain_dir was not removed: $(tail -3 "$WORK/drain.out")"
[ "$(field "$WORK/drain.json" run_dir_kept)" = False ] || fail "summary: $(cat "$WORK/drain.json")"
"$RINGCTL" local --workers 3 "$SPEC" --set checkpoint.dir="$CK" --set checkpoint.every_steps=25 \
  --set epochs=1 --summary "$WORK/resumed.json" --keep_run_dir >"$WORK/resumed.out" 2>&1
[ $? -eq 0 ] || fail "the resumed job failed: $(tail -5 "$WORK/resumed.out")"
resumed_from="$(field "$WORK/resumed.json" resumed_from_step)"
[ "$resumed_from" -gt 0 ] 2>/dev/null || fail "the job did not resume: $(cat "$WORK/resumed.json")"
grep -q "saved by 2 ranks" "$WORK/resumed.out" || fail "no resume message: $(head -8 "$WORK/resumed.out")"
kept_dir="$(run_dir_of "$WORK/resumed.out")"
[ -f "$kept_dir/job.yaml" ] && grep -q "kept the run directory $kept_dir" "$WORK/resumed.out" ||
  fail "--keep_run_dir did not keep $kept_dir: $(tail -3 "$WORK/resumed.out")"
"$RINGCTL" checkpoint list "$CK/fashion_mnist_mlp" >"$WORK/list.out" 2>&1 || fail "checkpoint list failed"
grep -q "LATEST" "$WORK/list.out" || fail "checkpoint list: $(cat "$WORK/list.out")"
latest="$CK/fashion_mnist_mlp/$(cat "$CK/fashion_mnist_mlp/LATEST")"
"$RINGCTL" checkpoint verify "$latest" >"$WORK/verify.out" 2>&1 || fail "verify: $(cat "$WORK/verify.out")"
"$RINGCTL" checkpoint inspect "$latest" | grep -q "fc1.weight" || fail "inspect shows no tensors"
# 6. The same checkpoint.dir under a changed spec: an error no restart can fix, so the job
#    fails at once (no restart spent) and says what to change.
"$RINGCTL" local --workers 2 "$SPEC" --set checkpoint.dir="$CK" --set epochs=1 --set seed=7 \
  --summary "$WORK/other.json" >"$WORK/other.out" 2>&1
rc=$?
[ "$rc" -eq 1 ] || fail "a job resuming another job's checkpoint exited with $rc, expected 1"
grep -q "written with another spec: the fields that differ: seed: 1 in the checkpoint, 7 here" \
  "$WORK/other.out" && grep -q "no restart can fix" "$WORK/other.out" &&
  grep -q "checkpoint.dir points elsewhere" "$WORK/other.out" ||
  fail "the failure does not say why and what to change: $(tail -3 "$WORK/other.out")"
[ "$(field "$WORK/other.json" restarts)" = 0 ] || fail "restarts were spent: $(cat "$WORK/other.json")"
[ "$(cat "$CK/fashion_mnist_mlp/LATEST")" = "$(basename "$latest")" ] ||
  fail "the failed job changed the checkpoints: LATEST is $(cat "$CK/fashion_mnist_mlp/LATEST")"

# 7. The data is missing on this node (the only one): no restart here can fix it and there
#    is no other node, so the job fails at once, naming the file, spending no restart.
"$RINGCTL" local --workers 2 "$SPEC" --set data.fashion_mnist.dir="$WORK/no-data" \
  --set epochs=1 --summary "$WORK/nodata.json" >"$WORK/nodata.out" 2>&1
rc=$?
[ "$rc" -eq 1 ] || fail "a job without its data exited with $rc, expected 1"
grep -q "no restart on node local can fix" "$WORK/nodata.out" &&
  grep -q "$WORK/no-data/train-images-idx3-ubyte.gz" "$WORK/nodata.out" ||
  fail "the failure does not name the node and the file: $(tail -3 "$WORK/nodata.out")"
[ "$(field "$WORK/nodata.json" restarts)" = 0 ] || fail "restarts were spent: $(cat "$WORK/nodata.json")"

# 8. A job directory: each committed checkpoint verified.
"$RINGCTL" checkpoint verify "$CK/fashion_mnist_mlp" >"$WORK/verify_job.out" 2>&1 ||
  fail "verify of the job directory: $(cat "$WORK/verify_job.out")"
steps="$(ls -d "$CK"/fashion_mnist_mlp/step-* | wc -l)"
[ "$(grep -c "verified" "$WORK/verify_job.out")" -eq "$steps" ] && [ "$steps" -gt 1 ] &&
  grep -q "$steps checkpoints, $steps sound, 0 damaged" "$WORK/verify_job.out" ||
  fail "verify of the job directory did not verify its $steps checkpoints: $(cat "$WORK/verify_job.out")"

# 8b. Issue 36 point 21: the newest checkpoint damaged (a byte of a shard flipped, in a copy).
#     With checkpoints before it, the job resumes from the newest of those and says why; with
#     none, every restart would read it again, so the job fails at once (no restart spent),
#     the damage named first. Before, it went through the restart budget and led with that.
damage_latest() {  # $1: a copy of the job directory's root; prints the damaged step directory
  local step_dir
  step_dir="$1/fashion_mnist_mlp/$(cat "$1/fashion_mnist_mlp/LATEST")"
  python3 - "$(ls "$step_dir"/shard-0-of-*.bin | head -1)" <<'PY'
import sys
path = sys.argv[1]
data = bytearray(open(path, "rb").read())
data[len(data) // 2] ^= 0x5A
open(path, "wb").write(bytes(data))
PY
  echo "$step_dir"
}
cp -r "$CK" "$WORK/damaged"
damaged_step="$(damage_latest "$WORK/damaged")"
previous="$(ls -d "$WORK"/damaged/fashion_mnist_mlp/step-* | sed 's/.*step-//' | sort -n | tail -2 | head -1)"
"$RINGCTL" local --workers 2 "$SPEC" --set checkpoint.dir="$WORK/damaged" \
  --set checkpoint.every_steps=25 --set epochs=1 --summary "$WORK/fellback.json" \
  >"$WORK/fellback.out" 2>&1
rc=$?
[ "$rc" -eq 0 ] || fail "a job whose newest checkpoint is damaged exited with $rc: $(tail -3 "$WORK/fellback.out")"
[ "$(field "$WORK/fellback.json" resumed_from_step)" = "$previous" ] ||
  fail "did not resume from step $previous: $(cat "$WORK/fellback.json")"
grep -q "checkpoint $(basename "$damaged_step") is damaged (.*): resuming from step-$previous" \
  "$WORK/fellback.out" || fail "the fallback is not said: $(grep -m3 "damaged\|resumed" "$WORK/fellback.out")"
mkdir -p "$WORK/damaged_only/fashion_mnist_mlp"
cp -r "$CK/fashion_mnist_mlp/LATEST" "$latest" "$WORK/damaged_only/fashion_mnist_mlp/"
damaged_step="$(damage_latest "$WORK/damaged_only")"
"$RINGCTL" local --workers 2 "$SPEC" --set checkpoint.dir="$WORK/damaged_only" \
  --set checkpoint.every_steps=25 --set epochs=1 --summary "$WORK/damaged.json" \
  >"$WORK/damaged.out" 2>&1
rc=$?
[ "$rc" -eq 1 ] || fail "a job resuming its only checkpoint, damaged, exited with $rc, expected 1"
grep -q "failed: error on local/[0-9] that no restart can fix: DATA_LOSS: the checkpoint to resume from is damaged: $damaged_step/shard-0-of-" \
  "$WORK/damaged.out" || fail "the damage is not named first: $(tail -3 "$WORK/damaged.out")"
[ "$(field "$WORK/damaged.json" restarts)" = 0 ] || fail "restarts were spent: $(cat "$WORK/damaged.json")"

# 8c. Issue 36 point 10: a configuration error that only a trainer finds (pipeline micro-batches
#     larger than batch.micro_max on this world) fails the job at once, named a configuration
#     error, not a collective error after the restart budget.
(cd "$WORK" && "$RINGCTL" local --workers 2 "$TEST_SRCDIR/ringmaster/examples/tiny_gpt.yaml" \
  --set steps=4 --set parallelism.mesh.pp=2 --set batch.micro_max=2 \
  --summary "$WORK/config.json" >"$WORK/config.out" 2>&1)
rc=$?
[ "$rc" -eq 1 ] || fail "a job a trainer cannot configure exited with $rc, expected 1"
grep -q "failed: error on local/[0-9] that no restart can fix: INVALID_ARGUMENT: configuration error: batch.micro_max is 2" \
  "$WORK/config.out" || fail "not a configuration error: $(tail -3 "$WORK/config.out")"
grep -q "collective error\|restart budget" "$WORK/config.out" &&
  fail "named a collective error: $(tail -3 "$WORK/config.out")"
[ "$(field "$WORK/config.json" restarts)" = 0 ] || fail "restarts were spent: $(cat "$WORK/config.json")"

# 9. A memory bomb: a rank this machine cannot hold is refused before anything runs, naming
#    the field and the sizes (it used to die of an uncaught bad_alloc, restart after restart).
"$RINGCTL" local --workers 1 "$SPEC" --set 'model.mlp.hidden=[1000000, 1000000]' \
  >"$WORK/bomb.out" 2>&1
rc=$?
[ "$rc" -eq 2 ] || fail "a job no node can hold exited with $rc, expected 2: $(tail -3 "$WORK/bomb.out")"
grep -q "resources.memory_per_rank_mib: a rank of job fashion_mnist_mlp needs" "$WORK/bomb.out" ||
  fail "the refusal does not name the field and the sizes: $(tail -3 "$WORK/bomb.out")"

shard="$(ls "$latest"/shard-1-of-*.bin | head -1)"
printf '\x5a' | dd of="$shard" bs=1 seek=4000 conv=notrunc status=none
"$RINGCTL" checkpoint verify "$latest" >"$WORK/corrupt.out" 2>&1
[ $? -eq 1 ] || fail "a flipped byte was not detected"
grep -q "DATA_LOSS" "$WORK/corrupt.out" && grep -q "shard-1-of" "$WORK/corrupt.out" ||
  fail "the corruption report does not name the shard: $(cat "$WORK/corrupt.out")"
"$RINGCTL" checkpoint verify "$CK/fashion_mnist_mlp" >"$WORK/corrupt_job.out" 2>&1
[ $? -eq 1 ] && grep -q "shard-1-of" "$WORK/corrupt_job.out" && grep -q "1 damaged" "$WORK/corrupt_job.out" ||
  fail "verify of the job directory missed the flipped byte: $(cat "$WORK/corrupt_job.out")"

if [ "$failures" -gt 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all ringctl local checks passed"
