#!/usr/bin/env bash
# The test command (README): on a fresh Debian 12 machine it installs what it
# needs, builds and runs every test with Bazel in batch mode (no Bazel server
# is left behind), then builds the same targets with clang and its
# thread-safety analysis as an error (--config=clang, .bazelrc), runs each
# libFuzzer target of fuzz/ for a bounded time from its corpus (whole runs
# only), and ends with the line "N passed, N failed, N skipped" (one gtest
# case each, one per fuzzer run; a test binary that dies counts as one
# failure, and so does a failed clang or fuzz build).
#
#   tests/run.sh                 # everything
#   tests/run.sh //plan/...      # a subset (Bazel target patterns; no fuzzing)
#   SHARDLINE_CLANG_CHECK=0 tests/run.sh   # local use: skip the clang build
#   SHARDLINE_FUZZ_SECONDS=0 tests/run.sh  # skip the fuzz runs (default 30 s each)
#
# The clang build has its own output directory (bazel-out/k8-opt-clang), so
# when nothing changed it only costs Bazel's start and analysis; a fresh
# clone gets its actions from the disk cache (.bazelrc). CI runs it.
#
# Without a CUDA toolkit at /usr/local/cuda the GPU parts are compiled out
# (--config=nocuda); GPU tests skip themselves on machines without a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."

bash deploy/install_deps.sh --check || { echo "tests/run.sh: installing dependencies failed"; echo "0 passed, 1 failed, 0 skipped"; exit 1; }

CONFIG=(--config=ci)
[ -x /usr/local/cuda/bin/nvcc ] || CONFIG+=(--config=nocuda)
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=(//...)

# Count only this run's results: stale logs of removed targets must not count.
# Every configuration's logs go (bazel-testlogs may point at another one's,
# e.g. after a --config=asan run; see .bazelrc): Bazel re-creates or
# re-fetches from the disk cache those it needs.
out=$(readlink -f bazel-out 2>/dev/null || true)
if [ -n "$out" ] && [ -d "$out" ]; then
  for logs in "$out"/*/testlogs; do [ -d "$logs" ] && rm -rf "$logs"; done
fi

bazel --batch test "${CONFIG[@]}" -- "${TARGETS[@]}"
rc=$?

passed=0; failed=0; skipped=0
if [ -d bazel-testlogs ]; then
  while IFS= read -r xml; do
    read -r p f s < <(awk '
      /<testcase / { open = 1; bad = 0; skip = 0 }
      open && /<failure|<error/ { bad = 1 }
      open && /result="skipped"|<skipped/ { skip = 1 }
      open && (/<testcase [^>]*\/>/ || /<\/testcase>/) {
        if (bad) f++; else if (skip) s++; else p++
        open = 0
      }
      END { print p + 0, f + 0, s + 0 }' "$xml")
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
  done < <(find -L bazel-testlogs -name test.xml)
fi
if [ $rc -ne 0 ] && [ $failed -eq 0 ]; then
  echo "tests/run.sh: bazel exited $rc before any test failed (build error?)"
  failed=1
fi

# The thread-safety build, after the tests' results are counted. No
# convenience symlinks (--symlink_prefix=/): bazel-bin and bazel-testlogs
# keep pointing at the default build's outputs.
if [ "${SHARDLINE_CLANG_CHECK:-1}" != 0 ]; then
  bazel --batch build "${CONFIG[@]}" --config=clang --symlink_prefix=/ -- "${TARGETS[@]}"
  clang_rc=$?
  if [ $clang_rc -ne 0 ]; then
    echo "tests/run.sh: the clang thread-safety build (--config=clang) failed (exit $clang_rc)"
    failed=$((failed + 1))
    [ $rc -eq 0 ] && rc=$clang_rc
  fi
fi

# Bounded fuzzing (fuzz/BUILD): each fuzzer starts from its committed corpus
# and regressions in a scratch copy, so the tree is never written. A crash,
# a sanitizer report or a hang (-timeout) leaves its input under the scratch
# folder and fails the run; `bazel-bin/fuzz/<fuzzer> INPUT` replays it.
FUZZ_SECONDS="${SHARDLINE_FUZZ_SECONDS:-30}"
if [ "$FUZZ_SECONDS" != 0 ] && [ "$*" = "" ]; then
  if bazel --batch build "${CONFIG[@]}" --config=fuzz --symlink_prefix=/ -- //fuzz:spec_fuzzer //fuzz:rpc_fuzzer; then
    # The fuzz configuration's output directory (.bazelrc: --platform_suffix=fuzz).
    fuzz_bin="bazel-out/k8-optfuzz/bin/fuzz"
    scratch=$(mktemp -d /tmp/shardline-fuzz.XXXXXX)
    for target in spec rpc; do
      mkdir -p "$scratch/$target/corpus" "$scratch/$target/artifacts"
      cp fuzz/corpus/$target/* fuzz/regressions/$target/* "$scratch/$target/corpus/" 2>/dev/null
      if LSAN_OPTIONS=suppressions="$PWD/fuzz/lsan.supp" "$fuzz_bin/${target}_fuzzer" -max_total_time="$FUZZ_SECONDS" -timeout=30 \
           -close_fd_mask=3 -print_final_stats=1 -artifact_prefix="$scratch/$target/artifacts/" \
           "$scratch/$target/corpus" >"$scratch/$target/log" 2>&1; then
        passed=$((passed + 1))
        echo "tests/run.sh: ${target}_fuzzer: $(grep -m1 -o 'Done [0-9]* runs in [0-9]* second(s)' "$scratch/$target/log")"
      else
        failed=$((failed + 1)); [ $rc -eq 0 ] && rc=1
        echo "tests/run.sh: ${target}_fuzzer found a failing input (kept in $scratch/$target/artifacts):"
        grep -v -E '^#[0-9]+|^INFO:' "$scratch/$target/log" | tail -40
        keep_scratch=1
      fi
    done
    [ -z "${keep_scratch:-}" ] && rm -rf "$scratch"
  else
    echo "tests/run.sh: the fuzz build (--config=fuzz) failed"
    failed=$((failed + 1)); [ $rc -eq 0 ] && rc=1
  fi
fi
echo "${passed} passed, ${failed} failed, ${skipped} skipped"
exit $rc
