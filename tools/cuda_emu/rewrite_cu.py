#!/usr/bin/env python3
"""Rewrites a .cu file into C++ for tools/cuda_emu (--config=cudaemu):

  kernel<<<grid, block, smem, stream>>>(args)  ->  ::rm_emu::Launcher(grid, block, smem,
                                                   stream).Run(kernel, args)
  extern __shared__ T name[];                  ->  T* name = reinterpret_cast<T*>(
                                                   ::rm_emu::DynamicShared());

inlines the project's .cuh headers (`#include "....cuh"`, found from the execution root; they
hold launches too), and puts #line directives in, so compiler errors point at the sources.
Usage: rewrite_cu.py in.cu out.cc
"""
import re
import sys

LAUNCH = re.compile(r"([A-Za-z_][\w:]*(?:<[^<>;()]*>)?)\s*<<<(.*?)>>>\s*\(\s*(\)?)", re.S)
SHARED = re.compile(r"extern\s+__shared__\s+([^;\[]*?)\s+(\w+)\s*\[\s*\]\s*;")


def launch(m):
    kernel, config, empty = m.group(1), m.group(2), m.group(3)
    return "::rm_emu::Launcher(%s).Run(%s%s" % (config, kernel, ")" if empty else ", ")


INCLUDE = re.compile(r'^#include "([^"]+\.cuh)"\s*$', re.M)


def inline(path, seen):
    text = open(path).read()

    def expand(m):
        header = m.group(1)
        if header in seen:
            return ""  # its include guard would skip it anyway
        seen.add(header)
        return '%s\n#line %d "%s"' % (inline(header, seen), text.count("\n", 0, m.end()) + 2,
                                       path)

    return '#line 1 "%s"\n' % path + INCLUDE.sub(expand, text)


def main():
    src, out = sys.argv[1], sys.argv[2]
    text = inline(src, set())
    text, launches = LAUNCH.subn(launch, text)
    text = SHARED.sub(r"\1* \2 = reinterpret_cast<\1*>(::rm_emu::DynamicShared());", text)
    if "<<<" in text:
        sys.exit("rewrite_cu.py: %s: a kernel launch it could not rewrite" % src)
    with open(out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
