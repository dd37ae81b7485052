#!/usr/bin/env bash
# Shardline over several "hosts" made of network namespaces (hosts.sh), with
# a node lost to a network partition, not a kill:
#
#   h0  10.77.0.10  shardline-coordinator (SQLite state, metrics on :9464)
#   h1  10.77.0.11  workers h1-w0, h1-w1
#   h2  10.77.0.12  workers h2-w0, h2-w1
#   h3  10.77.0.13  worker h3-w0
#
# The job (deploy/netns/job.yaml: tiny GPT, pp=2, a checkpoint every 10;
# --steps training steps, default 1000) forms world 4 = pp 2 x dp 2 with one spare; each worker's Gloo
# binds its own host's address (--interface). Once step 12 is done, the
# switch port of the host holding two ranks (h2, or h1 if the spare is on h2)
# goes down. Its workers keep running but fall silent: the coordinator
# declares them LOST after heartbeat_timeout and re-forms the job at
# generation 2 with the survivors and the spare (world 2 = pp 2 x dp 1), from
# the last committed checkpoint. Then the link comes back: the cut-off
# workers' next calls carry generation 1 and are refused (fenced); they
# re-join as new members (spares) and the job trains to its last step.
# The job must outlast the cut-off workers' return: their connections come
# back on TCP's retransmission backoff (seconds after the heal), and two
# ranks on one host (shared memory) train this model at ~20 ms a step here,
# so 60 steps were over in a second; 1000 give ~20 s.
#
#   sudo deploy/netns/demo.sh [--out DIR] [--prefix NAME]
#       [--bin-dir DIR | --coordinator-bin F --worker-bin F --shardctl-bin F]
#       [--data FILE] [--cut-at-step N] [--steps N] [--keep]
#
# Without binaries given it installs what it needs and builds them with
# Bazel. Everything it writes goes to --out (default /tmp/shardline-netns):
# spec, state, checkpoints, one log per process, summary.txt. It checks what
# it shows and exits non-zero if the job did not re-form and complete.
# Needs root; every namespace and process it made is removed on exit (--keep
# leaves the namespaces for a look: deploy/netns/hosts.sh down PREFIX).
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"  # ip(8), also from a minimal PATH
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
HOSTS="$REPO/deploy/netns/hosts.sh"
OUT=/tmp/shardline-netns
PREFIX=shardline
COORDINATOR_BIN="" WORKER_BIN="" SHARDCTL_BIN="" DATA="$REPO/data/tinyshakespeare.txt"
CUT_AT_STEP=12
STEPS=1000
KEEP=0
usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in --keep) ;; --*) [ $# -ge 2 ] || usage ;; esac  # every other flag takes a value
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --prefix) PREFIX="$2"; shift 2 ;;
    --bin-dir)
      COORDINATOR_BIN="$2/shardline-coordinator" WORKER_BIN="$2/shardline-worker" SHARDCTL_BIN="$2/shardctl"
      shift 2 ;;
    --coordinator-bin) COORDINATOR_BIN="$2"; shift 2 ;;
    --worker-bin) WORKER_BIN="$2"; shift 2 ;;
    --shardctl-bin) SHARDCTL_BIN="$2"; shift 2 ;;
    --data) DATA="$2"; shift 2 ;;
    --cut-at-step) CUT_AT_STEP="$2"; shift 2 ;;
    --steps) STEPS="$2"; shift 2 ;;
    --keep) KEEP=1; shift ;;
    *) usage ;;
  esac
