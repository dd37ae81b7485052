"""Where the coordinator is and how to talk to it: the one path of every call.

:class:`Connection` holds one gRPC channel per coordinator replica and sends
each call to the replica it believes leads, as the C++ client does
(client/coordinator_channels.h, client/grpc_call.h):

* an UNAVAILABLE answer with the leader's address in the ``shardline-leader``
  metadata (a follower's "not the leader: ..."): nothing was done; the call
  goes again at once to that address (after 3 such hops in a row, after a
  backoff);
* an UNAVAILABLE without it, with several replicas: the next replica becomes
  the guess (for later calls too), and this call goes there again only when
  that is safe: the request was never sent (refused, unresolvable), a replica
  said "not the leader", or the RPC is idempotent (coordinator.proto
  "Retries": every RPC except RendezvousService.KvAdd,
  RendezvousService.KvCompareAndSet and WorkerService.ReportError). Each
  replica once, then a backoff of 50 ms doubling to 500 ms before each further
  round, while the deadline allows;
* with several replicas, an attempt first waits up to 1 s for a replica whose
  channel is still connecting (a host that does not answer), then moves on;
* a unary call's CANCELLED that the client did not cause (the connection is
  not closed): the coordinator ended the call without an answer, as a leader
  stepping down does with the calls still open after its shutdown grace; it
  is an UNAVAILABLE without a hint (the call may have been done);
* DEADLINE_EXCEEDED with several replicas: the call fails, and later calls
  start at the next replica;
* with one address: one attempt, nothing retried;
* CoordinatorService (every replica serves it) goes to any replica.

One deadline covers every attempt of a call.
"""

from __future__ import annotations

import atexit
import math
import os
import random
import re
import ssl
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import grpc

from shardline import _stubs
from shardline.errors import LEADER_METADATA_KEY, ShardlineError, make_error

__all__ = ["Connection", "Stream", "MAX_ADDRESSES", "MAX_MESSAGE_BYTES", "DEFAULT_TIMEOUT"]

#: The most coordinator replica addresses a Connection takes (client/connection.h).
MAX_ADDRESSES = 16
#: Leader addresses learned from hints beyond the configured ones.
MAX_LEARNED_ADDRESSES = 16
#: The largest request or response (coordinator.proto kMaxMessageBytes).
MAX_MESSAGE_BYTES = 64 << 20
#: Default deadline of a unary call, seconds.
DEFAULT_TIMEOUT = 10.0

_MAX_IMMEDIATE_HOPS = 3
_RETRY_INITIAL = 0.05
_RETRY_MAX = 0.5
_CONNECT_WAIT = 1.0
_UNCONNECTED = "connection timed out (no connection within "

# RPCs a retry could do twice (coordinator.proto "Retries").
_NOT_IDEMPOTENT = frozenset({
    "RendezvousService.KvAdd",
    "RendezvousService.KvCompareAndSet",
    "WorkerService.ReportError",
})
# Services every replica serves, leader or not.
_ANY_REPLICA = frozenset({"CoordinatorService"})

# Open connections, closed at exit: a gRPC channel whose connectivity was
# watched (Attempts.await_connectable) and is still open when the interpreter
# finalizes blocks its exit (grpc/_channel.py waits for the frozen polling
# thread).
_OPEN: "weakref.WeakSet[Connection]" = weakref.WeakSet()


@atexit.register
def _close_open_connections() -> None:
    for conn in list(_OPEN):
        conn.close()


_URI_PREFIXES = ("unix:", "dns:", "ipv4:", "ipv6:")
_HOST_PORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[^\s/:\[\]]+):([0-9]+)$")


def _check_address(address: str, what: str) -> None:
    if address.startswith(_URI_PREFIXES):
        return
    m = _HOST_PORT.match(address)
    if m and 0 < int(m.group(2)) <= 65535:
        return
    raise ValueError("%s=%r is not HOST:PORT; give e.g. '127.0.0.1:7070', 'coord.example:7070' or "
                     "'[::1]:7070'" % (what, address))


