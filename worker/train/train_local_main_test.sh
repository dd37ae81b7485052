#!/usr/bin/env bash
# shardline-train-local's command line, without training: --help prints the
# usage to stdout and exits 0; bad flags and a missing spec exit 2 with the
# reason on stderr and nothing on stdout; a model too large for the host
# exits 1 with the sizes.
#
#   train_local_main_test.sh TRAIN_LOCAL SPEC_YAML EMULATED_GPU_PLUGIN
set -uo pipefail
TRAIN_LOCAL="$1"
SPEC="$2"
EMU="$3"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"

CLI="$TRAIN_LOCAL"
CLI_QUIET_SUCCESS=1
# check NAME RC OUT ERR -- ARGS (tests/cli_check.sh)
source "${TEST_SRCDIR:?run with bazel test}/${TEST_WORKSPACE:?}/tests/cli_check.sh"

check "--help" 0 "Usage: shardline-train-local SPEC [flags]" "" -- --help
check "--help lists the flags" 0 "  --dp VALUE                data-parallel degree" "" -- --help
check "--help lists itself" 0 "  --help                    print this help and exit" "" -- --help
check "-h" 0 "Usage: shardline-train-local SPEC [flags]" "" -- -h
check "--help with a spec still only helps" 0 "Flags of shardline-train-local SPEC:" "" -- "$SPEC" --help
check "unknown flag" 2 "" "unknown flag --bogus for 'shardline-train-local SPEC'; valid flags: " -- --bogus
check "unknown flag with --help" 2 "" "unknown flag --bogus" -- --bogus --help
check "no spec" 2 "" "give one job spec file (YAML or JSON)" --
check "bad --dp" 2 "" "--dp=0 must be >= 1" -- "$SPEC" --dp 0
check "--help=false is no help" 2 "" "give one job spec file" -- --help=false

# A model no host holds (the demo spec at hidden_size 65536: 3.00 TiB of fp32
# model states over its 2 pipeline stages) exits 1 before training, naming
# the sizes and what to change; not 134 from an uncaught std::bad_alloc.
sed 's/hidden_size: 128/hidden_size: 65536/' "$SPEC" >"$TMP/huge.yaml"
grep -q "hidden_size: 65536" "$TMP/huge.yaml" || { echo "[FAILED] could not write huge.yaml"; fails=$((fails + 1)); }
check "model too large for the host" 1 "" \
  "not enough host memory: the 2 ranks of this process need 3.00 TiB (3299195486208 bytes) for their model states (largest rank 0: params 384.08 GiB, grads 384.08 GiB, optimizer 768.17 GiB; fp32, ZeRO stage 2" \
  -- "$TMP/huge.yaml" --steps 1
check "the message says what to change" 1 "" \
  "raise spec.parallel.pp or spec.parallel.tp; now tp=1 pp=2), shard model states over data-parallel ranks (spec.parallel.zero_stage up to 3 with more workers; now zero_stage=2 at dp=1), lower spec.training.micro_batch (now 3) for activations, or run on a host with more memory" \
  -- "$TMP/huge.yaml" --steps 1

check "--eval-samples has a bound" 2 "" "--eval-samples=999999999999 must be in 1..1000000" \
  -- "$SPEC" --eval-samples 999999999999
check "--sample-length has a bound" 2 "" "--sample-length=999999999999 must be in 0..1048576 (bytes)" \
  -- "$SPEC" --sample-length 999999999999

# No validation split (validation_fraction 0): refused before training, as
# the run ends with a validation loss (it used to fail after the last step).
head -c 20000 /dev/urandom | base64 >"$TMP/corpus.txt"
sed -e "s|^\(  dataset_path:\).*|\1 $TMP/corpus.txt|" -e "s|^\(  validation_fraction:\).*|\1 0|" \
  "$SPEC" >"$TMP/noval.yaml"
check "no validation split" 2 "" \
  "the validation split (data.validation_fraction=0 of $TMP/corpus.txt: 0 bytes) must be longer than model.seq_length=64" \
  -- "$TMP/noval.yaml" --steps 1

# Backend and optimizer placement flags are checked before training.
check "bad --backend" 2 "" "--backend=mpi is not one of gloo, nccl" -- "$SPEC" --backend mpi --steps 1
check "zero --steps" 2 "" "--steps=0 must be >= 1" -- "$SPEC" --steps 0
check "--backend nccl on the CPU" 2 "" "--backend nccl needs --device cuda[:N]" \
  -- "$SPEC" --backend nccl --steps 1
check "--host-optimizer on the CPU" 2 "" "--host-optimizer needs --device cuda[:N]" \
  -- "$SPEC" --host-optimizer --steps 1
check "--host-optimizer with NCCL" 2 "" "--host-optimizer keeps the state in host memory, which NCCL cannot read" \
  -- "$SPEC" --device cuda:0 --backend nccl --host-optimizer --steps 1

# A GPU that cannot be used says so first, CUDA's or the loader's text after.
check "no usable GPU" 1 "" \
  "--device cuda:0: no usable NVIDIA GPU, driver or plugin here (" \
  -- "$SPEC" --data "$TMP/corpus.txt" --device cuda:0 --gpu-plugin "$TMP/no-such-plugin.so" --steps 1

# --backend nccl puts rank r on GPU N + r: every rank's GPU is checked before
# training (the emulated plugin has as many devices as the fake's loopback).
export SHARDLINE_FAKE_LOOPBACK_DEVICES=2
check "a GPU per NCCL rank" 2 "" \
  "--device cuda:1 (rank 1 on cuda:2): GPU ops on device 2: device 2 does not exist; this machine has devices 0..1; --backend nccl needs a GPU per rank" \
  -- "$SPEC" --data "$TMP/corpus.txt" --device cuda:1 --gpu-plugin "$EMU" --backend nccl --dp 2 --steps 1
unset SHARDLINE_FAKE_LOOPBACK_DEVICES

echo "$fails failed"
[ $fails -eq 0 ]
