#!/usr/bin/python3
"""Benchmark `failover` (bench/README.md, issue 15): SIGKILL the leader of 3
shardline-coordinator replicas on a 3-member etcd 3.4 cluster and time until a
client is answered again, against a single SQLite coordinator that a
supervisor restarts at once (systemd's Restart=always, RestartSec=0); then the
same kill under a training job of 2 shardline-workers, against torchrun, whose
c10d store lives in one agent (killing that host ends the job).

    bench/control_plane/failover.py --out bench/out/failover.csv [--quick]
"""
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
from _common import benchlib  # noqa: E402
import node_loss  # noqa: E402  (its log helpers)

NAME = "failover"
TTL_S = 2  # shardline-coordinator's default --lease-ttl
GOAL_S = 3.0
WORKERS = 2



def stats(xs):
    xs = sorted(xs)
    p90 = xs[min(len(xs) - 1, int(round(0.9 * (len(xs) - 1))))]
    return statistics.median(xs), p90, xs[-1]


def first_answer(targets, t0, args, limit=30):
    """Seconds from t0 to the first `shardctl ARGS` that succeeds, trying each
    target in turn (a replica list is one target when the client follows it)."""
    while time.time() - t0 < limit:
        for a in targets:
            if _common.shardctl(args, a, 1)[0] == 0:
                return time.time() - t0
        time.sleep(0.005)
    raise RuntimeError("no answer to shardctl %s within %d s of the kill" % (" ".join(args), limit))


def create_job(coordinator, job_id, d, data):
    spec = os.path.join(d, "%s.yaml" % job_id)
    with open(spec, "w") as f:
        f.write(_common.tiny_gpt_spec("failover", data, os.path.join(d, "ckpt-" + job_id), 1, 2, "1s",
                                     "10s"))
    rc, out = _common.shardctl(["job", "create", spec, "--id", job_id], coordinator, 10)
    if rc != 0:
        raise RuntimeError("shardctl job create %s: %s" % (job_id, out.strip()[-300:]))


class Supervised:
    """A process restarted the moment it exits, as systemd's Restart=always with
    RestartSec=0 would (a thread blocked in wait(), then a new Popen)."""

    def __init__(self, argv, name):
        self.argv, self.name, self.starts = argv, name, 0
        self.stopping = False
        self.proc = self._spawn()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _spawn(self):
        self.starts += 1
        return _common.Server(self.argv, os.path.join(_common.tmpdir("logs"), "%s-%d.log" % (
            self.name, self.starts)))

    def _loop(self):
        while True:
            p = self.proc
            p.proc.wait()
            if self.stopping:
                return
            p.log.close()
            self.proc = self._spawn()

    def kill(self):
        os.killpg(self.proc.proc.pid, signal.SIGKILL)
        return time.time()

    def stop(self):
        self.stopping = True
        self.proc.stop()
        self.thread.join(10)
        self.proc.stop()  # one started while stopping


def sqlite_failover(reps, d, data):
    port = _common.free_port()
    address = "127.0.0.1:%d" % port
    sup = Supervised([_common.bin_path("server/shardline-coordinator"), "--listen", address,
                      "--state", os.path.join(d, "state.db")], "failover-sqlite")
    try:
        if not _common.wait_port(port, 30):
            raise RuntimeError("the SQLite coordinator did not start: " + sup.proc.tail())
        create_job(address, "fo", d, data)
        out = []
        for rep in range(reps):
            t0 = sup.kill()
            out.append(first_answer([address], t0, ["job", "get", "fo"]))
            benchlib.log("  sqlite: kill -9 -> answered after %.3f s" % out[-1])
            time.sleep(0.5)
        return out
    finally:
        sup.stop()


def ha_failover(replicas, reps, d, data):
    """(a): kill the leader `reps` times; returns (seconds, the client follows the list)."""
    leader = replicas.leader()
    whole = ",".join(replicas.addresses)
    follows = _common.shardctl(["job", "list"], whole, 5)[0] == 0
    benchlib.log("  shardctl %s a replica list" % ("follows" if follows else "does not take"))
    create_job(replicas.addresses[leader], "fo", d, data)
    out = []
    for rep in range(reps):
        leader = replicas.leader()
        t0 = replicas.kill(leader)
        targets = [whole] if follows else (
            replicas.addresses[leader + 1:] + replicas.addresses[:leader + 1])
        out.append(first_answer(targets, t0, ["job", "get", "fo"]))
        benchlib.log("  ha: killed r%d -> answered after %.3f s" % (leader, out[-1]))
        replicas.start(leader)
        time.sleep(1)
    return out, follows


