#!/usr/bin/python3
"""Benchmark 7, trainer: tokens/s of shardline-train-local vs torch (Debian's 1.13 and
current torch from PyPI, bench/benchlib.py torch_peers) on the CPU
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


def realtime():
    """The command prefix that runs a measured process under SCHED_FIFO (chrt -f 10)
    when this user may, so that the builds and tests sharing this machine cannot take
    its cores mid-run (both sides get it); [] otherwise."""
    try:
        ok = subprocess.run(["chrt", "-f", "10", "true"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL).returncode == 0
    except OSError:
        ok = False
    return ["chrt", "-f", "10"] if ok else []


def ours(steps, skip, threads, dp):
    cmd = realtime() + [os.path.join(benchlib.bench_bin(), "worker/train/shardline-train-local"), spec_for(dp),
           "--data", DATA, "--steps", str(steps), "--log-interval", str(skip),
           "--threads", str(threads), "--dp", str(dp), "--eval-samples", "12"]
    benchlib.log("+ " + " ".join(cmd))
    text = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    rates = []
    for m in re.finditer(r"^step (\d+)/\d+ .*tokens/s (\d+)", text, re.M):
        if int(m.group(1)) > skip:  # windows of `skip` steps after the first
            rates.append(float(m.group(2)))
    return statistics.mean(rates)


def torch_peer(python, steps, skip, threads, dp, blas_threads=None):
    """torch's tokens/s under `python` with `threads` intra-op (OpenMP) threads and
    `blas_threads` (default: `threads`) OpenBLAS threads."""
    here = os.path.dirname(os.path.abspath(__file__))
    blas = blas_threads or threads
    cmd = realtime() + [python, os.path.join(here, "torch_gpt.py"), "--steps", str(steps),
           "--skip", str(skip), "--threads", str(threads), "--data", DATA]
    if dp > 1:
        cmd += ["--ddp", str(dp), "--port", "29611"]
    # Debian's torch does not pass set_num_threads on to OpenBLAS (BLAS_INFO=generic):
    # without this OpenBLAS would use every core under "1 thread".
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(blas), OMP_NUM_THREADS=str(threads))
    benchlib.log("+ OPENBLAS_NUM_THREADS=%d " % blas + " ".join(cmd))
    text = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True, env=env).stdout
    return float(re.search(r"tokens/s ([\d.]+)", text).group(1))


# FP32 (non-tensor-core) peak FLOP/s from NVIDIA's data sheets, by a piece of
# the name nvidia-smi prints; the first match wins. The trainer's products are
# fp32 cuBLAS SGEMMs, so this is the peak they can reach.
# Dense bf16 tensor-core peaks in FLOP/s (vendor data sheets, without
# sparsity): the yardstick of model FLOPs utilisation. H200 SXM: 989 TFLOP/s.
GPU_BF16_PEAK = [("H200", 989e12), ("H100 80GB HBM3", 989e12), ("H100 SXM", 989e12),
                 ("H100 NVL", 835e12), ("H100", 756e12), ("A100", 312e12), ("L40S", 362e12),
                 ("L4", 121e12), ("A10", 125e12)]

# A GPT-2-small-sized model for the GPU (deploy/jobs/gpt2-small.yaml: 12
# layers, width 768, context 1024; the CPU spec is too small to say anything
# about a GPU).
GPU_SPEC = """name: gpt2-small-gpu
model: {num_layers: 12, hidden_size: 768, num_heads: 12, vocab_size: 256, seq_length: 1024}
parallel: {tp: 1, pp: 1, zero_stage: 0}
training: {global_batch: 8, micro_batch: 8, train_steps: 1000, learning_rate: 3.0e-4,
           seed: 1, precision: %s}
