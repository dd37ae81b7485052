#!/usr/bin/python3
"""Benchmark 1, CPU collectives: bus bandwidth of Shardline's Gloo backend
(shardline-bench-collectives; its ranks share this host, so it runs on shared
memory) vs Gloo called directly over TCP (shardline-bench-gloo-direct) vs
torch.distributed gloo (bench/torch_collectives.py), all-reduce, all-gather,
reduce-scatter, 2 and 4 ranks, 4 B to 256 MiB (4 MiB in --quick); memcpy
bandwidth of the same bytes as the ceiling. Interface: bench/README.md."""
import csv
import io
import os
import socket
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

OPS = ["all_reduce", "all_gather", "reduce_scatter"]


def sweeps(quick):
    """(sizes, iters, warmup) groups: small sizes get many iterations."""
    if quick:
        return [([4 * 16 ** k for k in range(6)], 5, 1)]        # 4 B .. 4 MiB
    # 200 timed calls up to 256 KiB and 20 at 1..16 MiB (were 40 and 5):
    # the fastest peer's timed stretch was then under a millisecond (a few ms
    # at 1 MiB), shorter than a scheduler time slice on this shared 2-core
    # host, and whether one preemption fell into it decided the figure.
    return [([4 * 4 ** k for k in range(9)], 200, 10),           # 4 B .. 256 KiB
            ([1 << 20, 4 << 20, 16 << 20], 20, 3),
            ([64 << 20, 256 << 20], 3, 1)]


def bus_factor(op, n):
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    return 1.0 if op == "memcpy" else (n - 1) / n


def parse(text):
    """{(op, size_bytes): busbw GB/s}, recomputed from time_us (the GB/s columns are
    printed with 6 decimals, too coarse for the smallest sizes)."""
    rows = {}
    for r in csv.DictReader(io.StringIO(text)):
        size, secs = int(r["size_bytes"]), float(r["time_us"]) * 1e-6
        if secs > 0 and size > 0:
            rows[(r["op"], size)] = size / secs / 1e9 * bus_factor(r["op"], int(r["ranks"]))
    return rows


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def run(cmd, timeout=600):
    benchlib.log("+ " + " ".join(cmd))
    return subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True,
                          timeout=timeout).stdout


def shardline(bin_dir, ranks, op, sizes, iters, warmup, tmp):
    out = os.path.join(tmp, "shardline-%d-%s.csv" % (ranks, op))
    rows = {}
    lo, hi = sizes[0], sizes[-1]
    factor = sizes[1] // sizes[0] if len(sizes) > 1 else 2
    run([os.path.join(bin_dir, "worker/comm/shardline-bench-collectives"), "--ranks", str(ranks),
         "--op", op, "--min-bytes", str(lo), "--max-bytes", str(hi), "--factor", str(factor),
         "--iters", str(iters), "--warmup", str(warmup), "--csv", out])
    with open(out) as f:
        rows.update(parse(f.read()))
    return rows


def gloo_direct(bin_dir, ranks, op, sizes, iters, warmup):
    factor = sizes[1] // sizes[0] if len(sizes) > 1 else 2
    return parse(run([os.path.join(bin_dir, "bench/shardline-bench-gloo-direct"), "--ranks",
                      str(ranks), "--op", op, "--min-bytes", str(sizes[0]), "--max-bytes",
                      str(sizes[-1]), "--factor", str(factor), "--iters", str(iters),
                      "--warmup", str(warmup)]))


def torch_dist(python, ranks, groups):
    """({(op, size): busbw}, how reduce_scatter ran) for the torch under `python`."""
    sizes = [s for g in groups for s in g[0]]
    iters = [g[1] for g in groups for _ in g[0]]
    warmup = [g[2] for g in groups for _ in g[0]]
    port = free_port()
    here = os.path.dirname(os.path.abspath(__file__))
    cmd = [python, os.path.join(here, "torch_collectives.py"), "--ranks", str(ranks),
           "--port", str(port), "--sizes", ",".join(map(str, sizes)),
           "--iters", ",".join(map(str, iters)), "--warmup", ",".join(map(str, warmup))]
    benchlib.log("+ %s (x%d ranks)" % (" ".join(cmd), ranks))
    procs = [subprocess.Popen(cmd + ["--rank", str(r)], stdout=subprocess.PIPE, text=True)
             for r in range(ranks)]
    outs = [p.communicate(timeout=900)[0] for p in procs]
    for p in procs:
        if p.returncode != 0:
            raise RuntimeError("torch_collectives.py failed (exit %d)" % p.returncode)
    lines = outs[0].splitlines()
    how = lines[0].split(":", 1)[1].strip() if lines and lines[0].startswith("#") else ""
    return parse("\n".join(l for l in lines if not l.startswith("#"))), how