STEP_LINE = re.compile(r"^\d{4}-\d\d-\d\dT(\d\d:\d\d:\d\d\.\d+)Z .*gen (\d+) step (\d+)/", re.M)
RECOVERY_LINE = re.compile(r"^\d{4}-\d\d-\d\dT(\d\d:\d\d:\d\d\.\d+)Z .*recovery \(", re.M)


def steps(logs, near):
    """[(epoch seconds, generation, step)] of every step line in `logs`, sorted."""
    out = []
    for p in logs:
        for m in STEP_LINE.finditer(node_loss.read(p)):
            out.append((node_loss.utc_clock_to_epoch(m.group(1), near), int(m.group(2)),
                        int(m.group(3))))
    return sorted(out)


def ha_training(replicas, kills, d, data):
    """(c): returns ([kill -> next completed step, s], [longest step gap around the kill, s],
    median step time before the first kill, re-formations after the kills, checkpoints
    skipped (one pending at the kill is aborted), workers alive)."""
    whole = ",".join(replicas.addresses)
    create_job(replicas.addresses[replicas.leader()], "train", d, data)
    env = dict(os.environ)
    env.pop("SHARDLINE_TOKEN", None)
    env.pop("SHARDLINE_COORDINATOR", None)
    workers = []
    try:
        for i in range(WORKERS):
            workers.append(_common.Server(
                [_common.bin_path("worker/shardline-worker"), "--coordinator", whole,
                 "--job", "train", "--worker-id", "w%d" % i, "--log-interval", "1",
                 "--connect-timeout", "30s"], os.path.join(d, "worker%d.log" % i), env=env))
        logs = [w.log_path for w in workers]
        if not node_loss.wait_until(lambda: len(steps(logs, time.time())) >= 20 or
                                    not all(w.alive() for w in workers), 180, 0.1) or \
                not all(w.alive() for w in workers):
            raise RuntimeError("no 20 steps within 180 s: %s" % workers[0].tail(5))
        before = steps(logs, time.time())
        gaps = [b[0] - a[0] for a, b in zip(before, before[1:]) if b[2] == a[2] + 1]
        step_s = statistics.median(gaps) if gaps else float("nan")
        to_next, longest = [], []
        for k in range(kills):
            leader = replicas.leader()
            t_kill = replicas.kill(leader)
            got = node_loss.wait_until(
                lambda: [s for s in steps(logs, t_kill) if s[0] > t_kill], 60, 0.02)
            if not got:
                raise RuntimeError("no step within 60 s of killing the leader: %s" %
                                   workers[0].tail(5))
            to_next.append(got[0][0] - t_kill)
            time.sleep(TTL_S + 3)  # the new leader serves; steps go on
            window = [s for s in steps(logs, t_kill) if t_kill - 1 <= s[0] <= t_kill + TTL_S + 3]
            longest.append(max((b[0] - a[0] for a, b in zip(window, window[1:])), default=0))
            benchlib.log("  training: killed r%d -> next step after %.3f s; longest step gap %.3f s"
                         " (step time %.3f s)" % (leader, to_next[-1], longest[-1], step_s))
            replicas.start(leader)
            time.sleep(1)
        reformed = sum(len(RECOVERY_LINE.findall(node_loss.read(p))) for p in logs)
        aborted = sum(node_loss.read(p).count("checkpoint skipped") for p in logs)
        alive = sum(w.alive() for w in workers)
        return to_next, longest, step_s, reformed, aborted, alive
    finally:
        for w in workers:
            w.stop()


