#!/usr/bin/env bash
# Runs every test of ringmaster. Installs what the build needs first (tools/setup.sh).
# Usage: tools/test.sh [extra bazel test flags, e.g. //comm/...]
# Ends with one line: "N passed, N failed[, N skipped]" (test cases, counted from the JUnit
# XML that each test target writes; a target that did not build or wrote no XML counts as
# one failure; skipped cases are GPU tests on a machine without a GPU). Where the CUDA
# toolkit's headers are installed, the GPU tests also run under --config=cudaemu (the CUDA
# code emulated on the CPU, tools/cuda_emu) and count in the same line. Last, the same
# targets are built with clang 14 and -Werror=thread-safety (--config=clang): a failed
# build counts as one failure and its first errors are printed. With the whole tree, each
# dependency rule of ARCHITECTURE.md (tools/check_layering.sh) counts as one case.
set -uo pipefail
cd "$(dirname "$0")/.."

tools/setup.sh || { echo "0 passed, 1 failed"; exit 1; }

CACHE_DIR="${RINGMASTER_BAZEL_CACHE:-$HOME/.cache/ringmaster-bazel}"
mkdir -p "$CACHE_DIR"

targets=()
flags=()
for a in "$@"; do
  case "$a" in
    //*|:*) targets+=("$a") ;;
    *) flags+=("$a") ;;
  esac
