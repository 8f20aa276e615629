#!/usr/bin/env bash
# GPT-2 weights checked against a real peer: a GPT-2 written in plain PyTorch
# (tests/gpt2_peer.py, Debian's python3-torch, the safetensors file parsed by hand).
#   1. A small GPT pre-trained by `ringctl local` on 2 workers under ZeRO-3 is exported with
#      `ringctl export`; PyTorch loads the file and gives the same loss and logits as
#      ringmaster on the same batch (gpt_weights_eval; tolerance 1e-4 absolute, in loss and in
#      the log-softmax of the logits).
#   2. PyTorch writes a GPT-2 file of its own (GPT2LMHeadModel's names, attention-mask
#      buffers); ringmaster loads it (the same check), and a job with init_from that file trains
#      on 2 workers with another optimizer, its loss going down from the file's model's.
#   3. A tied LM head (GPT-2's), pre-trained as a 2-stage pipeline, exported and checked as in 1.
# Skips (exit 0, saying so) without PyTorch.
set -uo pipefail

PYTHON=/usr/bin/python3
if ! "$PYTHON" -c 'import torch' 2>/dev/null; then
  echo "SKIP: PyTorch is not installed for $PYTHON (Debian's python3-torch); the peer check needs it"
  exit 0
fi
RM="$TEST_SRCDIR/ringmaster"
RINGCTL="$RM/cli/ringctl"
EVAL="$RM/tests/gpt_weights_eval"
PEER="$RM/tests/gpt2_peer.py"
TEXT=/usr/share/common-licenses/GPL-3
WORK="${TEST_TMPDIR:-/tmp}/gpt2_peer_test"
rm -rf "$WORK" && mkdir -p "$WORK/tmp"
export TMPDIR="$WORK/tmp"
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
MODEL=(--layers 2 --heads 2 --width 32 --context 16 --vocab 256)

spec() {  # name, steps, extra YAML lines
  cat <<EOF
name: $1
seed: 11
steps: $2
model: {gpt: {layers: 2, heads: 2, width: 32, context: 16, vocab: 256}}
data: {text: {path: $TEXT}}
batch: {global: 8}
device: cpu
diagnostics: {log_every: 1}
metrics: {jsonl: $WORK/$1.jsonl}
$3
EOF
}
# The loss of the first and the last step in a metrics file.
losses() {
  "$PYTHON" -c 'import json,sys; r=[json.loads(l) for l in open(sys.argv[1]) if "loss" in l]
print(r[0]["loss"], r[-1]["loss"])' "$1"
}

"$PYTHON" "$PEER" tokens --out "$WORK/tokens.bin" --samples 4 --context 16 --vocab 256 --seed 3 \
  --text "$TEXT" ||
  fail "writing the token batch"

# 1. ringmaster -> PyTorch.
spec pretrain 30 "optimizer: {adamw: {}, lr: 0.003}
parallelism: {zero_stage: 3}
checkpoint: {dir: $WORK/ck, every_steps: 30}" >"$WORK/pretrain.yaml"
"$RINGCTL" local --workers 2 "$WORK/pretrain.yaml" >"$WORK/pretrain.out" 2>&1 ||
  fail "pre-training: $(tail -5 "$WORK/pretrain.out")"
"$RINGCTL" export "$WORK/ck/pretrain" -o "$WORK/pretrained.safetensors" >"$WORK/export.out" 2>&1 ||
  fail "ringctl export: $(cat "$WORK/export.out")"
cat "$WORK/export.out"
grep -q "29 tensors" "$WORK/export.out" || fail "export: $(cat "$WORK/export.out")"
"$EVAL" --weights "$WORK/pretrained.safetensors" "${MODEL[@]}" --tokens "$WORK/tokens.bin" \
  --out "$WORK/pretrained.json" || fail "gpt_weights_eval on the export"
"$PYTHON" "$PEER" check --weights "$WORK/pretrained.safetensors" --tokens "$WORK/tokens.bin" \
  --ringmaster "$WORK/pretrained.json" --heads 2 || fail "PyTorch disagrees with the export"

# 2. PyTorch -> ringmaster.
"$PYTHON" "$PEER" write --out "$WORK/torch.safetensors" "${MODEL[@]}" --seed 5 ||
  fail "PyTorch writing its GPT-2"
"$EVAL" --weights "$WORK/torch.safetensors" "${MODEL[@]}" --tokens "$WORK/tokens.bin" \
  --out "$WORK/torch.json" || fail "gpt_weights_eval on PyTorch's file"
"$PYTHON" "$PEER" check --weights "$WORK/torch.safetensors" --tokens "$WORK/tokens.bin" \
  --ringmaster "$WORK/torch.json" --heads 2 || fail "ringmaster reads PyTorch's file differently"
spec finetune 20 "optimizer: {sgd: {momentum: 0.9}, lr: 0.05}
schedule: {warmup_steps: 2, decay: cosine}
parallelism: {zero_stage: 3}
init_from: $WORK/torch.safetensors" >"$WORK/finetune.yaml"
"$RINGCTL" local --workers 2 "$WORK/finetune.yaml" >"$WORK/finetune.out" 2>&1 ||
  fail "training from PyTorch's file: $(tail -5 "$WORK/finetune.out")"
grep -q "init_from: read 29 tensors (.*F32) from $WORK/torch.safetensors" "$WORK/finetune.out" ||
  fail "the job does not say it read the file: $(grep -m3 init_from "$WORK/finetune.out")"
read -r first last <<<"$(losses "$WORK/finetune.jsonl")"
echo "fine-tuning from PyTorch's GPT-2: loss $first at step 1, $last at step 20"
"$PYTHON" -c 'import sys; sys.exit(0 if float(sys.argv[2]) < float(sys.argv[1]) - 0.5 else 1)' \
  "$first" "$last" || fail "the loss did not go down: $first -> $last"

# 3. A tied LM head (GPT-2's: no lm_head tensor), pre-trained as a 2-stage pipeline (the last
# stage's copy of wte is not exported): ringmaster -> PyTorch, which ties when the file has no
# lm_head.
spec tied 30 "optimizer: {adamw: {}, lr: 0.003}
parallelism: {mesh: {pp: 2}}
checkpoint: {dir: $WORK/ck, every_steps: 30}" | sed 's/vocab: 256}/vocab: 256, tied_head: true}/' \
  >"$WORK/tied.yaml"
"$RINGCTL" local --workers 2 "$WORK/tied.yaml" >"$WORK/tied.out" 2>&1 ||
  fail "pre-training the tied model: $(tail -5 "$WORK/tied.out")"
"$RINGCTL" export "$WORK/ck/tied" -o "$WORK/tied.safetensors" >"$WORK/tied_export.out" 2>&1 ||
  fail "ringctl export (tied): $(cat "$WORK/tied_export.out")"
grep -q "28 tensors" "$WORK/tied_export.out" || fail "tied export: $(cat "$WORK/tied_export.out")"
"$EVAL" --weights "$WORK/tied.safetensors" "${MODEL[@]}" --tied 1 --tokens "$WORK/tokens.bin" \
  --out "$WORK/tied.json" || fail "gpt_weights_eval on the tied export"
"$PYTHON" "$PEER" check --weights "$WORK/tied.safetensors" --tokens "$WORK/tokens.bin" \
  --ringmaster "$WORK/tied.json" --heads 2 || fail "PyTorch disagrees with the tied export"

if [ "$failures" -gt 0 ]; then
  echo "$failures failure(s); the work is in $WORK" >&2
  exit 1
fi
echo PASS
