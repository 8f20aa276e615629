#!/usr/bin/env bash
# Issue 7's GPU checks and measurements in as few device calls as possible (the device
# machine has CUDA and PyTorch but no Bazel: build the bundle here first).
#
# Here (with --config=cuda available):
#   tools/gpu_bundle.sh -o devrun $(bench/gpu/issue7_gpu_run.sh --targets)
#   tar czf devrun.tgz devrun                # ~70 MiB unpacked (OpenBLAS), ~23 MiB packed:
#   echo /devrun.tgz >> .git/info/exclude    # the carry limit is 64 MiB, so it travels packed
# There (device `run`, carry ["devrun.tgz"]):
#   bash bench/gpu/issue7_gpu_run.sh tests    # every GPU test, and memcheck    (~3-6 min)
#   bash bench/gpu/issue7_gpu_run.sh bench    # gpt2_bench beside PyTorch       (~5-8 min)
#   bash bench/gpu/issue7_gpu_run.sh bench2   # the variants, profile, attention (~3 min)
# Each writes its log under $OUT (tests.log / bench.log / bench2.log) and prints it as it
# goes; each fits one device call (10 minutes at most).
set -uo pipefail

TARGETS=(
  //kernels:matmul_cuda_test //kernels:rows_cuda_test //kernels:elementwise_cuda_test
  //kernels:embedding_cuda_test //kernels:attention_cuda_test //kernels:sgd_cuda_test
  //kernels:activation_cuda_test //kernels:vector_cuda_test //kernels:conv_cuda_test
  //train/optim:cuda_vector_ops_test //train/nn:gpt_cuda_test //train/nn:sequential_cuda_test
  //train/nn:device_arena_test //train:trainer_test
  //comm/nccl:nccl_communicator_test //comm/nccl:nccl_group_test //comm/tcp:tcp_cuda_test
  //bench/gpu:gpt2_bench //bench/gpu:attention_bench
)

case "${1:-}" in
  --targets)
    echo "${TARGETS[@]}"
    exit 0
    ;;
  tests|bench|bench2) ;;
  *)
    echo "usage: $0 --targets | tests | bench | bench2" >&2
    exit 2
    ;;
esac

cd "$(dirname "$0")/../.."
bundle=${BUNDLE:-devrun}
out=${OUT:-/tmp/issue7}
mkdir -p "$out"
if [[ ! -d "$bundle" && -f "$bundle.tgz" ]]; then
  tar xzf "$bundle.tgz"
fi
if [[ ! -f "$bundle/env.sh" ]]; then
  echo "no $bundle/env.sh: build the bundle here and carry it (see the top of $0)" >&2
  exit 2
fi
# shellcheck disable=SC1091
source "$bundle/env.sh"
export TEST_TMPDIR=/tmp/issue7_tmp PYTHONUNBUFFERED=1
mkdir -p "$TEST_TMPDIR"

if [[ "$1" == tests ]]; then
  log="$out/tests.log"
  : >"$log"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee -a "$log"
  failed=0
  for target in "${TARGETS[@]}"; do
    label=${target#//}
    name="${label%%:*}__${label#*:}"
    name=${name//\//_}
    [[ "$name" == *_test ]] || continue
    echo "=== $target" | tee -a "$log"
    if ! timeout 240 "$bundle/bin/$name" --gtest_brief=1 2>&1 | tee -a "$log"; then
      failed=$((failed + 1))
      echo "=== FAILED: $target" | tee -a "$log"
    fi
  done
  # Out-of-bounds accesses and uninitialised reads in the GPT's kernels and products (tiny
  # models: the sanitizer slows everything down many times).
  if command -v compute-sanitizer >/dev/null; then
    echo "=== compute-sanitizer memcheck: //train/nn:gpt_cuda_test" | tee -a "$log"
    if ! timeout 400 compute-sanitizer --tool memcheck --error-exitcode=1 \
        "$bundle/bin/train_nn__gpt_cuda_test" --gtest_brief=1 2>&1 | tail -40 | tee -a "$log"; then
      failed=$((failed + 1))
      echo "=== FAILED: compute-sanitizer memcheck" | tee -a "$log"
    fi
  fi
  echo "=== $failed test binaries failed" | tee -a "$log"
  exit $((failed > 0))
fi

log="$out/$1.log"
: >"$log"
run() {
  echo "\$ $*" | tee -a "$log"
  timeout 300 "$@" 2>&1 | tee -a "$log"
}
gpt="$bundle/bin/bench_gpu__gpt2_bench"
torch=bench/gpu/gpt2_torch.py
if [[ "$1" == bench ]]; then
  # ringmaster beside PyTorch on the same GPU (--torch runs gpt2_torch.py first, untied head
  # like ours, and prints the ratios), in every precision.
  run "$gpt" --batch=8 --matmul=tf32 --steps=10 --torch="$torch" --torch_modes=eager
  run "$gpt" --batch=16 --matmul=bf16 --steps=20 --torch="$torch"
  run "$gpt" --batch=16 --matmul=fp16 --steps=20 --torch="$torch"
  exit 0
fi
# bf16 with llm.c's padded vocabulary, then with our logits' rows dense (the default pads
# them to 50304 internally, keeping the vocabulary; the two runs say what the padding is
# worth), the profile, checkpointing, and fp16's loss scale fixed and dynamic (seed exercises
# 35.11, 35.15-35.18); then attention alone.
run "$gpt" --batch=16 --matmul=bf16 --steps=20 --vocab=50304 --torch="$torch" --torch_modes=eager
run "$gpt" --batch=16 --matmul=bf16 --steps=20 --logits_alignment=1
run "$gpt" --batch=16 --matmul=bf16 --steps=10 --profile
run "$gpt" --batch=8 --matmul=bf16 --steps=20
run "$gpt" --batch=16 --matmul=bf16 --steps=20 --checkpoint_every=1
run "$gpt" --batch=16 --matmul=fp16 --steps=20 --loss_scale_mode=fixed --loss_scale=1024
run "$gpt" --batch=16 --matmul=fp16 --steps=20 --loss_scale=1e9
run "$bundle/bin/bench_gpu__attention_bench"
