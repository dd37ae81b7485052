#!/usr/bin/env bash
# Quick start, command 1: the main job on a local cluster.
#
# Installs what it needs (Debian 12), builds shardctl, the coordinator and
# the worker, then
#   1. starts a coordinator on SQLite state (OUT/state.db),
#   2. creates the demo job (deploy/jobs/shakespeare-demo.yaml: a 4-layer,
#      width-128 byte-level GPT on tiny-Shakespeare; pp=2 x dp=2, ZeRO-2,
#      1F1B over 4 micro-batches; checkpoints under OUT/checkpoints),
#   3. starts 5 workers: world 4 plus a spare; shows live progress (step,
#      loss, tokens/s, generation, checkpoints),
#   4. mid-run kills (SIGKILL) a worker that holds a rank: the coordinator
#      notices, the survivors and the spare re-form at generation 2, restore
#      the last committed checkpoint and resume,
#   5. after the last step queries the job with shardctl (members, topology,
#      the owner of a parameter, checkpoints), prints a text sample from the
#      trained model, and a summary of the run and of the recovery.
# About 3-4 minutes on 2 idle cores after the build (about 230 ms a step);
# longer on a busy machine.
#
# Environment:
#   SHARDLINE_DEMO_OUT    output folder (default /tmp/shardline-demo); its
#                         logs, state and checkpoints are replaced each run
#   SHARDLINE_DEMO_STEPS  training steps (default 600; quick mode 40)
#   SHARDLINE_DEMO_QUICK=1  a short run for tests: 40 steps, a checkpoint
#                         every 10, the kill after step 15
#   SHARDLINE_DEMO_BIN    folder holding client/shardctl/shardctl,
#                         server/shardline-coordinator and
#                         worker/shardline-worker: skip install and build
#                         (tests/demo_test.sh uses its runfiles)
#   OPENBLAS_CORETYPE     see below
set -euo pipefail
SCRIPT_START=$(date +%s.%N)
cd "$(dirname "$0")/../.."
ROOT="$(pwd)"
OUT="${SHARDLINE_DEMO_OUT:-/tmp/shardline-demo}"
QUICK="${SHARDLINE_DEMO_QUICK:-0}"
JOB=shakespeare

die() { echo "demo: $*" >&2; exit 1; }

if [ "$QUICK" = 1 ]; then
  STEPS="${SHARDLINE_DEMO_STEPS:-40}"
  INTERVAL=10
  LOG_INTERVAL=5
  SAMPLE_LENGTH=120
else
  STEPS="${SHARDLINE_DEMO_STEPS:-600}"
  INTERVAL=50
  LOG_INTERVAL=10
  SAMPLE_LENGTH=400
fi
[[ "$STEPS" =~ ^[0-9]+$ ]] && [ "$STEPS" -ge 40 ] || die "SHARDLINE_DEMO_STEPS='$STEPS' must be a whole number >= 40"
# At least four checkpoints in a run, on steps rank 0 logs.
if [ "$INTERVAL" -gt $((STEPS / 4)) ]; then
  INTERVAL=$(( STEPS / 4 / LOG_INTERVAL * LOG_INTERVAL ))
  [ "$INTERVAL" -ge "$LOG_INTERVAL" ] || INTERVAL=$LOG_INTERVAL
fi
# The kill comes halfway between two checkpoints a little before mid-run,
# on a step rank 0 logs: the recovery has committed work to restore and
# some steps to redo.
KILL_AT=$(( (STEPS * 45 / 100) / INTERVAL * INTERVAL + INTERVAL / 2 ))
KILL_AT=$(( (KILL_AT + LOG_INTERVAL - 1) / LOG_INTERVAL * LOG_INTERVAL ))
[ "$KILL_AT" -gt "$INTERVAL" ] || KILL_AT=$(( INTERVAL + LOG_INTERVAL ))
[ "$KILL_AT" -lt "$STEPS" ] || die "no step to kill a worker at in $STEPS steps; give more"
WARMUP=$(( STEPS / 10 < 50 ? STEPS / 10 : 50 ))

