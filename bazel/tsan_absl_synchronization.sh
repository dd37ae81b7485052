#!/usr/bin/env bash
# Builds a ThreadSanitizer-instrumented stand-in for Debian's
# libabsl_synchronization.so.20220623, for --config=tsan (.bazelrc).
#
# Debian's Abseil is not instrumented, so TSan cannot see absl::Mutex lock
# and unlock (they happen in that library's plain atomics and futex calls)
# and reports every access an absl::Mutex guards as a data race. Abseil's
# own Mutex tells TSan about each lock when it is compiled with
# -fsanitize=thread; this compiles it so, from Abseil's sources at the
# version Debian ships (20220623.1; Debian's headers give the same inline
# namespace and options), into a library with the same soname and symbols.
#
#   bazel/tsan_absl_synchronization.sh ABSEIL_SOURCE_DIR OUT_DIR
#   bazel --batch test --config=ci --config=tsan --test_env=LD_LIBRARY_PATH=OUT_DIR //...
#
# ABSEIL_SOURCE_DIR is a checkout of https://github.com/abseil/abseil-cpp at
# tag 20220623.1 (nothing here downloads it). Reports left inside Abseil's
# thread-identity reuse (ResetThreadIdentityBetweenReuse, Waiter) come from
# libabsl_base, still uninstrumented.
set -euo pipefail
src="${1:?usage: $0 ABSEIL_SOURCE_DIR OUT_DIR}"
out="${2:?usage: $0 ABSEIL_SOURCE_DIR OUT_DIR}"
mkdir -p "$out"
objs=()
for f in barrier.cc blocking_counter.cc internal/create_thread_identity.cc \
         internal/per_thread_sem.cc internal/waiter.cc mutex.cc notification.cc; do
  o="$out/$(basename "$f" .cc).o"
  # Only the .cc files come from the checkout: no -I, so every header is
  # Debian's (/usr/include/absl).
  g++ -std=c++17 -O1 -g -fPIC -fsanitize=thread -DNDEBUG -c "$src/absl/synchronization/$f" -o "$o"
  objs+=("$o")
done
g++ -shared -fsanitize=thread -Wl,-soname,libabsl_synchronization.so.20220623 \
  -o "$out/libabsl_synchronization.so.20220623" "${objs[@]}" \
  -labsl_graphcycles_internal -labsl_stacktrace -labsl_symbolize -labsl_time \
  -labsl_malloc_internal -labsl_base -labsl_spinlock_wait -labsl_raw_logging_internal
echo "built $out/libabsl_synchronization.so.20220623; test with --test_env=LD_LIBRARY_PATH=$out"
