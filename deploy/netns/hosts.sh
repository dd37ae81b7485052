#!/usr/bin/env bash
# "Hosts" made of Linux network namespaces on one machine, joined by one
# switch (a bridge), for running Shardline as if over several nodes.
#
#   hosts.sh up    PREFIX N      namespaces PREFIX-h0 .. PREFIX-h<N-1>, each
#                                with eth0 = SUBNET.(10+i)/24 on the switch
#                                (namespace PREFIX-sw, bridge br0)
#   hosts.sh down  PREFIX        removes every namespace PREFIX-* (and so
#                                its links); processes inside are not killed
#   hosts.sh cut   PREFIX HOST   pulls HOST's cable: its switch port goes down
#                                (a partition: processes keep running, TCP
#                                connections stay open and see silence)
#   hosts.sh heal  PREFIX HOST   plugs it back in
#   hosts.sh addr  PREFIX HOST   prints HOST's IPv4 address
#   hosts.sh exec  PREFIX HOST COMMAND [ARGS...]   runs COMMAND on HOST
#
# HOST is h0, h1, ... SUBNET is $SHARDLINE_NETNS_SUBNET (default 10.77.0).
# Each PREFIX is its own network (its own switch), isolated from the
# machine's: clusters with different PREFIXes may use the same SUBNET. The
# root namespace is not touched: the switch lives in a namespace too. Needs
# root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and iproute2.
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"  # ip(8), also from a minimal PATH

SUBNET="${SHARDLINE_NETNS_SUBNET:-10.77.0}"

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//' >&2
  exit 2
}

# host_index HOST: prints i for "hi".
host_index() {
  [[ "$1" =~ ^h([0-9]+)$ ]] || { echo "hosts.sh: '$1' is not a host name (h0, h1, ...)" >&2; exit 2; }
  echo "${BASH_REMATCH[1]}"
}

[ $# -ge 2 ] || usage
cmd="$1" prefix="$2"
shift 2
[[ "$prefix" =~ ^[A-Za-z0-9_.-]{1,40}$ ]] || { echo "hosts.sh: bad PREFIX '$prefix'" >&2; exit 2; }
sw="$prefix-sw"

case "$cmd" in
  up)
    if [ $# -ne 1 ] || ! [[ "$1" =~ ^[0-9]+$ ]] || [ "$1" -lt 1 ] || [ "$1" -gt 200 ]; then usage; fi
    n="$1"
    ip netns add "$sw"
    ip -n "$sw" link set lo up
    ip -n "$sw" link add br0 type bridge
    ip -n "$sw" link set br0 up
    for ((i = 0; i < n; i++)); do
      h="$prefix-h$i"
      ip netns add "$h"
      ip -n "$h" link set lo up
      # Port "p<i>" on the switch, its peer is the host's eth0.
      ip -n "$sw" link add "p$i" type veth peer name eth0 netns "$h"
      ip -n "$sw" link set "p$i" master br0
      ip -n "$sw" link set "p$i" up
      ip -n "$h" addr add "$SUBNET.$((10 + i))/24" dev eth0
      ip -n "$h" link set eth0 up
    done
    ;;
  down)
    [ $# -eq 0 ] || usage
    for ns in $(ip netns list | awk '{print $1}'); do
      case "$ns" in "$prefix"-h[0-9]* | "$sw") ip netns delete "$ns" ;; esac
    done
    ;;
  cut | heal)
    [ $# -eq 1 ] || usage
    i=$(host_index "$1")
    state=down
    [ "$cmd" = heal ] && state=up
    ip -n "$sw" link set "p$i" "$state"
    ;;
  addr)
    [ $# -eq 1 ] || usage
    i=$(host_index "$1")
    echo "$SUBNET.$((10 + i))"
    ;;
  exec)
    [ $# -ge 2 ] || usage
    host_index "$1" >/dev/null
    h="$prefix-$1"
    shift
    exec ip netns exec "$h" "$@"
    ;;
  *) usage ;;
esac
