#!/usr/bin/env bash
# Checks the deployment files with what this machine can check them with
# (no systemd running, no docker, no Kubernetes, no Slurm here):
#   * shellcheck on every deploy shell script (ours strictly; deploy/local and
#     install_deps.sh at error level, their warnings shown),
#   * systemd: `systemd-analyze verify` on the units (when it is installed),
#     the env files define every variable the units use, and the worker
#     template's ExecStart, run through sh with stand-in binaries, gives the
#     slot's worker id and device; its flags are the real worker's, the
#     coordinator units' the real coordinator's; etcd.default's variables
#     are flags of the installed etcd,
#   * container: the Dockerfile's stages, COPY sources, Bazel targets and
#     copied files exist; the runtime stage installs the packages that provide
#     every library the built binaries link (ldd + dpkg); the entrypoint,
#     run with stand-in binaries, passes flags the real programs accept,
#   * Kubernetes: every file parses as YAML (python3-yaml), the one-
#     coordinator set (deploy/k8s/*.yaml) and the replicas' set (ha/*.yaml
#     with checkpoints.yaml and jobs.yaml) each on its own; names referenced
#     (PVCs, ConfigMaps, ports, labels) are defined; the replicas' and etcd's
#     StatefulSets, headless Services, anti-affinity, disruption budgets and
#     the addresses they name agree; the probe path is served by a real
#     coordinator's metrics endpoint; the ConfigMap's job spec is accepted by
#     the real coordinator (shardctl job create); the coordinators' flags
#     are the real coordinator's, etcd's variables the installed etcd's;
#     two real replicas on a real etcd both answer that path (a follower is
#     as ready as the leader),
#   * TLS material: ha/certs.sh's certificates verify against its CA, name
#     what they are given, and a real etcd run with them (client certificate
#     required) accepts the coordinators' client certificate and refuses a
#     client without one,
#   * Slurm: shellcheck; the worker task script, run with stand-ins and
#     Slurm's variables, gives NODE:LOCALID and cuda:LOCALID; the batch
#     script, run with stand-in scontrol/srun/shardctl, starts its own
#     coordinator, or none when given a list of external replicas,
#   * secrets (docs/SECURITY.md): no deploy file ships a usable token, no
#     token is put on a command line, and every coordinator that listens
#     beyond loopback is started with TLS; etcd is served over TLS with
#     client certificates, to clients and peers, and reached with them.
#
#   deploy_files_test.sh COORDINATOR WORKER SHARDCTL   (cwd: the runfiles root)
# Patterns are meant literally (SC2016); word lists are flag names (SC2013).
# shellcheck disable=SC2016,SC2013,SC2015
set -uo pipefail
COORDINATOR="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
WORKER="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"
SHARDCTL="$(cd "$(dirname "$3")" && pwd)/$(basename "$3")"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
export TMP
export PATH="$PATH:/usr/sbin:/sbin"
unset SHARDLINE_COORDINATOR SHARDLINE_TOKEN SHARDLINE_ADMIN_TOKEN
# Files of the root package (README.md, deploy/install_deps.sh) are not
# exported to Bazel, so not in the runfiles: look them up in the source tree
# the runfiles links point into.
SRC="$(cd "$(dirname "$(readlink -f deploy/container/Dockerfile)")/../.." && pwd)"
src() { if [ -e "$1" ]; then echo "$1"; else echo "$SRC/$1"; fi; }
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3  # Debian's, with python3-yaml
fails=0
ok() { echo "[  OK  ] $*"; }
bad() { echo "[FAILED] $*"; fails=$((fails + 1)); }
skip() { echo "[ SKIP ] $*"; }
# check NAME COMMAND...: OK when COMMAND succeeds; its output shown when not.
check() {
  local name="$1"; shift
  if "$@" >"$TMP/check.out" 2>&1; then ok "$name"; else bad "$name"; sed 's/^/    /' "$TMP/check.out"; fi
}

# A directory of stand-in programs that print their arguments, one a line.
STUBS="$TMP/stubs"
mkdir -p "$STUBS"
for p in shardline-coordinator shardline-worker shardctl; do
  printf '#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n' >"$STUBS/$p"
  chmod +x "$STUBS/$p"
done
# flags_known BINARY ARGS_FILE: every --flag in ARGS_FILE is in BINARY --help.
flags_known() {
  local help
  help=$("$1" --help 2>&1)
  local f missing=0
  for f in $(grep -o '^--[a-z0-9-]*' "$2" | sort -u); do
    grep -q -- "$f" <<<"$help" || { echo "$(basename "$1") has no flag $f"; missing=1; }
  done
  return $missing
}

echo "== shellcheck"
if command -v shellcheck >/dev/null; then
  ours=(deploy/netns/*.sh deploy/container/entrypoint.sh deploy/slurm/shardline.sbatch deploy/slurm/worker.sh
    deploy/k8s/ha/certs.sh)
  check "shellcheck: ${ours[*]}" shellcheck -x "${ours[@]}"
  others=()
  for f in "$(src deploy/install_deps.sh)" deploy/local/*.sh; do [ -f "$f" ] && others+=("$f"); done
  if [ ${#others[@]} -gt 0 ]; then
    check "shellcheck --severity=error: ${others[*]}" shellcheck --severity=error "${others[@]}"
    shellcheck --severity=warning "${others[@]}" >"$TMP/warn.out" 2>&1 ||
      { echo "    (warnings, not failing this test:)"; grep -E '^In |SC[0-9]+ \((warning|error)\)' "$TMP/warn.out" | sed 's/^/    /'; }
  fi
else
  skip "shellcheck is not installed (deploy/install_deps.sh installs it)"
fi

echo "== systemd"
SD="$TMP/systemd"
mkdir -p "$SD/bin"
cp "$STUBS"/* "$SD/bin/"
for u in deploy/systemd/*.service; do
  sed "s|/usr/local/bin/|$SD/bin/|g" "$u" >"$SD/$(basename "$u")"
done
cp "$SD/shardline-worker@.service" "$SD/shardline-worker@3.service"
if command -v systemd-analyze >/dev/null; then
  verify() {
    # Any line about our units is a finding (unknown keys only warn, rc 0).
    SYSTEMD_LOG_LEVEL=info systemd-analyze verify --man=no "$@" >"$TMP/verify.out" 2>&1
    local rc=$?
    grep -E "shardline-(coordinator|worker)" "$TMP/verify.out" && return 1
    [ $rc -eq 0 ] || { cat "$TMP/verify.out"; return 1; }
  }
  check "systemd-analyze verify shardline-coordinator.service shardline-coordinator-replica.service shardline-worker@3.service" \
    verify "$SD/shardline-coordinator.service" "$SD/shardline-coordinator-replica.service" \
    "$SD/shardline-worker@3.service"
else
  skip "systemd-analyze is not installed: units checked by the steps below only"
fi
# env_vars_defined UNIT ENV_FILE...: every $VAR / ${VAR} that systemd expands
# in ExecStart (not $$VAR: the shell's) is set in one of the env files.
env_vars_defined() {
  local unit="$1"; shift
  local line v missing=0
  line=$(grep '^ExecStart=' "$unit" | sed 's/\$\$[{]\{0,1\}[A-Za-z_]*//g')
  for v in $(grep -o '\${\{0,1\}[A-Z_]*' <<<"$line" | tr -d '${' | sort -u); do
    grep -q "^$v=" "$@" || { echo "$unit uses \$$v, not set in $*"; missing=1; }
  done
  return $missing
}
check "coordinator.env sets what shardline-coordinator.service uses" \
  env_vars_defined deploy/systemd/shardline-coordinator.service deploy/systemd/coordinator.env
