"""Typed errors of the Shardline client: one exception class per gRPC status code.

Every failed call of :class:`shardline.Connection` and :class:`shardline.Client`
raises a :class:`ShardlineError` subclass chosen by the status code, e.g.::

    try:
        client.get_job("nope")
    except shardline.NotFoundError as e:
        print(e.code, e.message)   # StatusCode.NOT_FOUND, the coordinator's message

The codes and their causes for each RPC are listed in
proto/shardline/v1/coordinator.proto ("Errors" and each RPC's comment).

Messages follow the C++ client's (client/connection.h FromGrpcStatus): the
coordinator's own message unchanged, except that

* a transport failure (connection refused, name that does not resolve, TLS
  handshake) becomes :class:`UnavailableError` "cannot reach the coordinator
  at ADDRESS: CAUSE; ...";
* a deadline that passed without an answer says which call and how long;
* UNAUTHENTICATED and PERMISSION_DENIED add which token to pass.
"""

from __future__ import annotations

from typing import Dict, Optional, Type

import grpc

__all__ = [
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
    "error_class",
    "from_rpc_error",
]

# The metadata key of a follower's leader hint (common/grpc_status.h
# kLeaderMetadataKey; coordinator.proto "Replicas").
LEADER_METADATA_KEY = "shardline-leader"


class ShardlineError(Exception):
    """A failed call to the coordinator.

    Attributes:
        code: the gRPC status code (``grpc.StatusCode``).
        message: the coordinator's message (str), with the additions the
            module docstring lists for transport, deadline and token errors.
        address: the coordinator address the call went to last ("HOST:PORT"),
            or None when no call was made.
        details: the status message exactly as gRPC reported it (str).

    ``str(e)`` is ``"<CODE_NAME>: <message>"``, plus ``" (at ADDRESS)"`` when
    the message does not name the address already.
    """

    #: The status code of the subclass (UNKNOWN for the base class).
    CODE: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(
        self,
        message: str,
        *,
        code: Optional[grpc.StatusCode] = None,
        address: Optional[str] = None,
        details: Optional[str] = None,
    ) -> None:
        self.code = code if code is not None else type(self).CODE
        self.message = message
        self.address = address
        self.details = message if details is None else details
        super().__init__(str(self))

    def __str__(self) -> str:
        text = "%s: %s" % (self.code.name, self.message)
        if self.address and self.address not in self.message:
            text += " (at %s)" % self.address
        return text

    def __reduce__(self):
        return (_rebuild, (type(self), self.message, self.code, self.address, self.details))


def _rebuild(cls, message, code, address, details):
    return cls(message, code=code, address=address, details=details)


class InvalidArgumentError(ShardlineError):
    """INVALID_ARGUMENT: a request field is missing, malformed or over its limit (the message names it)."""

    CODE = grpc.StatusCode.INVALID_ARGUMENT


class NotFoundError(ShardlineError):
    """NOT_FOUND: no such job, worker, parameter or checkpoint."""

    CODE = grpc.StatusCode.NOT_FOUND


class AlreadyExistsError(ShardlineError):
    """ALREADY_EXISTS: e.g. a job_id that exists with a different spec."""

    CODE = grpc.StatusCode.ALREADY_EXISTS


class PermissionDeniedError(ShardlineError):
    """PERMISSION_DENIED: a valid token that may not make this call (e.g. a worker token on an admin RPC)."""

    CODE = grpc.StatusCode.PERMISSION_DENIED


class UnauthenticatedError(ShardlineError):
    """UNAUTHENTICATED: no token, or one the coordinator does not know."""

    CODE = grpc.StatusCode.UNAUTHENTICATED


class FailedPreconditionError(ShardlineError):
    """FAILED_PRECONDITION: the job is not in a state for this call (e.g. not formed yet, or finished)."""

    CODE = grpc.StatusCode.FAILED_PRECONDITION


