#!/usr/bin/env bash
# End-to-end: the shardctl binary as a user runs it. Checks exit codes, that
# results go to stdout and errors to stderr, and real values in the output.
set -uo pipefail
SHARDCTL="$1"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
MODEL=(--layers 4 --hidden 128 --heads 4 --vocab 256 --seq 64)

CLI="$SHARDCTL"
# check NAME RC OUT ERR -- ARGS (tests/cli_check.sh)
source "${TEST_SRCDIR:?run with bazel test}/${TEST_WORKSPACE:?}/tests/cli_check.sh"

check "help" 0 "plan      plan a layout offline" "" -- --help
check "no command is a usage error" 2 "" "" --
check "unknown command" 2 "" "unknown command 'deploy'" -- deploy
check "a usage error" 2 "" "job get takes one job id" -- job get
grep -qx 'Usage: shardctl job get ID \[--json\]' "$TMP/err" && echo "[  OK  ] ... keeps the usage on its own line" \
  || { echo "[FAILED] the usage is not on its own line:"; cat "$TMP/err"; fails=$((fails + 1)); }
check "plan help" 0 "--micro-batches VALUE" "" -- plan --help
check "summary" 0 "834,304 parameters" "" -- plan "${MODEL[@]}" --tp 2 --pp 2 --dp 2 --zero 2 --micro-batches 4
check "json bubble" 0 '"bubble_ratio": 0.25' "" -- plan "${MODEL[@]}" --pp 2 --micro-batches 4 --json
check "json groups" 0 '"parameters": 834304' "" -- plan "${MODEL[@]}" --pp 2 --json
check "memory only" 0 "total 29.25 GiB (31,406,250,000 bytes)" "" -- plan --params 7500000000 --dp 64 --zero 1 --precision mixed
check "owner" 0 "optimizer" "" -- plan owner layers.3.mlp.fc1.weight --element 7 "${MODEL[@]}" --pp 2 --dp 2 --zero 1
check "bad tp" 2 "" "--tp=3 does not divide --heads=4; choose tp in {1, 2, 4}" -- plan "${MODEL[@]}" --tp 3
check "missing flag" 2 "" "--seq is required" -- plan --layers 4 --hidden 128 --heads 4 --vocab 256
check "not a number" 2 "" "--pp='two' is not an integer" -- plan "${MODEL[@]}" --pp two
check "unknown owner" 2 "" "no parameter named 'layers.99.x'" -- plan owner layers.99.x "${MODEL[@]}"
check "deadlocking interleaved" 2 "" "multiple of pp" -- plan --layers 12 --hidden 64 --heads 4 --vocab 256 --seq 16 --pp 4 --vpp 3 --micro-batches 5
check "unwritable svg" 1 "" "cannot write --schedule-svg file" -- plan "${MODEL[@]}" --schedule-svg /nonexistent-dir/x.svg
check "svg" 0 "Schedule" "" -- plan "${MODEL[@]}" --pp 4 --micro-batches 8 --schedule-svg "$TMP/pipe.svg"
if grep -q "1f1b schedule: pp=4, vpp=1, m=8" "$TMP/pipe.svg" && [ "$(grep -c '<title>F' "$TMP/pipe.svg")" -eq 32 ]; then
  echo "[  OK  ] svg content"
else
  echo "[FAILED] svg content"; fails=$((fails + 1))
fi

echo "$fails failed"
[ $fails -eq 0 ]