check "coordinator-replica.env sets what shardline-coordinator-replica.service uses" \
  env_vars_defined deploy/systemd/shardline-coordinator-replica.service deploy/systemd/coordinator-replica.env
check "worker.env sets what shardline-worker@.service uses" \
  env_vars_defined deploy/systemd/shardline-worker@.service deploy/systemd/worker.env
# The worker template's ExecStart as systemd would run it for slot 3 on host
# node7: %i, %H and $$ resolved, the environment from worker.env.
run_worker_unit() {  # DEVICE_KIND
  local cmd
  cmd=$(sed -n 's/^ExecStart=//p' "$SD/shardline-worker@.service" |
    sed -e 's/%i/3/g' -e 's/%H/node7/g' -e 's/\$\$/$/g')
  (
    set -a
    # shellcheck disable=SC1091
    . deploy/systemd/worker.env
    set +a
    export SHARDLINE_DEVICE_KIND="$1"
    eval "$cmd"
  )
}
worker_unit_args() {
  run_worker_unit cuda >"$TMP/unit-cuda.args" || return 1
  run_worker_unit cpu >"$TMP/unit-cpu.args" || return 1
  grep -qx -- "--worker-id" "$TMP/unit-cuda.args" && grep -qx "node7:3" "$TMP/unit-cuda.args" &&
    grep -A1 -x -- "--device" "$TMP/unit-cuda.args" | grep -qx "cuda:3" &&
    grep -A1 -x -- "--device" "$TMP/unit-cpu.args" | grep -qx "cpu" &&
    grep -A1 -x -- "--job" "$TMP/unit-cpu.args" | grep -qx "shakespeare" ||
    { cat "$TMP/unit-cuda.args"; return 1; }
}
check "shardline-worker@3 runs --worker-id node7:3, --device cuda:3 (cuda) or cpu" worker_unit_args
check "shardline-worker@.service passes only flags shardline-worker has" \
  flags_known "$WORKER" "$TMP/unit-cuda.args"
sed -n 's/^ExecStart=//p' deploy/systemd/shardline-coordinator.service | tr ' ' '\n' >"$TMP/unit-coord.args"
check "shardline-coordinator.service passes only flags shardline-coordinator has" \
  flags_known "$COORDINATOR" "$TMP/unit-coord.args"
sed -n 's/^ExecStart=//p' deploy/systemd/shardline-coordinator-replica.service | tr ' ' '\n' >"$TMP/unit-replica.args"
check "shardline-coordinator-replica.service passes only flags shardline-coordinator has" \
  flags_known "$COORDINATOR" "$TMP/unit-replica.args"
# The replica unit's state is etcd, reached with TLS and a client certificate.
replica_unit_etcd() {
  local rc=0 f
  grep -q '^SHARDLINE_STATE=etcd://[^/]*,[^/]*,[^/]*/[A-Za-z0-9._-]' deploy/systemd/coordinator-replica.env ||
    { echo "coordinator-replica.env: SHARDLINE_STATE is not etcd://THREE,MEMBERS,.../PREFIX"; rc=1; }
  for f in --state --advertise --etcd-ca --etcd-cert --etcd-key --lease-ttl; do
    grep -qx -- "$f" "$TMP/unit-replica.args" || { echo "the replica unit does not pass $f"; rc=1; }
  done
  grep -q '^Conflicts=shardline-coordinator.service' deploy/systemd/shardline-coordinator-replica.service ||
    { echo "the replica unit may run beside the single coordinator"; rc=1; }
  return $rc
}
check "shardline-coordinator-replica.service: state in etcd, --advertise, TLS to etcd" replica_unit_etcd
# etcd_flags_known FILE: every ETCD_X_Y in FILE (VAR=... lines, or
# YAML "name: VAR") is a flag --x-y of the installed etcd.
etcd_flags_known() {
  local help v f missing=0
  help=$(etcd --help 2>&1) || true
  grep -q -- '--initial-cluster' <<<"$help" || { echo "etcd --help lists no --initial-cluster"; return 1; }
  for v in $(sed -n -e 's/^\(ETCD_[A-Z_]*\)=.*/\1/p' -e 's/.*name: \(ETCD_[A-Z_]*\).*/\1/p' "$1" | sort -u); do
    f="--$(tr 'A-Z_' 'a-z-' <<<"${v#ETCD_}")"
    grep -q -- "$f" <<<"$help" || { echo "$1: $v: etcd has no flag $f"; missing=1; }
  done
  return $missing
}
if command -v etcd >/dev/null; then
  check "etcd.default sets only real etcd flags" etcd_flags_known deploy/systemd/etcd.default
else
  bad "etcd is not installed (deploy/install_deps.sh installs etcd-server): etcd.default cannot be checked"
fi
# etcd.default: one member of three, TLS with client certificates for
# clients and peers, the metrics URL on loopback only.
etcd_default_cluster() {
  local rc=0 name
  # shellcheck disable=SC1091
  ( set -a; . deploy/systemd/etcd.default; set +a
    [ "$ETCD_INITIAL_CLUSTER_STATE" = new ] || { echo "ETCD_INITIAL_CLUSTER_STATE is not new"; exit 1; }
    [ "$(tr ',' '\n' <<<"$ETCD_INITIAL_CLUSTER" | wc -l)" -eq 3 ] || { echo "ETCD_INITIAL_CLUSTER has not 3 members"; exit 1; }
    grep -q "\(^\|,\)$ETCD_NAME=$ETCD_INITIAL_ADVERTISE_PEER_URLS\(,\|$\)" <<<"$ETCD_INITIAL_CLUSTER" ||
      { echo "$ETCD_NAME=$ETCD_INITIAL_ADVERTISE_PEER_URLS is not in ETCD_INITIAL_CLUSTER"; exit 1; }
    for u in "$ETCD_LISTEN_CLIENT_URLS" "$ETCD_ADVERTISE_CLIENT_URLS" "$ETCD_LISTEN_PEER_URLS" \
      "$ETCD_INITIAL_ADVERTISE_PEER_URLS" $(tr ',' ' ' <<<"$ETCD_INITIAL_CLUSTER" | sed 's/[^ =]*=//g'); do
      case "$u" in https://*) ;; *) echo "$u is not https"; exit 1 ;; esac
    done
    case "$ETCD_LISTEN_METRICS_URLS" in http://127.0.0.1:* | http://localhost:*) ;;
      *) echo "ETCD_LISTEN_METRICS_URLS beyond loopback: $ETCD_LISTEN_METRICS_URLS"; exit 1 ;; esac
    [ "$ETCD_CLIENT_CERT_AUTH" = true ] && [ "$ETCD_PEER_CLIENT_CERT_AUTH" = true ] ||
      { echo "client or peer certificates are not required"; exit 1; }
    [ "${ETCD_PRE_VOTE:-}" = true ] || { echo "ETCD_PRE_VOTE is not true (a returning member deposes the raft leader)"; exit 1; }
    [ -n "$ETCD_TRUSTED_CA_FILE" ] && [ -n "$ETCD_PEER_TRUSTED_CA_FILE" ] && [ -n "$ETCD_CERT_FILE" ] &&
      [ -n "$ETCD_KEY_FILE" ] && [ -n "$ETCD_PEER_CERT_FILE" ] && [ -n "$ETCD_PEER_KEY_FILE" ] ||
      { echo "a TLS file is not set"; exit 1; }
    # The replicas reach every member of the cluster.
    state=$(sed -n 's/^SHARDLINE_STATE=etcd:\/\/\([^/]*\)\/.*/\1/p' deploy/systemd/coordinator-replica.env)
    for name in $(tr ',' ' ' <<<"$ETCD_INITIAL_CLUSTER" | sed 's/[^ =]*=https:\/\///g; s/:[0-9]*//g'); do
      grep -q "$name:" <<<"$state" || { echo "SHARDLINE_STATE ($state) does not list the member on $name"; exit 1; }
    done
  ) || rc=1
  return $rc
}
check "etcd.default: one of three members, pre-vote, TLS with client certificates, metrics on loopback" etcd_default_cluster