def torch_store_host_lost(d, data):
    """(d): 2 torchrun agents (c10d); SIGKILL the agent that hosts the store
    (its process group: the host goes down). Returns (seconds to the end of the
    job, the other agent's exit code, steps logged after the kill, torch version)."""
    port = _common.free_port()
    env = dict(os.environ, BENCH_CKPT=os.path.join(d, "ckpt.pt"), BENCH_DATA=data,
               OMP_NUM_THREADS="1")
    version = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "python3-torch"],
                             stdout=subprocess.PIPE, text=True).stdout.strip() or "?"
    agents = []
    try:
        for i in range(WORKERS):
            agents.append(_common.Server(
                [_common.PYTHON, os.path.join(_common.HERE, "_torchrun.py"),
                 "--nnodes=1:%d" % WORKERS, "--nproc_per_node=1", "--max_restarts=3",
                 "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:%d" % port, "--rdzv_id=fo",
                 "--rdzv_conf=last_call_timeout=5", "--monitor_interval=0.1",
                 os.path.join(_common.HERE, "_torch_ddp_train.py")],
                os.path.join(d, "agent%d.log" % i), env=env))
            time.sleep(0.2)  # the first agent hosts the TCPStore
        logs = [a.log_path for a in agents]
        step_re = r"(?m)^step (\d+) t=([\d.]+)"
        if not node_loss.wait_until(lambda: node_loss.max_step(map(node_loss.read, logs),
                                                               step_re) >= 10 or
                                    not all(a.alive() for a in agents), 240, 0.05):
            raise RuntimeError("torchrun: no step 10 within 240 s: %s" % agents[0].tail(8))
        ss = subprocess.run(["ss", "-ltnpH", "sport = :%d" % port], stdout=subprocess.PIPE,
                            text=True).stdout
        pids = {int(p) for p in re.findall(r"pid=(\d+)", ss)}
        host = [i for i, a in enumerate(agents) if a.proc.pid in pids]
        if not host:
            raise RuntimeError("torchrun: no agent listens on the store port %d (%s)" % (
                port, ss.strip()))
        host = host[0]
        os.killpg(agents[host].proc.pid, signal.SIGKILL)
        t_kill = time.time()
        others = [a for i, a in enumerate(agents) if i != host]
        ended = node_loss.wait_until(lambda: not any(a.alive() for a in others), 120, 0.05)
        t_end = time.time() - t_kill
        codes = [a.proc.poll() for a in others]
        after = 0
        for i, p in enumerate(logs):
            if i != host:
                after += sum(1 for m in re.finditer(step_re, node_loss.read(p))
                             if float(m.group(2)) > t_kill)
        if not ended:
            return None, codes, after, version
        benchlib.log("  torchrun: killed the store host (agent %d); the other agent exited %s "
                     "%.3f s later; %d steps after the kill" % (host, codes, t_end, after))
        return t_end, codes, after, version
    finally:
        for a in agents:
            a.stop()


