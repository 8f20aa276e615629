"""cuda_library: .cu sources compiled by nvcc through a genrule, wrapped in a cc_library.

Only meaningful with --config=cuda: the targets are tagged manual, and users reach them
through select({"//tools:cuda": [...], "//conditions:default": [...]}) so that the default
build never runs nvcc.

    cuda_library(
        name = "layernorm_cuda",
        srcs = ["cuda/layernorm.cu"],       # compiled by nvcc, one object each
        hdrs = ["cuda/layernorm.h"],        # the host API, included by C++ callers
        cu_deps = ["cuda/common.cuh"],      # headers only the .cu files include
        deps = ["//common:cuda_status"],    # linked into the library's users
    )

The .cu files may include any header of the workspace by its workspace path (nvcc runs
with -I at the execution root); such headers must be listed in `hdrs` or `cu_deps` so the
sandbox contains them. Device code is built for sm_90 (H100/H200) plus compute_80 PTX, so
A100-class GPUs JIT it; host code is C++20 and position independent.
"""

NVCC = "/usr/local/cuda/bin/nvcc"

NVCC_FLAGS = [
    "-std=c++20",
    "-O3",
    "-lineinfo",
    "--expt-relaxed-constexpr",
    "-Xcompiler=-fPIC",
    "-Xcompiler=-Wall",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_80,code=compute_80",
    "-I.",
    "-I$(GENDIR)",
]

def cuda_library(name, srcs, hdrs = [], cu_deps = [], deps = [], nvcc_flags = [], **kwargs):
    objects = []
    emulated = []
    for src in srcs:
        stem = src.replace("/", "_").replace(".cu", "")
        obj = "_%s_%s.pic.o" % (name, stem)
        native.genrule(
            name = "_%s_%s_nvcc" % (name, stem),
            srcs = [src] + hdrs + cu_deps,
            outs = [obj],
            cmd = " ".join([NVCC] + NVCC_FLAGS + nvcc_flags + [
                "-c",
                "$(location %s)" % src,
                "-o",
                "$@",
            ]),
            tags = ["manual"],
            message = "nvcc " + src,
        )
        objects.append(obj)

        # --config=cudaemu: the same source as C++ for tools/cuda_emu.
        emu = "_%s_%s_emu.cc" % (name, stem)
        native.genrule(
            name = "_%s_%s_emu" % (name, stem),
            srcs = [src] + cu_deps,
            outs = [emu],
            cmd = "python3 $(location //tools/cuda_emu:rewrite_cu.py) $(location %s) $@" % src,
            tools = ["//tools/cuda_emu:rewrite_cu.py"],
            tags = ["manual"],
        )
        emulated.append(emu)
    native.cc_library(
        name = name,
        srcs = select({
            "//tools:cuda_emu": emulated,
            "//conditions:default": objects,
        }),
        hdrs = hdrs,
        textual_hdrs = select({
            "//tools:cuda_emu": cu_deps,
            "//conditions:default": [],
        }),
        copts = select({
            "//tools:cuda_emu": [
                "-include",
                "tools/cuda_emu/cuda_emu.h",
                "-DRINGMASTER_CUDA_EMU=1",
                "-Wno-unused-function",
            ],
            "//conditions:default": [],
        }),
        deps = deps + ["@cuda//:cudart"] + select({
            "//tools:cuda_emu": ["//tools/cuda_emu:kernel"],
            "//conditions:default": [],
        }),
        tags = kwargs.pop("tags", []) + ["manual"],
        alwayslink = True,
        **kwargs
    )

def _if_cuda(cuda, default = []):
    return select({
        "//tools:cuda": cuda,
        "//conditions:default": default,
    })

def cuda_only_library(name, srcs = [], hdrs = [], deps = [], **kwargs):
    """A cc_library with its sources, headers and deps only under --config=cuda (empty
    otherwise), tagged manual: reach it through select() or from other CUDA-only targets."""
    native.cc_library(
        name = name,
        srcs = _if_cuda(srcs),
        hdrs = _if_cuda(hdrs),
        deps = _if_cuda(deps),
        tags = kwargs.pop("tags", []) + ["manual"],
        **kwargs
    )

def cuda_only_test(name, srcs, skipped_srcs, deps = [], **kwargs):
    """A cc_test that exists in every build: `srcs` and `deps` under --config=cuda,
    otherwise `skipped_srcs` (a test that skips and says how to build the real one)."""
    native.cc_test(
        name = name,
        srcs = _if_cuda(srcs, skipped_srcs),
        deps = _if_cuda(deps, ["@system//:gtest_main"]),
        **kwargs
    )

def cuda_only_binary(name, srcs, not_built_srcs, deps = [], **kwargs):
    """A cc_binary, tagged manual: `srcs` and `deps` under --config=cuda, otherwise
    `not_built_srcs` (a main that says it was not built and exits 2)."""
    native.cc_binary(
        name = name,
        srcs = _if_cuda(srcs, not_built_srcs),
        deps = _if_cuda(deps),
        tags = kwargs.pop("tags", []) + ["manual"],
        **kwargs
    )

def cuda_emu_test(name, srcs, deps = [], **kwargs):
    """A test of tools/cuda_emu itself: `srcs` and `deps` under --config=cudaemu, otherwise a
    single skipped case (tools/cuda_emu/skipped_test.cc) that says how to run it."""
    native.cc_test(
        name = name,
        srcs = select({
            "//tools:cuda_emu": srcs,
            "//conditions:default": ["//tools/cuda_emu:skipped_test.cc"],
        }),
        deps = select({
            "//tools:cuda_emu": deps,
            "//conditions:default": ["@system//:gtest_main"],
        }),
        **kwargs
    )
