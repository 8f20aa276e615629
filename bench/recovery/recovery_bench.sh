#!/usr/bin/env bash
# bench/recovery: how long a job takes to train again after one of its 4 trainers is
# SIGKILLed, ringmaster against an elastic torchrun in the same run, on this machine.
#
#   bazel build //coordinator:ringmaster //worker:ringworker //worker:ringtrainer //cli:ringctl
#   bench/recovery/recovery_bench.sh [--repeats 3]
#
# ringmaster: a coordinator (default timeouts except a 1 s slot backoff), two
# agents with 2 slots each, the Fashion-MNIST MLP checkpointing every 10 steps. The phases
# come from the coordinator's recovery record: detect (kill → the coordinator decided the
# new epoch), rendezvous (→ epoch committed), restore (→ every member ready: communicator
# built, checkpoint loaded), first step (→ the first step of the new epoch reported).
# torchrun: 4 workers, --max_restarts 3, its default monitor interval (5 s) and a
# c10d rendezvous; the same MLP under DDP/Gloo checkpointing every 10 steps. Its
# "resumed" is the kill → the first step printed after the restart.
# Also the drain: SIGTERM to an agent, and the steps lost (goal 0); and a frozen trainer:
# SIGSTOP, found by its silence (issue 17: no report, not even a keep-alive, for
# max(5 s, 10 x the median step time)), stopped by its agent, the job re-formed.
# Goals (issue 5): detection <= 2 s, training resumed <= 5 s after the kill, 0 lost steps
# on a drain; (issue 17) resumed <= 10 s after a SIGSTOP. The machine is shared and noisy:
# compare numbers of one run.
set -uo pipefail
REPEATS=3
[ "${1:-}" = "--repeats" ] && REPEATS="$2"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BIN="$ROOT/bazel-bin"
for b in coordinator/ringmaster worker/ringworker worker/ringtrainer cli/ringctl; do
  [ -x "$BIN/$b" ] || { echo "build first: bazel build //$(dirname $b):$(basename $b)" >&2; exit 2; }
done
WORK="$(mktemp -d /tmp/recovery-bench-XXXXXX)"
PORT=$((30000 + RANDOM % 20000))
COORD="127.0.0.1:$PORT"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  pkill -KILL -f "ringtrainer.*--coordinator=$COORD" 2>/dev/null
  pkill -KILL -f "torchrun_peer.py" 2>/dev/null
  true
}
trap cleanup EXIT
now() { date +%s.%N; }
ctl() { "$BIN/cli/ringctl" "$@" --coordinator "$COORD"; }
fail() { echo "$*" >&2; }
JOB_POLL_S=0.1
source "$ROOT/tests/job_helpers.sh"  # field, wait_until

"$BIN/coordinator/ringmaster" --listen "$COORD" --db "$WORK/jobs.db" --heartbeat_s 1 --lease_s 3 \
  --slot_backoff_s 1 --grow_after_s 1000 >"$WORK/coordinator.log" 2>&1 &
pids+=($!)
sleep 0.5
for node in a b; do
  "$BIN/worker/ringworker" --coordinator "$COORD" --node "$node" --slots 2 \
    --work_dir "$WORK/node-$node" --trainer "$BIN/worker/ringtrainer" >"$WORK/agent-$node.log" 2>&1 &
  pids+=($!)
done
sleep 1

# recover KIND SIGNAL RUN: a job of 4 ranks; at step 40 one trainer gets SIGNAL; waits for the
# job to train again and prints the phases. Sets PHASES ("detect rendezvous restore first
# resumed") and LOST (the steps trained again).
recover() {
  local kind="$1" signal="$2" job="$1$3"
  ctl submit "$ROOT/examples/fashion_mnist_mlp.yaml" --set name=$job --set epochs=4 \
    --set checkpoint.dir="$WORK/ckpt" --set checkpoint.every_steps=10 \
    --set elastic.min_ranks=2 --set elastic.max_ranks=4 >/dev/null || exit 1
  wait_until $job 'j["phase"]=="JOB_PHASE_RUNNING" and int(j.get("step",0))>=40' 60 || exit 1
  local victim t0 line began rdzv restore first detect resumed
  victim="$(pgrep -f "ringtrainer.*--job=$job " | tail -1)"
  [ -n "$victim" ] || { echo "no trainer of job $job" >&2; exit 1; }
  t0="$(now)"
  kill "-$signal" "$victim"
  wait_until $job 'len(j.get("recoveries",[]))>0 and float(j["recoveries"][0].get("first_step_s",0))>0' 120 || exit 1
  line="$(field $job '" ".join(str(x) for x in [int(j["recoveries"][0]["began_ms"])/1e3, j["recoveries"][0].get("rendezvous_s",0), j["recoveries"][0].get("restore_s",0), j["recoveries"][0].get("first_step_s",0), int(j["recoveries"][0].get("lost_steps",0))])')"
  read -r began rdzv restore first LOST <<<"$line"
  detect="$(python3 -c "print(max(0.0, $began - $t0))")"
  resumed="$(python3 -c "print($detect + $rdzv + $restore + $first)")"
  printf "ringmaster %s run %d: detect %.2f s, rendezvous %.2f s, restore %.2f s, first step %.2f s, resumed %.2f s, %d steps lost\n" \
    "$signal" "$3" "$detect" "$rdzv" "$restore" "$first" "$resumed" "$LOST"
  PHASES="$detect $rdzv $restore $first $resumed"
  kill -CONT "$victim" 2>/dev/null
  ctl cancel $job >/dev/null 2>&1
  sleep 2  # the failed slot's backoff (1 s here) ends
}