def retry(fn, failures, what):
    """fn(), tried twice; {} (and a note in `failures`, if given) when both fail."""
    for attempt in (1, 2):
        try:
            return fn()
        except (subprocess.SubprocessError, OSError) as e:
            benchlib.log("%s failed (attempt %d): %s" % (what, attempt, e))
    if failures is not None:
        failures.append(what)
    return {}


def main():
    quick = benchlib.quick()
    out = benchlib.out_path("bench/out/collectives.csv")
    rows = benchlib.Rows(out, "collectives")
    bin_dir = benchlib.bench_bin()
    tmp = benchlib.bench_tmp()
    groups = sweeps(quick)
    memcpy = {}
    failures = []
    torch_peers = benchlib.torch_peers()
    for ranks in (2, 4):
        peer_torch = {}  # label -> ({(op, size): busbw}, how reduce_scatter ran)
        for label, python in torch_peers:
            try:
                peer_torch[label] = torch_dist(python, ranks, groups)
            except Exception as e:  # a peer failing is a "not measured" row, not a crash
                benchlib.log("torch.distributed (%s) failed: %s" % (label, e))
                peer_torch[label] = ({}, "")
        for op in OPS:
            ours, direct = {}, {}
            for sizes, iters, warmup in groups:
                ours.update(retry(lambda: shardline(bin_dir, ranks, op, sizes, iters, warmup,
                                                    tmp), failures, "shardline"))
                direct.update(retry(lambda: gloo_direct(bin_dir, ranks, op, sizes, iters,
                                                        warmup), None, "gloo direct"))
            for (o, size), v in sorted(ours.items(), key=lambda kv: kv[0][1]):
                if o == "memcpy":
                    memcpy.setdefault(size, v)
                    continue
                param = "bytes=%d" % size
                rows.add("%s %d ranks" % (op, ranks), param, v, "gloo direct",
                         direct.get((o, size)), "GB/s",
                         note="" if (o, size) in direct else "peer not measured")
                for label, _ in torch_peers:
                    values, how = peer_torch[label]
                    tnote = ("torch emulates: all_reduce + copy"
                             if op == "reduce_scatter" and how != "native" else "")
                    if (o, size) not in values:
                        tnote = "peer not measured"
                    rows.add("%s %d ranks" % (op, ranks), param, v, "%s gloo" % label,
                             values.get((o, size)), "GB/s", note=tnote)
                if (o, size) in memcpy or ("memcpy", size) in ours:
                    m = ours.get(("memcpy", size), memcpy.get(size))
                    rows.add("%s %d ranks" % (op, ranks), param, v, "memcpy (ceiling)", m,
                             "GB/s", note="one-thread memcpy of the same bytes")
    benchlib.write_notes(out, """
Bus bandwidth (nccl-tests definitions: all_reduce algbw x 2(n-1)/n; all_gather and
reduce_scatter algbw x (n-1)/n; size = the whole buffer, i.e. the output of all_gather and
the input of reduce_scatter). Ranks are threads in one process for Shardline
(`shardline-bench-collectives`, our Gloo backend) and for Gloo called directly
(`bench/gloo_direct_main.cc`: `gloo::allreduce`, `gloo::allgather`,
`gloo::ReduceScatterHalvingDoubling`), and processes for torch.distributed (gloo, TCP init).
Shardline's ranks share this host, so its backend moves their data through a POSIX shared
memory segment (`worker/comm/shm_group.h`: per-rank staging buffers, futex flags, fp32
accumulation in vectorised loops; all_reduce reduce-scatter + all-gather in chunks, or a
direct reduction when small), as it does for the ranks of one host in a real job; the peers
use Gloo's TCP transport over loopback, which is what Gloo and torch.distributed gloo offer
between processes of one host. Per size: warmup calls, a barrier, timed calls; time = the
slowest rank's mean. Shardline's timed calls are issued back to back and then waited on
(its API is asynchronous: each returns a Work; a waiting thread runs queued shared memory
calls itself); Gloo direct and torch call synchronously, one after another. Small sizes are
latency-bound (the ratio then compares per-call overhead). torch peers: Debian's torch
1.13 and, where `deploy/install_deps.sh --bench` made its virtualenv, current torch from
PyPI (each column names its version). torch 1.13's gloo has no reduce_scatter, so its row
times all_reduce + copying out the own piece (what torch users do; the row's note says
so); a torch whose gloo has `reduce_scatter_tensor` runs that. This host has 2 cores shared with other work: with 4 ranks the ranks share cores and a
rank descheduled mid-collective stalls the others, so the figures measure CPU contention as
much as the transport and vary between runs. The memcpy ceiling is one thread copying the
same bytes.
""")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