echo "== container"
DF=deploy/container/Dockerfile
# The Dockerfile's instructions, continuation lines joined.
sed -e ':a' -e '/\\$/N; s/\\\n//; ta' "$DF" | grep -v '^[[:space:]]*#' | grep -v '^[[:space:]]*$' >"$TMP/df.txt"
dockerfile_structure() {
  local rc=0 stages
  grep -q '^FROM debian:12' "$TMP/df.txt" || { echo "no FROM debian:12"; rc=1; }
  grep -E '^FROM ' "$TMP/df.txt" | grep -vE '^FROM (scratch|debian:12(-slim)?)( |$)' && { echo "a base image that is not Debian 12"; rc=1; }
  stages=$(sed -n 's/^FROM .* AS \([a-z0-9_-]*\)$/\1/p' "$TMP/df.txt")
  local s
  for s in $(grep -o -- '--from=[a-z0-9_-]*' "$TMP/df.txt" | cut -d= -f2); do
    grep -qx "$s" <<<"$stages" || { echo "COPY --from=$s: no such stage"; rc=1; }
  done
  # COPY sources from the build context (the repository root).
  local line src
  while read -r line; do
    # shellcheck disable=SC2086
    set -- $line
    shift
    while [ $# -gt 1 ]; do
      src="$1"; shift
      case "$src" in --*) continue ;; .) continue ;; esac
      [ -e "$(src "$src")" ] || { echo "COPY source $src does not exist"; rc=1; }
    done
  done < <(grep -E '^COPY ' "$TMP/df.txt" | grep -v -- '--from=')
  # Files the build stage copies out of the source tree.
  for src in deploy/install_deps.sh deploy/container/entrypoint.sh data/tinyshakespeare.txt \
    README.md deploy/jobs/shakespeare.yaml; do
    grep -q "$src" "$DF" || continue
    [ -e "$(src "$src")" ] || { echo "$DF uses $src, which does not exist"; rc=1; }
  done
  grep -q 'bazel --batch build' "$TMP/df.txt" || { echo "no offline 'bazel --batch build'"; rc=1; }
  grep -q 'ENTRYPOINT \["/opt/shardline/bin/entrypoint.sh"\]' "$TMP/df.txt" || { echo "ENTRYPOINT is not the installed entrypoint.sh"; rc=1; }
  grep -q 'deploy/container/entrypoint.sh /out/opt/shardline/bin/' "$TMP/df.txt" || { echo "entrypoint.sh is not installed into /opt/shardline/bin"; rc=1; }
  return $rc
}
check "Dockerfile: Debian 12 stages, COPY sources and copied files exist" dockerfile_structure
bazel_targets_built() {
  local t path rc=0
  for t in $(grep -o '//[a-z/_]*:[A-Za-z0-9_.-]*' "$TMP/df.txt" | sort -u); do
    path="${t#//}"; path="${path/://}"
    if [ -e "$path" ]; then echo "$t: built"; continue; fi
    case "$t" in
      //worker/gpu:libshardline_gpu.so) echo "$t: not built here (no CUDA config)";;
      *) echo "$t: not among this test's built inputs"; rc=1 ;;
    esac
  done
  return $rc
}
check "Dockerfile's Bazel targets are real (built for this test)" bazel_targets_built
# The runtime stage's packages provide every library the binaries link.
runtime_packages_cover_ldd() {
  command -v dpkg >/dev/null || { echo "no dpkg"; return 0; }
  local listed closure lib pkg rc=0
  listed=$(awk '/^FROM debian:12-slim/ {rt=1} rt && /apt-get install/' "$TMP/df.txt" |
    sed 's/.*--no-install-recommends//; s/;.*//' | tr ' ' '\n' | grep -v '^$')
  [ -n "$listed" ] || { echo "no apt-get install in the runtime stage"; return 1; }
  # The listed packages and what they depend on, recursively.
  # shellcheck disable=SC2086
  closure=$( { echo "$listed"; apt-cache depends --recurse --no-recommends --no-suggests \
    --no-conflicts --no-breaks --no-replaces --no-enhances $listed 2>/dev/null |
    grep -v '^ ' | grep -v '^<'; } | sort -u)
  for lib in $(ldd "$COORDINATOR" "$WORKER" "$SHARDCTL" | awk '/=> \// {print $3}' | sort -u); do
    pkg=$(dpkg -S "$(readlink -f "$lib")" 2>/dev/null | head -1 | cut -d: -f1)
    [ -n "$pkg" ] || pkg=$(dpkg -S "$lib" 2>/dev/null | head -1 | cut -d: -f1)
    [ -n "$pkg" ] || { echo "$lib: no Debian package (not checked)"; continue; }
    case "$pkg" in libc6 | libgcc-s1 | libstdc++6) continue ;; esac  # in debian:12-slim
    grep -qx "$pkg" <<<"$closure" || { echo "$lib ($pkg) is not installed by the runtime stage"; rc=1; }
  done
  return $rc
}
check "Dockerfile runtime stage installs every library the binaries link (ldd, dpkg -S)" runtime_packages_cover_ldd
entrypoint_args() {  # NAME PROGRAM [ARGS...]: runs entrypoint.sh with stand-ins
  local name="$1"; shift
  env -i PATH="$PATH" SHARDLINE_BIN_DIR="$STUBS" "${ENTRY_ENV[@]}" \
    sh deploy/container/entrypoint.sh "$@" >"$TMP/entry-$name.args"
}
entrypoint_checks() {
  local rc=0
  ENTRY_ENV=()
  entrypoint_args coordinator coordinator --tls-cert c.pem --tls-key k.pem || return 1
  grep -A1 -x -- --listen "$TMP/entry-coordinator.args" | grep -qx "0.0.0.0:7070" || { echo "coordinator --listen"; rc=1; }
  grep -A1 -x -- --metrics-port "$TMP/entry-coordinator.args" | grep -qx 9464 || { echo "coordinator --metrics-port"; rc=1; }
  ENTRY_ENV=(SHARDLINE_JOB=j JOB_COMPLETION_INDEX=4 POD_IP=10.1.2.3 SHARDLINE_DEVICE=cuda SHARDLINE_LOCAL_RANK=2)
  entrypoint_args worker worker --log-interval 50 || return 1
  grep -A1 -x -- --worker-id "$TMP/entry-worker.args" | grep -qx "worker-4" || { echo "worker id from JOB_COMPLETION_INDEX"; rc=1; }
  grep -A1 -x -- --interface "$TMP/entry-worker.args" | grep -qx "10.1.2.3" || { echo "interface from POD_IP"; rc=1; }
  grep -A1 -x -- --device "$TMP/entry-worker.args" | grep -qx "cuda:2" || { echo "device cuda:LOCAL_RANK"; rc=1; }
  ENTRY_ENV=(SHARDLINE_JOB=j SLURM_PROCID=7)
  entrypoint_args worker-slurm worker || return 1
  grep -A1 -x -- --worker-id "$TMP/entry-worker-slurm.args" | grep -qx "worker-7" || { echo "worker id from SLURM_PROCID"; rc=1; }
  ENTRY_ENV=()
  entrypoint_args nojob worker 2>/dev/null && { echo "worker without SHARDLINE_JOB did not fail"; rc=1; }
  entrypoint_args shardctl shardctl job list || return 1
  [ "$(cat "$TMP/entry-shardctl.args")" = "$(printf 'job\nlist')" ] || { echo "shardctl args"; rc=1; }
  flags_known "$COORDINATOR" "$TMP/entry-coordinator.args" || rc=1
  flags_known "$WORKER" "$TMP/entry-worker.args" || rc=1
  return $rc
}
check "entrypoint.sh: coordinator/worker/shardctl, ids and devices from the environment, real flags" entrypoint_checks

