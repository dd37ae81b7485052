#!/usr/bin/python3
"""Benchmark `hang_recovery` (issue 17): one of 4 ranks of a training job
stalls (its training thread blocks, its process and heartbeats go on) and
the time until the job trains again (the first optimizer step completed
after the stall), Shardline vs torchrun (torch 1.13 elastic agent, c10d
rendezvous) running an equivalent gloo DDP job whose rank stalls the same
way.

    bench/control_plane/hang_recovery.py --out bench/out/hang_recovery.csv [--quick]

Shardline finds the hang from the ranks' progress reports after
elastic.progress_timeout (default: the larger of 30 s and 10 x the median
step time), evicts the rank and re-forms. torch has no hang detection: the
other ranks wait in their all_reduce until the process group's timeout
(gloo default 30 min, NCCL 10 min), raise, and torchrun restarts every
worker. torch is measured with its timeout lowered to Shardline's
progress_timeout, so the two compare at equal detection deadlines; at
torch's default the wait alone is 1800 s.
"""
import os
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
from _common import benchlib  # noqa: E402
from node_loss import first_shardline_resume, first_torch_restart_step, utc_clock_to_epoch  # noqa: E402

NAME = "hang_recovery"
WORKERS = 4
STALL_AT_STEP = 15
VICTIM = 3

read = _common.read
wait_until = _common.wait_until


def shardline_once(tag, progress_timeout):
    """Seconds from the stall to the first step resumed after it."""
    d = _common.tmpdir("hang_recovery/shardline-%s" % tag)
    subprocess.run(["rm", "-rf", d])
    os.makedirs(d)
    spec = os.path.join(d, "job.yaml")
    extra = "  progress_timeout: %s\n" % progress_timeout if progress_timeout else ""
    with open(spec, "w") as f:
        f.write(_common.tiny_gpt_spec("hang", os.path.join(_common.REPO, "data", "tinyshakespeare.txt"),
                                      os.path.join(d, "ckpt"), 2, 4, "200ms", "10s", extra,
                                      # longer than progress_timeout: the
                                      # progress reports find the hang
                                      collective_timeout="60s"))
    coord = _common.Coordinator("hang-coordinator-%s" % tag, state=os.path.join(d, "state.db"))
    workers = []
    try:
        env = dict(os.environ, SHARDLINE_COORDINATOR=coord.address)
        env.pop("SHARDLINE_TOKEN", None)
        subprocess.run([_common.bin_path("client/shardctl/shardctl"), "job", "create", spec, "--id", "hang"],
                       env=env, check=True, stdout=subprocess.DEVNULL, timeout=60)
        for i in range(WORKERS):
            flags = ["--inject-fault", "stall_at_step=%d" % STALL_AT_STEP] if i == VICTIM else []
            workers.append(_common.Server(
                [_common.bin_path("worker/shardline-worker"), "--coordinator", coord.address,
                 "--job", "hang", "--worker-id", "w%d" % i, "--log-interval", "1",
                 "--connect-timeout", "30s"] + flags, os.path.join(d, "worker%d.log" % i), env=env))
        logs = [w.log_path for w in workers]
        stall_re = re.compile(r"^\d{4}-\d\d-\d\dT(\d\d:\d\d:\d\d\.\d+)Z .*the training thread stalls before step", re.M)
        got = wait_until(lambda: stall_re.search(read(logs[VICTIM])), 180)
        if got is None:
            raise RuntimeError("w%d did not stall within 180 s: %s" % (VICTIM, workers[VICTIM].tail(5)))
        t_stall = utc_clock_to_epoch(got.group(1), time.time())

        res = wait_until(lambda: first_shardline_resume(logs, VICTIM, t_stall), 240)
        if res is None:
            raise RuntimeError("no 'recovery (' line within 240 s of the stall")
        benchlib.log("  shardline (progress_timeout %s): w%d stalled before step %d; first resumed "
                     "step %d after %.3f s" % (progress_timeout or "auto", VICTIM, STALL_AT_STEP,
                                               res[1], res[0] - t_stall))
        return res[0] - t_stall
    finally:
        for w in workers:
            w.stop()
        coord.stop()


