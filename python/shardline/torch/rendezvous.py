"""torchrun's rendezvous on the Shardline coordinator: backend "shardline".

    python3 -m shardline.torchrun --nnodes 2:4 --nproc_per_node 1 \\
        --rdzv_backend shardline --rdzv_endpoint coord1:7070,coord2:7070 \\
        --rdzv_id my-job --rdzv_conf token_file=/etc/shardline/job.token \\
        --max_restarts 3 train.py

How torch's elastic agent maps onto Shardline (proto/shardline/v1/job.proto
ExternalWorkload):
  - each torchrun agent is a member of an external job whose job_id is the
    --rdzv_id; --nnodes MIN:MAX are its min_workers / max_workers;
  - a rendezvous round is a generation: next_rendezvous() joins the current
    generation, waits until it forms, and returns (store, node rank, node
    count); the store is a shardline.torch.Store of that generation, so a
    round never sees the keys of an earlier one;
  - num_nodes_waiting() is non-zero as soon as the coordinator has ended
    the agent's generation (a node's Session stream broke, a heartbeat
    timed out, a node joined below max_nodes, a peer restarted): the
    Session stream says so at once, so the agent restarts its workers at
    its next monitor tick, not after a keep-alive window;
  - a lost agent is fenced: its store calls fail with ABORTED, and it comes
    back through JoinJob into a later round;
  - set_closed() marks the job COMPLETED (CompleteJob); is_closed() is true
    once the job is COMPLETED, FAILED or CANCELLED; shutdown() leaves the
    job (LeaveJob), and the job completes when every node of the running
    round has left.

The job is created on first use when it does not exist and the connection
may create jobs (a coordinator without auth, or the admin token):
external {framework: "torchrun"} with the rendezvous' min/max nodes and the
rdzv_conf timings below. With auth, create it beforehand (`shardctl job
create deploy/jobs/torchrun-external.yaml --id my-job`) and give
the agents its worker token.

rdzv_conf keys (all optional):
  token_file       file holding the bearer token (job worker token or admin)
  tls_ca, tls_cert, tls_key, tls_server_name   as shardctl's flags
  worker_id        this agent's member name (default "<host>-<pid>")
  join_timeout     seconds to wait for a round to include this agent (600)
  last_call_timeout  seconds a first round waits for more than min nodes (30)
  heartbeat_interval, heartbeat_timeout   seconds, for a job created here (1, 10)
  call_timeout     seconds one coordinator call may take (10)
  (torchrun also passes its legacy `timeout`, the rendezvous timeout, to
  every backend; like c10d, this one takes join_timeout instead.)
  create           "false" to never create the job
"""

from __future__ import annotations

import logging
import math
import os
import threading
from typing import Optional

from torch.distributed.elastic.rendezvous import api as rdzv_api

from shardline import errors
from shardline._connection import Connection, parse_addresses
from shardline.member import Member
from shardline.torch.store import Store
from shardline.v1 import job_pb2, session_pb2

BACKEND_NAME = "shardline"
_TERMINAL = (job_pb2.JOB_PHASE_COMPLETED, job_pb2.JOB_PHASE_FAILED,
             job_pb2.JOB_PHASE_CANCELLED)


# The rdzv_conf keys this backend reads (the module docstring).
CONF_KEYS = ("token_file", "tls_ca", "tls_cert", "tls_key", "tls_server_name", "worker_id",
             "join_timeout", "last_call_timeout", "heartbeat_interval", "heartbeat_timeout",
             "call_timeout", "create")
# Keys torchrun itself puts into the config of every backend.
_TORCH_KEYS = ("timeout", "rank", "local_addr", "is_host", "read_timeout",
               "keep_alive_interval", "keep_alive_max_attempt")
# The longest duration an rdzv_conf key may give (seconds): a day.
_MAX_SECONDS = 86400.0

log = logging.getLogger(__name__)


def _seconds(params, key: str, default: float) -> float:
    raw = params.get(key, None)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ValueError(f"rdzv_conf {key}={raw!r} is not a number of seconds") from None
    if not (value > 0 and math.isfinite(value)) or value > _MAX_SECONDS:
        raise ValueError(f"rdzv_conf {key}={raw!r}: give a positive number of seconds, at most "
                         f"{_MAX_SECONDS:.0f}")
    return value