echo "== Kubernetes"
# The manifests' checker: MODE single (deploy/k8s/*.yaml) or ha (ha/*.yaml
# with the shared checkpoints.yaml and jobs.yaml), then the files.
cat >"$TMP/k8s_check.py" <<'PYEOF'
import copy, os, sys, yaml
TMP = os.environ["TMP"]
mode = sys.argv[1]
docs = []
for path in sys.argv[2:]:
    with open(path) as f:
        for d in yaml.safe_load_all(f):
            if d is not None:
                docs.append((path, d))
errors = []
paths = set()
by_kind = {}
for path, d in docs:
    for key in ("apiVersion", "kind", "metadata"):
        if key not in d:
            errors.append(f"{path}: a document without {key}")
    by_kind.setdefault(d.get("kind"), {})[d["metadata"]["name"]] = d
print("kinds:", {k: sorted(v) for k, v in by_kind.items()})
def pod_specs():
    for kind in ("Deployment", "Job", "StatefulSet"):
        for name, d in by_kind.get(kind, {}).items():
            yield kind, name, d["spec"]["template"]
def labels_match(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())
for kind, name, tpl in pod_specs():
    spec = tpl["spec"]
    for v in spec.get("volumes", []):
        if "persistentVolumeClaim" in v and v["persistentVolumeClaim"]["claimName"] not in by_kind.get("PersistentVolumeClaim", {}):
            errors.append(f"{kind} {name}: PVC {v['persistentVolumeClaim']['claimName']} is not defined")
        if "configMap" in v and v["configMap"]["name"] not in by_kind.get("ConfigMap", {}):
            errors.append(f"{kind} {name}: ConfigMap {v['configMap']['name']} is not defined")
    volumes = {v["name"] for v in spec.get("volumes", [])}
    volumes |= {t["metadata"]["name"] for t in by_kind[kind][name]["spec"].get("volumeClaimTemplates", [])}
    for c in spec["containers"]:
        ports = {p["name"] for p in c.get("ports", [])}
        for m in c.get("volumeMounts", []):
            if m["name"] not in volumes:
                errors.append(f"{kind} {name}: mount of undefined volume {m['name']}")
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            p = c.get(probe)
            if not p:
                continue
            port = (p.get("httpGet") or p.get("tcpSocket") or {}).get("port")
            if isinstance(port, str) and port not in ports:
                errors.append(f"{kind} {name}: {probe} uses undefined port {port}")
    if kind in ("Deployment", "StatefulSet"):
        sel = by_kind[kind][name]["spec"]["selector"]["matchLabels"]
        if not labels_match(sel, tpl["metadata"]["labels"]):
            errors.append(f"{kind} {name}: selector does not match the pod labels")
def coordinator_container(tpl):
    for c in tpl["spec"]["containers"]:
        if c.get("args", [])[:1] == ["coordinator"]:
            return c
    return None
def http_probe_paths(c):
    return {p["httpGet"]["path"] for k in ("startupProbe", "readinessProbe", "livenessProbe")
            if (p := c.get(k)) and "httpGet" in p}
if mode == "single":
    # The coordinator: one replica, Recreate, state on a PVC, probes on /healthz.
    dep = by_kind.get("Deployment", {}).get("shardline-coordinator")
    if not dep:
        errors.append("no Deployment shardline-coordinator")
    else:
        if dep["spec"].get("replicas") != 1 or dep["spec"].get("strategy", {}).get("type") != "Recreate":
            errors.append("coordinator: want replicas 1 and strategy Recreate (one process per state file)")
        c = dep["spec"]["template"]["spec"]["containers"][0]
        if not c.get("readinessProbe") or not c.get("livenessProbe"):
            errors.append("coordinator: readiness and liveness probes wanted")
        paths = http_probe_paths(c)
    if "ReadWriteOnce" not in by_kind.get("PersistentVolumeClaim", {}).get("shardline-state", {}).get("spec", {}).get("accessModes", []):
        errors.append("shardline-state: want ReadWriteOnce")
for name, svc in by_kind.get("Service", {}).items():
    sel = svc["spec"]["selector"]
    if not any(labels_match(sel, tpl["metadata"]["labels"]) for _, _, tpl in pod_specs()):
        errors.append(f"Service {name}: selects no pod template")
# Workers: an indexed Job (the index is the slot) on the shared checkpoints.
jobs = by_kind.get("Job", {})
if not any(j["spec"].get("completionMode") == "Indexed" for j in jobs.values()) and not by_kind.get("StatefulSet"):
    errors.append("workers: want an indexed Job or a StatefulSet")
pvcs = by_kind.get("PersistentVolumeClaim", {})
if "ReadWriteMany" not in pvcs.get("shardline-checkpoints", {}).get("spec", {}).get("accessModes", []):
    errors.append("shardline-checkpoints: want ReadWriteMany")

def env_of(c):
    return {e["name"]: e for e in c.get("env", [])}
def port_of(c, name):
    return next((p["containerPort"] for p in c.get("ports", []) if p["name"] == name), None)
def pod_name_from_metadata(c, what):
    e = env_of(c).get("POD_NAME")
    if not e or e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") != "metadata.name":
        errors.append(f"{what}: POD_NAME is not the pod's metadata.name")
def secret_mount_paths(tpl, c):
    secrets = {v["name"] for v in tpl["spec"].get("volumes", []) if "secret" in v}
    return [m["mountPath"] for m in c.get("volumeMounts", []) if m["name"] in secrets]
def in_secret(tpl, c, path):
    return any(path.startswith(m.rstrip("/") + "/") for m in secret_mount_paths(tpl, c))
