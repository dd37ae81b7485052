#!/bin/sh
# The image's entrypoint: the first argument picks the program, the rest are
# its flags. Defaults come from the environment, so the same image serves
# docker run, Kubernetes and Slurm (srun --container-image / enroot).
#
#   coordinator [FLAGS]  shardline-coordinator --listen $SHARDLINE_LISTEN
#                        --state $SHARDLINE_STATE --metrics-port $SHARDLINE_METRICS_PORT
#                        (admin token: $SHARDLINE_ADMIN_TOKEN; a replica: state
#                        etcd://..., --advertise and --etcd-* among FLAGS)
#   worker [FLAGS]       shardline-worker --job $SHARDLINE_JOB --worker-id ID
#                        --interface ADDR --device $SHARDLINE_DEVICE (default cpu)
#                        (coordinator: $SHARDLINE_COORDINATOR, HOST:PORT or every
#                        replica's, comma-separated; token: $SHARDLINE_TOKEN)
#   shardctl ARGS        shardctl
#   anything else        run as given (e.g. sh)
#
# The worker id is $SHARDLINE_WORKER_ID, else worker-$JOB_COMPLETION_INDEX
# (a Kubernetes indexed Job's pod index), else worker-$SLURM_PROCID, else
# the host name. The Gloo address is $SHARDLINE_INTERFACE, else $POD_IP,
# else the first IPv4 address of `hostname -i`. With $SHARDLINE_DEVICE=cuda
# (no index) the device is cuda:$SHARDLINE_LOCAL_RANK, else cuda:$SLURM_LOCALID,
# else cuda:0. Flags given after the program name come last and win.
set -eu
BIN="${SHARDLINE_BIN_DIR:-/opt/shardline/bin}"

first_ipv4() {
  for a in $(hostname -i 2>/dev/null); do
    case "$a" in *.*.*.*) echo "$a"; return 0 ;; esac
  done
  echo 127.0.0.1
}

program="${1:-coordinator}"
[ $# -gt 0 ] && shift
case "$program" in
  coordinator)
    exec "$BIN/shardline-coordinator" \
      --listen "${SHARDLINE_LISTEN:-0.0.0.0:7070}" \
      --state "${SHARDLINE_STATE:-/var/lib/shardline/state.db}" \
      --metrics-port "${SHARDLINE_METRICS_PORT:-9464}" "$@"
    ;;
  worker)
    : "${SHARDLINE_JOB:?set SHARDLINE_JOB to the job id (shardctl job create ... --id ID)}"
    if [ -n "${SHARDLINE_WORKER_ID:-}" ]; then id="$SHARDLINE_WORKER_ID"
    elif [ -n "${JOB_COMPLETION_INDEX:-}" ]; then id="worker-$JOB_COMPLETION_INDEX"
    elif [ -n "${SLURM_PROCID:-}" ]; then id="worker-$SLURM_PROCID"
    else id="$(hostname)"
    fi
    device="${SHARDLINE_DEVICE:-cpu}"
    if [ "$device" = cuda ]; then
      device="cuda:${SHARDLINE_LOCAL_RANK:-${SLURM_LOCALID:-0}}"
    fi
    interface="${SHARDLINE_INTERFACE:-${POD_IP:-$(first_ipv4)}}"
    exec "$BIN/shardline-worker" --job "$SHARDLINE_JOB" --worker-id "$id" \
      --device "$device" --interface "$interface" \
      --connect-timeout "${SHARDLINE_CONNECT_TIMEOUT:-60s}" "$@"
    ;;
  shardctl)
    exec "$BIN/shardctl" "$@"
    ;;
  *)
    exec "$program" "$@"
    ;;
esac
