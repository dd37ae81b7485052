"""shardline.torch.Store: a torch.distributed.Store on the coordinator's
generation-scoped key-value store (proto/shardline/v1/rendezvous.proto).

    store = Store(member, scope="", timeout=datetime.timedelta(seconds=300))
    store.set("k", b"v"); store.get("k")  # -> b"v" (waits until set)

Keys live in (job, generation of the member's latest join, scope): a new
generation starts empty, and when the generation ends every call (and every
blocked get/wait) fails with shardline.errors.AbortedError, so no rank waits
on a dead round. Values are bytes (str is encoded as UTF-8); counters made
by add() read as their decimal text ("3"), as torch's TCPStore does.

Limits (the coordinator's, rendezvous.proto): scope <= 256 bytes, key
1..512 bytes, value <= 1 MiB, 65536 keys per scope, 256 MiB per generation;
over a limit is InvalidArgumentError / ResourceExhaustedError naming it.

Method names: torch calls a Python Store through its C++ trampoline by the
Python names (set, get, add, check, wait, compare_set, delete_key,
num_keys); the C++ spellings (compareSet, deleteKey, getNumKeys) are
aliases, as are multi_get / multi_set / append for torch >= 2.

Thread-safety: a Store may be used from any number of threads (each call is
one RPC on a thread-safe connection).

Errors (shardline.errors): DeadlineExceededError when get/wait time out
(the message names the keys), AbortedError when the generation ended or the
member was declared lost, UnavailableError when the coordinator cannot be
reached, FailedPreconditionError from add() on a value that is not an
integer.
"""

from __future__ import annotations

import datetime
import json
import math
import os
from typing import Iterable, List, Optional, Union

import torch.distributed as dist
from google.protobuf import duration_pb2

from shardline import errors
from shardline.v1 import rendezvous_pb2

# The coordinator's kMaxWaitTimeout (rendezvous.proto): a longer wait is cut
# into calls of at most this many seconds.
_MAX_WAIT_S = 3600.0
# Extra gRPC deadline over the wait a blocking call asks for (seconds): the
# coordinator answers DEADLINE_EXCEEDED itself at the wait's end; this only
# covers the answer's way back.
_DEADLINE_SLACK_S = 2.0

Bytes = Union[bytes, bytearray, str]


# The longest store timeout (seconds): a day, as shardline.Connection's.
_MAX_TIMEOUT_S = 86400.0


def _to_bytes(value: Bytes, what: str = "value") -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"{what} must be bytes or str, not {type(value).__name__}")


def _key(key) -> str:
    if not isinstance(key, str):
        raise TypeError(f"key must be str, not {type(key).__name__}")
    return key


def _keys(keys) -> List[str]:
    if isinstance(keys, (str, bytes)):
        raise TypeError("keys must be a list of str, not one string (wrap it: [key])")
    return [_key(k) for k in keys]


def _seconds(timeout, what: str = "timeout") -> float:
    if isinstance(timeout, datetime.timedelta):
        value = timeout.total_seconds()
    elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        value = float(timeout)
    else:
        raise TypeError(f"{what} must be a timedelta or seconds, not {type(timeout).__name__}")
    if not (value > 0 and math.isfinite(value)) or value > _MAX_TIMEOUT_S:
        raise ValueError(f"{what}={value!r} s: give a positive timeout of at most "
                         f"{_MAX_TIMEOUT_S:.0f} s")
    return value