if mode == "ha":
    sts = by_kind.get("StatefulSet", {})
    svcs = by_kind.get("Service", {})
    pdbs = by_kind.get("PodDisruptionBudget", {})
    pods = {}  # StatefulSet name -> [pod DNS name under its Service]
    for name in ("shardline-etcd", "shardline-coordinator"):
        s = sts.get(name)
        if not s:
            errors.append(f"no StatefulSet {name}")
            continue
        sp, tpl = s["spec"], s["spec"]["template"]
        labels = tpl["metadata"]["labels"]
        if sp.get("replicas") != 3:
            errors.append(f"StatefulSet {name}: want 3 replicas, not {sp.get('replicas')}")
        if sp.get("podManagementPolicy") != "Parallel":
            errors.append(f"StatefulSet {name}: want podManagementPolicy Parallel (etcd needs its peers to be ready)")
        svc = svcs.get(sp.get("serviceName"))
        if not svc or svc["spec"].get("clusterIP") != "None" or svc["spec"].get("publishNotReadyAddresses") is not True:
            errors.append(f"StatefulSet {name}: serviceName {sp.get('serviceName')} is not a headless Service publishing not-ready pods")
        elif not labels_match(svc["spec"]["selector"], labels):
            errors.append(f"StatefulSet {name}: its Service does not select its pods")
        anti = tpl["spec"].get("affinity", {}).get("podAntiAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution", [])
        if not any(t.get("topologyKey") == "kubernetes.io/hostname" and labels_match(t["labelSelector"]["matchLabels"], labels) for t in anti):
            errors.append(f"StatefulSet {name}: no required anti-affinity of its pods across nodes")
        budget = [p for p in pdbs.values() if labels_match(p["spec"]["selector"]["matchLabels"], labels)]
        if len(budget) != 1 or not (budget[0]["spec"].get("maxUnavailable") == 1 or budget[0]["spec"].get("minAvailable") == 2):
            errors.append(f"StatefulSet {name}: want one PodDisruptionBudget with maxUnavailable 1 (or minAvailable 2)")
        pods[name] = [f"{name}-{i}.{sp.get('serviceName')}" for i in range(sp.get("replicas") or 0)]
    # etcd: members named by their pods, the initial cluster lists each one
    # at its peer URL, TLS with client certificates for clients and peers.
    etcd = sts.get("shardline-etcd")
    etcd_client_port = None
    if etcd:
        tpl = etcd["spec"]["template"]
        c = tpl["spec"]["containers"][0]
        env = {k: v.get("value") for k, v in env_of(c).items()}
        svc = etcd["spec"]["serviceName"]
        peer, etcd_client_port = port_of(c, "peer"), port_of(c, "client")
        pod_name_from_metadata(c, "etcd")
        want = {
            "ETCD_NAME": "$(POD_NAME)",
            "ETCD_INITIAL_ADVERTISE_PEER_URLS": f"https://$(POD_NAME).{svc}:{peer}",
            "ETCD_ADVERTISE_CLIENT_URLS": f"https://$(POD_NAME).{svc}:{etcd_client_port}",
            "ETCD_LISTEN_PEER_URLS": f"https://0.0.0.0:{peer}",
            "ETCD_LISTEN_CLIENT_URLS": f"https://0.0.0.0:{etcd_client_port}",
            "ETCD_INITIAL_CLUSTER": ",".join(f"{p.split('.')[0]}=https://{p}:{peer}" for p in pods.get("shardline-etcd", [])),
            "ETCD_INITIAL_CLUSTER_STATE": "new",
            "ETCD_CLIENT_CERT_AUTH": "true",
            "ETCD_PEER_CLIENT_CERT_AUTH": "true",
            "ETCD_PRE_VOTE": "true",
        }
        for k, v in want.items():
            if env.get(k) != v:
                errors.append(f"etcd: {k} is {env.get(k)!r}, want {v!r}")
        for k in ("ETCD_CERT_FILE", "ETCD_KEY_FILE", "ETCD_TRUSTED_CA_FILE", "ETCD_PEER_CERT_FILE",
                  "ETCD_PEER_KEY_FILE", "ETCD_PEER_TRUSTED_CA_FILE"):
            if not env.get(k) or not in_secret(tpl, c, env[k]):
                errors.append(f"etcd: {k} ({env.get(k)}) is not in a mounted Secret")
        data = env.get("ETCD_DATA_DIR") or ""
        claims = {t["metadata"]["name"] for t in etcd["spec"].get("volumeClaimTemplates", [])}
        if not any(m["name"] in claims and data.startswith(m["mountPath"].rstrip("/") + "/") for m in c.get("volumeMounts", [])):
            errors.append(f"etcd: ETCD_DATA_DIR {data} is not on a volumeClaimTemplate's volume")
        if "/health" not in http_probe_paths(c):
            errors.append("etcd: no /health probe")
    # The replicas: each advertises its own pod name; the state names every
    # etcd member; TLS to etcd; the clients' list names every replica.
    coord = sts.get("shardline-coordinator")
    replicas = ""
    if coord:
        tpl = coord["spec"]["template"]
        c = coordinator_container(tpl)
        if not c:
            errors.append("StatefulSet shardline-coordinator: no container runs the coordinator")
        else:
            args, env = c["args"], {k: v.get("value") for k, v in env_of(c).items()}
            grpc = port_of(c, "grpc")
            svc = coord["spec"]["serviceName"]
            pod_name_from_metadata(c, "coordinator")
            replicas = ",".join(f"{p}:{grpc}" for p in pods.get("shardline-coordinator", []))
            def arg(flag):
                return args[args.index(flag) + 1] if flag in args and args.index(flag) + 1 < len(args) else None
            if arg("--advertise") != f"$(POD_NAME).{svc}:{grpc}":
                errors.append(f"coordinator: --advertise is {arg('--advertise')!r}, want '$(POD_NAME).{svc}:{grpc}'")
            state = env.get("SHARDLINE_STATE") or ""
            want = "etcd://" + ",".join(f"{p}:{etcd_client_port}" for p in pods.get("shardline-etcd", [])) + "/"
            if not state.startswith(want) or len(state) == len(want):
                errors.append(f"coordinator: SHARDLINE_STATE is {state!r}, want {want}PREFIX")
            for flag in ("--etcd-ca", "--etcd-cert", "--etcd-key", "--tls-cert", "--tls-key"):
                if not arg(flag) or not in_secret(tpl, c, arg(flag)):
                    errors.append(f"coordinator: {flag} ({arg(flag)}) is not in a mounted Secret")
            if env.get("SHARDLINE_COORDINATOR") != replicas:
                errors.append(f"coordinator: SHARDLINE_COORDINATOR (for shardctl) is {env.get('SHARDLINE_COORDINATOR')!r}, want {replicas!r}")
            if coord["spec"].get("volumeClaimTemplates") or any("persistentVolumeClaim" in v and v["persistentVolumeClaim"]["claimName"] != "shardline-checkpoints" for v in tpl["spec"].get("volumes", [])):
                errors.append("coordinator replicas: a volume besides the checkpoints (their state is in etcd)")
            paths = http_probe_paths(c)
            with open(f"{TMP}/k8s-ha-coord.args", "w") as f:
                f.write("\n".join(args[1:]) + "\n")
    # The workers list every replica, and are otherwise ../workers.yaml's Job.
    for name, j in jobs.items():
        for c in j["spec"]["template"]["spec"]["containers"]:
            got = env_of(c).get("SHARDLINE_COORDINATOR", {}).get("value")
            if got != replicas:
                errors.append(f"Job {name}: SHARDLINE_COORDINATOR is {got!r}, want every replica: {replicas!r}")
    single = os.environ.get("SINGLE_WORKERS")
    if single:
        def normal(job):
            job = copy.deepcopy(job)
            for c in job["spec"]["template"]["spec"]["containers"]:
                for e in c.get("env", []):
                    if e["name"] == "SHARDLINE_COORDINATOR":
                        e["value"] = "-"
            for v in job["spec"]["template"]["spec"].get("volumes", []):
                if v["name"] == "ca":
                    v["secret"]["secretName"] = "-"
            return job
        theirs = [d for d in yaml.safe_load_all(open(single)) if d and d.get("kind") == "Job"]
        if [normal(j) for j in jobs.values()] != [normal(j) for j in theirs]:
            errors.append(f"the Jobs differ from {single}'s in more than SHARDLINE_COORDINATOR and the CA")
print("probe paths:", sorted(paths))
if mode == "single":
    # Hand the ConfigMap's job specs to the shell.
    for name, cm in by_kind.get("ConfigMap", {}).items():
        for key, text in cm.get("data", {}).items():
            if key.endswith(".yaml"):
                yaml.safe_load(text)
                with open(f"{TMP}/cm-{key}", "w") as f:
                    f.write(text)
with open(f"{TMP}/probe-paths", "a") as f:
    f.write("".join(p + "\n" for p in sorted(paths)))
for e in errors:
    print(e)
