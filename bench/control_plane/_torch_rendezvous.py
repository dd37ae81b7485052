#!/usr/bin/python3
"""The torch peer of `cp_load rendezvous`: N nodes run torchrun's c10d
rendezvous (DynamicRendezvousHandler over C10dRendezvousBackend, torch 1.13,
min_nodes = max_nodes = N) against one TCPStore server and each gets its rank
and world size; prints the seconds from the start to the last node done.

    _torch_rendezvous.py --port P --nodes N [--timeout-s 120]

The nodes are threads of this process, each with its own TCPStore connection
(torchrun would run one agent process per node; the rendezvous mostly waits,
so threads do not hold it back much).
"""
import argparse
import datetime
import json
import logging
import queue
import threading
import time

from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler


def run_nodes(args, ids, start_at, q):
    logging.disable(logging.WARNING)
    results = {}

    def node(i):
        store = TCPStore("127.0.0.1", args.port, None, False, datetime.timedelta(seconds=600),
                         wait_for_workers=False)
        backend = C10dRendezvousBackend(store, "bench")
        params = RendezvousParameters(backend="c10d", endpoint="127.0.0.1:%d" % args.port,
                                      run_id="bench", min_nodes=args.nodes, max_nodes=args.nodes,
                                      join_timeout=args.timeout_s, last_call_timeout=1)
        handler = create_handler(store, backend, params)
        while time.time() < start_at:
            time.sleep(0.001)
        try:
            got = handler.next_rendezvous()
            # torch 1.13 returns (store, rank, world_size); torch >= 2.4 a
            # RendezvousInfo with rank and world_size attributes.
            if isinstance(got, tuple):
                _, rank, world = got
            else:
                rank, world = got.rank, got.world_size
            results[i] = (time.time(), rank, world)
        except Exception as e:  # a timeout: reported as not done
            results[i] = (None, str(e)[:200], 0)

    threads = [threading.Thread(target=node, args=(i,), daemon=True) for i in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    q.put(results)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--timeout-s", type=float, default=120)
    args = p.parse_args()
    q = queue.Queue()
    start_at = time.time() + 1.0 + 0.005 * args.nodes
    run_nodes(args, list(range(args.nodes)), start_at, q)
    results = q.get()
    done = [r for r in results.values() if r[0] is not None]
    errors = [r[1] for r in results.values() if r[0] is None]
    ranks = sorted(r[1] for r in done)
    res = {"nodes": args.nodes, "done": len(done),
           "seconds": (max(r[0] for r in done) - start_at) if done else None,
           "ranks_ok": ranks == list(range(args.nodes)),
           "first_error": errors[0] if errors else ""}
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
