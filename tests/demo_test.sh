#!/usr/bin/env bash
# End-to-end: deploy/local/demo.sh, quick-start command 1, in its quick mode
# (SHARDLINE_DEMO_QUICK=1: 40 steps, a checkpoint every 10, a rank killed
# after step 15) on the built programs (SHARDLINE_DEMO_BIN: no install, no
# build). Checks that it exits 0 and that its output shows the recovery, a
# restore from a committed checkpoint, the shardctl views, the sample and
# the summary.
#
#   demo_test.sh DEMO_SH SHARDCTL   (run from the runfiles root; the
#                                    programs lie under it as client/...,
#                                    server/..., worker/...)
set -uo pipefail
DEMO="$1"
SHARDCTL="$2"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
BIN="$(cd "$(dirname "$SHARDCTL")/../.." && pwd)"  # the runfiles root: BIN/client/shardctl/shardctl
unset SHARDLINE_COORDINATOR SHARDLINE_TOKEN SHARDLINE_ADMIN_TOKEN SHARDLINE_DEMO_STEPS

start=$(date +%s)
SHARDLINE_DEMO_QUICK=1 SHARDLINE_DEMO_BIN="$BIN" SHARDLINE_DEMO_OUT="$TMP/demo" \
  timeout 600 bash "$DEMO" >"$TMP/demo.out" 2>&1
rc=$?
echo "demo.sh exited $rc after $(( $(date +%s) - start )) s"

fails=0
expect() {  # NAME EXTENDED_REGEX: a line of the demo's output matches
  if grep -aqE -- "$2" "$TMP/demo.out"; then
    echo "[  OK  ] $1"
  else
    echo "[FAILED] $1: no line matches /$2/"
    fails=$((fails + 1))
  fi
}
if [ "$rc" -eq 0 ]; then echo "[  OK  ] exit 0"; else echo "[FAILED] exit $rc"; fails=$((fails + 1)); fi
expect "generation 1 formed with a spare" "generation 1: spare \(world 4\)"
expect "live training progress" "gen 1 step 5/40 loss [0-9.]+ .*tokens/s [0-9]+"
expect "a checkpoint committed before the kill" "checkpoint committed .*checkpoint=ckpt-step000000000010-gen1"
expect "the kill" "kill -9 node[0-4] \(rank 1 of generation 1\) after step 15"
expect "the coordinator notices" "coordinator \| generation ended job=shakespeare generation=1 reason=.*lost"
expect "re-formed at generation 2" "generation 2 rank [0-3] world 4: communicators ready"
expect "restore from the committed checkpoint" "generation 2 rank 0: restored ckpt-step000000000010-gen1 \(step 10\)"
expect "the recovery line" "recovery \(rank 1 .*lost.*\): communicators ready after [0-9.]+ s, restored after [0-9.]+ s, first resumed step 11 after [0-9.]+ s \(generation 2"
expect "training finished in generation 2" "gen 2 step 40/40 loss [0-9.]+"
expect "shardctl members" "node[0-4] +[0-9]+ +LOST"
expect "shardctl topology" "world 4 = tp 1 x pp 2 x dp 2"
expect "shardctl owner" "layers.2.mlp.fc1.weight: shape \[512, 128\]"
expect "shardctl checkpoint list" "ckpt-step000000000040-gen2 +40 +2 +COMMITTED"
expect "the sample" "== A sample from the trained model"
expect "the run summary" "^run: +40 steps .* -> [0-9.]+ at step 40"
expect "the throughput" "tokens/s [0-9]+ while training, [0-9]+ overall"
expect "the recovery summary" "kill -> coordinator noticed [0-9.]+ s -> generation 2 formed [0-9.]+ s -> communicators ready [0-9.]+ s -> restored [0-9.]+ s -> first resumed step \(11\) [0-9.]+ s"
# The sample holds text: some letters after its header.
if sed -n '/== A sample/,/== Summary/p' "$TMP/demo.out" | grep -a '^  | ' | grep -aq '[A-Za-z]'; then
  echo "[  OK  ] the sample has text"
else
  echo "[FAILED] the sample has no text"; fails=$((fails + 1))
fi
# Nothing the demo started outlives it.
if pgrep -f -- "--state $TMP/demo/state.db" >/dev/null || pgrep -f -- "$BIN/worker/shardline-worker" >/dev/null; then
  echo "[FAILED] processes outlived the demo"; fails=$((fails + 1))
else
  echo "[  OK  ] no process outlived the demo"
fi

if [ "$fails" -ne 0 ]; then
  echo "--- demo output"
  cat "$TMP/demo.out"
  for f in "$TMP"/demo/*.log; do echo "--- $f (tail)"; tail -20 "$f"; done
  exit 1
fi
echo "--- demo output"
cat "$TMP/demo.out"
