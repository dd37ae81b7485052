#!/usr/bin/env bash
# End-to-end: shardctl against the real shardline-coordinator binary, as an
# operator runs them. Starts one coordinator without auth (the job lifecycle
# and error paths) and one with an admin token (bearer metadata, worker
# tokens), each on --listen 127.0.0.1:0 --state memory, reading the port from
# its "listening on HOST:PORT" line. Checks exit codes, that results go to
# stdout and errors to stderr, and real values in the output.
#
#   shardctl_coordinator_test.sh SHARDCTL COORDINATOR SPEC_YAML EXTERNAL_SPEC_YAML
set -uo pipefail
SHARDCTL="$1"
COORDINATOR="$2"
SPEC="$3"
EXTERNAL_SPEC="$4"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
}
trap cleanup EXIT
unset SHARDLINE_COORDINATOR SHARDLINE_TOKEN SHARDLINE_ADMIN_TOKEN

# start_coordinator NAME [FLAGS...]: sets ADDRESS, or fails the test.
start_coordinator() {
  local name="$1"; shift
  "$COORDINATOR" --listen 127.0.0.1:0 --state memory "$@" >"$TMP/$name.out" 2>"$TMP/$name.err" &
  PIDS+=($!)
  for _ in $(seq 1 200); do
    ADDRESS=$(sed -n 's/^listening on //p' "$TMP/$name.out")
    [ -n "$ADDRESS" ] && return 0
    kill -0 "${PIDS[-1]}" 2>/dev/null || break
    sleep 0.05
  done
  echo "[FAILED] $name coordinator did not print 'listening on HOST:PORT' within 10 s"
  cat "$TMP/$name.out" "$TMP/$name.err"
  exit 1
}

CLI="$SHARDCTL"
CLI_ONE_LINE_ERRORS=1
# check NAME RC OUT ERR -- ARGS (tests/cli_check.sh)
source "${TEST_SRCDIR:?run with bazel test}/${TEST_WORKSPACE:?}/tests/cli_check.sh"

# A port nothing listens on.
CLOSED=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')

# ---- without auth -----------------------------------------------------------
start_coordinator plain
export SHARDLINE_COORDINATOR="$ADDRESS"

check "create from the example spec" 0 "Job:              shakespeare" "" -- job create "$SPEC" --id shakespeare
grep -qF "Worker token: none (the coordinator runs without authentication)" "$TMP/out" \
  && echo "[  OK  ] no auth: no worker token" || { echo "[FAILED] no auth: no worker token"; fails=$((fails + 1)); }
