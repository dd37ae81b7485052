#!/usr/bin/env bash
# GPU checks for the GPU plugin and the NCCL backend: runs gpu_plugin_cuda_test,
# train_kernels_test (every training kernel on the GPU against its CPU twin),
# gpu_trainer_test (the trainer on the GPU against the trainer on the CPU)
# and nccl_backend_test (GPU tests run, nothing skipped for "no GPU"; NCCL at
# world 1 on one GPU), the NCCL benchmark for a few sizes, and a training
# benchmark (train_bench below: tokens/s and MFU of a GPT-2-small-sized model
# on GPU 0), printing the results. Under 8 minutes with the build.
#
#   worker/gpu/gpu_check.sh          # a GPU machine with Bazel and the project's
#                                    # build deps (docs/BUILDING.md): build + run
#   worker/gpu/gpu_check.sh pack     # here, no GPU needed: build with --config=ci
#                                    # and bundle the binaries and the non-system
#                                    # libraries they need into bazel-gpu-check/
#                                    # (git-ignored by /bazel-*; about 53 MiB)
#   worker/gpu/gpu_check.sh run      # on a bare GPU machine with the CUDA 13
#                                    # driver and an NCCL 2.x (no Bazel): runs the
#                                    # bundle, e.g. through the device tool:
#                                    #   run(command="worker/gpu/gpu_check.sh run",
#                                    #       carry=["bazel-gpu-check"], timeout_s=400)
#
# libnccl.so.2 (218 MB) and libcublas.so.13 + libcublasLt.so.13 (600 MB) are
# not bundled: `run` uses /usr/local/cuda/lib64's, or those of the
# nvidia-nccl-cu13 / nvidia-cublas Python packages. If that NCCL is not the 2.28 this was
# built with, gpu_plugin_cuda_test's version check says so (expected there).
#
# Exit status: 0 when every test passed and the benchmark found no wrong element.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
mode="${1:-bazel}"
BUNDLE=bazel-gpu-check
TARGETS=(//worker/gpu:gpu_plugin_cuda_test //worker/gpu:train_kernels_test
         //worker/gpu:gpu_trainer_test
         //worker/gpu:libshardline_gpu.so
         //worker/gpu:libshardline_gpu_fake.so
         //worker/comm:nccl_backend_test //worker/comm:shardline-bench-collectives
         //worker/train:shardline-train-local)
BENCH_ARGS=(--backend nccl --op all --min-bytes 1024 --max-bytes 67108864 --factor 64
            --iters 20 --warmup 5 --check)
fails=0

gpus() {
  if command -v nvidia-smi >/dev/null; then nvidia-smi -L | wc -l; else echo 1; fi
}

bench() {  # bench BENCH_BINARY [extra args...]
  local bin="$1"; shift
  local n; n=$(gpus); [ "$n" -gt 8 ] && n=8
  for dtype in fp32 bf16; do
    echo "=== benchmark: --ranks $n --dtype $dtype"
    timeout 120 "$bin" "${BENCH_ARGS[@]}" --ranks "$n" --dtype "$dtype" "$@" || fails=$((fails + 1))
  done
}

# Training throughput on GPU 0: a few steps of the GPT-2-small-sized model
# (deploy/jobs/gpt2-small.yaml) through shardline-train-local --device
# cuda:0, twice: the state on the GPU (world 1: parameters, gradients, AdamW
# on the device; worker/train/trainer.h "Where the state lives") and
# --host-optimizer (the host-staged ZeRO-Offload path: master weights, AdamW
# and gradients on the host, every unit up and every gradient down per
# step), fp32 layers both; and the state on the GPU at precision bf16 (bf16
# tensor-core products, bf16-rounded activations stored as fp32). Each
# prints tokens/s (median of the steps
# after the first two) and model FLOPs utilisation: tokens/s x FLOPs per
# token / the device's dense peak, FLOPs per token = 6 N + 12 L h s (N
# parameters, L layers, width h, context s: PaLM, Chowdhery et al. 2022,
# appendix B; no recomputation counted; 0.629 GFLOP here, within 1% of
# `shardctl plan`'s flops_per_iteration / tokens, Narayanan et al.'s Eq. 3
# without recomputation), against the bf16 tensor-core peak
# (the issue's yardstick) and the fp32 (no TF32) peak this path can reach.
train_bench() {  # train_bench BINARY SPEC [extra args...]
  local bin="$1" spec="$2"; shift 2
  # The same spec at precision bf16 (the issue's yardstick).
  sed 's/^  precision: fp32$/  precision: bf16/' "$spec" >/tmp/gpu_check_bf16.yaml
  train_bench_one "state on the GPU" bf16 "$bin" /tmp/gpu_check_bf16.yaml "$@"
  train_bench_one "state on the GPU" fp32 "$bin" "$spec" "$@"
  train_bench_one "host-staged" fp32 "$bin" "$spec" "$@" --host-optimizer
}
train_bench_one() {  # train_bench_one LABEL PRECISION BINARY SPEC [extra args...]
  local label="$1" precision="$2" bin="$3" spec="$4"; shift 4
  echo "=== benchmark: shardline-train-local $(basename "$spec") --device cuda:0 $* ($precision, $label)"
  timeout 300 "$bin" "$spec" --device cuda:0 --steps 12 --log-interval 1 --eval-samples 8 "$@" \
    2>&1 | tee /tmp/gpu_check_train.log
  [ "${PIPESTATUS[0]}" -eq 0 ] || { fails=$((fails + 1)); return; }
  local name
  name=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 2>/dev/null || echo unknown)
  python3 - "$name" /tmp/gpu_check_train.log "$precision" "$label" <<'PY' || fails=$((fails + 1))
import re, statistics, sys
name, log, precision, label = sys.argv[1], open(sys.argv[2]).read(), sys.argv[3], sys.argv[4]
steps = [(int(m.group(1)), float(m.group(2)))
         for m in re.finditer(r"^step (\d+)/\d+ .*?tokens/s (\d+)", log, re.M)]
tps = [t for s, t in steps if s > 2]
if not tps:
    sys.exit("no step lines after step 2 in the log")
L, h, s, V = 12, 768, 1024, 256  # deploy/jobs/gpt2-small.yaml
N = L * (12 * h * h + 13 * h) + V * h + s * h + 2 * h  # plan::GptParameters' count
flops_per_token = 6 * N + 12 * L * h * s
# Dense peaks in FLOP/s (vendor data sheets, without sparsity): bf16 tensor
# core, fp32 without tensor cores.
peaks = [("H200", 989e12, 67e12), ("H100 SXM", 989e12, 67e12), ("H100 80GB HBM3", 989e12, 67e12),
         ("H100 NVL", 835e12, 60e12), ("H100 PCIe", 756e12, 51e12), ("A100", 312e12, 19.5e12)]
match = next((p for p in peaks if p[0].lower() in name.lower()), None)
rate = statistics.median(tps)
print(f"train_bench ({label}): device {name!r}, {precision}, N = {N / 1e6:.1f}M parameters, "
      f"{flops_per_token / 1e9:.3f} GFLOP/token")
print(f"train_bench ({label}): {rate:.0f} tokens/s (median of {len(tps)} steps), "
      f"{rate * flops_per_token / 1e12:.2f} TFLOP/s")
if match:
    print(f"train_bench ({label}): MFU {100 * rate * flops_per_token / match[1]:.2f}% of the bf16 dense peak "
          f"({match[1] / 1e12:.0f} TFLOP/s), {100 * rate * flops_per_token / match[2]:.2f}% of the "
          f"fp32 peak ({match[2] / 1e12:.1f} TFLOP/s)")
else:
    print(f"train_bench: no peak known for {name!r}; add it to gpu_check.sh's table")
PY
}

