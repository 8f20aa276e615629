#!/usr/bin/env bash
# End to end under a coordinator: ringmaster, ringworker agents and ringtrainers as real
# processes on loopback, driven by ringctl. One scenario per target ($1):
#   failures: 4 ranks on 2 agents (2 slots each).
#     - SIGKILL one trainer: the job goes on with 3 in a new epoch, the survivors restoring
#       from memory with no step lost, and completes, its test accuracy within 0.03 of an
#       uninterrupted run of the same spec;
#     - SIGKILL a whole agent with its trainers: its lease expires, the job goes on;
#     - SIGSTOP a trainer: after the hang timeout it is stopped and the job goes on.
#   restart: kill -9 the coordinator mid-training and start it again on the same
#     database: the job completes; a node that comes back makes the job grow again (also a
#     job without checkpoint.dir, from the survivors' memory); a
#     trainer's death while the coordinator is down is reported once it is back.
#   drain: SIGTERM an agent: the job shrinks with no step lost (the survivors resume from
#     the drain save of the step the ring reached); two jobs at once on separate slots; the
#     drain again under ZeRO-3 (fully sharded: the survivors resume from the drain's save).
#   mesh: the GPT with pipeline parallelism (parallelism.mesh.pp 2) on 4 ranks (pp 2 x dp 2):
#     SIGKILL one trainer: the pipeline and data-parallel groups break within the trainers'
#     op timeout, the next world is one whole replica (2 ranks: the survivor beyond it is
#     stopped, not blamed), restored from the last checkpoint, and the job completes; the
#     recovery, `ringctl status` and rank 0's progress lines say the steps lost and why.
#   mesh_tp: the same with tensor parallelism (parallelism.mesh.tp 2: tp 2 x dp 2): the
#     killed trainer's tensor-parallel partner meets the broken group inside a block's sum.
#   reports: what trainers tell the coordinator: every committed checkpoint (ringctl
#     checkpoints lists them, the last step's included); a diverged run (optimizer.lr=1e6)
#     fails at once, its reason naming the step, with no restart.
#   preemption: checkpoint.every: auto hears the cluster: an agent's preemption notice file
#     appears, the agent drains, the coordinator counts it and a running job's rank 0 sets
#     its interval from the cluster's rate (Young/Daly), saying so.
set -uo pipefail

SCENARIO="${1:?scenario}"
BIN="$TEST_SRCDIR/ringmaster"
RINGMASTER="$BIN/coordinator/ringmaster"
RINGWORKER="$BIN/worker/ringworker"
RINGTRAINER="$BIN/worker/ringtrainer"
RINGCTL="$BIN/cli/ringctl"
SPEC="$BIN/examples/fashion_mnist_mlp.yaml"
WORK="${TEST_TMPDIR:-/tmp}/elastic_$SCENARIO"
rm -rf "$WORK" && mkdir -p "$WORK"
# The coordinator's first start listens on port 0 (the kernel picks a free one, so tests
# running side by side never collide); a restart reuses the port it got.
COORD_PORT=0
COORD="127.0.0.1:$COORD_PORT"
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  pkill -KILL -f "ringtrainer.*--coordinator=$COORD" 2>/dev/null
  true
}
trap cleanup EXIT

