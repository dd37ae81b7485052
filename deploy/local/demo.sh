#!/usr/bin/env bash
# Quick start, command 1: the main job on a local cluster.
#
# Today it installs what it needs, builds shardctl and plans the demo job
# (GPT on tiny-Shakespeare, 4 layers, width 128; pp=2 x dp=2, ZeRO-2, 1F1B
# over 4 micro-batches): ranks and groups, the pipeline timeline, ZeRO
# shards, the owner of a parameter, memory per rank. Training that job on a
# local coordinator with 4 workers and a spare, killing one mid-run and
# resuming from the last checkpoint, arrives with the deployment work.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${SHARDLINE_DEMO_OUT:-/tmp/shardline-demo}"
mkdir -p "$OUT"

bash deploy/install_deps.sh
CONFIG=(--config=ci)
[ -x /usr/local/cuda/bin/nvcc ] || CONFIG+=(--config=nocuda)
bazel --batch build "${CONFIG[@]}" //client:shardctl 2>"$OUT/build.log" || {
  cat "$OUT/build.log" >&2; exit 1; }
SHARDCTL="$(pwd)/bazel-bin/client/shardctl"
MODEL=(--layers 4 --hidden 128 --heads 4 --vocab 256 --seq 64)
LAYOUT=(--pp 2 --dp 2 --zero 2 --micro-batches 4 --micro-batch-size 3)

echo "== The demo job's plan"
"$SHARDCTL" plan "${MODEL[@]}" "${LAYOUT[@]}" --schedule-svg "$OUT/schedule.svg"
"$SHARDCTL" plan "${MODEL[@]}" "${LAYOUT[@]}" --json >"$OUT/plan.json"
echo
echo "== Who holds element 1000 of layers.2.mlp.fc1.weight"
"$SHARDCTL" plan owner layers.2.mlp.fc1.weight --element 1000 "${MODEL[@]}" "${LAYOUT[@]}"
echo
echo "== Written: $OUT/schedule.svg (pipeline timeline), $OUT/plan.json (full plan)"
echo "Training this job on a local cluster arrives with the deployment work."
