"""The operator's view of the coordinator: jobs, members, plans, checkpoints, events.

    from shardline import Client
    with Client("127.0.0.1:7070", token=admin_token) as client:
        job, worker_token = client.create_job({"name": "demo", ...}, job_id="demo")
        for event in client.watch("demo", after_sequence=0):
            print(event)

Each method is one RPC of proto/shardline/v1/coordinator.proto (named in its
docstring) and returns its response message (shardline.v1.*_pb2 classes).
Every method raises the ShardlineError subclass of the RPC's status
(shardline.errors); the codes each can return are listed per method and in
coordinator.proto "Errors" (any RPC may also fail with UnavailableError,
DeadlineExceededError, UnauthenticatedError, PermissionDeniedError,
ResourceExhaustedError; a job_id RPC with NotFoundError for an unknown job).

Thread-safety: a Client is thread-safe (see Connection).
"""

from __future__ import annotations

from typing import Any, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from google.protobuf import json_format

from shardline._connection import DEFAULT_TIMEOUT, Connection, Stream
from shardline._stubs import (checkpoint_pb2, events_pb2, job_pb2, plan_pb2, replica_pb2,
                              session_pb2)

__all__ = ["Client"]

# ListJobs / ListCheckpoints pages a listing reads at most (a coordinator
# holds a bounded number of jobs; this only stops a server that loops).
_MAX_PAGES = 10000


def _phase(value: Union[int, str]) -> int:
    if isinstance(value, str):
        name = value.upper()
        if not name.startswith("JOB_PHASE_"):
            name = "JOB_PHASE_" + name
        try:
            return job_pb2.JobPhase.Value(name)
        except ValueError:
            raise ValueError("phases: unknown phase %r; give one of %s" % (
                value, ", ".join(n[len("JOB_PHASE_"):] for n in job_pb2.JobPhase.keys()
                                 if n != "JOB_PHASE_UNSPECIFIED"))) from None
    if isinstance(value, bool) or not isinstance(value, int) or value not in job_pb2.JobPhase.values():
        raise ValueError("phases: %r is not a JobPhase" % (value,))
    return value


