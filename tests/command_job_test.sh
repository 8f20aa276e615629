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
set -uo pipefail

RINGCTL="$TEST_SRCDIR/ringmaster/cli/ringctl"
TRAIN="$TEST_SRCDIR/ringmaster/examples/torch_ddp/train.py"
WORK="${TEST_TMPDIR:-/tmp}/command_job_test"
rm -rf "$WORK" && mkdir -p "$WORK/tmp"
export TMPDIR="$WORK/tmp"
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
now() { date +%s.%N; }
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
fi

if [ "$failures" -gt 0 ]; then
  echo "$failures failure(s); outputs in $WORK" >&2
  exit 1
fi
echo "PASS"
