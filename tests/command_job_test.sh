#!/usr/bin/env bash
# End to end, real processes on loopback: command jobs under `ringctl local`.
#   1. a program that cannot be run fails once, naming the node and the path;
#   2. an exit code in command.permanent_exit_codes fails the job at once, no restart;
#   3. after a rank's failure, a program that ignores SIGTERM is killed at stop_grace_s and the
#      re-formed group succeeds;
#   4. (with PyTorch) examples/torch_ddp/train.py, a DDP program written for torchrun,
#      trains on 2 ranks with parameters equal on every rank;
#   5. (with PyTorch) kill -9 of one rank: the whole group restarts, resumes from the
#      program's own checkpoint and ends with the parameters of the uninterrupted run;
#   6. (with PyTorch) a drain (SIGTERM to ringctl local) stops every rank's program with
#      SIGTERM, it saves, and the next run resumes at that step: nothing lost;
#   7. (with PyTorch) under a coordinator with two agents of 2 slots: ringctl submit --wait of
#      examples/torch_ddp.yaml trains 4 ranks on 2 nodes to equal parameters;
#   8. (with PyTorch's torchrun) the same program under torchrun ends with the same parameters
#      as under ringctl local.
#   9. (with PyTorch) under a coordinator, one elastic job (min_ranks 2, max_ranks 4): agent
#      b comes, the group re-forms on 4 ranks (resize); kill -9 of a rank's program, the whole
#      group restarts from the checkpoint (failure); agent b's SIGTERM (drain): every rank
#      stops at once, 0 steps lost, no budget spent; its name submitted again (resubmit):
#      epoch 1, restart 0, the same checkpoint directory.
#  10. (with PyTorch) the culprit, named: the rank that failed first (its @record error file's
#      time), though its report came last, in status and the final reason; the epochs' header
#      lines in ringctl logs --rank; submit --wait exits 1 for a failed job.
#  11. (with PyTorch) progress and hangs: a program that reports through python/ringmaster shows
#      its step and loss in ringctl status and top, /metrics and the metrics file; SIGSTOP of
#      one rank: the group trains again within 10 s.
#  12. stragglers and the dashboard's curves of a reporting program (no PyTorch needed).
set -uo pipefail

source "$TEST_SRCDIR/ringmaster/tests/job_helpers.sh"  # field, wait_until (they call ctl)
test_setup command_job_test
TRAIN="$TEST_SRCDIR/ringmaster/examples/torch_ddp/train.py"
elapsed() { echo "$(now) - $1" | bc; }

# 1. A missing program: permanent, named, at once.
start=$(now)
"$RINGCTL" local --workers 2 -- /nonexistent/prog --flag >"$WORK/missing.out" 2>&1
rc=$?
[ "$rc" = 1 ] || fail "missing program: exit status $rc, want 1"
grep -q "command.argv\[0\] /nonexistent/prog cannot be run on node local (slot [01]): No such file or directory" \
  "$WORK/missing.out" || fail "missing program: the failure does not name node and path"
grep -q "no restart can fix" "$WORK/missing.out" || fail "missing program: not permanent"
(( $(echo "$(elapsed "$start") < 20" | bc) )) || fail "missing program: took $(elapsed "$start") s"

# 2. A permanent exit code: one epoch, failed.
"$RINGCTL" local --workers 2 --run_dir "$WORK/permanent" --set 'command.permanent_exit_codes=[3]' \
  -- /bin/sh -c 'exit 3' >"$WORK/permanent.out" 2>&1
rc=$?
[ "$rc" = 1 ] || fail "permanent exit code: exit status $rc, want 1"
grep -q "exit code 3 (in command.permanent_exit_codes: no restart)" "$WORK/permanent.out" ||
  fail "permanent exit code: the reason does not say so"
if grep -q "membership epoch 2" "$WORK"/permanent/node/sh/slot-*.log; then
  fail "permanent exit code: the job was restarted"
fi

# 3. Rank 1 fails in epoch 1; rank 0 ignores SIGTERM and is killed after stop_grace_s (2 s);
#    epoch 2 succeeds (long before rank 0's 60 s sleep would end).
start=$(now)
"$RINGCTL" local --workers 2 --run_dir "$WORK/grace" --set command.stop_grace_s=2 -- /bin/sh -c \
  'if [ "$RINGMASTER_EPOCH" = 1 ]; then
     if [ "$RANK" = 1 ]; then sleep 1; exit 1; fi
     trap "" TERM; sleep 60
   fi
   echo "epoch $RINGMASTER_EPOCH rank $RANK of $WORLD_SIZE done"' >"$WORK/grace.out" 2>&1
