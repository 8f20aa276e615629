#!/usr/bin/env bash
# Real PyTorch against TorchStoreServer: torch_store_main hosts the store on a free loopback
# port; 4 /usr/bin/python3 processes with torchrun's agent-store environment
# (TORCHELASTIC_USE_AGENT_STORE=True, TORCHELASTIC_RESTART_COUNT=0) call
# init_process_group("gloo", init_method="env://"), which makes each a TCPStore client of
# MASTER_ADDR:MASTER_PORT under the prefix /worker/attempt_0; then an all_reduce (every rank
# must see 1+2+3+4 = 10) and a barrier. Skipped where /usr/bin/python3 cannot import torch.
# Every process runs under timeout; the EXIT trap ends the server and any rank left.
set -uo pipefail

if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  echo "SKIP: /usr/bin/python3 cannot import torch (apt-get install python3-torch)"
  exit 0
fi
SERVER="$TEST_SRCDIR/ringmaster/worker/torch_store_main"
WORK="${TEST_TMPDIR:-$(mktemp -d)}/torch_store_torch_test"
rm -rf "$WORK" && mkdir -p "$WORK"
WORLD=4
PIDS=()
SERVER_PID=""

fail() { echo "FAIL: $*"; for f in "$WORK"/*.log; do echo "--- $f"; cat "$f"; done; exit 1; }
cleanup() {
  exec 3>&- 2>/dev/null
  for pid in "${PIDS[@]}" $SERVER_PID; do kill -KILL "$pid" 2>/dev/null; done
  wait 2>/dev/null
}
trap cleanup EXIT

cat >"$WORK/rank.py" <<'PY'
import datetime, os, sys, time
import torch
import torch.distributed as dist

start = time.monotonic()
dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=60))
init_s = time.monotonic() - start
rank = dist.get_rank()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
dist.barrier()
print(f"rank {rank} world {dist.get_world_size()} sum {t.item():g} init_s {init_s:.3f}",
      flush=True)
dist.destroy_process_group()
PY

# The server: its stdin is a FIFO held open by fd 3; closing fd 3 stops it.
mkfifo "$WORK/stdin"
timeout -k 5 120 "$SERVER" <"$WORK/stdin" >"$WORK/server.out" 2>"$WORK/server.log" &
SERVER_PID=$!
exec 3>"$WORK/stdin"
PORT=""
for _ in $(seq 100); do
  PORT=$(awk '/^port /{print $2}' "$WORK/server.out")
  [ -n "$PORT" ] && break
  kill -0 "$SERVER_PID" 2>/dev/null || fail "torch_store_main exited before printing its port"
  sleep 0.1
done
[ -n "$PORT" ] || fail "torch_store_main printed no port within 10 s"
echo "store on 127.0.0.1:$PORT"

for rank in $(seq 0 $((WORLD - 1))); do
  env RANK=$rank LOCAL_RANK=$rank WORLD_SIZE=$WORLD LOCAL_WORLD_SIZE=$WORLD \
    MASTER_ADDR=127.0.0.1 MASTER_PORT="$PORT" \
    TORCHELASTIC_USE_AGENT_STORE=True TORCHELASTIC_RESTART_COUNT=0 \
    GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1 \
    timeout -k 5 90 /usr/bin/python3 "$WORK/rank.py" >"$WORK/rank$rank.log" 2>&1 &
  PIDS+=($!)
done
for i in "${!PIDS[@]}"; do
  wait "${PIDS[$i]}"
  rc=$?
  [ "$rc" = 0 ] || fail "rank $i exited with status $rc (124: timed out)"
done
PIDS=()

for rank in $(seq 0 $((WORLD - 1))); do
  line=$(grep "^rank $rank " "$WORK/rank$rank.log") || fail "rank $rank printed no result"
  echo "$line"
  grep -q " world $WORLD sum 10 " <<<"$line" || fail "rank $rank: want world $WORLD sum 10"
done
echo "init_process_group took (s, per rank): $(grep -ho 'init_s [0-9.]*' "$WORK"/rank*.log |
  awk '{print $2}' | sort -n | tr '\n' ' ')"

# Stop the server by closing its stdin; it lists the keys the ranks stored.
exec 3>&-
wait "$SERVER_PID"
rc=$?
SERVER_PID=""
[ "$rc" = 0 ] || fail "torch_store_main exited with status $rc"
cat "$WORK/server.out"
# (torch 1.13 writes them as "//worker/attempt_0/default_pg/..."; its TCPStore's own "init/"
# is outside the prefix.)
grep -q "^key /*worker/attempt_0/default_pg/" "$WORK/server.out" ||
  fail "no key under the agent store's prefix /worker/attempt_0"
if grep -q "closing the connection" "$WORK/server.log"; then
  fail "the store refused a request of torch's: $(grep 'closing the connection' "$WORK/server.log")"
fi
echo "PASS"