def main():
    quick = benchlib.quick()
    out = benchlib.out_path("bench/out/%s.csv" % NAME)
    rows = benchlib.Rows(out, NAME)
    reps = 3 if quick else 10
    kills = 1 if quick else 5
    data = os.path.join(_common.REPO, "data", "tinyshakespeare.txt")
    d = _common.tmpdir("failover")
    subprocess.run(["rm", "-rf", d])
    os.makedirs(d)
    errors = []

    def attempt(what, fn):
        try:
            return fn()
        except (RuntimeError, subprocess.SubprocessError, OSError) as e:
            benchlib.log("  %s failed: %s" % (what, e))
            errors.append("%s: %s" % (what, str(e).splitlines()[0][:150].replace(",", ";")))
            return None

    ha = sq = train = torch = None
    follows = False
    train_errors = []  # (c) and (d): their rows only
    benchlib.log("%s: 3-member etcd, 3 replicas, lease TTL %d s; %d kills" % (NAME, TTL_S, reps))
    cluster = attempt("etcd", lambda: _common.EtcdCluster("failover-etcd", 3))
    if cluster is not None:
        try:
            replicas = attempt("replicas", lambda: _common.Replicas(cluster, "failover", 3, TTL_S,
                                                                      "failover-r"))
            if replicas is not None:
                try:
                    got = attempt("shardline HA", lambda: ha_failover(replicas, reps, d, data))
                    if got is not None:
                        ha, follows = got
                    if follows:
                        benchlib.log("%s: training, %d kills of the leader" % (NAME, kills))
                        n = len(errors)
                        train = attempt("shardline training",
                                        lambda: ha_training(replicas, kills, d, data))
                        train_errors.extend(errors[n:])
                        del errors[n:]
                    else:
                        train_errors.append("the workers take one --coordinator address in "
                                            "this build (no replica list)")
                finally:
                    replicas.stop()
        finally:
            cluster.stop()
    benchlib.log("%s: single SQLite coordinator under a supervisor; %d kills" % (NAME, reps))
    sq = attempt("SQLite + supervisor", lambda: sqlite_failover(reps, d, data))
    benchlib.log("%s: torchrun, the c10d store host killed" % NAME)
    n = len(errors)
    torch = attempt("torchrun", lambda: torch_store_host_lost(d, data))
    train_errors.extend(errors[n:])
    del errors[n:]

    err = "; ".join(errors)
    how = ("shardctl given all 3 addresses" if follows else
           "shardctl given one address per call; each replica in turn")
    peer = "single SQLite coordinator + supervisor (Restart=always RestartSec=0)"
    case = "kill -9 the leader -> first answered shardctl job get"
    param = "ttl_s=%d" % TTL_S
    hs = stats(ha) if ha else (None, None, None)
    ss = stats(sq) if sq else (None, None, None)
    for k, label in enumerate(("median", "p90", "max")):
        note = "%s of %d kills; %s; goal < %g s at the default TTL: %s" % (
            label, reps, how, GOAL_S, "not measured" if hs[k] is None else
            ("met" if hs[k] < GOAL_S else "NOT met"))
        if err:
            note += "; " + err
        rows.add("%s (%s)" % (case, label), param, hs[k], peer, ss[k], "s", False, note)
        rows.add("%s (%s)" % (case, label), param, hs[k], "goal", GOAL_S, "s", False, note)
    tcase = "kill -9 the leader during training -> next completed step"
    tparam = "workers=%d" % WORKERS
    terr = "; ".join(train_errors)
    tnote = terr
    tnext = None
    tgap = (None, None)
    if train is not None:
        to_next, longest, step_s, reformed, aborted, alive = train
        tnext = statistics.median(to_next)
        tgap = (statistics.median(longest), max(longest))
        tnote = ("%d kills: next step after %s s; longest gap %s s; step time before %.3f s; %d "
                 "checkpoints skipped; %d re-formations; %d of %d workers alive after" % (
                     kills, " ".join("%.2f" % x for x in to_next),
                     " ".join("%.2f" % x for x in longest), step_s, aborted, reformed, alive,
                     WORKERS))
        if terr:
            tnote += "; " + terr
    if torch is not None:
        t_end, codes, after, version = torch
        if t_end is not None:
            tpeer_note = ("outcome: job lost (python3-torch %s): the surviving agent exited with "
                          "code %s %.1f s after the store host was killed; %d steps after the "
                          "kill" % (version, "/".join(str(c) for c in codes), t_end, after))
        else:
            tpeer_note = ("outcome: the surviving agent still ran 120 s after the store host was "
                          "killed (python3-torch %s); %d steps after the kill" % (version, after))
    else:
        tpeer_note = terr
    rows.add(tcase + " (median)", tparam, tnext, "goal", GOAL_S, "s", False, tnote)
    rows.add(tcase + " (median)", tparam, tnext, "torchrun c10d (store host killed)", None, "s",
             False, tpeer_note.replace(",", ";"))
    gcase = "kill -9 the leader during training -> longest gap between steps"
    for k, label in enumerate(("median", "max")):
        rows.add("%s (%s)" % (gcase, label), tparam, tgap[k], "goal", GOAL_S, "s", False, tnote)
    benchlib.write_notes(out, """
**How measured.** A 3-member etcd 3.4 cluster on loopback (data on tmpfs) and 3 `shardline-coordinator`
replicas on one prefix (`--state etcd://A,B,C/failover --lease-ttl %ds`, the default). The script finds the
leader (the replica that etcd's PREFIX/leader key names and that answers `shardctl job list`), SIGKILLs it and runs `shardctl job get` (%s, each
call a new process, 1 s timeout) until one succeeds: the time from the kill to that answer, over %d kills
(the killed replica is restarted at its address after each). Peer: one `shardline-coordinator` on SQLite,
SIGKILLed and restarted at once by a supervisor loop in the script, as systemd's `Restart=always` with
`RestartSec=0` would (systemd's default RestartSec is 100 ms), the same `shardctl job get` polling. The
SQLite coordinator comes back faster on the same machine, but only if the machine survives: the replicas
are for losing the machine. The goal column is the target (< %g s at the default TTL). Training: %d
`shardline-worker`s (tiny GPT of node_loss, checkpoint every 5 steps) given all three addresses; the leader
SIGKILLed %d times; the time from the kill to the first step a worker logged after it, and the longest gap
between two logged steps from 1 s before to %d s after the kill (the workers train on without the coordinator
until the next checkpoint, every 5 steps, which waits for the new leader; a kill in the middle of a checkpoint
aborts it). Peer: 2 torchrun agents
(torch 1.13 c10d rendezvous; the store lives in the first agent); the agent hosting the store is SIGKILLed
with its worker (its host goes down): the other agent cannot re-rendezvous and the job ends.
""" % (TTL_S, how, reps, GOAL_S, WORKERS, kills, TTL_S + 3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
