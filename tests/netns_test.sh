#!/usr/bin/env bash
# Three hosts in network namespaces, made here (ip netns, veth, a bridge in a fourth
# namespace standing for the switch), run the release bundle unpacked: h1 the coordinator,
# h2 and h3 one agent of one slot each. A 2-rank job trains; then h3's link is cut (the host
# is not killed: its processes keep running, unreachable). The job must detect the
# partition (h3's lease expires, the ring's collective times out), shrink to 1 rank and go
# on; when the link comes back, h3's agent registers again, the job grows back onto it and
# trains on 2 ranks again; then it is cancelled. (The job is long so that no machine is fast
# enough to finish it before the link comes back: how long training takes is not what this
# tests.) Skipped, saying why, where namespaces cannot be made (not root, no CAP_NET_ADMIN,
# no iproute2).
set -uo pipefail

BUNDLE="$TEST_SRCDIR/ringmaster/deploy/ringmaster-bundle.tar.gz"
WORK="${TEST_TMPDIR:-/tmp}/netns"
rm -rf "$WORK" && mkdir -p "$WORK"
tag="rm$$"
NS=("${tag}h1" "${tag}h2" "${tag}h3")
SW="${tag}sw"
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  for n in "${NS[@]}"; do
    ip netns pids "$n" 2>/dev/null | xargs -r kill -KILL 2>/dev/null
    ip netns del "$n" 2>/dev/null
  done
  ip netns del "$SW" 2>/dev/null
  true
}
trap cleanup EXIT

if ! command -v ip >/dev/null; then echo "SKIP: iproute2 (ip) is not installed"; exit 0; fi
if ! err="$(ip netns add "${tag}probe" 2>&1)"; then
  echo "SKIP: cannot create network namespaces here (root with CAP_NET_ADMIN needed): $err"
  exit 0
