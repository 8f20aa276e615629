#!/usr/bin/env bash
# End to end: `ringctl local` runs a job on this machine and exits with its status.
#   1. the Fashion-MNIST example on 2 workers succeeds and its summary says so;
#   2. a bad spec or override is refused before anything runs, naming the field;
#   3. a job whose trainers fail ends "failed" with exit status 1;
#   4. SIGTERM to ringctl cancels the job (exit 130) and leaves no trainer behind.
set -uo pipefail

RINGCTL="$TEST_SRCDIR/ringmaster/cli/ringctl"
SPEC="$TEST_SRCDIR/ringmaster/examples/fashion_mnist_mlp.yaml"
WORK="${TEST_TMPDIR:-/tmp}/ringctl_local_test"
rm -rf "$WORK" && mkdir -p "$WORK"
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
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
grep -q "nowhere" "$WORK/failed.out" || fail "the failure does not name the missing data: $(cat "$WORK/failed.out")"

# 4. SIGTERM cancels.
"$RINGCTL" local --workers 2 "$SPEC" --summary "$WORK/cancel.json" --run_dir "$WORK/cancel" \
  >"$WORK/cancel.out" 2>&1 &
pid=$!
for _ in $(seq 1 300); do
  grep -q "^step" "$WORK/cancel.out" 2>/dev/null && break
  sleep 0.1
done
kill -TERM "$pid"
wait "$pid"
rc=$?
[ "$rc" -eq 130 ] || fail "a cancelled job exited with $rc, expected 130"
[ "$(field "$WORK/cancel.json" status)" = cancelled ] || fail "summary: $(cat "$WORK/cancel.json")"
sleep 0.5
if pgrep -f "ringtrainer.*$WORK/cancel" >/dev/null; then
  fail "trainers still running after the cancel"
  pkill -KILL -f "ringtrainer.*$WORK/cancel"
fi

if [ "$failures" -gt 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all ringctl local checks passed"
