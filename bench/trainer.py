#!/usr/bin/python3
"""Benchmark 7, trainer: tokens/s of shardline-train-local vs torch 1.13 on the CPU
for the same GPT (deploy/jobs/nanogpt-cpu.yaml: 4 layers, 4 heads, width 128,
context 64, batch 12, byte vocabulary, fp32; torch model in bench/torch_gpt.py):
one process with 1 and with 2 BLAS/intra-op threads, and data parallel over 2
ranks (ours: two ranks as threads over loopback Gloo; torch: DDP gloo, 2
processes). On a machine with an NVIDIA GPU: model FLOPs utilisation.
Interface: bench/README.md."""
import os
import re
import shutil
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

SPEC = "deploy/jobs/nanogpt-cpu.yaml"
DATA = "data/tinyshakespeare.txt"


def spec_for(dp):
    """The spec, with micro_batch = global_batch / dp so dp ranks keep the global batch
    of 12 in one micro-batch each (the spec's micro_batch 12 does not split over dp=2)."""
    if dp == 1:
        return SPEC
    with open(SPEC) as f:
        text = f.read()
    text = re.sub(r"(?m)^(\s*micro_batch:)\s*12\b", r"\1 %d" % (12 // dp), text)
    path = os.path.join(benchlib.bench_tmp(), "nanogpt-cpu-dp%d.yaml" % dp)
    with open(path, "w") as f:
        f.write(text)
    return path


def ours(steps, skip, threads, dp):
    cmd = [os.path.join(benchlib.bench_bin(), "worker/train/shardline-train-local"), spec_for(dp),
           "--data", DATA, "--steps", str(steps), "--log-interval", str(skip),
           "--blas-threads", str(threads), "--dp", str(dp), "--eval-samples", "12"]
    benchlib.log("+ " + " ".join(cmd))
    text = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    rates = []
    for m in re.finditer(r"^step (\d+)/\d+ .*tokens/s (\d+)", text, re.M):
        if int(m.group(1)) > skip:  # windows of `skip` steps after the first
            rates.append(float(m.group(2)))
    return statistics.mean(rates)


def torch_peer(steps, skip, threads, dp, blas_threads=None):
    """torch's tokens/s with `threads` intra-op (OpenMP) threads and `blas_threads`
    (default: `threads`) OpenBLAS threads."""
    here = os.path.dirname(os.path.abspath(__file__))
    blas = blas_threads or threads
    cmd = [sys.executable, os.path.join(here, "torch_gpt.py"), "--steps", str(steps),
           "--skip", str(skip), "--threads", str(threads), "--data", DATA]
    if dp > 1:
        cmd += ["--ddp", str(dp), "--port", "29611"]
    # Debian's torch does not pass set_num_threads on to OpenBLAS (BLAS_INFO=generic):
    # without this OpenBLAS would use every core under "1 thread".
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(blas), OMP_NUM_THREADS=str(threads))
    benchlib.log("+ OPENBLAS_NUM_THREADS=%d " % blas + " ".join(cmd))
    text = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True, env=env).stdout
    return float(re.search(r"tokens/s ([\d.]+)", text).group(1))


def main():
    quick = benchlib.quick()
    out = benchlib.out_path("bench/out/trainer.csv")
    rows = benchlib.Rows(out, "trainer")
    steps, skip = (10, 4) if quick else (40, 10)
    rounds = 1 if quick else 2  # best of `rounds`, Shardline and torch alternating
    cases = [("1 process 1 thread", 1, 1), ("1 process 2 threads", 2, 1),
             ("dp=2 (1 thread per rank)", 1, 2)]
    for name, threads, dp in cases:
        a, b, b1, failed = 0.0, 0.0, 0.0, ""
        for _ in range(rounds):
            a = max(a, ours(steps, skip, threads, dp))
            try:
                b = max(b, torch_peer(steps, skip, threads, dp))
                if threads > 1 and dp == 1:
                    # torch's OpenMP threads spin-wait; with as many threads as cores any
                    # other load stalls them. Give torch the better of its default and
                    # intra-op 1 with a 2-thread OpenBLAS.
                    b1 = max(b1, torch_peer(steps, skip, 1, dp, blas_threads=threads))
            except Exception as e:
                benchlib.log("torch peer failed: %s" % e)
                failed = "peer failed"
        note = failed
        if not failed and threads > 1 and dp == 1:
            note = "best of torch intra-op %d + BLAS %d (%.0f) and intra-op 1 + BLAS %d (%.0f)" % (
                threads, threads, b, threads, b1)
            b = max(b, b1)
        peer = "torch 1.13 DDP gloo" if dp > 1 else "torch 1.13"
        rows.add(name, "threads=%d" % (threads * dp), a, peer, None if failed else b,
                 "tokens/s", note=note)
    if shutil.which("nvidia-smi") and subprocess.run(["nvidia-smi", "-L"],
                                                      stdout=subprocess.DEVNULL,
                                                      stderr=subprocess.DEVNULL).returncode == 0:
        why = "the trainer computes on the CPU; it has no GPU path yet"
    else:
        why = "no GPU"
    rows.add("GPU model FLOPs utilisation", "gpus=0", None, "torch 1.13", None, "%", note=why)
    blas = os.environ.get("OPENBLAS_CORETYPE", "")
    benchlib.write_notes(out, """
Same model (834,304 parameters on both sides, as `shardctl plan` counts them), same work per step: forward, backward, global-norm clipping at 1.0 and AdamW,
batch 12 x 64 tokens (dp=2: 6 sequences per rank, the global batch stays 12). tokens/s =
global tokens / wall time over %d steps after %d warm-up steps, the best of %d runs (Shardline
and torch alternating, so both see the same background load). Shardline:
`shardline-train-local %s --blas-threads T [--dp 2]` (dp=2: micro_batch 6), its own forward/backward with matrix
products through OpenBLAS. torch: `bench/torch_gpt.py` (nn.Linear/LayerNorm/GELU, tied
head, `torch.set_num_threads(T)` and OPENBLAS_NUM_THREADS=T, since Debian's torch does
not hand its thread count to OpenBLAS, which would otherwise use every core); Debian's torch 1.13 is built with BLAS_INFO=generic and
calls the system libblas.so.3, which here is OpenBLAS 0.3.21 (pthread) too, so both sides
run the same GEMM kernels (OPENBLAS_CORETYPE=%s set for both: OpenBLAS 0.3.21 misdetects
this VM's CPU as Prescott). DDP: 2 processes, gloo all-reduce of gradients in buckets.
Model FLOPs utilisation on a GPU is not measured: the trainer has no GPU path yet, and
Debian's torch 1.13 is built without CUDA (USE_CUDA=OFF), so neither side could run there.
With 2 threads on this 2-core machine every thread needs a whole core: torch's OpenMP
threads spin-wait, so any other load on the machine stalls them; for "1 process 2 threads"
torch is therefore run twice, with its default (2 intra-op threads, 2 OpenBLAS threads) and
with 1 intra-op thread and 2 OpenBLAS threads, and the better figure is its value (both are
in the CSV's note).
""" % (steps - skip, skip, rounds, SPEC, blas or "unset"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