check "create again with the same spec is idempotent and says so" 0 "Job shakespeare already existed with this spec; nothing was created (job create is idempotent)" "" -- job create "$SPEC" --id shakespeare
check "get" 0 "Elastic:          4..5 workers, heartbeat 1s, timeout 10s" "" -- job get shakespeare
check "get says who it waits for" 0 "World:            not formed yet; waiting for workers: 0 joined, needs at least 4 (min_workers)" "" -- job get shakespeare
check "get --json" 0 '"job_id": "shakespeare"' "" -- job get shakespeare --json
check "get --json prints zero fields" 0 '"world_size": 0' "" -- job get shakespeare --json
check "list" 0 "shakespeare  shakespeare  PENDING    1      -  0/2000" "" -- job list
check "list --phase filters" 0 "no jobs" "" -- job list --phase running,recovering
SHARDLINE_COORDINATOR="127.0.0.1:$CLOSED" check "connection flags before the command" 0 "shakespeare  shakespeare  PENDING" "" -- --coordinator "$ADDRESS" --timeout=5s job list
check "connection flag --json before the command" 0 '"job_id": "shakespeare"' "" -- --json job get shakespeare
check "another flag before the command" 2 "" "'--phase' before the command is not a connection flag; put the command first" -- --phase running job list
check "members (none yet)" 0 "no workers have joined job shakespeare (generation 1)" "" -- members shakespeare
check "members --json" 0 '"members": []' "" -- members shakespeare --json
check "checkpoints (none yet)" 0 "no checkpoints of job shakespeare" "" -- checkpoints shakespeare
check "checkpoint list (none yet)" 0 "no checkpoints of job shakespeare" "" -- checkpoint list shakespeare
check "checkpoint show (nothing committed)" 2 "" "shardctl checkpoint show: " -- checkpoint show shakespeare
check "checkpoint verify (nothing committed)" 2 "" "shardctl checkpoint verify: " -- checkpoint verify shakespeare
check "topology before the first generation" 1 "" "the topology exists once the first generation forms" -- topology shakespeare
check "owner before the first generation" 1 "" "shardctl owner: " -- owner shakespeare layers.0.mlp.fc1.weight
check "kv get of a key nobody set" 0 "Value:       not set" "" -- kv get shakespeare --generation 1 --scope tp/0 k
check "kv get of a future generation" 2 "" "does not exist yet" -- kv get shakespeare --generation 9 k
check "a cancel reason with terminal escapes is refused" 2 "" "reason='a\x1b[2Jb\nPhase: fake' contains control characters" -- job cancel shakespeare --reason $'a\e[2Jb\nPhase: fake'
check "cancel" 0 "Phase:            CANCELLED" "" -- job cancel shakespeare --reason "test over"
check "cancel shows the reason" 0 "test over" "" -- job get shakespeare
check "a job cancelled before it formed says so" 0 "World:            none: cancelled before it formed" "" -- job get shakespeare
check "cancel a cancelled job says so" 0 "job shakespeare is already CANCELLED (cancelled: test over); nothing to do" "" -- job cancel shakespeare --reason again
check "cancel a cancelled job still checks the reason" 2 "" "contains control characters" -- job cancel shakespeare --reason $'a\e[31mb'
check "cancel again keeps the first reason" 0 "Phase:            CANCELLED (cancelled: test over)" "" -- job get shakespeare
check "watch replays and ends at the terminal phase" 0 "phase_changed PENDING -> CANCELLED" "" -- watch shakespeare --after 0
check "watch a finished job shows its history" 0 "phase_changed PENDING -> CANCELLED: cancelled: test over" "" -- watch shakespeare
check "watch a finished job says how it ended" 0 "job shakespeare has ended: CANCELLED (cancelled: test over); no more events will come" "" -- watch shakespeare
check "watch --count" 0 "#1 " "" -- watch shakespeare --after 0 --count 1
[ "$(wc -l <"$TMP/out")" -eq 1 ] && echo "[  OK  ] watch --count 1 prints one line" \
  || { echo "[FAILED] watch --count 1 printed $(wc -l <"$TMP/out") lines"; fails=$((fails + 1)); }
check "watch --json lines" 0 '"phase_changed":' "" -- watch shakespeare --after 0 --json
check "an argument that is not UTF-8 is refused before any call" 2 "" "shardctl: argument 3 ('a\\xff') is not UTF-8" -- job get $'a\xff'
check "an id with a terminal escape is echoed escaped" 2 "" "a\\x1b[31m" -- job get $'a\e[31m'
check "watch --after beyond the history names the flag" 2 "" "shardctl watch: --after=99999 is outside the retained range [0, " -- watch shakespeare --after 99999
check "whatif of a cancelled job" 1 "" "shardctl whatif: job 'shakespeare' is CANCELLED; no loss would change it" -- whatif shakespeare --lose w1
check "whatif of an unknown job" 2 "" "shardctl whatif: no job 'nope'; 'shardctl job list' lists the jobs" -- whatif nope --lose w1
# Usage errors end with the command's usage (several lines).
CLI_ONE_LINE_ERRORS=0 check "whatif without --lose names the flag" 2 "" "shardctl whatif: whatif needs --lose WORKER[,WORKER...]" -- whatif shakespeare
CLI_ONE_LINE_ERRORS=0 check "whatif naming a worker twice" 2 "" "--lose names 'w1' twice (workers 1 and 2); name each worker once" -- whatif shakespeare --lose w1,w1
check "whatif --help" 0 "Usage: shardctl whatif JOB --lose WORKER[,WORKER...] [--json]" "" -- whatif --help

