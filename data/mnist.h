// MNIST and Fashion-MNIST from their idx files (raw or gzip), and the idx reader itself.
//
// Where the data is: `<data_dir>/mnist` and `<data_dir>/fashion-mnist`, with data_dir from the
// program's --data-dir, else $CHORUS_DATA_DIR, else ~/.cache/chorus/data — where tools/setup.sh
// installs it. A missing file is a chorus::Error that names it and the command that installs it.
#pragma once

#include <string>

#include "data/dataset.h"

namespace chorus::data {

// $CHORUS_DATA_DIR, else $HOME/.cache/chorus/data (HOME from the password database when unset).
std::string default_data_dir();

// Reads an idx file (magic 0x00000801 uint8 vectors, 0x00000803 uint8 images; big-endian dims),
// raw or gzip-compressed (detected by its first bytes). Returns a uint8 tensor of the file's dims.
// A missing, truncated or malformed file -> chorus::Error naming the file and the problem.
Tensor read_idx(const std::string& path);

enum class Split { Train, Test };

struct MNISTOptions {
  bool normalize = true;  // (x / 255 - mean) / std with the dataset's mean and std
};

// Images float32 [N, 1, 28, 28], targets int64 [N]. `root` is the folder holding the four files
// ({train,t10k}-{images-idx3,labels-idx1}-ubyte, optionally .gz).
class MNIST : public Dataset {
 public:
  MNIST(const std::string& root, Split split, MNISTOptions options = {});
  int64_t size() const override { return images_.size(0); }
  Example get(int64_t index) const override;
  Batch get_batch(const std::vector<int64_t>& indices) const override;
  const Tensor& images() const { return images_; }
  const Tensor& targets() const { return targets_; }
  static constexpr double kMean = 0.1307, kStd = 0.3081;

 protected:
  MNIST(const std::string& root, Split split, MNISTOptions options, double mean, double std, const char* name);

 private:
  Tensor images_, targets_;
};

class FashionMNIST : public MNIST {
 public:
  FashionMNIST(const std::string& root, Split split, MNISTOptions options = {})
      : MNIST(root, split, options, kMean, kStd, "Fashion-MNIST") {}
  static constexpr double kMean = 0.2860, kStd = 0.3530;
};

}  // namespace chorus::data