class AbortedError(ShardlineError):
    """ABORTED: a stale fence; the generation changed: re-join (coordinator.proto "Fencing")."""

    CODE = grpc.StatusCode.ABORTED


class UnavailableError(ShardlineError):
    """UNAVAILABLE: the coordinator cannot be reached, is starting or stopping, or is not the leader."""

    CODE = grpc.StatusCode.UNAVAILABLE


class DeadlineExceededError(ShardlineError):
    """DEADLINE_EXCEEDED: no answer within the call's timeout, or a wait the request asked for ran out."""

    CODE = grpc.StatusCode.DEADLINE_EXCEEDED


class ResourceExhaustedError(ShardlineError):
    """RESOURCE_EXHAUSTED: a coordinator limit (jobs, keys, watchers, message size) or too many bad tokens."""

    CODE = grpc.StatusCode.RESOURCE_EXHAUSTED


class OutOfRangeError(ShardlineError):
    """OUT_OF_RANGE: e.g. a WatchJob after_sequence no longer retained, or a counter overflow."""

    CODE = grpc.StatusCode.OUT_OF_RANGE


class InternalError(ShardlineError):
    """INTERNAL: a broken coordinator invariant (a bug; report it)."""

    CODE = grpc.StatusCode.INTERNAL


class UnimplementedError(ShardlineError):
    """UNIMPLEMENTED: the coordinator does not have this RPC (an older version), or the server is not a coordinator."""

    CODE = grpc.StatusCode.UNIMPLEMENTED


class CancelledError(ShardlineError):
    """CANCELLED: the call was cancelled."""

    CODE = grpc.StatusCode.CANCELLED


class DataLossError(ShardlineError):
    """DATA_LOSS: a checkpoint's pieces leave a gap or overlap, or a shard file is missing."""

    CODE = grpc.StatusCode.DATA_LOSS


class UnknownError(ShardlineError):
    """UNKNOWN, or a code without a class of its own."""

    CODE = grpc.StatusCode.UNKNOWN


_CLASSES: Dict[grpc.StatusCode, Type[ShardlineError]] = {
    cls.CODE: cls
    for cls in (
        InvalidArgumentError,
        NotFoundError,
        AlreadyExistsError,
        PermissionDeniedError,
        UnauthenticatedError,
        FailedPreconditionError,
        AbortedError,
        UnavailableError,
        DeadlineExceededError,
        ResourceExhaustedError,
        OutOfRangeError,
        InternalError,
        UnimplementedError,
        CancelledError,
        DataLossError,
        UnknownError,
    )
}


def error_class(code: grpc.StatusCode) -> Type[ShardlineError]:
    """The ShardlineError subclass of `code` (UnknownError for codes without one, e.g. OK)."""
    return _CLASSES.get(code, UnknownError)


def _transport_reason(message: str, tls: bool) -> str:
    """The transport's reason in a few words, from gRPC's UNAVAILABLE message.

    Empty when the message is the coordinator's own (starting, stopping, not
    the leader). Mirrors client/connection.cc TransportReason.
    """
    m = message.lower()
    if "connection refused" in m:
        return "connection refused"
    if any(s in m for s in ("dns resolution failed", "name not found", "domain name not found",
                            "name or service not known")):
        return "the host name does not resolve"
    names_tls = "ssl" in m or "tls" in m or "certificate" in m
    if "handshake" in m and not names_tls and not tls:
        return "could not connect (nothing listening there, or a firewall)"
    if "handshake" in m or names_tls:
        return ("TLS handshake failed (%s); check tls_ca, tls_cert, tls_key and tls_server_name "
                "against the coordinator's certificates" % message)
    if "failed parsing http/2" in m:
        return "the server there does not speak gRPC (is this the coordinator's port?)"
    if "no route to host" in m:
        return "no route to host"
    if "network is unreachable" in m:
        return "network is unreachable"
    if any(s in m for s in ("connection reset", "socket closed", "connection closed",
                            "broken pipe")):
        if tls:
            return "the connection was closed"
        return "the connection was closed (if the coordinator serves TLS, pass tls_ca)"
    if "timed out" in m or "timeout" in m:
        return "connection timed out"
    if any(s in m for s in ("failed to connect", "connections to all backends failing",
                            "no such file or directory")):
        return message
    return ""


