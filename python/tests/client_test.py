"""shardline.Client and shardline.Connection against the real shardline-coordinator.

Each class starts its own coordinator (python/tests/coordinator.py) on a free
loopback port: without auth (the job lifecycle, a formed job's views, watch,
errors, replica lists), and with an admin token (tokens). Options that are
refused never reach a coordinator.
"""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import grpc

import shardline
from shardline.v1 import events_pb2, job_pb2, session_pb2

from coordinator import Coordinator, closed_port
from shardline.member import Member

# A small GPT job (deploy/jobs/shakespeare.yaml's model) that forms with two
# workers: world 2 = tp 1 x pp 2 x dp 1.
SPEC = {
    "name": "pyclient",
    "model": {"num_layers": 4, "hidden_size": 128, "num_heads": 4, "vocab_size": 256,
              "seq_length": 64},
    "parallel": {"tp": 1, "pp": 2, "zero_stage": 2},
    "training": {"global_batch": 6, "micro_batch": 3, "train_steps": 100,
                 "learning_rate": 1e-3, "precision": "PRECISION_FP32"},
    "data": {"dataset_path": "data/tinyshakespeare.txt"},
    "elastic": {"min_workers": 2, "max_workers": 2, "heartbeat_interval": "1s",
                "heartbeat_timeout": "10s"},
}


class JobLifecycleTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.coordinator = Coordinator().start()
        cls.client = shardline.Client(cls.coordinator.address)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.coordinator.stop()

    def test_create_get_list_cancel(self):
        job, token = self.client.create_job(SPEC, job_id="lifecycle")
        self.assertEqual(job.job_id, "lifecycle")
        self.assertEqual(job.phase, job_pb2.JOB_PHASE_PENDING)
        self.assertEqual(job.generation, 1)
        self.assertEqual(job.spec.parallel.pp, 2)
        self.assertEqual(job.spec.elastic.heartbeat_interval.seconds, 1)
        self.assertEqual(token, "")  # no auth: no worker token

        # The same spec again is idempotent; a message spec works as a dict does.
        again, _ = self.client.create_job(job.spec, job_id="lifecycle")
        self.assertEqual(again.job_id, "lifecycle")

        got = self.client.get_job("lifecycle")
        self.assertEqual(got.spec.name, "pyclient")
        self.assertEqual(got.phase, job_pb2.JOB_PHASE_PENDING)

        other, _ = self.client.create_job(SPEC)  # the coordinator picks the id
        self.assertTrue(other.job_id)
        self.assertNotEqual(other.job_id, "lifecycle")

        # page_size=1: every page is read.
        ids = [j.job_id for j in self.client.list_jobs(page_size=1)]
        self.assertIn("lifecycle", ids)
        self.assertIn(other.job_id, ids)
        self.assertEqual(len(ids), len(set(ids)))
        pending = [j.job_id for j in self.client.list_jobs(phases=["PENDING"])]
        self.assertIn("lifecycle", pending)

        cancelled = self.client.cancel_job("lifecycle", reason="test over")
        self.assertEqual(cancelled.phase, job_pb2.JOB_PHASE_CANCELLED)
        self.assertIn("test over", cancelled.phase_reason)
        self.assertEqual(self.client.get_job("lifecycle").phase, job_pb2.JOB_PHASE_CANCELLED)
        self.assertIn("lifecycle", [j.job_id for j in self.client.list_jobs(
            phases=[job_pb2.JOB_PHASE_CANCELLED])])
        self.assertNotIn("lifecycle", [j.job_id for j in self.client.list_jobs(phases=["pending"])])

    def test_unknown_job_is_not_found_with_the_coordinator_message(self):
        with self.assertRaises(shardline.NotFoundError) as cm:
            self.client.get_job("no-such-job")
        e = cm.exception
        self.assertEqual(e.code, grpc.StatusCode.NOT_FOUND)
        self.assertIn("no-such-job", e.message)
        self.assertEqual(e.address, self.coordinator.address)
        self.assertTrue(str(e).startswith("NOT_FOUND: "), str(e))
        self.assertIsInstance(e, shardline.ShardlineError)

    def test_invalid_spec_names_the_field(self):
        bad = dict(SPEC, parallel={"tp": 3, "pp": 1})
        with self.assertRaises(shardline.InvalidArgumentError) as cm:
            self.client.create_job(bad, job_id="badspec")
        self.assertIn("tp", cm.exception.message)
        with self.assertRaises(ValueError) as cm:
            self.client.create_job({"name": "x", "nonsense": 1})
        self.assertIn("nonsense", str(cm.exception))

    def test_already_exists_with_another_spec(self):
        self.client.create_job(SPEC, job_id="twice")
        with self.assertRaises(shardline.AlreadyExistsError):
            self.client.create_job(dict(SPEC, name="other"), job_id="twice")

    def test_topology_before_formation_is_failed_precondition(self):
        self.client.create_job(SPEC, job_id="unformed")
        with self.assertRaises(shardline.FailedPreconditionError):
            self.client.topology("unformed")

    def test_status(self):
        status = self.client.status()
        self.assertEqual(status.state, "memory")
        self.assertTrue(status.replica_id)
        self.assertGreaterEqual(len(status.replicas), 1)

    def test_one_client_from_many_threads(self):
        self.client.create_job(SPEC, job_id="threads")
        results, errors = [], []

        def work():
            try:
                for _ in range(20):
                    results.append(self.client.get_job("threads").job_id)
            except Exception as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        self.assertEqual(results, ["threads"] * 160)

    def test_connection_call_by_name(self):
        conn = self.client.connection
        with self.assertRaises(ValueError) as cm:
            conn.call("JobService.NoSuchMethod", job_pb2.GetJobRequest(job_id="x"))
        self.assertIn("NoSuchMethod", str(cm.exception))
        with self.assertRaises(ValueError):
            conn.call("JobService.WatchJob", events_pb2.WatchJobRequest(job_id="x"))
        with self.assertRaises(TypeError) as cm:
            conn.call("JobService.GetJob", job_pb2.ListJobsRequest())
        self.assertIn("shardline.v1.GetJobRequest", str(cm.exception))
        self.client.create_job(SPEC, job_id="byname")
        job = conn.call("JobService.GetJob", job_pb2.GetJobRequest(job_id="byname"), timeout=5)
        self.assertEqual(job.job_id, "byname")


