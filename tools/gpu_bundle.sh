#!/usr/bin/env bash
# Builds Bazel targets with --config=cuda and packs them, with the shared libraries they
# need from this machine, into a folder that can travel to a GPU machine that has CUDA but
# neither Bazel nor Debian's libraries (the lent H100/H200 machines, a bare cloud VM).
#
#   tools/gpu_bundle.sh [-o DIR] //comm/nccl:nccl_communicator_test //kernels:cuda_kernels_test ...
#
# DIR (default devrun/) gets bin/<package>__<name> for each target (debug info stripped),
# lib/ with every shared library the binaries load that is not part of glibc, the
# compiler runtime or CUDA (those come from the GPU machine; the release bundle,
# `bazel build --config=cuda //deploy:bundle`, carries CUDA's instead), and env.sh, which points
# LD_LIBRARY_PATH at lib/, CUDA's lib64 and wherever the machine keeps libnccl.so.2 (the
# CUDA toolkit, or the nvidia-nccl wheel PyTorch ships). On the GPU machine:
#
#   source DIR/env.sh && DIR/bin/comm_nccl__nccl_communicator_test
#
# Targets are linked with --dynamic_mode=off, so the project's own libraries are inside the
# binaries and only system libraries are loaded at run time.
set -euo pipefail

out=devrun
if [[ "${1:-}" == "-o" ]]; then
  out="$2"
  shift 2
fi
if [[ $# -eq 0 ]]; then
  echo "usage: $0 [-o DIR] //pkg:target ..." >&2
  exit 2
fi

cd "$(dirname "$0")/.."
bazel build --config=cuda --dynamic_mode=off "$@"
bin_dir="$(bazel info --config=cuda --dynamic_mode=off bazel-bin)"

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
for target in "$@"; do
  label="${target#//}"
  pkg="${label%%:*}"
  name="${label#*:}"
  src="$bin_dir/$pkg/$name"
  if [[ ! -x "$src" ]]; then
    echo "$target: no executable at $src (only cc_binary and cc_test targets can be bundled)" >&2
    exit 1
  fi
  dst="$out/bin/${pkg//\//_}__$name"
  cp "$src" "$dst"
  chmod u+w "$dst"
  strip --strip-debug "$dst"
done

# Shared libraries: everything ldd resolves, minus what the GPU machine must provide itself.
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libresolv\.|libutil\.|libgcc_s\.|libstdc\+\+\.|libcuda\.|libcudart\.|libnccl\.|libcublas|libnvidia)'
for b in "$out"/bin/*; do
  ldd "$b" | awk '/=> \// {print $1, $3}'
done | sort -u | while read -r soname path; do
  if [[ "$soname" =~ $skip ]]; then continue; fi
  cp -L "$path" "$out/lib/$soname"
done

cat >"$out/env.sh" <<'EOF'
# Sourced on the GPU machine: libraries carried in lib/, then CUDA, then NCCL wherever found.
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
nccl_dir=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu; do
  if [[ -e "$d/libnccl.so.2" ]]; then nccl_dir="$d"; break; fi
done
if [[ -z "$nccl_dir" ]]; then
  found="$(find / -xdev -name 'libnccl.so.2' -path '*nvidia/nccl/lib*' 2>/dev/null | head -1)"
  [[ -n "$found" ]] && nccl_dir="$(dirname "$found")"
fi
cublas_dir=""
if [[ ! -e /usr/local/cuda/lib64/libcublasLt.so.13 ]]; then
  found="$(find / -xdev -name 'libcublasLt.so.13' 2>/dev/null | head -1)"
  [[ -n "$found" ]] && cublas_dir="$(dirname "$found")"
fi
export LD_LIBRARY_PATH="$here/lib:/usr/local/cuda/lib64${cublas_dir:+:$cublas_dir}${nccl_dir:+:$nccl_dir}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TEST_TMPDIR="${TEST_TMPDIR:-/tmp/ringmaster-test}"
mkdir -p "$TEST_TMPDIR"
echo "env.sh: NCCL from ${nccl_dir:-(not found)}; cuBLASLt from ${cublas_dir:-/usr/local/cuda/lib64}"
EOF
du -sh "$out"