rc=$?
took=$(elapsed "$start")
[ "$rc" = 0 ] || fail "stop grace: exit status $rc, want 0 (see $WORK/grace.out)"
grep -q "did not exit within 2s of SIGTERM: SIGKILL" "$WORK"/grace/node/sh/slot-*.log ||
  fail "stop grace: no SIGKILL after stop_grace_s in the trainers' logs"
grep -q "(1 recovery)" "$WORK/grace.out" || fail "stop grace: not one recovery"
(( $(echo "$took < 40" | bc) )) || fail "stop grace: took $took s (the program's sleep is 60 s)"

# 4 and 5 need PyTorch.
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  echo "SKIP: parts 4 and 5: /usr/bin/python3 cannot import torch (apt-get install python3-torch)"
else
  ARGS=(--steps 100 --step_time 0.03 --save_every 20)
  checksums() { grep -ho "params checksum [-0-9.]*" "$1"/node/train/slot-*.log | sort -u; }

  # 4. Plain DDP, 2 ranks.
  "$RINGCTL" local --workers 2 --run_dir "$WORK/ddp" -- /usr/bin/python3 "$TRAIN" "${ARGS[@]}" \
    >"$WORK/ddp.out" 2>&1
  rc=$?
  [ "$rc" = 0 ] || fail "ddp: exit status $rc (see $WORK/ddp.out)"
  [ "$(grep -ho "done at step 100, params checksum" "$WORK"/ddp/node/train/slot-*.log | wc -l)" = 2 ] ||
    fail "ddp: not both ranks finished step 100"
  [ "$(checksums "$WORK/ddp" | wc -l)" = 1 ] || fail "ddp: checksums differ: $(checksums "$WORK/ddp")"

  # 5. kill -9 of rank 1's program once it passed step 30.
  "$RINGCTL" local --workers 2 --run_dir "$WORK/kill" -- /usr/bin/python3 "$TRAIN" "${ARGS[@]}" \
    >"$WORK/kill.out" 2>&1 &
  pid=$!
  killed=""
  deadline=$((SECONDS + 240))  # generous: torch imports slowly on a loaded machine
  while [ "$SECONDS" -lt "$deadline" ] && kill -0 "$pid" 2>/dev/null; do
    if grep -qs "rank 1: step [3-9]0 " "$WORK"/kill/node/train/slot-*.log; then
      for p in $(pgrep -f "$TRAIN"); do
        if tr '\0' '\n' </proc/"$p"/environ 2>/dev/null | grep -qx RANK=1; then
          kill -9 "$p" && killed="$p"
        fi
      done
      break
    fi
    sleep 0.1
  done
  wait "$pid"
  rc=$?
  [ -n "$killed" ] || fail "kill: rank 1's program was not found to kill (pgrep: $(pgrep -af \
    "$TRAIN" | head -3); logs: $(tail -2 "$WORK"/kill/node/train/slot-*.log))"
  [ "$rc" = 0 ] || fail "kill: exit status $rc (see $WORK/kill.out)"
  grep -q "(1 recovery)" "$WORK/kill.out" || fail "kill: not one recovery"
  [ "$(grep -l "resumed from step [1-9]" "$WORK"/kill/node/train/slot-*.log | wc -l)" = 2 ] ||
    fail "kill: not every rank resumed from the program's checkpoint"
  grep -q "restart 1)" "$WORK"/kill/node/train/slot-0.log ||
    fail "kill: TORCHELASTIC_RESTART_COUNT was not 1 in the second epoch"
  [ "$(checksums "$WORK/kill" | wc -l)" = 1 ] || fail "kill: checksums differ: $(checksums "$WORK/kill")"
  [ "$(checksums "$WORK/kill")" = "$(checksums "$WORK/ddp")" ] ||
    fail "kill: parameters $(checksums "$WORK/kill") differ from the uninterrupted run's $(checksums "$WORK/ddp")"

  # 6. A drain (SIGTERM to ringctl local: its agent drains) stops every rank's program with
  #    SIGTERM; the program saves at the step they agree on, and a new run resumes there: no
  #    step lost.
  "$RINGCTL" local --workers 2 --run_dir "$WORK/drain" --set checkpoint.dir="$WORK/ck" \
    -- /usr/bin/python3 "$TRAIN" "${ARGS[@]}" >"$WORK/drain.out" 2>&1 &
  pid=$!
  deadline=$((SECONDS + 240))
  while [ "$SECONDS" -lt "$deadline" ] && kill -0 "$pid" 2>/dev/null; do
    grep -qs "rank 0: step [3-9]0 " "$WORK"/drain/node/train/slot-0.log && break
    sleep 0.1
  done
  kill -TERM "$pid"
  wait "$pid"
  rc=$?
  [ "$rc" = 130 ] || fail "drain: exit status $rc, want 130 (cancelled; see $WORK/drain.out)"
  stopped=$(grep -ho "stopped at step [0-9]*" "$WORK"/drain/node/train/slot-*.log | sort -u)
  [ "$(grep -c . <<<"$stopped")" = 1 ] && [ -n "$stopped" ] ||
    fail "drain: the ranks did not stop at one step: '$stopped'"
  step=${stopped##* }
  "$RINGCTL" local --workers 2 --run_dir "$WORK/resume" --set checkpoint.dir="$WORK/ck" \
    -- /usr/bin/python3 "$TRAIN" "${ARGS[@]}" >"$WORK/resume.out" 2>&1 ||
    fail "drain: the resumed run failed (see $WORK/resume.out)"
  grep -q "rank 0: resumed from step $step " "$WORK"/resume/node/train/slot-0.log ||
    fail "drain: the new run did not resume from step $step"
  [ "$(checksums "$WORK/resume")" = "$(checksums "$WORK/ddp")" ] ||
    fail "drain: parameters $(checksums "$WORK/resume") differ from the uninterrupted run's"

  # 8. The same program runs unchanged under torchrun, to the same parameters (Debian's
  #    torchrun 1.13 on Python 3.11 needs --redirects 2 --tee 2).
  if [ -x /usr/bin/torchrun ]; then
    (cd "$WORK" && timeout 300 /usr/bin/torchrun --standalone --nproc_per_node 2 --redirects 2 \
      --tee 2 "$TRAIN" "${ARGS[@]}" --ckpt "$WORK/torchrun-ck" >"$WORK/torchrun.out" 2>&1) ||
      fail "torchrun: exited $? (see $WORK/torchrun.out)"
    trsums=$(grep -o "params checksum [-0-9.]*" "$WORK/torchrun.out" | sort | uniq -c)
    [ "$(awk '{print $1}' <<<"$trsums")" = 2 ] &&
      [ "$(awk '{print $2, $3, $4}' <<<"$trsums")" = "$(checksums "$WORK/ddp")" ] ||
      fail "torchrun: checksums '$trsums' are not ringmaster's $(checksums "$WORK/ddp")"
  else
    echo "SKIP: part 8: no /usr/bin/torchrun"
  fi

  # 7. Under a coordinator with two agents of 2 slots each: ringctl submit --wait, 4 ranks on
  #    2 nodes, equal parameters.
  BIN="$TEST_SRCDIR/ringmaster"
  "$BIN/coordinator/ringmaster" --listen=127.0.0.1:0 --db="$WORK/cluster.db" --heartbeat_s=0.5 \
    --lease_s=3 >"$WORK/ringmaster.out" 2>"$WORK/ringmaster.err" &
  pids=($!)
  trap 'kill "${pids[@]}" 2>/dev/null' EXIT
  port=""
  for _ in $(seq 1 100); do
    port=$(grep -o "(port [0-9]*)" "$WORK/ringmaster.out" 2>/dev/null | grep -o "[0-9]*")
    [ -n "$port" ] && break
    sleep 0.1
  done
  for node in a b; do
    "$BIN/worker/ringworker" --coordinator="127.0.0.1:$port" --node="$node" --slots=2 \
      --work_dir="$WORK/cluster/$node" --trainer="$BIN/worker/ringtrainer" \
      >"$WORK/ringworker-$node.log" 2>&1 &
    pids+=($!)
  done
  "$RINGCTL" submit "$BIN/examples/torch_ddp.yaml" --coordinator "127.0.0.1:$port" \
    --set command.workdir="$BIN" --set 'command.argv[3]=40' --set elastic.min_ranks=4 \
    --set checkpoint.dir="$WORK/cluster-ck" --wait >"$WORK/submit.out" 2>&1
  rc=$?
  [ "$rc" = 0 ] || fail "cluster: ringctl submit --wait exited $rc: $(tail -3 "$WORK/submit.out")"
  logs=("$WORK"/cluster/*/torch_ddp/slot-*.log)
  [ "$(grep -l "of 4: training" "${logs[@]}" | wc -l)" = 4 ] || fail "cluster: not 4 ranks of 4"
  sums=$(grep -ho "done at step 40, params checksum [-0-9.]*" "${logs[@]}" | sort | uniq -c)
  [ "$(awk '{print $1}' <<<"$sums")" = 4 ] || fail "cluster: checksums of 4 ranks differ: $sums"
  kill "${pids[@]}" 2>/dev/null
  wait "${pids[@]}" 2>/dev/null
  trap - EXIT

  # 9. Under a coordinator, one job through every lifecycle event, each epoch's environment
  #    seen by the program (a shell prints it, then execs train.py): min_ranks 2, max_ranks
  #    4, on agent a's 2 slots; agent b comes: the group re-forms on 4 ranks (resize, no
  #    budget spent); kill -9 of one rank's program: the whole group restarts from the
  #    program's checkpoint (failure, restart 1); agent b gets SIGTERM (a drain): every rank's
  #    program gets SIGTERM within a second of the others, they save at one step and the 2
  #    ranks left resume there (drain, still restart 1: no budget spent, no step lost); the
  #    job ends with equal parameters. Then its name again (ringctl submit -- PROGRAM ARGS),
  #    more steps: epoch 1, restart 0, reason resubmit, the same checkpoint directory,
  #    resumed where it ended.
  "$BIN/coordinator/ringmaster" --listen=127.0.0.1:0 --db="$WORK/elastic.db" --heartbeat_s=0.5 \
    --lease_s=3 --grow_after_s=1 >"$WORK/elastic-ringmaster.out" 2>"$WORK/elastic-ringmaster.err" &
  epids=($!)
  trap 'kill "${epids[@]}" 2>/dev/null' EXIT
  port=""
  for _ in $(seq 1 100); do
    port=$(grep -o "(port [0-9]*)" "$WORK/elastic-ringmaster.out" 2>/dev/null | grep -o "[0-9]*")
    [ -n "$port" ] && break
    sleep 0.1
  done
  ctl() { "$RINGCTL" "$@" --coordinator "127.0.0.1:$port"; }
  agent() {  # agent NODE: 2 slots
    "$BIN/worker/ringworker" --coordinator="127.0.0.1:$port" --node="$1" --slots=2 \
      --work_dir="$WORK/elastic/$1" --trainer="$BIN/worker/ringtrainer" \
      >>"$WORK/elastic-ringworker-$1.log" 2>&1 &
    epids+=($!)
  }
  # The program: a shell prints the environment, then execs train.py ($0) with its arguments.
  show_env='echo "env: epoch=$RINGMASTER_EPOCH reason=$RINGMASTER_RESTART_REASON restart=$TORCHELASTIC_RESTART_COUNT rank=$RANK of $WORLD_SIZE ckpt=$RINGMASTER_CHECKPOINT_DIR"; exec /usr/bin/python3 "$0" "$@"'
  elastic_spec() {  # elastic_spec STEPS
    cat >"$WORK/elastic.yaml" <<SPEC
name: elastic
command:
  argv:
    - /bin/sh
    - -c
    - '$show_env'
    - $TRAIN
    - --steps
    - "$1"
    - --step_time
    - "0.03"
    - --save_every
    - "10"
  env: {PYTHONUNBUFFERED: "1"}
elastic: {min_ranks: 2, max_ranks: 4, restart_budget: 3}
checkpoint: {dir: $WORK/elastic-ck}
SPEC
  }
  # since EPOCH: each slot's log from its program's start in that epoch (its env line) on.
  since() {
    for f in "$WORK"/elastic/*/elastic/slot-*.log; do
      awk -v e="env: epoch=$1 " 'index($0, e) == 1 {on = 1} on' "$f" 2>/dev/null
    done
  }
  # await WHAT EPOCH EXTENDED_REGEX: until a line of `since EPOCH` matches (not once the job
  # has ended).
  await() {
    local deadline=$((SECONDS + 240))  # generous: torch imports slowly on a loaded machine
    while [ "$SECONDS" -lt "$deadline" ]; do
      since "$2" | grep -E "$3" >/dev/null && return 0  # not -q: pipefail, SIGPIPE
      case "$(field elastic 'j["phase"]')" in
        JOB_PHASE_SUCCEEDED | JOB_PHASE_FAILED | JOB_PHASE_CANCELLED) break ;;
      esac
      sleep 0.2
    done
    since "$2" | grep -E "$3" >/dev/null && return 0  # not -q: pipefail, SIGPIPE
    fail "elastic: $1: no line /$3/ since epoch $2; last: $(since 1 | tail -3)"
    return 1
  }
  envs() { since "$1" | grep "^env: epoch=$1 " | sort -u; }
  restarts() { field elastic 'j.get("restarts", 0)'; }
  elastic_spec 300
  agent a
  ctl submit "$WORK/elastic.yaml" >"$WORK/elastic-submit.out" 2>&1 ||
    fail "elastic: submit: $(cat "$WORK/elastic-submit.out")"
  if await "2 ranks train" 1 "rank 0: step 20 "; then
    agent b  # capacity comes
    await "4 ranks train" 2 "rank 3: step [0-9]*0 "
    [ "$(envs 2 | grep -c "reason=resize restart=0 rank=[0-3] of 4 ckpt=$WORK/elastic-ck/elastic$")" = 4 ] ||
      fail "elastic: resize: not 4 ranks with reason resize, restart 0: $(envs 2)"
    [ "$(restarts)" = 0 ] || fail "elastic: the resize spent restart budget ($(restarts))"
    # kill -9 of rank 3's program (on node b).
    for p in $(pgrep -f "$TRAIN"); do
      if tr '\0' '\n' </proc/"$p"/environ 2>/dev/null | grep -qx RANK=3; then kill -9 "$p"; fi
    done
    await "4 ranks train again" 3 "rank 3: step [0-9]*0 "
    [ "$(envs 3 | grep -c "reason=failure restart=1 rank=[0-3] of 4")" = 4 ] ||
      fail "elastic: kill -9: not 4 ranks with reason failure, restart 1: $(envs 3)"
    [ "$(since 3 | grep -c "^rank [0-3]: resumed from step [1-9]")" = 4 ] ||
      fail "elastic: kill -9: not every rank resumed from the program's checkpoint"
    kill -TERM "${epids[2]}"  # agent b: a drain
    await "2 ranks train after the drain" 4 "rank 1: step [0-9]*0 "
    wait_until elastic 'j["phase"] == "JOB_PHASE_SUCCEEDED"' 240
    [ "$(envs 4 | grep -c "reason=drain restart=1 rank=[01] of 2")" = 2 ] ||
      fail "elastic: drain: not 2 ranks with reason drain, restart 1: $(envs 4)"
    [ "$(restarts)" = 1 ] || fail "elastic: the drain spent restart budget ($(restarts))"
    stopped=$(since 3 | grep -o "^rank [0-3]: stopped at step [0-9]*" | sort -u)
    step=$(grep -o "[0-9]*$" <<<"$stopped" | sort -u)
    [ "$(grep -c . <<<"$stopped")" = 4 ] && [ "$(grep -c . <<<"$step")" = 1 ] ||
      fail "elastic: drain: the 4 ranks did not stop at one step: $stopped"
    [ "$(since 4 | grep -c "^rank [01]: resumed from step $step ")" = 2 ] ||
      fail "elastic: drain: the 2 ranks left did not resume at step $step (steps lost)"
    # The drain's SIGTERMs (the runners' glog lines, time of day) within a second.
    times=$(grep -h "formed epoch 4: stopping the program\|SIGTERM: stopping the program" \
      "$WORK"/elastic/*/elastic/slot-*.log | awk '{print $2}' | sort)
    spread=$(awk -F: 'NR == 1 {a = $1 * 3600 + $2 * 60 + $3} {b = $1 * 3600 + $2 * 60 + $3}
      END {print b - a}' <<<"$times")
    [ "$(grep -c . <<<"$times")" = 4 ] && (( $(echo "$spread < 1" | bc) )) ||
      fail "elastic: drain: not 4 programs stopped within a second: '$times'"
    echo "elastic: the drain's SIGTERMs spread over ${spread} s"
    sums=$(since 4 | grep -o "done at step 300, params checksum [-0-9.]*" | sort | uniq -c)
    [ "$(awk '{print $1}' <<<"$sums")" = 2 ] || fail "elastic: checksums of 2 ranks differ: $sums"
    # Its name again, 40 steps more, as `ringctl submit [--set ...] -- PROGRAM ARGS...`.
    "$RINGCTL" submit --coordinator "127.0.0.1:$port" --set name=elastic --set elastic.min_ranks=2 \
      --set checkpoint.dir="$WORK/elastic-ck" --wait -- /bin/sh -c "$show_env" "$TRAIN" \
      --steps 340 --step_time 0.03 --save_every 10 >"$WORK/elastic-resubmit.out" 2>&1 ||
      fail "elastic: resubmit: $(tail -3 "$WORK/elastic-resubmit.out")"
    [ "$(envs 1 | grep -c "reason=resubmit restart=0 rank=[01] of 2 ckpt=$WORK/elastic-ck/elastic$")" = 2 ] ||
      fail "elastic: resubmit: not epoch 1, reason resubmit, restart 0, the same directory: $(envs 1)"
    [ "$(grep -h "^rank [01]: resumed from step 300 " "$WORK"/elastic/*/elastic/slot-*.log | wc -l)" = 2 ] ||
      fail "elastic: resubmit: not resumed from step 300"
  fi
  kill "${epids[@]}" 2>/dev/null
  wait "${epids[@]}" 2>/dev/null
  trap - EXIT
  # 10. The culprit, named: 4 ranks of tests/first_failure.py under a coordinator with one
  #     agent of 4 slots, restart budget 1. Epoch 1: rank 2 raises under @record but is slow
  #     to exit; the others fail in Gloo a second later and their reports reach the coordinator
  #     first. Still, status names rank 2 as the first failure (node, slot, its error file's
  #     message, its last output line). Epoch 2: rank 1 raises and exits at once; the budget is
  #     spent: ringctl submit --wait exits 1 and the job's final reason names rank 1 of epoch 2.
  #     ringctl logs --rank 2 shows each epoch's header line; an unknown rank is refused,
  #     saying which there are.
  FF="$TEST_SRCDIR/ringmaster/tests/first_failure.py"
  "$BIN/coordinator/ringmaster" --listen=127.0.0.1:0 --db="$WORK/ff.db" --heartbeat_s=0.5 \
    --lease_s=3 >"$WORK/ff-ringmaster.out" 2>"$WORK/ff-ringmaster.err" &
  fpids=($!)
  trap 'kill "${fpids[@]}" 2>/dev/null' EXIT
  port=""
  for _ in $(seq 1 100); do
    port=$(grep -o "(port [0-9]*)" "$WORK/ff-ringmaster.out" 2>/dev/null | grep -o "[0-9]*")
    [ -n "$port" ] && break
    sleep 0.1
  done
  "$BIN/worker/ringworker" --coordinator="127.0.0.1:$port" --node=a --slots=4 \
    --work_dir="$WORK/ff" --trainer="$BIN/worker/ringtrainer" >"$WORK/ff-ringworker.log" 2>&1 &
  fpids+=($!)
  "$RINGCTL" submit --coordinator "127.0.0.1:$port" --set name=ff --set elastic.min_ranks=4 \
    --set elastic.max_ranks=4 --set elastic.restart_budget=1 --wait -- /usr/bin/python3 "$FF" \
    --culprit 2 --then_culprit 1 --linger_s 1 --go_file "$WORK/ff-go" >"$WORK/ff-submit.out" 2>&1 &
  submit=$!
  wait_until ff 'j.get("first_failure", {}).get("rank") == 2 and str(j["first_failure"]["epoch"]) == "1"' 240
  ctl status ff >"$WORK/ff-status-1.out" 2>&1
  for want in "first failure: rank 2 (node a, slot 2) in membership epoch 1: /usr/bin/python3: " \
    "error file: ValueError: rank 2 found a bad batch at step 3" \
    "last output line: rank 2: closing the process group"; do
    grep -qF "$want" "$WORK/ff-status-1.out" ||
      fail "culprit: status does not say '$want': $(cat "$WORK/ff-status-1.out")"
  done
  # The others' reports did come first (their failures re-formed the job).
  grep -q "epoch 1: the stopped program had failed: ValueError: rank 2" "$WORK"/ff/ff/slot-2.log ||
    fail "culprit: rank 2's failure was not the last reported (see $WORK/ff/ff/slot-2.log)"
  touch "$WORK/ff-go"
  wait "$submit"
  rc=$?
  [ "$rc" = 1 ] || fail "culprit: ringctl submit --wait exited $rc, want 1: $(tail -3 "$WORK/ff-submit.out")"
  ctl status ff >"$WORK/ff-status-2.out" 2>&1
  grep -qF "reason: restart budget of 1 exhausted; last failure: rank 1 (node a, slot 1) failed first in membership epoch 2: /usr/bin/python3: exit code 1; its error file says: ValueError: rank 1 found a bad batch at step 3" \
    "$WORK/ff-status-2.out" || fail "culprit: the final reason does not name rank 1: $(cat "$WORK/ff-status-2.out")"
  grep -qF "first failure: rank 1 (node a, slot 1) in membership epoch 2" "$WORK/ff-status-2.out" ||
    fail "culprit: the first failure is not epoch 2's rank 1: $(cat "$WORK/ff-status-2.out")"
  timeout 60 "$RINGCTL" logs ff --rank 2 -f --coordinator "127.0.0.1:$port" >"$WORK/ff-logs.out" 2>&1 ||
    fail "culprit: ringctl logs ff --rank 2 -f: $(tail -3 "$WORK/ff-logs.out")"
  for e in "1: rank 2 of 4 on a slot 2 (restart 0, reason start)" \
    "2: rank 2 of 4 on a slot 2 (restart 1, reason failure)"; do
    grep -qxF "==== ringmaster: job ff membership epoch $e ====" "$WORK/ff-logs.out" ||
      fail "culprit: ringctl logs --rank 2 has no header '... epoch $e ...'"
  done
  grep -qx "rank 2: closing the process group" "$WORK/ff-logs.out" ||
    fail "culprit: ringctl logs --rank 2 lacks the program's output"
  ctl logs ff --rank 7 >"$WORK/ff-logs-7.out" 2>&1 && fail "culprit: ringctl logs --rank 7 succeeded"
  grep -q "has no rank 7: its ranks are 0 to 3" "$WORK/ff-logs-7.out" ||
    fail "culprit: ringctl logs --rank 7 does not say which ranks there are: $(cat "$WORK/ff-logs-7.out")"
  kill "${fpids[@]}" 2>/dev/null
  wait "${fpids[@]}" 2>/dev/null
  trap - EXIT
