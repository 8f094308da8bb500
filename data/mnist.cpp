#include "data/mnist.h"

#include <pwd.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "tensor/ops.h"

namespace chorus::data {

std::string default_data_dir() {
  if (const char* env = std::getenv("CHORUS_DATA_DIR"); env != nullptr && *env != '\0') return env;
  std::string home;
  if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0') {
    home = h;
  } else if (const passwd* pw = ::getpwuid(::getuid()); pw != nullptr && pw->pw_dir != nullptr) {
    home = pw->pw_dir;  // bazel test runs without HOME; the password database still knows it
  } else {
    home = ".";
  }
  return home + "/.cache/chorus/data";
}

namespace {

// A raw or gzip file read in order (gzopen reads raw files unchanged, too).
class IdxReader {
 public:
  explicit IdxReader(const std::string& path) : path_(path), f_(gzopen(path.c_str(), "rb")) {
    if (f_ == nullptr) fail("read_idx: cannot open {}", path);
  }
  ~IdxReader() { gzclose(f_); }
  bool direct() { return gzdirect(f_) != 0; }  // a raw file, not gzip
  IdxReader(const IdxReader&) = delete;
  IdxReader& operator=(const IdxReader&) = delete;

  // Reads up to n bytes into out; fewer only where the data ends.
  size_t read(void* out, size_t n) {
    size_t done = 0;
    while (done < n) {
      const unsigned want = static_cast<unsigned>(std::min<size_t>(n - done, size_t{1} << 30));
      const int got = gzread(f_, static_cast<char*>(out) + done, want);
      if (got < 0) {
        int code = 0;
        fail("read_idx: {} is corrupt (gzip error: {})", path_, gzerror(f_, &code));
      }
      if (got == 0) break;
      done += static_cast<size_t>(got);
    }
    return done;
  }

  // Reads what is left and returns its size; then a gzip stream must have ended properly.
  size_t rest() {
    std::vector<char> chunk(size_t{1} << 16);
    size_t n = 0;
    for (size_t got; (got = read(chunk.data(), chunk.size())) > 0;) n += got;
    if (!gzdirect(f_) && gzeof(f_) == 0) {
      fail("read_idx: {} ends in the middle of its gzip stream (truncated download?)", path_);
    }
    return n;
  }