done
[ ${#targets[@]} -eq 0 ] && targets=("//...")

# Counts the test cases of the targets listed in $1 from the JUnit XML under $2 (a testlogs
# directory) written after the marker file $3; $4 is bazel's exit status, $5 a label for the
# problems printed. Prints the problems, and "passed failed skipped" as its last line.
count() {
  python3 - "$@" <<'PY'
import os, sys, xml.etree.ElementTree as ET
targets_file, testlogs, marker, rc, label = sys.argv[1:6]
rc = int(rc)
since = os.path.getmtime(marker)
passed = failed = skipped = 0
problems = []
for t in open(targets_file).read().split():
    pkg, name = t[2:].split(":")
    xml = os.path.join(testlogs, pkg, name, "test.xml")
    if not os.path.exists(xml) or os.path.getmtime(xml) < since:
        failed += 1
        problems.append(f"{t}{label}: did not run (build failure?)")
        continue
    try:
        root = ET.parse(xml).getroot()
    except ET.ParseError as e:
        failed += 1
        problems.append(f"{t}{label}: unreadable test.xml ({e})")
        continue
    cases = list(root.iter("testcase"))
    target_failed = 0
    for case in cases:
        if case.find("failure") is not None or case.find("error") is not None:
            target_failed += 1
        elif case.find("skipped") is not None or case.get("result") == "skipped":
            skipped += 1  # e.g. GPU tests on a machine without a GPU; the log says why
        else:
            passed += 1
    # A crash after some cases passed leaves a log but maybe no failing <testcase>.
    status_failed = any(s.get("failures", "0") not in ("0", "") or s.get("errors", "0") not in ("0", "")
                        for s in root.iter("testsuite"))
    if not cases:
        if status_failed:
            failed += 1
        else:
            passed += 1
    elif target_failed == 0 and status_failed and rc != 0:
        target_failed = 1
    failed += target_failed
    if target_failed:
        problems.append(f"{t}{label}: {target_failed} failed")
if rc != 0 and failed == 0:
    failed += 1
    problems.append(f"bazel test{label} exited with status {rc} (see its output above)")
for p in problems:
    print("  " + p)
print(passed, failed, skipped)
PY
}

marker=$(mktemp)
bazel test --disk_cache="$CACHE_DIR" --nocache_test_results --keep_going \
  ${flags[@]+"${flags[@]}"} -- "${targets[@]}"
rc=$?

# Tests that should have run: every test target that is not tagged manual.
query="tests(set(${targets[*]})) except attr(tags, 'manual', tests(set(${targets[*]})))"
bazel query --noshow_progress "$query" 2>/dev/null >"$marker.targets"
count "$marker.targets" bazel-testlogs "$marker" "$rc" "" >"$marker.counts"
read -r passed failed skipped < <(tail -n 1 "$marker.counts")
sed '$d' "$marker.counts"

# The GPU code once more, on the CPU: --config=cudaemu compiles the CUDA sources as C++ against
# tools/cuda_emu (the CUDA runtime, cuBLASLt and NCCL emulated), so the GPU tests run
# instead of skipping. Needs the CUDA toolkit's headers (not on a plain Debian machine, where
# this is skipped and says so); RINGMASTER_CUDAEMU=0 skips it.
emu_query="kind(cc_test, rdeps(set(${targets[*]}), @cuda//:cudart)) + tests(set(${targets[*]}) intersect //tools/cuda_emu/...)"
if [ "${RINGMASTER_CUDAEMU:-1}" != 0 ] && [ -f /usr/local/cuda/include/cuda_runtime_api.h ]; then
  bazel query --noshow_progress "($emu_query) except attr(tags, 'manual', $emu_query)" \
    2>/dev/null >"$marker.emu_targets"
  if [ -s "$marker.emu_targets" ]; then
    echo "== the GPU tests again under --config=cudaemu (the CUDA code emulated on the CPU) =="
    emu_marker=$(mktemp)
    bazel test --config=cudaemu --disk_cache="$CACHE_DIR" --nocache_test_results --keep_going \
      ${flags[@]+"${flags[@]}"} -- $(cat "$marker.emu_targets")
    emu_rc=$?
    emu_logs=$(bazel info --config=cudaemu bazel-testlogs 2>/dev/null)
    count "$marker.emu_targets" "$emu_logs" "$emu_marker" "$emu_rc" " (cudaemu)" >"$marker.counts"
    read -r p f s < <(tail -n 1 "$marker.counts")
    sed '$d' "$marker.counts"
    passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
    rc=$((rc != 0 ? rc : emu_rc))
    rm -f "$emu_marker"
  fi
elif [ "${RINGMASTER_CUDAEMU:-1}" != 0 ]; then
  echo "(no CUDA headers in /usr/local/cuda/include: the GPU tests were not run under the CPU emulation)"
fi

# Thread-safety annotations (ABSL_GUARDED_BY, ABSL_EXCLUSIVE_LOCKS_REQUIRED, ...) checked by
# a compiler: the targets built once more with Debian's clang 14 and -Werror=thread-safety,
# in their own output directory. Needs clang-14 (tools/setup.sh installs it where Debian has
# it; skipped and said so where not); RINGMASTER_CLANG=0 skips it.
if [ "${RINGMASTER_CLANG:-1}" != 0 ] && command -v clang-14 >/dev/null 2>&1; then
  echo "== the same targets built with clang 14 and -Werror=thread-safety (--config=clang) =="
  start=$SECONDS
  bazel build --config=clang --disk_cache="$CACHE_DIR" --keep_going -- "${targets[@]}" \
    >"$marker.clang" 2>&1
  clang_rc=$?
  if [ "$clang_rc" -eq 0 ]; then
    echo "clang build: ok ($((SECONDS - start)) s)"
  else
    echo "clang build: FAILED (bazel exited with status $clang_rc); its first errors:"
    # The compiler's and linker's errors with their context, else Bazel's own.
    { grep -E -A3 -m 10 ": (fatal )?error:" "$marker.clang" || grep -m 10 "^ERROR:" "$marker.clang"; } |
      head -n 50 | sed 's/^/  /'
    echo "  (the whole output: bazel build --config=clang --keep_going ${targets[*]})"
    failed=$((failed + 1))
    rc=$((rc != 0 ? rc : clang_rc))
  fi
elif [ "${RINGMASTER_CLANG:-1}" != 0 ]; then
  echo "(no clang-14 on this machine: the build with -Werror=thread-safety was skipped;" \
    "tools/setup.sh installs it on Debian 12)"
fi
# ARCHITECTURE.md's dependency rules (who may depend on whom), one case per rule, when the
# whole tree is tested.
if [ "${targets[*]}" = "//..." ]; then
  echo "== the dependency rules (tools/check_layering.sh) =="
  tools/check_layering.sh >"$marker.layering" 2>&1
  cat "$marker.layering"
  passed=$((passed + $(grep -c '^layering: ok' "$marker.layering")))
  layering_failed=$(grep -c '^layering: FAILED' "$marker.layering")
  failed=$((failed + layering_failed))
  [ "$layering_failed" -gt 0 ] && rc=1
fi
rm -f "$marker" "$marker.targets" "$marker.emu_targets" "$marker.counts" "$marker.clang" \
  "$marker.layering"

echo "$passed passed, $failed failed$([ "$skipped" -gt 0 ] && echo ", $skipped skipped")"
[ "$failed" -eq 0 ] && [ "$rc" -eq 0 ]
