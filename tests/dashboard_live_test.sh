#!/usr/bin/env bash
# The dashboard of a live coordinator in headless Chromium: `ringctl local --metrics_listen`
# trains the Fashion-MNIST MLP on 2 workers, and while it runs Chromium loads the job's page
# and the index from the coordinator's HTTP port. The DOM it built must show the job's name,
# its phase RUNNING, the members table, the epoch's members and the loss curve with rank 0's
# points; the index must link the job and list the node. Screenshots of both pages go to the
# test's undeclared outputs (TEST_UNDECLARED_OUTPUTS_DIR) for a person to look at.
# Skips, saying so, without Debian's chromium or dataset-fashion-mnist (tools/setup.sh
# installs both).
set -uo pipefail

RINGCTL="$TEST_SRCDIR/ringmaster/cli/ringctl"
SPEC="$TEST_SRCDIR/ringmaster/examples/fashion_mnist_mlp.yaml"
WORK="${TEST_TMPDIR:-/tmp}/dashboard_live_test"
SHOTS="${TEST_UNDECLARED_OUTPUTS_DIR:-$WORK}"
JOB=dashboard-live
rm -rf "$WORK" && mkdir -p "$WORK/tmp" "$SHOTS"
export TMPDIR="$WORK/tmp"
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

CHROMIUM="$(command -v chromium)"
if [ -z "$CHROMIUM" ]; then
  echo "SKIP: chromium is not installed (Debian's chromium; tools/setup.sh installs it)"
  exit 0
fi
if [ ! -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  echo "SKIP: Debian's dataset-fashion-mnist is not installed (tools/setup.sh installs it)"
  exit 0
fi

# Chromium's own temporary files: its socket's path must stay under 108 bytes, which a
# directory under $TEST_TMPDIR may not.
CHROME_TMP="$(mktemp -d /tmp/ringmaster-chromium.XXXXXX)"
# chrome ARGS...: headless Chromium with its profile under $WORK.
chrome() {
  TMPDIR="$CHROME_TMP" HOME="$WORK" timeout 120 "$CHROMIUM" --headless --no-sandbox --disable-gpu --hide-scrollbars \
    --user-data-dir="$WORK/profile" "$@" 2>>"$WORK/chromium.err"
}
# fetch URL: the page's body (python3's urllib, no browser).
fetch() {
  python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())' \
    "$1" 2>/dev/null
}

# rows FILE ID: the rows (<tr>) of the table with that id in FILE.
rows() {
  python3 -c 'import re, sys; t = re.search(r"<table id=\"%s\">(.*?)</table>" % sys.argv[2], open(sys.argv[1]).read(), re.S); print(t.group(1).count("<tr") if t else 0)' "$1" "$2"
}

# A job long enough to be running while the pages are loaded; the test cancels it.
"$RINGCTL" local --workers 2 "$SPEC" --set name="$JOB" --set epochs=50 \
  --metrics_listen 127.0.0.1:0 --run_dir "$WORK/run" >"$WORK/local.out" 2>&1 &
pid=$!
cleanup() {
  kill -TERM "$pid" 2>/dev/null && wait "$pid"
  rm -rf "$CHROME_TMP"
}
trap cleanup EXIT

base=""
for _ in $(seq 1 300); do
  base="$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$WORK/local.out" | head -1)"
  [ -n "$base" ] && break
  sleep 0.1
done
[ -n "$base" ] || { fail "no HTTP address in: $(head -5 "$WORK/local.out")"; exit 1; }

# Until the job runs and its curve has 30 of rank 0's reports.
ready=""
for _ in $(seq 1 600); do
  page="$(fetch "$base/jobs/$JOB")"
  if grep -q 'class="phase running"' <<<"$page" &&
     [ "$(grep -o '<circle class="point"' <<<"$page" | wc -l)" -ge 30 ]; then
    ready=1
    break
  fi
  sleep 0.1
done
[ -n "$ready" ] || fail "the job page never showed a running job with 30 points: $(tail -5 "$WORK/local.out")"

chrome --dump-dom "$base/jobs/$JOB" >"$WORK/job.dom"
grep -q "<h1 id=\"job\">$JOB <span class=\"phase running\">RUNNING</span>" "$WORK/job.dom" ||
  fail "the job page has no heading with the job's name and RUNNING: $(head -c 600 "$WORK/job.dom")"
[ "$(rows "$WORK/job.dom" members)" = 3 ] || fail "the members table is not a header and 2 ranks"
grep -q '<table id="epochs">' "$WORK/job.dom" && grep -q '0: [^ ]*/0 · 1: [^ ]*/1' "$WORK/job.dom" ||
  fail "no members per epoch for ranks 0 and 1"
[ "$(grep -o '<polyline' "$WORK/job.dom" | wc -l)" -ge 1 ] || fail "no curve drawn"
points="$(grep -o '<circle class="point"' "$WORK/job.dom" | wc -l)"
[ "$points" -ge 30 ] || fail "the curves have $points points, expected 30 or more"

chrome --dump-dom "$base/" >"$WORK/index.dom"
grep -q "<a href=\"/jobs/$JOB\">$JOB</a>" "$WORK/index.dom" || fail "the index does not link the job"
grep -q '<table id="nodes">' "$WORK/index.dom" || fail "the index has no nodes table"
python3 - "$base/jobs/no-such-job" <<'EOF' || fail "an unknown job is not a 404"
import sys, urllib.request, urllib.error
try:
    urllib.request.urlopen(sys.argv[1], timeout=10)
    sys.exit(1)
except urllib.error.HTTPError as e:
    sys.exit(0 if e.code == 404 else 1)
EOF

chrome --screenshot="$SHOTS/dashboard_live_job.png" --window-size=1280,1900 "$base/jobs/$JOB" >/dev/null
chrome --screenshot="$SHOTS/dashboard_live_index.png" --window-size=1280,600 "$base/" >/dev/null
for png in dashboard_live_job.png dashboard_live_index.png; do
  [ "$(stat -c %s "$SHOTS/$png" 2>/dev/null || echo 0)" -gt 20000 ] ||
    fail "no screenshot $SHOTS/$png (chromium: $(tail -3 "$WORK/chromium.err"))"
done
echo "screenshots: $SHOTS/dashboard_live_job.png $SHOTS/dashboard_live_index.png"

if [ "$failures" -gt 0 ]; then
  echo "$failures failures; ringctl local said: $(tail -20 "$WORK/local.out")" >&2
  exit 1
fi
echo PASS