def parse_addresses(addresses: Union[str, Sequence[str]]) -> List[str]:
    """The replica addresses of "A" or "A,B,C" or a sequence of such strings.

    ValueError naming `addresses`: an empty list or entry, an entry that is
    not HOST:PORT (or a gRPC URI target unix:, dns:, ipv4:, ipv6:), the same
    address twice, more than MAX_ADDRESSES.
    """
    if isinstance(addresses, str):
        parts = addresses.split(",")
    elif isinstance(addresses, (list, tuple)):
        parts = list(addresses)
        for p in parts:
            if not isinstance(p, str):
                raise ValueError("addresses must be strings 'HOST:PORT'; got %r" % (p,))
    else:
        raise ValueError("addresses must be 'HOST:PORT[,HOST:PORT...]' or a list of 'HOST:PORT'; "
                         "got %r" % (addresses,))
    if len(parts) > MAX_ADDRESSES:
        raise ValueError("addresses lists %d addresses; at most %d coordinator replicas are "
                         "supported" % (len(parts), MAX_ADDRESSES))
    out: List[str] = []
    for i, raw in enumerate(parts):
        address = raw.strip()
        if not address:
            if len(parts) == 1:
                raise ValueError("addresses is empty; give the coordinator's HOST:PORT, e.g. "
                                 "'127.0.0.1:7070', or every replica's, comma-separated")
            raise ValueError("addresses=%r has an empty address at position %d; give "
                             "HOST:PORT,HOST:PORT,... without empty entries" % (addresses, i + 1))
        _check_address(address, "addresses" if len(parts) == 1 else "addresses[%d]" % i)
        if address in out:
            raise ValueError("addresses lists %s twice; give each coordinator replica once"
                             % address)
        out.append(address)
    return out


# The longest token sent (bytes): well inside gRPC's 8 KiB metadata limit.
MAX_TOKEN_BYTES = 1024


def check_token(token: str, what: str) -> str:
    """`token` stripped; ValueError naming `what` unless printable ASCII without spaces."""
    if not isinstance(token, str):
        raise ValueError("%s must be a str; got %s" % (what, type(token).__name__))
    token = token.strip()
    if len(token) > MAX_TOKEN_BYTES:
        raise ValueError("%s is %d bytes; at most %d (a Shardline token is 64 hex digits; an "
                         "admin token 16 or more bytes)" % (what, len(token), MAX_TOKEN_BYTES))
    for c in token:
        if not 0x21 <= ord(c) <= 0x7E:
            raise ValueError("%s holds a space or control character; a token is printable ASCII "
                             "without spaces (check for a pasted line break)" % what)
    return token


# The longest timeout a call may be given (seconds).
MAX_TIMEOUT_S = 86400


