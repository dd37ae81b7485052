#!/usr/bin/python3
"""Benchmark `torchrun_backend` (bench/README.md, issue 16): torchrun with
Shardline's rendezvous backend (`python3 -m shardline.torchrun`, the
coordinator holding the rendezvous) vs torchrun's own c10d backend (a
TCPStore in the first agent), same torch 1.13, same elastic DDP script
(deploy/torch/train_ddp.py), same machine, in one run:

  recovery  3 agents (--nnodes 2:3 --nproc_per_node 1 --max_restarts 3);
            after step 15 one agent's whole process group (agent and its
            worker: a host going down) is SIGKILLed; the time from the kill
            to the first step line of the next round (world 2).
            c10d twice: with torch's defaults, and with the monitor interval
            the Shardline run uses, to tell the backend from the interval.
  startup   N agents (--nnodes N:N) launched at once; the time to the first
            step line.

    bench/control_plane/torchrun_backend.py --out bench/out/torchrun_backend.csv [--quick]
"""
import os
import re
import signal
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
from _common import benchlib  # noqa: E402

NAME = "torchrun_backend"
TRAIN = os.path.join(_common.REPO, "deploy", "torch", "train_ddp.py")
DATA = os.path.join(_common.REPO, "data", "tinyshakespeare.txt")
PYDIR = os.path.join(_common.REPO, "python")
KILL_AFTER_STEP = 15
STEP_SLEEP = 0.1           # s per step on top of the step itself (~0.1-0.2 s in all)
MONITOR_INTERVAL = 0.5     # s: python3 -m shardline.torchrun's default (torch 1.13's: 5 s); also the tuned c10d run's
RECOVERY_STEPS = 400       # training must still run when it recovers (up to a minute later)
# The Shardline run's rdzv_conf: the same last call and join timeout as
# torch's c10d defaults (30 s, 600 s), so that only the backend differs.
SHARDLINE_CONF = "last_call_timeout=30,join_timeout=600"
STEP_RE = re.compile(r"^step=(\d+) loss=\S+ world=(\d+) restart=(\d+) time=([\d.]+)", re.M)
PEER_DEFAULT = "torchrun c10d (torch defaults)"
PEER_TUNED = "torchrun c10d (--monitor_interval %g)" % MONITOR_INTERVAL


read = _common.read
wait_until = _common.wait_until


def steps(logs):
    """Every step line of the agents' logs: (time, step, world, restart)."""
    out = []
    for p in logs:
        for m in STEP_RE.finditer(read(p)):
            out.append((float(m.group(4)), int(m.group(1)), int(m.group(2)), int(m.group(3))))
    return out


def ensure_stubs():
    """Generates python/shardline/v1/*_pb2*.py from proto/ (python/generate_stubs.sh)."""
    gen = os.path.join(PYDIR, "generate_stubs.sh")
    if not os.path.exists(os.path.join(PYDIR, "shardline", "torchrun.py")):
        raise RuntimeError("python/shardline/torchrun.py is missing (the shardline package)")
    if not os.path.exists(gen):
        raise RuntimeError("python/generate_stubs.sh is missing")
    # Every time: stubs left from an older proto/ would be wrong, and it takes 0.1 s.
    subprocess.run([gen], check=True, cwd=_common.REPO, stdout=subprocess.DEVNULL, timeout=300)


class Run:
    """One torchrun job: `backend` "shardline" (its own coordinator), "c10d" (torch's
    defaults) or "c10d-tuned" (--monitor_interval MONITOR_INTERVAL); agents started by
    start(), each in its own session (its worker is in its process group)."""

    def __init__(self, backend, label, nnodes, train_steps):
        self.backend, self.nnodes, self.train_steps = backend, nnodes, train_steps
        self.dir = _common.tmpdir("%s/%s" % (NAME, label))
        subprocess.run(["rm", "-rf", self.dir])
        os.makedirs(self.dir)
        self.agents = []
        self.coord = None
        self.env = dict(os.environ, OMP_NUM_THREADS="1")
        self.env.pop("SHARDLINE_TOKEN", None)
        if backend == "shardline":
            self.coord = _common.Coordinator("%s-%s" % (NAME, label.replace("/", "-")))
            self.endpoint = self.coord.address
            self.env["PYTHONPATH"] = PYDIR + (":" + os.environ["PYTHONPATH"]
                                              if os.environ.get("PYTHONPATH") else "")
            self.launcher = [_common.PYTHON, "-m", "shardline.torchrun",
                             "--rdzv_conf", SHARDLINE_CONF,
                             "--monitor_interval", str(MONITOR_INTERVAL)]
        else:
            self.port = _common.free_port()
            self.endpoint = "127.0.0.1:%d" % self.port
            self.launcher = [_common.PYTHON, os.path.join(_common.HERE, "_torchrun.py"),
                             "--rdzv_backend", "c10d"]
            if backend == "c10d-tuned":
                self.launcher += ["--monitor_interval", str(MONITOR_INTERVAL)]

    def argv(self):
        return self.launcher + [
            "--nnodes", self.nnodes, "--nproc_per_node", "1", "--max_restarts", "3",
            "--rdzv_endpoint", self.endpoint, "--rdzv_id", "bench-job", TRAIN,
            "--data", DATA, "--steps", str(self.train_steps),
            "--checkpoint-dir", os.path.join(self.dir, "ckpt"), "--save-every", "5",
            "--step-sleep", str(STEP_SLEEP)]

    def start(self):
        i = len(self.agents)
        self.agents.append(_common.Server(self.argv(), os.path.join(self.dir, "agent%d.log" % i),
                                          env=self.env))
        return self.agents[-1]

    @property
    def logs(self):
        return [a.log_path for a in self.agents]

    def any_alive(self):
        return any(a.alive() for a in self.agents)

    def tails(self, n=6):
        return " | ".join("agent%d: %s" % (i, a.tail(n).replace("\n", " / "))
                          for i, a in enumerate(self.agents))

    def stop(self):
        for a in self.agents:
            a.stop()
        if self.coord is not None:
            self.coord.stop()