def torch_once(tag, pg_timeout_s):
    d = _common.tmpdir("hang_recovery/torch-%s" % tag)
    subprocess.run(["rm", "-rf", d])
    os.makedirs(d)
    env = dict(os.environ, BENCH_CKPT=os.path.join(d, "ckpt.pt"),
               BENCH_DATA=os.path.join(_common.REPO, "data", "tinyshakespeare.txt"),
               OMP_NUM_THREADS="1", BENCH_PG_TIMEOUT=str(pg_timeout_s),
               BENCH_STALL_RANK="1", BENCH_STALL_AT_STEP=str(STALL_AT_STEP))
    agents = []
    try:
        agents = _common.start_torchrun_agents(d, WORKERS, "hang", env)
        logs = [a.log_path for a in agents]
        stall_re = re.compile(r"^stalling before step \d+ t=([\d.]+)", re.M)

        def stalled():
            for p in logs:
                m = stall_re.search(read(p))
                if m:
                    return float(m.group(1))
            return None

        t_stall = wait_until(stalled, 240)
        if t_stall is None:
            raise RuntimeError("rank 1 did not stall within 240 s: %s" % agents[0].tail(8))

        res = wait_until(lambda: first_torch_restart_step(logs), pg_timeout_s + 240)
        if res is None:
            raise RuntimeError("no step after the restart within %d s: %s" % (
                pg_timeout_s + 240, agents[0].tail(8)))
        benchlib.log("  torchrun (gloo timeout %d s): rank 1 stalled; first step after restart "
                     "(%d) after %.3f s" % (pg_timeout_s, res[1], res[0] - t_stall))
        return res[0] - t_stall
    finally:
        for a in agents:
            a.stop()


def main():
    quick = benchlib.quick()
    out = benchlib.out_path("bench/out/%s.csv" % NAME)
    rows = benchlib.Rows(out, NAME)
    reps = 1 if quick else 2
    # (Shardline's progress_timeout, torch's process-group timeout): the
    # default, and a short one.
    cases = [(None, 30, "progress_timeout auto (30 s)"), ("5s", 5, "progress_timeout 5 s")]
    for sl_timeout, pt_timeout, what in cases:
        sl, pt, notes = [], [], []
        for rep in range(reps):
            benchlib.log("%s (%s): repetition %d" % (NAME, what, rep + 1))
            tag = "%s-%d" % (sl_timeout or "auto", rep)
            for fn, arg, acc, who in ((shardline_once, sl_timeout, sl, "shardline"),
                                      (torch_once, pt_timeout, pt, "torchrun")):
                try:
                    acc.append(fn(tag, arg))
                except (RuntimeError, subprocess.SubprocessError, OSError) as e:
                    benchlib.log("  %s failed: %s" % (who, e))
                    notes.append("%s: %s" % (who, str(e).splitlines()[0][:120]))
        note = "median of %d%s" % (reps, ("; " + "; ".join(notes)) if notes else "")
        rows.add("rank stalls -> first step trained after it", "workers=%d, %s" % (WORKERS, what),
                 statistics.median(sl) if sl else None,
                 "torchrun c10d + gloo DDP, pg timeout %d s" % pt_timeout,
                 statistics.median(pt) if pt else None, "s", False, note)
    benchlib.write_notes(out, """
**How measured.** Shardline: `shardline-coordinator` and 4 `shardline-worker` processes train the tiny GPT of
`node_loss` (dp = 4, a checkpoint every 5 steps, heartbeats every 200 ms, collective_timeout 60 s so that the
progress reports, not a timeout, find the hang); worker w%d runs with
`--inject-fault stall_at_step=%d` (a test facility: its training thread blocks for good before that step
while its process and heartbeats go on). The time runs from that worker's `the training thread stalls before step` log
line to the first survivor's `recovery (...): ... first resumed step N` line: the coordinator sees no
progress in any rank's reports for `progress_timeout`, names the stalled rank (the others wait in an all_reduce
it has not issued), evicts it, and the survivors re-form at dp = 3, restore the last checkpoint and finish a
step. Peer: 4 torchrun agents (c10d, `--max_restarts=3 --monitor_interval=0.1`, last_call_timeout 5 s) running
the same model as a gloo DDP script whose rank 1 blocks the same way before step %d; torch has no hang
detection, so the others wait in all_reduce until the process group's timeout (here lowered to the same
deadline as Shardline's progress timeout: torch's default is 30 min for gloo and 10 min for NCCL, so at its
defaults the wait alone is 1800 s or 600 s), raise, and every agent restarts its worker (new Python
processes importing torch, a new gloo group, the checkpoint loaded). XLA's coordination service (not run
here: no XLA on this machine) documents a hang watchdog about 10 s after a deadline. Median of %d
repetitions.
""" % (VICTIM, STALL_AT_STEP, STALL_AT_STEP, reps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
