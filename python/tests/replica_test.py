"""shardline.Connection with coordinator replicas: the leader hint of a follower is followed.

A one-member etcd and two coordinator replicas on it (--state etcd://...):
A leads, B follows and answers every leader-only RPC with UNAVAILABLE "not
the leader" and the shardline-leader metadata (coordinator.proto
"Replicas"). Clients given B first (or B alone) reach A.
"""

import time
import unittest

import grpc

import shardline
from shardline.v1 import job_pb2

from coordinator import Coordinator, Etcd

SPEC = {
    "name": "replicas",
    "model": {"num_layers": 2, "hidden_size": 64, "num_heads": 2, "vocab_size": 256,
              "seq_length": 32},
    "parallel": {"tp": 1, "pp": 1},
    "training": {"global_batch": 4, "micro_batch": 2, "train_steps": 10},
    "data": {"dataset_path": "data.txt"},
    "elastic": {"min_workers": 1},
}


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except shardline.ShardlineError as e:
            last = e
        time.sleep(0.1)
    raise AssertionError("%s within %gs (last error: %s)" % (what, timeout, last))


class LeaderHintTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.etcd = Etcd().start()
        # A long lease: a loaded machine must not make B the leader mid-test.
        flags = ["--lease-ttl", "10s"]
        cls.a = Coordinator(state=cls.etcd.url("/pytest"), args=flags).start()
        with shardline.Client(cls.a.address) as c:
            wait_for(lambda: c.status().leader_address == cls.a.address, 30, "A leads")
        cls.b = Coordinator(state=cls.etcd.url("/pytest"), args=flags).start()
        with shardline.Client(cls.b.address) as c:
            wait_for(lambda: c.status().leader_address == cls.a.address, 30,
                     "B knows that A leads")

    @classmethod
    def tearDownClass(cls):
        cls.b.stop()
        cls.a.stop()
        cls.etcd.stop()

    def test_follower_answers_not_the_leader_with_the_hint(self):
        # Through a raw channel: what the client has to deal with.
        from shardline.v1 import coordinator_pb2_grpc
        with grpc.insecure_channel(self.b.address) as channel:
            stub = coordinator_pb2_grpc.JobServiceStub(channel)
            with self.assertRaises(grpc.RpcError) as cm:
                stub.GetJob(job_pb2.GetJobRequest(job_id="x"), timeout=10)
        err = cm.exception
        self.assertEqual(err.code(), grpc.StatusCode.UNAVAILABLE)
        self.assertTrue(err.details().startswith("not the leader"), err.details())
        self.assertIn(("shardline-leader", self.a.address), list(err.trailing_metadata()))

    def test_calls_follow_the_hint(self):
        with shardline.Client([self.b.address, self.a.address]) as client:
            self.assertEqual(client.connection.leader, self.b.address)
            job, _ = client.create_job(SPEC, job_id="hinted")
            self.assertEqual(job.job_id, "hinted")
            self.assertEqual(client.connection.leader, self.a.address)
            self.assertEqual(client.get_job("hinted").job_id, "hinted")
            # GetStatus is served by any replica.
            self.assertEqual(client.status().leader_address, self.a.address)

    def test_a_learned_leader_address(self):
        # Only the follower is configured: the hint names an address the
        # connection makes a channel for.
        with shardline.Client(self.b.address) as client:
            client.create_job(SPEC, job_id="learned")
            self.assertEqual(client.connection.leader, self.a.address)
            self.assertEqual(client.connection.addresses, [self.b.address])
            stream = client.watch("learned", after_sequence=0)
            first = next(stream)
            self.assertEqual(first.job_id, "learned")
            stream.cancel()

    def test_a_stream_opened_on_the_follower_moves(self):
        with shardline.Client([self.b.address, self.a.address]) as client:
            with self.assertRaises(shardline.NotFoundError):
                next(client.watch("no-such-job"))
            self.assertEqual(client.connection.leader, self.a.address)


if __name__ == "__main__":
    unittest.main()
