"""torchrun (Debian's torch 1.13) on Shardline's rendezvous backend only:
3 agents on loopback train deploy/torch/train_ddp.py (gloo DDP); one agent
is SIGKILLed mid-training (its whole node: agent and worker) and the
survivors re-rendezvous at the next generation and finish; a fourth agent
that joins later is admitted at the next round; `shardctl members` lists
the agents; a job of the wrong kind is one clear error."""

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import shardline
from shardline.v1 import job_pb2, session_pb2

from coordinator import Coordinator, repo_path, binary_path

STEP = re.compile(r"^step=(\d+) loss=([\d.]+) world=(\d+) restart=(\d+) time=([\d.]+)", re.M)


class Agent:
    """One torchrun agent (python3 -m shardline.torchrun) in its own session,
    so killing its process group takes its workers too (a lost node)."""

    def __init__(self, address, job_id, workdir, name, nnodes, steps, extra_conf=""):
        self.log_path = os.path.join(workdir, name + ".log")
        self.log = open(self.log_path, "w")
        conf = "last_call_timeout=1,heartbeat_interval=0.5,heartbeat_timeout=10,join_timeout=120"
        if extra_conf:
            conf += "," + extra_conf
        env = dict(os.environ, OMP_NUM_THREADS="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "shardline.torchrun", "--nnodes", nnodes,
             "--nproc_per_node", "1", "--rdzv_endpoint", address, "--rdzv_id", job_id,
             "--rdzv_conf", conf, "--max_restarts", "3", "--monitor_interval", "0.5",
             repo_path("deploy/torch/train_ddp.py"), "--data",
             repo_path("data/tinyshakespeare.txt"), "--steps", str(steps), "--step-sleep", "0.1",
             "--save-every", "5", "--checkpoint-dir", os.path.join(workdir, "ckpt")],
            stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def text(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def steps(self):
        return [(int(m[0]), float(m[1]), int(m[2]), int(m[3]), float(m[4]))
                for m in STEP.findall(self.text())]

    def kill_node(self):
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)
        self.log.close()


def all_steps(agents):
    out = []
    for a in agents:
        out += a.steps()
    return sorted(out, key=lambda s: s[4])


