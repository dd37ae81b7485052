#!/usr/bin/python3
"""Benchmark `heartbeats` (bench/README.md, item 4): sustained heartbeats per
second from thousands of simulated workers, and false evictions (members
declared lost while alive; must be 0), against etcd 3.4 lease keep-alives
(one lease per worker, the usual way to track liveness with etcd).

    bench/control_plane/heartbeats.py --out bench/out/heartbeats.csv [--quick]
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
from _common import benchlib  # noqa: E402

NAME = "heartbeats"
INTERVAL_MS = 1000  # heartbeat_interval of the job
TIMEOUT_MS = 10000  # heartbeat_timeout, and the etcd lease TTL
PROGRESS_GROUPS = 3  # communicators in a progress report (dp, tp, pp)


def run(mode_fn, what):
    try:
        return mode_fn(), ""
    except (RuntimeError, subprocess.TimeoutExpired, ValueError) as e:
        benchlib.log("  %s failed: %s" % (what, e))
        return None, "%s failed: %s" % (what, str(e).splitlines()[0][:150] if str(e) else "?")


def progress_cost(rows, quick):
    """The cost of progress reports (issue 17): the closed-loop capacity with
    every heartbeat carrying a RankProgress of PROGRESS_GROUPS communicators,
    against the same fleet without them on a fresh coordinator, back to back."""
    for n in ([256] if quick else [1024, 4096]):
        got = {}
        for groups in (0, PROGRESS_GROUPS):
            benchlib.log("%s: %d workers, closed loop, progress_groups=%d" % (NAME, n, groups))
            coord = _common.Coordinator("heartbeats-progress-%d-%d" % (n, groups))
            try:
                got[groups] = run(lambda: _common.cp_load(
                    "heartbeats", address=coord.address, workers=n, interval_ms=INTERVAL_MS,
                    timeout_ms=TIMEOUT_MS, seconds=1, closed_seconds=5, progress_groups=groups,
                    form_timeout_s=60, timeout=600), "shardline progress_groups=%d" % groups)
            finally:
                coord.stop()
        (with_p, with_err), (without, without_err) = got[PROGRESS_GROUPS], got[0]
        res = with_p.get("closed") if with_p and not with_p.get("formation_failed") else None
        peer = without.get("closed") if without and not without.get("formation_failed") else None
        note = "; ".join(x for x in (with_err, without_err) if x)
        if res is not None:
            note += " with progress: lost=%d errors=%d" % (res["lost"], res["errors"])
        rows.add("heartbeats/s closed loop with progress reports (%d communicators)" % PROGRESS_GROUPS,
                 "workers=%d" % n, res["per_s"] if res else None,
                 "shardline heartbeats without progress reports", peer["per_s"] if peer else None,
                 "heartbeats/s", True, note.replace(",", ";").strip())


def main():
    quick = benchlib.quick()
    out = benchlib.out_path("bench/out/%s.csv" % NAME)
    rows = benchlib.Rows(out, NAME)
    # (workers, paced seconds, closed-loop seconds)
    cases = [(256, 2, 2)] if quick else [(256, 10, 5), (1024, 10, 5), (4096, 10, 5)]
    for n, paced_s, closed_s in cases:
        benchlib.log("%s: %d workers, %d s paced + %d s closed loop" % (NAME, n, paced_s, closed_s))
        coord = _common.Coordinator("heartbeats-coordinator-%d" % n)
        try:
            sl, sl_err = run(lambda: _common.cp_load(
                "heartbeats", address=coord.address, workers=n, interval_ms=INTERVAL_MS,
                timeout_ms=TIMEOUT_MS, seconds=paced_s, closed_seconds=closed_s,
                form_timeout_s=60, timeout=600), "shardline")
        finally:
            coord.stop()
        peer = {}
        for phase, interval, secs in (("paced", INTERVAL_MS, paced_s), ("closed", 0, closed_s)):
            etcd = _common.Etcd("heartbeats-etcd-%d-%s" % (n, phase))
            try:
                peer[phase] = run(lambda: _common.cp_load(
                    "leases", address=etcd.address, workers=n, interval_ms=interval,
                    ttl_s=TIMEOUT_MS // 1000, seconds=secs, timeout=600), "etcd")
            finally:
                etcd.stop()
        param = "workers=%d" % n
        formation_failed = sl is not None and sl.get("formation_failed")
        for phase, case in (("paced", "paced every %d ms" % INTERVAL_MS),
                            ("closed", "closed loop (capacity)")):
            ed, ed_err = peer[phase]
            res = sl.get(phase) if sl is not None and not formation_failed else None
            note = "; ".join(x for x in (sl_err, ed_err) if x)
            if formation_failed:
                note += (" shardline: the job did not form: %d of %d workers assigned in %.0f s;"
                         " %d members declared LOST while alive (%d not ACTIVE); %s" % (
                             sl["assigned"], n, sl["seconds"], sl["lost"], sl["not_active"],
                             (sl["example"] or sl["first_error"])[:120]))
            if res is not None:
                note += " shardline errors=%d generation=%d not-ACTIVE=%d formed in %.1f s" % (
                    res["errors"], res["generation"], res["not_active"], sl["formed_s"])
                if phase == "paced":
                    note += " offered=%d/s" % (n * 1000 // INTERVAL_MS)
            if ed is not None:
                note += " etcd expired=%d errors=%d" % (ed["expired"], ed["errors"])
            note = note.replace(",", ";").strip()
            rows.add("heartbeats/s " + case, param, res["per_s"] if res else None,
                     "etcd 3.4 lease keep-alive", ed["per_s"] if ed else None, "heartbeats/s",
                     True, note)
            rows.add("heartbeat latency p99 " + case, param, res["p99_us"] / 1000 if res else None,
                     "etcd 3.4 lease keep-alive", ed["p99_us"] / 1000 if ed else None, "ms", False,
                     note)
            # False evictions: members declared lost (or whose session the
            # coordinator ended) while alive, vs leases expired while kept alive.
            if res is not None:
                evicted = res["lost"]
            elif formation_failed:
                evicted = sl["lost"]
            else:
                evicted = None
            rows.add("false evictions " + case, param, evicted, "etcd 3.4 lease keep-alive",
                     ed["expired"] if ed else None, "members", False, "must be 0; " + note)
    progress_cost(rows, quick)
    benchlib.write_notes(out, """