case "$mode" in
  bazel)
    command -v nvidia-smi >/dev/null && nvidia-smi -L
    bazel build --config=ci "${TARGETS[@]}" || exit 1
    # Never a cached result: a pass cached on a machine without a GPU (every
    # GPU test skipped) must not stand in for this run.
    bazel test --config=ci --test_output=all --nocache_test_results \
      //worker/gpu:gpu_plugin_cuda_test //worker/gpu:train_kernels_test \
      //worker/gpu:gpu_trainer_test //worker/comm:nccl_backend_test 2>&1 |
      tee /tmp/gpu_check_bazel.log
    [ "${PIPESTATUS[0]}" -eq 0 ] || fails=$((fails + 1))
    if command -v nvidia-smi >/dev/null && grep -q "no GPU:\|no usable CUDA device" \
        /tmp/gpu_check_bazel.log; then
      echo "[FAILED] GPU tests skipped on a machine with a GPU"; fails=$((fails + 1))
    fi
    bench bazel-bin/worker/comm/shardline-bench-collectives
    train_bench bazel-bin/worker/train/shardline-train-local deploy/jobs/gpt2-small.yaml \
      --data data/tinyshakespeare.txt
    ;;

  pack)
    bazel build --config=ci "${TARGETS[@]}" || exit 1
    rm -rf "$BUNDLE"
    mkdir -p "$BUNDLE/bin" "$BUNDLE/lib" "$BUNDLE/worker/gpu" "$BUNDLE/data"
    # gpu_trainer_test reads the corpus relative to its working directory.
    cp data/tinyshakespeare.txt deploy/jobs/gpt2-small.yaml "$BUNDLE/data/"
    for t in worker/gpu/gpu_plugin_cuda_test worker/gpu/train_kernels_test \
             worker/gpu/gpu_trainer_test worker/comm/nccl_backend_test worker/comm/shardline-bench-collectives \
             worker/train/shardline-train-local; do
      cp -L "bazel-bin/$t" "$BUNDLE/bin/"
    done
    cp -L bazel-bin/worker/gpu/libshardline_gpu.so bazel-bin/worker/gpu/libshardline_gpu_fake.so \
      "$BUNDLE/worker/gpu/"
    # Every shared library they load except glibc/libstdc++ (the target has
    # newer ones), the CUDA driver, NCCL and cuBLAS (found there).
    # ldd the originals: their RUNPATH ($ORIGIN/../../_solib_k8) finds Bazel's
    # own shared libraries there.
    for f in worker/gpu/gpu_plugin_cuda_test worker/gpu/train_kernels_test \
             worker/gpu/gpu_trainer_test worker/comm/nccl_backend_test \
             worker/comm/shardline-bench-collectives worker/gpu/libshardline_gpu.so \
             worker/train/shardline-train-local; do
      ldd "bazel-bin/$f" | awk '$3 ~ /^\// {print $3}'
    done | sort -u | while read -r lib; do
      case "$(basename "$lib")" in
        libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|libstdc++.so*|libgcc_s.so*| \
        libcuda.so*|libnccl.so*|libcublas.so*|libcublasLt.so*) ;;
        *) cp -L "$lib" "$BUNDLE/lib/" ;;
      esac
    done
    # train_kernels_test's libopenblas (37 MB, for the CPU reference) goes
    # gzip'ed so the bundle stays well inside the device tool's 64 MiB; `run`
    # unpacks it.
    for f in "$BUNDLE"/lib/*; do
      [ "$(stat -c %s "$f")" -gt 16000000 ] && gzip -9 "$f"
    done
    du -sh "$BUNDLE"
    echo "packed; on the GPU machine: worker/gpu/gpu_check.sh run (carry $BUNDLE)"
    exit 0
    ;;

  run)
    [ -d "$BUNDLE" ] || { echo "no $BUNDLE/: run 'worker/gpu/gpu_check.sh pack' first"; exit 1; }
    command -v nvidia-smi >/dev/null && nvidia-smi -L
    # Unpack the gzip'ed libraries outside the bundle, which stays carryable.
    unpacked=$(mktemp -d)
    for f in "$BUNDLE"/lib/*.gz; do
      [ -e "$f" ] && gunzip -c "$f" > "$unpacked/$(basename "${f%.gz}")"
    done
    nccl_dir=""
    if [ -e /usr/local/cuda/lib64/libnccl.so.2 ]; then
      nccl_dir=/usr/local/cuda/lib64
    else
      nccl_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
    fi
    echo "NCCL from: ${nccl_dir:-not found}"
    cublas_dir=""
    if [ -e /usr/local/cuda/lib64/libcublas.so.13 ]; then
      cublas_dir=/usr/local/cuda/lib64
    else
      cublas_dir=$(python3 -c 'import glob, os, nvidia
hits = [h for p in nvidia.__path__ for h in glob.glob(os.path.join(p, "**", "libcublas.so.13"), recursive=True)]
print(os.path.dirname(hits[0]) if hits else "")' 2>/dev/null)
    fi
    echo "cuBLAS from: ${cublas_dir:-not found}"
    export LD_LIBRARY_PATH="$PWD/$BUNDLE/lib:$unpacked:${nccl_dir}:${cublas_dir}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
    # The tests open worker/gpu/libshardline_gpu.so relative to the working
    # directory (their Bazel runfiles layout), so run them inside the bundle.
    for t in gpu_plugin_cuda_test train_kernels_test gpu_trainer_test nccl_backend_test; do
      echo "=== $t"
      (cd "$BUNDLE" && timeout 240 "bin/$t" 2>&1) | tee "/tmp/gpu_check_$t.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || fails=$((fails + 1))
      # On a GPU machine, "skipped: no GPU" means the plugin could not use it.
      if command -v nvidia-smi >/dev/null && grep -q "no GPU:\|no usable CUDA device" \
          "/tmp/gpu_check_$t.log"; then
        echo "[FAILED] $t skipped GPU tests on a machine with a GPU"; fails=$((fails + 1))
      fi
      grep -E "^\[  (PASSED|SKIPPED|FAILED) +\] [0-9]" "/tmp/gpu_check_$t.log" | head -20
    done
    bench "$BUNDLE/bin/shardline-bench-collectives" \
      --gpu-plugin "$PWD/$BUNDLE/worker/gpu/libshardline_gpu.so"
    train_bench "$BUNDLE/bin/shardline-train-local" "$BUNDLE/data/gpt2-small.yaml" \
      --data "$BUNDLE/data/tinyshakespeare.txt" \
      --gpu-plugin "$PWD/$BUNDLE/worker/gpu/libshardline_gpu.so"
    ;;

  *)
    echo "usage: $0 [bazel|pack|run]"; exit 2 ;;
esac

echo "=== gpu_check: $fails failure(s)"
[ "$fails" -eq 0 ]
