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

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
  else
    echo "tools/setup.sh: these Debian packages are missing and this is not root (no sudo):" >&2
    echo "  ${missing[*]}" >&2
    echo "Install them as root: apt-get install ${missing[*]}" >&2
    exit 1
  fi
fi

echo "tools/setup.sh: installing ${#missing[@]} Debian packages: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
echo "tools/setup.sh: done" >&2
