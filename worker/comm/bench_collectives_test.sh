#!/usr/bin/env bash
# shardline-bench-collectives as a user runs it: a small checked sweep of every
# op (exit 0, every op has rows, #wrong is 0 in every row; shared memory, then
# loopback TCP) and bad flags (exit 2, the flag named on stderr, nothing on
# stdout).
set -uo pipefail
BENCH="$1"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
fails=0
fail() { echo "[FAILED] $*"; fails=$((fails + 1)); }

"$BENCH" --ranks 2 --op all --min-bytes 4 --max-bytes 4096 --iters 2 --warmup 1 --check \
  --csv "$TMP/rows.csv" >"$TMP/out" 2>"$TMP/err"
rc=$?
if [ "$rc" -ne 0 ]; then
  fail "checked sweep: rc=$rc (want 0)"; cat "$TMP/out" "$TMP/err"
else
  echo "[  OK  ] checked sweep exits 0"
fi
# Data rows start with the size; columns: size count type op time algbw busbw #wrong.
awk '$1 ~ /^[0-9]+$/' "$TMP/out" >"$TMP/rows"
for op in all_reduce all_gather reduce_scatter all_to_all broadcast memcpy; do
  # 4 .. 4096 B doubling: 11 sizes per op.
  n=$(awk -v op="$op" '$4 == op' "$TMP/rows" | wc -l)
  if [ "$n" -eq 11 ]; then echo "[  OK  ] $op: $n rows"; else fail "$op: $n rows (want 11)"; cat "$TMP/out"; fi
done
bad=$(awk 'NF != 8 || $8 != "0"' "$TMP/rows")
if [ -z "$bad" ] && [ -s "$TMP/rows" ]; then
  echo "[  OK  ] #wrong is 0 in every row"
else
  fail "rows with #wrong != 0 (or malformed):"; echo "$bad"
fi
grep -qF "# Wrong elements : 0 OK" "$TMP/out" || fail "no '# Wrong elements : 0 OK' summary"
# The CSV has a header and one line per row.
csv_rows=$(($(wc -l <"$TMP/rows.csv") - 1))
[ "$csv_rows" -eq "$(wc -l <"$TMP/rows")" ] || fail "csv has $csv_rows rows, table $(wc -l <"$TMP/rows")"

# Without --check the column says N/A.
"$BENCH" --ranks 1 --op broadcast --min-bytes 64 --max-bytes 64 --iters 1 --warmup 0 >"$TMP/out" 2>&1
awk '$1 ~ /^[0-9]+$/ && $8 != "N/A" {bad=1} END {exit bad}' "$TMP/out" || fail "no --check: #wrong not N/A"

bad_flag() {  # bad_flag NAME PATTERN_IN_STDERR -- ARGS...
  local name="$1" pat="$2"; shift 3
  "$BENCH" "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  if [ "$rc" -eq 2 ] && grep -qF -- "$pat" "$TMP/err" && [ ! -s "$TMP/out" ]; then
    echo "[  OK  ] $name"
  else
    fail "$name: rc=$rc (want 2), stderr should name '$pat'"; cat "$TMP/out" "$TMP/err"
  fi
}
bad_flag "unknown flag" "--bogus" -- --bogus 1
bad_flag "unknown op" "--op='allreduce'" -- --op allreduce
bad_flag "unknown dtype" "--dtype='int8'" -- --dtype int8
bad_flag "zero iters" "--iters=0" -- --iters 0
bad_flag "non-integer ranks" "--ranks='two'" -- --ranks two
bad_flag "max below min" "--max-bytes=4" -- --min-bytes 8 --max-bytes 4
bad_flag "factor 1" "--factor=1" -- --factor 1
bad_flag "positional" "unexpected argument 'extra'" -- extra
bad_flag "unknown transport" "--transport='udp'" -- --transport udp
bad_flag "staging buffer not whole pages" "--shm-buffer-bytes=5000" -- --shm-buffer-bytes 5000

# Loopback TCP (shared memory off) is checked too.
"$BENCH" --ranks 2 --op all_reduce --min-bytes 4 --max-bytes 4096 --iters 2 --warmup 1 --check \
  --transport tcp >"$TMP/out" 2>"$TMP/err" || { fail "tcp sweep failed"; cat "$TMP/out" "$TMP/err"; }
grep -qF "# Wrong elements : 0 OK" "$TMP/out" || fail "tcp sweep: no '# Wrong elements : 0 OK'"
grep -qF "loopback TCP" "$TMP/out" || fail "tcp sweep: header does not say loopback TCP"

[ "$fails" -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "all passed"
