#!/usr/bin/python3
"""Benchmark `node_loss` (bench/README.md, item 5): SIGKILL one of 4 workers
of a training job and time until training resumes (the first optimizer
step completed after the kill), Shardline vs torchrun (torch 1.13 elastic
agent, c10d rendezvous, --max_restarts) restarting an equivalent gloo DDP job.

    bench/control_plane/node_loss.py --out bench/out/node_loss.csv [--quick]
"""
import calendar
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

NAME = "node_loss"
WORKERS = 4
KILL_AFTER_STEP = 12



read = _common.read
wait_until = _common.wait_until


def utc_clock_to_epoch(hms, near):
    """'HH:MM:SS.mmm' (UTC, the clock part of common/log.h's time) -> epoch seconds closest to `near`."""
    h, m, s = hms.split(":")
    day = calendar.timegm(time.gmtime(near)[:3] + (0, 0, 0))
    t = day + int(h) * 3600 + int(m) * 60 + float(s)
    if t - near > 43200:
        t -= 86400
    elif near - t > 43200:
        t += 86400
    return t


def max_step(logs, pattern):
    best = 0
    for text in logs:
        for m in re.finditer(pattern, text):
            best = max(best, int(m.group(1)))
    return best


def first_shardline_resume(logs, skip, near):
    """(epoch time, step) of the earliest `recovery (...): ... first resumed
    step N` line in the worker logs but logs[skip], or None."""
    ts = []
    for i, p in enumerate(logs):
        if i == skip:
            continue
        for m in re.finditer(r"^\d{4}-\d\d-\d\dT(\d\d:\d\d:\d\d\.\d+)Z .*recovery \(.*first resumed step (\d+)",
                             read(p), re.M):
            ts.append((utc_clock_to_epoch(m.group(1), near), int(m.group(2))))
    return min(ts) if ts else None


def first_torch_restart_step(logs):
    """(epoch time, step, world) of the earliest step the torch peer logged
    after a restart, or None."""
    ts = []
    for p in logs:
        for m in re.finditer(r"^step (\d+) t=([\d.]+) rank \d+ world (\d+) restart [1-9]",
                             read(p), re.M):
            ts.append((float(m.group(2)), int(m.group(1)), int(m.group(3))))
    return min(ts) if ts else None


def shardline_once(rep, data):
    d = _common.tmpdir("node_loss/shardline-%d" % rep)
    subprocess.run(["rm", "-rf", d])
    os.makedirs(d)
    spec = os.path.join(d, "job.yaml")
    with open(spec, "w") as f:
        f.write(_common.tiny_gpt_spec("node-loss", data, os.path.join(d, "ckpt"), 2, 4, "200ms", "2s"))
    coord = _common.Coordinator("node-loss-coordinator-%d" % rep, state=os.path.join(d, "state.db"))
    workers = []
    try:
        env = dict(os.environ, SHARDLINE_COORDINATOR=coord.address)
        env.pop("SHARDLINE_TOKEN", None)
        subprocess.run([_common.bin_path("client/shardctl/shardctl"), "job", "create", spec, "--id", "nl"],
                       env=env, check=True, stdout=subprocess.DEVNULL, timeout=60)
        for i in range(WORKERS):
            workers.append(_common.Server(
                [_common.bin_path("worker/shardline-worker"), "--coordinator", coord.address,
                 "--job", "nl", "--worker-id", "w%d" % i, "--log-interval", "1",
                 "--connect-timeout", "30s"], os.path.join(d, "worker%d.log" % i), env=env))
        logs = [w.log_path for w in workers]
        step_re = r"gen \d+ step (\d+)/"
        if not wait_until(lambda: max_step(map(read, logs), step_re) >= KILL_AFTER_STEP or
                          not any(w.alive() for w in workers), 180, 0.05) or \
                not any(w.alive() for w in workers):
            raise RuntimeError("no step %d within 180 s: %s" % (KILL_AFTER_STEP,
                                                                 workers[0].tail(5)))
        # The victim: a worker that logs no steps (rank 0 logs them).
        leader = [i for i, p in enumerate(logs) if re.search(step_re, read(p))]
        victim = max(i for i in range(WORKERS) if i not in leader)
        killed_at_step = max_step(map(read, logs), step_re)
        t_kill = time.time()
        os.killpg(workers[victim].proc.pid, signal.SIGKILL)

        got = wait_until(lambda: first_shardline_resume(logs, victim, t_kill), 120)
        if got is None:
            raise RuntimeError("no 'recovery (' line within 120 s of the kill")
        benchlib.log("  shardline: killed w%d after step %d; first resumed step %d after %.3f s" % (
            victim, killed_at_step, got[1], got[0] - t_kill))
        return got[0] - t_kill
    finally:
        for w in workers:
            w.stop()
        coord.stop()


