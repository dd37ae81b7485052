#!/usr/bin/env bash
# Shardline with a highly available coordinator over three "hosts" made of
# network namespaces (hosts.sh): one etcd member and one coordinator replica
# on each, workers on all three, and the leader's host cut off mid-training.
#
#   h0  10.77.0.10  etcd m0, coordinator replica (the first leader), worker h0-w0
#   h1  10.77.0.11  etcd m1, coordinator replica, workers h1-w0, h1-w1
#   h2  10.77.0.12  etcd m2, coordinator replica, workers h2-w0, h2-w1
#
# The replicas share the state prefix etcd://m0,m1,m2/netns and elect a
# leader on an etcd lease (--lease-ttl 2s); h0's replica starts first and
# leads. Every worker and shardctl is given all three replica addresses. The
# job (deploy/netns/job.yaml, with --steps training steps) forms world 4 =
# pp 2 x dp 2 with one spare. Once step --cut-at-step is done, h0's switch
# port goes down: its etcd member, its replica (the leader) and its worker
# fall silent. etcd keeps a quorum (2 of 3); the leader's lease expires; a
# replica on h1 or h2 wins the election, loads the state from etcd and
# serves; the workers' calls move to it. h0's worker is declared LOST by
# heartbeat timeout and, if it held a rank, the job re-forms without it.
# Training goes on and checkpoints are committed by the new leader. Then the
# link comes back: h0's etcd member catches up, its replica finds another
# leader's key and stays a follower, and the job trains to the end.
#
#   sudo deploy/netns/ha-demo.sh [--out DIR] [--prefix NAME] [--steps N]
#       [--bin-dir DIR | --coordinator-bin F --worker-bin F --shardctl-bin F]
#       [--data FILE] [--cut-at-step N] [--lease-ttl D] [--tls] [--keep]
#       [--fault cut|kill]
#
# --fault kill: instead of cutting h0's link, kill -9 h0's replica (its
# etcd member and worker stay up; its port then refuses connections), and
# instead of the heal, start it again.
#
# --tls: TLS with client certificates between etcd members and to etcd, and
# TLS from clients to the replicas (certificates from deploy/k8s/ha/certs.sh
# in OUT/tls). Without it everything is plaintext, as in demo.sh: the
# namespaces' network is private to this machine; a real deployment uses
# TLS (deploy/k8s/ha, deploy/systemd, docs/SECURITY.md).
#
# Without binaries given it builds them with Bazel. Everything goes to --out
# (default /tmp/shardline-netns-ha): spec, etcd data, checkpoints, one log
# per process, summary.txt. It checks what it shows and exits non-zero if
# no new leader took over or the job did not complete. Needs root and etcd
# (Debian's etcd-server, etcd-client); every namespace and process it made
# is removed on exit (--keep leaves the namespaces).
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"  # ip(8), also from a minimal PATH
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
HOSTS="$REPO/deploy/netns/hosts.sh"
OUT=/tmp/shardline-netns-ha
PREFIX=shardline-ha
COORDINATOR_BIN="" WORKER_BIN="" SHARDCTL_BIN="" DATA="$REPO/data/tinyshakespeare.txt"
STEPS=200
CUT_AT_STEP=20
LEASE_TTL=2s
TLS=0
KEEP=0
FAULT="cut"
usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in --keep | --tls) ;; --*) [ $# -ge 2 ] || usage ;; esac  # every other flag takes a value
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --prefix) PREFIX="$2"; shift 2 ;;
    --steps) STEPS="$2"; shift 2 ;;
    --bin-dir)
      COORDINATOR_BIN="$2/shardline-coordinator" WORKER_BIN="$2/shardline-worker" SHARDCTL_BIN="$2/shardctl"
      shift 2 ;;
    --coordinator-bin) COORDINATOR_BIN="$2"; shift 2 ;;
    --worker-bin) WORKER_BIN="$2"; shift 2 ;;
    --shardctl-bin) SHARDCTL_BIN="$2"; shift 2 ;;
    --data) DATA="$2"; shift 2 ;;
    --cut-at-step) CUT_AT_STEP="$2"; shift 2 ;;
    --lease-ttl) LEASE_TTL="$2"; shift 2 ;;
    --tls) TLS=1; shift ;;
    --fault) FAULT="$2"; shift 2 ;;
    --keep) KEEP=1; shift ;;
    *) usage ;;
  esac