fi

# 11. (with PyTorch) progress and hangs through the ringmaster module (python/ringmaster, on
#     the program's PYTHONPATH): train.py reports every step; ringctl status and top, /metrics
#     and the metrics file show its step and loss; SIGSTOP of rank 1's program: its runner
#     stops the keep-alives, the coordinator finds it hung, and the group trains again within
#     10 s (the time is printed); then SIGTERM to ringctl local ends the run.
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  H="$WORK/hang"
  "$RINGCTL" local --workers 2 --run_dir "$H" --metrics_listen 127.0.0.1:0 \
    --set checkpoint.dir="$WORK/hang-ck" --set metrics.jsonl="$WORK/hang.metrics.jsonl" \
    -- /usr/bin/python3 "$TRAIN" --steps 5000 --step_time 0.03 --save_every 20 \
    >"$WORK/hang.out" 2>&1 &
  pid=$!
  deadline=$((SECONDS + 240))
  while [ "$SECONDS" -lt "$deadline" ] && kill -0 "$pid" 2>/dev/null; do
    grep -qs "rank 1: step [3-9]0 " "$H"/node/train/slot-1.log && break
    sleep 0.1
  done
  coord=$(grep -o "coordinator at [0-9.:]*" "$WORK/hang.out" | awk '{print $3}')
  metrics_url=$(grep -o "metrics at http[^ ]*" "$WORK/hang.out" | awk '{print $3}')
  "$RINGCTL" status train --coordinator "$coord" >"$WORK/hang-status.out" 2>&1
  grep -Eq "step [1-9][0-9]*, loss [0-9]" "$WORK/hang-status.out" ||
    fail "progress: ringctl status shows no step and loss: $(head -5 "$WORK/hang-status.out")"
  timeout 2 "$RINGCTL" top train --coordinator "$coord" >"$WORK/hang-top.out" 2>&1
  grep -Eq "^  1 +local/1 +[1-9][0-9]* +[0-9.]+ms +[0-9]+% +[0-9]" "$WORK/hang-top.out" ||
    fail "progress: ringctl top shows no step, step time and loss of rank 1: $(head -4 "$WORK/hang-top.out")"
  /usr/bin/python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())' \
    "$metrics_url" >"$WORK/hang-metrics.out" 2>&1
  grep -Eq '^ringmaster_job_step\{job="train"\} [1-9]' "$WORK/hang-metrics.out" &&
    grep -Eq '^ringmaster_job_loss\{job="train"\} [0-9]' "$WORK/hang-metrics.out" ||
    fail "progress: /metrics has no step and loss of the job ($metrics_url)"
  records=$(grep -c '"samples_per_second":[0-9]' "$WORK/hang.metrics.jsonl" 2>/dev/null)
  [ "${records:-0}" -ge 2 ] && grep -q '"job":"train".*"loss":[0-9]' "$WORK/hang.metrics.jsonl" ||
    fail "progress: the metrics file has ${records:-no} records with samples/s"
  frozen=""  # rank 1's program of this run (its error file is in the run directory)
  for p in $(pgrep -f "$TRAIN"); do
    env_of=$(tr '\0' '\n' </proc/"$p"/environ 2>/dev/null)
    grep -qx RANK=1 <<<"$env_of" && grep -q "^TORCHELASTIC_ERROR_FILE=$H/" <<<"$env_of" &&
      frozen="$p"
  done
  runs=$(cat "$H"/node/train/slot-*.log | grep -c "the first of this run")
  start=$(now)
  [ -n "$frozen" ] && kill -STOP "$frozen"
  took=""
  while [ -n "$frozen" ] && (( $(echo "$(elapsed "$start") < 60" | bc) )); do
    if [ "$(cat "$H"/node/train/slot-*.log | grep -c "the first of this run")" -gt "$runs" ]; then
      took=$(elapsed "$start")
      break
    fi
    sleep 0.05
  done
  kill -TERM "$pid"
  wait "$pid"
  rc=$?
  echo "progress and hangs: SIGSTOP of rank 1's program -> the group trained again after ${took:-(never)} s"
  [ -n "$frozen" ] || fail "hang: rank 1's program was not found to stop"
  [ -n "$took" ] && (( $(echo "$took <= 10" | bc) )) ||
    fail "hang: the group trained again after ${took:-more than 60} s, not within 10 s"
  grep -q "no keep-alive for it" "$H"/node/train/slot-1.log ||
    fail "hang: rank 1's runner did not stop its keep-alives"
  [ "$rc" = 130 ] || fail "hang: exit status $rc, want 130 (cancelled; see $WORK/hang.out)"
