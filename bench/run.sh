#!/usr/bin/env bash
# Runs every benchmark against its peers on this machine and writes
# docs/benchmarks.md, docs/benchmarks.csv and docs/plots/*.png (bench/README.md).
#
#   bench/run.sh                      # full run: ~15 min on 2 cores
#   bench/run.sh --quick              # small sizes: < 2 min after the build
#   bench/run.sh --only checkpoint,trainer [--no-build] [--docs DIR]
#
# Exit status: 0 when every benchmark ran; 1 when one failed (the report is
# still written, listing it); 2 for bad flags.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

QUICK=0 ONLY="" BUILD=1 DOCS=docs
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --only) ONLY="${2:?--only needs a comma-separated list}"; shift ;;
    --only=*) ONLY="${1#--only=}" ;;
    --no-build) BUILD=0 ;;
    --docs) DOCS="${2:?--docs needs a folder}"; shift ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench/run.sh: unknown flag '$1'; see --help" >&2; exit 2 ;;
  esac
  shift
done

log() { echo "[bench $(date -u +%H:%M:%S)] $*" >&2; }
START=$(date +%s)

# name:command, in run order.
BENCHES=(
  "collectives:/usr/bin/python3 bench/collectives.py"
)
for f in bench/control_plane/*; do
  b=$(basename "$f")
  case "$b" in _*|.*|*.md|BUILD*|README*) continue ;; esac
  if [ ! -f "$f" ] || [ ! -x "$f" ]; then continue; fi
  BENCHES+=("${b%.*}:$f")
done
BENCHES+=("planner:/usr/bin/python3 bench/planner.py" "checkpoint:/usr/bin/python3 bench/checkpoint.py"
         "trainer:/usr/bin/python3 bench/trainer.py")

if [ -n "$ONLY" ]; then
  IFS=, read -r -a WANT <<< "$ONLY"
  for w in "${WANT[@]}"; do
    found=0
    for entry in "${BENCHES[@]}"; do [ "${entry%%:*}" = "$w" ] && found=1; done
    [ $found = 1 ] || { echo "bench/run.sh: --only: no benchmark '$w'; have: $(printf '%s ' "${BENCHES[@]%%:*}")" >&2; exit 2; }
  done
fi
wanted() { [ -z "$ONLY" ] || [[ ",$ONLY," == *",$1,"* ]]; }
NEED_CP=0
for entry in "${BENCHES[@]}"; do
  case "${entry#*:}" in bench/control_plane/*) wanted "${entry%%:*}" && NEED_CP=1 ;; esac
done

# Debian's python (torch, numpy, matplotlib are Debian packages), not a pyenv shim.
PY=/usr/bin/python3
deploy/install_deps.sh --bench || { echo "bench/run.sh: installing packages failed" >&2; exit 1; }

if [ "$BUILD" = 1 ]; then
  # Items 1, 6, 7 and the planner: bench/'s own binaries and the programs they run. Must build.
  CORE=(//bench:all //worker/comm:shardline-bench-collectives //worker/train:shardline-train-local
        //client/shardctl:shardctl)
  # Item 7 on a GPU machine: the GPU plugin for shardline-train-local --device cuda:0.
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    CORE+=(//worker/gpu:libshardline_gpu.so)
  fi
  log "building (-c opt): ${CORE[*]}"
  bazel --batch build --config=ci -c opt "${CORE[@]}" \
      || { echo "bench/run.sh: build failed" >&2; exit 1; }
  # Items 2-5: everything under bench/control_plane, the control-plane programs, and
  # any target listed one a line in bench/control_plane/BUILD_TARGETS. If this fails,
  # those benchmarks fail (and are listed in the report); the others still run.
  CP=(//bench/control_plane/... //server:shardline-coordinator //worker:shardline-worker
      //client/shardctl)
  if [ -s bench/control_plane/BUILD_TARGETS ]; then
    while read -r t; do
      [[ -z "$t" || "$t" == \#* ]] || CP+=("$t")
    done < bench/control_plane/BUILD_TARGETS
  fi
  if [ "$NEED_CP" = 1 ]; then
    log "building (-c opt): ${CP[*]}"
    bazel --batch build --config=ci -c opt "${CP[@]}" \
        || log "WARNING: building the control-plane targets failed; their benchmarks will fail"
  fi
fi

export BENCH_QUICK=$QUICK
export BENCH_BIN=$PWD/bazel-out/k8-opt/bin   # not bazel-bin: other builds move that link
export BENCH_TMP=/var/tmp/shardline-bench.$$
export PYTHONPATH="$PWD/bench${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1   # no __pycache__ in the tree
PATH="$(dirname "$PY"):$PATH"
export PATH
# OpenBLAS 0.3.21 takes some of these VMs' CPUs for a Prescott and runs SSE3
# kernels; both our trainer and Debian's torch (through libblas.so.3) use it.
# deploy/local/openblas_coretype.sh has the rule (SkylakeX or Haswell there).
. deploy/local/openblas_coretype.sh
choose_openblas_coretype "$BENCH_BIN/worker/train/shardline-train-local"
[ -n "$openblas_note" ] && log "$openblas_note"
mkdir -p "$BENCH_TMP" bench/out
trap 'rm -rf "$BENCH_TMP"' EXIT
# A full run starts from nothing; with --only the other benchmarks' last rows stay
# and go into the report again (so one benchmark can be rerun on its own).
[ -z "$ONLY" ] && rm -f bench/out/*.csv bench/out/*.md bench/out/*.tmp

FAILED=()
for entry in "${BENCHES[@]}"; do
  name=${entry%%:*} cmd=${entry#*:}
  wanted "$name" || continue
  log "$name: $cmd"
  rm -f "bench/out/$name.csv" "bench/out/$name.md"
  t0=$(date +%s)
  QUICK_FLAG=()
  [ "$QUICK" = 1 ] && QUICK_FLAG=(--quick)
  # shellcheck disable=SC2086  # $cmd is "interpreter script" or a path: split it
  if $cmd --out "bench/out/$name.csv" "${QUICK_FLAG[@]}"; then
    log "$name: done in $(( $(date +%s) - t0 )) s"
  else
    log "$name: FAILED (exit $?) after $(( $(date +%s) - t0 )) s"
    FAILED+=("$name")
  fi
done

ELAPSED="$(( $(date +%s) - START )) s"
IFS=, FAILED_LIST="${FAILED[*]:-}"; unset IFS
$PY bench/report.py --out-dir bench/out --docs "$DOCS" \
    --mode "$([ "$QUICK" = 1 ] && echo quick || echo full)" --failed "$FAILED_LIST" \
    --elapsed "$ELAPSED" --only "$ONLY" || exit 1
log "all done in $ELAPSED; see $DOCS/benchmarks.md"
[ ${#FAILED[@]} -eq 0 ]
