#!/usr/bin/env bash
# The command lines' manners (issue 17, point 19), with the real binaries:
#   1. every binary: --help and -h print the usage and exit 0, --version prints
#      "<name> <version> (build ...)" and exits 0; ringctl's subcommands too;
#   2. ringctl, and the Abseil-flag binaries, benchmarks too: bad usage exits 2 with a message
#      naming the flag or argument; ringctl local refuses what it cannot run before it starts
#      anything; an address where nothing listens is said so;
#   3. against a live coordinator (no agent: the jobs stay pending, nothing trains): the
#      address from $RINGMASTER_ADDRESS or a config file ($RINGMASTER_CONFIG), the flag
#      winning over both; a bad config file is an error naming the file and the key;
#      list/status with -o json|yaml|wide and the old --json; a job's spec printed as YAML
#      and as JSON is submitted again as it is.
set -uo pipefail
BIN="$TEST_SRCDIR/ringmaster"
RINGCTL="$BIN/cli/ringctl"
SPEC="$BIN/examples/fashion_mnist_mlp.yaml"
WORK="${TEST_TMPDIR:-/tmp}/ringctl_cli_test"
rm -rf "$WORK" && mkdir -p "$WORK" && cd "$WORK"
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
pids=()
trap 'for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done' EXIT
unset RINGMASTER_ADDRESS RINGMASTER_CONFIG RINGMASTER_TOKEN_FILE RINGMASTER_TLS_CA
export HOME="$WORK/home"  # no ~/.config/ringmaster/config.yaml of the user's

# expect STATUS COMMAND...: runs it (output in out.txt) and checks its exit status.
expect() {
  local want="$1"
  shift
  "$@" >out.txt 2>&1
  local rc=$?
  [ "$rc" -eq "$want" ] || fail "$* exited with $rc, expected $want: $(head -5 out.txt)"
}

# 1. --help, -h, --version.
for b in cli/ringctl coordinator/ringmaster worker/ringworker worker/ringtrainer bench/ringbench; do
  name="$(basename "$b")"
  for flag in --help -h; do
    expect 0 "$BIN/$b" "$flag"
    grep -q -- "--" out.txt || fail "$name $flag printed no flags: $(head -3 out.txt)"
  done
  expect 0 "$BIN/$b" --version
  grep -Eq "^$name [0-9]+\.[0-9]+\.[0-9]+ \(build [^)]+\)$" out.txt ||
    fail "$name --version: $(cat out.txt)"
done
grep -q -- "--slots" <("$BIN/worker/ringworker" --help) || fail "ringworker --help lacks --slots"
grep -q -- "--coordinator" <("$BIN/worker/ringtrainer" --help) ||
  fail "ringtrainer --help does not list its own flags"
for sub in local submit list status cancel top checkpoints "checkpoint verify" \
  "estimate memory"; do
  for flag in --help -h; do
    expect 0 "$RINGCTL" $sub "$flag"
    grep -q "Usage: ringctl $sub" out.txt || fail "ringctl $sub $flag: $(head -3 out.txt)"
  done
done

# 2. Bad usage: exit 2, naming the problem.
expect 2 "$RINGCTL" status
grep -q "JOB is required" out.txt || fail "status without a job: $(cat out.txt)"
expect 2 "$RINGCTL" list --bogus
grep -q -- "--bogus" out.txt || fail "unknown flag not named: $(cat out.txt)"
expect 2 "$RINGCTL" list -o xml
grep -q -- "--output: xml" out.txt || fail "bad -o not named: $(cat out.txt)"
expect 2 "$RINGCTL" frob
grep -q 'unknown command "frob"' out.txt || fail "unknown command: $(cat out.txt)"
expect 2 "$RINGCTL" local "$SPEC" --workers 0
grep -q -- "--workers" out.txt || fail "--workers 0: $(cat out.txt)"
# Issue 36 point 13: every binary exits 2 on bad usage, naming the flag (Abseil exited 1);
# trainbench and fsdpbench list their flags (they printed "No flags matched.").
for b in coordinator/ringmaster worker/ringworker worker/ringtrainer bench/ringbench \
  bench/trainbench bench/fsdpbench; do
  name="$(basename "$b")"
  expect 2 "$BIN/$b" --no_such_flag
  grep -q "^$name: unknown flag --no_such_flag" out.txt || fail "$name --no_such_flag: $(cat out.txt)"