done
# At most 9 digits each: the arithmetic below cannot overflow.
if ! [[ "$STEPS" =~ ^[0-9]{1,9}$ ]] || ! [[ "$CUT_AT_STEP" =~ ^[0-9]{1,9}$ ]] ||
  [ "$CUT_AT_STEP" -lt 11 ] || [ "$STEPS" -lt $((10#$CUT_AT_STEP + 30)) ]; then
  echo "ha-demo.sh: want --cut-at-step >= 11 (after the first checkpoint) and --steps >= cut + 30," \
    "whole numbers below 10^9 (got --cut-at-step '$CUT_AT_STEP' --steps '$STEPS')" >&2
  exit 2
fi
case "$FAULT" in cut | kill) ;; *) echo "ha-demo.sh: --fault is cut or kill, not '$FAULT'" >&2; exit 2 ;; esac
[ "$(id -u)" -eq 0 ] || { echo "ha-demo.sh: needs root (network namespaces)" >&2; exit 1; }
for p in etcd etcdctl python3; do
  command -v "$p" >/dev/null || { echo "ha-demo.sh: needs $p (deploy/install_deps.sh installs it)" >&2; exit 1; }
done
# shellcheck source=deploy/netns/programs.sh
. "$REPO/deploy/netns/programs.sh"
resolve_programs ha-demo.sh

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
rm -rf "$OUT/ckpt" "$OUT/etcd" "$OUT/tls" "$OUT"/*.log "$OUT"/*.out "$OUT/summary.txt"
SUMMARY="$OUT/summary.txt"
say() { echo "$*" | tee -a "$SUMMARY"; }
fail() {
  say "FAILED: $*"
  for f in "$OUT"/etcd-m*.log "$OUT"/coordinator-h*.log "$OUT"/h*-w*.log; do
    [ -e "$f" ] && { echo "--- $(basename "$f") (last 25 lines)"; tail -25 "$f"; }
  done >&2
  exit 1
}

# The job spec: absolute paths, --steps training steps.
sed -e "s|^\(  dataset_path:\).*|\1 $DATA|" -e "s|^\(  directory:\).*|\1 $OUT/ckpt|" \
  -e "s|^\(  train_steps:\).*|\1 $STEPS|" "$REPO/deploy/netns/job.yaml" >"$OUT/job.yaml"

PIDS=()
trap cleanup EXIT
trap 'fail "line $LINENO: a command failed"' ERR
"$HOSTS" down "$PREFIX" 2>/dev/null || true
"$HOSTS" up "$PREFIX" 3
IP=()
for i in 0 1 2; do IP+=("$("$HOSTS" addr "$PREFIX" "h$i")"); done
unset SHARDLINE_TOKEN SHARDLINE_ADMIN_TOKEN SHARDLINE_COORDINATOR

# TLS material (--tls): one CA; the member certificate names the three
# addresses, the replicas' certificate too.
SCHEME=http
ETCD_TLS=() ETCD_CLIENT_TLS=() ETCDCTL_TLS=() COORD_TLS=() CLIENT_TLS=()
if [ "$TLS" -eq 1 ]; then
  names="${IP[0]},${IP[1]},${IP[2]},127.0.0.1"
  bash "$REPO/deploy/k8s/ha/certs.sh" "$OUT/tls" "$names" "$names" 2 >"$OUT/certs.log" 2>&1 ||
    fail "certs.sh: $(cat "$OUT/certs.log")"
  T="$OUT/tls"
  SCHEME=https
  ETCD_TLS=(--cert-file "$T/etcd-member.pem" --key-file "$T/etcd-member.key" --trusted-ca-file "$T/ca.pem"
    --client-cert-auth --peer-cert-file "$T/etcd-member.pem" --peer-key-file "$T/etcd-member.key"
    --peer-trusted-ca-file "$T/ca.pem" --peer-client-cert-auth)
  ETCDCTL_TLS=(--cacert "$T/ca.pem" --cert "$T/etcd-client.pem" --key "$T/etcd-client.key")
  ETCD_CLIENT_TLS=(--etcd-ca "$T/ca.pem" --etcd-cert "$T/etcd-client.pem" --etcd-key "$T/etcd-client.key")
  COORD_TLS=(--tls-cert "$T/coordinator.pem" --tls-key "$T/coordinator.key")
  CLIENT_TLS=(--tls-ca "$T/ca.pem")
fi

say "== 3 hosts (namespaces $PREFIX-h0..h2 on switch $PREFIX-sw): ${IP[*]}"
cluster="m0=$SCHEME://${IP[0]}:2380,m1=$SCHEME://${IP[1]}:2380,m2=$SCHEME://${IP[2]}:2380"
for i in 0 1 2; do
  "$HOSTS" exec "$PREFIX" "h$i" etcd --name "m$i" --data-dir "$OUT/etcd/m$i" \
    --listen-client-urls "$SCHEME://${IP[$i]}:2379" --advertise-client-urls "$SCHEME://${IP[$i]}:2379" \
    --listen-peer-urls "$SCHEME://${IP[$i]}:2380" --initial-advertise-peer-urls "$SCHEME://${IP[$i]}:2380" \
    --initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token "$PREFIX" \
    --pre-vote \
    "${ETCD_TLS[@]}" >"$OUT/etcd-m$i.log" 2>&1 &
  PIDS+=($!)
done
ENDPOINTS="${IP[0]}:2379,${IP[1]}:2379,${IP[2]}:2379"
# etcd_health HOST: "healthy" members as HOST sees them, e.g. "3/3".
etcd_health() {
  local urls="$SCHEME://${IP[0]}:2379,$SCHEME://${IP[1]}:2379,$SCHEME://${IP[2]}:2379" n
  n=$(ETCDCTL_API=3 timeout 10 "$HOSTS" exec "$PREFIX" "$1" etcdctl --endpoints "$urls" \
    "${ETCDCTL_TLS[@]}" --dial-timeout 1s --command-timeout 2s endpoint health 2>&1 |
    grep -c "is healthy" || true)
  echo "$n/3"
}
# etcd_raft_leader HOST: the endpoint of etcd's raft leader, as HOST sees it.
etcd_raft_leader() {
  local urls="$SCHEME://${IP[0]}:2379,$SCHEME://${IP[1]}:2379,$SCHEME://${IP[2]}:2379"
  ETCDCTL_API=3 timeout 10 "$HOSTS" exec "$PREFIX" "$1" etcdctl --endpoints "$urls" \
    "${ETCDCTL_TLS[@]}" --dial-timeout 1s --command-timeout 2s endpoint status -w json 2>/dev/null |
    python3 -c '
import json, sys
for e in json.load(sys.stdin):
    if e["Status"]["header"]["member_id"] == e["Status"]["leader"]:
        print(e["Endpoint"])
' 2>/dev/null || true
}
for _ in $(seq 100); do [ "$(etcd_health h0)" = 3/3 ] && break; sleep 0.2; done
[ "$(etcd_health h0)" = 3/3 ] || fail "the etcd cluster did not become healthy"
say "== etcd: m0 m1 m2 healthy (--state etcd://$ENDPOINTS/netns)"

# sctl HOST [ARGS...]: shardctl run on HOST against $ASK: every replica,
# except while h0 is cut off, when the demo's own polls ask only h1's and
# h2's (so that each answer is timely: a call to a host whose link is down
# waits for its deadline). The workers are always given all three.
REPLICAS="${IP[0]}:7070,${IP[1]}:7070,${IP[2]}:7070"
SURVIVORS="${IP[1]}:7070,${IP[2]}:7070"
ASK="$REPLICAS"
sctl() {
  local h="$1"; shift
  timeout 20 "$HOSTS" exec "$PREFIX" "$h" env SHARDLINE_COORDINATOR="$ASK" \
    "$SHARDCTL_BIN" "${CLIENT_TLS[@]}" "$@"
}
# role I: replica I's role from its log's last election line: LEADER
# ("elected leader"), FOLLOWER ("following ..."), CANDIDATE ("no longer the
# leader", or nothing yet).
role() {
  local last
  last=$(grep -E ": (elected leader|no longer the leader|following )" "$OUT/coordinator-h$1.log" 2>/dev/null | tail -n 1)
  case "$last" in
    *": elected leader"*) echo LEADER ;;
    *": following "*) echo FOLLOWER ;;
    *) echo CANDIDATE ;;
  esac
}
roles() { echo "h0=$(role 0) h1=$(role 1) h2=$(role 2)"; }
# served_at I: when replica I last logged "serving as the leader" (epoch s).
served_at() {
  local t
  t=$(grep ": serving as the leader" "$OUT/coordinator-h$1.log" | tail -n 1 | cut -d' ' -f1)
  [ -n "$t" ] && date -d "$t" +%s.%N
}
start_replica() {  # start_replica I
  local i="$1"
  "$HOSTS" exec "$PREFIX" "h$i" "$COORDINATOR_BIN" --listen "${IP[$i]}:7070" --advertise "${IP[$i]}:7070" \
    --state "etcd://$ENDPOINTS/netns" --lease-ttl "$LEASE_TTL" --metrics-port 9464 \
    "${ETCD_CLIENT_TLS[@]}" "${COORD_TLS[@]}" >"$OUT/coordinator-h$i.out" 2>"$OUT/coordinator-h$i.log" &
  PIDS+=($!)
  REPLICA_PID[$i]=$!
}
declare -A REPLICA_PID
replica_alive() {  # replica_alive I: fails (with its log) when replica I exited
  kill -0 "${REPLICA_PID[$1]}" 2>/dev/null ||
    fail "h$1's replica exited: $(head -n 2 "$OUT/coordinator-h$1.log" 2>/dev/null)"
}
# h0's replica first, so that it is the first leader; then the other two.
start_replica 0
for _ in $(seq 150); do
  replica_alive 0
  grep -q ": serving as the leader" "$OUT/coordinator-h0.log" && break
  sleep 0.2
done
[ "$(role 0)" = LEADER ] || fail "h0's replica did not become the leader"
start_replica 1
start_replica 2
for _ in $(seq 150); do
  replica_alive 1
  replica_alive 2
  [ "$(roles)" = "h0=LEADER h1=FOLLOWER h2=FOLLOWER" ] && break
  sleep 0.2
done
say "== replicas: $(roles)"
[ "$(roles)" = "h0=LEADER h1=FOLLOWER h2=FOLLOWER" ] || fail "not h0 leading and h1, h2 following"
# shardctl's view, for the record (GetStatus, served by every replica).
sctl h1 status 2>&1 | tee -a "$SUMMARY" || true

created=0
for _ in 1 2 3 4 5; do
  if sctl h1 job create "$OUT/job.yaml" --id netns >/dev/null 2>"$OUT/create.err"; then created=1; break; fi
  grep -q "already exists" "$OUT/create.err" && { created=1; break; }
  sleep 1
done
[ $created -eq 1 ] || fail "job create: $(cat "$OUT/create.err")"

job_now() {  # "PHASE GENERATION WORLD" from the leader, asked from HOST
  sctl "$1" job get netns --json 2>/dev/null |
    python3 -c 'import json, sys; j = json.load(sys.stdin); print(j.get("phase", ""), j.get("generation", ""), j.get("world_size", ""))' 2>/dev/null || true
}
max_step() {  # max_step HOST...: the highest step the workers of those hosts logged
  local f h
  for h in "$@"; do
    for f in "$OUT/$h"-w*.log; do
      if [ -f "$f" ]; then sed -n 's/.* step \([0-9]*\)\/.*/\1/p' "$f"; fi
    done
  done | sort -n | tail -1
}

