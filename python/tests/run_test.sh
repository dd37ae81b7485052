#!/usr/bin/env bash
# Runs one Python unittest file with Debian's /usr/bin/python3 (which sees
# python3-grpcio, python3-protobuf and python3-torch), shardline importable
# from python/ (sources and the generated stubs) and these helpers
# (coordinator.py) from python/tests/; writes the JUnit report
# $XML_OUTPUT_FILE (junit_runner.py). The test of py_shardline_test
# (python/defs.bzl); from a source tree (after python/generate_stubs.sh and
# `bazel build //server:shardline-coordinator`):
#
#   python/tests/run_test.sh python/tests/client_test.py [TEST_NAME...]
set -uo pipefail
if [ -n "${TEST_SRCDIR:-}" ]; then
  root="$TEST_SRCDIR/${TEST_WORKSPACE:?}"
else
  root="$(cd "$(dirname "$0")/../.." && pwd)"
fi
test_file="${1:?usage: run_test.sh TEST_FILE.py [TEST_NAME...]}"
shift
case "$test_file" in /*) ;; *) test_file="$root/$test_file" ;; esac
export PYTHONPATH="$root/python:$root/python/tests${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
exec /usr/bin/python3 "$root/python/tests/junit_runner.py" "$test_file" "$@"