class FormedJobTest(unittest.TestCase):
    """Two members (shardline.member.Member, no training) form generation 1; members,
    topology, owner, watch."""

    @classmethod
    def setUpClass(cls):
        cls.coordinator = Coordinator().start()
        cls.client = shardline.Client(cls.coordinator.address)
        cls.client.create_job(SPEC, job_id="formed")
        cls.connections = [shardline.Connection(cls.coordinator.address) for _ in range(2)]
        cls.workers = [Member(cls.connections[i], "formed", "w%d" % i, incarnation=100 + i)
                       for i in range(2)]
        cls.assignments = [None, None]
        errors = []

        def run(i):
            try:
                w = cls.workers[i]
                w.join()  # and its Session stream and heartbeats
                cls.assignments[i] = w.wait_assignment(timeout=20)
            except Exception as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            cls.tearDownClass()
            raise errors[0]

    @classmethod
    def tearDownClass(cls):
        for w in cls.workers:
            w.close()
        for c in cls.connections:
            c.close()
        cls.client.close()
        cls.coordinator.stop()

    def test_job_members_topology_owner(self):
        self.assertEqual(sorted(a.rank for a in self.assignments), [0, 1])
        generation = self.assignments[0].generation
        job = self.client.get_job("formed")
        self.assertEqual(job.phase, job_pb2.JOB_PHASE_RUNNING)
        self.assertEqual(job.world_size, 2)
        self.assertEqual(job.dp, 1)

        members = self.client.members("formed")
        self.assertEqual(members.generation, generation)
        self.assertEqual(sorted(m.worker_id for m in members.members), ["w0", "w1"])
        self.assertEqual([m.state for m in members.members],
                         [session_pb2.MEMBER_STATE_ACTIVE] * 2)

        plan = self.client.topology("formed")
        self.assertEqual(plan.world_size, 2)
        self.assertEqual(plan.generation, generation)
        self.assertEqual(plan.parallel.pp, 2)
        self.assertEqual(plan.gradient_accumulation_steps, 2)  # 6 / (3 * dp 1)

        owner = self.client.owner("formed", "layers.2.mlp.fc1.weight", element_index=1000)
        self.assertEqual(list(owner.global_shape), [512, 128])
        self.assertEqual(owner.numel, 512 * 128)
        self.assertEqual(owner.zero_stage, 2)
        self.assertTrue(owner.holders)
        every = self.client.owner("formed", "layers.2.mlp.fc1.weight")
        self.assertGreaterEqual(len(every.holders), len(owner.holders))
        with self.assertRaises(shardline.NotFoundError):
            self.client.owner("formed", "layers.9.nothing")
        with self.assertRaises(shardline.InvalidArgumentError) as cm:
            self.client.owner("formed", "layers.2.mlp.fc1.weight", element_index=512 * 128)
        self.assertIn(str(512 * 128), cm.exception.message)

        self.assertEqual(self.client.checkpoints("formed"), [])
        with self.assertRaises(shardline.NotFoundError):
            self.client.manifest("formed", "")

    def test_watch_yields_events_then_ends_on_cancel(self):
        # Replays the history (joins, formation), then goes live; a second
        # watcher is cancelled by us while it waits.
        events = []
        stream = self.client.watch("formed", after_sequence=0)
        idle = self.client.watch("formed", after_sequence=None)  # only new events
        seen_formed = threading.Event()
        idle_done = threading.Event()

        def read_all():
            for event in stream:
                events.append(event)
                if event.HasField("generation_formed"):
                    seen_formed.set()

        def read_idle():
            for _ in idle:
                pass
            idle_done.set()

        readers = [threading.Thread(target=read_all), threading.Thread(target=read_idle)]
        for t in readers:
            t.start()
        self.assertTrue(seen_formed.wait(20), [str(e) for e in events])
        # test_watch... runs before any cancel of "formed": the job ends now.
        self.client.cancel_job("formed", reason="watch test")
        readers[0].join(20)
        self.assertFalse(readers[0].is_alive(), "watch did not end after the job was cancelled")
        kinds = [e.WhichOneof("event") for e in events]
        self.assertIn("worker_joined", kinds)
        self.assertIn("generation_formed", kinds)
        self.assertEqual(kinds[-1], "phase_changed")
        self.assertEqual(events[-1].phase_changed.new_phase, job_pb2.JOB_PHASE_CANCELLED)
        sequences = [e.sequence for e in events]
        self.assertEqual(sequences, sorted(sequences))
        self.assertTrue(all(e.job_id == "formed" for e in events))
        # The idle watcher saw the cancellation too and ended; cancel() is harmless after.
        self.assertTrue(idle_done.wait(20))
        idle.cancel()
        # A watcher that is cancelled while it blocks ends with StopIteration.
        self.client.create_job(SPEC, job_id="quiet")
        quiet = self.client.watch("quiet", after_sequence=None)
        ended = threading.Event()

        def read_quiet():
            for _ in quiet:
                pass
            ended.set()

        t = threading.Thread(target=read_quiet)
        t.start()
        time.sleep(0.2)  # let it block in next(); cancel() works before that too
        quiet.cancel()
        self.assertTrue(ended.wait(10), "cancel() did not end the watch")

    def test_watch_errors(self):
        with self.assertRaises(shardline.NotFoundError):
            next(iter(self.client.watch("no-such-job")))
        with self.assertRaises(shardline.OutOfRangeError):
            next(iter(self.client.watch("formed", after_sequence=10 ** 9)))