if [ ! -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  echo "SKIP: Debian's dataset-fashion-mnist is not installed (tools/setup.sh installs it)"
  exit 0
fi

# Coordinator flags for quick tests: 0.2 s heartbeats, 1 s lease, 3 s hang timeout.
COORD_FLAGS=(--heartbeat_s 0.2 --lease_s 1 --hang_timeout_s 3 --slot_backoff_s 2
  --grow_after_s 1000 --join_timeout_s 20)
start_coordinator() {
  local started
  started="$(grep -c "serving on" "$WORK/coordinator.log" 2>/dev/null)"
  "$RINGMASTER" --listen "127.0.0.1:$COORD_PORT" --db "$WORK/jobs.db" "${COORD_FLAGS[@]}" "$@" \
    >>"$WORK/coordinator.log" 2>&1 &
  COORD_PID=$!
  pids+=("$COORD_PID")
  for _ in $(seq 1 100); do
    if [ "$(grep -c "serving on" "$WORK/coordinator.log" 2>/dev/null)" -gt "${started:-0}" ]; then
      COORD_PORT="$(grep -o "(port [0-9]*)" "$WORK/coordinator.log" | tail -1 | tr -dc 0-9)"
      COORD="127.0.0.1:$COORD_PORT"
      return 0
    fi
    sleep 0.05
  done
  fail "the coordinator did not start: $(tail -3 "$WORK/coordinator.log")"
  exit 1
}
# start_agent NODE SLOTS [FLAG...]: sets AGENT_PID.
start_agent() {
  "$RINGWORKER" --coordinator "$COORD" --node "$1" --slots "$2" --work_dir "$WORK/node-$1" \
    --trainer "$RINGTRAINER" --trainer_flags=--op_timeout_s=5,--connect_timeout_s=10 \
    --drain_grace_s 30 "${@:3}" >>"$WORK/agent-$1.log" 2>&1 &
  AGENT_PID=$!
  pids+=("$AGENT_PID")
  local registered
  registered="$(grep -c "registered node" "$WORK/agent-$1.log" 2>/dev/null)"
  for _ in $(seq 1 100); do
    [ "$(grep -c "registered node" "$WORK/agent-$1.log" 2>/dev/null)" -gt "${registered:-0}" ] && return 0
    sleep 0.05
  done
  fail "agent $1 did not register: $(tail -3 "$WORK/agent-$1.log")"
}
ctl() { "$RINGCTL" "$@" --coordinator "$COORD"; }
# submit NAME EPOCHS [--set ...]
submit() {
  local name="$1" epochs="$2"
  shift 2
  ctl submit "$SPEC" --set name="$name" --set epochs="$epochs" \
    --set checkpoint.dir="$WORK/ckpt" --set checkpoint.every_steps=10 \
    --set elastic.min_ranks=1 --set elastic.max_ranks=4 --set schedule.warmup_steps=20 "$@" \
    >>"$WORK/ctl.log" 2>&1 || fail "submit $name: $(tail -3 "$WORK/ctl.log")"
}
# field, wait_until
source "$TEST_SRCDIR/ringmaster/tests/job_helpers.sh"
trainer_pid() {  # trainer_pid JOB NODE SLOT
  pgrep -f "ringtrainer.*--job=$1 .*--node=$2 --slot=$3 " | head -1
}
accuracy() {  # the last test accuracy in rank 0's log of a job under node DIR
  grep -ho "test_accuracy [0-9.]*" "$WORK"/node-*/"$1"/slot-*.log | tail -1 | cut -d' ' -f2
}

case "$SCENARIO" in
failures)
  start_coordinator
  start_agent a 2
  start_agent b 2
  # The reference: the same job, uninterrupted, on 4 local ranks.
  "$RINGCTL" local --workers 4 "$SPEC" --set name=reference --set epochs=2 \
    --set schedule.warmup_steps=20 --summary "$WORK/reference.json" \
    --run_dir "$WORK/reference" >"$WORK/reference.out" 2>&1 || fail "reference run failed"
  reference="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["eval_accuracy"])' "$WORK/reference.json")"

  submit kill 2
  wait_until kill 'j["phase"]=="JOB_PHASE_RUNNING" and int(j.get("step",0))>=30' 60
  victim="$(trainer_pid kill b 0)"
  [ -n "$victim" ] || fail "no trainer of job kill on b/0"
  kill -KILL "$victim"
  wait_until kill 'int(j["epoch"])==2 and len(j.get("members",[]))==3' 20
  wait_until kill 'j["phase"]=="JOB_PHASE_SUCCEEDED"' 120
  [ "$(field kill 'j["recoveries"][0]["cause"]')" = failure ] || fail "recovery cause: $(ctl status kill)"
  # The survivors restored the state from memory (ZeRO-0: each holds all of it), so no step
  # since the last checkpoint was trained again.
  grep -q "from the memory of rank" "$WORK"/node-a/kill/slot-*.log ||
    fail "the survivors did not restore from memory: $(grep -h "restored\|resumed" "$WORK"/node-a/kill/slot-*.log | head -3)"
  [ "$(field kill 'int(j["recoveries"][0].get("lost_steps",0))')" = 0 ] ||
    fail "steps lost in the recovery: $(ctl status kill)"
  [ "$(field kill 'float(j["recoveries"][0]["rendezvous_s"])<5')" = True ] ||
    fail "rendezvous took too long: $(ctl status kill)"
  acc="$(accuracy kill)"
  python3 -c 'import sys; a,b=map(float,sys.argv[1:]); sys.exit(0 if abs(a-b)<=0.03 else 1)' \
    "$acc" "$reference" || fail "accuracy after a recovery $acc vs uninterrupted $reference"

  # A whole node dies: the agent and its trainers.
  submit node 3 --set elastic.max_ranks=4
  wait_until node 'j["phase"]=="JOB_PHASE_RUNNING" and int(j.get("step",0))>=20' 60
  agent_b="$(pgrep -f "ringworker.*--node b ")"
  kill -KILL $agent_b
  pkill -KILL -f "ringtrainer.*--job=node .*--node=b "
  wait_until node 'int(j["epoch"])>=2 and len(j.get("members",[]))==2 and all(m["slot"]["node"]=="a" for m in j.get("members",[]))' 20
  grep -q "lease expired" "$WORK/coordinator.log" || true
  wait_until node 'j["phase"]=="JOB_PHASE_SUCCEEDED"' 150

  # A hung trainer (SIGSTOP) on the remaining node: stopped after the hang timeout.
  start_agent b 2
  submit hang 2 --set elastic.max_ranks=4
  wait_until hang 'j["phase"]=="JOB_PHASE_RUNNING" and int(j.get("step",0))>=20' 60
  hung="$(trainer_pid hang a 1)"
  kill -STOP "$hung"
  wait_until hang 'int(j["epoch"])>=2 and not any(m["slot"]["node"]=="a" and int(m["slot"].get("slot",0))==1 for m in j.get("members",[]))' 30
  grep -q "sent nothing" "$WORK/coordinator.log" "$WORK/ctl.log" 2>/dev/null ||
    [ "$(field hang '"sent nothing" in j["recoveries"][0]["reason"]')" = True ] ||
    fail "the hang was not the recovery's reason: $(ctl status hang)"
  wait_until hang 'j["phase"]=="JOB_PHASE_SUCCEEDED"' 150
  kill -KILL "$hung" 2>/dev/null
  ;;

