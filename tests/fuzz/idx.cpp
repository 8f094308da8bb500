// Fuzz target: bytes as an idx file (raw or gzip, as MNIST ships), through data::read_idx. A
// chorus::Error or a uint8 tensor whose size matches the dimensions the header declared.
#include "data/mnist.h"
#include "tensor/error.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace chorus;
  static const std::string path = fuzz::scratch_path("data-idx");
  fuzz::write_file(path, data, size);
  try {
    Tensor t = data::read_idx(path);
    fuzz::check(t.dtype() == kUInt8, "read_idx returned a tensor that is not uint8");
    // A raw file holds every element; a gzip one may expand, but the reader caps what it inflates.
    const bool gzip = size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
    if (!gzip) fuzz::check(static_cast<size_t>(t.numel()) <= size, "more elements than a raw file has bytes");
    if (t.numel() > 0) (void)t.reshape({-1})[t.numel() - 1].item<int64_t>();  // the last element is readable
  } catch (const Error&) {
  }
  return 0;
}