data: {dataset_path: %s, validation_fraction: 0.1}
elastic: {min_workers: 1, max_workers: 1}
"""


def gpu_name():
    if not shutil.which("nvidia-smi"):
        return None
    r = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    names = r.stdout.strip().splitlines() if r.returncode == 0 else []
    return names[0].strip() if names else None


def gpu_mfu(rows, quick):
    """Model FLOPs utilisation of shardline-train-local --device cuda:0 on GPT-2 small:
    tokens/s x FLOPs per token / the GPU's dense bf16 peak, FLOPs per token = 6 N + 12 L h s
    (PaLM, Chowdhery et al. 2022, Appendix B, as nanoGPT's estimate_mfu; N = parameters
    without the position table, each counted once). Two runs: bf16 with the state on the
    GPU (the trainer's device-resident path), and fp32 with --host-optimizer (the
    host-staged ZeRO-Offload path) beside it."""
    name = gpu_name()
    if name is None:
        rows.add("GPU model FLOPs utilisation", "gpus=0", None, "bf16 dense peak", None, "%",
                 note="no GPU on this machine")
        return
    peak = next((p for key, p in GPU_BF16_PEAK if key in name), None)
    plugin = os.path.join(benchlib.bench_bin(), "worker/gpu/libshardline_gpu.so")
    steps, skip = (6, 2) if quick else (20, 5)
    layers, h, s, v = 12, 768, 1024, 256
    n = v * h + layers * (12 * h * h + 13 * h) + 2 * h
    flops_per_token = 6 * n + 12 * layers * h * s
    for precision, extra, label in (("bf16", [], "bf16, state on the GPU"),
                                    ("fp32", ["--host-optimizer"], "fp32, host-staged")):
        spec = os.path.join(benchlib.bench_tmp(), "gpt2-small-gpu-%s.yaml" % precision)
        with open(spec, "w") as f:
            f.write(GPU_SPEC % (precision, os.path.abspath(DATA)))
        cmd = [os.path.join(benchlib.bench_bin(), "worker/train/shardline-train-local"), spec,
               "--steps", str(steps), "--log-interval", "1", "--device", "cuda:0",
               "--gpu-plugin", plugin, "--threads", str(os.cpu_count() or 1),
               "--eval-samples", "16"] + extra
        benchlib.log("+ " + " ".join(cmd))
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        rates = [float(m.group(2)) for m in
                 re.finditer(r"^step (\d+)/\d+ .*tokens/s (\d+)", r.stdout, re.M)
                 if int(m.group(1)) > skip]
        case = "GPU model FLOPs utilisation (%s)" % label
        if r.returncode != 0 or not rates:
            rows.add(case, "gpus=1", None, "bf16 dense peak", None, "%",
                     note="%s: shardline-train-local --device cuda:0 failed: %s" % (
                         name, r.stdout.strip().splitlines()[-1][:200] if r.stdout.strip() else "?"))
            continue
        tokens = statistics.mean(rates)
        mfu = 100.0 * tokens * flops_per_token / peak if peak else None
        rows.add(case, "gpus=1", mfu, "bf16 dense peak", None, "%",
                 note="%s; %.0f tokens/s; %.3g FLOPs/token; peak %s" % (
                     name, tokens, flops_per_token,
                     "%.3g FLOP/s" % peak if peak else "unknown for this GPU"))
        rows.add("GPU tokens/s (%s)" % label, "gpus=1", tokens, "bf16 dense peak", None,
                 "tokens/s", note=name)


def main():
    quick = benchlib.quick()
    out = benchlib.out_path("bench/out/trainer.csv")
    rows = benchlib.Rows(out, "trainer")
    steps, skip = (10, 4) if quick else (40, 10)
    rounds = 1 if quick else 2  # best of `rounds`, Shardline and torch alternating
    cases = [("1 process 1 thread", 1, 1), ("1 process 2 threads", 2, 1),
             ("dp=2 (1 thread per rank)", 1, 2)]
    peers = benchlib.torch_peers()
    for name, threads, dp in cases:
        a = 0.0
        best = {label: [0.0, 0.0, ""] for label, _ in peers}  # default, intra-op 1, failure
        for _ in range(rounds):
            a = max(a, ours(steps, skip, threads, dp))
            for label, python in peers:
                b = best[label]
                try:
                    b[0] = max(b[0], torch_peer(python, steps, skip, threads, dp))
                    if threads > 1 and dp == 1:
                        # torch's OpenMP threads spin-wait; with as many threads as cores
                        # any other load stalls them. Give torch the better of its default
                        # and intra-op 1 with a 2-thread BLAS.
                        b[1] = max(b[1], torch_peer(python, steps, skip, 1, dp,
                                                    blas_threads=threads))
                except Exception as e:
                    benchlib.log("%s peer failed: %s" % (label, e))
                    b[2] = "peer failed"
        for label, _ in peers:
            value, value1, failed = best[label]
            note = failed
            if not failed and threads > 1 and dp == 1:
                note = ("best of torch intra-op %d + BLAS %d (%.0f) and intra-op 1 + BLAS %d "
                        "(%.0f)" % (threads, threads, value, threads, value1))
                value = max(value, value1)
            peer = label + (" DDP gloo" if dp > 1 else "")
            rows.add(name, "threads=%d" % (threads * dp), a, peer, None if failed else value,
                     "tokens/s", note=note)
        if not peers:
            rows.add(name, "threads=%d" % (threads * dp), a, "torch", None, "tokens/s",
                     note="no torch installed")
    gpu_mfu(rows, quick)
    blas = os.environ.get("OPENBLAS_CORETYPE", "")
    benchlib.write_notes(out, """
