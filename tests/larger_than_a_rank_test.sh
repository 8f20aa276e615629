#!/usr/bin/env bash
# A model larger than one rank (examples/larger_than_a_rank.yaml): `ringctl local --workers 4
# --rank_memory_limit 700M` gives each trainer a memory limit (RLIMIT_DATA) that the whole
# training state does not fit but a ZeRO-3 shard of it does.
#   1. a bad --rank_memory_limit is refused before anything runs, naming the flag;
#   2. data parallelism (zero_stage 0) fails within seconds with RESOURCE_EXHAUSTED, before
#      allocating, naming the limit and parallelism.zero_stage: 3, spending no restart: one
#      membership, one start of each of the 4 trainers;
#   3. ZeRO-3 trains to the end on 4 ranks, under the same limit, to a finite loss.
set -uo pipefail

LIMIT=700M
ROOT="$TEST_SRCDIR/ringmaster"
SPEC="$ROOT/examples/larger_than_a_rank.yaml"
RINGCTL="$ROOT/cli/ringctl"
# The temporary run directories `ringctl local` makes go to $TMPDIR.
WORK="${TEST_TMPDIR:-/tmp}/larger_than_a_rank_test" && export TMPDIR="$WORK/tmp"
rm -rf "$WORK" && mkdir -p "$TMPDIR"
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
field() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get(sys.argv[2], ""))' "$1" "$2"; }

if [ ! -r /usr/share/common-licenses/GPL-3 ]; then
  echo "SKIP: the example's text (/usr/share/common-licenses/GPL-3) is not on this system"
  exit 0
fi

# 1. A bad limit names the flag.
"$RINGCTL" local --workers 4 "$SPEC" --rank_memory_limit 700K >"$WORK/bad.out" 2>&1
rc=$?
[ "$rc" -eq 2 ] || fail "--rank_memory_limit 700K exited with $rc, expected 2"
grep -q -- "--rank_memory_limit: \"700K\"" "$WORK/bad.out" ||
  fail "the error does not name the flag and the value: $(cat "$WORK/bad.out")"

# 2. Data parallelism: every rank would keep the whole state.
start=$SECONDS
"$RINGCTL" local --workers 4 "$SPEC" --rank_memory_limit "$LIMIT" \
  --set parallelism.zero_stage=0 --set steps=2 --summary "$WORK/ddp.json" >"$WORK/ddp.out" 2>&1
rc=$?
took=$((SECONDS - start))
[ "$rc" -eq 1 ] || fail "data parallelism under the limit exited with $rc, expected 1: $(tail -3 "$WORK/ddp.out")"
[ "$took" -le 60 ] || fail "data parallelism took $took s to fail (a retry storm?)"
grep -q "each rank limited to 700 MiB of memory (RLIMIT_DATA)" "$WORK/ddp.out" ||
  fail "ringctl local does not say that the ranks are limited: $(head -2 "$WORK/ddp.out")"
error="$(field "$WORK/ddp.json" error)"
for part in "that no restart can fix" "RESOURCE_EXHAUSTED" \
  "does not fit its memory limit of 700.0 MiB (RLIMIT_DATA" \
  "parameters 145.4 MiB, gradients 145.4 MiB, optimizer state 290.9 MiB" \
  "parallelism.zero_stage: 3" "raise the limit"; do
  case "$error" in
    *"$part"*) ;;
    *) fail "the error does not say \"$part\": $error" ;;
  esac
done
[ "$(field "$WORK/ddp.json" restarts)" = 0 ] && [ "$(field "$WORK/ddp.json" rendezvous_count)" = 1 ] ||
  fail "restarts were spent: $(cat "$WORK/ddp.json")"
run_dir="$(field "$WORK/ddp.json" run_dir)"
started="$(grep -c "^ringworker local: started trainer" "$run_dir/ringworker.log")"
[ "$started" -eq 4 ] || fail "$started trainer starts, expected 4 (one per rank): $(grep started "$run_dir/ringworker.log")"
grep -q "memory limit 700 MiB" "$run_dir/ringworker.log" ||
  fail "the agent does not start its trainers under the limit: $(grep started "$run_dir/ringworker.log" | head -1)"

# 3. ZeRO-3: a quarter of the state a rank, under the same limit.
"$RINGCTL" local --workers 4 "$SPEC" --rank_memory_limit "$LIMIT" --set steps=2 \
  --summary "$WORK/zero3.json" >"$WORK/zero3.out" 2>&1
rc=$?
[ "$rc" -eq 0 ] || fail "ZeRO-3 under the limit exited with $rc: $(tail -5 "$WORK/zero3.out")"
[ "$(field "$WORK/zero3.json" status)" = succeeded ] &&
  [ "$(field "$WORK/zero3.json" steps)" = 2 ] &&
  [ "$(field "$WORK/zero3.json" world_size)" = 4 ] ||
  fail "ZeRO-3 summary: $(cat "$WORK/zero3.json")"
python3 -c 'import json,math,sys; l=json.load(open(sys.argv[1]))["final_loss"]; sys.exit(0 if math.isfinite(l) and l > 0 else 1)' \
  "$WORK/zero3.json" || fail "ZeRO-3's final loss is not finite: $(cat "$WORK/zero3.json")"
grep -q "ZeRO-3 (fully sharded)" "$WORK/zero3.out" || fail "not ZeRO-3: $(grep batch: "$WORK/zero3.out")"

if [ "$failures" -gt 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all larger-than-a-rank checks passed"
