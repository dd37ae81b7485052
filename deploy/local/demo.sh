#!/usr/bin/env bash
# Quick start, command 1: the main job on a local cluster.
#
# Today it installs what it needs, builds shardctl, the coordinator and the
# worker, plans the demo job (GPT on tiny-Shakespeare, 4 layers, width 128;
# pp=2 x dp=2, ZeRO-2, 1F1B over 4 micro-batches): ranks and groups, the
# pipeline timeline, ZeRO shards, the owner of a parameter, memory per rank;
# then starts a coordinator on SQLite state, creates the job, and starts 5
# workers: world 4 plus a spare form generation 1 and build their Gloo
# communicators through the coordinator; one worker is killed (SIGKILL), the
# coordinator notices at once, and the survivors with the spare re-form at
# generation 2 and rebuild their communicators. Training on top of this
# arrives with the trainer work.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${SHARDLINE_DEMO_OUT:-/tmp/shardline-demo}"
mkdir -p "$OUT"

bash deploy/install_deps.sh
CONFIG=(--config=ci)
[ -x /usr/local/cuda/bin/nvcc ] || CONFIG+=(--config=nocuda)
bazel --batch build "${CONFIG[@]}" //client:shardctl //server:shardline-coordinator \
  //worker:shardline-worker 2>"$OUT/build.log" || { cat "$OUT/build.log" >&2; exit 1; }
WORKER="$(pwd)/bazel-bin/worker/shardline-worker"
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

# Waits until `shardctl job get` shows phase RUNNING at generation $1.
wait_generation() {
  for _ in $(seq 300); do
    "$SHARDCTL" job get shakespeare --json >"$OUT/job.json" 2>/dev/null &&
      grep -q '"phase": "JOB_PHASE_RUNNING"' "$OUT/job.json" &&
      grep -q "\"generation\": \"$1\"" "$OUT/job.json" && return 0
    sleep 0.1
  done
  echo "generation $1 did not form; coordinator log:" >&2
  tail -20 "$OUT/coordinator.log" >&2
  return 1
}

echo "== 5 workers join: world 4 (pp 2 x dp 2) and a spare"
WORKER_PIDS=()
for i in 0 1 2 3 4; do
  "$WORKER" --job shakespeare --worker-id "demo-node$i:cpu" >"$OUT/worker$i.log" 2>&1 &
  WORKER_PIDS+=($!)
done
trap 'kill "${WORKER_PIDS[@]}" "$COORDINATOR_PID" 2>/dev/null || true' EXIT
wait_generation 1
for _ in $(seq 300); do
  [ "$(cat "$OUT"/worker*.log | grep -c 'communicators ready')" -ge 4 ] && break
  sleep 0.1
done
grep -h "communicators ready" "$OUT"/worker*.log | sed 's/^/  /'
"$SHARDCTL" members shakespeare
echo

VICTIM=$(grep -l "rank 1 world 4: communicators ready" "$OUT"/worker*.log | head -1 | sed 's/.*worker\([0-9]\)\.log/\1/')
echo "== kill -9 the worker holding rank 1 (demo-node$VICTIM)"
LOST_AT=$(date +%s.%N)
{ kill -9 "${WORKER_PIDS[$VICTIM]}"; wait "${WORKER_PIDS[$VICTIM]}"; } 2>/dev/null || true
wait_generation 2
REFORMED_AT=$(date +%s.%N)
for _ in $(seq 300); do
  [ "$(cat "$OUT"/worker*.log | grep -c 'generation 2 rank .* communicators ready')" -ge 4 ] && break
  sleep 0.1
done
grep -h "generation 2 rank .* communicators ready" "$OUT"/worker*.log | sed 's/^/  /'
"$SHARDCTL" members shakespeare
echo "re-formed at generation 2 $(awk -v a="$LOST_AT" -v b="$REFORMED_AT" 'BEGIN{printf "%.2f", b-a}') s after the kill"
echo
echo "events:"
timeout 2 "$SHARDCTL" watch shakespeare --after 0 2>/dev/null | grep -E "lost|formed|phase" | sed 's/^/  /' || true
echo

echo "== cancel the job: workers stop"
"$SHARDCTL" job cancel shakespeare --reason "demo over" >/dev/null
for pid in "${WORKER_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
kill "$COORDINATOR_PID"
wait "$COORDINATOR_PID" 2>/dev/null || true
trap - EXIT
echo "Training on top of this (loss, checkpoints, resume) arrives with the trainer work."