done
expect 2 "$BIN/coordinator/ringmaster" --listen
grep -q -- "--listen needs a value" out.txt || fail "ringmaster --listen: $(cat out.txt)"
expect 2 "$BIN/bench/ringbench" comm --ranks=x
grep -q -- "--ranks" out.txt || fail "ringbench --ranks=x: $(cat out.txt)"
for b in trainbench fsdpbench; do
  expect 0 "$BIN/bench/$b" --help
  grep -q -- "--worlds" out.txt || fail "$b --help lists no flags: $(head -3 out.txt)"
  grep -q "No flags matched" out.txt && fail "$b --help: $(head -3 out.txt)"
done
# ringctl local refuses before it starts anything: the unknown flag named (not the spec),
# workers the mesh cannot all use, a --summary it could not write.
expect 2 "$RINGCTL" local --nproc_per_node 2 "$SPEC"
grep -q "unknown flag --nproc_per_node.*--workers" out.txt || fail "--nproc_per_node: $(cat out.txt)"
expect 2 "$RINGCTL" local "$BIN/examples/tiny_gpt.yaml" --workers 3 --set parallelism.mesh.tp=2
grep -q "^ringctl local: --workers 3 is not a multiple of parallelism.mesh.tp" out.txt ||
  fail "--workers 3 with tp 2: $(cat out.txt)"
expect 2 "$RINGCTL" local "$SPEC" --summary "$WORK/no/such/dir/summary.json"
grep -q -- "--summary $WORK/no/such/dir/summary.json" out.txt || fail "--summary: $(cat out.txt)"
# Nothing listens at the address: said so, not "it may serve TLS".
FREE_PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
expect 1 "$RINGCTL" list --coordinator "127.0.0.1:$FREE_PORT"
grep -q "nothing listens there" out.txt || fail "list without a coordinator: $(cat out.txt)"
grep -q "TLS" out.txt && fail "list without a coordinator suggests TLS: $(cat out.txt)"

# 3. A coordinator on a port the kernel picks.
"$BIN/coordinator/ringmaster" --listen 127.0.0.1:0 --db "$WORK/rm.db" >ringmaster.log 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do
  grep -q "serving on" ringmaster.log && break
  sleep 0.05
done
PORT="$(grep -o "(port [0-9]*)" ringmaster.log | tail -1 | tr -dc 0-9)"
[ -n "$PORT" ] || { fail "ringmaster did not start: $(cat ringmaster.log)"; exit 1; }
ADDR="127.0.0.1:$PORT"

# The address from the environment; a flag wins over it.
RINGMASTER_ADDRESS="$ADDR" expect 0 "$RINGCTL" submit "$SPEC" --set name=first
grep -q "submitted first" out.txt || fail "submit with RINGMASTER_ADDRESS: $(cat out.txt)"
RINGMASTER_ADDRESS=127.0.0.1:1 expect 0 "$RINGCTL" list --coordinator "$ADDR"
grep -q "^first " out.txt || fail "--coordinator did not win over RINGMASTER_ADDRESS: $(cat out.txt)"
# From a config file; the environment wins over it.
printf 'coordinator: %s\n' "$ADDR" >good.yaml
RINGMASTER_CONFIG="$WORK/good.yaml" expect 0 "$RINGCTL" list
grep -q "^first " out.txt || fail "list with RINGMASTER_CONFIG: $(cat out.txt)"
printf 'coordinator: 127.0.0.1:1\n' >other.yaml
RINGMASTER_CONFIG="$WORK/other.yaml" RINGMASTER_ADDRESS="$ADDR" expect 0 "$RINGCTL" list
# ... and the default config file.
mkdir -p "$HOME/.config/ringmaster" && cp good.yaml "$HOME/.config/ringmaster/config.yaml"
expect 0 "$RINGCTL" list
grep -q "^first " out.txt || fail "list with ~/.config/ringmaster/config.yaml: $(cat out.txt)"
# A bad config file names itself and the key.
printf 'coordinator: %s\ntokn_file: x\n' "$ADDR" >bad.yaml
RINGMASTER_CONFIG="$WORK/bad.yaml" expect 2 "$RINGCTL" list
grep -q "bad.yaml:2:1: unknown key \"tokn_file\"" out.txt || fail "bad config file: $(cat out.txt)"
printf 'token_file: missing.token\n' >notoken.yaml
RINGMASTER_CONFIG="$WORK/notoken.yaml" expect 2 "$RINGCTL" list
grep -q "notoken.yaml: token_file" out.txt && grep -q "missing.token" out.txt ||
  fail "a missing token file is not traced to the config key: $(cat out.txt)"
