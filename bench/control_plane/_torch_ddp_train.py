#!/usr/bin/python3
"""The torchrun peer of node_loss.py: a tiny GPT (2 layers, width 16, 2
heads, byte vocabulary 256, context 16; the Shardline job's shape) trained
with DistributedDataParallel over gloo on CPU, global batch 24 split over the
ranks, AdamW, a checkpoint (model + optimizer + step) every 5 steps written by
rank 0 and loaded on every (re)start. Run by torchrun; logs one line per
step with the wall-clock time:

    step S t=EPOCH rank R world W restart K

Environment: BENCH_CKPT (checkpoint file), BENCH_DATA (text file);
for hang_recovery.py, BENCH_PG_TIMEOUT (seconds: the process group's
collective timeout; torch's default is 30 min) and BENCH_STALL_RANK /
BENCH_STALL_AT_STEP (that rank's first run blocks its training loop
forever before that step, its process alive: a hung training thread).
"""
import os
import datetime
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

VOCAB, WIDTH, HEADS, LAYERS, CONTEXT, GLOBAL_BATCH = 256, 16, 2, 2, 16, 24


class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, WIDTH)
        self.pos = nn.Embedding(CONTEXT, WIDTH)
        layer = nn.TransformerEncoderLayer(WIDTH, HEADS, 4 * WIDTH, dropout=0.0,
                                           activation="gelu", batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, LAYERS)
        self.ln = nn.LayerNorm(WIDTH)
        self.register_buffer("mask", torch.triu(torch.full((CONTEXT, CONTEXT), float("-inf")), 1))

    def forward(self, x):
        h = self.tok(x) + self.pos(torch.arange(x.shape[1]))
        h = self.ln(self.blocks(h, mask=self.mask))
        return h @ self.tok.weight.t()  # embedding tied to the head


def main():
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    print("pid %d rank %d world %d restart %d" % (os.getpid(), rank, world, restart), flush=True)
    if os.environ.get("BENCH_PG_TIMEOUT"):
        dist.init_process_group("gloo", timeout=datetime.timedelta(
            seconds=float(os.environ["BENCH_PG_TIMEOUT"])))
    else:
        dist.init_process_group("gloo")
    stall_rank = int(os.environ.get("BENCH_STALL_RANK", "-1"))
    stall_at = int(os.environ.get("BENCH_STALL_AT_STEP", "0"))
    data = torch.tensor(list(open(os.environ["BENCH_DATA"], "rb").read()), dtype=torch.long)
    torch.manual_seed(7)
    model = DDP(TinyGPT())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    ckpt = os.environ["BENCH_CKPT"]
    step = 0
    if os.path.exists(ckpt):
        state = torch.load(ckpt)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
        print("restored step %d" % step, flush=True)
    per_rank = GLOBAL_BATCH // world
    while True:
        if rank == stall_rank and restart == 0 and step + 1 == stall_at:
            print("stalling before step %d t=%.6f" % (step + 1, time.time()), flush=True)
            while True:
                time.sleep(3600)
        g = torch.Generator().manual_seed(step)
        starts = torch.randint(0, len(data) - CONTEXT - 1, (GLOBAL_BATCH,), generator=g)
        mine = starts[rank * per_rank:(rank + 1) * per_rank]
        x = torch.stack([data[s:s + CONTEXT] for s in mine])
        y = torch.stack([data[s + 1:s + CONTEXT + 1] for s in mine])
        loss = nn.functional.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if rank == 0 and step % 5 == 0:
            torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(),
                        "step": step}, ckpt + ".tmp")
            os.replace(ckpt + ".tmp", ckpt)
        print("step %d t=%.6f rank %d world %d restart %d loss %.4f" % (
            step, time.time(), rank, world, restart, loss.item()), flush=True)


if __name__ == "__main__":
    main()