class ReconnectTest(unittest.TestCase):
    """A member (in a child process, gRPC's backup poller off) whose coordinator is
    SIGKILLed and restarted on its state heartbeats again as soon as it serves:
    the member watches its connection after a failed heartbeat
    (Connection.await_reconnect); without that watch it never reconnected."""

    def test_member_heartbeats_reach_a_restarted_coordinator(self):
        tmp = tempfile.mkdtemp()
        child = None
        try:
            with Coordinator(state_dir=tmp) as c:
                spec = dict(SPEC)
                spec["elastic"] = dict(SPEC["elastic"], heartbeat_interval="0.2s",
                                       heartbeat_timeout="30s")
                with shardline.Client(c.address) as client:
                    client.create_job(spec, job_id="reconnect")
                child = subprocess.Popen(
                    [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "member_child.py"), c.address, "reconnect", "w0"],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                self.assertEqual(child.stdout.readline().strip(), "joined")
                time.sleep(0.5)  # a few heartbeats on the first connection
                c.kill()
                time.sleep(1.0)  # heartbeats fail meanwhile
                c.start()
                restarted = time.time()
                beat = None
                with shardline.Client(c.address) as client:
                    deadline = time.monotonic() + 8
                    while beat is None and time.monotonic() < deadline:
                        for m in client.members("reconnect").members:
                            t = m.last_heartbeat_time.ToNanoseconds() / 1e9
                            if m.worker_id == "w0" and t > restarted:
                                beat = t - restarted
                        time.sleep(0.05)
                self.assertIsNotNone(beat, "no heartbeat within 8 s of the restart\n" + c.logs())
                # Heartbeats every 0.2 s: the first after the restart within
                # about one interval plus the reconnect (0.2 s measured).
                self.assertLess(beat, 3.0)
        finally:
            if child is not None:
                child.stdin.close()
                child.wait(15)
            shutil.rmtree(tmp, ignore_errors=True)


class AuthTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.coordinator = Coordinator(admin_token=Coordinator.ADMIN_TOKEN).start()
        cls.admin = shardline.Client(cls.coordinator.address, token=Coordinator.ADMIN_TOKEN)

    @classmethod
    def tearDownClass(cls):
        cls.admin.close()
        cls.coordinator.stop()

    def test_tokens(self):
        job, worker_token = self.admin.create_job(SPEC, job_id="authjob")
        self.assertTrue(worker_token)
        # The worker token reads its own job, and nothing admin-only.
        with shardline.Client(self.coordinator.address, token=worker_token) as worker:
            self.assertEqual(worker.get_job("authjob").job_id, "authjob")
            with self.assertRaises(shardline.PermissionDeniedError) as cm:
                worker.list_jobs()
            self.assertIn("admin token", cm.exception.message)
        # A per-call token overrides the connection's.
        got = self.admin.connection.call("JobService.GetJob", job_pb2.GetJobRequest(job_id="authjob"),
                                         token=worker_token)
        self.assertEqual(got.job_id, "authjob")

        with shardline.Client(self.coordinator.address, token="wrong-token-0123456789") as wrong:
            with self.assertRaises(shardline.UnauthenticatedError) as cm:
                wrong.get_job("authjob")
            self.assertEqual(cm.exception.code, grpc.StatusCode.UNAUTHENTICATED)
            self.assertIn("check the token", cm.exception.message)
        with shardline.Client(self.coordinator.address) as anonymous:
            with self.assertRaises(shardline.UnauthenticatedError) as cm:
                anonymous.get_job("authjob")
            self.assertIn("requires a token", cm.exception.message)

    def test_token_file(self):
        d = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        path = os.path.join(d, "token")
        with open(path, "w") as f:
            f.write(Coordinator.ADMIN_TOKEN + "\nignored second line\n")
        with shardline.Client(self.coordinator.address, token_file=path) as client:
            self.assertEqual(client.status().state, "memory")
        shutil.rmtree(d)


class UnreachableTest(unittest.TestCase):
    def test_refused_is_unavailable_naming_the_address(self):
        address = "127.0.0.1:%d" % closed_port()
        with shardline.Client(address, timeout=5) as client:
            start = time.monotonic()
            with self.assertRaises(shardline.UnavailableError) as cm:
                client.get_job("x")
            self.assertLess(time.monotonic() - start, 30)  # the deadline holds; no hang
        self.assertIn("cannot reach the coordinator at %s: connection refused" % address,
                      cm.exception.message)
        self.assertEqual(cm.exception.address, address)

    def test_silent_server_is_deadline_exceeded_within_the_timeout(self):
        # A port that accepts TCP connections but never speaks HTTP/2.
        with socket.socket() as silent:
            silent.bind(("127.0.0.1", 0))
            silent.listen(16)
            address = "127.0.0.1:%d" % silent.getsockname()[1]
            with shardline.Client(address, timeout=1.5) as client:
                start = time.monotonic()
                with self.assertRaises(shardline.DeadlineExceededError) as cm:
                    client.get_job("x")
                self.assertLess(time.monotonic() - start, 30)
            self.assertIn("no answer from the coordinator at %s to JobService.GetJob within 1.5s"
                          % address, cm.exception.message)


class ReplicaListTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.coordinator = Coordinator().start()

    @classmethod
    def tearDownClass(cls):
        cls.coordinator.stop()

    def test_dead_first_address_moves_on(self):
        dead = "127.0.0.1:%d" % closed_port()
        with shardline.Client([dead, self.coordinator.address]) as client:
            job, _ = client.create_job(SPEC, job_id="replicas")
            self.assertEqual(job.job_id, "replicas")
            self.assertEqual(client.connection.leader, self.coordinator.address)
            self.assertEqual(client.get_job("replicas").job_id, "replicas")
            events = client.watch("replicas", after_sequence=0)
            first = next(iter(events))
            self.assertEqual(first.job_id, "replicas")
            events.cancel()

    def test_silent_first_address_moves_on(self):
        with socket.socket() as silent:
            silent.bind(("127.0.0.1", 0))
            silent.listen(16)
            silent_address = "127.0.0.1:%d" % silent.getsockname()[1]
            with shardline.Client("%s,%s" % (silent_address, self.coordinator.address),
                                  timeout=10) as client:
                self.assertEqual(client.status().state, "memory")
                self.assertEqual(len(client.list_jobs()), len(client.list_jobs()))

    def test_every_address_dead_names_them(self):
        a, b = "127.0.0.1:%d" % closed_port(), "127.0.0.1:%d" % closed_port()
        with shardline.Client([a, b], timeout=2) as client:
            with self.assertRaises(shardline.UnavailableError) as cm:
                client.get_job("x")
        self.assertIn("replicas tried: %s, %s" % (a, b), cm.exception.message)


class RetryRulesTest(unittest.TestCase):
    """Which failures a call may be sent again after (coordinator.proto "Retries"), on the real
    attempt logic of shardline._connection with two replica addresses (nothing is sent)."""

    def again(self, method, code, details, hint=""):
        from shardline import _connection
        conn = shardline.Connection("127.0.0.1:1,127.0.0.1:2")
        try:
            attempts = _connection._Attempts(conn, method, time.monotonic() + 10)
            return attempts.again(_connection._Status(code, details, hint)), conn.leader
        finally:
            conn.close()

    def test_ambiguous_failures_retry_only_idempotent_rpcs(self):
        closed = (grpc.StatusCode.UNAVAILABLE, "Socket closed")
        self.assertEqual(self.again("RendezvousService.KvSet", *closed), (True, "127.0.0.1:2"))
        # Not idempotent: not sent again, but the next call starts at the next replica.
        for method in ("RendezvousService.KvAdd", "RendezvousService.KvCompareAndSet",
                       "WorkerService.ReportError"):
            self.assertEqual(self.again(method, *closed), (False, "127.0.0.1:2"), method)

    def test_nothing_done_retries_every_rpc(self):
        for details in ("failed to connect to all addresses; last error: UNKNOWN: "
                        "ipv4:127.0.0.1:1: Failed to connect to remote host: Connection refused",
                        "not the leader: no leader is known (election in progress)"):
            self.assertEqual(self.again("RendezvousService.KvAdd", grpc.StatusCode.UNAVAILABLE,
                                        details), (True, "127.0.0.1:2"))

    def test_a_cancel_the_coordinator_made_is_an_ambiguous_failure(self):
        # A leader stepping down cancels the calls still open after its grace.
        from shardline import _connection
        ended = _connection._Status(grpc.StatusCode.CANCELLED, "Cancelled").server_ended()
        self.assertEqual(ended.code, grpc.StatusCode.UNAVAILABLE)
        self.assertIn("ended the call without an answer (CANCELLED: Cancelled)", ended.details)
        self.assertFalse(ended.nothing_done())
        self.assertEqual(self.again("RendezvousService.KvSet", ended.code, ended.details),
                         (True, "127.0.0.1:2"))
        self.assertEqual(self.again("RendezvousService.KvAdd", ended.code, ended.details),
                         (False, "127.0.0.1:2"))
        other = _connection._Status(grpc.StatusCode.ABORTED, "generation over")
        self.assertIs(other.server_ended(), other)

    def test_a_hint_is_followed_and_other_codes_end_the_call(self):
        self.assertEqual(self.again("RendezvousService.KvAdd", grpc.StatusCode.UNAVAILABLE,
                                    "not the leader: the leader is 127.0.0.1:9", "127.0.0.1:9"),
                         (True, "127.0.0.1:9"))
        self.assertEqual(self.again("JobService.GetJob", grpc.StatusCode.NOT_FOUND, "no job"),
                         (False, "127.0.0.1:1"))
        # A replica that held the call for the whole deadline: later calls start elsewhere.
        self.assertEqual(self.again("JobService.GetJob", grpc.StatusCode.DEADLINE_EXCEEDED, ""),
                         (False, "127.0.0.1:2"))
        # CoordinatorService is served by every replica: the leader guess stays.
        self.assertEqual(self.again("CoordinatorService.GetStatus", grpc.StatusCode.UNAVAILABLE,
                                    "Socket closed"), (True, "127.0.0.1:1"))


