#!/usr/bin/env bash
# shardline-train-local's command line, without training: --help prints the
# usage to stdout and exits 0; bad flags and a missing spec exit 2 with the
# reason on stderr and nothing on stdout.
#
#   train_local_main_test.sh TRAIN_LOCAL SPEC_YAML
set -uo pipefail
TRAIN_LOCAL="$1"
SPEC="$2"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"

CLI="$TRAIN_LOCAL"
CLI_QUIET_SUCCESS=1
# check NAME RC OUT ERR -- ARGS (tests/cli_check.sh)
source "${TEST_SRCDIR:?run with bazel test}/${TEST_WORKSPACE:?}/tests/cli_check.sh"

check "--help" 0 "Usage: shardline-train-local SPEC [flags]" "" -- --help
check "--help lists the flags" 0 "  --dp VALUE                data-parallel degree" "" -- --help
check "--help lists itself" 0 "  --help                    print this help and exit" "" -- --help
check "-h" 0 "Usage: shardline-train-local SPEC [flags]" "" -- -h
check "--help with a spec still only helps" 0 "Flags of shardline-train-local SPEC:" "" -- "$SPEC" --help
check "unknown flag" 2 "" "unknown flag --bogus for 'shardline-train-local SPEC'; valid flags: " -- --bogus
check "unknown flag with --help" 2 "" "unknown flag --bogus" -- --bogus --help
check "no spec" 2 "" "give one job spec file (YAML or JSON)" --
check "bad --dp" 2 "" "--dp=0 must be >= 1" -- "$SPEC" --dp 0
check "--help=false is no help" 2 "" "give one job spec file" -- --help=false

echo "$fails failed"
[ $fails -eq 0 ]
