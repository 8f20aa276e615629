#!/usr/bin/env bash
# The node agent (ringworker) as a real process, with its coordinator and trainers on
# loopback:
#   - SIGTERM while the coordinator cannot be reached: the agent says why it cannot
#     register, and the first SIGTERM ends it (exit 0) within seconds;
#   - a coordinator under mutual TLS and an agent without a client certificate: the agent
#     exits 1 at once naming --tls_client_cert, instead of retrying "Socket closed" forever;
#   - kill -9 of an agent: its trainers die with it (none is left running); the agent
#     started again on the same work directory takes the job's slots again, never two
#     trainers on one slot, and the job succeeds.
set -uo pipefail
BIN="$TEST_SRCDIR/ringmaster"
RINGMASTER="$BIN/coordinator/ringmaster"
RINGWORKER="$BIN/worker/ringworker"
RINGTRAINER="$BIN/worker/ringtrainer"
RINGCTL="$BIN/cli/ringctl"
SPEC="$BIN/examples/fashion_mnist_mlp.yaml"
WORK="${TEST_TMPDIR:-/tmp}/agent_process"
rm -rf "$WORK" && mkdir -p "$WORK" && cd "$WORK"
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  for p in $(pgrep -f "ringtrainer.*$WORK"); do kill -KILL "$p" 2>/dev/null; done
  true
}
trap cleanup EXIT

# exited_within PID SECONDS: whether PID (a child of this shell) exits within SECONDS.
exited_within() {
  local deadline=$((SECONDS + $2))
  while kill -0 "$1" 2>/dev/null; do
    [ "$SECONDS" -ge "$deadline" ] && return 1
    sleep 0.05
  done
  return 0
}
# runs PID: whether PID is a process that has not exited (a zombie has).
runs() { [ -e "/proc/$1" ] && ! grep -q '^[0-9]* (.*) Z' "/proc/$1/stat" 2>/dev/null; }

# --- SIGTERM while the coordinator cannot be reached --------------------------------------
free_port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
"$RINGWORKER" --coordinator "127.0.0.1:$free_port" --node lonely --slots 1 --gpus none \
  --work_dir "$WORK/node-lonely" --trainer "$RINGTRAINER" >lonely.out 2>lonely.err &
lonely=$!
pids+=("$lonely")
for _ in $(seq 1 200); do
  grep -q "cannot register node lonely" lonely.out && break
  sleep 0.05
done
grep -q "cannot register node lonely with the coordinator at 127.0.0.1:$free_port" lonely.out ||
  fail "the agent did not say why it cannot register: $(cat lonely.out)"
kill -TERM "$lonely"
if exited_within "$lonely" 5; then
  wait "$lonely"
  rc=$?
  [ "$rc" = 0 ] || fail "after SIGTERM the unregistered agent exited $rc, not 0"
  grep -q "exiting: asked to drain before node lonely registered" lonely.out ||
    fail "the agent did not say why it left: $(tail -2 lonely.out)"
else
  fail "the agent ignored SIGTERM for 5 s while the coordinator could not be reached"
fi

# --- Mutual TLS without a client certificate ---------------------------------------------
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=agent test CA" \
  -keyout ca.key -out ca.pem 2>/dev/null || { echo "openssl failed"; exit 1; }
echo "subjectAltName = IP:127.0.0.1, DNS:localhost" >san.cnf
openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" -keyout server.key \
  -out server.csr 2>/dev/null
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
  -extfile san.cnf -out server.pem 2>/dev/null
chmod 600 server.key ca.key
# start_coordinator NAME FLAG...: on a port the kernel picks; sets PORT and COORD_PID.
start_coordinator() {
  local name="$1"
  shift
  "$RINGMASTER" --listen 127.0.0.1:0 --db "$WORK/$name.db" "$@" >"coordinator-$name.log" 2>&1 &
  COORD_PID=$!
  pids+=("$COORD_PID")
  for _ in $(seq 1 100); do
    if grep -q "serving on" "coordinator-$name.log"; then
      PORT="$(grep -o "(port [0-9]*)" "coordinator-$name.log" | tail -1 | tr -dc 0-9)"
      return 0
    fi
    sleep 0.05
  done
  fail "ringmaster $name did not start: $(tail -3 "coordinator-$name.log")"
  exit 1
}
start_coordinator mtls --tls_cert server.pem --tls_key server.key --tls_client_ca ca.pem
"$RINGWORKER" --coordinator "127.0.0.1:$PORT" --node nocert --slots 1 --gpus none \
  --work_dir "$WORK/node-nocert" --trainer "$RINGTRAINER" --tls_ca ca.pem \
  >nocert.out 2>nocert.err &
