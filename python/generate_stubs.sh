#!/usr/bin/env bash
# Generates the Python protobuf and gRPC stubs of the coordinator API
# (proto/shardline/v1/*.proto) into python/shardline/v1/ as
# shardline.v1.<file>_pb2 and shardline.v1.<file>_pb2_grpc, for use from the
# source tree:
#
#   python/generate_stubs.sh
#   PYTHONPATH=python /usr/bin/python3 -c 'import shardline'
#
# The same generation runs in `bazel build //python:shardline` (python/BUILD)
# and in `pip install ./python` (python/setup.py). Needs /usr/bin/protoc and
# /usr/bin/grpc_python_plugin (Debian: protobuf-compiler, protobuf-compiler-grpc).
#
#   generate_stubs.sh [PROTO_ROOT [OUT_DIR]]
#     PROTO_ROOT  the folder holding shardline/v1/*.proto (default: ../proto)
#     OUT_DIR     where shardline/v1/*_pb2*.py go (default: this folder)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
proto_root="${1:-$here/../proto}"
out="${2:-$here}"
PROTOC="${PROTOC:-/usr/bin/protoc}"
PLUGIN="${GRPC_PYTHON_PLUGIN:-/usr/bin/grpc_python_plugin}"
for tool in "$PROTOC" "$PLUGIN"; do
  if [ ! -x "$tool" ]; then
    echo "generate_stubs.sh: $tool not found; install protobuf-compiler and protobuf-compiler-grpc (deploy/install_deps.sh)" >&2
    exit 1
  fi
done
shopt -s nullglob
protos=("$proto_root"/shardline/v1/*.proto)
if [ ${#protos[@]} -eq 0 ]; then
  echo "generate_stubs.sh: no .proto files under $proto_root/shardline/v1" >&2
  exit 1
fi
mkdir -p "$out/shardline/v1"
# -I/usr/include: the well-known types (google/protobuf/duration.proto, ...).
"$PROTOC" -I"$proto_root" -I/usr/include --python_out="$out" --grpc_python_out="$out" \
  --plugin=protoc-gen-grpc_python="$PLUGIN" "${protos[@]}"