WORKERS=(h0-w0 h1-w0 h1-w1 h2-w0 h2-w1)
for w in "${WORKERS[@]}"; do
  h=${w%%-*}
  "$HOSTS" exec "$PREFIX" "$h" env SHARDLINE_COORDINATOR="$REPLICAS" "$WORKER_BIN" --job netns \
    --worker-id "$w" --host "$h" --interface "$("$HOSTS" addr "$PREFIX" "$h")" "${CLIENT_TLS[@]}" \
    --log-interval 1 --connect-timeout 30s >"$OUT/$w.log" 2>&1 &
  PIDS+=($!)
done
say "== 5 workers: h0-w0 on h0, h1-w0 h1-w1 on h1, h2-w0 h2-w1 on h2; each is given all three replicas"
for _ in $(seq 1200); do
  s=$(max_step h0 h1 h2)  # rank 0 logs the steps, on whichever host it is
  [ -n "$s" ] && [ "$s" -ge "$CUT_AT_STEP" ] && break
  sleep 0.05
done
if [ -z "$s" ] || [ "$s" -lt "$CUT_AT_STEP" ]; then fail "training did not reach step $CUT_AT_STEP"; fi
read -r _ gen1 world1 <<<"$(job_now h1)"
[ "$(role 0)" = LEADER ] || fail "h0's replica is not the leader before the cut: $(roles)"
h0_role="a rank"
if grep -q ": spare (world" "$OUT/h0-w0.log"; then h0_role=spare; fi

