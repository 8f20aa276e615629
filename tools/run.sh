#!/usr/bin/env bash
# Runs ringmaster's main job on this one machine, no cluster needed: trains the
# Fashion-MNIST MLP example (examples/fashion_mnist_mlp.yaml) with 4 local trainer
# processes (under an embedded coordinator and node agent) and prints the test accuracy. While
# it trains, its dashboard is served on a free loopback port (the URL is printed); at the end
# its curves are drawn into out/fashion_mnist_mlp.curves.svg. Installs what the build needs
# first (tools/setup.sh). Extra arguments go to `ringctl local` (e.g. --set epochs=3).
set -euo pipefail
cd "$(dirname "$0")/.."

tools/setup.sh
CACHE_DIR="${RINGMASTER_BAZEL_CACHE:-$HOME/.cache/ringmaster-bazel}"
mkdir -p "$CACHE_DIR" out
bazel build --disk_cache="$CACHE_DIR" //cli:ringctl //worker:ringtrainer
bazel-bin/cli/ringctl local --workers 4 examples/fashion_mnist_mlp.yaml \
    --set metrics.jsonl="$PWD/out/fashion_mnist_mlp.metrics.jsonl" \
    --metrics_listen 127.0.0.1:0 --summary out/fashion_mnist_mlp.json "$@"
bazel-bin/cli/ringctl plot out/fashion_mnist_mlp.metrics.jsonl -o out/fashion_mnist_mlp.curves.svg
python3 - out/fashion_mnist_mlp.json <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"test accuracy: {s['eval_accuracy']:.4f} after {s['steps']} steps on {s['world_size']} ranks "
      f"({s['samples_per_second']:.0f} samples/s); summary in {sys.argv[1]}")
PY