mkdir -p "$OUT" || die "cannot create the output folder $OUT"
OUT="$(cd "$OUT" && pwd)"
# Nothing of an earlier run may leak in: its state, checkpoints and logs go.
rm -rf "$OUT/checkpoints" "$OUT"/state.db* "$OUT"/*.log "$OUT"/*.out "$OUT"/*.err "$OUT"/job.yaml \
  "$OUT"/job.json "$OUT"/plan.json "$OUT"/schedule.svg

# ---------------------------------------------------------------- build
if [ -n "${SHARDLINE_DEMO_BIN:-}" ]; then
  BIN="$SHARDLINE_DEMO_BIN"
else
  echo "== Installing dependencies and building (log: $OUT/build.log)"
  bash deploy/install_deps.sh
  CONFIG=(--config=ci)
  [ -x /usr/local/cuda/bin/nvcc ] || CONFIG+=(--config=nocuda)
  bazel --batch build "${CONFIG[@]}" //client/shardctl //server:shardline-coordinator \
    //worker:shardline-worker >"$OUT/build.log" 2>&1 ||
    { tail -40 "$OUT/build.log" >&2; die "the build failed (full log: $OUT/build.log)"; }
  # Copies: a later build in this workspace (another configuration, or
  # -c opt) may replace bazel-bin under a running demo.
  rm -rf "$OUT/bin"
  mkdir -p "$OUT/bin/client/shardctl" "$OUT/bin/server" "$OUT/bin/worker"
  cp -fL bazel-bin/client/shardctl/shardctl "$OUT/bin/client/shardctl/" &&
    cp -fL bazel-bin/server/shardline-coordinator "$OUT/bin/server/" &&
    cp -fL bazel-bin/worker/shardline-worker "$OUT/bin/worker/" ||
    die "cannot copy the built programs from bazel-bin"
  BIN="$OUT/bin"
fi
SHARDCTL="$BIN/client/shardctl/shardctl"
COORDINATOR="$BIN/server/shardline-coordinator"
WORKER="$BIN/worker/shardline-worker"
for b in "$SHARDCTL" "$COORDINATOR" "$WORKER"; do
  [ -x "$b" ] || die "missing program $b"
done
DATA="$ROOT/data/tinyshakespeare.txt"
[ -s "$DATA" ] || die "missing corpus $DATA"
SPEC_IN="$ROOT/deploy/jobs/shakespeare-demo.yaml"
[ -s "$SPEC_IN" ] || die "missing job spec $SPEC_IN"

# OpenBLAS 0.3.21 (Debian 12) detects some virtual CPUs as "Prescott" and
# then runs its SSE3 kernels, about 2x slower here; the rule that picks the
# right kernels (SkylakeX on AVX-512, Haswell on AVX2) is in
# deploy/local/openblas_coretype.sh. An explicit setting wins.
. "$ROOT/deploy/local/openblas_coretype.sh"
choose_openblas_coretype "$WORKER"
[ -n "$openblas_note" ] && echo "$openblas_note"

# The job's plan, offline: pipeline timeline and the full plan as JSON.
PLAN=(--layers 4 --hidden 128 --heads 4 --vocab 256 --seq 64
      --pp 2 --dp 2 --zero 2 --micro-batches 4 --micro-batch-size 3)
"$SHARDCTL" plan "${PLAN[@]}" --schedule-svg "$OUT/schedule.svg" >/dev/null &&
  "$SHARDCTL" plan "${PLAN[@]}" --json >"$OUT/plan.json" || die "shardctl plan failed"

# ---------------------------------------------------------------- cleanup
COORDINATOR_PID=""
WORKER_PIDS=()
WATCH_PID=""
cleanup() {
  local rc=$?
  set +e
  trap - EXIT INT TERM
  [ -n "$WATCH_PID" ] && kill -- -"$WATCH_PID" 2>/dev/null
  for pid in "${WORKER_PIDS[@]}" $COORDINATOR_PID; do
    kill "$pid" 2>/dev/null
  done
  for pid in "${WORKER_PIDS[@]}" $COORDINATOR_PID; do
    # A worker that ignores SIGTERM for 5 s is killed.
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  if [ "$rc" -ne 0 ]; then
    echo "demo: failed (exit $rc); logs are in $OUT" >&2
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Seconds since midnight UTC of an "HH:MM:SS.mmm" time.
secs() { awk -v t="$1" 'BEGIN{split(t,a,":"); printf "%.3f", a[1]*3600+a[2]*60+a[3]}'; }
now() { date -u +%H:%M:%S.%N | cut -c1-12; }
# Seconds from time $1 to time $2 (HH:MM:SS.mmm; across midnight too).
elapsed() {
  awk -v a="$(secs "$1")" -v b="$(secs "$2")" 'BEGIN{d=b-a; if (d < -43200) d += 86400; printf "%.2f", d}'
}

# ---------------------------------------------------------------- coordinator
echo "== A coordinator on SQLite state ($OUT/state.db)"
"$COORDINATOR" --listen 127.0.0.1:0 --state "$OUT/state.db" >"$OUT/coordinator.out" 2>"$OUT/coordinator.log" &
COORDINATOR_PID=$!
for _ in $(seq 200); do
  grep -a -q "^listening on " "$OUT/coordinator.out" 2>/dev/null && break
  kill -0 "$COORDINATOR_PID" 2>/dev/null || break
  sleep 0.05
done
export SHARDLINE_COORDINATOR
SHARDLINE_COORDINATOR=$(sed -n 's/^listening on //p' "$OUT/coordinator.out")
[ -n "$SHARDLINE_COORDINATOR" ] || { tail -20 "$OUT/coordinator.log" >&2; die "the coordinator did not start"; }
echo "coordinator listening on $SHARDLINE_COORDINATOR"
echo

# ---------------------------------------------------------------- job
# The spec with this run's paths and lengths.
sed -e "s|^\(  dataset_path:\).*|\1 $DATA|" \
    -e "s|^\(  directory:\).*|\1 $OUT/checkpoints|" \
    -e "s|^\(  train_steps:\).*|\1 $STEPS|" \
    -e "s|^\(  warmup_steps:\).*|\1 $WARMUP|" \
    -e "s|^\(  interval_steps:\).*|\1 $INTERVAL|" \
    "$SPEC_IN" >"$OUT/job.yaml"
echo "== The job: deploy/jobs/shakespeare-demo.yaml, $STEPS steps, a checkpoint every $INTERVAL (spec as sent: $OUT/job.yaml)"
"$SHARDCTL" job create "$OUT/job.yaml" --id "$JOB" >"$OUT/job-create.out" ||
  die "shardctl job create failed"
"$SHARDCTL" job get "$JOB" | sed 's/^/  /'
echo

# Waits until the job shows phase $1 (and generation $2, if given).
wait_job() {
  local tries="$3" failed=0
  for _ in $(seq "$tries"); do
    if ! "$SHARDCTL" job get "$JOB" --json >"$OUT/job.json" 2>"$OUT/job-get.err"; then
      failed=$((failed + 1))
      [ "$failed" -lt 50 ] || { cat "$OUT/job-get.err" >&2; echo "demo: shardctl job get keeps failing" >&2; break; }
    else
      failed=0
      if grep -a -q "\"phase\": \"JOB_PHASE_$1\"" "$OUT/job.json" &&
        { [ -z "$2" ] || grep -a -q "\"generation\": \"$2\"" "$OUT/job.json"; }; then
        return 0
      fi
      grep -a -qE '"phase": "JOB_PHASE_(FAILED|CANCELLED)"' "$OUT/job.json" && break
    fi
    sleep 0.2
  done
  echo "demo: the job did not reach $1${2:+ at generation $2}; now:" >&2
  grep -a -E '"(phase|phaseReason|phase_reason|generation)"' "$OUT/job.json" >&2 || true
  echo "--- coordinator log (tail)" >&2
  tail -20 "$OUT/coordinator.log" >&2
  for f in "$OUT"/worker*.log; do echo "--- $f (tail)" >&2; tail -8 "$f" >&2; done
  return 1
}

# ---------------------------------------------------------------- workers
echo "== 5 workers join: world 4 (pp 2 x dp 2) and a spare"
[ -n "${OPENBLAS_CORETYPE:-}" ] && echo "(OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE)"
START=$(now)
START_EPOCH=$(date +%s.%N)
for i in 0 1 2 3 4; do
  "$WORKER" --job "$JOB" --worker-id "node$i" --log-interval "$LOG_INTERVAL" \
    --sample-length "$SAMPLE_LENGTH" --connect-timeout 30s >"$OUT/worker$i.log" 2>&1 &
  WORKER_PIDS+=($!)
done

# Live progress: the workers' training, checkpoint, re-form and restore
# lines, each marked with its worker, as they come.
setsid bash -c '
  for i in 0 1 2 3 4; do
    tail -n +1 -F "$1/worker$i.log" 2>/dev/null |
      grep -a --line-buffered -E "step [0-9]+/|: spare|communicators ready|restored|recovery \(|is over|finished|LOST|error" |
      sed -u "s/^[0-9-]*T\([0-9:.]*\)Z shardline-worker[^:]*: /  \1 node$i | /" &
  done
  tail -n +1 -F "$1/coordinator.log" 2>/dev/null |
    grep -a --line-buffered -E "session broken|generation ended|checkpoint committed|checkpoint aborted" |
    sed -u "s/^[0-9-]*T\([0-9:.]*\)Z shardline-coordinator: /  \1 coordinator | /" &
  wait' _ "$OUT" &
WATCH_PID=$!

wait_job RUNNING 1 300 || die "generation 1 did not form"
echo "-- generation 1 formed"

# The kill: once rank 0 has logged step KILL_AT.
for _ in $(seq $((KILL_AT * 20 + 600))); do
  grep -a -qE "gen 1 step $KILL_AT/" "$OUT"/worker*.log && break
  for pid in "${WORKER_PIDS[@]}"; do kill -0 "$pid" 2>/dev/null || die "a worker exited early; see $OUT/worker*.log"; done
  sleep 0.1
done
grep -a -qE "gen 1 step $KILL_AT/" "$OUT"/worker*.log || die "training did not reach step $KILL_AT"
VICTIM=$(grep -a -l "generation 1 rank 1 world 4: communicators ready" "$OUT"/worker*.log | head -1 |
  sed 's/.*worker\([0-9]\)\.log/\1/')
[ -n "$VICTIM" ] || die "no worker logged rank 1 of generation 1"
KILLED_AT=$(now)
kill -9 "${WORKER_PIDS[$VICTIM]}"
wait "${WORKER_PIDS[$VICTIM]}" 2>/dev/null || true
echo "-- $KILLED_AT kill -9 node$VICTIM (rank 1 of generation 1) after step $KILL_AT"

wait_job RUNNING 2 300 || die "the job did not re-form at generation 2"
echo "-- generation 2 formed (world 4 again with the spare; ranks are assigned afresh)"

wait_job COMPLETED "" $((STEPS * 10 + 600)) || die "the job did not complete"
END_EPOCH=$(date +%s.%N)
# Rank 0 prints the sample after the last step; give it a moment.
for _ in $(seq 100); do
  grep -a -q "shardline-worker.*: sample:$" "$OUT"/worker*.log 2>/dev/null && break
  sleep 0.1
done
sleep 0.5
kill -- -"$WATCH_PID" 2>/dev/null || true
WATCH_PID=""
echo "-- the job is COMPLETED"
echo

# ---------------------------------------------------------------- shardctl
show() {
  echo "\$ shardctl $*"
  "$SHARDCTL" "$@" 2>&1 | sed 's/^/  /' || true
  echo
}
echo "== The job, seen with shardctl"
show job get "$JOB"
show members "$JOB"
show topology "$JOB"
show owner "$JOB" layers.2.mlp.fc1.weight --element 1000
show checkpoint list "$JOB"
show checkpoint show "$JOB"
echo "events (shardctl watch $JOB):"
timeout 3 "$SHARDCTL" watch "$JOB" --after 0 2>/dev/null |
  grep -a -E "lost|LOST|formed|phase|generation|checkpoint" | grep -a -v "heartbeat" | sed 's/^/  /' | head -40 || true
echo

# ---------------------------------------------------------------- sample
SAMPLE_LOG=$(grep -a -l "shardline-worker.*: sample:$" "$OUT"/worker*.log | head -1)
[ -n "$SAMPLE_LOG" ] || die "no worker printed a sample"
echo "== A sample from the trained model ($SAMPLE_LENGTH bytes after a newline, temperature 0.8)"
# The lines between "sample:" and the worker's next log line (its stamp
# 2026-12-02T14:35:38.793Z, or 14:35:38.793 from an older worker); control bytes
# the model may emit are dropped.
awk '/shardline-worker.*: sample:$/ {on = 1; next}
     on && /^([0-9-]+T)?[0-9][0-9]:[0-9][0-9]:[0-9][0-9]\.[0-9]+Z? shardline-worker[^:]*: / {exit}
     on {print "  | " $0}' "$SAMPLE_LOG" | LC_ALL=C tr -d '\000-\010\013-\037\177'
echo

# ---------------------------------------------------------------- summary
LAST=$(grep -a -h "step $STEPS/$STEPS loss" "$OUT"/worker*.log | tail -1)
[ -n "$LAST" ] || die "no worker logged the last step"
FINAL_LOSS=$(sed 's/.* loss \([0-9.]*\).*/\1/' <<<"$LAST")
FIRST_LOSS=$(grep -a -h "gen 1 step $LOG_INTERVAL/" "$OUT"/worker*.log | head -1 | sed 's/.* loss \([0-9.]*\).*/\1/')
WALL=$(awk -v a="$START_EPOCH" -v b="$END_EPOCH" 'BEGIN{printf "%.1f", b-a}')
TOKENS=$((STEPS * 24 * 64))
# Steady state: the mean of rank 0's tokens/s windows; effective: all the
# tokens of the job over the wall time, joins and recovery included.
STEADY=$(grep -a -h "step [0-9]*/$STEPS loss" "$OUT"/worker*.log |
  sed 's/.* tokens\/s \([0-9.]*\).*/\1/' | awk '{s+=$1; n++} END{if (n) printf "%.0f", s/n}')