class OptionsTest(unittest.TestCase):
    """Refused options: ValueError naming the option, before anything is sent."""

    def assertRefused(self, option, **kwargs):
        addresses = kwargs.pop("addresses", "127.0.0.1:7070")
        with self.assertRaises(ValueError) as cm:
            shardline.Client(addresses, **kwargs)
        self.assertIn(option, str(cm.exception))
        return str(cm.exception)

    def test_addresses(self):
        self.assertRefused("addresses", addresses="")
        self.assertIn("not HOST:PORT", self.assertRefused("addresses", addresses="nohost"))
        self.assertRefused("addresses", addresses="127.0.0.1:0")
        self.assertRefused("addresses", addresses="127.0.0.1:99999")
        self.assertIn("position 2", self.assertRefused("addresses", addresses="a:1,,b:2"))
        self.assertIn("twice", self.assertRefused("addresses", addresses="a:1,a:1"))
        self.assertIn("at most 16", self.assertRefused(
            "addresses", addresses=["h%d:1" % i for i in range(17)]))
        self.assertRefused("addresses", addresses=42)
        shardline.Client(["[::1]:7070", "unix:/tmp/x.sock", " a:1 "]).close()

    def test_tokens(self):
        self.assertRefused("token", token="a b")
        self.assertIn("at most 1024", self.assertRefused("token", token="t" * 20000))
        self.assertRefused("token_file", token="x", token_file="/nonexistent")
        self.assertIn("cannot read token_file", self.assertRefused(
            "token_file", token_file="/nonexistent/token"))
        d = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        empty = os.path.join(d, "empty")
        open(empty, "w").close()
        self.assertIn("empty", self.assertRefused("token_file", token_file=empty))
        shutil.rmtree(d)

    def test_tls(self):
        self.assertRefused("tls_key", tls_cert="/etc/hostname")
        self.assertRefused("tls_cert", tls_key="/etc/hostname")
        self.assertIn("cannot read tls_ca", self.assertRefused("tls_ca", tls_ca="/nonexistent.pem"))
        self.assertIn("not PEM", self.assertRefused("tls_ca", tls_ca="/etc/hostname"))
        self.assertRefused("tls_server_name", tls_server_name="coord.example")

    def test_timeout(self):
        for bad in (0, -1, float("inf"), float("nan"), "10s", True, 1e10):
            self.assertRefused("timeout", timeout=bad)
        conn = shardline.Connection("127.0.0.1:7070")
        with self.assertRaises(ValueError) as cm:
            conn.call("JobService.GetJob", job_pb2.GetJobRequest(job_id="x"), timeout=-1)
        self.assertIn("timeout", str(cm.exception))
        conn.close()
        with self.assertRaises(ValueError) as cm:
            conn.call("JobService.GetJob", job_pb2.GetJobRequest(job_id="x"))
        self.assertIn("closed", str(cm.exception))


class PackagingTest(unittest.TestCase):
    def test_missing_stubs_say_how_to_make_them(self):
        # A copy of the package without the generated modules.
        import shardline as pkg
        d = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        src = os.path.dirname(os.path.realpath(pkg.__file__))
        shutil.copytree(src, os.path.join(d, "shardline"),
                        ignore=shutil.ignore_patterns("*_pb2.py", "*_pb2_grpc.py", "__pycache__"))
        run = subprocess.run([sys.executable, "-c", "import shardline"], cwd=d,
                             env={"PYTHONPATH": d, "PATH": os.environ.get("PATH", "")},
                             capture_output=True, text=True, timeout=60)
        shutil.rmtree(d)
        self.assertNotEqual(run.returncode, 0)
        self.assertIn("ImportError", run.stderr)
        self.assertIn("generate_stubs.sh", run.stderr)
        self.assertIn("pip install ./python", run.stderr)

    def test_errors_pickle_and_classes(self):
        import pickle
        e = shardline.NotFoundError("no job x", address="h:1")
        back = pickle.loads(pickle.dumps(e))
        self.assertIsInstance(back, shardline.NotFoundError)
        self.assertEqual((back.code, back.message, back.address),
                         (grpc.StatusCode.NOT_FOUND, "no job x", "h:1"))
        self.assertEqual(str(back), "NOT_FOUND: no job x (at h:1)")
        self.assertEqual(shardline.errors.error_class(grpc.StatusCode.DATA_LOSS),
                         shardline.DataLossError)


if __name__ == "__main__":
    unittest.main()