sys.exit(1 if errors else 0)
PYEOF
if "$PY" -c 'import yaml' 2>/dev/null; then
  : >"$TMP/probe-paths"
  check "k8s manifests (one coordinator: deploy/k8s/*.yaml) parse and their references resolve" \
    "$PY" "$TMP/k8s_check.py" single deploy/k8s/*.yaml
  check "k8s manifests (replicas: deploy/k8s/ha/) parse, resolve, and name the same pods and members" \
    env SINGLE_WORKERS=deploy/k8s/workers.yaml "$PY" "$TMP/k8s_check.py" ha deploy/k8s/ha/*.yaml \
    deploy/k8s/checkpoints.yaml deploy/k8s/jobs.yaml
  check "k8s ha/coordinator.yaml passes only flags shardline-coordinator has" \
    flags_known "$COORDINATOR" "$TMP/k8s-ha-coord.args"
  if command -v etcd >/dev/null; then
    check "k8s ha/etcd.yaml sets only real etcd flags" etcd_flags_known deploy/k8s/ha/etcd.yaml
  fi
else
  bad "python3 with yaml (python3-yaml) is not installed: the k8s files cannot be parsed"
fi
# A real coordinator: the probes' path answers 200, the ConfigMap's specs are
# valid jobs (and so is deploy/netns/job.yaml).
PORT=$((20000 + $$ % 20000))
"$COORDINATOR" --listen 127.0.0.1:0 --state memory --metrics-port "$PORT" >"$TMP/coord.out" 2>"$TMP/coord.err" &
COORD_PID=$!
trap 'kill $COORD_PID 2>/dev/null; wait $COORD_PID 2>/dev/null' EXIT
for _ in $(seq 200); do grep -q "^metrics on " "$TMP/coord.out" && break; sleep 0.05; done
export SHARDLINE_COORDINATOR
SHARDLINE_COORDINATOR=$(sed -n 's/^listening on //p' "$TMP/coord.out")
probe_paths_served() {
  [ -s "$TMP/probe-paths" ] || { echo "no httpGet probe path found"; return 1; }
  local p rc=0
  while read -r p; do
    "$PY" -c 'import sys, urllib.request; r = urllib.request.urlopen(sys.argv[1], timeout=5); sys.exit(r.status != 200)' \
      "http://127.0.0.1:$PORT$p" || { echo "GET $p did not answer 200"; rc=1; }
  done <"$TMP/probe-paths"
  return $rc
}
if grep -q "^metrics on " "$TMP/coord.out"; then
  check "the coordinator's metrics endpoint serves the probes' path" probe_paths_served
  specs_valid() {
    local f rc=0 i=0
    for f in "$TMP"/cm-*.yaml deploy/netns/job.yaml; do
      i=$((i + 1))
      # The coordinator creates checkpoint.directory at job create; point it
      # at a scratch directory (the real one is a volume mount).
      sed "s|^\(\s*directory:\s*\).*|\1$TMP/ckpt$i|" "$f" >"$TMP/spec$i.yaml"
      timeout 20 "$SHARDCTL" job create "$TMP/spec$i.yaml" --id "spec$i" >/dev/null || { echo "$f refused"; rc=1; }
    done
    return $rc
  }
  check "job specs in jobs.yaml (ConfigMap) and deploy/netns/job.yaml are accepted by the coordinator" specs_valid
else
  bad "the coordinator did not start (metrics on port $PORT)"; cat "$TMP/coord.err"
fi

# Two real replicas on a one-member etcd (loopback, plaintext): the k8s
# readiness probe's path answers 200 on the follower as on the leader (so
# a failover moves no pod out of its Service).
replicas_probe_healthz() {
  local base=$((30002 + $$ % 20000)) rc=0 i pids=() leader="" follower=""
  etcd --name m0 --data-dir "$TMP/etcd-replicas" \
    --listen-client-urls "http://127.0.0.1:$base" --advertise-client-urls "http://127.0.0.1:$base" \
    --listen-peer-urls "http://127.0.0.1:$((base + 1))" --initial-advertise-peer-urls "http://127.0.0.1:$((base + 1))" \
    --initial-cluster "m0=http://127.0.0.1:$((base + 1))" >"$TMP/etcd-replicas.log" 2>&1 &
  pids+=($!)
  # A replica that cannot reach etcd at start exits: wait for etcd first.
  for _ in $(seq 200); do
    "$PY" -c 'import sys, urllib.request; sys.exit(b"true" not in urllib.request.urlopen(sys.argv[1], timeout=2).read())' \
      "http://127.0.0.1:$base/health" 2>/dev/null && break
    sleep 0.1
  done
  for i in 0 1; do
    "$COORDINATOR" --listen "127.0.0.1:$((base + 2 + i))" --state "etcd://127.0.0.1:$base/deploytest" \
      --metrics-port "$((base + 4 + i))" >"$TMP/replica$i.out" 2>"$TMP/replica$i.err" &
    pids+=($!)
  done
  # Each replica logs "elected leader" or "following".
  for _ in $(seq 300); do
    kill -0 "${pids[1]}" 2>/dev/null && kill -0 "${pids[2]}" 2>/dev/null || break
    leader="" follower=""
    for i in 0 1; do
      grep -q ": elected leader" "$TMP/replica$i.err" && leader=$i
      grep -q ": following " "$TMP/replica$i.err" && follower=$i
    done
    [ -n "$leader" ] && [ -n "$follower" ] && [ "$leader" != "$follower" ] && break
    sleep 0.1
  done
  if [ -z "$leader" ] || [ -z "$follower" ] || [ "$leader" = "$follower" ]; then
    echo "not one leader and one follower"; cat "$TMP/replica0.err" "$TMP/replica1.err"; rc=1
  else
    for i in "$leader" "$follower"; do
      "$PY" -c 'import sys, urllib.request; r = urllib.request.urlopen(sys.argv[1], timeout=5); sys.exit(r.status != 200)' \
        "http://127.0.0.1:$((base + 4 + i))/healthz" ||
        { echo "replica $i ($([ "$i" = "$leader" ] && echo leader || echo follower)): /healthz did not answer 200"; rc=1; }
    done
  fi
  for i in "${pids[@]}"; do kill "$i" 2>/dev/null; done
  for i in "${pids[@]}"; do wait "$i" 2>/dev/null; done
  return $rc
}
if command -v etcd >/dev/null; then
  check "two replicas on etcd, a leader and a follower: /healthz answers 200 on both" \
    replicas_probe_healthz
else
  bad "etcd is not installed (deploy/install_deps.sh installs etcd-server): replicas cannot be run"
fi

echo "== TLS material (deploy/k8s/ha/certs.sh)"
CERTS="$TMP/certs"
certs_made() {
  bash deploy/k8s/ha/certs.sh "$CERTS" "etcd-0.etcd,localhost,127.0.0.1" "coord-0.coord,coord-1.coord,127.0.0.1" 30 ||
    return 1
  local rc=0 f
  for f in etcd-member etcd-client coordinator; do
    openssl verify -CAfile "$CERTS/ca.pem" "$CERTS/$f.pem" || rc=1
    [ "$(stat -c %a "$CERTS/$f.key")" = 600 ] || { echo "$f.key is not mode 0600"; rc=1; }
  done
  [ "$(stat -c %a "$CERTS")" = 700 ] || { echo "$CERTS is not mode 0700"; rc=1; }
  openssl x509 -in "$CERTS/etcd-member.pem" -noout -ext subjectAltName,extendedKeyUsage >"$TMP/member.ext"
  grep -q "DNS:etcd-0.etcd, DNS:localhost, IP Address:127.0.0.1" "$TMP/member.ext" &&
    grep -q "TLS Web Server Authentication, TLS Web Client Authentication" "$TMP/member.ext" ||
    { echo "etcd-member.pem:"; cat "$TMP/member.ext"; rc=1; }
  openssl x509 -in "$CERTS/coordinator.pem" -noout -ext subjectAltName >"$TMP/coord.ext"
  grep -q "DNS:coord-0.coord, DNS:coord-1.coord, IP Address:127.0.0.1" "$TMP/coord.ext" ||
    { echo "coordinator.pem:"; cat "$TMP/coord.ext"; rc=1; }
  openssl x509 -in "$CERTS/etcd-client.pem" -noout -ext extendedKeyUsage | grep -q "TLS Web Client Authentication" ||
    { echo "etcd-client.pem is not for client authentication"; rc=1; }
  bash deploy/k8s/ha/certs.sh "$TMP/certs-bad" "a b" c 2>/dev/null && { echo "a name with a space was accepted"; rc=1; }
  return $rc
}
# etcd as the manifests run it (TLS, client certificates required, for
# clients and peers) with these certificates, on loopback.
etcd_takes_certs() {
  local port=$((30000 + $$ % 20000)) pid rc=0 i
  etcd --name m0 --data-dir "$TMP/etcd-data" \
    --listen-client-urls "https://127.0.0.1:$port" --advertise-client-urls "https://127.0.0.1:$port" \
    --listen-peer-urls "https://127.0.0.1:$((port + 1))" --initial-advertise-peer-urls "https://127.0.0.1:$((port + 1))" \
    --initial-cluster "m0=https://127.0.0.1:$((port + 1))" \
    --cert-file "$CERTS/etcd-member.pem" --key-file "$CERTS/etcd-member.key" \
    --trusted-ca-file "$CERTS/ca.pem" --client-cert-auth \
    --peer-cert-file "$CERTS/etcd-member.pem" --peer-key-file "$CERTS/etcd-member.key" \
    --peer-trusted-ca-file "$CERTS/ca.pem" --peer-client-cert-auth >"$TMP/etcd.log" 2>&1 &
  pid=$!
  ctl() { ETCDCTL_API=3 timeout 10 etcdctl --endpoints "https://127.0.0.1:$port" --cacert "$CERTS/ca.pem" \
    --dial-timeout 2s --command-timeout 2s "$@"; }
  for i in $(seq 100); do
    ctl --cert "$CERTS/etcd-client.pem" --key "$CERTS/etcd-client.key" put /t/k v >/dev/null 2>&1 && break
    sleep 0.1
  done
  [ "$(ctl --cert "$CERTS/etcd-client.pem" --key "$CERTS/etcd-client.key" get --print-value-only /t/k 2>&1)" = v ] ||
    { echo "etcd did not take the coordinators' client certificate"; tail -5 "$TMP/etcd.log"; rc=1; }
  ctl get /t/k >/dev/null 2>&1 && { echo "etcd answered a client without a certificate"; rc=1; }
  kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
  return $rc
}
if command -v openssl >/dev/null; then
  check "ha/certs.sh: CA, member, client and replica certificates (names, key usage, modes)" certs_made
  if command -v etcd >/dev/null && command -v etcdctl >/dev/null; then
    check "etcd with ha/certs.sh's certificates takes the coordinators' client certificate, refuses none" \
      etcd_takes_certs
  else
    bad "etcd/etcdctl are not installed (deploy/install_deps.sh installs etcd-server, etcd-client)"
  fi
else
  bad "openssl is not installed: ha/certs.sh cannot be checked"
fi

echo "== Slurm"
slurm_worker_task() {
  local rc=0
  env -i PATH="$PATH" SHARDLINE_BIN="$STUBS" SHARDLINE_JOB=j SHARDLINE_COORDINATOR=h:7070 \
    SLURM_LOCALID=3 SLURM_GPUS_ON_NODE=4 SHARDLINE_INTERFACE=10.9.8.7 \
    SHARDLINE_WORKER_ARGS="--log-interval 5" bash deploy/slurm/worker.sh >"$TMP/slurm.args" || return 1
  grep -A1 -x -- --worker-id "$TMP/slurm.args" | grep -qx "$(hostname -s):3" || { echo "worker id NODE:LOCALID"; rc=1; }
  grep -A1 -x -- --device "$TMP/slurm.args" | grep -qx "cuda:3" || { echo "device cuda:LOCALID"; rc=1; }
  grep -A1 -x -- --interface "$TMP/slurm.args" | grep -qx "10.9.8.7" || { echo "interface"; rc=1; }
  grep -A1 -x -- --log-interval "$TMP/slurm.args" | grep -qx "5" || { echo "SHARDLINE_WORKER_ARGS"; rc=1; }
  flags_known "$WORKER" "$TMP/slurm.args" || rc=1
  [ $rc -eq 0 ] || cat "$TMP/slurm.args"
  return $rc
}
check "slurm worker.sh: NODE:LOCALID, cuda:LOCALID, real worker flags" slurm_worker_task
sbatch_directives() {
  grep -q '^#SBATCH --nodes=' deploy/slurm/shardline.sbatch &&
    grep -q '^#SBATCH --gpus-per-node=' deploy/slurm/shardline.sbatch &&
    grep -q 'scontrol show hostnames' deploy/slurm/shardline.sbatch &&
    grep -q -- '--nodelist="$HEAD"' deploy/slurm/shardline.sbatch
}
check "shardline.sbatch: coordinator on the first node, one task per GPU" sbatch_directives
# shardline.sbatch with stand-ins for Slurm (scontrol, srun) and shardctl:
# SBATCH_DIR/bin has them; srun and shardctl log their arguments and the
# coordinator address and token they were given.
sbatch_stubs() {  # DIR
  mkdir -p "$1/bin" "$1/submit"
  cat >"$1/bin/scontrol" <<'SH'
#!/bin/sh
[ "$1 $2" = "show hostnames" ] && printf 'n1\nn2\n'
SH
  cat >"$1/bin/srun" <<'SH'
#!/bin/sh
echo "srun $* | coordinator=$SHARDLINE_COORDINATOR token=$SHARDLINE_TOKEN" >>"$SBATCH_LOG"
SH
  cat >"$1/bin/shardctl" <<'SH'
#!/bin/sh
echo "shardctl $* | coordinator=$SHARDLINE_COORDINATOR token=$SHARDLINE_TOKEN" >>"$SBATCH_LOG"
case "$*" in
  *"job get"*) [ -e "$SBATCH_LOG.created" ] ;;
  *"job create"*) touch "$SBATCH_LOG.created"; echo '{"worker_token": "jobtoken-0123456789abcdef"}' ;;
esac
SH
  chmod +x "$1/bin/"*
}
run_sbatch() {  # DIR [VAR=VALUE...]: runs the batch script there, rc of it
  local dir="$1"; shift
  (cd "$dir/submit" && env -i PATH="$dir/bin:$PATH" HOME="$dir" SBATCH_LOG="$dir/log" SLURM_JOB_ID=42 \
    SLURM_JOB_NODELIST='n[1-2]' SLURM_SUBMIT_DIR="$dir/submit" SHARDLINE_BIN="$dir/bin" \
    SHARDLINE_SLURM_DIR="$SRC_SLURM" "$@" bash "$SRC_SLURM/shardline.sbatch" "$dir/spec.yaml" myjob \
    >"$dir/out" 2>&1)
}
SRC_SLURM="$(cd deploy/slurm && pwd)"
sbatch_own_coordinator() {
  local d="$TMP/sbatch-own" rc=0
  sbatch_stubs "$d"
  run_sbatch "$d" || { cat "$d/out"; return 1; }
  grep -q '^srun .*--nodelist=n1 .*/shardline-coordinator --listen 0.0.0.0:7070 ' "$d/log" ||
    { echo "no coordinator started on n1"; rc=1; }
  grep -q '^shardctl .*job create .* | coordinator=n1:7070 ' "$d/log" || { echo "job not created on n1:7070"; rc=1; }
  grep -q '^srun .*worker.sh | coordinator=n1:7070 token=jobtoken-0123456789abcdef$' "$d/log" ||
    { echo "workers not given n1:7070 and the job token"; rc=1; }
  [ $rc -eq 0 ] || cat "$d/log"
  return $rc
}
sbatch_external_replicas() {
  local d="$TMP/sbatch-ext" rc=0 list="c1:7070,c2:7070,c3:7070"
  local given=(SHARDLINE_COORDINATOR="$list" SHARDLINE_ADMIN_TOKEN=admin-0123456789abcdef SHARDLINE_TLS_CA=/site/ca.pem)
  sbatch_stubs "$d"
  run_sbatch "$d" "${given[@]}" || { cat "$d/out"; return 1; }
  grep -q 'shardline-coordinator' "$d/log" && { echo "a coordinator was started"; rc=1; }
  grep -q "^shardctl --tls-ca /site/ca.pem job create .* | coordinator=$list token=admin-" "$d/log" ||
    { echo "job not created on the replicas with the site's CA and admin token"; rc=1; }
  grep -q "^srun .*worker.sh | coordinator=$list token=jobtoken-0123456789abcdef\$" "$d/log" ||
    { echo "workers not given the replicas and the job token"; rc=1; }
  [ "$(stat -c %a "$d/submit/shardline-42.token" 2>&1)" = 600 ] || { echo "the job token is not kept mode 0600"; rc=1; }
  # A requeue: the job exists; its workers get the kept job token, not the
  # site's admin token.
  : >"$d/log"
  run_sbatch "$d" "${given[@]}" || { cat "$d/out"; return 1; }
  grep -q 'job create' "$d/log" && { echo "the requeue created the job again"; rc=1; }
  grep -q "^srun .*worker.sh | coordinator=$list token=jobtoken-0123456789abcdef\$" "$d/log" ||
    { echo "requeued workers not given the kept job token"; rc=1; }
  run_sbatch "$d" SHARDLINE_COORDINATOR="$list" SHARDLINE_TLS_CA=/site/ca.pem &&
    { echo "ran with replicas but no admin token"; rc=1; }
  [ $rc -eq 0 ] || cat "$d/log"
  return $rc
}
check "shardline.sbatch: its own coordinator on the first node, the job token to the workers" sbatch_own_coordinator
check "shardline.sbatch with SHARDLINE_COORDINATOR=A,B,C: no coordinator started, the list and the job token to the workers" \
  sbatch_external_replicas
