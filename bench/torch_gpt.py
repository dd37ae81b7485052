#!/usr/bin/python3
"""The peer for bench/trainer.py: the GPT of deploy/jobs/nanogpt-cpu.yaml in torch
1.13 on the CPU, with the same shapes and work per step as shardline-train-local:
byte vocabulary (256), learned positions, pre-LayerNorm blocks, causal multi-head
attention, GELU MLP of width 4h, final LayerNorm, embedding tied to the output head,
fp32, mean cross entropy, global-norm gradient clipping at 1.0, AdamW. One step =
forward + backward (+ DDP's gradient all-reduce) + clip + AdamW.

  torch_gpt.py --steps 30 --threads 1                  # one process
  torch_gpt.py --steps 30 --threads 1 --ddp 2          # DDP gloo, 2 processes, batch split

Prints `tokens/s N` (global tokens per second over the steps after --skip)."""
import argparse
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, h, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(h)
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        self.ln2 = nn.LayerNorm(h)
        self.fc1 = nn.Linear(h, 4 * h)
        self.fc2 = nn.Linear(4 * h, h)

    def forward(self, x):
        b, t, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=2)
        q = q.view(b, t, self.heads, h // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, h // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, h // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, h)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, layers=4, heads=4, h=128, seq=64, vocab=256):
        super().__init__()
        self.wte = nn.Embedding(vocab, h)
        self.wpe = nn.Embedding(seq, h)
        self.blocks = nn.ModuleList([Block(h, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(h)
        for m in self.modules():  # GPT-2's initialisation, as the trainer's
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def forward(self, idx, targets):
        t = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(t))
        for blk in self.blocks:
            x = blk(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied head
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--skip", type=int, default=5, help="warm-up steps not timed")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ddp", type=int, default=0, help="world size (spawns processes)")
    ap.add_argument("--rank", type=int, default=-1)
    ap.add_argument("--port", type=int, default=29511)
    ap.add_argument("--batch", type=int, default=12, help="global batch (sequences)")
    ap.add_argument("--data", default="data/tinyshakespeare.txt")
    a = ap.parse_args()

    if a.ddp and a.rank < 0:  # parent: start the ranks, print rank 0's line
        import subprocess
        procs = [subprocess.Popen([sys.executable] + sys.argv + ["--rank", str(r)],
                                  stdout=subprocess.PIPE, text=True) for r in range(a.ddp)]
        outs = [p.communicate()[0] for p in procs]
        if any(p.returncode for p in procs):
            return 1
        sys.stdout.write(outs[0])
        return 0

    torch.set_num_threads(a.threads)
    torch.manual_seed(1337)
    world = a.ddp or 1
    rank = max(a.rank, 0)
    model = GPT()
    if a.ddp:
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % a.port, rank=rank,
                                world_size=world)
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
    with open(a.data, "rb") as f:
        data = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).long()
    seq, local = 64, a.batch // world
    g = torch.Generator().manual_seed(1337 + rank)
    t0 = None
    for step in range(a.steps):
        if step == a.skip:
            t0 = time.perf_counter()
        ix = torch.randint(len(data) - seq - 1, (local,), generator=g)
        x = torch.stack([data[i:i + seq] for i in ix])
        y = torch.stack([data[i + 1:i + 1 + seq] for i in ix])
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    el = time.perf_counter() - t0
    tokens = (a.steps - a.skip) * a.batch * seq
    if rank == 0:
        print("loss %.4f tokens/s %.1f" % (loss.item(), tokens / el))
    if a.ddp:
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