def check_timeout(timeout: Any, what: str = "timeout") -> float:
    """`timeout` as float seconds; ValueError naming `what` unless a positive finite number."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise ValueError("%s=%r is not a number of seconds; give e.g. %s=30" % (what, timeout, what))
    if not (timeout > 0 and math.isfinite(timeout)):
        raise ValueError("%s=%r is not a positive number of seconds; give e.g. %s=30"
                         % (what, timeout, what))
    if timeout > MAX_TIMEOUT_S:
        # gRPC's deadline arithmetic overflows far beyond this (a deadline of
        # 1e10 s fails every call at once).
        raise ValueError("%s=%r s is over %d s (one day); give a shorter timeout"
                         % (what, timeout, MAX_TIMEOUT_S))
    return float(timeout)


def _read_file(path: Any, option: str) -> bytes:
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise ValueError("%s needs a file path; got %r" % (option, path))
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError("cannot read %s %r: %s" % (option, str(path), e.strerror)) from None


def _read_pem(path: Any, option: str, kind: str) -> bytes:
    data = _read_file(path, option)
    if b"-----BEGIN " not in data or kind.encode() not in data:
        raise ValueError("%s file %r is not PEM holding a %s (no '-----BEGIN ...%s-----' line)"
                         % (option, str(path), kind.lower(), kind))
    return data


class _Replica:
    """One coordinator address: its position, channel and service stubs."""

    def __init__(self, index: int, address: str, channel: grpc.Channel) -> None:
        self.index = index
        self.address = address
        self.channel = channel
        self._stubs: Dict[str, Any] = {}
        self._lock = threading.Lock()
        # Until when gRPC's connectivity-polling thread may still run after
        # the last watch (it stops within 0.2 s of the unsubscribe); a channel
        # closed before that makes the thread fail with "Channel closed!".
        self.polling_until = 0.0

    def method(self, service: str, method: str):
        with self._lock:
            stub = self._stubs.get(service)
            if stub is None:
                stub = getattr(_stubs.coordinator_pb2_grpc, service + "Stub")(self.channel)
                self._stubs[service] = stub
        return getattr(stub, method)

    def watch(self, done: Callable[[grpc.ChannelConnectivity], bool],
              timeout: float) -> Tuple[bool, List[grpc.ChannelConnectivity]]:
        """Watches the channel, asking it to connect, until done(state) holds or
        `timeout` seconds pass; returns whether it held and the states reported
        (the first is the state at the start). gRPC notices a finished connect
        only while something polls the channel, and this watch polls
        (common/grpc_backup_poll.h)."""
        settled = threading.Event()
        seen: List[grpc.ChannelConnectivity] = []

        def on_state(state: grpc.ChannelConnectivity) -> None:
            seen.append(state)
            if done(state):
                settled.set()

        self.channel.subscribe(on_state, try_to_connect=True)
        try:
            settled.wait(max(0.0, timeout))
        finally:
            self.channel.unsubscribe(on_state)
            self.polling_until = time.monotonic() + 0.5
        return settled.is_set(), seen


def _metadata_value(metadata, key: str) -> str:
    for k, v in metadata or ():
        if k == key:
            return (v.decode() if isinstance(v, bytes) else v).strip()
    return ""


class _Status:
    """A failed attempt: code, message and the leader hint it carried."""

    def __init__(self, code: grpc.StatusCode, details: str, leader_hint: str = "") -> None:
        self.code = code
        self.details = details or ""
        self.leader_hint = leader_hint

    @classmethod
    def of(cls, err: grpc.RpcError) -> "_Status":
        code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
        details = err.details() if hasattr(err, "details") else str(err)
        hint = ""
        for getter in ("trailing_metadata", "initial_metadata"):
            if not hint and hasattr(err, getter):
                try:
                    hint = _metadata_value(getattr(err, getter)(), LEADER_METADATA_KEY)
                except Exception:  # a call without metadata
                    hint = ""
        return cls(code or grpc.StatusCode.UNKNOWN, details or "", hint)

    def unconnected(self) -> bool:
        return self.details.startswith(_UNCONNECTED)

    def server_ended(self) -> "_Status":
        """A CANCELLED the client did not cause as UNAVAILABLE (client/grpc_call.cc ServerEnded)."""
        if self.code != grpc.StatusCode.CANCELLED:
            return self
        return _Status(grpc.StatusCode.UNAVAILABLE,
                       "the coordinator ended the call without an answer (CANCELLED: %s), as a "
                       "replica that stops serving does; the call may have been done" % self.details,
                       "")

    def nothing_done(self) -> bool:
        """A "not the leader" answer, or the request never left (client/grpc_call.cc Classify)."""
        if self.code != grpc.StatusCode.UNAVAILABLE:
            return False
        lower = self.details.lower()
        return bool(self.leader_hint) or lower.startswith("not the leader") or any(
            s in lower for s in ("failed to connect to all addresses", "connection refused",
                                 "dns resolution failed", "empty address list", "no connection within"))


class _Attempts:
    """The attempts of one call: where the next goes, whether there is one. One thread."""

    def __init__(self, conn: "Connection", method: str, deadline: Optional[float],
                 cancelled: Optional[threading.Event] = None) -> None:
        self.conn = conn
        self.method = method
        self.leader_only = method.split(".", 1)[0] not in _ANY_REPLICA
        self.idempotent = method not in _NOT_IDEMPOTENT
        self.deadline = deadline
        self.cancelled = cancelled
        self.replica = conn._leader()
        self.delay = _RETRY_INITIAL
        self.hops = 0
        self.round = [self.replica.index]
        self.tried: List[str] = []
        self.last_answer: Optional[Tuple[_Status, str]] = None

    def remaining(self) -> Optional[float]:
        return None if self.deadline is None else self.deadline - time.monotonic()

    def expired(self) -> bool:
        r = self.remaining()
        return r is not None and r <= 0

    def await_connectable(self) -> Optional[_Status]:
        """With several replicas: waits up to 1 s while the replica's channel connects."""
        if self.conn._size() <= 1:
            return None
        wait = _CONNECT_WAIT
        r = self.remaining()
        if r is not None:
            wait = max(0.0, min(wait, r))
        settled, _ = self.replica.watch(
            lambda state: state in (grpc.ChannelConnectivity.READY,
                                    grpc.ChannelConnectivity.TRANSIENT_FAILURE,
                                    grpc.ChannelConnectivity.SHUTDOWN), wait)
        if settled:
            return None
        return _Status(grpc.StatusCode.UNAVAILABLE, "%s%gs)" % (_UNCONNECTED, _CONNECT_WAIT))

    def _wait(self) -> bool:
        delay = self.delay * (1 + random.uniform(-0.5, 0.5))
        self.delay = min(self.delay * 2, _RETRY_MAX)
        r = self.remaining()
        if r is not None and delay >= r:
            return False
        if self.cancelled is not None:
            if self.cancelled.wait(delay):
                return False
        else:
            time.sleep(delay)
        self.hops = 0
        self.round = []
        return True

    def _note(self, status: _Status) -> None:
        if self.replica.address not in self.tried:
            self.tried.append(self.replica.address)
        if not status.unconnected():
            self.last_answer = (status, self.replica.address)

    def again(self, status: _Status) -> bool:
        """After a failed attempt: updates the shared leader guess; True: try again at self.replica."""
        self._note(status)
        several = self.conn._size() > 1
        if status.code == grpc.StatusCode.DEADLINE_EXCEEDED and self.leader_only and several:
            self.conn._move_on(self.replica.index)
            return False
        if status.code != grpc.StatusCode.UNAVAILABLE:
            return False
        if self.leader_only and status.leader_hint:
            leader = self.conn._follow_hint(status.leader_hint)
            if leader is not None:
                if self.hops >= _MAX_IMMEDIATE_HOPS:
                    if not self._wait():
                        return False
                else:
                    self.hops += 1
                self.replica = leader
                return not self.expired()
        if self.leader_only:
            nxt = self.conn._move_on(self.replica.index)
        else:
            nxt = self.conn._at((self.replica.index + 1) % self.conn._size())
        if self.conn._size() <= 1:
            return False
        if not (not self.leader_only or self.idempotent or status.nothing_done()):
            return False
        if nxt.index in self.round and not self._wait():
            return False
        self.round.append(nxt.index)
        self.replica = nxt
        return not self.expired()

    def observe(self, status: _Status) -> None:
        """Like again, for a failure that must not be retried (a stream that delivered messages)."""
        self._note(status)
        if not self.leader_only:
            return
        if status.code == grpc.StatusCode.DEADLINE_EXCEEDED and self.conn._size() > 1:
            self.conn._move_on(self.replica.index)
        elif status.code == grpc.StatusCode.UNAVAILABLE:
            if not (status.leader_hint and self.conn._follow_hint(status.leader_hint)):
                self.conn._move_on(self.replica.index)

    def succeeded(self) -> None:
        if self.leader_only:
            self.conn._succeeded(self.replica.index)

    def error(self, last: _Status, timeout: Optional[float], token: str) -> ShardlineError:
        status, address = last, self.replica.address
        if last.unconnected() and self.last_answer is not None:
            status, address = self.last_answer
        err = make_error(status.code, status.details, address, rpc=self.method, timeout=timeout,
                         tls=self.conn._tls, has_token=bool(token))
        if len(self.tried) > 1 and status.code in (grpc.StatusCode.UNAVAILABLE,
                                                   grpc.StatusCode.DEADLINE_EXCEEDED):
            err = type(err)("%s (replicas tried: %s)" % (err.message, ", ".join(self.tried)),
                            code=err.code, address=err.address, details=err.details)
        return err