sed -n 's/.*"\$BIN\/shardline-coordinator" \(.*\)/\1/p' deploy/slurm/shardline.sbatch | tr ' ' '\n' >"$TMP/sbatch-coord.args"
check "shardline.sbatch passes only flags shardline-coordinator has" flags_known "$COORDINATOR" "$TMP/sbatch-coord.args"

echo "== secrets"
no_default_secrets() {
  local rc=0 f
  # A token variable set to a value, or a placeholder someone might keep.
  if grep -n -E '^[[:space:]]*(export[[:space:]]+)?SHARDLINE_(ADMIN_)?TOKEN=[^$"]' deploy/systemd/*.env; then
    echo "an env file sets a token"; rc=1
  fi
  # -R: the runfiles are symbolic links, which -r would skip. A placeholder
  # in capitals (token=TOKEN) is documentation, a lower-case one a value.
  if grep -Rn -i -E 'change-?me' deploy/ || grep -Rn -E -- '--from-literal=token=[a-z0-9]' deploy/; then
    echo "a placeholder or literal token"; rc=1
  fi
  # Tokens on a command line (ps shows them to every local user).
  for f in deploy/systemd/*.service deploy/slurm/* deploy/k8s/*.yaml deploy/k8s/ha/* deploy/container/entrypoint.sh; do
    grep -n -E -- '--(admin-)?token([[:space:]]|=|",)' "$f" && { echo "$f passes a token on a command line"; rc=1; }
  done
  for f in deploy/systemd/shardline-coordinator.service deploy/systemd/shardline-coordinator-replica.service; do
    grep -q -- '--admin-token-file' "$f" || { echo "$f reads no --admin-token-file"; rc=1; }
  done
  # No private key ships (certs.sh makes them; the manifests name Secrets).
  if grep -Rln -E -- '-----BEGIN ([A-Z]+ )?PRIVATE KEY-----' deploy/; then
    echo "a private key ships"; rc=1
  fi
  grep -q -- '--token-file' deploy/systemd/shardline-worker@.service ||
    { echo "the worker unit reads no --token-file"; rc=1; }
  return $rc
}
check "no deploy file ships a usable secret or puts a token on a command line" no_default_secrets
tls_beyond_loopback() {
  local rc=0
  grep -q '^SHARDLINE_LISTEN=0.0.0.0' deploy/systemd/coordinator.env &&
    ! grep -q -- '--tls-cert' deploy/systemd/shardline-coordinator.service &&
    { echo "systemd: listens on 0.0.0.0 without TLS"; rc=1; }
  grep -q '^SHARDLINE_LISTEN=0.0.0.0' deploy/systemd/coordinator-replica.env &&
    ! grep -q -- '--tls-cert' deploy/systemd/shardline-coordinator-replica.service &&
    { echo "systemd: the replica listens on 0.0.0.0 without TLS"; rc=1; }
  grep -q '"0.0.0.0:$PORT"' deploy/slurm/shardline.sbatch &&
    ! grep -q -- '--tls-cert' deploy/slurm/shardline.sbatch && { echo "slurm: no TLS"; rc=1; }
  "$PY" - deploy/k8s/*.yaml deploy/k8s/ha/*.yaml <<'PYEOF' || rc=1
import sys, yaml
bad = 0
for path in sys.argv[1:]:
    for d in yaml.safe_load_all(open(path)):
        if not d or d.get("kind") not in ("Deployment", "Job", "StatefulSet"):
            continue
        for c in d["spec"]["template"]["spec"]["containers"]:
            args = c.get("args", [])
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            if args[:1] == ["coordinator"] and env.get("SHARDLINE_LISTEN", "0.0.0.0").startswith("0.0.0.0") \
                    and "--tls-cert" not in args:
                print(f"{path}: the coordinator listens beyond loopback without --tls-cert"); bad = 1
            if args[:1] == ["coordinator"] and (env.get("SHARDLINE_STATE") or "").startswith("etcd://") \
                    and not all(f in args for f in ("--etcd-ca", "--etcd-cert", "--etcd-key")):
                print(f"{path}: the coordinator reaches etcd without TLS and a client certificate"); bad = 1
            if args[:1] == ["worker"] and "--tls-ca" not in args:
                print(f"{path}: the workers do not check the coordinator's certificate (--tls-ca)"); bad = 1
            # etcd: clients and peers over TLS, certificates required.
            if "ETCD_LISTEN_CLIENT_URLS" in env:
                loopback = all(u.startswith(("https://127.0.0.1:", "http://127.0.0.1:"))
                               for u in env["ETCD_LISTEN_CLIENT_URLS"].split(","))
                for k in ("ETCD_LISTEN_CLIENT_URLS", "ETCD_LISTEN_PEER_URLS", "ETCD_ADVERTISE_CLIENT_URLS",
                          "ETCD_INITIAL_ADVERTISE_PEER_URLS"):
                    if not loopback and not all(u.startswith("https://") for u in (env.get(k) or "http://").split(",")):
                        print(f"{path}: etcd {k} is not https: {env.get(k)}"); bad = 1
                for k in ("ETCD_CLIENT_CERT_AUTH", "ETCD_PEER_CLIENT_CERT_AUTH"):
                    if not loopback and env.get(k) != "true":
                        print(f"{path}: etcd without {k}=true"); bad = 1
sys.exit(bad)
PYEOF
  return $rc
}
check "coordinators and etcd that listen beyond loopback serve TLS; clients check it, and present certificates to etcd" \
  tls_beyond_loopback

echo
if [ $fails -ne 0 ]; then echo "deploy_files_test: $fails check(s) failed"; exit 1; fi
echo "deploy_files_test: all checks passed"
