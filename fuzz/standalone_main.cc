// main() for a fuzz target built without libFuzzer (the default gcc build):
// runs every file named on the command line, and every file in every folder
// named, through LLVMFuzzerTestOneInput once, as `fuzzer FILE...` does. So
// a crash input found by the libFuzzer build reproduces in any build:
//   bazel-bin/fuzz/spec_fuzzer crash-1234
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

int RunFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    return 1;
  }
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int failures = 0;
  int ran = 0;
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path arg(argv[i]);
    std::error_code ec;
    if (std::filesystem::is_directory(arg, ec)) {
      std::vector<std::filesystem::path> files;
      for (const auto& entry : std::filesystem::directory_iterator(arg)) {
        if (entry.is_regular_file()) files.push_back(entry.path());
      }
      std::sort(files.begin(), files.end());
      for (const auto& f : files) failures += RunFile(f), ++ran;
    } else {
      failures += RunFile(arg), ++ran;
    }
  }
  std::fprintf(stderr, "ran %d inputs, %d unreadable\n", ran, failures);
  return failures == 0 ? 0 : 1;
}