EFFECTIVE=$(awk -v t="$TOKENS" -v w="$WALL" 'BEGIN{printf "%.0f", t/w}')

# Recovery times, from the kill: the coordinator's "generation ended" line
# (detection), its "generation 2 formed" (the new layout decided), the last
# worker's "generation 2 ... communicators ready", the last restore, and the
# last "recovery" line (written after the first resumed step).
iso_time() { sed -n "$1" "$OUT/coordinator.log" | head -1 | sed 's/^[0-9-]*T\([0-9:.]*\)Z.*/\1/'; }
DETECTED=$(iso_time '/generation ended job=shakespeare generation=1/p')
FORMED=$(iso_time '/generation 2 formed/p')
REFORMED=$(grep -a -h "generation 2 rank .* communicators ready" "$OUT"/worker*.log | cut -c12-23 | sort | tail -1)
RESTORED=$(grep -a -h "generation 2 rank .*: restored" "$OUT"/worker*.log | cut -c12-23 | sort | tail -1)
RESUMED=$(grep -a -h "recovery (" "$OUT"/worker*.log | cut -c12-23 | sort | tail -1)
# "restored <checkpoint> (step S) in T s": T is the read itself, not the time since the kill.
RESTORE_LINE=$(grep -a -h "generation 2 rank 0: restored" "$OUT"/worker*.log | head -1 |
  sed -e 's/.*: generation 2 rank 0: //' -e 's/ in \([0-9.]*\) s$/, read in \1 s/')
