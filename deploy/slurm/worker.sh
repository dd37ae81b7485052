#!/bin/bash
# One Shardline worker, as a Slurm task (deploy/slurm/shardline.sbatch runs
# it with srun, one task per GPU). Reads SHARDLINE_COORDINATOR, SHARDLINE_JOB,
# SHARDLINE_TOKEN, SHARDLINE_BIN and SHARDLINE_TLS_CA (the coordinator's CA;
# unset: no TLS) from the environment; the GPU is the
# task's local id (SLURM_LOCALID), the worker id NODE:LOCALID. Gloo binds
# this node's address on the training network: $SHARDLINE_INTERFACE, else the
# node's address whose prefix is $SHARDLINE_NETWORK_PREFIX (e.g. "10.1."),
# else the address of its default route.
set -euo pipefail
: "${SHARDLINE_JOB:?}" "${SHARDLINE_COORDINATOR:?}"
BIN="${SHARDLINE_BIN:-/opt/shardline/bin}"
local_id="${SLURM_LOCALID:-0}"
node="$(hostname -s)"

address="${SHARDLINE_INTERFACE:-}"
if [ -z "$address" ] && [ -n "${SHARDLINE_NETWORK_PREFIX:-}" ]; then
  for a in $(hostname -I); do
    case "$a" in "$SHARDLINE_NETWORK_PREFIX"*) address="$a"; break ;; esac
  done
fi
if [ -z "$address" ]; then
  address="$(ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p' | head -1)"
fi
[ -n "$address" ] || { echo "worker.sh: no IPv4 address for Gloo; set SHARDLINE_INTERFACE" >&2; exit 2; }

device=cpu
if [ -n "${SLURM_GPUS_ON_NODE:-}" ] && [ "${SLURM_GPUS_ON_NODE}" != 0 ]; then
  # With --gpu-bind or per-task cgroups each task may see only its own GPU.
  visible="${CUDA_VISIBLE_DEVICES:-}"
  if [ -n "$visible" ] && [ "${visible//,/}" = "$visible" ]; then
    device=cuda:0
  else
    device="cuda:$local_id"
  fi
fi

read -r -a extra <<<"${SHARDLINE_WORKER_ARGS:-}"
[ -n "${SHARDLINE_TLS_CA:-}" ] && extra=(--tls-ca "$SHARDLINE_TLS_CA" "${extra[@]}")
exec "$BIN/shardline-worker" --job "$SHARDLINE_JOB" --worker-id "$node:$local_id" \
  --host "$node" --device "$device" --interface "$address" --connect-timeout 120s \
  "${extra[@]}"