fi

# 12. Stragglers and the dashboard's curves of a program that reports (python/ringmaster; no
#     PyTorch needed): 3 ranks of a program whose rank 2 takes 4x as long a step; ringctl
#     status flags rank 2 a straggler, and the job's dashboard page draws rank 0's reports.
cat >"$WORK/straggler.py" <<'PROGRAM'
import time, ringmaster
step_time = 0.12 if ringmaster.rank() == 2 else 0.03
step = 0
while not ringmaster.stop_requested():
    time.sleep(step_time)
    step += 1
    ringmaster.report(step, loss=1.0 / step, samples=8)
PROGRAM
"$RINGCTL" local --workers 3 --run_dir "$WORK/straggler" --metrics_listen 127.0.0.1:0 \
  -- /usr/bin/python3 "$WORK/straggler.py" >"$WORK/straggler.out" 2>&1 &
pid=$!
flagged=""
deadline=$((SECONDS + 60))
while [ "$SECONDS" -lt "$deadline" ] && kill -0 "$pid" 2>/dev/null; do
  coord=$(grep -o "coordinator at [0-9.:]*" "$WORK/straggler.out" | awk '{print $3}')
  if [ -n "$coord" ] && "$RINGCTL" status straggler --coordinator "$coord" \
      >"$WORK/straggler-status.out" 2>&1 &&
      grep -q "straggler: local/2 (rank 2, compute [3-5]\.[0-9]x the median)" "$WORK/straggler-status.out"; then
    flagged=1
    break
  fi
  sleep 0.5
done
[ -n "$flagged" ] ||
  fail "stragglers: rank 2 of a reporting program was not flagged: $(cat "$WORK/straggler-status.out")"
dashboard=$(grep -o "dashboard at http[^ ]*" "$WORK/straggler.out" | awk '{print $3}')
/usr/bin/python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())' \
  "$dashboard" >"$WORK/straggler-dashboard.html" 2>&1
grep -q "<svg" "$WORK/straggler-dashboard.html" &&
  grep -Eq "Rank 0's reports: [1-9][0-9]* kept" "$WORK/straggler-dashboard.html" ||
  fail "stragglers: the dashboard ($dashboard) draws no curves of the program's reports"
kill -TERM "$pid"
wait "$pid"
rc=$?
[ "$rc" = 130 ] || fail "stragglers: exit status $rc, want 130 (cancelled; see $WORK/straggler.out)"

if [ "$failures" -gt 0 ]; then
  echo "$failures failure(s); outputs in $WORK" >&2
  exit 1
fi
echo "PASS"
