// Fuzz target: the FileStore's shared file (records appended by every process of a job on one
// machine), as a corrupt or hostile file would be read. A chorus::Error or consistent answers.
#include "distributed/store.h"
#include "tensor/error.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace chorus;
  static const std::string path = fuzz::scratch_path("file-store");
  fuzz::write_file(path, data, size);
  try {
    distributed::FileStore store(path, std::chrono::milliseconds(10));
    const int64_t n = store.num_keys();
    fuzz::check(n >= 0, "a negative key count");
    if (store.check({"a"})) (void)store.get("a");
    store.set("fuzz", std::string("x"));
    fuzz::check(store.get_string("fuzz") == "x", "a key just set does not read back");
    (void)store.add("counter", 3);
  } catch (const Error&) {
  }
  return 0;
}