restart)
  start_coordinator
  start_agent a 2
  start_agent b 2
  submit survive 3
  wait_until survive 'j["phase"]=="JOB_PHASE_RUNNING" and int(j.get("step",0))>=30' 60
  kill -KILL "$COORD_PID"
  sleep 1
  start_coordinator
  wait_until survive 'j["phase"]=="JOB_PHASE_SUCCEEDED"' 150
  [ "$(field survive 'int(j["epoch"])')" = 1 ] ||
    fail "the coordinator's restart disturbed the running ring: $(ctl status survive)"
  grep -qE "restored 1 jobs? " "$WORK/coordinator.log" || fail "the coordinator restored no job"

  # Growth: a job on one node grows when a second node registers.
  kill -KILL "$COORD_PID"
  COORD_FLAGS=(--heartbeat_s 0.2 --lease_s 1 --hang_timeout_s 30 --grow_after_s 1)
  start_coordinator
  agent_b="$(pgrep -f "ringworker.*--node b ")"
  kill -TERM $agent_b
  sleep 2
  submit grow 3
  wait_until grow 'j["phase"]=="JOB_PHASE_RUNNING" and len(j.get("members",[]))==2 and int(j.get("step",0))>=10' 60
  start_agent b 2
  wait_until grow 'len(j.get("members",[]))==4 and j["recoveries"][-1]["cause"]=="grow"' 30
  wait_until grow 'j["phase"]=="JOB_PHASE_SUCCEEDED"' 150
  [ "$(field grow 'int(j.get("restarts",0))')" = 0 ] || fail "growth spent the restart budget"

  # Growth without checkpoint.dir (as every example ships): the new ranks get the state from
  # the survivors' memory (plain data parallelism: each survivor holds all of it), no step
  # is lost and the job does not fail.
  kill -TERM "$(pgrep -f "ringworker.*--node b ")"
  sleep 2
  submit frommemory 3 --set checkpoint.dir= --set checkpoint.every_steps=0
  wait_until frommemory 'j["phase"]=="JOB_PHASE_RUNNING" and len(j.get("members",[]))==2 and int(j.get("step",0))>=10' 60
  start_agent b 2
  wait_until frommemory 'len(j.get("members",[]))==4 and j["recoveries"][-1]["cause"]=="grow"' 30
  wait_until frommemory 'j["phase"]=="JOB_PHASE_SUCCEEDED"' 150
  [ "$(field frommemory 'int(j.get("restarts",0))')" = 0 ] || fail "growth spent the restart budget: $(ctl status frommemory)"
  [ "$(field frommemory 'int(j["recoveries"][-1].get("lost_steps",0))')" = 0 ] ||
    fail "steps lost in the growth: $(ctl status frommemory)"
  grep -q "from the memory of rank" "$WORK"/node-a/frommemory/slot-*.log ||
    fail "the grown job did not restore from memory: $(grep -h "restored\|resumed\|checkpoint.dir" "$WORK"/node-*/frommemory/slot-*.log | head -3)"

  # A trainer dies while the coordinator is down: its agent keeps the exit report and sends
  # it once the coordinator is back, so the job's recovery names that death (it used to be
  # dropped: the job learnt of it only from a timeout or the survivors' errors).
  submit orphan 3
  wait_until orphan 'j["phase"]=="JOB_PHASE_RUNNING" and int(j.get("step",0))>=10' 60
  victim="$(trainer_pid orphan a 0)"
  kill -KILL "$COORD_PID"
  kill -KILL "$victim"
  sleep 7  # the agent reaps it; its report cannot be delivered (its client retries 5 s)
  start_coordinator
  wait_until orphan 'len(j.get("recoveries",[]))>0' 60
  [ "$(field orphan '"trainer on a/0 was killed by signal 9" in j["recoveries"][0]["reason"]')" = True ] ||
    fail "the exit reported while the coordinator was down was lost: $(ctl status orphan | head -5)"
  wait_until orphan 'j["phase"]=="JOB_PHASE_SUCCEEDED"' 150
  ;;