Same model (834,304 parameters on both sides, as `shardctl plan` counts them), same work per step: forward, backward, global-norm clipping at 1.0 and AdamW,
batch 12 x 64 tokens (dp=2: 6 sequences per rank, the global batch stays 12). tokens/s =
global tokens / wall time over %d steps after %d warm-up steps, the best of %d runs (Shardline
and torch alternating, so both see the same background load). Shardline:
`shardline-train-local %s --threads T [--dp 2]` (dp=2: micro_batch 6), its own forward/backward with matrix
products through OpenBLAS; with T threads each kernel splits its work over T OpenMP threads (products by
rows or columns of the output, OpenBLAS single-threaded in each part; bit-identical to 1 thread). torch: `bench/torch_gpt.py` (nn.Linear/LayerNorm/GELU, tied
head, `torch.set_num_threads(T)` and OPENBLAS_NUM_THREADS=T, since Debian's torch does
not hand its thread count to OpenBLAS, which would otherwise use every core); Debian's torch 1.13 is built with BLAS_INFO=generic and
calls the system libblas.so.3, which here is OpenBLAS 0.3.21 (pthread) too, so both sides
run the same GEMM kernels (%s). Current torch (%s: PyPI's wheel, in the virtualenv
`deploy/install_deps.sh --bench` makes) brings its own GEMM and OpenMP runtime. DDP: 2 processes, gloo all-reduce of gradients in buckets.
On a machine with an NVIDIA GPU the GPU rows measure `shardline-train-local --device cuda:0`
on a GPT-2-small-sized model (12 layers, width 768, context 1024, batch 8) and report model
FLOPs utilisation against the GPU's dense bf16 peak (6N + 12Lhs FLOPs per token, PaLM
Appendix B): in bf16 with the state on the GPU (device-resident: bf16 tensor-core products,
activations bf16 values stored as fp32), and in fp32 with `--host-optimizer` (the host-staged
ZeRO-Offload path) beside it. No torch peer there: Debian's torch 1.13 is built without CUDA
(USE_CUDA=OFF).
With 2 threads on this 2-core machine every thread needs a whole core: torch's OpenMP
threads spin-wait, so any other load on the machine stalls them; for "1 process 2 threads"
torch is therefore run twice, with its default (2 intra-op threads, 2 OpenBLAS threads) and
with 1 intra-op thread and 2 OpenBLAS threads, and the better figure is its value (both are
in the CSV's note). %s
""" % (steps - skip, skip, rounds, SPEC,
       ("OPENBLAS_CORETYPE=%s set for both: OpenBLAS 0.3.21 took this VM's CPU for a Prescott" % blas)
       if blas else "OpenBLAS's own choice of kernels for this CPU on both sides (bench/run.sh sets "
       "OPENBLAS_CORETYPE only where OpenBLAS reports a Prescott)",
       ", ".join(benchlib.torch_version(p) for label, p in peers
                 if not label.startswith("torch 1.")) or "not installed here",
       "Every measured process (both sides) ran under SCHED_FIFO (`chrt -f 10`), so the "
       "machine's other work could not preempt it." if realtime() else
       "The processes ran at normal priority (chrt -f was not permitted here): background "
       "load shows in both sides' figures."))
    return 0


if __name__ == "__main__":
    sys.exit(main())
