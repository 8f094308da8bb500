// main() for the corpus tests: every file under the folders given (recursively) is passed to the
// target's LLVMFuzzerTestOneInput once, as libFuzzer would. A finding aborts (sanitizers, fuzz
// checks) or escapes as an exception other than chorus::Error (the targets catch that one): either
// way the test fails naming the input.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    if (!fs::is_directory(argv[i])) {
      std::fprintf(stderr, "replay: '%s' is not a folder of inputs\n", argv[i]);
      return 2;
    }
    for (const auto& entry : fs::recursive_directory_iterator(argv[i]))
      if (entry.is_regular_file()) inputs.push_back(entry.path());
  }
  std::sort(inputs.begin(), inputs.end());
  if (inputs.empty()) {
    std::fprintf(stderr, "replay: no inputs found (expected a seed corpus)\n");
    return 2;
  }
  for (const fs::path& path : inputs) {
    std::ifstream in(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    try {
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "replay: %s: unexpected exception: %s\n", path.c_str(), e.what());
      return 1;
    }
  }
  std::printf("replayed %zu inputs without a finding\n", inputs.size());
  return 0;
}
