#!/usr/bin/env bash
# Runs one peer benchmark with N ranks on this machine and prints rank 0's CSV on stdout
# (op,ranks,bytes,time_us,algbw_gbps,busbw_gbps,impl); diagnostics go to stderr.
#
# Usage: run_peer gloo|mpi|mpi_shm --ranks N [--timeout_s S] -- [gloo_bench or mpi_bench flags]
#   e.g. bazel-bin/bench/peers/run_peer gloo --ranks 4 -- --sizes 1K,64M --ops all_reduce
#
#   gloo   starts N gloo_bench processes in the background, meeting in a fresh temporary
#          FileStore directory; rank 0's stdout is the output, the other ranks' stdout is
#          shown (on stderr) only when they fail.
#   mpi    runs mpi_bench under mpirun over TCP loopback (see mpi_bench.cc for the flags).
#   mpi_shm  the same over OpenMPI's shared-memory transport (btl vader,self): the peer
#          for ringmaster's shared-memory rings between local ranks.
#
# Exits non-zero when any rank fails, or 124 when the whole run takes longer than
# --timeout_s (default 900); the remaining ranks are then killed.
set -uo pipefail

usage() {
  echo "usage: $(basename "$0") gloo|mpi|mpi_shm --ranks N [--timeout_s S] -- [benchmark flags]" >&2
  exit 2
}

[ $# -ge 1 ] || usage
peer="$1"
shift
case "$peer" in
  gloo | mpi | mpi_shm) ;;
  *)
    echo "run_peer: unknown peer \"$peer\"; use gloo, mpi or mpi_shm" >&2
    usage
    ;;
esac

ranks=""
timeout_s=900
while [ $# -gt 0 ]; do
  case "$1" in
    --ranks) ranks="${2:-}"; shift 2 || usage ;;
    --ranks=*) ranks="${1#--ranks=}"; shift ;;
    --timeout_s) timeout_s="${2:-}"; shift 2 || usage ;;
    --timeout_s=*) timeout_s="${1#--timeout_s=}"; shift ;;
    --) shift; break ;;
    *) echo "run_peer: unknown option \"$1\" (benchmark flags go after --)" >&2; usage ;;
  esac
done
if ! [[ "$ranks" =~ ^[1-9][0-9]*$ ]]; then
  echo "run_peer: --ranks: \"$ranks\" is not a positive number of ranks" >&2
  exit 2
fi
if ! [[ "$timeout_s" =~ ^[1-9][0-9]*$ ]]; then
  echo "run_peer: --timeout_s: \"$timeout_s\" is not a positive number of seconds" >&2
  exit 2
fi

# Finds a benchmark binary: in this sh_binary's runfiles, next to it (bazel-bin), or in
# bazel-bin when this script is run from the source tree.
find_binary() {
  local name="$1" self_dir
  self_dir="$(cd "$(dirname "$0")" && pwd)"
  local candidates=(
    "${RUNFILES_DIR:-/nonexistent}/ringmaster/bench/peers/$name"
    "$0.runfiles/ringmaster/bench/peers/$name"
    "$self_dir/$name"
    "$self_dir/../../bazel-bin/bench/peers/$name"
  )
  local c
  for c in "${candidates[@]}"; do
    if [ -x "$c" ] && [ -f "$c" ]; then
      echo "$c"
      return 0
    fi
  done
  echo "run_peer: cannot find $name; build it first: bazel build //bench/peers/..." >&2
  return 1
}

if [ "$peer" = mpi ] || [ "$peer" = mpi_shm ]; then
  binary="$(find_binary mpi_bench)" || exit 1
  if ! command -v mpirun >/dev/null 2>&1; then
    echo "run_peer: mpirun not found; install Debian's openmpi-bin (tools/setup.sh)" >&2
    exit 1
  fi
  # --oversubscribe: more ranks than cores; --bind-to none: no pinning, as the other
  # peers; pml ob1 + btl tcp,self on lo: TCP loopback only (no shared memory, no UCX);
  # btl vader,self: shared memory only.
  if [ "$peer" = mpi ]; then
    transport=(--mca btl tcp,self --mca btl_tcp_if_include lo)
    name=tcp
  else
    transport=(--mca btl vader,self)
    name=shm
  fi
  exec timeout --kill-after=10 "$timeout_s" \
    mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$ranks" \
    --mca pml ob1 "${transport[@]}" "$binary" --transport "$name" "$@"
fi

binary="$(find_binary gloo_bench)" || exit 1
work="$(mktemp -d "${TMPDIR:-/tmp}/run_peer_gloo.XXXXXX")" || exit 1
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do
    kill "$pid" 2>/dev/null
  done
  wait 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 143' INT TERM

declare -A rank_of
for ((r = 0; r < ranks; r++)); do
  if [ "$r" -eq 0 ]; then
    "$binary" --rank "$r" --ranks "$ranks" --store_dir "$work/store" "$@" &
  else
    "$binary" --rank "$r" --ranks "$ranks" --store_dir "$work/store" "$@" \
      >"$work/rank$r.out" &
  fi
  pids+=("$!")
  rank_of[$!]=$r
done
# The deadline: a sleep among the waited-for children (no polling while ranks run). Its
# output is closed so that it cannot hold a pipe reading our stdout open.
sleep "$timeout_s" </dev/null >/dev/null 2>&1 &
timer_pid=$!
pids+=("$timer_pid")

# Waits for every rank; on the first failure or the deadline kills the others (cleanup).
rc=0
for ((left = ranks; left > 0; left--)); do
  finished=""
  wait -n -p finished "${pids[@]}"
  status=$?
  [ -n "$finished" ] || break
  rest=()
  for pid in "${pids[@]}"; do
    [ "$pid" = "$finished" ] || rest+=("$pid")
  done
  pids=("${rest[@]}")
  if [ "$finished" = "$timer_pid" ]; then
    echo "run_peer: gloo with $ranks ranks did not finish within ${timeout_s}s" >&2
    rc=124
    break
  fi
  r="${rank_of[$finished]}"
  if [ "$status" -ne 0 ]; then
    echo "run_peer: gloo_bench rank $r exited with status $status" >&2
    if [ "$r" -ne 0 ] && [ -s "$work/rank$r.out" ]; then
      echo "run_peer: stdout of rank $r:" >&2
      cat "$work/rank$r.out" >&2
    fi
    [ "$left" -gt 1 ] && echo "run_peer: stopping the other ranks" >&2
    rc=$status
    break
  fi
done
exit "$rc"
