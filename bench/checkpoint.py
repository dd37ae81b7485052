#!/usr/bin/python3
"""Benchmark 6, checkpoints: save and restore GB/s of Shardline's shard file path
(WriteShard / ReadRuns, through shardline-bench-checkpoint-io) vs dd of the same
byte count to the same disk (conv=fdatasync; read back with dd) vs torch.save /
torch.load of the same tensors (with fsync). Interface: bench/README.md."""
import csv
import io
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402


def table(text):
    return [{k: float(v) for k, v in r.items()} for r in csv.DictReader(io.StringIO(text))]


def run(cmd):
    benchlib.log("+ " + " ".join(cmd))
    return subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout


def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


def dd(directory, nbytes, repeats):
    bs = 4 << 20
    count = (nbytes + bs - 1) // bs
    out = []
    for rep in range(repeats):
        path = os.path.join(directory, "dd-%d.bin" % rep)
        t0 = time.perf_counter()
        subprocess.run(["dd", "if=/dev/zero", "of=" + path, "bs=%d" % bs, "count=%d" % count,
                        "conv=fdatasync"], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        save = time.perf_counter() - t0
        drop_cache(path)
        t1 = time.perf_counter()
        subprocess.run(["dd", "if=" + path, "of=/dev/null", "bs=%d" % bs], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        restore = time.perf_counter() - t1
        os.unlink(path)
        out.append({"bytes": float(bs * count), "save_s": save, "restore_s": restore})
    return out


def gbps(rows, key):
    """Median GB/s over the repeats."""
    return statistics.median(r["bytes"] / r[key] / 1e9 for r in rows)


def main():
    quick = benchlib.quick()
    out = benchlib.out_path("bench/out/checkpoint.csv")
    rows = benchlib.Rows(out, "checkpoint")
    d = os.path.join(benchlib.bench_tmp(), "checkpoint")
    os.makedirs(d, exist_ok=True)
    nbytes = (64 << 20) if quick else (512 << 20)
    repeats = 2 if quick else 3
    here = os.path.dirname(os.path.abspath(__file__))
    ours = table(run([os.path.join(benchlib.bench_bin(), "bench/shardline-bench-checkpoint-io"),
                      "--dir", d, "--bytes", str(nbytes), "--repeats", str(repeats)]))
    peers = {"dd": dd(d, nbytes, repeats)}
    try:
        peers["torch.save/torch.load"] = table(run(
            [sys.executable, os.path.join(here, "torch_checkpoint.py"), "--dir", d,
             "--bytes", str(nbytes), "--repeats", str(repeats)]))
    except Exception as e:
        benchlib.log("torch peer failed: %s" % e)
        peers["torch.save/torch.load"] = None
    param = "bytes=%d" % nbytes
    for what, key in (("save", "save_s"), ("restore", "restore_s")):
        for name, prow in peers.items():
            rows.add(what, param, gbps(ours, key), name, gbps(prow, key) if prow else None,
                     "GB/s", note="" if prow else "peer failed")
    benchlib.write_notes(out, """
State: a GPT-shaped set of fp32 tensors (width 1024: qkv, proj, fc1, fc2 of each layer,
each as parameter + AdamW's two moments, as `Trainer::SaveSlices` hands them over) of %d MiB,
median of %d repeats. Shardline: `WriteShard` (one file, CRC-32C per piece and per file,
fsync of the file, rename, fsync of the directory) and `ReadRuns` (pread of each run,
CRC-32C of every piece verified; values compared after). dd: `dd if=/dev/zero bs=4M
conv=fdatasync` of the same byte count, read back with `dd of=/dev/null` (the disk's
sequential ceiling: no checksums, no serialisation). torch: `torch.save` of the same
tensors as a dict into a temporary file, fsync, rename, fsync of the directory;
`torch.load` (values compared after). Before each restore the file is evicted from the
page cache with posix_fadvise(DONTNEED); a virtual disk may still be cached by the host,
so restore figures can exceed the device's raw speed.
""" % (nbytes >> 20, repeats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
