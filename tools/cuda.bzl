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
    native.cc_library(
        name = name,
        srcs = objects,
        hdrs = hdrs,
        deps = deps + ["@cuda//:cudart"],
        tags = kwargs.pop("tags", []) + ["manual"],
        alwayslink = True,
        **kwargs
    )