export RINGMASTER_ADDRESS="$ADDR"

# Tables with headers and ages; -o wide has more columns.
expect 0 "$RINGCTL" list
head -1 out.txt | grep -Eq "^NAME +PHASE +STEP +LOSS +RANKS +AGE$" || fail "list header: $(cat out.txt)"
grep -Eq "^first +pending .* [0-9]+s$" out.txt || fail "list row: $(cat out.txt)"
expect 0 "$RINGCTL" list -o wide
head -1 out.txt | grep -q "EPOCH *RESTARTS" || fail "list -o wide: $(cat out.txt)"
expect 0 "$RINGCTL" status first -o wide
grep -q "spec:" out.txt || fail "status -o wide: $(cat out.txt)"

# JSON: defaults included, the spec's own enum spelling; --json is -o json.
py() { python3 -c "$1" "${@:2}"; }
for json_flag in "-o json" --json; do
  expect 0 "$RINGCTL" status first $json_flag
  py 'import json,sys; j=json.load(open("out.txt"))
assert j["phase"] == "JOB_PHASE_PENDING", j["phase"]
assert j["restarts"] == 0 and j["step"] == 0, "defaults missing"
assert j["spec"]["schedule"]["decay"] == "cosine", j["spec"]["schedule"]' ||
    fail "status $json_flag: $(head -20 out.txt)"
done
expect 0 "$RINGCTL" list -o json
py 'import json; assert [j["id"] for j in json.load(open("out.txt"))["jobs"]] == ["first"]' ||
  fail "list -o json: $(head -5 out.txt)"

# Round trips: the spec as YAML and as JSON, submitted again (under another name).
expect 0 "$RINGCTL" status first -o yaml
py 'import yaml; s=yaml.safe_load(open("out.txt"))["spec"]; s["name"]="from_yaml"
yaml.safe_dump(s, open("from_yaml.yaml", "w"))' || fail "status -o yaml is not YAML: $(head out.txt)"
expect 0 "$RINGCTL" submit from_yaml.yaml
expect 0 "$RINGCTL" status first -o json
py 'import json; s=json.load(open("out.txt"))["spec"]; s["name"]="from_json"
json.dump(s, open("from_json.json", "w"))' || fail "status -o json is not JSON"
expect 0 "$RINGCTL" submit from_json.json
expect 0 "$RINGCTL" status from_json -o json
py 'import json,sys
a=json.load(open("out.txt"))["spec"]; b=json.load(open("from_json.json"))
assert a == b, (a, b)' || fail "the resubmitted JSON spec differs"
expect 0 "$RINGCTL" status from_yaml -o json
py 'import json
a=json.load(open("out.txt"))["spec"]; b=json.load(open("from_json.json")); a.pop("name"); b.pop("name")
assert a == b, (a, b)' || fail "the resubmitted YAML spec differs"
expect 0 "$RINGCTL" cancel first -o yaml
grep -q "^phase: JOB_PHASE_CANCELLED" out.txt || fail "cancel -o yaml: $(head -5 out.txt)"

if [ "$failures" -gt 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all ringctl command line checks passed"
