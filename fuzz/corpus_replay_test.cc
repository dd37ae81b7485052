// Runs every input of the fuzz corpora (fuzz/corpus/<target>/) and every
// input a fuzzer once crashed on (fuzz/regressions/<target>/) through its
// target, as tests/run.sh's bounded libFuzzer run starts from them. A crash
// or a failed invariant aborts the test.
//
// The spec corpus doubles as a table of the parser's verdicts: a seed named
// ok-* must parse and validate, one named bad-* must be refused with
// InvalidArgument (the first byte of every seed is the format byte, see
// fuzz/spec_fuzz_target.h).
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "fuzz/rpc_fuzz_target.h"
#include "fuzz/spec_fuzz_target.h"
#include "gtest/gtest.h"
#include "spec/job_spec.h"
#include "spec/spec_file.h"

namespace shardline::fuzz {
namespace {

namespace fs = std::filesystem;

std::string Read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The files of fuzz/<folder>/<target>, sorted; none when it does not exist.
std::vector<fs::path> Inputs(const std::string& folder, const std::string& target) {
  std::vector<fs::path> out;
  const fs::path dir = fs::path("fuzz") / folder / target;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.is_regular_file()) out.push_back(entry.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

void RunAll(const std::string& target, int (*fuzz)(const uint8_t*, size_t), size_t min_seeds) {
  const std::vector<fs::path> seeds = Inputs("corpus", target);
  EXPECT_GE(seeds.size(), min_seeds) << "fuzz/corpus/" << target << " lost its seeds";
  std::vector<fs::path> all = seeds;
  for (const fs::path& p : Inputs("regressions", target)) all.push_back(p);
  for (const fs::path& path : all) {
    SCOPED_TRACE(path.string());
    const std::string bytes = Read(path);
    ASSERT_FALSE(bytes.empty()) << "an empty seed";
    EXPECT_EQ(fuzz(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), 0);
  }
}

TEST(CorpusReplay, SpecParserSurvivesEveryInput) { RunAll("spec", &FuzzJobSpec, 8); }

TEST(CorpusReplay, SpecSeedsGetTheVerdictTheirNameSays) {
  int ok = 0, bad = 0;
  for (const fs::path& path : Inputs("corpus", "spec")) {
    SCOPED_TRACE(path.string());
    const std::string name = path.filename().string();
    const std::string bytes = Read(path);
    ASSERT_GE(bytes.size(), 2u);
    static constexpr spec::SpecFormat kFormats[] = {
        spec::SpecFormat::kAuto, spec::SpecFormat::kYaml, spec::SpecFormat::kJson};
    absl::StatusOr<v1::JobSpec> parsed = spec::ParseJobSpec(
        bytes.substr(1), kFormats[static_cast<uint8_t>(bytes[0]) % 3], name);
    absl::StatusOr<v1::JobSpec> resolved =
        parsed.ok() ? spec::ResolveJobSpec(*parsed) : parsed.status();
    if (absl::StartsWith(name, "ok-")) {
      EXPECT_TRUE(resolved.ok()) << resolved.status();
      ++ok;
    } else if (absl::StartsWith(name, "bad-")) {
      EXPECT_EQ(resolved.status().code(), absl::StatusCode::kInvalidArgument)
          << resolved.status();
      ++bad;
    }
  }
  EXPECT_GE(ok, 3);
  EXPECT_GE(bad, 3);
}

TEST(CorpusReplay, CoordinatorSurvivesEveryInput) { RunAll("rpc", &FuzzCoordinatorRpcs, 5); }

}  // namespace
}  // namespace shardline::fuzz
