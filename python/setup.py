"""pip install ./python: the shardline package with stubs generated from ../proto.

    /usr/bin/python3 -m venv --system-site-packages /tmp/v
    /tmp/v/bin/pip install --no-build-isolation --no-deps ./python

build_py runs generate_stubs.sh (Debian's /usr/bin/protoc and
/usr/bin/grpc_python_plugin) on proto/shardline/v1/*.proto of the checkout
(or $SHARDLINE_PROTO_ROOT) into the build folder, next to the sources. Without
the .proto files, the stubs already in shardline/v1/ are used, if any.
"""

import os
import subprocess

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def _version():
    scope = {}
    with open(os.path.join(HERE, "shardline", "_version.py")) as f:
        exec(f.read(), scope)
    return scope["__version__"]


class BuildPyWithStubs(build_py):
    """build_py, then the generated shardline.v1.*_pb2 / *_pb2_grpc modules into build_lib."""

    def run(self):
        super().run()
        proto_root = os.environ.get("SHARDLINE_PROTO_ROOT", os.path.join(HERE, "..", "proto"))
        if os.path.isdir(os.path.join(proto_root, "shardline", "v1")):
            subprocess.check_call(["bash", os.path.join(HERE, "generate_stubs.sh"), proto_root,
                                   self.build_lib])
            return
        built = os.path.join(self.build_lib, "shardline", "v1", "coordinator_pb2_grpc.py")
        if not os.path.exists(built):
            raise SystemExit("setup.py: no proto/shardline/v1/*.proto at %s and no generated stubs in "
                             "shardline/v1/; install from a Shardline checkout (pip install ./python) "
                             "or set SHARDLINE_PROTO_ROOT" % proto_root)


setup(
    name="shardline",
    version=_version(),
    description="Python client of the Shardline coordinator (gRPC)",
    long_description=open(os.path.join(HERE, "README.md")).read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["shardline", "shardline.*"]),
    python_requires=">=3.9",
    install_requires=["grpcio>=1.51", "protobuf>=3.21"],
    # torch (the Store and the torchrun backend) is optional: the client
    # works without it.
    extras_require={"torch": ["torch>=1.13"]},
    entry_points={
        # torch >= 2.5 discovers rendezvous backends here: plain
        # `torchrun --rdzv-backend shardline ...` then works.
        "torchrun.handlers": ["shardline = shardline.torch.rendezvous:handler_generator"],
        "console_scripts": ["shardline-torchrun = shardline.torchrun:main"],
    },
    cmdclass={"build_py": BuildPyWithStubs},
)