# An external job (job.proto ExternalWorkload): no model or plan to show.
check "create an external job from its example spec" 0 "Kind:         external workload (framework torchrun): no plan; ranks are the workload's" "" -- job create "$EXTERNAL_SPEC" --id ddp
check "get an external job" 0 "Elastic:      2..4 nodes, heartbeat 1s, timeout 5s, last call 2s" "" -- job get ddp
check "get an external job says who it waits for" 0 "World:        not formed yet; waiting for workers: 0 joined, needs at least 2 (min_workers)" "" -- job get ddp
check "list an external job" 0 "torchrun-external  PENDING" "" -- job list
check "members of an external job" 0 "no workers have joined job ddp (generation 1)" "" -- members ddp
check "topology of an external job" 1 "" "job ddp is an external job (spec.external): it has no plan" -- topology ddp
check "owner of an external job" 1 "" "job ddp is an external job (spec.external): it has no plan" -- owner ddp wte
check "cancel an external job" 0 "Phase:        CANCELLED (cancelled: done)" "" -- job cancel ddp --reason done
check "watch an external job" 0 "phase_changed PENDING -> CANCELLED: cancelled: done" "" -- watch ddp --after 0

# A job that fails before it forms (nobody joins within join_timeout 1s).
sed 's/^  heartbeat_timeout: 10s$/  heartbeat_timeout: 10s\n  join_timeout: 1s/' "$SPEC" >"$TMP/short.yaml"
check "create a job nobody joins" 0 "Job:              lonely" "" -- job create "$TMP/short.yaml" --id lonely
for _ in $(seq 1 100); do
  "$SHARDCTL" job get lonely 2>/dev/null | grep -q "^Phase: *FAILED" && break
  sleep 0.1
done
check "a job failed before it formed says so" 0 "World:            none: failed before it formed" "" -- job get lonely
check "cancel a failed job is an error naming the phase" 1 "" "shardctl job cancel: job 'lonely' already FAILED; nothing to cancel" -- job cancel lonely
check "watch a failed job says how it ended" 0 "job lonely has ended: FAILED (only 0 workers joined within join_timeout 1s" "" -- watch lonely

# Error paths.
check "unknown job" 2 "" "shardctl job get: no job" -- job get nope
check "unknown job names the way out" 2 "" "'shardctl job list' lists the jobs" -- members nope
check "unreachable coordinator" 1 "" "shardctl job list: cannot reach the coordinator at 127.0.0.1:$CLOSED: connection refused; start shardline-coordinator or set --coordinator / SHARDLINE_COORDINATOR" -- job list --coordinator "127.0.0.1:$CLOSED"
SHARDLINE_COORDINATOR="127.0.0.1:$CLOSED" check "unreachable coordinator from the environment" 1 "" "cannot reach the coordinator at 127.0.0.1:$CLOSED: connection refused" -- job get shakespeare
printf 'name: bad\nmodel:\n  num_layers: 4\n  colour: blue\n' >"$TMP/unknown.yaml"
check "bad spec: unknown field" 2 "" "$TMP/unknown.yaml:4:3: unknown field 'model.colour'" -- job create "$TMP/unknown.yaml"
sed 's/^  tp: 1$/  tp: 3/' "$SPEC" >"$TMP/tp3.yaml"
check "bad spec: the coordinator names the field" 2 "" "spec.parallel.tp=3" -- job create "$TMP/tp3.yaml" --id tp3
sed 's/heartbeat_timeout: 10s/heartbeat_timeout: 10/' "$SPEC" >"$TMP/duration.yaml"
check "bad spec: duration without unit" 2 "" "'elastic.heartbeat_timeout' is a duration and the number 10 has no unit" -- job create "$TMP/duration.yaml"
sed 's/^  dataset_path:.*/  dataset_path: ""/' "$SPEC" >"$TMP/nodata.yaml"
check "bad spec: empty dataset_path" 2 "" "nodata.yaml: spec.data.dataset_path is empty; give the path of the text corpus every worker can read" -- job create "$TMP/nodata.yaml" --id nodata
sed 's/^name:.*/name: "x\\e[2J\\nPhase: COMPLETED"/' "$SPEC" >"$TMP/escape.yaml"
check "bad spec: terminal escapes in the name" 2 "" "spec.name='x\x1b[2J\nPhase: COMPLETED' contains control characters" -- job create "$TMP/escape.yaml" --id escape
python3 -c 'import sys; print(open(sys.argv[1]).read().replace("directory: /tmp/shardline-ckpt", "directory: /" + "d" * 20000))' "$SPEC" >"$TMP/longdir.yaml"
check "bad spec: a 20,000-byte checkpoint.directory is named in a short message" 2 "" "spec.checkpoint.directory='/dddd" -- job create "$TMP/longdir.yaml" --id longdir
[ "$(wc -c <"$TMP/err")" -lt 1000 ] && echo "[  OK  ] ... and the message is short" \
  || { echo "[FAILED] the checkpoint.directory message is $(wc -c <"$TMP/err") bytes"; fails=$((fails + 1)); }
