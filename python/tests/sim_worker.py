"""A simulated worker over shardline.Connection: joins a job, holds its Session, heartbeats.

What a real worker does with the coordinator (coordinator.proto WorkerService),
without training: enough to form a job's generation in a test.

    w = SimWorker(address, "demo", "w0", incarnation=100, token=worker_token)
    w.join(); w.open_session(); w.start_heartbeats(0.5)
    assignment = w.assignment(wait=True, timeout=20)
    ...
    w.close()
"""

import threading
from typing import List, Optional

from google.protobuf import duration_pb2

import shardline
from shardline.v1 import common_pb2, session_pb2


class SimWorker:
    def __init__(self, address: str, job_id: str, worker_id: str, incarnation: int,
                 token: Optional[str] = None) -> None:
        self.connection = shardline.Connection(address, token=token)
        self.identity = common_pb2.WorkerIdentity(job_id=job_id, worker_id=worker_id,
                                                  incarnation=incarnation)
        self.token = token or ""  # the job token, then the member token
        self.generation = 0
        self.messages: List[session_pb2.SessionMessage] = []
        self.session_error: Optional[BaseException] = None
        self._cond = threading.Condition()
        self._session: Optional[shardline.Stream] = None
        self._stop = threading.Event()
        self._threads: List[threading.Thread] = []
        self.state = session_pb2.WORKER_STATE_WAITING

    def fence(self) -> common_pb2.Fence:
        return common_pb2.Fence(worker=self.identity, generation=self.generation)

    def join(self) -> session_pb2.JoinJobResponse:
        response = self.connection.call("WorkerService.JoinJob", session_pb2.JoinJobRequest(
            worker=self.identity, host="host-" + self.identity.worker_id, device="cpu"),
            token=self.token)
        self.generation = response.generation
        if response.member_token:
            self.token = response.member_token
        return response

    def open_session(self, timeout: float = 10.0) -> None:
        """Opens the Session stream on a reader thread; waits for SessionOpened (or raises the stream's error)."""
        self._session = self.connection.stream(
            "WorkerService.Session", session_pb2.SessionRequest(worker=self.identity),
            token=self.token)

        def read():
            try:
                for message in self._session:
                    with self._cond:
                        self.messages.append(message)
                        self._cond.notify_all()
            except shardline.ShardlineError as e:
                with self._cond:
                    self.session_error = e
                    self._cond.notify_all()

        t = threading.Thread(target=read, daemon=True)
        t.start()
        self._threads.append(t)
        with self._cond:
            if not self._cond.wait_for(
                    lambda: self.session_error is not None
                    or any(m.HasField("opened") for m in self.messages), timeout):
                raise TimeoutError("no SessionOpened within %gs" % timeout)
            if self.session_error is not None:
                raise self.session_error

    def start_heartbeats(self, interval: float) -> None:
        def beat():
            while not self._stop.wait(interval):
                try:
                    self.connection.call("WorkerService.Heartbeat", session_pb2.HeartbeatRequest(
                        fence=self.fence(), state=self.state), token=self.token)
                except shardline.ShardlineError:
                    pass  # ABORTED / FAILED_PRECONDITION once the job moves on: keep beating

        t = threading.Thread(target=beat, daemon=True)
        t.start()
        self._threads.append(t)

    def assignment(self, wait: bool = True, timeout: float = 20.0) -> session_pb2.Assignment:
        request = session_pb2.GetAssignmentRequest(
            fence=self.fence(), wait=wait, timeout=duration_pb2.Duration(seconds=int(timeout)))
        a = self.connection.call("WorkerService.GetAssignment", request, timeout=timeout + 5,
                                 token=self.token)
        self.generation = a.generation
        self.state = session_pb2.WORKER_STATE_TRAINING
        return a

    def close(self) -> None:
        self._stop.set()
        if self._session is not None:
            self._session.cancel()
        for t in self._threads:
            t.join(10)
        self.connection.close()