nocert=$!
pids+=("$nocert")
if exited_within "$nocert" 15; then
  wait "$nocert"
  rc=$?
  [ "$rc" = 1 ] || fail "the agent without a client certificate exited $rc, not 1"
  grep -q "asks for a client certificate.*give --tls_client_cert and --tls_client_key" \
    nocert.err || fail "the agent did not say what mutual TLS lacks: $(tail -3 nocert.err)"
else
  fail "the agent without a client certificate retried for 15 s: $(tail -2 nocert.out)"
fi
kill -KILL "$COORD_PID" 2>/dev/null

# --- kill -9 of an agent, and its restart on the same work directory ---------------------
if [ ! -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  echo "SKIP (the agent's kill -9): Debian's dataset-fashion-mnist is not installed"
  [ "$failures" = 0 ] && echo PASS || echo "$failures failure(s)"
  exit $((failures > 0))
fi
# A long lease and hang timeout: the job's recovery is the restarted agent's doing (it
# reports the trainers that died with its predecessor), and the trainers' deaths the
# agent's kill -9 alone (the coordinator fences their ring out only once the lease lapses).
start_coordinator plain --heartbeat_s 0.2 --lease_s 60 --hang_timeout_s 60 --slot_backoff_s 1 \
  --grow_after_s 1000 --join_timeout_s 20
COORD="127.0.0.1:$PORT"
ctl() { "$RINGCTL" "$@" --coordinator "$COORD"; }
source "$TEST_SRCDIR/ringmaster/tests/job_helpers.sh"
start_agent() {
  "$RINGWORKER" --coordinator "$COORD" --node a --slots 2 --gpus none --work_dir "$WORK/node-a" \
    --trainer "$RINGTRAINER" --trainer_flags=--op_timeout_s=5,--connect_timeout_s=10 \
    >>agent-a.log 2>&1 &
  AGENT_PID=$!
  pids+=("$AGENT_PID")
}
start_agent
ctl submit "$SPEC" --set name=orphan --set epochs=2 --set checkpoint.dir="$WORK/ckpt" \
  --set checkpoint.every_steps=10 --set elastic.min_ranks=1 --set elastic.max_ranks=2 \
  --set schedule.warmup_steps=20 >>ctl.log 2>&1 || fail "submit: $(tail -3 ctl.log)"
wait_until orphan 'j["phase"]=="JOB_PHASE_RUNNING" and int(j.get("step",0))>=10' 60
trainers="$(pgrep -f "ringtrainer.*--job=orphan ")"
[ "$(echo "$trainers" | wc -w)" = 2 ] || fail "not two trainers: $trainers"
kill -KILL "$AGENT_PID"
wait "$AGENT_PID" 2>/dev/null
deadline=$((SECONDS + 3))
for p in $trainers; do
  while runs "$p" && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.05; done
  runs "$p" && fail "trainer $p outlived its agent's kill -9 by 3 s: $(tr '\0' ' ' </proc/"$p"/cmdline)"
done
start_agent
restarted=$SECONDS
wait_until orphan 'int(j["epoch"])>=2' 15
[ $((SECONDS - restarted)) -le 10 ] || fail "the job re-formed $((SECONDS - restarted)) s after the agent's restart"
grep -q "is gone (it died with that agent): reporting it" agent-a.log ||
  fail "the restarted agent did not report the trainers that died: $(grep -v '^I' agent-a.log | tail -5)"

# Until the job ends: never two trainers of the job on one slot.
deadline=$((SECONDS + 180))
while [ "$SECONDS" -lt "$deadline" ]; do
  for slot in 0 1; do
    n="$(pgrep -fc "ringtrainer.*--job=orphan .*--slot=$slot ")"
    [ "$n" -le 1 ] || fail "$n trainers on slot $slot: $(pgrep -fa "ringtrainer.*--slot=$slot ")"
  done
  phase="$(field orphan 'j["phase"]')"
  case "$phase" in JOB_PHASE_SUCCEEDED | JOB_PHASE_FAILED | JOB_PHASE_CANCELLED) break ;; esac
  sleep 0.2
done
[ "$(field orphan 'j["phase"]')" = JOB_PHASE_SUCCEEDED ] ||
  fail "the job did not succeed after the agent's restart: $(ctl status orphan 2>&1 | head -15)"
[ "$(field orphan 'int(j["epoch"])>=2')" = True ] ||
  fail "the job did not re-form after the agent's kill -9: $(ctl status orphan 2>&1 | head -15)"

[ "$failures" = 0 ] && echo PASS || echo "$failures failure(s)"
exit $((failures > 0))
