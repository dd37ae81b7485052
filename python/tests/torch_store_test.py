"""shardline.torch.Store against a real coordinator: every method, its
timeouts and errors, the C++ trampoline path (PrefixStore), a 4-rank gloo
process group initialised through it, and fencing of a lost member."""

import datetime
import os
import signal
import subprocess
import sys
import threading
import time
import unittest

import torch.distributed as dist

import shardline
from shardline import errors
from shardline.member import Member
from shardline.torch import Store

from coordinator import Coordinator

HERE = os.path.dirname(os.path.abspath(__file__))


def external_spec(min_workers, max_workers, heartbeat_timeout="5s", last_call="0.2s"):
    return {
        "name": "store test",
        "external": {"framework": "torchrun"},
        "elastic": {"min_workers": min_workers, "max_workers": max_workers,
                    "heartbeat_interval": "0.2s", "heartbeat_timeout": heartbeat_timeout,
                    "last_call": last_call, "join_timeout": "60s"},
    }


def stop(pid):
    """SIGSTOP and wait until the kernel shows the process stopped (a signal
    is delivered asynchronously: a call sent at once could still be served)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with open("/proc/%d/stat" % pid) as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        time.sleep(0.005)
    raise AssertionError("process %d did not stop" % pid)


def create(address, job_id, spec, token=None):
    with shardline.Client(address, token=token) as c:
        job, worker_token = c.create_job(spec, job_id=job_id)
    return job, worker_token


class StoreTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.coord = Coordinator()
        cls.coord.start()
        cls.conn = shardline.Connection(cls.coord.address, timeout=10)
        create(cls.coord.address, "store", external_spec(1, 1))
        cls.member = Member(cls.conn, "store", "m0")
        cls.member.join()
        a = cls.member.wait_assignment(30)
        assert (a.rank, a.world_size) == (0, 1), a

    @classmethod
    def tearDownClass(cls):
        cls.member.leave("done")
        cls.conn.close()
        cls.coord.stop()

    def store(self, scope, timeout=2.0):
        return Store(self.member, scope=scope, timeout=datetime.timedelta(seconds=timeout))

    def test_set_get_bytes_and_str(self):
        s = self.store("setget")
        s.set("a", b"\x00\xffbytes")
        s.set("b", "text")
        self.assertEqual(s.get("a"), b"\x00\xffbytes")
        self.assertEqual(s.get("b"), b"text")
        s.set("a", b"")
        self.assertEqual(s.get("a"), b"")

    def test_get_waits_for_a_later_set(self):
        s = self.store("later")
        t = threading.Timer(0.3, lambda: self.store("later").set("k", b"v"))
        t.start()
        start = time.monotonic()
        self.assertEqual(s.get("k"), b"v")
        self.assertGreaterEqual(time.monotonic() - start, 0.25)
        t.join()

    def test_get_times_out_with_the_store_timeout(self):
        s = self.store("timeout", timeout=0.5)
        start = time.monotonic()
        with self.assertRaises(errors.DeadlineExceededError) as cm:
            s.get("missing")
        took = time.monotonic() - start
        self.assertGreaterEqual(took, 0.45)
        self.assertLess(took, 5.0)
        self.assertIn("missing", cm.exception.message)

    def test_add_counts_and_reads_as_text(self):
        s = self.store("add")
        self.assertEqual(s.add("n", 3), 3)
        self.assertEqual(s.add("n", -1), 2)
        self.assertEqual(s.add("n", 0), 2)
        self.assertEqual(s.get("n"), b"2")
        s.set("text", b"abc")
        with self.assertRaises(errors.FailedPreconditionError):
            s.add("text", 1)

    def test_compare_set_follows_tcpstore(self):
        s = self.store("cas")
        # Missing key, empty expected: stores desired.
        self.assertEqual(s.compare_set("k", "", "one"), b"one")
        self.assertEqual(s.get("k"), b"one")
        # Mismatch: unchanged, returns the current value.
        self.assertEqual(s.compare_set("k", "zzz", "two"), b"one")
        self.assertEqual(s.get("k"), b"one")
        # Match: swaps.
        self.assertEqual(s.compare_set("k", "one", "two"), b"two")
        self.assertEqual(s.get("k"), b"two")
        # Missing key, non-empty expected: returns expected, stores nothing.
        self.assertEqual(s.compare_set("absent", "x", "y"), b"x")
        self.assertFalse(s.check(["absent"]))
        # Existing empty value matches an empty expected.
        s.set("empty", b"")
        self.assertEqual(s.compare_set("empty", "", "full"), b"full")

    def test_wait_check_delete_num_keys(self):
        s = self.store("wait")
        other = self.store("wait-other")
        with self.assertRaises(errors.DeadlineExceededError) as cm:
            s.wait(["x", "y"], datetime.timedelta(seconds=0.3))
        self.assertIn("x", cm.exception.message)
        s.set("x", b"1")
        self.assertFalse(s.check(["x", "y"]))
        s.set("y", b"2")
        s.wait(["x", "y"])
        self.assertTrue(s.check(["x", "y"]))
        other.set("z", b"3")
        self.assertEqual(s.num_keys(), 2)
        self.assertEqual(other.num_keys(), 1)
        self.assertTrue(s.delete_key("x"))
        self.assertFalse(s.delete_key("x"))
        self.assertEqual(s.num_keys(), 1)

    def test_cpp_names_and_the_trampoline(self):
        s = self.store("cpp")
        self.assertEqual(s.compareSet("k", "", "v"), b"v")
        self.assertEqual(s.getNumKeys(), 1)
        self.assertTrue(s.deleteKey("k"))
        # torch's C++ PrefixStore calls the Python methods through pybind.
        p = dist.PrefixStore("pre", s)
        p.set("a", "1")
        self.assertEqual(p.get("a"), b"1")
        self.assertEqual(p.add("c", 5), 5)
        p.wait(["a", "c"])
        self.assertEqual(s.get("pre/a"), b"1")

    def test_wrong_types_are_named(self):
        s = self.store("types")
        with self.assertRaises(TypeError) as cm:
            s.set("k", 5)
        self.assertIn("value must be bytes or str, not int", str(cm.exception))
        with self.assertRaises(TypeError):
            s.set(7, b"v")
        with self.assertRaises(TypeError):
            s.add("c", 1.7)
        with self.assertRaises(TypeError):
            s.wait("kk")
        with self.assertRaises(TypeError):
            Store(self.member, scope=5)
        for bad in (0, -1, float("nan"), float("inf"), 1e9):
            with self.assertRaises(ValueError):
                Store(self.member, timeout=bad)
        self.assertEqual(s.num_keys(), 0)  # nothing was stored

    def test_calls_are_bounded_by_the_store_timeout_when_the_coordinator_hangs(self):
        coord = Coordinator()
        coord.start()
        try:
            create(coord.address, "hang", external_spec(1, 1))
            with shardline.Connection(coord.address, timeout=30) as conn:
                m = Member(conn, "hang", "m0")
                m.join()
                m.wait_assignment(30)
                s = Store(m, timeout=1.5)
                s.set("k", b"v")
                stop(coord.process.pid)
                try:
                    for call in (lambda: s.set("k", b"w"), lambda: s.get("missing"),
                                 lambda: s.num_keys()):
                        start = time.monotonic()
                        with self.assertRaises(errors.DeadlineExceededError):
                            call()
                        self.assertLess(time.monotonic() - start, 1.5 + 3)
                finally:
                    os.kill(coord.process.pid, signal.SIGCONT)
                m.leave("done")
        finally:
            coord.stop()

    def test_limits_are_named(self):
        s = self.store("limits")
        with self.assertRaises(errors.InvalidArgumentError) as cm:
            s.set("k" * 600, b"v")
        self.assertIn("512", cm.exception.message)
        with self.assertRaises(errors.InvalidArgumentError):
            s.set("big", b"x" * (1024 * 1024 + 1))
        with self.assertRaises(ValueError):
            Store(self.member, scope="s" * 300)


class GenerationTest(unittest.TestCase):
    """A generation's end aborts its store; a lost member is fenced."""

    @classmethod
    def setUpClass(cls):
        cls.coord = Coordinator()
        cls.coord.start()

    @classmethod
    def tearDownClass(cls):
        cls.coord.stop()

    def test_blocked_get_is_aborted_when_the_generation_ends(self):
        create(self.coord.address, "gen-end", external_spec(1, 1))
        with shardline.Connection(self.coord.address) as conn:
            m = Member(conn, "gen-end", "m0")
            m.join()
            m.wait_assignment(30)
            s = Store(m, timeout=60)
            got = []

            def blocked():
                try:
                    s.get("never")
                except errors.ShardlineError as e:
                    got.append(e)
            t = threading.Thread(target=blocked)
            t.start()
            time.sleep(0.3)
            new_generation = m.restart_generation("test restarts the round")
            t.join(15)
            self.assertFalse(t.is_alive(), "the blocked get did not return")
            self.assertIsInstance(got[0], errors.AbortedError)
            self.assertEqual(new_generation, s.generation + 1)
            a = m.wait_assignment(30)
            self.assertEqual(a.generation, new_generation)
            # The old store stays fenced; a new one works.
            with self.assertRaises(errors.AbortedError):
                s.set("k", b"v")
            Store(m).set("k", b"v")
            m.leave("done")

    def test_lost_member_is_fenced_then_rejoins_a_later_generation(self):
        # m1 lives in a child process that we SIGSTOP: its heartbeats stop
        # and the coordinator declares it LOST after heartbeat_timeout.
        # The first generation forms when both have joined (max_workers; the
        # child's torch import takes seconds, so the last call is long); the
        # recoveries after it form as soon as the survivors re-join.
        create(self.coord.address, "lost", external_spec(1, 2, heartbeat_timeout="1s",
                                                          last_call="60s"))
        child = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "store_child.py"), "fenced",
             self.coord.address, "lost", "m1"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        with shardline.Connection(self.coord.address) as conn:
            m0 = Member(conn, "lost", "m0")
            m0.join()
            a = m0.wait_assignment(60)
            self.assertEqual(a.world_size, 2)
            line = child.stdout.readline()
            self.assertTrue(line.startswith("assigned generation=%d" % a.generation), line)
            stop(child.pid)
            try:
                deadline = time.monotonic() + 20
                while not m0.reform_pending and time.monotonic() < deadline:
                    time.sleep(0.05)
                self.assertTrue(m0.reform_pending, "m1's loss did not end the generation")
                m0.rejoin()
                b = m0.wait_assignment(30)
                self.assertEqual((b.generation, b.world_size), (a.generation + 1, 1))
                with shardline.Client(self.coord.address) as c:
                    states = {m.worker_id: m.state for m in c.members("lost").members}
                from shardline.v1 import session_pb2
                self.assertEqual(states["m1"], session_pb2.MEMBER_STATE_LOST)
            finally:
                os.kill(child.pid, signal.SIGCONT)
            # m1 comes back: its join grows the job (world 1 < max 2), so m0
            # re-joins too, as a torchrun agent would on num_nodes_waiting.
            later = []

            def follow():
                deadline = time.monotonic() + 30
                while not m0.reform_pending and time.monotonic() < deadline:
                    time.sleep(0.02)
                later.append(m0.wait_assignment(30))
            t = threading.Thread(target=follow)
            t.start()
            out, _ = child.communicate(timeout=60)
            t.join(40)
            # The child's old store was refused; it re-joined and was
            # admitted to a later generation beside m0.
            self.assertIn("old store refused: ABORTED", out)
            self.assertRegex(out, r"rejoined generation=%d world=2" % later[0].generation)
            self.assertGreater(later[0].generation, b.generation)
            self.assertEqual(later[0].world_size, 2)
            self.assertEqual(child.returncode, 0, out)
            m0.leave("done")