def _format_seconds(seconds: float) -> str:
    return ("%gs" % seconds) if seconds >= 1 else ("%gms" % (seconds * 1000))


def make_error(
    code: grpc.StatusCode,
    details: str,
    address: Optional[str],
    *,
    rpc: Optional[str] = None,
    timeout: Optional[float] = None,
    tls: bool = False,
    has_token: Optional[bool] = None,
) -> ShardlineError:
    """The ShardlineError of a status (code, details) from a call to `address`.

    `rpc` ("Service.Method"), `timeout` (seconds), `tls` and `has_token`
    (whether the call carried a token; None: unknown) only refine the message.
    """
    details = details or ""
    where = address or "the configured address"
    call = rpc or "the call"
    message = details
    if code == grpc.StatusCode.UNAVAILABLE:
        reason = _transport_reason(details, tls)
        if reason:
            message = ("cannot reach the coordinator at %s: %s; start shardline-coordinator or "
                       "check the address given to shardline.Client / Connection" % (where, reason))
        else:
            message = "the coordinator at %s is unavailable: %s%s" % (
                where, details, "" if "retry" in details else "; retry shortly")
    elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
        if not details or details == "Deadline Exceeded":
            within = " within %s (timeout)" % _format_seconds(timeout) if timeout else ""
            message = ("no answer from the coordinator at %s to %s%s; check that it is running and "
                       "reachable, or give a longer timeout" % (where, call, within))
    elif code == grpc.StatusCode.UNAUTHENTICATED:
        if has_token is False:
            message = ("the coordinator at %s requires a token (%s); pass token= or token_file="
                       % (where, details))
        else:
            message = "%s; check the token given by token= or token_file=" % details
    elif code == grpc.StatusCode.PERMISSION_DENIED:
        if "member token" in details or "member_token" in details:
            message = details
        elif "admin token" in details:
            message = "%s (token= or token_file=)" % details
        else:
            message = ("%s; %s needs the coordinator's admin token (a job's worker token only "
                       "reads its own job)" % (details, call))
    elif code == grpc.StatusCode.UNIMPLEMENTED:
        if details.startswith("Received http2 header with status"):
            message = "the server at %s is not a Shardline coordinator (%s)" % (where, details)
        else:
            message = ("the coordinator at %s does not implement %s (%s); is it an older version "
                       "than this client?" % (where, call, details))
    elif code == grpc.StatusCode.CANCELLED:
        message = "%s was cancelled%s" % (call, ": " + details if details else "")
    elif not details:
        message = "%s failed with %s and no message from the coordinator" % (call, code.name)
    return error_class(code)(message, code=code, address=address, details=details)


def from_rpc_error(
    err: grpc.RpcError,
    address: Optional[str],
    *,
    rpc: Optional[str] = None,
    timeout: Optional[float] = None,
    tls: bool = False,
    has_token: Optional[bool] = None,
) -> ShardlineError:
    """The ShardlineError of a failed gRPC call (a ``grpc.RpcError`` that is a ``grpc.Call``).

    `address`: the coordinator the call went to ("HOST:PORT") or None. The
    keyword arguments only refine the message (see make_error). An RpcError
    without a status (not a grpc.Call) becomes UnknownError.
    """
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = err.details() if hasattr(err, "details") else str(err)
    if code is None:
        code = grpc.StatusCode.UNKNOWN
    return make_error(code, details or "", address, rpc=rpc, timeout=timeout, tls=tls,
                      has_token=has_token)
