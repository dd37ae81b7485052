# Sourced by the command-line tests (tests/shardctl_*_test.sh,
# worker/train/train_local_main_test.sh):
#
#   check NAME EXPECTED_RC PATTERN_IN_STDOUT PATTERN_IN_STDERR -- ARGS...
#
# runs "$CLI" ARGS (at most 30 s) and checks its exit code and, when not
# empty, a fixed string in stdout and in stderr. An error never prints a
# partial result on stdout. With CLI_ONE_LINE_ERRORS=1 an error is exactly
# one line on stderr; with CLI_QUIET_SUCCESS=1 success prints nothing on
# stderr. Prints [  OK  ] or [FAILED] with the output, and counts failures in
# $fails. Needs CLI and TMP set.
fails=0
check() {
  local name="$1" want_rc="$2" out_pat="$3" err_pat="$4"; shift 5
  timeout 30 "$CLI" "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  local ok=1
  [ "$rc" -eq "$want_rc" ] || ok=0
  [ -z "$out_pat" ] || grep -qF -- "$out_pat" "$TMP/out" || ok=0
  [ -z "$err_pat" ] || grep -qF -- "$err_pat" "$TMP/err" || ok=0
  if [ "$want_rc" -ne 0 ]; then
    [ -s "$TMP/out" ] && ok=0
    if [ "${CLI_ONE_LINE_ERRORS:-0}" = 1 ]; then [ "$(wc -l <"$TMP/err")" -eq 1 ] || ok=0; fi
  elif [ "${CLI_QUIET_SUCCESS:-0}" = 1 ]; then
    [ -s "$TMP/err" ] && ok=0
  fi
  if [ $ok -eq 1 ]; then
    echo "[  OK  ] $name"
  else
    echo "[FAILED] $name: rc=$rc (want $want_rc)"; echo "--- stdout"; head -30 "$TMP/out"; echo "--- stderr"; cat "$TMP/err"
    fails=$((fails + 1))
  fi
}
