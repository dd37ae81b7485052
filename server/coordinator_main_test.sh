#!/usr/bin/env bash
# shardline-coordinator's --listen and --state before it serves: a malformed
# address, one that is not this machine's, a host that does not resolve, a
# --state with an unknown scheme or naming a directory (exit 2) and a port
# in use (exit 1) each get one line naming the flag and the cause, never
# gRPC's raw log line.
#
#   coordinator_main_test.sh COORDINATOR
set -uo pipefail
CLI="$1"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
# check NAME RC OUT ERR -- ARGS (tests/cli_check.sh)
source "${TEST_SRCDIR:?run with bazel test}/${TEST_WORKSPACE:?}/tests/cli_check.sh"

check "malformed --listen" 2 "" "--listen='127.0.0.1:99999' is not HOST:PORT" \
  -- --listen 127.0.0.1:99999 --state memory
check "not this machine's address" 2 "" \
  "--listen='192.0.2.1:7070' is not an address of this machine (Cannot assign requested address)" \
  -- --listen 192.0.2.1:7070 --state memory
check "host does not resolve" 2 "" "--listen='no-such-host.invalid:7070': the host does not resolve" \
  -- --listen no-such-host.invalid:7070 --state memory

check "--state with an unknown scheme" 2 "" "--state='bogus://x': unknown scheme 'bogus://'" \
  -- --listen 127.0.0.1:0 --state bogus://x
check "--state that is a directory" 2 "" "--state='$TMP' is a directory; give the path of the state file in it" \
  -- --listen 127.0.0.1:0 --state "$TMP"

# A port some other program holds: the first coordinator's.
"$CLI" --listen 127.0.0.1:0 --state memory >"$TMP/first.out" 2>"$TMP/first.err" &
first=$!
for _ in $(seq 100); do grep -q "listening on " "$TMP/first.out" && break; sleep 0.1; done
address=$(sed -n 's/^listening on //p' "$TMP/first.out")
if [ -z "$address" ]; then
  echo "[FAILED] the first coordinator did not start"; cat "$TMP/first.err"; fails=$((fails + 1))
else
  check "port in use" 1 "" "--listen='$address': the port is in use (Address already in use)" \
    -- --listen "$address" --state memory
  if grep -q "E[0-9]\{4\} " "$TMP/err"; then
    echo "[FAILED] gRPC's raw log line was printed"; cat "$TMP/err"; fails=$((fails + 1))
  fi
fi
kill "$first" 2>/dev/null
wait "$first" 2>/dev/null

echo "$fails failed"
[ $fails -eq 0 ]