raft_leader=$(etcd_raft_leader h1)
CUT_AT=$(date +%s.%N)
ASK="$SURVIVORS"
if [ "$FAULT" = kill ]; then
  kill -9 "${REPLICA_PID[0]}"
  say "== step $s (generation $gen1, world $world1): kill -9 of h0's replica, the leader (h0's etcd m0 and h0-w0, $h0_role, stay up)"
else
  "$HOSTS" cut "$PREFIX" h0
  say "== step $s (generation $gen1, world $world1): cut h0's link; h0 held the leader, etcd m0 and h0-w0 ($h0_role)"
fi
[ "$FAULT" = kill ] || case "$raft_leader" in
  *"//${IP[0]}:"*) say "   m0 was also etcd's raft leader: etcd elects another first, which renews every lease" ;;
  *) say "   etcd's raft leader was ${raft_leader:-unknown}, not on h0" ;;
esac

# A new leader: h1's or h2's replica (its log says when it began serving).
new=""
for _ in $(seq 300); do
  for i in 1 2; do
    # (h1's and h2's replicas never led before the cut.)
    if [ "$(role "$i")" = LEADER ] && grep -q ": serving as the leader" "$OUT/coordinator-h$i.log"; then
      new=$i
    fi
  done
  [ -n "$new" ] && break
  sleep 0.1