sed 's/^  global_batch:.*/  global_batch: -24/' "$SPEC" >"$TMP/negative.yaml"
check "bad spec: the range hint is the valid range" 2 "" "'training.global_batch' must be a whole number in 1..18446744073709551615, not the number -24" -- job create "$TMP/negative.yaml"
sed 's/^  pp: 2$/  pp: 3/' "$SPEC" >"$TMP/pp3.yaml"
check "bad spec: no world size in the worker range says why" 2 "" "a multiple of tp*pp=3, and none lies in spec.elastic.min_workers..max_workers = 4..5; set min_workers to 3 or max_workers to 6" -- job create "$TMP/pp3.yaml" --id pp3
check "missing spec file" 2 "" "cannot read spec file '$TMP/none.yaml': No such file or directory" -- job create "$TMP/none.yaml"
check "bad --id" 2 "" "--id='Shake' is not a job id" -- job create "$SPEC" --id Shake
check "bad flag" 2 "" "unknown flag --phse" -- job list --phse running

# ---- with an admin token --------------------------------------------------
start_coordinator auth --admin-token admin-secret-0123456789
export SHARDLINE_COORDINATOR="$ADDRESS"
check "no token" 1 "" "requires a token" -- job list
check "wrong token" 1 "" "check the token given by --token or SHARDLINE_TOKEN" -- job list --token nope
SHARDLINE_TOKEN=admin-secret-0123456789 check "create with the admin token" 0 "Worker token (shown only now; give it to this job's workers as SHARDLINE_TOKEN):" "" -- job create "$SPEC" --id shakespeare
WORKER_TOKEN=$(grep -A1 "^Worker token (shown only now" "$TMP/out" | tail -1 | tr -d ' ')
if [ -n "$WORKER_TOKEN" ] && [ "$(grep -c -- "$WORKER_TOKEN" "$TMP/out")" -eq 1 ]; then
  echo "[  OK  ] the worker token is printed once"
else
  echo "[FAILED] the worker token is printed once"; fails=$((fails + 1))
fi
check "admin token from --token" 0 "shakespeare" "" -- job list --token admin-secret-0123456789
SHARDLINE_TOKEN="$WORKER_TOKEN" check "worker token reads its job" 0 "Job:              shakespeare" "" -- job get shakespeare
SHARDLINE_TOKEN="$WORKER_TOKEN" check "worker token may not list jobs" 1 "" "admin token" -- job list
SHARDLINE_TOKEN="$WORKER_TOKEN" check "worker token may not cancel" 1 "" "admin token" -- job cancel shakespeare
SHARDLINE_TOKEN="$WORKER_TOKEN" check "worker token of another job" 1 "" "shardctl job get: " -- job get other

echo "$fails failed"
[ $fails -eq 0 ]
