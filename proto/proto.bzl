"""rm_proto_library: .proto -> C++ messages (+ gRPC services) with Debian's protoc.

    rm_proto_library(
        name = "job_proto",
        srcs = ["job.proto"],
        deps = [":common_proto"],   # other rm_proto_library targets it imports
        grpc = True,                # also generate gRPC stubs and services
    )

Makes a cc_library `name` whose headers are "<package>/<file>.pb.h" (and ".grpc.pb.h").
Imports are written relative to the workspace root: import "proto/common.proto";
"""

def rm_proto_library(name, srcs, deps = [], grpc = False, visibility = None, testonly = False):
    outs = []
    hdrs = []
    for src in srcs:
        if not src.endswith(".proto"):
            fail("rm_proto_library %s: %s is not a .proto file" % (name, src))
        base = src[:-len(".proto")]
        outs += [base + ".pb.h", base + ".pb.cc"]
        hdrs.append(base + ".pb.h")
        if grpc:
            outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]
            hdrs.append(base + ".grpc.pb.h")

    native.filegroup(
        name = name + "_srcs",
        srcs = srcs + [d + "_srcs" for d in deps],
        visibility = visibility,
        testonly = testonly,
    )

    grpc_flags = ""
    if grpc:
        grpc_flags = "--grpc_out=$(GENDIR) --plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin"

    native.genrule(
        name = name + "_gen",
        srcs = srcs + [d + "_srcs" for d in deps],
        outs = outs,
        cmd = " ".join([
            "/usr/bin/protoc",
            "--proto_path=.",
            "--proto_path=$(GENDIR)",
            "--cpp_out=$(GENDIR)",
            grpc_flags,
        ] + ["$(location %s)" % s for s in srcs]),
        testonly = testonly,
    )

    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        deps = deps + ["@system//:protobuf"] + (["@system//:grpc"] if grpc else []),
        visibility = visibility,
        testonly = testonly,
    )
