"""py_shardline_test: a Python unittest file run with Debian's /usr/bin/python3.

    load("//python:defs.bzl", "py_shardline_test")

    py_shardline_test(
        name = "client_test",
        srcs = ["client_test.py"],
    )

An sh_test of python/tests/run_test.sh: PYTHONPATH holds the runfiles'
python/ (//python:shardline: sources and generated stubs) and python/tests/
(coordinator.py); $SHARDLINE_COORDINATOR_BINARY names
//server:shardline-coordinator (python/tests/coordinator.py starts it); the
JUnit report has one <testcase> per unittest case (junit_runner.py). Only
packages in //bazel:tests (//python/tests/...) may depend on the coordinator
binary, so define these tests there.

Args:
  name: the test.
  srcs: the one unittest file.
  data: more runfiles.
  args: more arguments (unittest test names, e.g. "ClientTest.test_x").
  env: more environment variables.
  size: as for any test ("small" by default).
  **kwargs: more sh_test attributes (tags, timeout, flaky, ...).
"""

def py_shardline_test(name, srcs, data = [], args = [], env = {}, size = "small", **kwargs):
    if len(srcs) != 1:
        fail("py_shardline_test %s: srcs must be one unittest file" % name)
    native.sh_test(
        name = name,
        size = size,
        srcs = ["//python/tests:run_test.sh"],
        args = ["$(rootpath %s)" % srcs[0]] + args,
        data = srcs + data + [
            "//python:shardline",
            "//python/tests:harness",
            "//server:shardline-coordinator",
        ],
        env = dict(env, SHARDLINE_COORDINATOR_BINARY = "$(rootpath //server:shardline-coordinator)"),
        **kwargs
    )
