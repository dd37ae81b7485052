"""cc_grpc_library: C++ protobuf + gRPC stubs from Debian's protoc/grpc_cpp_plugin.

No rules_proto / com_github_grpc_grpc download: one genrule runs the system
protoc (tracked as @system//:protoc) with the system grpc_cpp_plugin
(@system//:grpc_cpp_plugin) and a cc_library compiles the output.

Import paths and generated includes are relative to the package that calls the
macro, so a proto/BUILD with srcs = ["shardline/v1/job.proto"] gives
`import "shardline/v1/job.proto";` and `#include "shardline/v1/job.pb.h"`.
"""

def cc_grpc_library(name, srcs, deps = [], grpc = True, **kwargs):
    outs = []
    for src in srcs:
        if not src.endswith(".proto"):
            fail("cc_grpc_library srcs must be .proto files: " + src)
        base = src[:-len(".proto")]
        outs += [base + ".pb.h", base + ".pb.cc"]
        if grpc:
            outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]

    pkg = native.package_name()
    root = pkg if pkg else "."
    out_dir = "$(GENDIR)/" + pkg if pkg else "$(GENDIR)"
    grpc_args = ""
    if grpc:
        grpc_args = " --grpc_out=%s --plugin=protoc-gen-grpc=$(location @system//:grpc_cpp_plugin)" % out_dir

    native.genrule(
        name = name + "_codegen",
        srcs = srcs,
        outs = outs,
        tools = ["@system//:protoc", "@system//:grpc_cpp_plugin"],
        # -I<package> makes imports package-relative; -I/usr/include finds the
        # well-known types (google/protobuf/*.proto).
        cmd = "$(location @system//:protoc) -I%s -I/usr/include --cpp_out=%s" % (root, out_dir) +
              grpc_args + " $(SRCS)",
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        includes = ["."],
        deps = deps + ["@system//:protobuf"] + (["@system//:grpcpp"] if grpc else []),
        **kwargs
    )
