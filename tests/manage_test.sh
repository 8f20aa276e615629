#!/usr/bin/env bash
# Jobs a user manages (issue 17, points 16 and 17), end to end: ringmaster, a ringworker
# agent (2 slots) and ringtrainers on loopback, driven by ringctl.
#   - `ringctl nodes` shows the node, its slots, the job and rank on each, the heartbeat;
#   - `ringctl logs` reads rank 0's and rank 1's logs through the coordinator from the
#     agent; `logs -f` follows a running job and returns when it is cancelled;
#   - `ringctl delete` refuses a live job, deletes a cancelled one (its checkpoints stay,
#     the agent removes its files), and the name is free again;
#   - a cancelled job submitted again under its name runs again, resuming from its
#     checkpoint;
#   - extend: a job of 10 steps, submitted again with steps=20, is refused naming the field
#     (steps: 10 in the checkpoint, 20 here); with --extend it resumes at step 10 and
#     trains steps 11 to 20.
set -uo pipefail

BIN="$TEST_SRCDIR/ringmaster"
RINGMASTER="$BIN/coordinator/ringmaster"
RINGWORKER="$BIN/worker/ringworker"
RINGTRAINER="$BIN/worker/ringtrainer"
RINGCTL="$BIN/cli/ringctl"
SPEC="$BIN/examples/fashion_mnist_mlp.yaml"
WORK="${TEST_TMPDIR:-/tmp}/manage"
rm -rf "$WORK" && mkdir -p "$WORK"
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
COORD_PID=""
AGENT_PID=""
cleanup() {
  # A second SIGTERM makes the agent kill its trainers and leave at once.
  if [ -n "$AGENT_PID" ]; then
    kill -TERM "$AGENT_PID" 2>/dev/null
    sleep 0.2
    kill -TERM "$AGENT_PID" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$AGENT_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$AGENT_PID" 2>/dev/null
  fi
  [ -n "$COORD_PID" ] && kill -KILL "$COORD_PID" 2>/dev/null
  true
}
trap cleanup EXIT

