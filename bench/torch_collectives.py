#!/usr/bin/python3
"""The peer "torch.distributed (gloo)" for bench/collectives.py: one process per
rank (this script, started `--ranks` times by collectives.py), TCP init on
loopback. Same sizes and timing as shardline-bench-collectives: per size,
`warmup` untimed calls, a barrier, `iters` timed calls; time = the slowest
rank's elapsed / iters. Rank 0 prints CSV rows in that binary's --csv layout.

reduce_scatter is dist.reduce_scatter_tensor where this torch's gloo backend
has it; torch 1.13's has none (ProcessGroupGloo raises "does not support
reduce_scatter"), and there the row times what a torch user does instead:
all_reduce of the whole input, then copying out the own piece. Rank 0's first
output line says which: "# reduce_scatter: native" or "# reduce_scatter:
all_reduce + copy".
"""
import argparse
import sys
import time

import torch
import torch.distributed as dist


def has_native_reduce_scatter(n):
    """Whether dist.reduce_scatter_tensor runs on this gloo backend (every rank
    tries it once and they agree: a rank where it raised says so in an
    all_reduce)."""
    ok = 1.0
    if not hasattr(dist, "reduce_scatter_tensor"):
        ok = 0.0
    else:
        try:
            out = torch.empty(1)
            dist.reduce_scatter_tensor(out, torch.ones(n))
            ok = 1.0 if out.item() == float(n) else 0.0
        except RuntimeError:
            ok = 0.0
    flag = torch.tensor([ok])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return flag.item() == 1.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--ranks", type=int, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--ops", default="all_reduce,all_gather,reduce_scatter")
    ap.add_argument("--sizes", required=True, help="comma-separated bytes")
    ap.add_argument("--iters", default="20", help="one value, or one per size")
    ap.add_argument("--warmup", default="5", help="one value, or one per size")
    a = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % a.port,
                            rank=a.rank, world_size=a.ranks)
    n = a.ranks
    sizes = [int(s) for s in a.sizes.split(",")]
    iters = [int(s) for s in a.iters.split(",")]
    if len(iters) == 1:
        iters = iters * len(sizes)
    warmups = [int(s) for s in a.warmup.split(",")]
    if len(warmups) == 1:
        warmups = warmups * len(sizes)
    out = []
    native_reduce_scatter = has_native_reduce_scatter(n)
    for op in a.ops.split(","):
        for size, it, warmup in zip(sizes, iters, warmups):
            count = size // 4
            if op != "all_reduce":
                count = count // n * n
            if count == 0:
                continue
            piece = count // n
            if op == "all_reduce":
                t = torch.full((count,), 1.0 + a.rank)
                fn = lambda: dist.all_reduce(t)
            elif op == "all_gather":
                x = torch.full((piece,), 1.0 + a.rank)
                outs = list(torch.empty(count).split(piece))
                fn = lambda: dist.all_gather(outs, x)
            elif native_reduce_scatter:
                x = torch.full((count,), 1.0 + a.rank)
                mine = torch.empty(piece)
                fn = lambda: dist.reduce_scatter_tensor(mine, x)
            else:
                x = torch.full((count,), 1.0 + a.rank)
                mine = torch.empty(piece)
                def fn():
                    y = x.clone()
                    dist.all_reduce(y)
                    mine.copy_(y[a.rank * piece:(a.rank + 1) * piece])
            for _ in range(warmup):
                fn()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(it):
                fn()
            el = torch.tensor([(time.perf_counter() - t0) / it], dtype=torch.float64)
            dist.all_reduce(el, op=dist.ReduceOp.MAX)
            secs = el.item()
            nbytes = count * 4
            algbw = nbytes / secs / 1e9
            factor = 2.0 * (n - 1) / n if op == "all_reduce" else (n - 1) / n
            out.append("%d,%d,%d,fp32,%s,%.3f,%.6f,%.6f,N/A" % (
                n, nbytes, count, op, secs * 1e6, algbw, algbw * factor))
    dist.destroy_process_group()
    if a.rank == 0:
        print("# reduce_scatter: %s" % ("native" if native_reduce_scatter
                                         else "all_reduce + copy"))
        print("ranks,size_bytes,count,type,op,time_us,algbw_gbps,busbw_gbps,wrong")
        print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