drain)
  start_coordinator
  start_agent a 2
  start_agent b 2
  submit drain 3
  wait_until drain 'j["phase"]=="JOB_PHASE_RUNNING" and int(j.get("step",0))>=25' 60
  agent_b="$(pgrep -f "ringworker.*--node b ")"
  kill -TERM $agent_b
  wait_until drain 'int(j["epoch"])==2 and len(j.get("members",[]))==2' 30
  for _ in $(seq 1 100); do kill -0 $agent_b 2>/dev/null || break; sleep 0.1; done
  kill -0 $agent_b 2>/dev/null && fail "the drained agent did not exit"
  grep -q "drained: every trainer has exited" "$WORK/agent-b.log" || fail "agent b: $(tail -3 "$WORK/agent-b.log")"
  wait_until drain 'j["phase"]=="JOB_PHASE_SUCCEEDED"' 150
  [ "$(field drain 'int(j.get("restarts",0))')" = 0 ] || fail "the drain spent the restart budget"
  # No lost step: the survivors resumed (from their memory, or from the drain save) at the
  # step where the ring stopped, which is the last step any rank logged before the drain.
  log="$(ls "$WORK"/node-a/drain/slot-0.log)"
  drained_at="$(grep -o "drained after step [0-9]*" "$log" | head -1 | grep -o "[0-9]*$")"
  resumed_at="$(grep -o "resumed from .*step-[0-9]* (step [0-9]*\|restored step [0-9]*" "$log" | head -1 | grep -o "[0-9]*$")"
  [ -n "$drained_at" ] || fail "rank 0 did not drain: $(grep -v "^I20" "$log" | tail -5)"
  [ "$drained_at" = "$resumed_at" ] ||
    fail "drained after step $drained_at but resumed from step $resumed_at (steps lost)"

  # Two jobs at once on separate slots.
  start_agent b 2
  submit one 1 --set elastic.max_ranks=2
  submit two 1 --set elastic.max_ranks=2
  wait_until one 'j["phase"]=="JOB_PHASE_SUCCEEDED"' 120
  wait_until two 'j["phase"]=="JOB_PHASE_SUCCEEDED"' 120
  # The slots each job's trainers ran on, from the agents' logs: a finished job's status no
  # longer lists a member whose trainer exited before the last rank finished.
  slots_of() {
    for n in a b; do
      grep -o "started trainer for job $1 epoch [0-9]* on slot [0-9]*" "$WORK/agent-$n.log" |
        sed "s/.* on slot /$n/"
    done | sort -u | tr '\n' ' '
  }
  slots_one="$(slots_of one)"
  slots_two="$(slots_of two)"
  python3 -c 'import sys; a=set(sys.argv[1].split()); b=set(sys.argv[2].split()); sys.exit(0 if len(a)==2 and len(b)==2 and not a&b else 1)' \
    "$slots_one" "$slots_two" || fail "two jobs shared slots: $slots_one / $slots_two"

  # ZeRO-3: each rank holds only its pieces, so the survivors of a drain resume from the
  # drain's save (not from memory), again with no step lost.
  submit drain3 3 --set parallelism.zero_stage=3
  wait_until drain3 'j["phase"]=="JOB_PHASE_RUNNING" and int(j.get("step",0))>=25 and len(j.get("members",[]))==4' 60
  agent_b="$(pgrep -f "ringworker.*--node b ")"
  kill -TERM $agent_b
  wait_until drain3 'int(j["epoch"])==2 and len(j.get("members",[]))==2' 30
  wait_until drain3 'j["phase"]=="JOB_PHASE_SUCCEEDED"' 150
  log="$(ls "$WORK"/node-a/drain3/slot-0.log)"
  drained_at="$(grep -o "drained after step [0-9]*" "$log" | head -1 | grep -o "[0-9]*$")"
  resumed_at="$(grep -o "resumed from .*step-[0-9]* (step [0-9]*" "$log" | head -1 | grep -o "[0-9]*$")"
  grep -q "ZeRO-3 (fully sharded)" "$log" || fail "drain3 did not run ZeRO-3: $(grep batch: "$log" | head -1)"
  [ -n "$drained_at" ] || fail "drain3: rank 0 did not drain: $(grep -v "^I20" "$log" | tail -5)"
  [ "$drained_at" = "$resumed_at" ] ||
    fail "drain3: drained after step $drained_at but resumed from step $resumed_at (steps lost)"
  ;;

mesh | mesh_tp)
  # The mesh's pp and tp, and how its two worlds print.
  if [ "$SCENARIO" = mesh ]; then
    pp=2 tp=1 before="pp=2 x dp=2 x tp=1" after="pp=2 x dp=1 x tp=1"
  else
    pp=1 tp=2 before="pp=1 x dp=2 x tp=2" after="pp=1 x dp=1 x tp=2"
  fi
  start_coordinator
  start_agent a 2
  start_agent b 2
  ctl submit "$BIN/examples/tiny_gpt.yaml" --set name=pipe --set steps=80 \
    --set metrics.jsonl="$WORK/pipe.metrics.jsonl" \
    --set schedule.warmup_steps=5 --set model.gpt.width=64 --set model.gpt.context=64 \
    --set checkpoint.dir="$WORK/ckpt" --set checkpoint.every_steps=10 \
    --set elastic.min_ranks=2 --set elastic.max_ranks=4 --set parallelism.mesh.pp=$pp \
    --set parallelism.mesh.tp=$tp \
    >>"$WORK/ctl.log" 2>&1 || fail "submit pipe: $(tail -3 "$WORK/ctl.log")"
  wait_until pipe 'j["phase"]=="JOB_PHASE_RUNNING" and len(j.get("members",[]))==4 and int(j.get("step",0))>=15' 90
  grep -q "mesh: $before" "$WORK"/node-a/pipe/slot-0.log ||
    fail "epoch 1 did not run on the mesh: $(grep -h "mesh\|batch:" "$WORK"/node-a/pipe/slot-0.log | head -3)"
  victim="$(trainer_pid pipe b 1)"
  [ -n "$victim" ] || fail "no trainer of job pipe on b/1"
  kill -KILL "$victim"
  # 3 slots left: the world is the largest multiple of tp x pp = 2, one replica.
  wait_until pipe 'int(j["epoch"])>=2 and len(j.get("members",[]))==2' 30
  wait_until pipe 'j["phase"]=="JOB_PHASE_SUCCEEDED"' 180
  [ "$(field pipe 'len(j["recoveries"])==1 and j["recoveries"][0]["cause"]=="failure"')" = True ] ||
    fail "recoveries: $(ctl status pipe | head -12)"
  # The killed trainer is named; the survivor stopped as beyond the world is not blamed.
  [ "$(field pipe '"trainer on b/1 was killed" in j["recoveries"][0]["reason"] and "trainer on b/0" not in j["recoveries"][0]["reason"]')" = True ] ||
    fail "the recovery blames the wrong rank: $(field pipe 'j["recoveries"][0]["reason"]')"
  [ "$(field pipe 'int(j.get("restarts",0))')" = 1 ] || fail "restarts: $(ctl status pipe | head -5)"
  grep -q "mesh: $after" "$WORK"/node-a/pipe/slot-0.log ||
    fail "epoch 2 did not run on one replica: $(grep -h "mesh" "$WORK"/node-a/pipe/slot-0.log)"
  grep -q "resumed from .*step-" "$WORK"/node-a/pipe/slot-0.log ||
    fail "epoch 2 did not resume from a checkpoint: $(grep -h "resum\|restor" "$WORK"/node-a/pipe/slot-0.log)"
  # Where it resumed from, the steps lost and why: in the recovery, in
  # `ringctl status`, and once in rank 0's progress lines, the same words.
  [ "$(field pipe '(r:=j["recoveries"][0])["resumed_from"]=="step %d\x27s checkpoint" % int(r["resumed_from_step"]) and int(r["lost_steps"])==int(r["step_before"])-int(r["resumed_from_step"]) and "sharded over the ranks" in r["lost_because"]')" = True ] ||
    fail "the recovery does not say where it resumed from and why: $(ctl status pipe --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["recoveries"])')"
  said="$(grep -h "^resumed from step [0-9]*'s checkpoint: " "$WORK"/node-a/pipe/slot-0.log)"
  [ "$(printf '%s\n' "$said" | grep -c .)" = 1 ] ||
    fail "rank 0 did not say the steps lost once: $(grep -h "resum" "$WORK"/node-a/pipe/slot-0.log)"
  ctl status pipe | grep -qF "$said" ||
    fail "status does not say what rank 0 said ($said): $(ctl status pipe | grep recovery)"
  ;;

reports)
  start_coordinator
  start_agent a 2
  submit saves 1 --set elastic.max_ranks=2
  wait_until saves 'j["phase"]=="JOB_PHASE_SUCCEEDED"' 120
  # A save every 10 steps and the last: each reported once, newest last.
  total="$(field saves 'int(j["total_steps"])')"
  ctl checkpoints saves --json >"$WORK/checkpoints.json" 2>&1
  python3 - "$WORK/checkpoints.json" "$WORK/ckpt/saves" "$total" <<'PY' || fail "checkpoints: $(cat "$WORK/checkpoints.json")"
