#!/usr/bin/env bash
# Installs every Debian package ringmaster needs to build, test and benchmark.
# Idempotent and non-interactive: does nothing when everything is already there.
# Usage: tools/setup.sh            (as root, or with sudo available)
set -euo pipefail

PACKAGES=(
  # build
  bazel-bootstrap g++ protobuf-compiler protobuf-compiler-grpc libprotobuf-dev libgrpc++-dev
  libabsl-dev libgoogle-glog-dev libgflags-dev
  # tests and micro-benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev
  # libraries used by later layers (checksums, durable state, job specs, data, BLAS)
  libxxhash-dev libsqlite3-dev libyaml-cpp-dev zlib1g-dev libopenblas-dev libssl-dev openssl
  # command lines (ringctl and the daemons) and JSON output, header-only
  libcli11-dev nlohmann-json3-dev
  # the real data set (gzip-compressed IDX files in /usr/share/datasets/fashion-mnist/)
  dataset-fashion-mnist
  # peers measured by `ringbench comm`
  libgloo-dev openmpi-bin libopenmpi-dev
  # tools used by scripts and tests
  iproute2 procps python3
)

# Wanted, not required: Debian's clang 14 (bookworm), for tools/test.sh's build with
# -Werror=thread-safety (--config=clang). Where it cannot be installed, this says so and
# tools/test.sh skips that build.
OPTIONAL_PACKAGES=(clang-14)

# The packages of "$@" that are not installed.
not_installed() {
  for p in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
      echo "$p"
    fi
  done
}
mapfile -t missing < <(not_installed "${PACKAGES[@]}")
mapfile -t missing_optional < <(not_installed "${OPTIONAL_PACKAGES[@]}")

if [ ${#missing[@]} -eq 0 ] && [ ${#missing_optional[@]} -eq 0 ]; then
  exit 0
fi
optional_note="tools/setup.sh: not installed: ${missing_optional[*]} (optional: tools/test.sh skips its clang build)"

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
  elif [ ${#missing[@]} -eq 0 ]; then
    echo "$optional_note; install as root: apt-get install ${missing_optional[*]}" >&2
    exit 0
  else
    echo "tools/setup.sh: these Debian packages are missing and this is not root (no sudo):" >&2
    echo "  ${missing[*]}" >&2
    echo "Install them as root: apt-get install ${missing[*]}" >&2
    exit 1
  fi
fi

echo "tools/setup.sh: installing $((${#missing[@]} + ${#missing_optional[@]})) Debian packages:" \
  "${missing[*]}${missing[*]:+ }${missing_optional[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get update -qq && [ ${#missing[@]} -eq 0 ]; then
  echo "$optional_note: apt-get update failed" >&2
  exit 0
fi
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if [ ${#missing_optional[@]} -gt 0 ] &&
   ! $SUDO apt-get install -y -qq "${missing_optional[@]}" >/dev/null; then
  echo "$optional_note: apt-get install failed" >&2
fi
echo "tools/setup.sh: done" >&2
