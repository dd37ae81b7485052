"""The "shardline" torchrun rendezvous handler in-process against a real
coordinator: rounds are generations, num_nodes_waiting reports a re-form at
once, set_closed/is_closed, shutdown, and one clear exception per bad input."""

import threading
import time
import unittest

from torch.distributed.elastic.rendezvous import api as rdzv_api
from torch.distributed.elastic.rendezvous import registry

import shardline
from shardline.torch import rendezvous
from shardline.v1 import job_pb2, session_pb2

from coordinator import Coordinator


def params(address, run_id, min_nodes=1, max_nodes=2, **conf):
    conf.setdefault("last_call_timeout", "0.3")
    conf.setdefault("heartbeat_interval", "0.2")
    conf.setdefault("join_timeout", "20")
    conf.setdefault("call_timeout", "3")
    return rdzv_api.RendezvousParameters("shardline", address, run_id, min_nodes, max_nodes,
                                         **conf)


def wait_for(fn, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if fn():
            return True
        time.sleep(0.01)
    return False


class HandlerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.coord = Coordinator()
        cls.coord.start()
        rendezvous.register()

    @classmethod
    def tearDownClass(cls):
        cls.coord.stop()

    def handler(self, run_id, worker_id, **kw):
        h = registry.handler_registry.create_handler(
            params(self.coord.address, run_id, worker_id=worker_id, **kw))
        self.addCleanup(h.shutdown)
        return h

    def test_rounds_are_generations_and_a_joiner_is_seen_at_once(self):
        h1 = self.handler("rounds", "node-a")
        self.assertEqual(h1.get_backend(), "shardline")
        self.assertEqual(h1.get_run_id(), "rounds")
        store1, rank, world = h1.next_rendezvous()
        self.assertEqual((rank, world), (0, 1))
        self.assertEqual(h1.num_nodes_waiting(), 0)
        store1.set("round1", b"x")
        with shardline.Client(self.coord.address) as c:
            job = c.get_job("rounds")
        self.assertTrue(job.spec.HasField("external"))
        self.assertEqual(job.spec.external.framework, "torchrun")
        self.assertEqual((job.spec.elastic.min_workers, job.spec.elastic.max_workers), (1, 2))
        first_generation = store1.generation

        # A second node joins below max_nodes: h1 learns of the pending
        # round from its Session stream, without an RPC of its own.
        h2 = self.handler("rounds", "node-b")
        got = {}
        t = threading.Thread(target=lambda: got.setdefault("h2", h2.next_rendezvous()))
        start = time.monotonic()
        t.start()
        self.assertTrue(wait_for(lambda: h1.num_nodes_waiting() == 1, 5))
        noticed = time.monotonic() - start
        self.assertLess(noticed, 5)
        store1b, rank1, world1 = h1.next_rendezvous()
        t.join(20)
        store2, rank2, world2 = got["h2"]
        self.assertEqual((world1, world2), (2, 2))
        self.assertEqual(sorted([rank1, rank2]), [0, 1])
        self.assertEqual(store1b.generation, store2.generation)
        self.assertGreater(store1b.generation, first_generation)
        # A new round's store starts empty; the old one is fenced.
        self.assertFalse(store1b.check(["round1"]))
        store2.set("shared", b"y")
        self.assertEqual(store1b.get("shared"), b"y")
        with self.assertRaises(shardline.AbortedError):
            store1.get("round1")
        self.assertEqual(h1.num_nodes_waiting(), 0)

        # An agent that restarts its workers while the round runs ends it
        # for everyone (torch's max_restarts path).
        t = threading.Thread(target=lambda: got.__setitem__("h2b", h2.next_rendezvous()))
        t.start()
        self.assertTrue(wait_for(lambda: h1.num_nodes_waiting() == 1, 5))
        s1c, _, w = h1.next_rendezvous()
        t.join(20)
        self.assertEqual((w, got["h2b"][2]), (2, 2))
        self.assertEqual(s1c.generation, store1b.generation + 1)

        # shutdown of both: the job completes.
        h1.shutdown()
        h2.shutdown()
        with shardline.Client(self.coord.address) as c:
            job = c.get_job("rounds")
        self.assertEqual(job.phase, job_pb2.JOB_PHASE_COMPLETED, job.phase_reason)

    def test_a_dead_node_is_reported_waiting_and_the_survivor_re_forms(self):
        h1 = self.handler("dead", "node-a", min_nodes=1, max_nodes=2)
        h2 = self.handler("dead", "node-b", min_nodes=1, max_nodes=2)
        got = {}
        t = threading.Thread(target=lambda: got.setdefault("h2", h2.next_rendezvous()))
        t.start()
        _, _, world = h1.next_rendezvous()
        t.join(20)
        self.assertEqual((world, got["h2"][2]), (2, 2))
        # node-b's process "dies": its stream is cut without LeaveJob.
        h2.member.close()
        self.assertTrue(wait_for(lambda: h1.num_nodes_waiting() == 1, 5))
        _, rank, world = h1.next_rendezvous()
        self.assertEqual((rank, world), (0, 1))
        with shardline.Client(self.coord.address) as c:
            members = {m.worker_id: m for m in c.members("dead").members}
        self.assertEqual(members["node-b"].state, session_pb2.MEMBER_STATE_LOST)
        self.assertEqual(members["node-a"].state, session_pb2.MEMBER_STATE_ACTIVE)

    def test_set_closed_completes_the_job_and_closes_every_handler(self):
        h1 = self.handler("closed", "node-a", min_nodes=1, max_nodes=1)
        h1.next_rendezvous()
        h2 = self.handler("closed", "node-b", min_nodes=1, max_nodes=1)
        self.assertFalse(h2.is_closed())
        h1.set_closed()
        self.assertTrue(h1.is_closed())
        self.assertTrue(h2.is_closed())
        with shardline.Client(self.coord.address) as c:
            self.assertEqual(c.get_job("closed").phase, job_pb2.JOB_PHASE_COMPLETED)
        with self.assertRaises(rdzv_api.RendezvousClosedError):
            h2.next_rendezvous()

    def test_a_cancelled_job_closes_the_rendezvous(self):
        h1 = self.handler("cancel", "node-a", min_nodes=1, max_nodes=1)
        h1.next_rendezvous()
        with shardline.Client(self.coord.address) as c:
            c.cancel_job("cancel", reason="operator")
        self.assertTrue(wait_for(h1.is_closed, 5))
        with self.assertRaises(rdzv_api.RendezvousClosedError) as cm:
            h1.next_rendezvous()
        self.assertIn("CANCELLED", str(cm.exception))


class BadInputTest(unittest.TestCase):
    """One clear exception each, no hang."""

    def test_unknown_job_without_create(self):
        with Coordinator() as coord:
            h = rendezvous.create_handler(params(coord.address, "nope", create="false",
                                                 worker_id="a"))
            with self.assertRaises(rdzv_api.RendezvousStateError) as cm:
                h.next_rendezvous()
            self.assertIn("NOT_FOUND", str(cm.exception))
            self.assertIn("nope", str(cm.exception))
            h.shutdown()

    def test_wrong_token(self):
        import tempfile
        with Coordinator(admin_token="a" * 32) as coord, \
                tempfile.NamedTemporaryFile("w", suffix=".token") as f:
            f.write("b" * 32)
            f.flush()
            h = rendezvous.create_handler(params(coord.address, "job", token_file=f.name,
                                                 worker_id="a"))
            with self.assertRaises(rdzv_api.RendezvousStateError) as cm:
                h.next_rendezvous()
            self.assertIn("UNAUTHENTICATED", str(cm.exception))
            h.shutdown()

    def test_unreachable_coordinator(self):
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        h = rendezvous.create_handler(params("127.0.0.1:%d" % port, "job", call_timeout="2",
                                             worker_id="a"))
        start = time.monotonic()
        with self.assertRaises(rdzv_api.RendezvousConnectionError) as cm:
            h.next_rendezvous()
        self.assertLess(time.monotonic() - start, 10)
        self.assertIn("127.0.0.1:%d" % port, str(cm.exception))
        h.shutdown()

    def test_job_of_the_wrong_kind(self):
        spec = {"name": "gpt", "model": {"num_layers": 2, "hidden_size": 16, "num_heads": 2,
                                         "vocab_size": 256, "seq_length": 16},
                "parallel": {"tp": 1, "pp": 1},
                "training": {"global_batch": 4, "micro_batch": 2, "train_steps": 10,
                             "learning_rate": 0.001},
                "data": {"dataset_path": "/dev/null"},
                "elastic": {"min_workers": 1}}
        with Coordinator() as coord:
            with shardline.Client(coord.address) as c:
                c.create_job(spec, job_id="gpt")
            h = rendezvous.create_handler(params(coord.address, "gpt", worker_id="a"))
            with self.assertRaises(rdzv_api.RendezvousStateError) as cm:
                h.next_rendezvous()
            self.assertIn("job gpt is a GPT training job", str(cm.exception))
            h.shutdown()

    def test_bad_rdzv_conf_and_nnodes(self):
        for key, value in (("join_timeout", "soon"), ("join_timeout", "nan"),
                           ("heartbeat_interval", "inf"), ("call_timeout", "-1"),
                           ("last_call_timeout", "1e10")):
            with self.assertRaises(ValueError) as cm:
                rendezvous.create_handler(params("127.0.0.1:1", "j", **{key: value}))
            self.assertIn("rdzv_conf %s=" % key, str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            rendezvous.create_handler(params("127.0.0.1:1", "j", join_timout="5"))
        self.assertIn("join_timout: not a key of the shardline backend", str(cm.exception))
        with self.assertRaises(ValueError):
            rendezvous.create_handler(params("", "j"))
        with self.assertRaises(ValueError) as cm:
            rendezvous.create_handler(params("garbage::", "j"))
        self.assertIn("--rdzv_endpoint='garbage::'", str(cm.exception))
        # torchrun's own legacy `timeout` key is accepted (and not used).
        rendezvous.create_handler(params("127.0.0.1:1", "j", timeout="900")).shutdown()

    def test_entry_point_returns_the_factory(self):
        # torch >= 2.5 calls the torchrun.handlers entry point with no
        # arguments and registers what it returns.
        self.assertIs(rendezvous.handler_generator(), rendezvous.create_handler)

    def test_shutdown_with_the_coordinator_gone_returns_false(self):
        coord = Coordinator()
        coord.start()
        h = rendezvous.create_handler(params(coord.address, "gone", worker_id="a",
                                             min_nodes=1, max_nodes=1, call_timeout="2"))
        h.next_rendezvous()
        coord.kill()
        start = time.monotonic()
        self.assertFalse(h.shutdown())
        self.assertLess(time.monotonic() - start, 10)


if __name__ == "__main__":
    unittest.main()