done
[ -n "$new" ] || fail "no replica on h1 or h2 took over within 30 s: $(roles)"
new_leader="${IP[$new]}:7070"
FAILOVER=$(awk -v a="$CUT_AT" -v b="$(served_at "$new")" 'BEGIN{printf "%.2f", b-a}')
say "new leader: h$new's replica ($new_leader), serving ${FAILOVER} s after the cut (lease TTL $LEASE_TTL); etcd $(etcd_health h1) healthy as h1 sees it"
grep -h ": no longer the leader" "$OUT/coordinator-h0.log" | tail -n 1 | sed 's/^/  h0: /' | tee -a "$SUMMARY" || true
sctl h1 status 2>&1 | tee -a "$SUMMARY" || true

# Training goes on under the new leader: it commits a checkpoint of a
# step past the one of the cut (a re-formed job restores an earlier one
# first), and steps are trained.
committed_past() {  # the highest step the new leader committed, if past $s
  sed -n 's/.*checkpoint committed job=netns .* step=\([0-9]*\).*/\1/p' "$OUT/coordinator-h$new.log" |
    sort -n | tail -n 1
}
c=""
for _ in $(seq 1200); do
  c=$(committed_past)
  [ -n "$c" ] && [ "$c" -gt "$s" ] && break
  sleep 0.1
