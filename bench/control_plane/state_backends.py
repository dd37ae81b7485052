#!/usr/bin/python3
"""Benchmark `state_backends` (bench/README.md, issue 15): what keeping the
coordinator's state in a 3-member etcd 3.4 cluster (`--state etcd://...`, a
replica that leads) costs against SQLite (`--state FILE`) at the same load:
heartbeats (which never write state: the ratio should be ~1), job creation and
cancellation (one state write each) and checkpoint commits of a training job;
for heartbeats also etcd's own lease keep-alives on the same cluster.

    bench/control_plane/state_backends.py --out bench/out/state_backends.csv [--quick]
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
import node_loss  # noqa: E402  (its log helpers)

NAME = "state_backends"
INTERVAL_MS = 1000  # as heartbeats.py
TIMEOUT_MS = 10000
SQLITE = "coordinator on SQLite"
HB_GOAL = 0.9


class Backend:
    """A coordinator on `kind` ("etcd": one replica on the cluster, leading; "sqlite")."""

    def __init__(self, kind, cluster, tag):
        self.kind = kind
        if kind == "etcd":
            self.replicas = _common.Replicas(cluster, "sb-" + tag, 1, 2, "state-etcd-%s-" % tag)
            self.replicas.leader()
            self.address = self.replicas.addresses[0]
        else:
            d = _common.tmpdir("state_backends/sqlite-" + tag)
            subprocess.run(["rm", "-rf", d])
            os.makedirs(d)
            self.coord = _common.Coordinator("state-sqlite-" + tag, state=os.path.join(d, "s.db"))
            self.address = self.coord.address

    def stop(self):
        (self.replicas if self.kind == "etcd" else self.coord).stop()


def attempt(errors, what, fn):
    try:
        return fn()
    except (RuntimeError, subprocess.SubprocessError, OSError, ValueError) as e:
        benchlib.log("  %s failed: %s" % (what, e))
        errors.append("%s: %s" % (what, str(e).splitlines()[0][:150].replace(",", ";")))
        return None


def on(kind, cluster, tag, fn):
    b = Backend(kind, cluster, tag)
    try:
        return fn(b.address)
    finally:
        b.stop()


def checkpoint_rate(address, seconds, tag):
    """One shardline-worker training the tiny GPT with a (synchronous)
    checkpoint every step for `seconds`; returns (committed per s, median save s)."""
    d = _common.tmpdir("state_backends/ckpt-" + tag)
    subprocess.run(["rm", "-rf", d])
    os.makedirs(d)
    spec = os.path.join(d, "job.yaml")
    data = os.path.join(_common.REPO, "data", "tinyshakespeare.txt")
    with open(spec, "w") as f:
        f.write(_common.tiny_gpt_spec("failover", data, os.path.join(d, "ckpt"), 1, 1, "1s", "10s")
                .replace("interval_steps: 5", "interval_steps: 1"))
    rc, out = _common.shardctl(["job", "create", spec, "--id", "ck"], address, 10)
    if rc != 0:
        raise RuntimeError("job create: " + out.strip()[-200:])
    env = dict(os.environ)
    env.pop("SHARDLINE_TOKEN", None)
    w = _common.Server([_common.bin_path("worker/shardline-worker"), "--coordinator", address,
                        "--job", "ck", "--worker-id", "w0", "--log-interval", "1",
                        "--connect-timeout", "30s"], os.path.join(d, "worker.log"), env=env)
    line = re.compile(r"^\d{4}-\d\d-\d\dT(\d\d:\d\d:\d\d\.\d+)Z .*checkpoint \S+ \(committed\) "
                      r"in ([\d.]+) s", re.M)
    try:
        if not node_loss.wait_until(lambda: len(line.findall(node_loss.read(w.log_path))) >= 3 or
                                    not w.alive(), 120, 0.1) or not w.alive():
            raise RuntimeError("no 3 checkpoints within 120 s: " + w.tail(5))
        t0 = time.time()
        time.sleep(seconds)
        t1 = time.time()
        got = [(node_loss.utc_clock_to_epoch(m.group(1), t0), float(m.group(2)))
               for m in line.finditer(node_loss.read(w.log_path))]
        window = [s for t, s in got if t0 <= t < t1]
        if not window:
            raise RuntimeError("no checkpoint committed in %d s: %s" % (seconds, w.tail(5)))
        return len(window) / (t1 - t0), statistics.median(window)
    finally:
        w.stop()


def main():
    quick = benchlib.quick()
    out = benchlib.out_path("bench/out/%s.csv" % NAME)
    rows = benchlib.Rows(out, NAME)
    sizes = [(256, 2, 2)] if quick else [(256, 10, 5), (1024, 10, 5)]
    jobs, clients = (200, 4) if quick else (800, 4)
    ckpt_s = 5 if quick else 20
    rounds = 1 if quick else 2
    errors = []
    benchlib.log("%s: 3-member etcd (data on disk, as SQLite's)" % NAME)
    cluster = attempt(errors, "etcd", lambda: _common.EtcdCluster("state-etcd", 3, on_disk=True))
    if cluster is None:
        rows.add("heartbeats/s closed loop (capacity)", "workers=256", None, SQLITE, None,
                 "heartbeats/s", True, "; ".join(errors))
        return 0
    try:
        for n, paced_s, closed_s in sizes:
            del errors[:]  # each case's notes name its own failures
            # Best of `rounds` per backend, in ABBA order: other load on the
            # machine (builds) moves a single closed-loop figure by +-20%.
            res = {"etcd": None, "sqlite": None}
            runs = {"etcd": [], "sqlite": []}  # closed-loop heartbeats/s and load average
            order = ("etcd", "sqlite") if rounds == 1 else ("etcd", "sqlite", "sqlite", "etcd")
            for r, kind in enumerate(order):
                benchlib.log("%s: heartbeats, %d workers, coordinator on %s" % (NAME, n, kind))
                load = os.getloadavg()[0]
                got = attempt(errors, "heartbeats on %s" % kind, lambda: on(
                    kind, cluster, "hb%d-%d" % (n, r), lambda a: _common.cp_load(
                        "heartbeats", address=a, workers=n, interval_ms=INTERVAL_MS,
                        timeout_ms=TIMEOUT_MS, seconds=paced_s, closed_seconds=closed_s,
                        form_timeout_s=60, timeout=600)))
                if got is not None and got.get("formation_failed"):
                    errors.append("%s: the job did not form" % kind)
                    got = None
                if got is not None:
                    runs[kind].append("%.0f/s at load %.1f" % (got["closed"]["per_s"], load))
                    best = res[kind]
                    res[kind] = got if best is None else {
                        ph: max(best[ph], got[ph], key=lambda x: x["per_s"])
                        for ph in ("paced", "closed")}
            leases = {}
            for phase, interval, secs in (("paced", INTERVAL_MS, paced_s), ("closed", 0, closed_s)):
                leases[phase] = attempt(errors, "etcd leases", lambda: _common.cp_load(
                    "leases", address=cluster.addresses[0], workers=n, interval_ms=interval,
                    ttl_s=TIMEOUT_MS // 1000, seconds=secs, timeout=600))
            for phase, case in (("paced", "paced every %d ms" % INTERVAL_MS),
                                ("closed", "closed loop (capacity)")):
                e = res["etcd"][phase] if res["etcd"] else None
                s = res["sqlite"][phase] if res["sqlite"] else None
                le = leases[phase]
                note = "best of %d (ABBA); goal etcd/SQLite >= %g" % (rounds, HB_GOAL)
                if e and s:
                    note += ": %s" % ("met" if e["per_s"] / s["per_s"] >= HB_GOAL else "NOT met")
                    note += "; lost etcd=%d sqlite=%d" % (e["lost"], s["lost"])
                if phase == "closed":
                    note += "; runs (1-min load average before each): etcd %s; sqlite %s" % (
                        " ".join(runs["etcd"]) or "-", " ".join(runs["sqlite"]) or "-")
                if errors:
                    note += "; " + "; ".join(errors)
                param = "workers=%d" % n
                rows.add("heartbeats/s " + case, param, e["per_s"] if e else None, SQLITE,
                         s["per_s"] if s else None, "heartbeats/s", True, note)
                rows.add("heartbeats/s " + case, param, e["per_s"] if e else None,
                         "etcd 3.4 lease keep-alive (same cluster)", le["per_s"] if le else None,
                         "heartbeats/s", True, note)
                rows.add("heartbeat latency p99 " + case, param, e["p99_us"] / 1000 if e else None,
                         SQLITE, s["p99_us"] / 1000 if s else None, "ms", False, note)
        res = {}
        del errors[:]
        for kind in ("etcd", "sqlite"):
            benchlib.log("%s: %d jobs created then cancelled, %d clients, on %s" % (
                NAME, jobs, clients, kind))
            res[kind] = attempt(errors, "jobs on %s" % kind, lambda: on(
                kind, cluster, "jobs", lambda a: _common.cp_load(
                    "jobs", address=a, jobs=jobs, clients=clients, timeout=600)))
        for op, rpc in (("create", "CreateJob"), ("cancel", "CancelJob")):
            e = res["etcd"][op] if res["etcd"] else None
            s = res["sqlite"][op] if res["sqlite"] else None
            note = "%d jobs; errors etcd=%s sqlite=%s" % (
                jobs, e["errors"] if e else "-", s["errors"] if s else "-")
            if errors:
                note += "; " + "; ".join(errors)
            param = "clients=%d" % clients
            rows.add("%s/s (one state write each)" % rpc, param, e["per_s"] if e else None,
                     SQLITE, s["per_s"] if s else None, "ops/s", True, note)
            rows.add("%s latency p99" % rpc, param, e["p99_us"] / 1000 if e else None, SQLITE,
                     s["p99_us"] / 1000 if s else None, "ms", False, note)
        res = {}
        del errors[:]
        for kind in ("etcd", "sqlite"):
            benchlib.log("%s: checkpoint every step for %d s, 1 worker, on %s" % (
                NAME, ckpt_s, kind))
            res[kind] = attempt(errors, "checkpoints on %s" % kind, lambda: on(
                kind, cluster, "ckpt", lambda a: checkpoint_rate(a, ckpt_s, kind)))
        e, s = res["etcd"], res["sqlite"]
        note = "%d s window; synchronous save (write shards + ReportShard + commit)" % ckpt_s
        if errors:
            note += "; " + "; ".join(errors)
        rows.add("checkpoints committed/s (every step)", "workers=1", e[0] if e else None, SQLITE,
                 s[0] if s else None, "ckpt/s", True, note)
        rows.add("checkpoint save time (median)", "workers=1", e[1] if e else None, SQLITE,
                 s[1] if s else None, "s", False, note)
    finally:
        cluster.stop()
    benchlib.write_notes(out, """