class ProcessGroupTest(unittest.TestCase):
    def test_gloo_process_group_of_4_ranks_all_reduces(self):
        with Coordinator() as coord:
            create(coord.address, "pg", external_spec(4, 4))
            children = [subprocess.Popen(
                [sys.executable, os.path.join(HERE, "store_child.py"), "allreduce",
                 coord.address, "pg", "w%d" % i],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(4)]
            outs = [c.communicate(timeout=120)[0] for c in children]
            for c, out in zip(children, outs):
                self.assertEqual(c.returncode, 0, out)
            ranks = sorted(int(o.split("rank=")[1].split()[0]) for o in outs)
            self.assertEqual(ranks, [0, 1, 2, 3])
            for out in outs:
                # all_reduce of rank+1 over 4 ranks: 1+2+3+4.
                self.assertIn("all_reduce=10.0", out)
                self.assertIn("all_gather=[1.0, 2.0, 3.0, 4.0]", out)


class ErrorTest(unittest.TestCase):
    def test_unknown_job(self):
        with Coordinator() as coord, shardline.Connection(coord.address) as conn:
            with self.assertRaises(errors.NotFoundError) as cm:
                Member(conn, "no-such-job", "m0").join()
            self.assertIn("no-such-job", cm.exception.message)

    def test_wrong_token(self):
        with Coordinator(admin_token="a" * 32) as coord:
            create(coord.address, "auth", external_spec(1, 1), token="a" * 32)
            with shardline.Connection(coord.address, token="b" * 32) as conn:
                with self.assertRaises((errors.UnauthenticatedError,
                                        errors.PermissionDeniedError)):
                    Member(conn, "auth", "m0").join()

    def test_unreachable_coordinator(self):
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        start = time.monotonic()
        with shardline.Connection("127.0.0.1:%d" % port, timeout=2) as conn:
            with self.assertRaises(errors.UnavailableError) as cm:
                Member(conn, "job", "m0").join()
        self.assertLess(time.monotonic() - start, 10)
        self.assertIn("127.0.0.1:%d" % port, str(cm.exception))


if __name__ == "__main__":
    unittest.main()