class ShardlineRendezvousHandler(rdzv_api.RendezvousHandler):
    """A torch RendezvousHandler over a Shardline external job (see the
    module docstring). Made by create_handler(params); thread-safe (torch's
    agent calls it from its main thread; the member's threads run beside)."""

    def __init__(self, run_id: str, connection: Connection, min_nodes: int, max_nodes: int, *,
                 worker_id: Optional[str] = None, join_timeout: float = 600.0,
                 last_call_timeout: float = 30.0, heartbeat_interval: float = 1.0,
                 heartbeat_timeout: float = 10.0, create: bool = True):
        if min_nodes < 1 or max_nodes < min_nodes:
            raise ValueError(f"nnodes {min_nodes}:{max_nodes}: give 1 <= MIN <= MAX")
        self._run_id = run_id
        self._conn = connection
        self._min_nodes = min_nodes
        self._max_nodes = max_nodes
        self._join_timeout = join_timeout
        self._last_call = last_call_timeout
        self._heartbeat_interval = heartbeat_interval
        self._heartbeat_timeout = heartbeat_timeout
        self._create = create
        self._lock = threading.Lock()
        self._member = Member(connection, run_id, worker_id)
        self._joined = False
        self._holds_rank = False
        self._closed = False

    @property
    def member(self) -> Member:
        return self._member

    # --- RendezvousHandler ------------------------------------------------

    def get_backend(self) -> str:
        return BACKEND_NAME

    def get_run_id(self) -> str:
        return self._run_id

    def next_rendezvous(self):
        """Joins the next round and returns (store, rank, world_size) (on
        torch >= 2.4, a RendezvousInfo carrying the same).

        Raises (torch's types, each with the coordinator's message):
          RendezvousClosedError   the job is COMPLETED, FAILED or CANCELLED;
          RendezvousTimeoutError  no round included this agent within
                                  join_timeout;
          RendezvousConnectionError  the coordinator cannot be reached;
          RendezvousStateError    the job is not an external job, the token
                                  is refused, or this agent was replaced.
        """
        try:
            with self._lock:
                if not self._joined:
                    self._ensure_job()
                    self._member.join()
                    self._joined = True
                elif self._holds_rank and not self._member.reform_pending:
                    # The agent restarts its workers while its round still
                    # runs (a local worker failed): end the round for all.
                    self._member.restart_generation(
                        f"torchrun agent {self._member.worker_id} restarts its workers")
                else:
                    self._member.rejoin()
                self._holds_rank = False
                self._member.set_progress(0, session_pb2.WORKER_STATE_WAITING)
            assignment = self._member.wait_assignment(self._join_timeout)
            with self._lock:
                self._holds_rank = True
                self._member.set_progress(0, session_pb2.WORKER_STATE_TRAINING)
            store = Store(self._member, scope="torchrun")
            # The workers this agent starts next inherit the round's store
            # (shardline.torch.Store.from_env()).
            os.environ[Store.ENV] = store.to_env()
            return self._result(store, assignment.rank, assignment.world_size)
        except errors.DeadlineExceededError as e:
            raise rdzv_api.RendezvousTimeoutError(str(e)) from e
        except errors.UnavailableError as e:
            raise rdzv_api.RendezvousConnectionError(str(e)) from e
        except errors.FailedPreconditionError as e:
            if self.is_closed():
                raise rdzv_api.RendezvousClosedError(str(e)) from e
            raise rdzv_api.RendezvousStateError(str(e)) from e
        except errors.ShardlineError as e:
            raise rdzv_api.RendezvousStateError(str(e)) from e

    def _result(self, store, rank: int, world_size: int):
        info = getattr(rdzv_api, "RendezvousInfo", None)
        if info is None:
            return store, rank, world_size
        # torch >= 2.4: the bootstrap store info is where rank 0's workers
        # host their TCPStore (MASTER_ADDR/PORT), agreed through our store.
        store_info = rdzv_api.RendezvousStoreInfo.build(rank, store)
        return info(store, rank, world_size, store_info)

    def is_closed(self) -> bool:
        if self._closed or self._member.closed:
            return True
        try:
            job = self._member.job()
        except errors.ShardlineError:
            return False
        self._closed = job.phase in _TERMINAL
        return self._closed

    def set_closed(self):
        try:
            self._member.complete(f"closed by torchrun agent {self._member.worker_id}")
        except errors.FailedPreconditionError:
            pass  # FAILED or CANCELLED already: closed all the same
        self._closed = True

    def num_nodes_waiting(self) -> int:
        """1 when the coordinator has ended this agent's round (a node was
        lost or left, a node is waiting to be admitted, a peer restarted),
        else 0. No RPC: the Session stream keeps it current."""
        return 1 if self._joined and self._member.reform_pending else 0

    def shutdown(self) -> bool:
        """Leaves the job (LeaveJob) and stops the member's threads. False
        (with a warning logged) when the coordinator could not be told: the
        agent's work is done all the same, and the coordinator declares the
        member LOST when its stream breaks."""
        if not self._joined:
            self._member.close()
            return True
        try:
            self._member.leave(f"torchrun agent {self._member.worker_id} shut down")
            return True
        except errors.ShardlineError as e:
            log.warning("shardline rendezvous: leaving job %s failed: %s", self._run_id, e)
            self._member.close()
            return False

    @property
    def use_agent_store(self) -> bool:
        # torch >= 2.4: workers must not expect a TCPStore in the agent.
        return False

    # --- the job ------------------------------------------------------------

    def _ensure_job(self) -> None:
        """Checks that the job exists and is external; creates it when it
        does not and creation is allowed."""
        try:
            job = self._member.job()
        except errors.NotFoundError:
            if not self._create:
                raise
            job = self._create_job()
        if not job.spec.HasField("external"):
            raise rdzv_api.RendezvousStateError(
                f"job {self._run_id} is a GPT training job (spec.model is set); the torchrun "
                "backend needs an external job: create one with spec.external "
                "(deploy/jobs/torchrun-external.yaml)")
        if job.phase in _TERMINAL:
            self._closed = True
            raise rdzv_api.RendezvousClosedError(
                f"job {self._run_id} is {job_pb2.JobPhase.Name(job.phase)}: {job.phase_reason} "
                "(a job id serves one run: give this run another --rdzv_id)")
        e = job.spec.elastic
        if (e.min_workers, e.max_workers) != (self._min_nodes, self._max_nodes):
            log.warning("shardline rendezvous: job %s takes %d..%d nodes (its spec); "
                        "--nnodes %d:%d is not used", self._run_id, e.min_workers,
                        e.max_workers, self._min_nodes, self._max_nodes)

    def _create_job(self) -> job_pb2.Job:
        spec = job_pb2.JobSpec(name=f"torchrun {self._run_id}"[:128])
        spec.external.framework = "torchrun"
        e = spec.elastic
        e.min_workers = self._min_nodes
        e.max_workers = self._max_nodes
        e.heartbeat_interval.FromNanoseconds(int(self._heartbeat_interval * 1e9))
        e.heartbeat_timeout.FromNanoseconds(int(self._heartbeat_timeout * 1e9))
        e.join_timeout.FromNanoseconds(int(self._join_timeout * 1e9))
        e.last_call.FromNanoseconds(int(self._last_call * 1e9))
        req = job_pb2.CreateJobRequest(job_id=self._run_id, spec=spec)
        try:
            return self._conn.call("JobService.CreateJob", req).job
        except errors.AlreadyExistsError:
            # Another agent created it first, with other settings: use it.
            return self._member.job()