class Store(dist.Store):
    """A torch.distributed.Store over Shardline's rendezvous service.

    Args:
      member: a joined shardline.member.Member (its connection, identity,
        member token and generation are used; the generation is fixed when
        the Store is made).
      scope: the namespace inside the generation (0..256 bytes).
      timeout: default wait of get() and wait() (timedelta or seconds);
        torch's default is 300 s.
    """

    def __init__(self, member=None, scope: str = "",
                 timeout: Union[datetime.timedelta, float] = datetime.timedelta(seconds=300),
                 *, connection=None, fence=None, token: Optional[str] = None):
        super().__init__()
        if not isinstance(scope, str):
            raise TypeError(f"scope must be str, not {type(scope).__name__}")
        if len(scope.encode("utf-8")) > 256:
            raise ValueError(f"scope is {len(scope.encode('utf-8'))} bytes; at most 256")
        if member is not None:
            connection, fence, token = member._conn, member.fence(), member.token
        if connection is None or fence is None:
            raise ValueError("give a joined member, or connection and fence")
        self._conn = connection
        self._fence = fence
        self._token = token
        self._scope = scope
        self.set_timeout(datetime.timedelta(seconds=_seconds(timeout)))

    # The environment variable through which a torchrun agent on the
    # "shardline" backend hands its round's store to its workers.
    ENV = "SHARDLINE_TORCH_STORE"

    def to_env(self) -> str:
        """This Store as the value of Store.ENV (JSON: addresses, TLS
        files, identity, generation, scope, token). The token is the
        member's secret: the environment of the worker processes only."""
        f = self._fence
        return json.dumps({
            "addresses": self._conn.addresses, "tls": self._conn.tls_files(),
            "job_id": f.worker.job_id, "worker_id": f.worker.worker_id,
            "incarnation": f.worker.incarnation, "generation": f.generation,
            "scope": self._scope, "token": self._token or ""})

    @classmethod
    def from_env(cls, scope: Optional[str] = None,
                 timeout: Union[datetime.timedelta, float] = datetime.timedelta(seconds=300)):
        """The store a torchrun agent handed its workers (Store.ENV), in
        `scope` (default: a scope of its own beside the agent's). Raises
        KeyError naming Store.ENV when the process was not started by such an
        agent."""
        from shardline._connection import Connection
        from shardline.v1 import common_pb2
        raw = os.environ.get(cls.ENV)
        if not raw:
            raise KeyError(f"{cls.ENV} is not set: this process was not started by torchrun "
                           "with --rdzv_backend shardline (python3 -m shardline.torchrun)")
        try:
            d = json.loads(raw)
            tls = d.get("tls") or {}
            addresses, own_scope = d["addresses"], str(d["scope"])
            fence = common_pb2.Fence(generation=int(d["generation"]))
            fence.worker.job_id = str(d["job_id"])
            fence.worker.worker_id = str(d["worker_id"])
            fence.worker.incarnation = int(d["incarnation"])
            tls_options = {k: v for k, v in tls.items() if v}
            token = d.get("token") or None
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{cls.ENV} is not what a shardline torchrun agent writes "
                             f"({type(e).__name__}: {e})") from None
        conn = Connection(addresses, **tls_options)
        return cls(scope=own_scope + "/workers" if scope is None else scope, timeout=timeout,
                   connection=conn, fence=fence, token=token)

    @property
    def generation(self) -> int:
        """The generation whose keys this Store reads and writes."""
        return self._fence.generation

    def _call(self, method: str, request, timeout: Optional[float] = None):
        """One RPC; a call that does not wait is bounded by the store's
        timeout, as torch's TCPStore bounds every operation."""
        if timeout is None:
            timeout = self._wait_s()
        return self._conn.call(method, request, timeout=timeout, token=self._token)

    def _wait_s(self, timeout=None) -> float:
        return _seconds(self.timeout if timeout is None else timeout)

    # --- torch.distributed.Store -----------------------------------------

    def set(self, key: str, value: Bytes) -> None:
        self._call("RendezvousService.KvSet", rendezvous_pb2.KvSetRequest(
            fence=self._fence, scope=self._scope, key=_key(key), value=_to_bytes(value)))

    def get(self, key: str) -> bytes:
        """Returns the value, waiting up to the store's timeout for the key."""
        key = _key(key)
        left = self._wait_s()
        while True:
            wait = min(left, _MAX_WAIT_S)
            d = duration_pb2.Duration()
            d.FromNanoseconds(int(wait * 1e9))
            try:
                resp = self._call("RendezvousService.KvGet", rendezvous_pb2.KvGetRequest(
                    fence=self._fence, scope=self._scope, key=key, wait=True, timeout=d),
                    timeout=wait + _DEADLINE_SLACK_S)
                return resp.value
            except errors.DeadlineExceededError:
                left -= wait
                if left <= 0:
                    raise

    def add(self, key: str, value: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"value must be int, not {type(value).__name__}")
        resp = self._call("RendezvousService.KvAdd", rendezvous_pb2.KvAddRequest(
            fence=self._fence, scope=self._scope, key=_key(key), delta=value))
        return resp.value

    def compare_set(self, key: str, expected_value: Bytes, desired_value: Bytes) -> bytes:
        """torch's compare_set: stores desired_value if the key holds
        expected_value; an empty expected_value also matches a missing key.
        Returns the value after the call; for a missing key with a non-empty
        expected_value, returns expected_value (torch's TCPStore does the
        same) and stores nothing."""
        expected = _to_bytes(expected_value, "expected_value")
        desired = _to_bytes(desired_value, "desired_value")
        req = rendezvous_pb2.KvCompareAndSetRequest(fence=self._fence, scope=self._scope,
                                                    key=_key(key), desired=desired)
        if expected:
            req.expected = expected
        resp = self._call("RendezvousService.KvCompareAndSet", req)
        if resp.swapped:
            return desired
        if not resp.HasField("current"):
            return expected  # missing key, non-empty expected
        if not expected and resp.current == b"":
            # The key exists and holds b"" == expected: swap on its value.
            req.expected = b""
            resp = self._call("RendezvousService.KvCompareAndSet", req)
            return desired if resp.swapped else resp.current
        return resp.current

    def wait(self, keys: Iterable[str], timeout=None) -> None:
        """Waits until every key exists (default: the store's timeout)."""
        keys = _keys(keys)
        if not keys:
            return
        left = self._wait_s(timeout)
        while True:
            wait = min(left, _MAX_WAIT_S)
            d = duration_pb2.Duration()
            d.FromNanoseconds(int(wait * 1e9))
            try:
                self._call("RendezvousService.KvWait", rendezvous_pb2.KvWaitRequest(
                    fence=self._fence, scope=self._scope, keys=keys, timeout=d),
                    timeout=wait + _DEADLINE_SLACK_S)
                return
            except errors.DeadlineExceededError:
                left -= wait
                if left <= 0:
                    raise

    def check(self, keys: Iterable[str]) -> bool:
        """True when every key exists (no waiting)."""
        for key in _keys(keys):
            resp = self._call("RendezvousService.KvGet", rendezvous_pb2.KvGetRequest(
                fence=self._fence, scope=self._scope, key=key, wait=False))
            if not resp.found:
                return False
        return True

    def num_keys(self) -> int:
        resp = self._call("RendezvousService.KvNumKeys", rendezvous_pb2.KvNumKeysRequest(
            fence=self._fence, scope=self._scope))
        return resp.num_keys

    def delete_key(self, key: str) -> bool:
        resp = self._call("RendezvousService.KvDelete", rendezvous_pb2.KvDeleteRequest(
            fence=self._fence, scope=self._scope, key=_key(key)))
        return resp.deleted

    # --- torch >= 2 extensions -------------------------------------------

    def multi_get(self, keys: List[str]) -> List[bytes]:
        return [self.get(k) for k in keys]

    def multi_set(self, keys: List[str], values: List[Bytes]) -> None:
        if len(keys) != len(values):
            raise ValueError(f"multi_set got {len(keys)} keys and {len(values)} values")
        for k, v in zip(keys, values):
            self.set(k, v)

    def append(self, key: str, value: Bytes) -> None:
        """Appends to the key's value atomically (compare-and-set loop)."""
        key, extra = _key(key), _to_bytes(value)
        while True:
            resp = self._call("RendezvousService.KvGet", rendezvous_pb2.KvGetRequest(
                fence=self._fence, scope=self._scope, key=key, wait=False))
            req = rendezvous_pb2.KvCompareAndSetRequest(
                fence=self._fence, scope=self._scope, key=key,
                desired=(resp.value if resp.found else b"") + extra)
            if resp.found:
                req.expected = resp.value
            if self._call("RendezvousService.KvCompareAndSet", req).swapped:
                return


    # C++ spellings.
    compareSet = compare_set
    deleteKey = delete_key
    getNumKeys = num_keys