def recovery_once(backend, rep):
    run = Run(backend, "recovery-%s-%d" % (backend, rep), "2:3", RECOVERY_STEPS)
    try:
        run.start()
        if backend != "shardline":
            # The first agent hosts c10d's TCPStore (the first to bind the port);
            # let it, so that the victim (the last one) is not the store's host.
            if not _common.wait_port(run.port, 120):
                raise RuntimeError("c10d's TCPStore did not open: " + run.tails())
        for _ in range(2):
            time.sleep(0.3)
            run.start()
        got = wait_until(lambda: max((s[1] for s in steps(run.logs)), default=0) >= KILL_AFTER_STEP
                         or not run.any_alive(), 600)
        before = steps(run.logs)
        if not got or not before or max(s[1] for s in before) < KILL_AFTER_STEP:
            raise RuntimeError("no step %d within 600 s: %s" % (KILL_AFTER_STEP, run.tails()))
        world = before[-1][2]
        if world != 3:
            raise RuntimeError("the first round has world %d, not 3: %s" % (world, run.tails()))
        restart = max(s[3] for s in before)
        victim = run.agents[-1]
        killed_at = max(s[1] for s in before)
        t_kill = time.time()
        os.killpg(victim.proc.pid, signal.SIGKILL)

        # The next round's first step: world 2, or a higher restart count.
        # (torchrun counts only its workers' failures as restarts; an agent
        # that restarts them because num_nodes_waiting() says the round
        # ended, as Shardline's does, keeps TORCHELASTIC_RESTART_COUNT.)
        def resumed():
            after = [s for s in steps(run.logs)
                     if s[0] > t_kill and (s[2] != world or s[3] > restart)]
            return min(after) if after else None

        got = wait_until(resumed, 600)
        if got is None:
            raise RuntimeError("no step after the kill within 600 s: " + run.tails())
        benchlib.log("  %s: killed agent 2 after step %d; first step after it: step %d world %d "
                     "restart %d after %.3f s" % (backend, killed_at, got[1], got[2], got[3],
                                                  got[0] - t_kill))
        return got[0] - t_kill
    finally:
        run.stop()


def startup_once(backend, n, rep):
    run = Run(backend, "startup-%s-%d-%d" % (backend, n, rep), "%d:%d" % (n, n), 3)
    try:
        t0 = time.time()
        for _ in range(n):
            run.start()
        timeout = 120 + 60 * n
        got = wait_until(lambda: steps(run.logs) or not run.any_alive(), timeout, 0.1)
        first = steps(run.logs)
        if not got or not first:
            raise RuntimeError("no step within %d s: %s" % (timeout, run.tails()))
        t, step, world, _ = min(first)
        if world != n:
            raise RuntimeError("world %d, not %d" % (world, n))
        benchlib.log("  %s: %d agents, first step after %.3f s" % (backend, n, t - t0))
        return t - t0
    finally:
        run.stop()


def measure(fn, args, reps, failures, what):
    vals = []
    for rep in range(reps):
        try:
            vals.append(fn(*args, rep))
        except (RuntimeError, subprocess.SubprocessError, OSError) as e:
            benchlib.log("  %s failed: %s" % (what, e))
            failures.append("%s: %s" % (what, str(e).splitlines()[0][:160]))
    return vals


def med(vals):
    return statistics.median(vals) if vals else None


def note(vals, failures):
    n = "median of %d (%s s)" % (len(vals), " ".join("%.2f" % v for v in vals)) if vals else ""
    return "; ".join([n] + failures if n else failures).replace(",", ";")


def row_note(ratio, sl, sl_fails, peer, peer_fails):
    """The reason alone when Shardline has no value (the report shows it as
    "not measured (note)"); else the ratio and every repetition's value."""
    if not sl:
        return note([], sl_fails) or "no value"
    return "c10d/shardline %sx; shardline %s; peer %s" % (ratio, note(sl, sl_fails),
                                                          note(peer, peer_fails) or "no value")