**How measured.** Shardline = a `shardline-coordinator` with `--state etcd://A,B,C/PREFIX` (one replica, the
leader, lease TTL 2 s) on a 3-member etcd 3.4 cluster on loopback; peer = the same coordinator with `--state
FILE` (SQLite); ratio = etcd / SQLite. Both keep their data on the same disk (`$BENCH_TMP`; etcd not on tmpfs
here), a fresh coordinator per case. Heartbeats: `cp_load heartbeats` exactly as in `heartbeats` (one job of N
workers, paced every %d ms, then a closed loop), the best of 2 runs per backend in the order etcd, SQLite, SQLite,
etcd (one run each under --quick); heartbeats never write state, so the goal is etcd/SQLite >= %g.
The second peer is etcd's own liveness, one lease per worker kept alive over `LeaseKeepAlive` (`cp_load leases`)
against the same cluster. Jobs: `cp_load jobs` creates %d jobs from %d closed-loop clients (each `CreateJob` one
durable write: a fenced etcd Txn, or a SQLite transaction), then cancels them (`CancelJob`, one write each).
Checkpoints: one `shardline-worker` trains node_loss's tiny GPT with a synchronous checkpoint every step; the
rate of `checkpoint ... (committed)` lines in a %d s window and their median time (shards written, `ReportShard`,
the commit made durable). Client, coordinator and 3 etcd members share the machine's cores.
""" % (INTERVAL_MS, HB_GOAL, jobs, clients, ckpt_s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
