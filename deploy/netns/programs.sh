# shellcheck shell=bash
# Sourced by demo.sh and ha-demo.sh: the programs they run, and their
# clean-up.
#
#   REPO=... OUT=... COORDINATOR_BIN=... WORKER_BIN=... SHARDCTL_BIN=... DATA=...
#   . deploy/netns/programs.sh
#   resolve_programs demo.sh
#
# absolute PATH: PATH made absolute (its folder must exist).
# resolve_programs NAME: without COORDINATOR_BIN, builds shardctl, the
# coordinator and the worker with Bazel (from REPO, the log in OUT/build.log)
# and uses bazel-bin's; then makes COORDINATOR_BIN, WORKER_BIN, SHARDCTL_BIN
# and DATA absolute and exits 1 ("NAME: F not found") when one is missing.
# cleanup (the scripts' EXIT trap): SIGTERM to every pid in PIDS, SIGKILL
# to those still there 5 s later, then, unless KEEP is 1, "$HOSTS" down
# "$PREFIX" (the namespaces go).

absolute() { echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; }

resolve_programs() {
  local name=$1
  if [ -z "$COORDINATOR_BIN" ]; then
    cd "$REPO" || exit 1
    mkdir -p "$OUT"
    local config=(--config=ci)
    [ -x /usr/local/cuda/bin/nvcc ] || config+=(--config=nocuda)
    bazel --batch build "${config[@]}" //client/shardctl //server:shardline-coordinator \
      //worker:shardline-worker 2>"$OUT/build.log" || { cat "$OUT/build.log" >&2; exit 1; }
    COORDINATOR_BIN=bazel-bin/server/shardline-coordinator
    WORKER_BIN=bazel-bin/worker/shardline-worker
    SHARDCTL_BIN=bazel-bin/client/shardctl/shardctl
  fi
  COORDINATOR_BIN=$(absolute "$COORDINATOR_BIN")
  WORKER_BIN=$(absolute "$WORKER_BIN")
  SHARDCTL_BIN=$(absolute "$SHARDCTL_BIN")
  DATA=$(absolute "$DATA")
  local f
  for f in "$COORDINATOR_BIN" "$WORKER_BIN" "$SHARDCTL_BIN" "$DATA"; do
    [ -e "$f" ] || { echo "$name: $f not found" >&2; exit 1; }
  done
}

cleanup() {
  local pid alive
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for _ in $(seq 50); do
    alive=0
    for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ $alive -eq 0 ] && break
    sleep 0.1
  done
  for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ "$KEEP" -eq 0 ]; then "$HOSTS" down "$PREFIX" || true; fi
}