class Stream:
    """The messages of a server-streaming call (WatchJob, Session).

    Iterate it (``for message in stream``); iteration blocks for the next
    message, ends when the coordinator ends the stream with OK or when
    cancel() was called, and raises a ShardlineError when the stream fails.
    While the stream has delivered nothing it is opened again where a
    follower points (or on the next replica, when the open failed without
    anything being done), within the connection's timeout; once messages
    came, a break is raised (resume with, e.g., WatchJob's after_sequence).

    cancel() may be called from any thread, also while another thread
    iterates; iteration is for one thread at a time.
    """

    def __init__(self, conn: "Connection", method: str, request, token: str) -> None:
        self._conn = conn
        self._method = method
        self._request = request
        self._token = token
        self._cancelled = threading.Event()
        self._lock = threading.Lock()
        self._call = None
        self._done = False
        self._delivered = False
        self._attempts: Optional[_Attempts] = None  # made by the first open

    def __iter__(self) -> "Stream":
        return self

    def _open(self):
        """The call of the next attempt (None: cancelled); raises when no attempt is left."""
        if self._attempts is None:
            self._attempts = _Attempts(self._conn, self._method,
                                       time.monotonic() + self._conn.timeout, self._cancelled)
        while True:
            unconnected = self._attempts.await_connectable()
            if unconnected is not None:
                if self._attempts.again(unconnected):
                    continue
                self._done = True
                raise self._attempts.error(unconnected, None, self._token)
            callable_ = self._attempts.replica.method(*self._method.split("."))
            with self._lock:
                if self._cancelled.is_set():
                    return None
                self._call = callable_(self._request, metadata=self._conn._metadata(self._token))
                return self._call

    def __next__(self):
        while True:
            if self._done or self._cancelled.is_set():
                self._finish()
                raise StopIteration
            with self._lock:
                call = self._call
            if call is None:
                call = self._open()
                if call is None:
                    continue
            try:
                message = next(call)
            except StopIteration:
                self._attempts.succeeded()
                self._done = True
                raise
            except grpc.RpcError as err:
                if self._cancelled.is_set():
                    self._done = True
                    raise StopIteration from None
                status = _Status.of(err)
                with self._lock:
                    self._call = None
                if self._delivered:
                    self._attempts.observe(status)
                elif self._attempts.again(status):
                    continue
                self._done = True
                raise self._attempts.error(status, None, self._token) from None
            if not self._delivered:
                self._delivered = True
                self._attempts.succeeded()
            return message

    def _finish(self) -> None:
        with self._lock:
            call, self._call = self._call, None
        if call is not None:
            call.cancel()

    def cancel(self) -> None:
        """Ends the stream: the iteration in progress (if any) and later ones stop (StopIteration)."""
        self._cancelled.set()
        self._finish()

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc) -> None:
        self.cancel()