RESUMED_STEP=$(grep -a -h "recovery (" "$OUT"/worker*.log | head -1 | sed 's/.*first resumed step \([0-9]*\).*/\1/')
[ -n "$DETECTED" ] && [ -n "$FORMED" ] && [ -n "$REFORMED" ] && [ -n "$RESTORED" ] && [ -n "$RESUMED" ] ||
  die "the recovery did not leave all its log lines"

echo "== Summary"
echo "run:      $STEPS steps (global batch 24 x 64 tokens), loss $FIRST_LOSS at step $LOG_INTERVAL -> $FINAL_LOSS at step $STEPS"
echo "          wall time ${WALL} s from the workers' start to COMPLETED; tokens/s ${STEADY} while training, ${EFFECTIVE} overall"
echo "recovery: node$VICTIM (rank 1) killed after step $KILL_AT; $RESTORE_LINE"
echo "          kill -> coordinator noticed $(elapsed "$KILLED_AT" "$DETECTED") s -> generation 2 formed $(elapsed "$KILLED_AT" "$FORMED") s -> communicators ready $(elapsed "$KILLED_AT" "$REFORMED") s -> restored $(elapsed "$KILLED_AT" "$RESTORED") s -> first resumed step ($RESUMED_STEP) $(elapsed "$KILLED_AT" "$RESUMED") s"
echo "          per worker (from the moment each learned generation 1 was over):"
grep -a -h "recovery (" "$OUT"/worker*.log | sed 's/^[0-9TZ:.-]* shardline-worker[^:]*: /            /'
echo "demo:     $(awk -v a="$SCRIPT_START" -v b="$(date +%s.%N)" 'BEGIN{printf "%.0f", b-a}') s in all (build included); logs, state, checkpoints, plan.json and schedule.svg in $OUT"