def torch_once(rep, data, python, label):
    d = _common.tmpdir("node_loss/torch-%s-%d" % (label.replace(" ", ""), rep))
    subprocess.run(["rm", "-rf", d])
    os.makedirs(d)
    env = dict(os.environ, BENCH_CKPT=os.path.join(d, "ckpt.pt"), BENCH_DATA=data,
               OMP_NUM_THREADS="1")
    agents = []
    try:
        agents = _common.start_torchrun_agents(d, WORKERS, "nl", env, python)
        logs = [a.log_path for a in agents]
        step_re = r"^step (\d+) t="
        if not wait_until(lambda: max_step((read(p) for p in logs), r"(?m)" + step_re)
                          >= KILL_AFTER_STEP or not any(a.alive() for a in agents), 240, 0.05) or \
                not any(a.alive() for a in agents):
            raise RuntimeError("no step %d within 240 s: %s" % (KILL_AFTER_STEP, agents[0].tail(8)))
        pids = {}
        for p in logs:
            for m in re.finditer(r"^pid (\d+) rank (\d+) world (\d+) restart 0", read(p), re.M):
                pids[int(m.group(2))] = (int(m.group(1)), int(m.group(3)))
        if 1 not in pids:
            raise RuntimeError("no rank 1 worker (world %s)" % sorted(pids))
        world = pids[1][1]
        killed_at_step = max_step((read(p) for p in logs), r"(?m)" + step_re)
        t_kill = time.time()
        os.kill(pids[1][0], signal.SIGKILL)

        got = wait_until(lambda: first_torch_restart_step(logs), 180)
        if got is None:
            raise RuntimeError("no step after the restart within 180 s: %s" % agents[0].tail(8))
        benchlib.log("  torchrun: world %d, killed rank 1 after step %d; first step after restart "
                     "(%d, world %d) after %.3f s" % (world, killed_at_step, got[1], got[2],
                                                      got[0] - t_kill))
        return got[0] - t_kill
    finally:
        for a in agents:
            a.stop()


def main():
    quick = benchlib.quick()
    out = benchlib.out_path("bench/out/%s.csv" % NAME)
    rows = benchlib.Rows(out, NAME)
    reps = 1 if quick else 2
    data = os.path.join(_common.REPO, "data", "tinyshakespeare.txt")
    # Each torch the machine has (Debian's 1.13, PyPI's current one).
    torch_peers = benchlib.torch_peers()
    sl, pt, notes = [], {label: [] for label, _ in torch_peers}, []
    for rep in range(reps):
        benchlib.log("%s: repetition %d" % (NAME, rep + 1))
        runs = [(lambda: shardline_once(rep, data), sl, "shardline")]
        for label, python in torch_peers:
            runs.append((lambda python=python, label=label: torch_once(rep, data, python, label),
                         pt[label], "%s torchrun" % label))
        for fn, acc, what in runs:
            try:
                acc.append(fn())
            except (RuntimeError, subprocess.SubprocessError, OSError) as e:
                benchlib.log("  %s failed: %s" % (what, e))
                notes.append("%s: %s" % (what, str(e).splitlines()[0][:120]))
    note = "median of %d%s" % (reps, ("; " + "; ".join(notes)) if notes else "")
    for label, _ in torch_peers:
        rows.add("SIGKILL a worker -> first resumed step", "workers=%d" % WORKERS,
                 statistics.median(sl) if sl else None, "%s torchrun c10d + gloo DDP" % label,
                 statistics.median(pt[label]) if pt[label] else None, "s", False, note)
    benchlib.write_notes(out, """
**How measured.** Shardline: `shardline-coordinator` (SQLite state) and 4 `shardline-worker` processes train a
tiny GPT (2 layers, width 16, 2 heads, byte vocabulary, context 16, global batch 24, fp32 on CPU, dp = 4) with a
checkpoint every 5 steps. After step %d the script SIGKILLs a worker that holds a rank and takes the time to the
first survivor's `recovery (...): ... first resumed step N` line (its own timestamp): the coordinator sees the
Session stream break, the survivors re-form at dp = 3 (gradient accumulation keeps the global batch), restore
the last checkpoint and finish a step. Peer (Debian's torch 1.13, and current torch from PyPI where its
virtualenv exists; each column names its version): 4 torchrun agents (`--nnodes=1:4 --nproc_per_node=1
--max_restarts=3 --rdzv_backend=c10d --monitor_interval=0.1`, last_call_timeout 5 s; launched through
`_torchrun.py`, which fixes Debian torch 1.13's `Std.from_str` under Python 3.11) running the same model
as a gloo DDP script with a `torch.save` checkpoint every 5 steps; the script SIGKILLs the rank-1 worker process
and takes the time to the first step logged after the restart (the agents stop every worker, re-rendezvous,
start 4 new Python processes that import torch, re-form the gloo group and load the checkpoint). A monitor
interval of 0.1 s (default 5 s) is generous to torchrun. Median of %d repetitions.
""" % (KILL_AFTER_STEP, reps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
