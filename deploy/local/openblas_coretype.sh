# shellcheck shell=bash
# Sourced by deploy/local/demo.sh and bench/run.sh: picks OPENBLAS_CORETYPE
# for Debian 12's OpenBLAS 0.3.21, which takes some virtual CPUs with AVX2
# (and AVX-512) for a "Prescott" and then runs its SSE3 kernels, about 2x
# slower. Where OpenBLAS itself names such an old core (its report under
# OPENBLAS_VERBOSE=2), the SkylakeX kernels are right on a CPU with AVX-512
# and the Haswell ones on a CPU with AVX2; where it finds a core of its own,
# that stands, and an explicit OPENBLAS_CORETYPE always wins.
#
#   . deploy/local/openblas_coretype.sh
#   choose_openblas_coretype BINARY   # any of our programs that links OpenBLAS
#
# Sets and exports OPENBLAS_CORETYPE or leaves it alone, and sets
# openblas_note to one line saying what OpenBLAS detected and what was
# chosen ("" when nothing was asked).
choose_openblas_coretype() {
  local binary="$1" core
  openblas_note=""
  [ -n "${OPENBLAS_CORETYPE:-}" ] && return 0
  grep -qw avx2 /proc/cpuinfo 2>/dev/null || return 0
  core=$(OPENBLAS_VERBOSE=2 "$binary" --help 2>&1 | sed -n 's/^Core: //p' | head -1) || core=""
  case "$core" in
    "" | Prescott | Core2 | Nehalem | Sandybridge)
      if grep -qw avx512f /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX
      else export OPENBLAS_CORETYPE=Haswell; fi ;;
  esac
  openblas_note="OpenBLAS detects core '${core:-?}'; OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(its own choice)}"
}