import json, sys
listed = json.load(open(sys.argv[1])).get("checkpoints", [])
steps = [int(c["step"]) for c in listed]
total = int(sys.argv[3])
assert steps == sorted(set(steps)) and steps[-1] == total and len(steps) >= 3, steps
last = listed[-1]
assert last["path"] == f"{sys.argv[2]}/step-{total}" and int(last["world_size"]) == 2, last
assert int(last["bytes"]) > 0 and int(last["committed_ms"]) > 0, last
PY
  submit diverge 1 --set elastic.max_ranks=2 --set optimizer.lr=1e6
  wait_until diverge 'j["phase"]=="JOB_PHASE_FAILED"' 60
  [ "$(field diverge '"training diverged at step" in j["reason"]')" = True ] ||
    fail "the diverged job's reason: $(ctl status diverge)"
  [ "$(field diverge 'int(j.get("restarts",0))')" = 0 ] || fail "a diverged run was restarted"
  ;;

preemption)
  start_coordinator
  start_agent a 2
  submit spot 3 --set elastic.max_ranks=2 --set checkpoint.every=auto \
    --set checkpoint.every_steps=0
  wait_until spot 'j["phase"]=="JOB_PHASE_RUNNING" and int(j.get("step",0))>=5' 60
  log="$(ls "$WORK"/node-a/spot/slot-0.log)"
  grep -q "checkpoint interval 1h (no preemptions expected" "$log" ||
    fail "no first interval: $(grep "checkpoint interval" "$log")"
  # A spot node (no work on it) gets its notice: 1 drain in 6 hours over 2 nodes, times the
  # job's 1 node, is 1/12 an hour: sqrt(2 x 10 s x 3600 x 12) = 929.5 s.
  start_agent c 1 --preemption_notice_file "$WORK/notice-c"
  agent_c=$AGENT_PID
  echo spot >"$WORK/notice-c"
  for _ in $(seq 1 100); do kill -0 $agent_c 2>/dev/null || break; sleep 0.1; done
  grep -q "preemption notice $WORK/notice-c found" "$WORK/agent-c.log" ||
    fail "agent c: $(tail -3 "$WORK/agent-c.log")"
  want="checkpoint interval now 15m29s (Young/Daly sqrt(2 x assumed save cost 10s / 0.0833 preemptions/h), the cluster's preemption rate (configured 0))"
  for _ in $(seq 1 200); do grep -qF "$want" "$log" && break; sleep 0.1; done
  grep -qF "$want" "$log" || fail "rank 0 did not hear the rate: $(grep "checkpoint interval" "$log")"
  wait_until spot 'j["phase"]=="JOB_PHASE_SUCCEEDED"' 150
  ;;

*)
  echo "unknown scenario $SCENARIO" >&2
  exit 2
  ;;
esac

if [ "$failures" -ne 0 ]; then
  echo "--- coordinator log (tail)"; tail -30 "$WORK/coordinator.log"
  for f in "$WORK"/agent-*.log; do echo "--- $f (tail)"; tail -15 "$f"; done
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "PASS: elastic $SCENARIO"
