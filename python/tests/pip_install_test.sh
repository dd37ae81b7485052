#!/usr/bin/env bash
# `pip install ./python` as a user does it, offline, over Debian's packages:
# a fresh venv with --system-site-packages (python3-grpcio, python3-protobuf),
# pip install --no-index --no-build-isolation --no-deps of a copy of python/
# and proto/ (setup.py generates the stubs from ../proto), then the installed
# package, imported from outside the source tree, against the real
# coordinator: GetStatus, CreateJob, GetJob, a NotFoundError.
#
#   pip_install_test.sh COORDINATOR_BINARY
set -uo pipefail
COORDINATOR="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
root="${TEST_SRCDIR:?run with bazel test}/${TEST_WORKSPACE:?}"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fail() { echo "[FAILED] $*"; exit 1; }

# A writable copy (pip builds in the source folder).
mkdir -p "$tmp/src"
cp -rL "$root/python" "$root/proto" "$tmp/src/" || fail "copying python/ and proto/"
rm -f "$tmp/src/python/shardline/v1/"*_pb2*.py   # what setup.py must make itself
/usr/bin/python3 -m venv --system-site-packages "$tmp/venv" || fail "python3 -m venv (python3-venv)"
"$tmp/venv/bin/pip" install --no-index --no-build-isolation --no-deps "$tmp/src/python" \
  >"$tmp/pip.log" 2>&1 || { cat "$tmp/pip.log"; fail "pip install ./python"; }
echo "[  OK  ] pip install ./python"

cd "$tmp" || exit 1
SHARDLINE_COORDINATOR_BINARY="$COORDINATOR" PYTHONPATH="$root/python/tests" \
  "$tmp/venv/bin/python" - "$tmp/venv" <<'PY' || fail "the installed package"
import os, sys
import shardline
from shardline.v1 import job_pb2
from coordinator import Coordinator

venv = os.path.realpath(sys.argv[1])
assert os.path.realpath(shardline.__file__).startswith(venv), shardline.__file__
import shardline.v1.coordinator_pb2_grpc as stubs
assert os.path.realpath(stubs.__file__).startswith(venv), stubs.__file__
with Coordinator() as c, shardline.Client(c.address) as client:
    assert client.status().state == "memory"
    spec = job_pb2.JobSpec(name="pip")
    spec.model.num_layers, spec.model.hidden_size, spec.model.num_heads = 2, 64, 2
    spec.model.vocab_size, spec.model.seq_length = 256, 32
    spec.parallel.tp, spec.parallel.pp = 1, 1
    spec.training.global_batch, spec.training.micro_batch, spec.training.train_steps = 4, 2, 10
    spec.data.dataset_path = "data.txt"
    spec.elastic.min_workers = 1
    job, _ = client.create_job(spec, job_id="pip")
    assert client.get_job("pip").spec.name == "pip"
    try:
        client.get_job("nope")
        raise AssertionError("no NotFoundError")
    except shardline.NotFoundError as e:
        assert "nope" in e.message, e.message
# The torchrun backend as torch >= 2.5 discovers it (the entry point), and
# the torch integration importable from the installed package.
from importlib.metadata import entry_points
found = [e for e in entry_points(group="torchrun.handlers") if e.name == "shardline"]
assert found, "no torchrun.handlers entry point 'shardline'"
from shardline.torch import rendezvous
# torch calls the entry point with no arguments and registers what it returns.
assert found[0].load()() is rendezvous.create_handler
assert os.path.realpath(rendezvous.__file__).startswith(venv), rendezvous.__file__
print("shardline", shardline.__version__, "from", os.path.dirname(shardline.__file__))
PY
echo "[  OK  ] the installed package against the coordinator"
