#!/usr/bin/env bash
# Installs, from Debian 12's archive, what building and testing Shardline
# needs. Idempotent: does nothing when every package is already there.
# Needs root (or sudo) only when something is missing.
#
#   deploy/install_deps.sh           # build and test
#   deploy/install_deps.sh --bench   # also the peers of bench/run.sh (torch, etcd, ...),
#                                    # and current torch from PyPI in a virtualenv
#                                    # ($SHARDLINE_BENCH_VENV, default ~/.cache/shardline-bench-venv)
#   deploy/install_deps.sh --check   # also clang (tests/run.sh's thread-safety build)
set -euo pipefail

PACKAGES=(
  bazel-bootstrap          # Bazel 4.2.3, runs offline (docs/BUILDING.md)
  g++ pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev              # Abseil 20220623: Status, strings, synchronization, time
  libgtest-dev libgmock-dev
  libgloo-dev              # CPU collectives (TCP transport)
  nlohmann-json3-dev       # shardctl --json
  libsqlite3-dev           # the coordinator's durable state
  libyaml-cpp-dev          # job spec files in YAML
  libopenblas-dev          # the trainer's CPU matrix products (cblas_sgemm)
  libisal-dev              # CRC-32C of checkpoint shards (ISA-L crc32_iscsi)
  openssl                  # tests make TLS certificates
  iproute2                 # ip netns: deploy/netns/, tests/netns_test.sh
  shellcheck               # tests/deploy_files_test.sh lints deploy/ scripts
  python3-yaml             # tests/deploy_files_test.sh parses deploy/k8s/
  python3-grpcio python3-protobuf  # python/shardline, the Python client (stubs: protobuf-compiler-grpc)
  python3-venv python3-pip python3-setuptools python3-wheel  # pip install ./python (python/tests/pip_install_test.sh)
  python3-torch            # torch 1.13: the torch.distributed Store and torchrun backend (python/shardline/torch), and bench/run.sh
  etcd-server etcd-client  # etcd 3.4: the coordinator's replicated state (--state etcd://),
                           # which its tests start as 3-member clusters on loopback
)

# Only for bench/run.sh (the tools users would pick instead, and plotting);
# the build and the tests never need them.
BENCH_PACKAGES=(
  python3-numpy
  python3-matplotlib       # docs/plots/*.png
)
# Only for checking the code (tests/run.sh, CI): clang 14 for the
# thread-safety build (bazel build --config=clang, .bazelrc), its libFuzzer
# and sanitizer runtimes for the fuzz targets (--config=fuzz, fuzz/BUILD)
# and clang-format (.clang-format).
CHECK_PACKAGES=(
  clang
  libomp-dev               # OpenMP for clang (worker/train/parallel.cc; GCC brings libgomp)
  libclang-rt-14-dev
  clang-format
)
case "${1:-}" in
  --bench) PACKAGES+=("${BENCH_PACKAGES[@]}") ;;
  --check) PACKAGES+=("${CHECK_PACKAGES[@]}") ;;
  "") ;;
  *) echo "install_deps: unknown argument '$1'; give nothing, --bench or --check" >&2; exit 2 ;;
esac

missing=()
for p in "${PACKAGES[@]}"; do
  [[ "$p" == \#* ]] && continue
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Current torch from PyPI for bench/run.sh, beside Debian's 1.13 (the product
# never uses it): a virtualenv of its own, made once. Without PyPI the
# benchmarks run with Debian's torch only, and say so.
BENCH_TORCH=torch==2.15.0
bench_venv() {
  local venv="${SHARDLINE_BENCH_VENV:-$HOME/.cache/shardline-bench-venv}"
  if "$venv/bin/python" -c 'import torch' 2>/dev/null; then return 0; fi
  echo "install_deps: installing $BENCH_TORCH from PyPI into $venv (bench peers only; ~4 GB with its CUDA libraries)" >&2
  if ! { /usr/bin/python3 -m venv "$venv" && "$venv/bin/pip" install -q "$BENCH_TORCH" numpy; }; then
    echo "install_deps: could not install $BENCH_TORCH from PyPI; benchmarks compare with Debian's torch 1.13 only" >&2
  fi
}

if [ ${#missing[@]} -eq 0 ]; then
  if [ "${1:-}" = --bench ]; then bench_venv; fi
  exit 0
fi

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install_deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  SUDO=(sudo)
fi
echo "install_deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
if [ "${1:-}" = --bench ]; then bench_venv; fi