**How measured.** A fresh `shardline-coordinator --state memory` per case; one job of N workers
(heartbeat_interval = %d ms, heartbeat_timeout = %d s). `cp_load heartbeats` forms the job as real workers
would (JoinJob, Session stream, assignment, heartbeats from the join on; one gRPC connection per worker, all
driven by one completion queue), then measures two phases one after the other: paced (every worker sends
`Heartbeat` with its fence every interval, first beats spread over one interval) and a closed loop (each worker
sends the next as soon as the last is answered: N in flight, the capacity). Only answered heartbeats count. False evictions = members the coordinator declared LOST (`ListMembers` at the end of each phase; every simulated
worker stayed alive, so any is a false eviction; one loss ends the generation and fences every other member, the
note gives that count too). When the job does not even form within 60 s (members declared lost during the join
storm), the throughput is not measured and the members declared LOST count as false evictions. Peer: etcd 3.4 (data on tmpfs), one lease per worker with TTL %d s,
each kept alive over its own `LeaseKeepAlive` stream on the same schedule (same C++ gRPC load generator); a
keep-alive answered with TTL 0 is an expired lease, the false eviction of that design. Client and server share the
machine's cores: at 4096 workers the one load-generator process drives 4096 connections and answers the
coordinator's keepalive pings (every 5 s, 10 s to answer) from the same two cores, so a starved client can lose
its connections; the note then says the job did not form. Progress reports: the closed loop again, each
heartbeat of a ranked worker carrying a `RankProgress` (activity, step, step and compute time, and %d
communicators' last collective: group, operation, sequence, count, dtype, elapsed, peer) as a training rank's
does, against the same fleet without it on a fresh coordinator right before; the coordinator stores each
report and feeds the straggler windows.
""" % (INTERVAL_MS, TIMEOUT_MS // 1000, TIMEOUT_MS // 1000, PROGRESS_GROUPS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