done
# At most 9 digits each: the arithmetic below cannot overflow.
if ! [[ "$STEPS" =~ ^[0-9]{1,9}$ ]] || ! [[ "$CUT_AT_STEP" =~ ^[0-9]{1,9}$ ]] ||
  [ "$CUT_AT_STEP" -lt 11 ] || [ "$STEPS" -lt $((10#$CUT_AT_STEP + 30)) ]; then
  echo "demo.sh: want --cut-at-step >= 11 (after the first checkpoint) and --steps >= cut + 30," \
    "whole numbers below 10^9 (got --cut-at-step '$CUT_AT_STEP' --steps '$STEPS')" >&2
  exit 2
fi
[ "$(id -u)" -eq 0 ] || { echo "demo.sh: needs root (network namespaces)" >&2; exit 1; }
# shellcheck source=deploy/netns/programs.sh
. "$REPO/deploy/netns/programs.sh"
if [ -z "$COORDINATOR_BIN" ]; then (cd "$REPO" && bash deploy/install_deps.sh) || exit 1; fi
resolve_programs demo.sh

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
rm -rf "$OUT/ckpt" "$OUT"/state.db* "$OUT"/*.log "$OUT/summary.txt"
SUMMARY="$OUT/summary.txt"
say() { echo "$*" | tee -a "$SUMMARY"; }
fail() {
  say "FAILED: $*"
  for f in "$OUT"/coordinator.log "$OUT"/h*-w*.log; do
    [ -e "$f" ] && { echo "--- $(basename "$f") (last 25 lines)"; tail -25 "$f"; }
  done >&2
  exit 1
}

# The job spec: absolute paths, --steps training steps.
sed -e "s|^\(  dataset_path:\).*|\1 $DATA|" -e "s|^\(  directory:\).*|\1 $OUT/ckpt|" \
  -e "s|^\(  train_steps:\).*|\1 $STEPS|" "$REPO/deploy/netns/job.yaml" >"$OUT/job.yaml"

PIDS=()
trap cleanup EXIT
trap 'fail "line $LINENO: a command failed"' ERR
"$HOSTS" down "$PREFIX" 2>/dev/null || true
"$HOSTS" up "$PREFIX" 4
COORD_IP=$("$HOSTS" addr "$PREFIX" h0)
export SHARDLINE_COORDINATOR="$COORD_IP:7070"
unset SHARDLINE_TOKEN SHARDLINE_ADMIN_TOKEN
say "== 4 hosts (namespaces $PREFIX-h0..h3 on switch $PREFIX-sw): coordinator on h0 ($SHARDLINE_COORDINATOR)"

"$HOSTS" exec "$PREFIX" h0 "$COORDINATOR_BIN" --listen "$SHARDLINE_COORDINATOR" \
  --state "$OUT/state.db" --metrics-port 9464 >"$OUT/coordinator.out" 2>"$OUT/coordinator.log" &
PIDS+=($!)
for _ in $(seq 200); do
  grep -q "^listening on " "$OUT/coordinator.out" 2>/dev/null && break
  sleep 0.05
done
grep -q "^listening on " "$OUT/coordinator.out" || fail "the coordinator did not start"

# shardctl, run on h0 (any host would do: it only needs to reach the coordinator).
sctl() { timeout 20 "$HOSTS" exec "$PREFIX" h0 "$SHARDCTL_BIN" "$@"; }
created=0
for _ in 1 2 3 4 5; do  # a loaded machine may be slow to accept the first connection
  if sctl job create "$OUT/job.yaml" --id netns >/dev/null 2>"$OUT/create.err"; then created=1; break; fi
  grep -q "already exists" "$OUT/create.err" && { created=1; break; }
  sleep 1
done
[ $created -eq 1 ] || fail "job create: $(cat "$OUT/create.err")"

# job_field NAME: a top-level field of `shardctl job get netns --json`.
job_field() {
  sctl job get netns --json 2>/dev/null |
    python3 -c 'import json, sys; print(json.load(sys.stdin).get(sys.argv[1], ""))' "$1" 2>/dev/null || true
}
# wait_job PHASE GENERATION SECONDS (GENERATION "" for any): both from one
# answer of the coordinator.
wait_job() {
  local deadline=$((SECONDS + $3)) now
  while [ $SECONDS -lt $deadline ]; do
    now=$(sctl job get netns --json 2>/dev/null |
      python3 -c 'import json, sys; j = json.load(sys.stdin); print(j.get("phase", ""), j.get("generation", ""))' 2>/dev/null || true)
    [ "${now% *}" = "$1" ] && { [ -z "$2" ] || [ "${now#* }" = "$2" ]; } && return 0
    sleep 0.2
  done
  return 1
}
# max_step: the highest training step any worker has logged (a worker's log
# may not exist yet: its shell has not run).
max_step() {
  local f
  for f in "$OUT"/h*-w*.log; do
    if [ -f "$f" ]; then sed -n 's/.* step \([0-9]*\)\/.*/\1/p' "$f"; fi
  done | sort -n | tail -1
}

WORKERS=(h1-w0 h1-w1 h2-w0 h2-w1 h3-w0)
declare -A WORKER_PID
for w in "${WORKERS[@]}"; do
  h=${w%%-*}
  "$HOSTS" exec "$PREFIX" "$h" "$WORKER_BIN" --job netns --worker-id "$w" --host "$h" \
    --interface "$("$HOSTS" addr "$PREFIX" "$h")" --log-interval 1 --connect-timeout 30s \
    >"$OUT/$w.log" 2>&1 &
  PIDS+=($!)
  WORKER_PID[$w]=$!
done
say "== 5 workers: h1-w0 h1-w1 on h1, h2-w0 h2-w1 on h2, h3-w0 on h3, each Gloo on its host's address"
# Training is quick (tens of ms a step): watch the logs, not the coordinator.
for _ in $(seq 1200); do
  s=$(max_step)
  [ -n "$s" ] && [ "$s" -ge "$CUT_AT_STEP" ] && break
  sleep 0.05
done
if [ -z "$s" ] || [ "$s" -lt "$CUT_AT_STEP" ]; then fail "training did not reach step $CUT_AT_STEP"; fi
# Cut the host holding two ranks.
spare=$(grep -l ": spare (world" "$OUT"/h*-w*.log | head -1 | xargs -r basename | sed 's/\.log$//' || true)
victim=h2
[ "${spare%%-*}" = h2 ] && victim=h1
[ "$s" -lt "$STEPS" ] || fail "training finished before the partition (step $s)"
CUT_AT=$(date +%s.%N)
"$HOSTS" cut "$PREFIX" "$victim"
say "== step $s: cut $victim's link (ip link set p${victim#h} down on the switch); spare is $spare"
[ "$(grep -l "generation 1 rank .* world 4: communicators ready" "$OUT"/h*-w*.log | wc -l)" -eq 4 ] ||
  fail "generation 1 is not world 4"
sctl members netns | tee -a "$SUMMARY" || true
wait_job JOB_PHASE_RUNNING 2 60 || fail "generation 2 did not form after the partition"
FORMED_AT=$(date +%s.%N)
DETECT=$(awk -v a="$CUT_AT" -v b="$FORMED_AT" 'BEGIN{printf "%.1f", b-a}')
for _ in $(seq 600); do
  [ "$(cat "$OUT"/h*-w*.log | grep -c 'generation 2 rank .* communicators ready')" -ge 2 ] && break
  sleep 0.1
done
say "re-formed at generation 2, world $(job_field world_size), ${DETECT} s after the cut (heartbeat_timeout 3s)"
grep -h "generation 2 rank .* communicators ready" "$OUT"/h*-w*.log | sed 's/^/  /' | tee -a "$SUMMARY" || true
sctl members netns | tee -a "$SUMMARY" || true

say "== healing $victim's link: its workers' generation-1 calls are refused (fenced), they re-join"
"$HOSTS" heal "$PREFIX" "$victim"
# A cut-off worker learns its generation is over from the first answer it
# gets ("generation 1 is over" while waiting, "generation 1 ended during
# training" mid-step), then joins again under the same slot name, as a spare
# of the current generation (or with a rank, once the job grows back).
# A worker that re-joins just before the job completes may be told to stop
# before it logs its assignment, so the coordinator's record of the join
# counts too. How soon a cut-off worker hears back depends on TCP: its
# connection retransmits with a backoff that grew during the cut (seconds).
REJOINED="generation [2-9]: spare|generation [2-9] rank [0-9]+ world"
rejoined() {  # rejoined WORKER: the worker or the coordinator logged its join
  grep -Eq "$REJOINED" "$OUT/$1.log" ||
    grep -Eq "worker joined job=netns worker=$1 .*generation=[2-9]" "$OUT/coordinator.log"
}
for w in "$victim-w0" "$victim-w1"; do
  for _ in $(seq 300); do
    rejoined "$w" && break
    sleep 0.1
  done
  grep -Eq "generation 1 (is over|ended)" "$OUT/$w.log" || fail "$w was not fenced after the link came back"
  rejoined "$w" || fail "$w did not re-join"
  grep -Eh "generation 1 (is over|ended)|$REJOINED" "$OUT/$w.log" |
    head -2 | sed "s/^/  /" | tee -a "$SUMMARY"
  grep -Eh "worker joined job=netns worker=$w .*generation=[2-9]" "$OUT/coordinator.log" |
    head -1 | sed "s/^/  coordinator: /" | tee -a "$SUMMARY"
done

wait_job JOB_PHASE_COMPLETED "" 180 || fail "the job did not complete (phase $(job_field phase))"
say "== job COMPLETED at generation $(job_field generation), world $(job_field world_size)"
grep -h " step $STEPS/$STEPS " "$OUT"/h*-w*.log | head -1 | sed 's/^/  /' | tee -a "$SUMMARY" || true
grep -h "restored ckpt-step" "$OUT"/h*-w*.log | head -2 | sed 's/^/  /' | tee -a "$SUMMARY" || true
sctl members netns | tee -a "$SUMMARY" || true
sctl checkpoints netns | tee -a "$SUMMARY" || true
say "events:"
timeout 20 "$HOSTS" exec "$PREFIX" h0 "$SHARDCTL_BIN" watch netns --after 0 2>"$OUT/watch.err" |
  grep -E "lost|formed|phase|fenc|grow|ended" | sed 's/^/  /' | tee -a "$SUMMARY" || true

# Workers leave after the job completes.
for w in "${WORKERS[@]}"; do
  for _ in $(seq 100); do kill -0 "${WORKER_PID[$w]}" 2>/dev/null || break; sleep 0.1; done
done
say "OK: partitioned $victim detected in ${DETECT} s, re-formed, fenced on return, completed"
