#!/usr/bin/env bash
# Runs every test of ringmaster. Installs what the build needs first (tools/setup.sh).
# Usage: tools/test.sh [extra bazel test flags, e.g. //comm/...]
# Ends with one line: "N passed, N failed[, N skipped]" (test cases, counted from the JUnit
# XML that each test target writes; a target that did not build or wrote no XML counts as
# one failure; skipped cases are GPU tests on a machine without a GPU).
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

start_marker=$(mktemp)
bazel test --disk_cache="$CACHE_DIR" --nocache_test_results --keep_going \
  ${flags[@]+"${flags[@]}"} -- "${targets[@]}"
rc=$?

# Tests that should have run: every test target that is not tagged manual.
query="tests(set(${targets[*]})) except attr(tags, 'manual', tests(set(${targets[*]})))"
bazel query --noshow_progress "$query" 2>/dev/null >"$start_marker.targets"

python3 - "$start_marker" "$start_marker.targets" "$rc" <<'PY'
import os, sys, xml.etree.ElementTree as ET
marker, targets_file, rc = sys.argv[1], sys.argv[2], int(sys.argv[3])
since = os.path.getmtime(marker)
passed = failed = skipped = 0
problems = []
for label in open(targets_file).read().split():
    pkg, name = label[2:].split(":")
    xml = os.path.join("bazel-testlogs", pkg, name, "test.xml")
    if not os.path.exists(xml) or os.path.getmtime(xml) < since:
        failed += 1
        problems.append(f"{label}: did not run (build failure?)")
        continue
    try:
        root = ET.parse(xml).getroot()
    except ET.ParseError as e:
        failed += 1
        problems.append(f"{label}: unreadable test.xml ({e})")
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
        problems.append(f"{label}: {target_failed} failed")
if rc != 0 and failed == 0:
    failed += 1
    problems.append(f"bazel test exited with status {rc} (see its output above)")
for p in problems:
    print("  " + p)
print(f"{passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else ""))
sys.exit(0 if failed == 0 and rc == 0 else 1)
PY
status=$?
rm -f "$start_marker" "$start_marker.targets"
exit $status
