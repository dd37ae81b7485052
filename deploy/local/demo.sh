#!/usr/bin/env bash
# Quick start, command 1: the main job on a local cluster.
#
# Today it installs what it needs, builds shardctl and the coordinator, plans
# the demo job (GPT on tiny-Shakespeare, 4 layers, width 128; pp=2 x dp=2,
# ZeRO-2, 1F1B over 4 micro-batches): ranks and groups, the pipeline
# timeline, ZeRO shards, the owner of a parameter, memory per rank; then
# starts a coordinator on SQLite state and creates the job there. Workers
# that train it (4 and a spare, one killed mid-run and the job resuming from
# its last checkpoint) arrive with the worker and deployment work.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${SHARDLINE_DEMO_OUT:-/tmp/shardline-demo}"
mkdir -p "$OUT"

bash deploy/install_deps.sh
CONFIG=(--config=ci)
[ -x /usr/local/cuda/bin/nvcc ] || CONFIG+=(--config=nocuda)
bazel --batch build "${CONFIG[@]}" //client:shardctl //server:shardline-coordinator \
  2>"$OUT/build.log" || { cat "$OUT/build.log" >&2; exit 1; }
SHARDCTL="$(pwd)/bazel-bin/client/shardctl"
COORDINATOR="$(pwd)/bazel-bin/server/shardline-coordinator"
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
echo

echo "== A coordinator on SQLite state, and the job created there"
rm -f "$OUT/state.db"*
"$COORDINATOR" --listen 127.0.0.1:0 --state "$OUT/state.db" >"$OUT/coordinator.out" 2>"$OUT/coordinator.log" &
COORDINATOR_PID=$!
trap 'kill "$COORDINATOR_PID" 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  grep -q "^listening on " "$OUT/coordinator.out" 2>/dev/null && break
  sleep 0.1
done
export SHARDLINE_COORDINATOR
SHARDLINE_COORDINATOR=$(sed -n 's/^listening on //p' "$OUT/coordinator.out")
[ -n "$SHARDLINE_COORDINATOR" ] || { cat "$OUT/coordinator.log" >&2; exit 1; }
echo "coordinator listening on $SHARDLINE_COORDINATOR"
"$SHARDCTL" job create deploy/jobs/shakespeare.yaml --id shakespeare
echo
"$SHARDCTL" job list
kill "$COORDINATOR_PID"
wait "$COORDINATOR_PID" 2>/dev/null || true
trap - EXIT
echo
echo "Workers that train this job (and survive losing one) arrive with the worker work."
