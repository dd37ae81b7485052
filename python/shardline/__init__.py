"""Shardline's Python client: the coordinator's API over gRPC (proto/shardline/v1).

    import shardline
    with shardline.Client("127.0.0.1:7070", token="...") as client:
        print(client.get_job("demo").phase)

Client: the operator's calls (jobs, members, plans, checkpoints, events).
Connection: any RPC by name ("JobService.GetJob", "RendezvousService.KvGet"),
with the leader-following and failover of several coordinator replicas.
Errors: one ShardlineError subclass per status code (shardline.errors).
Messages: shardline.v1.<file>_pb2 (generated; see python/README.md).
"""

import os as _os

# gRPC notices a finished connect only when a thread polls the channel: with
# fail-fast calls and none waiting, that is its backup poller, every 5 s by
# default, so a client reached a restarted coordinator seconds after it
# served (common/grpc_backup_poll.h, the same setting for the C++ programs).
# gRPC reads this when it initialises, on its import: it takes effect when
# shardline is imported before grpc; an operator's value wins.
_os.environ.setdefault("GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS", "100")

from shardline._version import __version__  # noqa: E402
from shardline import _stubs  # noqa: F401  (a clear ImportError when the stubs are missing)
from shardline._connection import Connection, Stream
from shardline.client import Client
from shardline.errors import (AbortedError, AlreadyExistsError, CancelledError, DataLossError,
                              DeadlineExceededError, FailedPreconditionError, InternalError,
                              InvalidArgumentError, NotFoundError, OutOfRangeError,
                              PermissionDeniedError, ResourceExhaustedError, ShardlineError,
                              UnauthenticatedError, UnavailableError, UnimplementedError,
                              UnknownError, from_rpc_error)

__all__ = [
    "__version__",
    "Client",
    "Connection",
    "Stream",
    "ShardlineError",
    "InvalidArgumentError",
    "NotFoundError",
    "AlreadyExistsError",
    "PermissionDeniedError",
    "UnauthenticatedError",
    "FailedPreconditionError",
    "AbortedError",
    "UnavailableError",
    "DeadlineExceededError",
    "ResourceExhaustedError",
    "OutOfRangeError",
    "InternalError",
    "UnimplementedError",
    "CancelledError",
    "DataLossError",
    "UnknownError",
    "from_rpc_error",
]
