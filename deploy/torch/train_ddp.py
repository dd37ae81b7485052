"""An elastic DDP training script for torchrun on Shardline's rendezvous.

A byte-level language model (embedding, two-layer MLP over a window of
bytes) trained with DistributedDataParallel over gloo on a text corpus.
Elastic in torch's usual way: rank 0 saves a checkpoint every
--save-every steps (atomically: temp file, then rename), and every start
of the workers (first start, or after torchrun restarted them for a new
round) resumes from the newest checkpoint. The global batch stays fixed:
each of WORLD_SIZE ranks takes batch/WORLD_SIZE samples, drawn from one
seeded sequence.

    python3 -m shardline.torchrun --nnodes 2:3 --nproc_per_node 1 \\
        --rdzv_endpoint 127.0.0.1:7070 --rdzv_id demo --max_restarts 3 \\
        deploy/torch/train_ddp.py --data data/tinyshakespeare.txt \\
        --steps 300 --checkpoint-dir /tmp/demo-ckpt

Under the "shardline" backend the process group is initialised on the
round's Shardline store (shardline.torch.Store.from_env()); under any other
backend, through torchrun's env:// (MASTER_ADDR/PORT).

Each step prints one line, which tests and benchmarks read:
    step=<n> loss=<nats/byte> world=<WORLD_SIZE> restart=<count> time=<unix s>
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

CONTEXT = 16
VOCAB = 256


class ByteMLP(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.fc1 = nn.Linear(32 * CONTEXT, width)
        self.fc2 = nn.Linear(width, VOCAB)

    def forward(self, x):
        h = self.embed(x).flatten(1)
        return self.fc2(F.gelu(self.fc1(h)))


def batch(data: torch.Tensor, step: int, size: int, seed: int):
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, data.numel() - CONTEXT - 1, (size,), generator=g)
    x = torch.stack([data[s:s + CONTEXT] for s in starts.tolist()])
    y = torch.stack([data[s + CONTEXT] for s in starts.tolist()])
    return x.long(), y.long()


def init_process_group() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if os.environ.get("SHARDLINE_TORCH_STORE"):
        from shardline.torch import Store
        dist.init_process_group("gloo", store=Store.from_env(), rank=rank, world_size=world)
    else:
        dist.init_process_group("gloo")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="text corpus (bytes)")
    p.add_argument("--steps", type=int, default=200, help="optimizer steps in all")
    p.add_argument("--batch", type=int, default=48, help="global batch (samples)")
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--checkpoint-dir", required=True)
    p.add_argument("--save-every", type=int, default=10, help="steps between checkpoints")
    p.add_argument("--step-sleep", type=float, default=0.0,
                   help="seconds to sleep per step (lets tests kill mid-run)")
    args = p.parse_args()

    torch.set_num_threads(1)
    init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.batch % world:
        print(f"--batch={args.batch} is not a multiple of WORLD_SIZE={world}", file=sys.stderr)
        return 2
    torch.manual_seed(args.seed)
    model = DDP(ByteMLP(args.width))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    start = 0
    path = os.path.join(args.checkpoint_dir, "latest.pt")
    if os.path.exists(path):
        ckpt = torch.load(path)
        model.module.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        start = ckpt["step"]
    data = torch.frombuffer(bytearray(open(args.data, "rb").read()), dtype=torch.uint8)
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    per_rank = args.batch // world
    for step in range(start + 1, args.steps + 1):
        x, y = batch(data, step, args.batch, args.seed)
        x, y = x[rank * per_rank:(rank + 1) * per_rank], y[rank * per_rank:(rank + 1) * per_rank]
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        mean /= world
        if rank == 0:
            print(f"step={step} loss={mean.item():.4f} world={world} restart={restart} "
                  f"time={time.time():.3f}", flush=True)
            if step % args.save_every == 0 or step == args.steps:
                os.makedirs(args.checkpoint_dir, exist_ok=True)
                tmp = path + f".tmp{os.getpid()}"
                torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(),
                            "step": step}, tmp)
                os.replace(tmp, path)
        if args.step_sleep:
            time.sleep(args.step_sleep)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
