#!/usr/bin/python3
"""The torch peer of cp_load's kv and barrier modes: N TCPStore clients
against a TCPStore server, the same operations; prints one JSON object.

    _torch_store_load.py kv      --port P --clients N --seconds S [--value-bytes 64]
    _torch_store_load.py barrier --port P --clients N --rounds R

Clients are threads spread over up to 8 forked processes (the store's calls
release the GIL, but the Python loop around them does not), each client with
its own TCPStore connection. kv: set c<i>/k<j> then get it (64 keys per
client), both counted. barrier: what a store-based barrier does with the
primitives TCPStore has: add(round, 1); the last arrival sets round/done,
the others wait([round/done]).
"""
import argparse
import datetime
import json
import multiprocessing as mp
import threading
import time

from torch.distributed import TCPStore


def client_store(port):
    return TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=300),
                    wait_for_workers=False)


def proc_main(args, ids, start_at, q):
    stores = {c: client_store(args.port) for c in ids}
    lat = {c: [] for c in ids}
    errors = [0]
    value = b"v" * args.value_bytes

    def kv(c):
        s = stores[c]
        out = lat[c]
        while time.time() < start_at:
            time.sleep(0.0005)
        end = start_at + args.seconds
        j = 0
        pc = time.perf_counter
        while time.time() < end:
            key = "c%d/k%d" % (c, j % 64)
            t0 = pc()
            s.set(key, value)
            t1 = pc()
            got = s.get(key)
            t2 = pc()
            if len(got) != len(value):
                errors[0] += 1
            out.append(t1 - t0)
            out.append(t2 - t1)
            j += 1

    def barrier(c):
        s = stores[c]
        out = lat[c]
        while time.time() < start_at:
            time.sleep(0.0005)
        for r in range(args.rounds):
            t0 = time.perf_counter()
            n = s.add("round%d" % r, 1)
            if n == args.clients:
                s.set("round%d/done" % r, b"1")
            else:
                s.wait(["round%d/done" % r])
            out.append(time.perf_counter() - t0)

    fn = kv if args.mode == "kv" else barrier
    threads = [threading.Thread(target=fn, args=(c,)) for c in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    q.put(([x for c in ids for x in lat[c]], errors[0], time.time()))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["kv", "barrier"])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--clients", type=int, default=1)
    p.add_argument("--seconds", type=float, default=3)
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--value-bytes", type=int, default=64)
    args = p.parse_args()
    nproc = min(args.clients, 8)
    groups = [list(range(i, args.clients, nproc)) for i in range(nproc)]
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    # Start together once every process has connected (connecting 256
    # clients takes a moment).
    start_at = time.time() + 1.0 + 0.01 * args.clients
    procs = [ctx.Process(target=proc_main, args=(args, g, start_at, q)) for g in groups]
    for pr in procs:
        pr.start()
    lat, errors, end = [], 0, start_at
    for _ in procs:
        l, e, t = q.get()
        lat += l
        errors += e
        end = max(end, t)
    for pr in procs:
        pr.join()
    lat.sort()

    def pct(x):
        return lat[min(len(lat) - 1, int(x / 100.0 * (len(lat) - 1) + 0.5))] * 1e6 if lat else 0

    secs = args.seconds if args.mode == "kv" else end - start_at
    res = {"target": "tcpstore", "clients": args.clients, "seconds": secs,
           "p50_us": pct(50), "p99_us": pct(99), "errors": errors}
    if args.mode == "kv":
        res.update(ops=len(lat), ops_per_s=len(lat) / secs)
    else:
        res.update(rounds=args.rounds, rounds_per_s=args.rounds / secs)
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
