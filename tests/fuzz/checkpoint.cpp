// Fuzz target: bytes as a checkpoint file, resumed the way the examples resume (load the
// safetensors file, check its metadata, load model, optimizer and scheduler state, restore the
// generator), then one training step from the loaded state. Whatever the bytes, the outcome is
// a chorus::Error or a model that trains; never a crash, a read outside a buffer or another exception.
#include <cmath>

#include "examples/common/example_util.h"
#include "tests/fuzz/checkpoint_model.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace chorus;
  static const std::string path = fuzz::scratch_path("checkpoint.safetensors");
  fuzz::write_file(path, data, size);
  // The plain reader first: what it returns must agree with the header it accepted.
  try {
    nn::SafetensorsFile file = nn::load_safetensors(path);
    for (const auto& [name, t] : file.tensors) {
      fuzz::check(!name.empty(), "a loaded tensor has an empty name");
      fuzz::check(t.defined() && t.is_contiguous(), "a loaded tensor is undefined or not contiguous");
      fuzz::check(static_cast<size_t>(t.numel()) * t.element_size() <= size, "tensor bytes beyond the file's size");
    }
  } catch (const Error&) {
  }
  fuzz::CheckpointModel state;
  try {
    examples::load_checkpoint(path, *state.model, *state.opt, *state.sched, {{"model", "fuzz"}});
  } catch (const Error&) {
    return 0;
  }
  // Loaded: one step from that state must run (it may diverge; that is the data's business).
  state.step();
  return 0;
}
