#!/usr/bin/env bash
# Checks the deployment files with what this machine can check them with
# (no systemd running, no docker, no Kubernetes, no Slurm here):
#   * shellcheck on every deploy shell script (ours strictly; deploy/local and
#     install_deps.sh at error level, their warnings shown),
#   * systemd: `systemd-analyze verify` on the units (when it is installed),
#     the env files define every variable the units use, and the worker
#     template's ExecStart, run through sh with stand-in binaries, gives the
#     slot's worker id and device; its flags are the real worker's,
#   * container: the Dockerfile's stages, COPY sources, Bazel targets and
#     copied files exist; the runtime stage installs the packages that provide
#     every library the built binaries link (ldd + dpkg); the entrypoint,
#     run with stand-in binaries, passes flags the real programs accept,
#   * Kubernetes: every file parses as YAML (python3-yaml); names referenced
#     (PVCs, ConfigMaps, ports, labels) are defined; the probe path is served
#     by a real coordinator's metrics endpoint; the ConfigMap's job spec is
#     accepted by the real coordinator (shardctl job create),
#   * Slurm: shellcheck; the worker task script, run with stand-ins and
#     Slurm's variables, gives NODE:LOCALID and cuda:LOCALID,
#   * secrets (docs/SECURITY.md): no deploy file ships a usable token, no
#     token is put on a command line, and every coordinator that listens
#     beyond loopback is started with TLS.
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
  ours=(deploy/netns/*.sh deploy/container/entrypoint.sh deploy/slurm/shardline.sbatch deploy/slurm/worker.sh)
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
  check "systemd-analyze verify shardline-coordinator.service shardline-worker@3.service" \
    verify "$SD/shardline-coordinator.service" "$SD/shardline-worker@3.service"
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
if "$PY" -c 'import yaml' 2>/dev/null; then
  check "k8s manifests parse and their references resolve" "$PY" - deploy/k8s/*.yaml <<'PYEOF'
import sys, yaml
docs = []
for path in sys.argv[1:]:
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
for kind, name, tpl in pod_specs():
    spec = tpl["spec"]
    for v in spec.get("volumes", []):
        if "persistentVolumeClaim" in v and v["persistentVolumeClaim"]["claimName"] not in by_kind.get("PersistentVolumeClaim", {}):
            errors.append(f"{kind} {name}: PVC {v['persistentVolumeClaim']['claimName']} is not defined")
        if "configMap" in v and v["configMap"]["name"] not in by_kind.get("ConfigMap", {}):
            errors.append(f"{kind} {name}: ConfigMap {v['configMap']['name']} is not defined")
    volumes = {v["name"] for v in spec.get("volumes", [])}
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
        if any(tpl["metadata"]["labels"].get(k) != v for k, v in sel.items()):
            errors.append(f"{kind} {name}: selector does not match the pod labels")
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
    paths = {p["httpGet"]["path"] for k in ("startupProbe", "readinessProbe", "livenessProbe")
             if (p := c.get(k)) and "httpGet" in p}
    print("probe paths:", sorted(paths))
for name, svc in by_kind.get("Service", {}).items():
    sel = svc["spec"]["selector"]
    if not any(all(tpl["metadata"]["labels"].get(k) == v for k, v in sel.items()) for _, _, tpl in pod_specs()):
        errors.append(f"Service {name}: selects no pod template")
# Workers: an indexed Job (the index is the slot) on the shared checkpoints.
jobs = by_kind.get("Job", {})
if not any(j["spec"].get("completionMode") == "Indexed" for j in jobs.values()) and not by_kind.get("StatefulSet"):
    errors.append("workers: want an indexed Job or a StatefulSet")
pvcs = by_kind.get("PersistentVolumeClaim", {})
if "ReadWriteMany" not in pvcs.get("shardline-checkpoints", {}).get("spec", {}).get("accessModes", []):
    errors.append("shardline-checkpoints: want ReadWriteMany")
if "ReadWriteOnce" not in pvcs.get("shardline-state", {}).get("spec", {}).get("accessModes", []):
    errors.append("shardline-state: want ReadWriteOnce")
# Hand the ConfigMap's job specs and the probe paths to the shell.
for name, cm in by_kind.get("ConfigMap", {}).items():
    for key, text in cm.get("data", {}).items():
        if key.endswith(".yaml"):
            yaml.safe_load(text)
            with open(f"{__import__('os').environ['TMP']}/cm-{key}", "w") as f:
                f.write(text)
with open(f"{__import__('os').environ['TMP']}/probe-paths", "w") as f:
    f.write("\n".join(sorted(paths)) + "\n")
for e in errors:
    print(e)
sys.exit(1 if errors else 0)
PYEOF
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
sed -n 's/.*"\$BIN\/shardline-coordinator" \(.*\)/\1/p' deploy/slurm/shardline.sbatch | tr ' ' '\n' >"$TMP/sbatch-coord.args"
check "shardline.sbatch passes only flags shardline-coordinator has" flags_known "$COORDINATOR" "$TMP/sbatch-coord.args"

echo "== secrets"
no_default_secrets() {
  local rc=0 f
  # A token variable set to a value, or a placeholder someone might keep.
  if grep -n -E '^[[:space:]]*(export[[:space:]]+)?SHARDLINE_(ADMIN_)?TOKEN=[^$"]' deploy/systemd/*.env; then
    echo "an env file sets a token"; rc=1
  fi
  if grep -rn -i -E 'change-?me|--from-literal=token=[a-z0-9]' deploy/ | grep -v 'TOKEN}' ; then
    echo "a placeholder or literal token"; rc=1
  fi
  # Tokens on a command line (ps shows them to every local user).
  for f in deploy/systemd/*.service deploy/slurm/* deploy/k8s/*.yaml deploy/container/entrypoint.sh; do
    grep -n -E -- '--(admin-)?token([[:space:]]|=|",)' "$f" && { echo "$f passes a token on a command line"; rc=1; }
  done
  grep -q -- '--admin-token-file' deploy/systemd/shardline-coordinator.service ||
    { echo "the coordinator unit reads no --admin-token-file"; rc=1; }
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
  grep -q '"0.0.0.0:$PORT"' deploy/slurm/shardline.sbatch &&
    ! grep -q -- '--tls-cert' deploy/slurm/shardline.sbatch && { echo "slurm: no TLS"; rc=1; }
  "$PY" - deploy/k8s/coordinator.yaml deploy/k8s/workers.yaml <<'PYEOF' || rc=1
import sys, yaml
bad = 0
for path in sys.argv[1:]:
    for d in yaml.safe_load_all(open(path)):
        if not d or d.get("kind") not in ("Deployment", "Job"):
            continue
        for c in d["spec"]["template"]["spec"]["containers"]:
            args = c.get("args", [])
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            if args[:1] == ["coordinator"] and env.get("SHARDLINE_LISTEN", "0.0.0.0").startswith("0.0.0.0") \
                    and "--tls-cert" not in args:
                print(f"{path}: the coordinator listens beyond loopback without --tls-cert"); bad = 1
            if args[:1] == ["worker"] and "--tls-ca" not in args:
                print(f"{path}: the workers do not check the coordinator's certificate (--tls-ca)"); bad = 1
sys.exit(bad)
PYEOF
  return $rc
}
check "coordinators that listen beyond loopback serve TLS; clients check it" tls_beyond_loopback

echo
if [ $fails -ne 0 ]; then echo "deploy_files_test: $fails check(s) failed"; exit 1; fi
echo "deploy_files_test: all checks passed"