done
if [ -z "$c" ] || [ "$c" -le "$s" ]; then
  fail "the new leader committed no checkpoint past step $s (last: ${c:-none})"
fi
read -r phase2 gen2 world2 <<<"$(job_now h1)"
say "training goes on: the new leader committed the checkpoint of step $c; the job is $phase2, generation $gen2, world $world2"
grep -h "checkpoint committed job=netns" "$OUT/coordinator-h$new.log" | head -n 1 | sed 's/^/  /' | tee -a "$SUMMARY" || true
grep -h "generation [2-9] rank .* communicators ready" "$OUT"/h[12]-w*.log | sed 's/^/  /' | tee -a "$SUMMARY" || true
sctl h1 members netns | tee -a "$SUMMARY" || true

if [ "$FAULT" = kill ]; then
  say "== starting h0's replica again: it follows"
  start_replica 0
else
  say "== healing h0's link: its etcd member catches up, its replica stays a follower"
  "$HOSTS" heal "$PREFIX" h0
fi
for _ in $(seq 300); do
  [ "$(role 0)" = FOLLOWER ] && [ "$(etcd_health h0)" = 3/3 ] && break
  sleep 0.1
done
say "replicas: $(roles); etcd $(etcd_health h0) healthy"
[ "$(role 0)" = FOLLOWER ] || fail "h0's replica is not a follower after the heal: $(roles)"
grep -h ": following " "$OUT/coordinator-h0.log" | tail -n 1 | sed 's/^/  h0: /' | tee -a "$SUMMARY" || true
[ "$(role "$new")" = LEADER ] || fail "the leader changed again after the heal: $(roles)"
ASK="$REPLICAS"

deadline=$((SECONDS + 300))
while [ $SECONDS -lt $deadline ]; do
  read -r phase _ _ <<<"$(job_now h1)"
  [ "$phase" = JOB_PHASE_COMPLETED ] && break
  sleep 0.5
done
read -r phase gen world <<<"$(job_now h1)"
[ "$phase" = JOB_PHASE_COMPLETED ] || fail "the job did not complete (phase $phase)"
say "== job COMPLETED at generation $gen, world $world, under leader $new_leader"
grep -h " step $STEPS/$STEPS " "$OUT"/h*-w*.log | head -1 | sed 's/^/  /' | tee -a "$SUMMARY" || true
sctl h1 members netns | tee -a "$SUMMARY" || true
sctl h1 checkpoints netns | tee -a "$SUMMARY" || true
sctl h1 status 2>&1 | tee -a "$SUMMARY" || true
say "events:"
timeout 20 "$HOSTS" exec "$PREFIX" h1 env SHARDLINE_COORDINATOR="$REPLICAS" "$SHARDCTL_BIN" "${CLIENT_TLS[@]}" \
  watch netns --after 0 2>"$OUT/watch.err" | tee "$OUT/watch.out" |
  grep -E "lost|formed|phase|fenc|grow|ended|leader" | sed 's/^/  /' | tee -a "$SUMMARY" || true
say "OK: leader on h0 lost ($FAULT) at step $s, $new_leader led ${FAILOVER} s later, training went on, job completed"
