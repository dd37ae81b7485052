"""A child process of torch_store_test.py: one member of an external job.

    store_child.py allreduce ADDRESS JOB WORKER_ID   # gloo PG through the Store
    store_child.py fenced ADDRESS JOB WORKER_ID      # gets SIGSTOPped, then checks fencing
"""

import sys
import time

import torch
import torch.distributed as dist

import shardline
from shardline import errors
from shardline.member import Member
from shardline.torch import Store


def allreduce(member):
    a = member.wait_assignment(90)
    store = Store(member, scope="pg", timeout=60)
    dist.init_process_group("gloo", store=store, rank=a.rank, world_size=a.world_size)
    t = torch.tensor([float(a.rank + 1)])
    dist.all_reduce(t)
    parts = [torch.zeros(1) for _ in range(a.world_size)]
    dist.all_gather(parts, torch.tensor([float(a.rank + 1)]))
    print("rank=%d all_reduce=%.1f all_gather=%s" % (
        a.rank, t.item(), [p.item() for p in parts]), flush=True)
    dist.destroy_process_group()
    member.leave("done")


def fenced(member):
    a = member.wait_assignment(90)
    store = Store(member, timeout=5)
    store.set("alive", b"1")
    print("assigned generation=%d" % a.generation, flush=True)
    # The parent SIGSTOPs us here until the coordinator has declared us LOST.
    deadline = time.monotonic() + 60
    while not member.reform_pending and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        store.set("after", b"1")
        print("old store accepted a write", flush=True)
        sys.exit(1)
    except errors.AbortedError as e:
        print("old store refused: %s" % e.code.name, flush=True)
    member.rejoin()
    b = member.wait_assignment(60)
    print("rejoined generation=%d world=%d" % (b.generation, b.world_size), flush=True)
    member.leave("done")


def main():
    mode, address, job, worker = sys.argv[1:5]
    conn = shardline.Connection(address, timeout=10)
    member = Member(conn, job, worker)
    member.join()
    {"allreduce": allreduce, "fenced": fenced}[mode](member)
    conn.close()


if __name__ == "__main__":
    main()
