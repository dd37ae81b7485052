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


def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


def dd_once(directory, nbytes, rep):
    """One dd save (bs=4M conv=fdatasync) and read-back of `nbytes`, like ours."""
    bs = 4 << 20
    count = (nbytes + bs - 1) // bs
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
    return {"bytes": float(bs * count), "save_s": save, "restore_s": restore}


def gbps(rows, key):
    """Median GB/s over the repeats."""
    return statistics.median(r["bytes"] / r[key] / 1e9 for r in rows)


def ratio_text(ours, peer, key):
    """min / median / max over the repeats of ours / peer GB/s in the same repeat."""
    r = sorted((o["bytes"] / o[key]) / (p["bytes"] / p[key]) for o, p in zip(ours, peer))
    return "%.2f / %.2f / %.2f" % (r[0], statistics.median(r), r[-1])


class Stepped:
    """A contender that runs one repeat per line it reads (--stepped) and
    answers with a CSV row of repeat,bytes,save_s,restore_s."""

    def __init__(self, cmd):
        benchlib.log("+ " + " ".join(cmd))
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        self.header = self.proc.stdout.readline()
        if not self.header:
            raise RuntimeError("%s exited at start (status %s)" % (cmd[0], self.proc.wait()))

    def step(self):
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("a contender exited (status %s)" % self.proc.wait())
        return table(self.header + line)[0]

    def close(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        if self.proc.wait() != 0:
            raise RuntimeError("a contender failed (status %d)" % self.proc.returncode)


def main():
    quick = benchlib.quick()
    out = benchlib.out_path("bench/out/checkpoint.csv")
    rows = benchlib.Rows(out, "checkpoint")
    d = os.path.join(benchlib.bench_tmp(), "checkpoint")
    os.makedirs(d, exist_ok=True)
    nbytes = (64 << 20) if quick else (512 << 20)
    repeats = 3 if quick else 9
    here = os.path.dirname(os.path.abspath(__file__))
    # The disk and the CPUs are shared (other builds, other benchmarks), so
    # the contenders take turns: Shardline and torch each run in one process
    # that does a repeat when told (--stepped), dd runs once per repeat, and
    # the order rotates every repeat, so that a slow spell hits all alike.
    # Each process first does one repeat that is not counted: a fresh
    # process's first save, just after it allocated the state, was 2-4x
    # slower than its later ones on the benchmark VM.
    ours_proc = Stepped([os.path.join(benchlib.bench_bin(), "bench/shardline-bench-checkpoint-io"),
                         "--dir", d, "--bytes", str(nbytes), "--stepped"])
    ours_proc.step()
    # Each torch the machine has (Debian's 1.13, PyPI's current one): a
    # contender of its own.
    torch_procs, torch_rows, torch_errors = {}, {}, {}
    for label, python in benchlib.torch_peers():
        try:
            proc = Stepped([python, os.path.join(here, "torch_checkpoint.py"),
                            "--dir", d, "--bytes", str(nbytes), "--stepped"])
            proc.step()
            torch_procs[label] = proc
            torch_rows[label] = []
        except Exception as e:  # the peer is optional
            benchlib.log("%s peer failed: %s" % (label, e))
            torch_errors[label] = e
    ours, dd = [], []
    for rep in range(repeats):
        order = ["ours", "dd"] + sorted(torch_procs)
        order = order[rep % len(order):] + order[:rep % len(order)]
        for who in order:
            if who == "ours":
                ours.append(ours_proc.step())
            elif who == "dd":
                dd.append(dd_once(d, nbytes, rep))
            elif who not in torch_errors:
                try:
                    torch_rows[who].append(torch_procs[who].step())
                except Exception as e:
                    benchlib.log("%s peer failed: %s" % (who, e))
                    torch_errors[who] = e
    ours_proc.close()
    for label, proc in torch_procs.items():
        try:
            proc.close()
        except Exception as e:
            benchlib.log("%s peer failed: %s" % (label, e))
            torch_errors.setdefault(label, e)
    peers = {"dd": dd}
    for label in sorted(set(torch_rows) | set(torch_errors)):
        peers["%s torch.save/torch.load" % label] = (
            None if label in torch_errors else torch_rows[label])
    param = "bytes=%d" % nbytes
    for what, key in (("save", "save_s"), ("restore", "restore_s")):
        for name, prow in peers.items():
            rows.add(what, param, gbps(ours, key), name, gbps(prow, key) if prow else None,
                     "GB/s", note="" if prow else "peer failed")
    benchlib.write_notes(out, """
State: a GPT-shaped set of fp32 tensors (width 1024: qkv, proj, fc1, fc2 of each layer,
each as parameter + AdamW's two moments, as `Trainer::SaveSlices` hands them over) of %d MiB,
median of %d repeats; in each repeat Shardline, dd and each torch (Debian's 1.13, and current torch from
PyPI where its virtualenv exists) run one after another, the
order rotated every repeat (the machine is shared, so a slow spell should hit all alike);
Shardline and torch each stay in one process, after one uncounted warm-up repeat (a fresh
process's first save, right after allocating the state, was 2-4x slower than later ones).
Shardline: `WriteShard` (one file in 4 MiB aligned blocks, CRC-32C per piece, the file's
combined from them, write-back streamed with sync_file_range, fsync of the file, rename,
fsync of the directory) and `ReadRuns` (pread of each run in 4 MiB chunks on up to 4
threads, CRC-32C of every piece verified; values compared after). dd: `dd if=/dev/zero
bs=4M conv=fdatasync` of the same byte count, read back with `dd of=/dev/null` (the disk's
sequential ceiling: no checksums, no serialisation, a 4 MiB buffer instead of the state's
memory). torch: `torch.save` of the same tensors as a dict into a temporary file, fsync,
rename, fsync of the directory; `torch.load` (values compared after). Before each restore
the file is evicted from the page cache with posix_fadvise(DONTNEED); a virtual disk may
still be cached by the host, so restore figures can exceed the device's raw speed.
Shardline / dd within the same repeat (min / median / max): save %s, restore %s.
""" % (nbytes >> 20, repeats, ratio_text(ours, dd, "save_s"), ratio_text(ours, dd, "restore_s")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