ours=()
for i in $(seq 1 "$REPEATS"); do
  recover kill KILL "$i"
  ours+=("$PHASES")
done

# SIGSTOP: the frozen trainer is found by its silence, killed by its agent, and the job goes
# on without it.
stops=()
for i in $(seq 1 "$REPEATS"); do
  recover stop STOP "$i"
  stops+=("$PHASES")
done

# Drain: SIGTERM an agent; lost steps = drained step - resumed step (0 expected).
ctl submit "$ROOT/examples/fashion_mnist_mlp.yaml" --set name=drain --set epochs=4 \
  --set checkpoint.dir="$WORK/ckpt" --set checkpoint.every_steps=50 \
  --set elastic.min_ranks=1 --set elastic.max_ranks=4 >/dev/null
wait_until drain 'j["phase"]=="JOB_PHASE_RUNNING" and int(j.get("step",0))>=30' 90 || exit 1
kill -TERM "$(pgrep -f "ringworker.*--node b " | head -1)"
wait_until drain 'len(j.get("recoveries",[]))>0 and float(j["recoveries"][0].get("first_step_s",0))>0' 60 || exit 1
log="$(ls "$WORK"/node-a/drain/slot-0.log)"
drained="$(grep -o "drained after step [0-9]*" "$log" | head -1 | grep -o "[0-9]*$")"
# The survivors restore from memory (or, with ZeRO-1/2, from the drain save).
resumed_step="$(grep -o "resumed from .*(step [0-9]*\|restored step [0-9]*" "$log" | head -1 | grep -o "[0-9]*$")"
lost=$(( ${drained:-0} - ${resumed_step:-0} ))
echo "ringmaster drain: drained after step $drained, resumed from step $resumed_step: $lost steps lost"

# torchrun, the same kill.
theirs=()
for i in $(seq 1 "$REPEATS"); do
  rm -f "$WORK/torch.ckpt"
  # --redirects/--tee 2: Debian's torch 1.13 on Python 3.11 cannot parse their default "0"
  # (IntFlag iteration skips the zero member), so stderr is redirected to torchrun's logs.
  /usr/bin/python3 -m torch.distributed.run --nnodes 1 --nproc_per_node 4 --max_restarts 3 \
    --redirects 2 --tee 2 \
    --rdzv_backend c10d --rdzv_endpoint "127.0.0.1:$((PORT + i))" \
    "$ROOT/bench/recovery/torchrun_peer.py" --steps 100000 --checkpoint "$WORK/torch.ckpt" \
    >"$WORK/torch-$i.log" 2>&1 &
  tr=$!
  for _ in $(seq 1 600); do
    [ "$(grep -c "^STEP" "$WORK/torch-$i.log")" -ge 40 ] && break
    sleep 0.1
  done
  victim="$(pgrep -f "torchrun_peer.py" | tail -1)"
  t_kill="$(now)"
  kill -KILL "$victim"
  steps_before="$(grep -c "^STEP" "$WORK/torch-$i.log")"
  resumed=""
  for _ in $(seq 1 1200); do
    if [ "$(grep -c "^STEP" "$WORK/torch-$i.log")" -gt "$steps_before" ]; then
      t_first="$(grep "^STEP" "$WORK/torch-$i.log" | tail -n +"$((steps_before + 1))" | head -1 | cut -d' ' -f3)"
      resumed="$(python3 -c "print($t_first - $t_kill)")"
      break
    fi
    sleep 0.1
  done
  kill -TERM "$tr" 2>/dev/null; wait "$tr" 2>/dev/null
  pkill -KILL -f "torchrun_peer.py" 2>/dev/null
  printf "torchrun run %d: resumed %s s after the kill\n" "$i" "${resumed:-never (120 s)}"
  theirs+=("${resumed:-120}")
done

python3 - "$REPEATS" "${ours[@]}" -- "${stops[@]}" -- "${theirs[@]}" "$lost" <<'EOF'
import statistics, sys
n = int(sys.argv[1])
args = sys.argv[2:]
sep = args.index("--")
sep2 = args.index("--", sep + 1)
ours = [list(map(float, a.split())) for a in args[:sep]]
stops = [list(map(float, a.split())) for a in args[sep + 1:sep2]]
theirs = list(map(float, args[sep2 + 1:sep2 + 1 + n]))
lost = int(args[sep2 + 1 + n])
med = lambda xs: statistics.median(xs)
names = ["detect", "rendezvous", "restore", "first step", "resumed"]
print("\nrecovery of 1 of 4 trainers (median of %d runs, seconds)" % n)
print("| phase | ringmaster, SIGKILL | goal | ringmaster, SIGSTOP | goal |")
print("|---|---|---|---|---|")
goals = {"detect": "<= 2", "resumed": "<= 5"}
stop_goals = {"resumed": "<= 10"}
for i, name in enumerate(names):
    print("| %s | %.2f | %s | %.2f | %s |" % (name, med([o[i] for o in ours]), goals.get(name, ""),
                                           med([o[i] for o in stops]), stop_goals.get(name, "")))
r = med([o[4] for o in ours])
t = med(theirs)
print("| torchrun resumed (same kill) | %.2f | |" % t)
print("\nratio torchrun / ringmaster (time to train again): %.1fx" % (t / r))
print("drain: %d steps lost (goal 0)" % lost)
EOF
