#!/usr/bin/python3
"""The peer torch.save / torch.load for bench/checkpoint.py: the same GPT-shaped
state as shardline-bench-checkpoint-io (GptStateShapes below mirrors the C++),
as a dict of fp32 tensors. Save = torch.save into a temporary file, fsync,
rename, fsync of the directory (what WriteShard does for durability); restore =
posix_fadvise(DONTNEED) on the file, then torch.load. Prints CSV:
repeat,bytes,save_s,restore_s. --stepped: one repeat per line read from stdin,
until its end (as shardline-bench-checkpoint-io --stepped)."""
import argparse
import os
import sys
import time

import torch


def gpt_state_shapes(nbytes, h):
    """Keep in step with GptStateShapes in bench/checkpoint_io_main.cc."""
    mats = [("attn.qkv.weight", 3 * h, h), ("attn.proj.weight", h, h),
            ("mlp.fc1.weight", 4 * h, h), ("mlp.fc2.weight", h, 4 * h)]
    out, left, layer = [], nbytes // 4, 0
    while left > 0:
        for name, rows, cols in mats:
            for kind in ("param", "exp_avg", "exp_avg_sq"):
                if left <= 0:
                    break
                r = rows if rows * cols <= left else (left + cols - 1) // cols
                out.append(("layers.%d.%s.%s" % (layer, name, kind), r, cols))
                left -= r * cols
        layer += 1
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--bytes", type=int, required=True)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--stepped", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    state = {name: torch.rand(r, c) for name, r, c in gpt_state_shapes(a.bytes, a.hidden)}
    total = sum(t.numel() * 4 for t in state.values())
    print("repeat,bytes,save_s,restore_s", flush=True)
    os.makedirs(a.dir, exist_ok=True)
    steps = (rep for rep, _ in enumerate(sys.stdin)) if a.stepped else range(a.repeats)
    for rep in steps:
        path = os.path.join(a.dir, "torch-%d.pt" % rep)
        t0 = time.perf_counter()
        with open(path + ".tmp", "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.rename(path + ".tmp", path)
        dfd = os.open(a.dir, os.O_RDONLY)
        os.fsync(dfd)
        os.close(dfd)
        save_s = time.perf_counter() - t0
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
        t1 = time.perf_counter()
        back = torch.load(path)
        restore_s = time.perf_counter() - t1
        for k, v in state.items():
            if not torch.equal(v, back[k]):
                print("torch_checkpoint: %s differs after load" % k, file=sys.stderr)
                return 1
        del back
        os.unlink(path)
        print("%d,%d,%.6f,%.6f" % (rep, total, save_s, restore_s), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
