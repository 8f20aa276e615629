#!/usr/bin/env bash
# End to end: `ringctl local --metrics_listen` serves its coordinator's Prometheus metrics.
# A short Fashion-MNIST job on 2 workers is scraped while it trains: the job's step, loss,
# throughput and the agent's heartbeat round trip are there and not zero, promtool accepts
# the exposition (when Debian's prometheus package is installed), and /healthz answers.
set -uo pipefail

RINGCTL="$TEST_SRCDIR/ringmaster/cli/ringctl"
SPEC="$TEST_SRCDIR/ringmaster/examples/fashion_mnist_mlp.yaml"
WORK="${TEST_TMPDIR:-/tmp}/metrics_local_test"
rm -rf "$WORK" && mkdir -p "$WORK"
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

if [ ! -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  echo "SKIP: Debian's dataset-fashion-mnist is not installed (tools/setup.sh installs it)"
  exit 0
fi

# GET $1: the body on stdout; fails on an HTTP error.
get() { python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())' "$1"; }
# The value of sample $2 (name{labels}, exactly) in exposition file $1; empty when absent.
value() { awk -v s="$2" '$1 == s { print $2 }' "$1"; }
positive() { python3 -c 'import sys; sys.exit(0 if sys.argv[1] and float(sys.argv[1]) > 0 else 1)' "$1"; }

"$RINGCTL" local --workers 2 "$SPEC" --set steps=100000 --set diagnostics.log_every=5 \
  --run_dir "$WORK/run" --metrics_listen 127.0.0.1:0 >"$WORK/out" 2>&1 &
pid=$!
url=""
for _ in $(seq 1 300); do
  url=$(grep -o "metrics at http://127.0.0.1:[0-9]*/metrics" "$WORK/out" | cut -d' ' -f3)
  [ -n "$url" ] && break
  sleep 0.1
done
[ -n "$url" ] || fail "ringctl local printed no metrics URL: $(cat "$WORK/out")"

job='job="fashion_mnist_mlp"'
if [ -n "$url" ]; then
  # Until the trainers have reported a few logged windows (at most a minute).
  for _ in $(seq 1 600); do
    get "$url" >"$WORK/scrape.txt" 2>/dev/null
    step=$(value "$WORK/scrape.txt" "ringmaster_job_step{$job}")
    rtt=$(value "$WORK/scrape.txt" 'ringmaster_node_heartbeat_rtt_seconds{node="local"}')
    if [ -n "$step" ] && [ "$step" -ge 20 ] 2>/dev/null && [ -n "$rtt" ]; then break; fi
    sleep 0.1
  done
  for sample in "ringmaster_job_step{$job}" "ringmaster_job_loss{$job}" \
                "ringmaster_job_samples_per_second{$job}" "ringmaster_job_learning_rate{$job}" \
                "ringmaster_rank_step{$job,rank=\"1\"}" 'ringmaster_jobs{phase="running"}' \
                'ringmaster_node_heartbeat_rtt_seconds{node="local"}' \
                'ringmaster_slots{state="busy"}'; do
    positive "$(value "$WORK/scrape.txt" "$sample")" ||
      fail "$sample is '$(value "$WORK/scrape.txt" "$sample")', not positive"
  done
  [ "$(value "$WORK/scrape.txt" "ringmaster_job_members{$job}")" = 2 ] ||
    fail "members: $(grep job_members "$WORK/scrape.txt")"
  if command -v promtool >/dev/null; then
    promtool check metrics <"$WORK/scrape.txt" >"$WORK/promtool.out" 2>&1 ||
      fail "promtool check metrics: $(cat "$WORK/promtool.out")"
  else
    echo "SKIP (part): promtool not found (Debian's prometheus package; tools/setup.sh installs it)"
  fi
  [ "$(get "${url%/metrics}/healthz")" = ok ] || fail "/healthz did not answer ok"
fi

kill -TERM "$pid"
wait "$pid"
rc=$?
[ "$rc" -eq 130 ] || fail "ringctl local exited with $rc after SIGTERM: $(tail -5 "$WORK/out")"

if [ "$failures" -gt 0 ]; then
  echo "--- ringctl local said:" >&2
  tail -20 "$WORK/out" >&2
  exit 1
fi
echo "PASS"