fi
ip netns del "${tag}probe"
if [ ! -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  echo "SKIP: Debian's dataset-fashion-mnist is not installed (tools/setup.sh installs it)"
  exit 0
fi

# The bundle, unpacked where nothing else of the build is.
tar xzf "$BUNDLE" -C "$WORK" || { echo "FAIL: cannot unpack $BUNDLE"; exit 1; }
B="$WORK/ringmaster"

# The network: h1, h2, h3 on 10.213.0.0/24 through a bridge in $SW.
ip netns add "$SW"
ip -n "$SW" link add br0 type bridge
ip -n "$SW" link set br0 up
for i in 1 2 3; do
  n="${NS[$((i - 1))]}"
  ip netns add "$n"
  ip link add "${tag}v$i" type veth peer name "${tag}p$i"
  ip link set "${tag}v$i" netns "$n"
  ip link set "${tag}p$i" netns "$SW"
  ip -n "$n" link set "${tag}v$i" name eth0
  ip -n "$n" addr add "10.213.0.$i/24" dev eth0
  ip -n "$n" link set eth0 up
  ip -n "$n" link set lo up
  ip -n "$SW" link set "${tag}p$i" master br0
  ip -n "$SW" link set "${tag}p$i" up
done

openssl rand -hex 16 >"$WORK/user.token" 2>/dev/null || echo "user-$$-$RANDOM-$RANDOM-$RANDOM" >"$WORK/user.token"
openssl rand -hex 16 >"$WORK/node.token" 2>/dev/null || echo "node-$$-$RANDOM-$RANDOM-$RANDOM" >"$WORK/node.token"
chmod 600 "$WORK/user.token" "$WORK/node.token"  # secrets: ringmaster refuses them readable by others
COORD=10.213.0.1:7070
on() { local host="$1"; shift; ip netns exec "${NS[$((host - 1))]}" "$@"; }

on 1 "$B/bin/ringmaster" --listen "$COORD" --db "$WORK/jobs.db" \
  --user_token_file "$WORK/user.token" --node_token_file "$WORK/node.token" \
  --heartbeat_s 0.2 --lease_s 1 --hang_timeout_s 10 --slot_backoff_s 1 --grow_after_s 2 \
  --join_timeout_s 20 >"$WORK/coordinator.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do grep -q "serving on" "$WORK/coordinator.log" && break; sleep 0.05; done
grep -q "serving on" "$WORK/coordinator.log" || fail "the coordinator did not start: $(tail -3 "$WORK/coordinator.log")"
for i in 2 3; do
  on "$i" "$B/bin/ringworker" --coordinator "$COORD" --node "h$i" --slots 1 \
    --advertise_host "10.213.0.$i" --node_token_file "$WORK/node.token" \
    --work_dir "$WORK/node-h$i" --trainer_flags=--op_timeout_s=4,--connect_timeout_s=10 \
    --drain_grace_s 30 >"$WORK/agent-h$i.log" 2>&1 &
  pids+=($!)
done

ctl() { on 1 "$B/bin/ringctl" "$@" --coordinator "$COORD" --token_file "$WORK/user.token"; }
# field, wait_until
source "$TEST_SRCDIR/ringmaster/tests/job_helpers.sh"

for _ in $(seq 1 100); do
  [ "$(grep -c "registered node" "$WORK"/agent-h*.log 2>/dev/null | awk -F: '{s+=$2} END {print s}')" -ge 2 ] && break
  sleep 0.1
done
ctl submit "$B/examples/fashion_mnist_mlp.yaml" --set name=part --set epochs=100 \
  --set checkpoint.dir="$WORK/ckpt" --set checkpoint.every_steps=10 \
  --set elastic.min_ranks=1 --set elastic.max_ranks=2 --set schedule.warmup_steps=20 \
  >"$WORK/ctl.log" 2>&1 || fail "submit: $(cat "$WORK/ctl.log")"
wait_until part 'j["phase"]=="JOB_PHASE_RUNNING" and len(j.get("members",[]))==2 and int(j.get("step",0))>=20' 90

# Cut h3's link (its processes keep running).
ip -n "$SW" link set "${tag}p3" down
cut_at=$SECONDS
wait_until part 'int(j["epoch"])>=2 and len(j.get("members",[]))==1 and j["members"][0]["slot"]["node"]=="h2"' 30
echo "partition: shrank to h2 in $((SECONDS - cut_at)) s"
wait_until part 'int(j.get("step",0))>0 and j["phase"]=="JOB_PHASE_RUNNING"' 30
grep -q "node h3 gone" "$WORK/coordinator.log" || fail "the coordinator did not declare h3 gone"

# The link comes back: h3's agent registers again and the job grows onto it.
registered_before="$(grep -c "registered node" "$WORK/agent-h3.log")"
ip -n "$SW" link set "${tag}p3" up
for _ in $(seq 1 150); do
  [ "$(grep -c "registered node" "$WORK/agent-h3.log")" -gt "$registered_before" ] && break
  sleep 0.1
done
[ "$(grep -c "registered node" "$WORK/agent-h3.log")" -gt "$registered_before" ] ||
  fail "h3's agent did not register again: $(tail -5 "$WORK/agent-h3.log")"
wait_until part 'len(j.get("members",[]))==2 and any(m["slot"]["node"]=="h3" for m in j["members"])' 60
# The grown ring trains: 20 more steps on 2 ranks.
grown_epoch="$(field part 'j["epoch"]')"
grown_step="$(field part 'int(j.get("step",0))')"
wait_until part "int(j['epoch'])==${grown_epoch:-0} and j['phase']=='JOB_PHASE_RUNNING' and len(j.get('members',[]))==2 and int(j.get('step',0))>=${grown_step:-0}+20" 60
causes="$(field part '",".join(r["cause"] for r in j.get("recoveries",[]))')"
ctl cancel part >>"$WORK/ctl.log" 2>&1 || fail "cancel: $(tail -3 "$WORK/ctl.log")"
wait_until part 'j["phase"]=="JOB_PHASE_CANCELLED"' 60
echo "recoveries: $causes"
case "$causes" in failure*grow*) ;; *) fail "expected a failure then a growth, got: $causes" ;; esac

if [ "$failures" -ne 0 ]; then
  echo "--- coordinator log (tail)"; tail -30 "$WORK/coordinator.log"
  for f in "$WORK"/agent-*.log; do echo "--- $f (tail)"; tail -15 "$f"; done
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "PASS: netns partition"
