#!/usr/bin/env bash
# Packs the release bundle (`bazel build //deploy:bundle`): a tarball whose ringmaster/
# directory runs wherever it is unpacked, on Debian 12 or Ubuntu 24.04 without any of
# ringmaster's build dependencies installed.
#
#   make_bundle.sh OUT.tar.gz BIN... -- FILE...   (FILEs keep their path below deploy/ or
#                                                  the workspace: examples/*.yaml,
#                                                  examples/torch_ddp/train.py, ...)
#
# ringmaster/bin/   the binaries, debug info stripped; their RUNPATH is $ORIGIN/../lib
# ringmaster/lib/   every shared library they load (found with ldd, not listed by hand)
#                   except glibc's, the C++ runtime and zlib, which every host has, and the
#                   NVIDIA driver's; with --config=cuda that includes the CUDA runtime,
#                   cuBLASLt and NCCL from /usr/local/cuda (the bundle's RPATH comes first,
#                   so a host's other CUDA install is not used)
# ringmaster/...    the other files: examples (the job specs, and the command job's example
#                   programs examples/torch_ddp/train.py and, recovering in its process,
#                   examples/torch_inprocess/train.py), systemd units, Kubernetes
#                   manifests, README
# ringmaster/python/ringmaster/   the Python module command jobs' programs import (ringtrainer
#                   finds it at ../python beside its bin/ and puts it on their PYTHONPATH)
set -euo pipefail

out="$1"
shift
bins=()
while [[ $# -gt 0 && "$1" != "--" ]]; do bins+=("$1"); shift; done
[[ $# -gt 0 ]] && shift
files=("$@")

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
root="$stage/ringmaster"
mkdir -p "$root/bin" "$root/lib"
for b in "${bins[@]}"; do
  cp "$b" "$root/bin/"
  chmod u+w,a+rx "$root/bin/$(basename "$b")"
  strip --strip-debug "$root/bin/$(basename "$b")"
done

# Everything ldd resolves, minus what every glibc system has and must not be replaced.
# With --config=cuda also the driver's libraries (libcuda, libnvidia-*): they must match
# the GPU machine's kernel module, so they come from there.
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libresolv\.|libutil\.|libgcc_s\.|libstdc\+\+\.|libz\.|libcuda\.|libnvidia)'
for b in "$root"/bin/*; do
  if ldd "$b" | grep -q "not found"; then
    echo "make_bundle.sh: $b has unresolved libraries:" >&2
    ldd "$b" | grep "not found" >&2
    exit 1
  fi
  ldd "$b" | awk '/=> \// {print $1, $3}'
done | sort -u | while read -r soname path; do
  [[ "$soname" =~ $skip ]] && continue
  cp -L "$path" "$root/lib/$soname"
  chmod 0644 "$root/lib/$soname"
done

for f in "${files[@]}"; do
  rel="${f#deploy/}"
  mkdir -p "$root/$(dirname "$rel")"
  cp "$f" "$root/$rel"
  chmod u+w "$root/$rel"
done

tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$stage" -cf - ringmaster |
  gzip -n >"$out"
