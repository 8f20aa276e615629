# Sourced by the end-to-end tests. The caller defines ctl (ringctl with its coordinator and
# token flags) and fail (counts a failure), or calls test_setup, which defines fail.

# test_setup NAME: RINGCTL (this build's ringctl); WORK, ${TEST_TMPDIR:-/tmp}/NAME emptied,
# with WORK/tmp as TMPDIR; failures=0 and fail MESSAGE (prints it, counts it); now (the
# time in seconds, with nanoseconds).
test_setup() {
  RINGCTL="$TEST_SRCDIR/ringmaster/cli/ringctl"
  WORK="${TEST_TMPDIR:-/tmp}/$1"
  rm -rf "$WORK" && mkdir -p "$WORK/tmp"
  export TMPDIR="$WORK/tmp"
  failures=0
  fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
  now() { date +%s.%N; }
}

# field JOB PYTHON_EXPRESSION_OF_j: the expression over `ringctl status JOB --json`.
field() {
  ctl status "$1" --json 2>/dev/null |
    python3 -c 'import json,sys; j=json.load(sys.stdin); print(eval(sys.argv[1]))' "$2" 2>/dev/null
}

# wait_until JOB EXPRESSION SECONDS: polls until the expression (of j) is True, every
# JOB_POLL_S seconds (0.2 unless the caller sets it).
wait_until() {
  local deadline=$((SECONDS + $3))
  while [ "$SECONDS" -lt "$deadline" ]; do
    [ "$(field "$1" "$2")" = True ] && return 0
    sleep "${JOB_POLL_S:-0.2}"
  done
  fail "job $1: waited $3 s for $2; status: $(ctl status "$1" 2>&1 | head -12)"
  return 1
}