class Connection:
    """A connection to the Shardline coordinator (one replica or several).

    Args:
        addresses: "HOST:PORT", "HOST1:PORT,HOST2:PORT,..." (every replica of
            a highly available coordinator, proto/shardline/v1/coordinator.proto
            "Replicas"), or a list of "HOST:PORT" (IPv6 as "[::1]:7070"; gRPC
            targets unix:, dns:, ipv4:, ipv6: too). At most 16.
        token: bearer token (the admin token, a job's worker token or a
            member token) sent as "authorization: Bearer <token>" on every
            call; None or "" sends no authorization metadata.
        token_file: a file whose first line is the token, instead of `token`.
        tls_ca: PEM file of the CA that signed the coordinator's certificate;
            turns TLS on.
        tls_cert, tls_key: PEM client certificate and its private key for
            mutual TLS (both or neither); turn TLS on (without tls_ca, the
            system roots verify the coordinator).
        tls_server_name: the name to expect in the coordinator's certificate
            when it differs from the host of the address (TLS only).
        timeout: deadline of each unary call in seconds (positive, finite);
            call(timeout=...) overrides it per call.

    Raises:
        ValueError naming the option: an address list parse_addresses
        refuses; both token and token_file; a token_file that cannot be read
        or whose first line is empty; a token with spaces or control
        characters; tls_cert without tls_key or the reverse; a TLS file that
        cannot be read, is not PEM of its kind or (tls_cert/tls_key) whose
        key is not the certificate's; tls_server_name without TLS; a timeout
        that is not a positive finite number.

    Nothing is sent before the first call (channels connect lazily).

    Thread-safety: a Connection is thread-safe: any number of threads may
    call(), stream() and close() on one. A Stream is iterated by one thread
    at a time; its cancel() may come from any thread.
    """

    def __init__(
        self,
        addresses: Union[str, Sequence[str]],
        *,
        token: Optional[str] = None,
        token_file: Optional[str] = None,
        tls_ca: Optional[str] = None,
        tls_cert: Optional[str] = None,
        tls_key: Optional[str] = None,
        tls_server_name: Optional[str] = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self._configured = parse_addresses(addresses)
        self._tls_files = {"tls_ca": tls_ca, "tls_cert": tls_cert, "tls_key": tls_key,
                           "tls_server_name": tls_server_name}
        if token is not None and token_file is not None:
            raise ValueError("give token or token_file, not both")
        if token_file is not None:
            text = _read_file(token_file, "token_file").decode("utf-8", "replace")
            first = text.splitlines()[0] if text.splitlines() else ""
            if not first.strip():
                raise ValueError("token_file %r is empty; its first line must hold the token"
                                 % str(token_file))
            self._token = check_token(first, "token_file")
        else:
            self._token = check_token(token, "token") if token is not None else ""
        self.timeout = check_timeout(timeout)

        for option, value in (("tls_ca", tls_ca), ("tls_cert", tls_cert), ("tls_key", tls_key)):
            if value is not None and not str(value):
                raise ValueError("%s needs a file path" % option)
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("mutual TLS needs both tls_cert and tls_key (the client certificate "
                             "and its key)")
        self._tls = tls_ca is not None or tls_cert is not None
        self._options: List[Tuple[str, Any]] = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.enable_retries", 0),
            # A coordinator restarting on its state file is back within
            # seconds: reconnect 100 ms after a failure at first, at most 1 s
            # apart. (Not grpc.min_reconnect_backoff_ms, which is also the
            # connect timeout: at 100 ms a handshake over a slower link
            # would fail.)
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000),
        ]
        if tls_server_name is not None:
            if not self._tls:
                raise ValueError("tls_server_name needs TLS: give tls_ca (or tls_cert and tls_key) "
                                 "too")
            if not isinstance(tls_server_name, str) or not re.match(r"^[A-Za-z0-9.*-]+$",
                                                                    tls_server_name):
                raise ValueError("tls_server_name=%r is not a host name" % (tls_server_name,))
            self._options.append(("grpc.ssl_target_name_override", tls_server_name))
        self._credentials = None
        if self._tls:
            root = _read_pem(tls_ca, "tls_ca", "CERTIFICATE") if tls_ca is not None else None
            if root is not None:
                try:
                    ssl.create_default_context(cadata=root.decode("ascii", "replace"))
                except (ssl.SSLError, ValueError) as e:
                    raise ValueError("tls_ca file %r holds no usable certificate: %s"
                                     % (str(tls_ca), e)) from None
            cert = key = None
            if tls_cert is not None:
                cert = _read_pem(tls_cert, "tls_cert", "CERTIFICATE")
                key = _read_pem(tls_key, "tls_key", "PRIVATE KEY")
                try:
                    ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(str(tls_cert), str(tls_key))
                except ssl.SSLError as e:
                    raise ValueError("tls_key file %r is not the private key of tls_cert file %r, or "
                                     "one of them is unparsable: %s"
                                     % (str(tls_key), str(tls_cert), e)) from None
            self._credentials = grpc.ssl_channel_credentials(
                root_certificates=root, private_key=key, certificate_chain=cert)

        self._lock = threading.Lock()
        self._closed = False
        self._replicas: List[_Replica] = [self._new_replica(i, a)
                                          for i, a in enumerate(self._configured)]
        self._leader_index = 0
        _OPEN.add(self)

    # ---- channels and the leader guess (client/coordinator_channels.h) ----

    def _new_replica(self, index: int, address: str) -> _Replica:
        options = list(self._options)
        if len(self._configured) > 1:
            # A replica that stops answering without closing its connections
            # must not hold calls for a whole deadline while another leads.
            options += [
                ("grpc.keepalive_time_ms", 2000),
                ("grpc.keepalive_timeout_ms", 2000),
                ("grpc.keepalive_permit_without_calls", 0),
                ("grpc.http2.max_pings_without_data", 0),
            ]
        if self._credentials is not None:
            channel = grpc.secure_channel(address, self._credentials, options=options)
        else:
            channel = grpc.insecure_channel(address, options=options)
        return _Replica(index, address, channel)

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("the Connection is closed")

    def _leader(self) -> _Replica:
        with self._lock:
            self._check_open()
            return self._replicas[self._leader_index]

    def _at(self, index: int) -> _Replica:
        with self._lock:
            return self._replicas[index]

    def _size(self) -> int:
        with self._lock:
            return len(self._replicas)

    def _follow_hint(self, address: str) -> Optional[_Replica]:
        try:
            _check_address(address, "leader hint")
        except ValueError:
            return None
        with self._lock:
            for r in self._replicas:
                if r.address == address:
                    self._leader_index = r.index
                    return r
            if self._closed or len(self._replicas) >= len(self._configured) + MAX_LEARNED_ADDRESSES:
                return None
            r = self._new_replica(len(self._replicas), address)
            self._replicas.append(r)
            self._leader_index = r.index
            return r

    def _move_on(self, index: int) -> _Replica:
        with self._lock:
            if self._leader_index == index:
                self._leader_index = (index + 1) % len(self._replicas)
            return self._replicas[self._leader_index]

    def _succeeded(self, index: int) -> None:
        with self._lock:
            self._leader_index = index

    @property
    def addresses(self) -> List[str]:
        """The configured replica addresses, in the order given."""
        return list(self._configured)

    def tls_files(self) -> dict:
        """The TLS options given (tls_ca, tls_cert, tls_key, tls_server_name;
        None where not given): what another process needs to open the same
        connection (shardline.torch.Store.to_env)."""
        return {k: (None if v is None else str(v)) for k, v in self._tls_files.items()}

    @property
    def leader(self) -> str:
        """The address this connection believes leads (the next call goes there first)."""
        with self._lock:
            return self._replicas[self._leader_index].address

    # ---- calls ----

    def _metadata(self, token: str):
        return (("authorization", "Bearer " + token),) if token else None

    def _resolve(self, method: str, request, streaming: bool):
        if not isinstance(method, str) or method.count(".") != 1:
            raise ValueError("method=%r is not 'Service.Method', e.g. 'JobService.GetJob'" % (method,))
        service_name, method_name = method.split(".")
        service = _stubs.coordinator_pb2.DESCRIPTOR.services_by_name.get(service_name)
        if service is None:
            raise ValueError("method=%r: no service %r; the services are %s" % (
                method, service_name,
                ", ".join(sorted(_stubs.coordinator_pb2.DESCRIPTOR.services_by_name))))
        desc = service.methods_by_name.get(method_name)
        if desc is None:
            raise ValueError("method=%r: %s has no method %r; it has %s" % (
                method, service_name, method_name, ", ".join(m.name for m in service.methods)))
        if desc.server_streaming != streaming:
            raise ValueError("%s is %s; use Connection.%s()" % (
                method, "server-streaming" if desc.server_streaming else "unary",
                "stream" if desc.server_streaming else "call"))
        got = getattr(request, "DESCRIPTOR", None)
        if got is None or got.full_name != desc.input_type.full_name:
            raise TypeError("%s takes a %s; got %s" % (
                method, desc.input_type.full_name,
                got.full_name if got is not None else type(request).__name__))

    def _call_token(self, token: Optional[str]) -> str:
        return self._token if token is None else check_token(token, "token")

    def call(self, method: str, request, *, timeout: Optional[float] = None,
             token: Optional[str] = None):
        """Sends one unary RPC and returns its response message.

        Args:
            method: "Service.Method" of proto/shardline/v1/coordinator.proto,
                e.g. "JobService.GetJob", "WorkerService.JoinJob",
                "RendezvousService.KvGet".
            request: the method's request message (e.g. GetJobRequest).
            timeout: deadline of the call in seconds, across every replica it
                tries (None: the connection's timeout). A call that waits on
                the coordinator (KvGet/KvWait/Barrier/GetAssignment with a
                wait) needs the wait plus a margin.
            token: bearer token for this call only, instead of the
                connection's ("" sends none).

        Raises:
            ShardlineError subclass of the status (shardline.errors), e.g.
            NotFoundError for an unknown job, UnavailableError when no
            replica could be reached or none leads, DeadlineExceededError
            when nothing answered within `timeout`.
            ValueError: an unknown method, a streaming one, a bad timeout or
            token, or a closed connection. TypeError: the wrong request type.
        """
        self._resolve(method, request, streaming=False)
        seconds = self.timeout if timeout is None else check_timeout(timeout)
        call_token = self._call_token(token)
        service, name = method.split(".")
        attempts = _Attempts(self, method, time.monotonic() + seconds)
        while True:
            unconnected = attempts.await_connectable()
            if unconnected is not None:
                if attempts.again(unconnected):
                    continue
                raise attempts.error(unconnected, seconds, call_token)
            remaining = max(attempts.remaining() or 0.0, 0.001)
            try:
                response = attempts.replica.method(service, name)(
                    request, timeout=remaining, metadata=self._metadata(call_token))
            except grpc.RpcError as err:
                status = _Status.of(err)
                if not self._closed:  # close() cancels the calls in flight itself
                    status = status.server_ended()
                if attempts.again(status):
                    continue
                raise attempts.error(status, seconds, call_token) from None
            except ValueError:
                # grpc raises ValueError on a channel closed under the call.
                self._check_open()
                raise
            attempts.succeeded()
            return response

    def stream(self, method: str, request, *, token: Optional[str] = None) -> Stream:
        """Opens a server-streaming RPC ("JobService.WatchJob", "WorkerService.Session").

        Returns a Stream: iterate it for the messages; it raises a
        ShardlineError subclass when the stream fails and stops after
        cancel(). The stream has no deadline; the connection's timeout bounds
        only the attempts to open it. `token` as in call(). Nothing is sent
        before the first next(). ValueError/TypeError as call().
        """
        self._resolve(method, request, streaming=True)
        self._check_open()
        return Stream(self, method, request, self._call_token(token))

    def await_reconnect(self, timeout: float) -> bool:
        """After a call failed UNAVAILABLE: waits up to `timeout` seconds for the
        leader guess's channel to become ready, making it connect and watching
        the attempts meanwhile. gRPC notices a finished connect only while
        something polls the channel, and calls on a failed channel fail at once
        without polling; this watch polls, so a restarted coordinator is
        reached as soon as it serves, whatever gRPC's backup poller does
        (common/grpc_backup_poll.h). True when the channel was not ready and
        now is; False at once when it was ready already (the call failed for
        another reason), and after `timeout` otherwise."""
        ready, seen = self._leader().watch(
            lambda state: state == grpc.ChannelConnectivity.READY, timeout)
        # The first state reported is the current one: READY then means it was
        # ready before the wait.
        return ready and bool(seen) and seen[0] != grpc.ChannelConnectivity.READY

    def close(self) -> None:
        """Closes every channel; open streams and calls in flight end (CANCELLED). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            replicas = list(self._replicas)
        wait = max([r.polling_until for r in replicas]) - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        for r in replicas:
            r.channel.close()

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return "Connection(%r, tls=%s)" % (",".join(self._configured), self._tls)