class Client:
    """A client of the Shardline coordinator for operators and launchers.

    The constructor takes exactly Connection's arguments (addresses, token,
    token_file, tls_ca, tls_cert, tls_key, tls_server_name, timeout) and
    raises its ValueErrors. `connection` is the underlying Connection, for
    RPCs this class has no method for (``client.connection.call(...)``).
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
        self.connection = Connection(addresses, token=token, token_file=token_file, tls_ca=tls_ca,
                                     tls_cert=tls_cert, tls_key=tls_key,
                                     tls_server_name=tls_server_name, timeout=timeout)

    def close(self) -> None:
        """Closes the connection (see Connection.close)."""
        self.connection.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- jobs ----

    def create_job(self, spec: Union[job_pb2.JobSpec, Mapping[str, Any]],
                   job_id: Optional[str] = None) -> Tuple[job_pb2.Job, str]:
        """JobService.CreateJob: creates a job (PENDING, generation 1). Admin token.

        Args:
            spec: a JobSpec message, or a dict in the protobuf JSON mapping of
                JobSpec (snake_case or lowerCamelCase field names, durations
                as strings such as "10s", enums by name such as
                "PRECISION_FP32"), e.g. a parsed YAML job file.
            job_id: 1..63 bytes of [a-z0-9-] starting with a letter; None or
                "" lets the coordinator choose. With a job_id, repeating the
                call with the same spec is safe.

        Returns:
            (job, worker_token): the Job, and the bearer token for its workers
            ("" when the coordinator runs without auth, and on a repeat of a
            creation: it is shown only once).

        Raises:
            ValueError: a dict that is not a JobSpec (names the field).
            InvalidArgumentError: a spec field missing or inconsistent (the
            message names it and the valid choices). AlreadyExistsError:
            job_id exists with another spec. ResourceExhaustedError: the
            coordinator holds its maximum number of jobs.
        """
        if isinstance(spec, job_pb2.JobSpec):
            message = spec
        elif isinstance(spec, Mapping):
            message = job_pb2.JobSpec()
            try:
                json_format.ParseDict(spec, message)
            except json_format.ParseError as e:
                raise ValueError("spec: %s" % e) from None
        else:
            raise TypeError("spec must be a shardline.v1.job_pb2.JobSpec or a dict; got %s"
                            % type(spec).__name__)
        request = job_pb2.CreateJobRequest(job_id=job_id or "", spec=message)
        response = self.connection.call("JobService.CreateJob", request)
        return response.job, response.worker_token

    def get_job(self, job_id: str) -> job_pb2.Job:
        """JobService.GetJob: one job (phase, generation, world_size, dp, step, ...).

        Raises NotFoundError (no such job), InvalidArgumentError (job_id empty).
        """
        return self.connection.call("JobService.GetJob", job_pb2.GetJobRequest(job_id=job_id))

    def list_jobs(self, phases: Optional[Iterable[Union[int, str]]] = None,
                  page_size: Optional[int] = None) -> List[job_pb2.Job]:
        """JobService.ListJobs, every page: the jobs, newest first. Admin token.

        Args:
            phases: only jobs in these phases (JobPhase values, or names such
                as "RUNNING" / "JOB_PHASE_RUNNING"); None or empty: every phase.
            page_size: jobs per RPC (1..1000; None: the coordinator's 50). The
                result holds every page either way.

        Raises:
            ValueError: an unknown phase, a page_size outside 1..1000.
            InvalidArgumentError: over 16 phases.
        """
        wanted = [_phase(p) for p in phases or ()]
        if page_size is not None and (isinstance(page_size, bool) or not isinstance(page_size, int)
                                      or not 1 <= page_size <= 1000):
            raise ValueError("page_size=%r must be an int in 1..1000" % (page_size,))
        jobs: List[job_pb2.Job] = []
        token = ""
        for _ in range(_MAX_PAGES):
            response = self.connection.call("JobService.ListJobs", job_pb2.ListJobsRequest(
                page_size=page_size or 0, page_token=token, phases=wanted))
            jobs.extend(response.jobs)
            token = response.next_page_token
            if not token:
                break
        return jobs

    def cancel_job(self, job_id: str, reason: str = "") -> job_pb2.Job:
        """JobService.CancelJob: the job becomes CANCELLED (its members get STOP). Admin token.

        `reason` becomes Job.phase_reason. Cancelling a CANCELLED job returns
        it unchanged. Raises FailedPreconditionError (COMPLETED or FAILED),
        NotFoundError.
        """
        return self.connection.call("JobService.CancelJob",
                                    job_pb2.CancelJobRequest(job_id=job_id, reason=reason))

    def members(self, job_id: str) -> session_pb2.ListMembersResponse:
        """JobService.ListMembers: the generation and one Member per worker_id.

        ACTIVE members by rank first, then the others by worker_id. Raises
        NotFoundError.
        """
        return self.connection.call("JobService.ListMembers",
                                    session_pb2.ListMembersRequest(job_id=job_id))

    def topology(self, job_id: str) -> plan_pb2.Plan:
        """JobService.GetPlan: the plan of the latest formed generation.

        Groups, pipeline chunks and schedule, ZeRO units, memory per rank.
        Raises FailedPreconditionError: nothing formed yet (PENDING), or an
        external job (it has no plan). NotFoundError.
        """
        return self.connection.call("JobService.GetPlan", plan_pb2.GetPlanRequest(job_id=job_id))

    def owner(self, job_id: str, parameter: str,
              element_index: Optional[int] = None) -> plan_pb2.GetShardOwnerResponse:
        """JobService.GetShardOwner: which ranks hold a parameter's values, gradients, optimizer states.

        Args:
            parameter: e.g. "layers.2.mlp.fc1.weight".
            element_index: only the holders of this element (a row-major
                index into the unsplit parameter, < its numel); None: every
                holder.

        Raises InvalidArgumentError (parameter empty; element_index >= numel),
        NotFoundError (no such parameter: the message lists close names),
        FailedPreconditionError (nothing formed yet).
        """
        request = plan_pb2.GetShardOwnerRequest(job_id=job_id, parameter=parameter)
        if element_index is not None:
            request.element_index = element_index
        return self.connection.call("JobService.GetShardOwner", request)

    def watch(self, job_id: str, after_sequence: Optional[int] = 0) -> Stream:
        """JobService.WatchJob: the job's events (JobEvent) in sequence order, live.

        Args:
            after_sequence: replay every retained event with a larger
                sequence first (0: the whole retained history); None: only
                events after the call.

        Returns a Stream: iterate it for JobEvent messages; it ends (with the
        PhaseChanged event) when the job reaches a terminal phase, or when
        cancel() is called (from any thread). Iteration raises
        OutOfRangeError (after_sequence no longer retained or beyond the
        newest event), ResourceExhaustedError (the watcher fell 1000 events
        behind: resume with after_sequence = the last sequence received; or
        too many watchers), NotFoundError.
        """
        request = events_pb2.WatchJobRequest(job_id=job_id)
        if after_sequence is not None:
            request.after_sequence = after_sequence
        return self.connection.stream("JobService.WatchJob", request)

    # ---- checkpoints ----

    def checkpoints(self, job_id: str,
                    include_aborted: bool = False) -> List[checkpoint_pb2.CheckpointSummary]:
        """CheckpointService.ListCheckpoints, every page: the job's checkpoints, newest step first.

        ABORTED ones only with include_aborted. Raises NotFoundError.
        """
        out: List[checkpoint_pb2.CheckpointSummary] = []
        token = ""
        for _ in range(_MAX_PAGES):
            response = self.connection.call(
                "CheckpointService.ListCheckpoints",
                checkpoint_pb2.ListCheckpointsRequest(job_id=job_id, include_aborted=include_aborted,
                                                      page_token=token))
            out.extend(response.checkpoints)
            token = response.next_page_token
            if not token:
                break
        return out

    def manifest(self, job_id: str, checkpoint_id: str = "",
                 tensors: Optional[Iterable[str]] = None) -> checkpoint_pb2.Manifest:
        """CheckpointService.GetManifest: a checkpoint's manifest (files, tensors and their pieces).

        checkpoint_id "" means the newest committed one; `tensors` limits the
        answer to those tensor names. Raises NotFoundError (no such
        checkpoint; nothing committed yet; a tensor name not in it).
        """
        return self.connection.call("CheckpointService.GetManifest", checkpoint_pb2.GetManifestRequest(
            job_id=job_id, checkpoint_id=checkpoint_id, tensors=list(tensors or ())))

    # ---- the coordinator ----

    def status(self) -> replica_pb2.CoordinatorStatus:
        """CoordinatorService.GetStatus: the state backend, the replicas and which leads. Admin token.

        Served by any replica.
        """
        return self.connection.call("CoordinatorService.GetStatus", replica_pb2.GetStatusRequest())

    def __repr__(self) -> str:
        return "Client(%r)" % ",".join(self.connection.addresses)
