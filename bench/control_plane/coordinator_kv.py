#!/usr/bin/python3
"""Benchmark `coordinator_kv` (bench/README.md, item 2): the coordinator's
key-value store and barriers under 1..256 concurrent clients, against
torch.distributed.TCPStore and etcd 3.4, each server a process of its own on
127.0.0.1 measured in the same run.

    bench/control_plane/coordinator_kv.py --out bench/out/coordinator_kv.csv [--quick]

Rows: ops/s, p50 and p99 latency of a set+get mix per client count
(Shardline vs TCPStore, Shardline vs etcd); barrier rounds/s and p50 wait
(Shardline vs a TCPStore add+wait barrier; etcd has no barrier primitive).
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
from _common import benchlib  # noqa: E402

NAME = "coordinator_kv"


def torch_load(python, mode, port, **flags):
    argv = [python, os.path.join(_common.HERE, "_torch_store_load.py"), mode,
            "--port", str(port)]
    for k, v in flags.items():
        argv += ["--" + k.replace("_", "-"), str(v)]
    return _common.run_json(argv, timeout=600)


def measure(fn, what):
    try:
        return fn(), ""
    except (RuntimeError, OSError, subprocess.TimeoutExpired, ValueError) as e:
        benchlib.log("  %s failed: %s" % (what, str(e)[:500]))
        return None, ("%s failed: %s" % (what, str(e).splitlines()[0] if str(e) else "?"))[:200]


def main():
    quick = benchlib.quick()
    out = benchlib.out_path("bench/out/%s.csv" % NAME)
    rows = benchlib.Rows(out, NAME)
    clients = [1, 16] if quick else [1, 4, 16, 64, 256]
    barrier_clients = [16] if quick else [2, 16, 64, 256]
    seconds = 1.0 if quick else 3.0
    rounds = 20 if quick else 100
    # Debian's torch 1.13 and, where its virtualenv exists, current torch
    # (whose TCPStore serves on libuv by default).
    torch_peers = benchlib.torch_peers()

    def tcpstore(label, python, what, n, **flags):
        store = _common.TorchStore("%s-tcpstore-%s-%d" % (what, label.replace(" ", ""), n),
                                   python)
        try:
            return measure(lambda: torch_load(python, what, store.port, clients=n, **flags),
                           "%s TCPStore" % label)
        finally:
            store.stop()

    for n in clients:
        benchlib.log("%s: %d clients" % (NAME, n))
        # A fresh server per point: no state carried over between sizes.
        coord = _common.Coordinator("kv-coordinator-%d" % n)
        try:
            sl, sl_err = measure(lambda: _common.cp_load(
                "kv", target="shardline", address=coord.address, clients=n, seconds=seconds),
                "shardline")
        finally:
            coord.stop()
        stores = [("%s TCPStore" % label,) + tcpstore(label, python, "kv", n, seconds=seconds)
                  for label, python in torch_peers]
        etcd = _common.Etcd("kv-etcd-%d" % n)
        try:
            ed, ed_err = measure(lambda: _common.cp_load(
                "kv", target="etcd", address=etcd.address, clients=n, seconds=seconds), "etcd")
        finally:
            etcd.stop()
        param = "clients=%d" % n
        for peer, res, err in stores + [("etcd 3.4", ed, ed_err)]:
            for case, key, unit, hib in (("set+get throughput", "ops_per_s", "ops/s", True),
                                         ("set+get latency p50", "p50_us", "us", False),
                                         ("set+get latency p99", "p99_us", "us", False)):
                note = "; ".join(x for x in (sl_err, err) if x)
                if sl is not None and sl.get("errors"):
                    note += " shardline errors=%d" % sl["errors"]
                if res is not None and res.get("errors"):
                    note += " peer errors=%d" % res["errors"]
                rows.add(case, param, sl[key] if sl else None, peer,
                         res[key] if res else None, unit, hib, note.strip())

    for n in barrier_clients:
        benchlib.log("%s: barrier, %d clients" % (NAME, n))
        coord = _common.Coordinator("barrier-coordinator-%d" % n)
        try:
            sl, sl_err = measure(lambda: _common.cp_load(
                "barrier", address=coord.address, clients=n, rounds=rounds), "shardline")
        finally:
            coord.stop()
        param = "clients=%d" % n
        for label, python in torch_peers:
            ts, ts_err = tcpstore(label, python, "barrier", n, rounds=rounds)
            note = "; ".join(x for x in (sl_err, ts_err) if x)
            peer = "%s TCPStore add+wait" % label
            rows.add("barrier rounds", param, sl["rounds_per_s"] if sl else None, peer,
                     ts["rounds_per_s"] if ts else None, "rounds/s", True, note)
            rows.add("barrier wait p50", param, sl["p50_us"] if sl else None, peer,
                     ts["p50_us"] if ts else None, "us", False, note)

    benchlib.write_notes(out, """
**How measured.** Each point starts a fresh server process on 127.0.0.1: `shardline-coordinator --state memory`
(no auth), a `torch.distributed.TCPStore` master in its own Python process (Debian's torch 1.13, and current
torch from PyPI where `deploy/install_deps.sh --bench` made its virtualenv: its TCPStore serves on libuv; each
column names its version), and `etcd` 3.4 (one
member, data directory on tmpfs `/dev/shm` — etcd fsyncs its WAL on every put; tmpfs keeps that cost small, on a
real disk etcd would be slower). N clients run for %.0f s each, each with its own connection, doing *set key;
get key* (64-byte values, 64 keys per client); both calls count as operations. Shardline and etcd are driven by
the same C++ gRPC load generator (`cp_load`, one thread per client, synchronous stubs); Shardline's clients are
real job members (JoinJob, Session, assignment) calling `KvSet`/`KvGet` with their fence, etcd's call
`Put`/`Range` (linearizable reads, etcd's default). TCPStore has no C++ client here: its clients are Python
threads in up to 8 processes calling `set`/`get`, so part of its latency is the Python interpreter.
Barriers: N members pass %d `Barrier` rounds; the TCPStore peer does `add(round, 1)`, the last arrival sets
`round/done`, the others `wait()` on it (etcd has no barrier primitive). Everything, clients included, shares the
machine's cores, so at high client counts the numbers measure the host as much as the server.
torch 2.15's TCPStore at 64 and 256 clients: every call took about 3.4 s in this harness (8 client threads per \
process), with its libuv server and with the classic one alike (checked by hand with 64 clients), while 16 \
clients ran 90k ops/s: an interaction of current torch's client with this harness, not the server's capacity, \
so those cells do not measure TCPStore; torch 1.13's do.

**Where the time goes (measured 2026-12-06, perf on the coordinator under `cp_load kv`, 1 client, 9.7k ops/s).** \
The kernel 36 %%, libgrpc 32 %%, Abseil's mutexes 6 %%, the coordinator's own code 5.7 %% (request limits, the fence \
check, the rendezvous, metrics and the generated gRPC glue together). What separates Shardline from TCPStore here is \
the cost of a gRPC call on this library (Debian's build, see the rendezvous notes) and its thread wake-ups, not the \
store's logic: the fenced calls already skip the hand-off to the coordinator's handler pool when its lock is free \
(server/rpc/call.h `RunInlineOrPooled`). A TCPStore-class figure would need a leaner transport for the store beside \
gRPC.
""" % (seconds, rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
