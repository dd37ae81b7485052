"""A process's membership in a Shardline job: join, session, heartbeats.

What a torchrun agent (or any trainer that is not Shardline's) needs to be
a member of an external job (proto/shardline/v1/job.proto ExternalWorkload):

    conn = shardline.Connection("coord:7070", token=job_token)
    member = Member(conn, "my-job", "node-3")
    member.join()                          # JoinJob, Session stream, heartbeats
    assignment = member.wait_assignment(timeout=600)   # rank, world_size
    store = member.store()                 # shardline.torch.Store of that generation
    ...
    if member.reform_pending: ...          # the coordinator ended the generation
    member.leave("done")

Lifecycle: join() once, then any number of rounds of rejoin() /
restart_generation() and wait_assignment(); leave() (or complete()) ends it.
The member keeps a Session stream open (so the coordinator declares it
LOST at once when the process dies) and heartbeats every
spec.elastic.heartbeat_interval from a background thread.

Thread-safety: every method may be called from any thread; the state
(generation, assignment, reform_pending, closed) is guarded by one lock.

Errors: every call raises shardline.errors.ShardlineError subclasses with
the coordinator's code and message (see each method).
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
from typing import Callable, Optional

from shardline import errors
import grpc

from shardline.v1 import common_pb2, job_pb2, session_pb2
from google.protobuf import duration_pb2

# The longest one GetAssignment call waits before the member looks again at
# its state (seconds): a re-form or a stop is noticed between slices.
_ASSIGNMENT_SLICE_S = 2.0
# After an UNAVAILABLE heartbeat, how long at most the heartbeat thread
# watches the connection (seconds).
_RECONNECT_WATCH_S = 1.0
# Session stream reconnect backoff (seconds).
_RECONNECT_MIN_S = 0.05
_RECONNECT_MAX_S = 2.0

_TERMINAL = (job_pb2.JOB_PHASE_COMPLETED, job_pb2.JOB_PHASE_FAILED,
             job_pb2.JOB_PHASE_CANCELLED)


def default_worker_id() -> str:
    """A worker_id unique per process on this host: "<host>-<pid>"."""
    host = socket.gethostname() or "host"
    return f"{host}-{os.getpid()}"[:128]


def _duration(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


class Member:
    """One incarnation of a worker slot in a job (see the module docstring).

    Args:
      connection: a shardline.Connection to the coordinator (one address or
        several replicas); its token is the job's worker token (or the admin
        token, or none on a coordinator without auth).
      job_id: the job to join.
      worker_id: the slot name, 1..128 printable ASCII bytes; default
        "<host>-<pid>".
      incarnation: non-zero 64-bit id of this process; default random.
      host: reported host name (default the machine's), at most 255 bytes.
      device: "cpu" or "cuda:<n>", for listings.
      backend: common_pb2.BACKEND_GLOO or BACKEND_NCCL.
      on_reform: called (from a background thread, without the lock held)
        with the new generation when the coordinator ends the member's
        generation, so a caller can react at once.
    """

    def __init__(self, connection, job_id: str, worker_id: Optional[str] = None, *,
                 incarnation: Optional[int] = None, host: Optional[str] = None,
                 device: str = "cpu", backend: int = common_pb2.BACKEND_GLOO,
                 on_reform: Optional[Callable[[int], None]] = None):
        if not job_id:
            raise ValueError("job_id is empty; give the id of an existing job (shardctl job list)")
        self._conn = connection
        self.job_id = job_id
        self.worker_id = worker_id or default_worker_id()
        self.incarnation = incarnation or (secrets.randbits(63) | 1)
        self.host = host or socket.gethostname()
        self.device = device
        self.backend = backend
        self._on_reform = on_reform
        self._lock = threading.Condition()
        self._member_token: Optional[str] = None
        self._generation = 0          # the generation of our latest JoinJob
        self._latest_generation = 0   # the newest generation the coordinator told us of
        self._assignment: Optional[session_pb2.Assignment] = None
        self._spec: Optional[job_pb2.JobSpec] = None
        self._phase = job_pb2.JOB_PHASE_UNSPECIFIED
        self._lost = False            # declared LOST (or replaced): re-join first
        self._closed_reason: Optional[str] = None  # STOP seen: the job ended
        self._left = False
        self._step = 0
        self._state = session_pb2.WORKER_STATE_WAITING
        self._threads: list[threading.Thread] = []
        self._stream = None
        self._stop = threading.Event()

    # ---------------------------------------------------------------- state

    @property
    def generation(self) -> int:
        """The generation of the latest join (the one fences carry)."""
        with self._lock:
            return self._generation

    @property
    def spec(self) -> Optional[job_pb2.JobSpec]:
        with self._lock:
            return self._spec

    @property
    def token(self) -> Optional[str]:
        """The token this member's calls carry: its member token, else the
        connection's token."""
        with self._lock:
            return self._member_token

    @property
    def reform_pending(self) -> bool:
        """True once the coordinator has ended the member's generation (a
        peer lost or left, a grow, a reported error) or declared the member
        LOST: the caller should stop using the generation's store and
        rejoin(). Learnt from the Session stream at once, or from a
        heartbeat answer."""
        with self._lock:
            return self._lost or self._latest_generation > self._generation

    @property
    def closed(self) -> bool:
        """True once the job ended (STOP seen, or a terminal phase read)."""
        with self._lock:
            return self._closed_reason is not None

    @property
    def closed_reason(self) -> Optional[str]:
        with self._lock:
            return self._closed_reason

    def fence(self, generation: Optional[int] = None) -> common_pb2.Fence:
        with self._lock:
            g = self._generation if generation is None else generation
        f = common_pb2.Fence(generation=g)
        f.worker.job_id = self.job_id
        f.worker.worker_id = self.worker_id
        f.worker.incarnation = self.incarnation
        return f

    def set_progress(self, step: int, state: int) -> None:
        """What the next heartbeat reports (step count, WorkerState)."""
        with self._lock:
            self._step = max(0, int(step))
            self._state = state

    # ---------------------------------------------------------------- calls

    def _call(self, method: str, request, timeout: Optional[float] = None):
        """One RPC as this member; `timeout` None: the connection's timeout."""
        return self._conn.call(method, request, timeout=timeout, token=self.token)

    def join(self) -> session_pb2.JoinJobResponse:
        """JoinJob (first time or again), then make sure the Session stream
        and the heartbeat thread run.

        Raises: NotFoundError (no such job), FailedPreconditionError (the job
        ended, or other backend), PermissionDenied/Unauthenticated (token),
        InvalidArgumentError (worker_id, host, device), UnavailableError.
        """
        req = session_pb2.JoinJobRequest(host=self.host[:255], device=self.device,
                                         backend=self.backend)
        req.worker.job_id = self.job_id
        req.worker.worker_id = self.worker_id
        req.worker.incarnation = self.incarnation
        resp = self._call("WorkerService.JoinJob", req)
        with self._lock:
            if resp.member_token:
                self._member_token = resp.member_token
            self._generation = resp.generation
            self._latest_generation = max(self._latest_generation, resp.generation)
            self._spec = resp.spec
            self._phase = resp.phase
            self._lost = False
            self._left = False
            if self._assignment is not None and self._assignment.generation != resp.generation:
                self._assignment = None
            self._lock.notify_all()
        self._start_threads()
        return resp

    def rejoin(self) -> int:
        """Joins the job's current generation (after reform_pending) and
        returns it."""
        return self.join().generation

    def restart_generation(self, why: str) -> int:
        """Ends the member's running generation on its own initiative
        (ReportError ABORTED with `why`): used when a torchrun agent
        restarts its workers while its peers still run. Then joins the next
        generation and returns it. If the generation had already ended,
        just re-joins."""
        if not self.reform_pending:
            req = session_pb2.ReportErrorRequest(fence=self.fence(),
                                                 code=grpc.StatusCode.ABORTED.value[0],
                                                 message=why[:4096], operation="restart workers")
            try:
                self._call("WorkerService.ReportError", req)
            except (errors.AbortedError, errors.FailedPreconditionError):
                pass  # already ended, or we hold no rank in it: re-joining is enough
        return self.rejoin()

    def wait_assignment(self, timeout: float) -> session_pb2.Assignment:
        """Waits until the member holds a rank in a formed generation and
        returns that Assignment (generation, rank, world_size). A spare keeps
        waiting for a later generation that includes it; a generation that
        ends before it forms is re-joined.

        Raises: DeadlineExceededError after `timeout` seconds (the message
        says how many members the job had), FailedPreconditionError when the
        job ended, AbortedError when the member was replaced by another
        incarnation, UnavailableError.
        """
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if self._closed_reason is not None:
                    raise errors.FailedPreconditionError(
                        f"job {self.job_id} has ended: {self._closed_reason}")
                a = self._assignment
                if a is not None and a.generation == self._generation and not a.spare \
                        and not self.reform_pending:
                    return a
                stale = self.reform_pending
            if stale:
                self.rejoin()
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                raise errors.DeadlineExceededError(
                    f"job {self.job_id}: generation {self.generation} did not include "
                    f"worker {self.worker_id} within {timeout:.0f} s ({self._members_text()})")
            wait = min(_ASSIGNMENT_SLICE_S, left)
            req = session_pb2.GetAssignmentRequest(fence=self.fence(), wait=True,
                                                   timeout=_duration(wait))
            try:
                a = self._call("WorkerService.GetAssignment", req,
                               timeout=wait + self._conn.timeout)
            except errors.DeadlineExceededError:
                continue
            except errors.AbortedError:
                # The generation ended while we waited, or we were declared
                # LOST: re-join (a replaced incarnation fails in join()).
                with self._lock:
                    self._lost = True
                continue
            with self._lock:
                if a.generation == self._generation:
                    self._assignment = a
            if a.spare:
                # Wait for the generation to end (a directive on the stream)
                # rather than polling GetAssignment, which answers at once.
                with self._lock:
                    self._lock.wait_for(lambda: self.reform_pending or self._closed_reason,
                                        timeout=min(_ASSIGNMENT_SLICE_S,
                                                    max(0.0, deadline - time.monotonic())))

    def leave(self, reason: str) -> None:
        """LeaveJob and stop the background threads. Harmless twice."""
        with self._lock:
            already = self._left or self._generation == 0
            self._left = True
        try:
            if not already:
                self._call("WorkerService.LeaveJob",
                           session_pb2.LeaveJobRequest(fence=self.fence(), reason=reason[:1024]))
        except (errors.AbortedError, errors.FailedPreconditionError, errors.NotFoundError):
            pass
        finally:
            self.close()

    def complete(self, reason: str) -> job_pb2.Job:
        """CompleteJob: marks the external job COMPLETED (torchrun's
        set_closed). Raises FailedPreconditionError for a GPT job or a
        FAILED/CANCELLED one."""
        return self._call("WorkerService.CompleteJob",
                          session_pb2.CompleteJobRequest(fence=self.fence(), reason=reason[:1024]))

    def job(self) -> job_pb2.Job:
        """GetJob of the member's job (the member token admits it)."""
        job = self._call("JobService.GetJob", job_pb2.GetJobRequest(job_id=self.job_id))
        if job.phase in _TERMINAL:
            with self._lock:
                if self._closed_reason is None:
                    self._closed_reason = (job_pb2.JobPhase.Name(job.phase) + ": " +
                                           job.phase_reason)
                self._lock.notify_all()
        return job

    def close(self) -> None:
        """Stops the heartbeat and session threads (no RPC)."""
        self._stop.set()
        with self._lock:
            stream = self._stream
            self._lock.notify_all()
        if stream is not None:
            stream.cancel()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=5)

    # ------------------------------------------------------ background work

    def _members_text(self) -> str:
        try:
            members = self._call("JobService.ListMembers",
                                 session_pb2.ListMembersRequest(job_id=self.job_id), timeout=3)
            live = sum(1 for m in members.members if m.state in (
                session_pb2.MEMBER_STATE_JOINING, session_pb2.MEMBER_STATE_ACTIVE,
                session_pb2.MEMBER_STATE_SPARE))
            spec = self.spec
            need = spec.elastic.min_workers if spec is not None else 0
            return f"{live} live members, min_workers={need}"
        except errors.ShardlineError as e:
            return f"members unknown: {e}"

    def _start_threads(self) -> None:
        with self._lock:
            alive = [t for t in self._threads if t.is_alive()]
            self._threads = alive
            names = {t.name for t in alive}
        self._stop.clear()
        for name, target in (("shardline-session", self._session_loop),
                             ("shardline-heartbeat", self._heartbeat_loop)):
            if name not in names:
                t = threading.Thread(target=target, name=name, daemon=True)
                t.start()
                with self._lock:
                    self._threads.append(t)

    def _note_generation(self, generation: int) -> None:
        callback = None
        with self._lock:
            if generation > self._latest_generation:
                self._latest_generation = generation
                callback = self._on_reform
            self._lock.notify_all()
        if callback is not None and generation > self.generation:
            callback(generation)

    def _note_closed(self, reason: str) -> None:
        with self._lock:
            if self._closed_reason is None:
                self._closed_reason = reason
            self._lock.notify_all()

    def _session_loop(self) -> None:
        backoff = _RECONNECT_MIN_S
        while not self._stop.is_set():
            req = session_pb2.SessionRequest()
            req.worker.job_id = self.job_id
            req.worker.worker_id = self.worker_id
            req.worker.incarnation = self.incarnation
            try:
                stream = self._conn.stream("WorkerService.Session", req, token=self.token)
                with self._lock:
                    self._stream = stream
                for msg in stream:
                    backoff = _RECONNECT_MIN_S
                    kind = msg.WhichOneof("payload")
                    if kind == "opened":
                        self._note_generation(msg.opened.generation)
                    elif kind == "assignment":
                        with self._lock:
                            if msg.assignment.generation == self._generation:
                                self._assignment = msg.assignment
                            self._lock.notify_all()
                    elif kind == "directive":
                        action = msg.directive.WhichOneof("action")
                        if action == "restart_at_generation":
                            self._note_generation(msg.directive.restart_at_generation.generation)
                        elif action == "stop":
                            stop = msg.directive.stop
                            self._note_closed(job_pb2.JobPhase.Name(stop.phase) + ": " +
                                              stop.reason)
                # Ended with OK: after STOP or LeaveJob.
                return
            except errors.AbortedError:
                # Declared LOST or replaced: re-join first (next_rendezvous).
                with self._lock:
                    self._lost = True
                    self._lock.notify_all()
                return
            except errors.FailedPreconditionError as e:
                self._note_closed(e.message)
                return
            except errors.CancelledError:
                return
            except errors.ShardlineError:
                if self._stop.wait(backoff):
                    return
                backoff = min(_RECONNECT_MAX_S, backoff * 2)

    def _heartbeat_loop(self) -> None:
        wait = None  # None: one interval
        while True:
            spec = self.spec
            interval = 5.0
            if spec is not None and spec.elastic.HasField("heartbeat_interval"):
                interval = max(0.01, spec.elastic.heartbeat_interval.ToNanoseconds() / 1e9)
            if self._stop.wait(interval if wait is None else wait):
                return
            wait = None
            with self._lock:
                if self._left:
                    return
                step, state = self._step, self._state
            req = session_pb2.HeartbeatRequest(fence=self.fence(), step=step, state=state)
            try:
                resp = self._call("WorkerService.Heartbeat", req)
                if resp.directive.WhichOneof("action") == "stop":
                    stop = resp.directive.stop
                    self._note_closed(job_pb2.JobPhase.Name(stop.phase) + ": " + stop.reason)
                    return
            except errors.AbortedError:
                # Our fence is stale: the generation ended (the stream has
                # probably said so already) or we were declared LOST.
                self._note_generation(req.fence.generation + 1)
            except errors.FailedPreconditionError as e:
                self._note_closed(e.message)
                return
            except errors.UnavailableError:
                # Unreachable for now: watch the connection for part of the
                # interval and beat again as soon as a restarted coordinator
                # can be reached (Connection.await_reconnect), at most one
                # interval after this beat otherwise.
                start = time.monotonic()
                if self._conn.await_reconnect(min(interval, _RECONNECT_WATCH_S)):
                    wait = 0.0
                else:
                    wait = max(0.0, interval - (time.monotonic() - start))
            except errors.ShardlineError:
                pass  # the stream and the next beat tell

