"""The generated protobuf and gRPC modules of proto/shardline/v1, with a clear error when missing.

They are generated, not committed: python/generate_stubs.sh writes them into
python/shardline/v1/ (for PYTHONPATH=python), `pip install ./python` and
`bazel build //python:shardline` generate them too.
"""

try:
    from shardline.v1 import checkpoint_pb2  # noqa: F401
    from shardline.v1 import common_pb2  # noqa: F401
    from shardline.v1 import coordinator_pb2  # noqa: F401
    from shardline.v1 import coordinator_pb2_grpc  # noqa: F401
    from shardline.v1 import events_pb2  # noqa: F401
    from shardline.v1 import job_pb2  # noqa: F401
    from shardline.v1 import plan_pb2  # noqa: F401
    from shardline.v1 import rendezvous_pb2  # noqa: F401
    from shardline.v1 import replica_pb2  # noqa: F401
    from shardline.v1 import session_pb2  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised by a subprocess test
    if not (e.name or "").startswith("shardline.v1"):
        raise
    raise ImportError(
        "shardline's generated stubs (%s) are missing: from a source checkout run "
        "python/generate_stubs.sh (then PYTHONPATH=python), or install the package with "
        "`pip install ./python`" % e.name, name=e.name) from e
