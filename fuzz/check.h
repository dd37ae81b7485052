// The fuzz targets' invariant check: a failed invariant aborts, which
// libFuzzer (and fuzz/corpus_replay_test.cc) reports as a crash.
#ifndef SHARDLINE_FUZZ_CHECK_H_
#define SHARDLINE_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>
#include <string>

namespace shardline::fuzz {

// Aborts with `what` (and `detail`, when given) on stderr unless `ok`.
inline void CheckOrDie(bool ok, const char* what, const std::string& detail = "") {
  if (ok) return;
  std::fprintf(stderr, "fuzz invariant failed: %s\n%s\n", what, detail.c_str());
  std::abort();
}

}  // namespace shardline::fuzz

#endif  // SHARDLINE_FUZZ_CHECK_H_