def main():
    quick = benchlib.quick()
    out = benchlib.out_path("bench/out/%s.csv" % NAME)
    rows = benchlib.Rows(out, NAME)
    reps = 1 if quick else 3
    sizes = (2, 4) if quick else (2, 4, 8)
    shardline_error = None
    try:
        ensure_stubs()
    except (RuntimeError, subprocess.SubprocessError, OSError) as e:
        shardline_error = str(e).splitlines()[0][:160].replace(",", ";")
        benchlib.log("%s: the shardline side cannot run: %s" % (NAME, shardline_error))

    def shardline(fn, args, fails, what):
        if shardline_error:
            fails.append("not measured: " + shardline_error)
            return []
        return measure(fn, args, reps, fails, what)

    benchlib.log("%s: recovery, %d repetition(s) per backend" % (NAME, reps))
    fails = {"shardline": [], "c10d": [], "c10d-tuned": []}
    rec = {"shardline": shardline(recovery_once, ("shardline",), fails["shardline"], "shardline")}
    for b in ("c10d", "c10d-tuned"):
        rec[b] = measure(recovery_once, (b,), reps, fails[b], b)
    sl = med(rec["shardline"])
    ratios = []
    for b, peer in (("c10d", PEER_DEFAULT), ("c10d-tuned", PEER_TUNED)):
        pv = med(rec[b])
        r = "%.1f" % (pv / sl) if sl and pv else "n/a"
        ratios.append((peer, r))
        rows.add("SIGKILL an agent -> next round's step", "agents=3", sl, peer,
                 pv, "s", False, row_note(r, rec["shardline"], fails["shardline"], rec[b], fails[b]))

    benchlib.log("%s: startup, N = %s" % (NAME, " ".join(map(str, sizes))))
    start = {}
    for n in sizes:
        f_sl, f_pt = [], []
        s = shardline(startup_once, ("shardline", n), f_sl, "shardline N=%d" % n)
        p = measure(startup_once, ("c10d", n), reps, f_pt, "c10d N=%d" % n)
        start[n] = (med(s), med(p))
        r = "%.2f" % (med(p) / med(s)) if s and p else "n/a"
        rows.add("launch -> first step", "agents=%d" % n, med(s), PEER_DEFAULT, med(p),
                 "s", False, row_note(r, s, f_sl, p, f_pt))

    default_ratio = ratios[0][1]
    goal = "not measured"
    if default_ratio != "n/a":
        goal = "met" if float(default_ratio) >= 10 else "not met"
    benchlib.write_notes(out, """
**How measured.** The same elastic DDP script (`deploy/torch/train_ddp.py`: a byte-level MLP language model on
`data/tinyshakespeare.txt`, gloo, one worker per agent, a checkpoint every 5 steps, `--step-sleep %g` so a step
takes ~0.1-0.2 s; it prints `step=N ... restart=R time=T` per step on rank 0) under torchrun of Debian's torch
1.13.1, with two rendezvous backends: **Shardline** (`python3 -m shardline.torchrun --rdzv_endpoint COORDINATOR
--rdzv_conf %s --monitor_interval %g`, a `shardline-coordinator` with state in memory) and **torchrun c10d**
(`--rdzv_backend c10d`, a TCPStore hosted by the first agent; launched through `_torchrun.py`, which fixes torch
1.13's `Std.from_str` under Python 3.11), once with torch's defaults (last_call_timeout 30 s, keep-alive every
5 s and 3 missed ones to drop a node, `--monitor_interval` 5 s) and once with `--monitor_interval %g` like the
Shardline run. c10d's recovery waits for the lost node's keep-alives to lapse (3 x 5 s) and then, the new round
being below `--nnodes` MAX, for the last call (30 s); a run by hand with `last_call_timeout=1` took 19.7 s.
Shardline's coordinator ends the round when the lost agent's Session stream breaks and forms the next one as
soon as every survivor has re-joined (no last call in a recovery). *Recovery*: 3 agents (`--nnodes 2:3 --nproc_per_node 1 --max_restarts 3`) on loopback; after step
%d the script SIGKILLs the process group of the last agent started (the agent and its worker; never c10d's store
host) and takes the time to the first step line of the next round (its `time=`; world 2: c10d's agents restart
after their workers failed, which raises the restart count, Shardline's at the first monitor tick after the round
ended, which torchrun does not count as a restart).
*Startup*: N agents (`--nnodes N:N`) launched at once; the time to the first step line (c10d with torch's
defaults only: the monitor interval plays no part before the first step). Each backend's median
of %d repetition(s); every agent's worker imports torch, so on this 2-core machine the N = 8 rows are mostly
16 processes starting Python and torch. Recovery ratio c10d (torch defaults) / Shardline: %sx (goal >= 10x:
%s); with the same monitor interval: %sx.
""" % (STEP_SLEEP, SHARDLINE_CONF, MONITOR_INTERVAL, MONITOR_INTERVAL, KILL_AFTER_STEP, reps,
       default_ratio, goal, ratios[1][1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