def create_handler(params: rdzv_api.RendezvousParameters) -> ShardlineRendezvousHandler:
    """torch's handler factory: registered as "shardline" by
    shardline.torchrun, and as the `torchrun.handlers` entry point."""
    unknown = sorted(k for k in params.config if k not in CONF_KEYS and k not in _TORCH_KEYS)
    if unknown:
        raise ValueError(f"rdzv_conf {', '.join(unknown)}: not a key of the shardline backend; "
                         f"it reads {', '.join(CONF_KEYS)}")
    endpoint = params.endpoint
    if not endpoint:
        raise ValueError("--rdzv_endpoint is empty; give the coordinator's HOST:PORT "
                         "(or several replicas, comma-separated)")
    try:
        parse_addresses(endpoint)
    except ValueError as e:
        raise ValueError(f"--rdzv_endpoint={endpoint!r}: {e}") from None
    conn = Connection(endpoint,
                      token_file=params.get("token_file", None) or None,
                      tls_ca=params.get("tls_ca", None) or None,
                      tls_cert=params.get("tls_cert", None) or None,
                      tls_key=params.get("tls_key", None) or None,
                      tls_server_name=params.get("tls_server_name", None) or None,
                      timeout=_seconds(params, "call_timeout", 10.0))
    return ShardlineRendezvousHandler(
        params.run_id, conn, params.min_nodes, params.max_nodes,
        worker_id=params.get("worker_id", None) or None,
        join_timeout=_seconds(params, "join_timeout", 600.0),
        last_call_timeout=_seconds(params, "last_call_timeout", 30.0),
        heartbeat_interval=_seconds(params, "heartbeat_interval", 1.0),
        heartbeat_timeout=_seconds(params, "heartbeat_timeout", 10.0),
        create=params.get_as_bool("create", True))


def handler_generator():
    """The `torchrun.handlers` entry point: torch >= 2.5 calls it with no
    arguments and registers what it returns as the backend's factory."""
    return create_handler


def register() -> None:
    """Registers the "shardline" backend with torch's handler registry
    (torch 1.13 has no plugin discovery). Harmless twice."""
    from torch.distributed.elastic.rendezvous import registry
    try:
        registry.handler_registry.register(BACKEND_NAME, create_handler)
    except ValueError:
        pass  # already registered