 private:
  std::string path_;
  gzFile f_;
};

uint32_t big_endian(const unsigned char* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

}  // namespace

Tensor read_idx(const std::string& path) {
  if (!std::filesystem::exists(path)) fail("read_idx: file {} does not exist", path);
  // The pixels are read straight into the tensor: no copy of the whole file in between.
  IdxReader in(path);
  unsigned char p[4 + 4 * 4];
  const size_t got = in.read(p, 4);
  if (got < 4) fail("read_idx: {} is {} bytes, too short for an idx header", path, got + in.rest());
  const uint32_t magic = big_endian(p);
  if ((magic >> 8) != 0x08) {
    fail("read_idx: {} has magic 0x{:08x}; expected an idx file of unsigned bytes (0x00000801 or 0x00000803)", path, magic);
  }
  const int dims = static_cast<int>(magic & 0xff);
  if (dims < 1 || dims > 4) fail("read_idx: {} declares {} dims; expected 1 to 4", path, dims);
  const size_t header = 4 + 4 * static_cast<size_t>(dims);
  if (in.read(p + 4, header - 4) < header - 4) fail("read_idx: {} is truncated inside its header", path);
  Shape shape;
  uint64_t count = 1;
  for (int d = 0; d < dims; ++d) {
    shape.push_back(big_endian(p + 4 + 4 * d));
    count *= static_cast<uint64_t>(shape.back());
  }
  auto wrong_size = [&](uint64_t held) {
    fail("read_idx: {} has dims {} ({} bytes of data) but holds {} bytes after the header (truncated or corrupt)", path,
         shape_str(shape), count, held);
  };
  // Refused before allocating: a corrupt header could ask for any size.
  const uint64_t file_bytes = std::filesystem::file_size(path);
  if (in.direct() && file_bytes - header != count) wrong_size(file_bytes - header);
  // deflate expands at most 1032:1, so a gzip file cannot hold more than that.
  if (!in.direct() && count / 1032 > file_bytes) wrong_size(in.rest());
  Tensor t = empty(shape, TensorOptions{.dtype = kUInt8});
  const size_t data = count > 0 ? in.read(t.raw_data_ptr(), count) : 0;
  const size_t extra = in.rest();
  if (data != count || extra != 0) wrong_size(data + extra);
  return t;
}

namespace {

// out[i] = table[pixels[i]]. Not instrumented by ThreadSanitizer: under TSan this scalar loop,
// three instrumented accesses a pixel, made data_test's MNIST case take 23 s and the test time out
// (2026-11-30); nothing here can race: the table is local, the bytes are read only, and `out` is a
// tensor nobody else holds yet. (ASan still checks every access.)
__attribute__((no_sanitize("thread"))) void look_up(const float* table, const unsigned char* pixels, float* out,
                                                  int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = table[pixels[i]];
}

std::string find_file(const std::string& root, const std::string& name, const char* dataset) {
  for (const std::string& candidate : {root + "/" + name, root + "/" + name + ".gz"}) {
    if (std::filesystem::exists(candidate)) return candidate;
  }
  fail("{}: {} not found in {} (neither {} nor {}.gz). Run tools/setup.sh to install it, or point --data-dir / "
       "CHORUS_DATA_DIR at the folder that holds mnist/ and fashion-mnist/",
       dataset, name, root, name, name);
}

}  // namespace

MNIST::MNIST(const std::string& root, Split split, MNISTOptions options)
    : MNIST(root, split, options, kMean, kStd, "MNIST") {}

MNIST::MNIST(const std::string& root, Split split, MNISTOptions options, double mean, double std, const char* name) {
  const std::string prefix = split == Split::Train ? "train" : "t10k";
  Tensor images = read_idx(find_file(root, prefix + "-images-idx3-ubyte", name));
  Tensor labels = read_idx(find_file(root, prefix + "-labels-idx1-ubyte", name));
  if (images.dim() != 3 || images.size(1) != 28 || images.size(2) != 28) {
    fail("{}: images file holds shape {}; expected [N, 28, 28]", name, shape_str(images.sizes()));
  }
  if (labels.dim() != 1 || labels.size(0) != images.size(0)) {
    fail("{}: {} labels for {} images", name, labels.dim() == 1 ? labels.size(0) : -1, images.size(0));
  }
  // [Pixels through a table] A pixel is one of 256 bytes, so its float is one of 256 values: the
  // table runs the same ops (x / 255, then (x - mean) / std) on the 256 levels, and one pass looks
  // every pixel up. The same bits as running them on the whole set, which took four passes and four
  // 188 MB temporaries (2026-11-30: examples/mnist --max-steps 1 took 3.38 s and 974 MB peak RSS,
  // 1.93 s and 547 MB with the table; dozens of such programs run in a full test run).
  Tensor levels = arange(256, TensorOptions{.dtype = kInt64}).to(kUInt8).to(kFloat32).div(255.0);
  if (options.normalize) levels = levels.sub(mean).div(std);
  levels = levels.contiguous();
  Shape shape = images.sizes();
  shape.insert(shape.begin() + 1, 1);
  images_ = empty(shape, TensorOptions{.dtype = kFloat32});
  look_up(levels.data_ptr<float>(), static_cast<const unsigned char*>(images.raw_data_ptr()), images_.data_ptr<float>(),
          images.numel());
  targets_ = labels.to(kInt64);
}

Example MNIST::get(int64_t index) const {
  check_index(index);
  return {images_.select(0, index), targets_.select(0, index)};
}

Batch MNIST::get_batch(const std::vector<int64_t>& indices) const {
  for (int64_t i : indices) check_index(i);
  Tensor idx = tensor(indices);
  return {index_select(images_, 0, idx), index_select(targets_, 0, idx)};
}

}  // namespace chorus::data
