#!/usr/bin/env bash
# Runs ringmaster's main job on this one machine, no cluster needed. Installs what the
# build needs first (tools/setup.sh).
#
# Until the trainer lands, the main job is the collectives benchmark: 4 local ranks over
# the TCP backend, every collective from 1 KiB to 1 GiB, printed as a table and written to
# out/comm.csv and out/comm.svg. Extra flags go to `ringbench comm` (ringbench --help).
set -euo pipefail
cd "$(dirname "$0")/.."

tools/setup.sh
CACHE_DIR="${RINGMASTER_BAZEL_CACHE:-$HOME/.cache/ringmaster-bazel}"
mkdir -p "$CACHE_DIR" out
bazel build --disk_cache="$CACHE_DIR" //bench:ringbench
exec bazel-bin/bench/ringbench comm --ranks 4 --csv out/comm.csv --plot out/comm.svg "$@"
