// Saving and loading tensors as safetensors files, and training checkpoints built on them.
//
// safetensors layout (what PyTorch's and Hugging Face's `safetensors` read): an 8-byte little-endian
// header length N; N bytes of JSON mapping each name to {"dtype", "shape", "data_offsets": [begin,
// end]} (offsets into the data section that follows), plus an optional "__metadata__" object of
// string -> string; then the raw little-endian data. Files are written atomically: a temporary file
// in the same folder, fsync, rename over the target, fsync of the folder. A crash leaves either the
// old file or the new one, never a mix.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "nn/module.h"

namespace chorus::nn {

using Metadata = std::map<std::string, std::string>;

struct SafetensorsFile {
  NamedTensors tensors;  // in data-offset order (the order they were saved in)
  Metadata metadata;
};

// Writes CPU tensors of any dtype and layout (non-contiguous ones are copied). Names must be unique
// and non-empty, and not "__metadata__".
void save_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata = {});

// Reads every tensor into fresh CPU memory. A missing file, a truncated file, a header that is not
// valid JSON or larger than the file (or than 100 MB), an unknown dtype, a shape that disagrees with
// its byte range, or offsets outside the data section or overlapping each other -> chorus::Error
// naming the file and the problem. Nothing is allocated for tensor data before the header checks out.
SafetensorsFile load_safetensors(const std::string& path);

// metadata[key] as an integer, parsed strictly (all of it, in int64 range); chorus::Error naming the
// file, the key and the value when it is absent or not an integer.
int64_t metadata_int(const Metadata& metadata, const std::string& key, const std::string& path);

// Writes `bytes` to `path` atomically (same-folder temporary file, fsync, rename, folder fsync).
void atomic_write(const std::string& path, const std::string& bytes);

// A training checkpoint: model state, optimizer state, LR-scheduler state (each the named tensors
// their state_dict() gives), the epoch and step reached, the default generator's state, and any
// extra strings. Saved as one safetensors file whose tensor names are prefixed "model.",
// "optimizer." and "scheduler."; a PyTorch user can open it with safetensors.torch.load_file.
struct Checkpoint {
  NamedTensors model, optimizer, scheduler;
  NamedTensors grad_scaler;  // optim::GradScaler::state_dict() when training with fp16 loss scaling, else empty
  int64_t epoch = 0;  // epochs completed
  int64_t step = 0;   // optimizer steps taken
  uint64_t rng_seed = 0, rng_offset = 0;
  Metadata extra;

  // Fills the generator fields from the default generator.
  void capture_rng();
  // Restores the default generator from the saved state.
  void restore_rng() const;

  void save(const std::string& path) const;
  // Loads and checks the file is a chorus checkpoint (its metadata says so).
  static Checkpoint load(const std::string& path);
};

}  // namespace chorus::nn