def wait_for(fn, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError("timed out after %d s waiting for %s" % (timeout, what))


class TorchrunTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="torchrun-test-")
        self.coord = Coordinator()
        self.coord.start()
        self.agents = []

    def tearDown(self):
        for a in self.agents:
            a.stop()
        self.coord.stop()

    def shardctl_env(self):
        env = dict(os.environ, SHARDLINE_COORDINATOR=self.coord.address)
        env.pop("SHARDLINE_TOKEN", None)
        return env

    def agent(self, job, name, nnodes, steps):
        a = Agent(self.coord.address, job, self.dir, name, nnodes, steps)
        self.agents.append(a)
        return a

    def describe(self):
        return "\n".join("--- %s\n%s" % (a.log_path, a.text()[-3000:]) for a in self.agents)

    def test_survivors_of_a_killed_node_re_rendezvous_and_finish(self):
        for i in range(3):
            self.agent("kill", "agent%d" % i, "2:3", 70)
        first = wait_for(lambda: [s for s in all_steps(self.agents) if s[0] >= 15],
                         240, "step 15 with 3 agents\n" + self.describe())
        self.assertEqual(first[0][2], 3, "the first round should hold all 3 agents")
        # shardctl members shows the three agents holding ranks 0..2.
        out = subprocess.run([binary_path("client/shardctl/shardctl"), "members", "kill"],
                             capture_output=True, text=True, timeout=30, env=self.shardctl_env())
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(len(re.findall(r"\bACTIVE\b", out.stdout)), 3, out.stdout)
        # Kill a node that does not print steps (not rank 0's).
        victim = next(a for a in self.agents[::-1] if not a.steps())
        with shardline.Client(self.coord.address) as c:
            generation = c.get_job("kill").generation
        t_kill = time.time()
        victim.kill_node()
        survivors = [a for a in self.agents if a is not victim]
        for a in survivors:
            a.proc.wait(240)
        self.assertEqual([a.proc.returncode for a in survivors], [0, 0], self.describe())
        after = [s for s in all_steps(survivors) if s[4] > t_kill]
        self.assertTrue(after, self.describe())
        self.assertTrue(all(s[2] == 2 for s in after), after[:3])
        # New workers (world 2) resumed from the last checkpoint, at or before
        # the last step seen with world 3.
        before = max(s[0] for s in all_steps(self.agents) if s[4] <= t_kill)
        self.assertLessEqual(after[0][0], before + 1)
        print("killed after step %d; first resumed step %d (world 2) %.2f s after the kill"
              % (before, after[0][0], after[0][4] - t_kill))
        self.assertEqual(max(s[0] for s in after), 70)
        with shardline.Client(self.coord.address) as c:
            job = c.get_job("kill")
            members = {m.worker_id: m for m in c.members("kill").members}
        self.assertGreater(job.generation, generation)
        self.assertEqual(job.phase, job_pb2.JOB_PHASE_COMPLETED, job.phase_reason)
        lost = [m for m in members.values() if m.state == session_pb2.MEMBER_STATE_LOST]
        self.assertEqual(len(lost), 1, members)
        self.assertEqual(lost[0].loss_reason, session_pb2.LOSS_REASON_STREAM_BROKEN)

    def test_a_fourth_agent_is_admitted_at_the_next_round(self):
        for i in range(3):
            self.agent("grow", "agent%d" % i, "2:4", 60)
        wait_for(lambda: [s for s in all_steps(self.agents) if s[0] >= 10], 240,
                 "step 10 with 3 agents\n" + self.describe())
        self.assertTrue(all(s[2] == 3 for s in all_steps(self.agents)))
        self.agent("grow", "agent-late", "2:4", 60)
        wait_for(lambda: [s for s in all_steps(self.agents) if s[2] == 4], 240,
                 "a step with world 4\n" + self.describe())
        for a in self.agents:
            a.proc.wait(240)
        self.assertEqual([a.proc.returncode for a in self.agents], [0] * 4, self.describe())
        self.assertEqual(max(s[0] for s in all_steps(self.agents)), 60)
        with shardline.Client(self.coord.address) as c:
            job = c.get_job("grow")
            members = c.members("grow").members
        self.assertEqual(job.phase, job_pb2.JOB_PHASE_COMPLETED, job.phase_reason)
        self.assertEqual(job.world_size, 4)
        # Four agents, each of which left when its workers finished.
        self.assertEqual(len(members), 4, members)
        self.assertTrue(all(m.state == session_pb2.MEMBER_STATE_LEFT for m in members), members)

    def test_a_node_declared_lost_is_fenced_and_rejoins_a_later_round(self):
        # agent2's agent process (not its worker) is frozen: its heartbeats
        # stop and the coordinator declares it LOST after heartbeat_timeout.
        for i in range(3):
            self.agents.append(Agent(self.coord.address, "freeze", self.dir, "agent%d" % i,
                                     "2:3", 80, extra_conf="heartbeat_timeout=2"))
        wait_for(lambda: [s for s in all_steps(self.agents) if s[0] >= 10], 240,
                 "step 10 with 3 agents\n" + self.describe())
        frozen = next(a for a in self.agents[::-1] if not a.steps())
        with shardline.Client(self.coord.address) as c:
            generation = c.get_job("freeze").generation
        os.kill(frozen.proc.pid, signal.SIGSTOP)
        try:
            def lost():
                with shardline.Client(self.coord.address) as c:
                    ms = {m.worker_id: m for m in c.members("freeze").members}
                return [m for m in ms.values() if m.state == session_pb2.MEMBER_STATE_LOST]
            gone = wait_for(lost, 60, "the frozen agent declared LOST\n" + self.describe())
            self.assertEqual(len(gone), 1)
            self.assertEqual(gone[0].loss_reason, session_pb2.LOSS_REASON_HEARTBEAT_TIMEOUT)
            t_lost = time.time()
            # The others train on without it.
            wait_for(lambda: [s for s in all_steps(self.agents) if s[4] > t_lost and s[2] == 2],
                     120, "a step with world 2\n" + self.describe())
        finally:
            os.kill(frozen.proc.pid, signal.SIGCONT)
        # Thawed, it finds its round gone (its old fence is refused), joins
        # the next round, and the job grows back to 3 nodes.
        t_thaw = time.time()
        wait_for(lambda: [s for s in all_steps(self.agents) if s[4] > t_thaw and s[2] == 3],
                 180, "a step with world 3 after the thaw\n" + self.describe())
        for a in self.agents:
            a.proc.wait(240)
        self.assertEqual([a.proc.returncode for a in self.agents], [0, 0, 0], self.describe())
        with shardline.Client(self.coord.address) as c:
            job = c.get_job("freeze")
            events = list(c.watch("freeze", after_sequence=0))
        self.assertEqual(job.phase, job_pb2.JOB_PHASE_COMPLETED, job.phase_reason)
        self.assertGreaterEqual(job.generation, generation + 2)
        text = "\n".join(str(e) for e in events)
        self.assertIn("heartbeat", text.lower())

    def test_a_gpt_job_is_refused_with_one_clear_error(self):
        spec = open(repo_path("deploy/jobs/shakespeare-demo.yaml")).read()
        path = os.path.join(self.dir, "gpt.yaml")
        with open(path, "w") as f:
            f.write(spec)
        subprocess.run([binary_path("client/shardctl/shardctl"), "job", "create", path,
                        "--id", "gpt"], check=True, capture_output=True, timeout=30,
                       env=self.shardctl_env())
        a = self.agent("gpt", "agent0", "1:1", 5)
        a.proc.wait(120)
        self.assertNotEqual(a.proc.returncode, 0)
        text = a.text()
        self.assertIn("job gpt is a GPT training job", text)
        self.assertIn("RendezvousStateError", text)


if __name__ == "__main__":
    unittest.main()