if [ ! -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  echo "SKIP: Debian's dataset-fashion-mnist is not installed (tools/setup.sh installs it)"
  exit 0
fi

"$RINGMASTER" --listen 127.0.0.1:0 --db "$WORK/jobs.db" --heartbeat_s 0.2 --lease_s 2 \
  --slot_backoff_s 1 --grow_after_s 1000 >"$WORK/coordinator.log" 2>&1 &
COORD_PID=$!
for _ in $(seq 1 100); do grep -q "serving on" "$WORK/coordinator.log" && break; sleep 0.05; done
COORD="127.0.0.1:$(grep -o "(port [0-9]*)" "$WORK/coordinator.log" | tail -1 | tr -dc 0-9)"
[ "$COORD" != "127.0.0.1:" ] || { fail "no coordinator: $(tail -3 "$WORK/coordinator.log")"; exit 1; }
"$RINGWORKER" --coordinator "$COORD" --node a --slots 2 --work_dir "$WORK/node-a" \
  --trainer "$RINGTRAINER" --trainer_flags=--op_timeout_s=10 >"$WORK/agent.log" 2>&1 &
AGENT_PID=$!
for _ in $(seq 1 100); do grep -q "registered node" "$WORK/agent.log" && break; sleep 0.05; done
grep -q "serving the trainers' logs at 127.0.0.1:" "$WORK/agent.log" ||
  fail "the agent serves no logs: $(tail -3 "$WORK/agent.log")"

ctl() { "$RINGCTL" "$@" --coordinator "$COORD"; }
# submit NAME [--set ...] [--extend]: 2 ranks, checkpoints every 5 steps, a progress line
# every step.
submit() {
  local name="$1"
  shift
  ctl submit "$SPEC" --set name="$name" --set checkpoint.dir="$WORK/ckpt" \
    --set checkpoint.every_steps=5 --set diagnostics.log_every=1 --set elastic.min_ranks=2 \
    --set elastic.max_ranks=2 --set schedule.warmup_steps=2 "$@"
}
# field, wait_until
source "$TEST_SRCDIR/ringmaster/tests/job_helpers.sh"

# --- nodes, before any job.
ctl nodes >"$WORK/nodes0.out" 2>&1 || fail "ringctl nodes: $(cat "$WORK/nodes0.out")"
grep -Eq "^a +ready +[0-9]+s +0 +- +- " "$WORK/nodes0.out" || fail "nodes: $(cat "$WORK/nodes0.out")"

# --- a job of 10 steps; its logs by rank.
submit ext --set steps=10 >"$WORK/submit.out" 2>&1 || fail "submit ext: $(cat "$WORK/submit.out")"
wait_until ext 'j["phase"]=="JOB_PHASE_SUCCEEDED"' 120
ctl logs ext >"$WORK/ext-rank0.log" 2>&1 || fail "logs ext: $(tail -3 "$WORK/ext-rank0.log")"
grep -q "step 10/10" "$WORK/ext-rank0.log" || fail "rank 0's log: $(tail -5 "$WORK/ext-rank0.log")"
cmp -s "$WORK/ext-rank0.log" "$WORK/node-a/ext/slot-0.log" ||
  fail "ringctl logs ext is not the log on the node"
ctl logs ext --rank 1 >"$WORK/ext-rank1.log" 2>&1 || fail "logs --rank 1: $(cat "$WORK/ext-rank1.log")"
cmp -s "$WORK/ext-rank1.log" "$WORK/node-a/ext/slot-1.log" ||
  fail "ringctl logs ext --rank 1 is not slot 1's log"
# --tail_bytes N: the whole lines within the log's last N bytes (a line cut by the N is left
# out); --tail N: the last N lines.
ctl logs ext --slot a/1 --tail_bytes 2000 >"$WORK/tail.out" 2>&1
python3 - "$WORK/node-a/ext/slot-1.log" >"$WORK/tail.expected" <<'PY'
import sys
data = open(sys.argv[1], "rb").read()
tail = data[-2001:]
sys.stdout.buffer.write(tail[tail.find(b"\n") + 1:] if len(data) > 2000 else data)
PY
[ -s "$WORK/tail.expected" ] || fail "--tail_bytes 2000: the log's last 2000 bytes hold no whole line"
cmp -s "$WORK/tail.out" "$WORK/tail.expected" ||
  fail "--tail_bytes 2000: $(cat "$WORK/tail.out") (expected $(cat "$WORK/tail.expected"))"
ctl logs ext --slot a/1 --tail 2 >"$WORK/tail2.out" 2>&1
tail -n 2 "$WORK/node-a/ext/slot-1.log" | cmp -s "$WORK/tail2.out" - ||
  fail "--tail 2: $(cat "$WORK/tail2.out")"
timeout 20 "$RINGCTL" logs ext -f --coordinator "$COORD" >/dev/null 2>&1 ||
  fail "logs -f of a finished job does not return at once"
ctl logs ext --rank 5 >"$WORK/rank5.out" 2>&1 && fail "logs --rank 5 succeeded"
grep -q "has no rank 5: its ranks are 0 to 1" "$WORK/rank5.out" || fail "logs --rank 5: $(cat "$WORK/rank5.out")"

# --- extend: more steps without --extend is refused, naming the field.
submit ext --set steps=20 >"$WORK/submit.out" 2>&1 || fail "submit ext again: $(cat "$WORK/submit.out")"
wait_until ext 'j["phase"]=="JOB_PHASE_FAILED"' 60
[ "$(field ext '"steps: 10 in the checkpoint, 20 here" in j["reason"] and "--extend" in j["reason"]')" = True ] ||
  fail "the refused resume's reason: $(ctl status ext)"
submit ext --set steps=20 --extend >"$WORK/submit.out" 2>&1 || fail "submit --extend: $(cat "$WORK/submit.out")"
wait_until ext 'j["phase"]=="JOB_PHASE_SUCCEEDED" and int(j["total_steps"])==20' 120
ctl logs ext >"$WORK/ext-extended.log" 2>&1
grep -q "resumed from $WORK/ckpt/ext/step-10 (step 10" "$WORK/ext-extended.log" ||
  fail "the extended job did not resume at step 10: $(grep -h "resum" "$WORK/ext-extended.log")"
grep -q "resume: extend: the checkpoint's job was steps: 10 -> 20" "$WORK/ext-extended.log" ||
  fail "the extension is not said: $(grep -h "resum" "$WORK/ext-extended.log")"
grep -q "step 11/20" "$WORK/ext-extended.log" || fail "no step 11/20 in the extended run"
grep -q "step 1/20" "$WORK/ext-extended.log" && fail "the extended run started from step 1"

# --- a long job: nodes shows it; logs -f follows it until it is cancelled.
submit long --set epochs=15 >"$WORK/submit.out" 2>&1 || fail "submit long: $(cat "$WORK/submit.out")"
wait_until long 'j["phase"]=="JOB_PHASE_RUNNING" and int(j.get("step",0))>=6' 120
ctl nodes -o json >"$WORK/nodes.json" 2>&1
python3 - "$WORK/nodes.json" <<'PY' || fail "nodes -o json: $(cat "$WORK/nodes.json")"
import json, sys
nodes = json.load(open(sys.argv[1]))["nodes"]
assert [n["node"] for n in nodes] == ["a"], nodes
slots = nodes[0]["slots"]
assert [(s["job"], int(s["rank"])) for s in slots] == [("long", 0), ("long", 1)], slots
assert 0 <= float(nodes[0]["last_heartbeat_age_s"]) < 2, nodes[0]
assert nodes[0]["log_address"].startswith("127.0.0.1:"), nodes[0]
PY
ctl nodes >"$WORK/nodes1.out" 2>&1
grep -Eq "^a +ready +[0-9]+s +0 +long +0 " "$WORK/nodes1.out" || fail "nodes: $(cat "$WORK/nodes1.out")"
ctl delete long >"$WORK/delete.out" 2>&1 && fail "a running job was deleted"
grep -q "job long is running: cancel it first" "$WORK/delete.out" || fail "delete of a live job: $(cat "$WORK/delete.out")"

ctl logs long -f >"$WORK/follow.out" 2>&1 &
follower=$!
sleep 2
ctl cancel long >/dev/null 2>&1 || fail "cancel long"
for _ in $(seq 1 150); do kill -0 "$follower" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$follower" 2>/dev/null; then
  fail "logs -f still runs 15 s after the job was cancelled"
  kill -KILL "$follower" 2>/dev/null
fi
wait "$follower" || fail "logs -f ended with an error: $(tail -3 "$WORK/follow.out")"
grep -q "step 6/" "$WORK/follow.out" || fail "logs -f did not show the run: $(tail -3 "$WORK/follow.out")"

# --- resubmit after cancel: accepted, and it resumes from the cancelled job's checkpoint.
submit long --set epochs=15 >"$WORK/submit.out" 2>&1 ||
  fail "submitting a cancelled job's name: $(cat "$WORK/submit.out")"
wait_until long 'j["phase"]=="JOB_PHASE_RUNNING" and int(j.get("step",0))>=1' 120
grep -q "resumed from $WORK/ckpt/long/step-" "$WORK/node-a/long/slot-0.log" ||
  fail "the resubmitted job did not resume: $(grep -h "resum" "$WORK/node-a/long/slot-0.log")"
ctl cancel long >/dev/null 2>&1

# --- delete: the record goes, the checkpoints stay, the agent removes the job's files.
ctl delete long >"$WORK/delete.out" 2>&1 || fail "delete long: $(cat "$WORK/delete.out")"
grep -q "its checkpoints stay in $WORK/ckpt/long" "$WORK/delete.out" || fail "delete: $(cat "$WORK/delete.out")"
ctl status long >"$WORK/status.out" 2>&1 && fail "a deleted job still has a status"
grep -q 'no job "long"' "$WORK/status.out" || fail "status of a deleted job: $(cat "$WORK/status.out")"
[ -e "$WORK/ckpt/long/LATEST" ] || fail "the deleted job's checkpoints are gone"
for _ in $(seq 1 100); do [ -d "$WORK/node-a/long" ] || break; sleep 0.1; done
[ -d "$WORK/node-a/long" ] && fail "the agent kept the deleted job's files: $(ls "$WORK/node-a/long")"
ctl logs long >/dev/null 2>&1 && fail "a deleted job's logs are still served"
ctl list --all >"$WORK/list.out" 2>&1
grep -q "^long " "$WORK/list.out" && fail "list shows the deleted job: $(cat "$WORK/list.out")"

if [ "$failures" -ne 0 ]; then
  echo "--- coordinator log (tail)"; tail -20 "$WORK/coordinator.log"
  echo "--- agent log (tail)"; tail -20 "$WORK/agent.log"
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "PASS: manage"
