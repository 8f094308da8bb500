// data/: the DataLoader visits every sample once per epoch (shuffled or not, with and without
// worker threads), reproducibly for a seed and differently per epoch; DistributedSampler shards as
// PyTorch's do; the idx reader (raw and gzip) and its errors; MNIST and Fashion-MNIST as installed.
#include <catch2/catch.hpp>

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "data/data.h"
#include "tensor/ops.h"

namespace chorus {
namespace {

namespace fs = std::filesystem;

std::shared_ptr<data::TensorDataset> numbered(int64_t n) {
  // data[i] = [i, 2i]; target[i] = i.
  Tensor idx = arange(0, n, 1, TensorOptions{.dtype = kInt64});
  return std::make_shared<data::TensorDataset>(stack({idx, idx * 2}, 1), idx.clone());
}

std::vector<int64_t> visit(data::DataLoader& loader, std::vector<int64_t>* batch_sizes = nullptr) {
  std::vector<int64_t> seen;
  for (data::Batch& b : loader) {
    REQUIRE(b.data.size(0) == b.target.size(0));
    if (batch_sizes) batch_sizes->push_back(b.size());
    for (int64_t i = 0; i < b.size(); ++i) {
      const int64_t t = b.target[i].item<int64_t>();
      CHECK(b.data[i][1].item<int64_t>() == 2 * t);  // rows stay paired with their targets
      seen.push_back(t);
    }
  }
  return seen;
}

TEST_CASE("DataLoader visits every sample exactly once per epoch, with and without workers", "[data][loader]") {
  for (int workers : {0, 2}) {
    for (bool shuffle : {false, true}) {
      for (bool drop_last : {false, true}) {
        INFO("workers " << workers << " shuffle " << shuffle << " drop_last " << drop_last);
        data::DataLoader loader(numbered(103), {.batch_size = 10, .shuffle = shuffle, .seed = 5, .drop_last = drop_last,
                                                .num_workers = workers});
        CHECK(loader.size() == (drop_last ? 10 : 11));
        std::vector<int64_t> sizes;
        std::vector<int64_t> seen = visit(loader, &sizes);
        CHECK(static_cast<int64_t>(sizes.size()) == loader.size());
        CHECK(sizes.back() == (drop_last ? 10 : 3));
        std::set<int64_t> unique(seen.begin(), seen.end());
        CHECK(unique.size() == seen.size());  // no repeats
        CHECK(seen.size() == (drop_last ? 100u : 103u));
        if (!shuffle) {
          for (size_t i = 0; i < seen.size(); ++i) CHECK(seen[i] == static_cast<int64_t>(i));
        }
      }
    }
  }
}

TEST_CASE("shuffling is reproducible for a seed, differs per epoch, and workers keep the order", "[data][loader]") {
  data::DataLoader a(numbered(50), {.batch_size = 7, .shuffle = true, .seed = 11});
  data::DataLoader b(numbered(50), {.batch_size = 7, .shuffle = true, .seed = 11, .num_workers = 3});
  data::DataLoader c(numbered(50), {.batch_size = 7, .shuffle = true, .seed = 12});
  std::vector<int64_t> a0 = visit(a), a1 = visit(a), b0 = visit(b), b1 = visit(b), c0 = visit(c);
  CHECK(a0 == b0);
  CHECK(a1 == b1);
  CHECK(a0 != a1);
  CHECK(a0 != c0);
  a.set_epoch(1);
  CHECK(visit(a) == a1);  // set_epoch replays an epoch (resuming)
}

TEST_CASE("skip_batches resumes mid-epoch: the rest of that epoch, then whole epochs again", "[data][loader]") {
  for (int workers : {0, 2}) {
    INFO("workers " << workers);
    data::DataLoader full(numbered(50), {.batch_size = 7, .shuffle = true, .seed = 3, .num_workers = workers});
    std::vector<int64_t> e0 = visit(full), e1 = visit(full);
    data::DataLoader resumed(numbered(50), {.batch_size = 7, .shuffle = true, .seed = 3, .num_workers = workers});
    resumed.set_epoch(0);
    resumed.skip_batches(3);
    CHECK(visit(resumed) == std::vector<int64_t>(e0.begin() + 21, e0.end()));
    CHECK(visit(resumed) == e1);  // the skip applied to one pass only
    resumed.skip_batches(resumed.size());
    CHECK(visit(resumed).empty());
    CHECK_THROWS_WITH(resumed.skip_batches(9), Catch::Contains("9 is outside [0, 8]"));
    CHECK_THROWS_WITH(resumed.skip_batches(-1), Catch::Contains("outside"));
  }
}

TEST_CASE("DistributedSampler: disjoint shards that cover the data, padded as PyTorch", "[data][sampler]") {
  for (bool shuffle : {false, true}) {
    std::vector<int64_t> all;
    for (int r = 0; r < 4; ++r) {
      data::DistributedSampler s(100, 4, r, shuffle, 3);
      auto idx = s.indices();
      CHECK(idx.size() == 25u);
      all.insert(all.end(), idx.begin(), idx.end());
    }
    std::sort(all.begin(), all.end());
    for (int64_t i = 0; i < 100; ++i) CHECK(all[i] == i);
  }
  // 10 samples over 4 ranks without shuffle: indices 0..9 padded with 0, 1 -> rank r takes r::4.
  std::vector<std::vector<int64_t>> expected = {{0, 4, 8}, {1, 5, 9}, {2, 6, 0}, {3, 7, 1}};
  for (int r = 0; r < 4; ++r) CHECK(data::DistributedSampler(10, 4, r, false).indices() == expected[r]);
  // drop_last cuts to a multiple of the replicas instead.
  CHECK(data::DistributedSampler(10, 4, 3, false, 0, true).indices() == std::vector<int64_t>{3, 7});
  // Padding longer than the data repeats it several times (2 samples over 5 ranks).
  CHECK(data::DistributedSampler(2, 5, 4, false).indices() == std::vector<int64_t>{0});
  // Same seed and epoch -> the same permutation on every rank; a new epoch -> a new one.
  data::DistributedSampler s0(40, 2, 0, true, 9), s1(40, 2, 1, true, 9);
  auto e0 = s0.indices();
  s0.set_epoch(1);
  CHECK(s0.indices() != e0);
  std::set<int64_t> u(e0.begin(), e0.end());
  for (int64_t i : s1.indices()) CHECK(u.count(i) == 0);
  CHECK_THROWS_WITH(data::DistributedSampler(10, 4, 4), Catch::Contains("invalid rank 4"));
  // A loader over a DistributedSampler gives this rank's share.
  data::DataLoader loader(numbered(10), {.batch_size = 2, .sampler = std::make_shared<data::DistributedSampler>(10, 4, 2, false)});
  CHECK(visit(loader) == std::vector<int64_t>{2, 6, 0});
}

struct Failing : data::Dataset {
  int64_t size() const override { return 20; }
  data::Example get(int64_t i) const override {
    if (i == 13) fail("example 13 is unreadable");
    return {full({2}, static_cast<double>(i)), tensor<int64_t>({i}).reshape({})};
  }
};

TEST_CASE("a worker's exception reaches the consumer; stopping early joins the workers", "[data][loader]") {
  for (int workers : {0, 2}) {
    data::DataLoader loader(std::make_shared<Failing>(), {.batch_size = 4, .num_workers = workers});
    int batches = 0;
    CHECK_THROWS_WITH(
        [&] {
          for (data::Batch& b : loader) {
            (void)b;
            ++batches;
          }
        }(),
        Catch::Contains("example 13 is unreadable"));
    CHECK(batches == 3);
  }
  data::DataLoader big(numbered(1000), {.batch_size = 1, .num_workers = 4});
  for (data::Batch& b : big) {
    if (b.target[0].item<int64_t>() == 5) break;  // the epoch's destructor stops and joins the workers
  }
  CHECK_THROWS_WITH(data::TensorDataset(zeros({5, 2}), zeros({4})), Catch::Contains("[5, 2]") && Catch::Contains("[4]"));
  CHECK_THROWS_WITH(data::DataLoader(numbered(5), {.batch_size = 0}), Catch::Contains("batch_size must be >= 1"));
}

// ------------------------------------------------------------------ idx files
struct TempDir {
  fs::path path = fs::temp_directory_path() / ("chorus_data_test_" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& n) const { return (path / n).string(); }
};

std::string idx_bytes(const std::vector<uint32_t>& dims, const std::vector<uint8_t>& payload) {
  std::string s = {0, 0, 8, static_cast<char>(dims.size())};
  for (uint32_t d : dims) {
    for (int k = 3; k >= 0; --k) s.push_back(static_cast<char>((d >> (8 * k)) & 0xff));
  }
  s.append(payload.begin(), payload.end());
  return s;
}

void write_raw(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

void write_gz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}

std::string idx_error(const std::string& path) {
  try {
    data::read_idx(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST_CASE("read_idx reads raw and gzip idx files and rejects bad ones", "[data][idx]") {
  TempDir dir;
  std::vector<uint8_t> payload(2 * 3 * 4);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 7 + 1);
  const std::string good = idx_bytes({2, 3, 4}, payload);
  write_raw(dir.file("a.idx"), good);
  write_gz(dir.file("a.idx.gz"), good);
  for (const char* name : {"a.idx", "a.idx.gz"}) {
    Tensor t = data::read_idx(dir.file(name));
    CHECK(t.sizes() == Shape{2, 3, 4});
    CHECK(t.dtype() == kUInt8);
    CHECK(t[1][2][3].item<uint8_t>() == payload[23]);
  }
  write_raw(dir.file("short.idx"), good.substr(0, good.size() - 3));
  CHECK_THAT(idx_error(dir.file("short.idx")), Catch::Contains("truncated or corrupt") && Catch::Contains("short.idx"));
  write_gz(dir.file("short.idx.gz"), good.substr(0, good.size() - 3));
  CHECK_THAT(idx_error(dir.file("short.idx.gz")), Catch::Contains("truncated or corrupt"));
  // Bytes after the data, and a header that claims more than a gzip file can hold: the sizes named.
  write_raw(dir.file("long.idx"), good + "xyz");
  CHECK_THAT(idx_error(dir.file("long.idx")), Catch::Contains("(24 bytes of data) but holds 27 bytes"));
  write_gz(dir.file("long.idx.gz"), good + "xyz");
  CHECK_THAT(idx_error(dir.file("long.idx.gz")), Catch::Contains("(24 bytes of data) but holds 27 bytes"));
  CHECK_THAT(idx_error(dir.file("short.idx.gz")), Catch::Contains("(24 bytes of data) but holds 21 bytes"));
  write_gz(dir.file("huge.idx.gz"), idx_bytes({1000000, 1000, 100}, payload));
  CHECK_THAT(idx_error(dir.file("huge.idx.gz")), Catch::Contains("(100000000000 bytes of data) but holds 24 bytes"));
  // A gzip stream cut in half.
  std::ifstream in(dir.file("a.idx.gz"), std::ios::binary);
  std::string gz((std::istreambuf_iterator<char>(in)), {});
  write_raw(dir.file("cut.idx.gz"), gz.substr(0, gz.size() / 2));
  CHECK_THAT(idx_error(dir.file("cut.idx.gz")), Catch::Contains("cut.idx.gz"));
  write_raw(dir.file("magic.idx"), std::string("\x00\x00\x0d\x01\x00\x00\x00\x01\x05", 9));
  CHECK_THAT(idx_error(dir.file("magic.idx")), Catch::Contains("magic 0x00000d01"));
  CHECK_THAT(idx_error(dir.file("none.idx")), Catch::Contains("does not exist"));
}

// ------------------------------------------------------------------ MNIST as installed
TEST_CASE("MNIST and Fashion-MNIST load from the installed data with the right sizes and labels", "[data][mnist]") {
  const std::string root = data::default_data_dir();
  INFO("data dir " << root << " (tools/setup.sh installs it)");
  data::MNIST train(root + "/mnist", data::Split::Train), test(root + "/mnist", data::Split::Test);
  CHECK(train.size() == 60000);
  CHECK(test.size() == 10000);
  CHECK(train.images().sizes() == Shape{60000, 1, 28, 28});
  CHECK(train.targets()[0].item<int64_t>() == 5);  // the famous first digit
  Tensor counts = zeros({10}, {.dtype = kInt64});
  counts = one_hot(train.targets(), 10).sum({0});
  CHECK(counts[1].item<int64_t>() == 6742);  // the official class counts
  CHECK(counts[5].item<int64_t>() == 5421);
  // Normalized: mean about 0, std about 1 over the training set.
  CHECK(std::abs(train.images().mean().item<float>()) < 0.01);
  CHECK(chorus::std(train.images()).item<float>() == Approx(1.0).epsilon(0.01));
  data::FashionMNIST fashion(root + "/fashion-mnist", data::Split::Train);
  CHECK(fashion.size() == 60000);
  CHECK(fashion.targets()[0].item<int64_t>() == 9);  // ankle boot
  CHECK(std::abs(fashion.images().mean().item<float>()) < 0.01);
  data::Batch b = train.get_batch({0, 1, 2});
  CHECK(b.data.sizes() == Shape{3, 1, 28, 28});
  CHECK_THROWS_WITH(data::MNIST("/nonexistent/mnist", data::Split::Train),
                    Catch::Contains("train-images-idx3-ubyte not found") && Catch::Contains("tools/setup.sh"));
}

// [Pixels through a table]: the loaded images are, bit for bit, the ops the table runs applied to the
// raw bytes of the whole file (the way they were computed before the table).
TEST_CASE("MNIST and Fashion-MNIST pixels are (x / 255 - mean) / std of the file's bytes, bit for bit",
          "[data][mnist]") {
  const std::string root = data::default_data_dir();
  INFO("data dir " << root << " (tools/setup.sh installs it)");
  auto raw = [&](const std::string& dir) {
    const std::string path = root + "/" + dir + "/t10k-images-idx3-ubyte";
    return data::read_idx(std::filesystem::exists(path) ? path : path + ".gz");
  };
  // (Float equality is bit equality here: no pixel value is NaN or a signed zero.)
  auto same_bits = [](const Tensor& a, const Tensor& b) { return a.sizes() == b.sizes() && equal(a, b.contiguous()); };
  const Tensor digits = raw("mnist"), clothes = raw("fashion-mnist");
  data::MNIST mnist(root + "/mnist", data::Split::Test);
  CHECK(same_bits(mnist.images(),
                  digits.to(kFloat32).div(255.0).unsqueeze(1).sub(data::MNIST::kMean).div(data::MNIST::kStd)));
  data::FashionMNIST fashion(root + "/fashion-mnist", data::Split::Test);
  CHECK(same_bits(fashion.images(), clothes.to(kFloat32).div(255.0).unsqueeze(1).sub(data::FashionMNIST::kMean)
                                        .div(data::FashionMNIST::kStd)));
  data::MNIST plain(root + "/mnist", data::Split::Test, {.normalize = false});
  CHECK(same_bits(plain.images(), digits.to(kFloat32).div(255.0).unsqueeze(1)));
  // Control: the wrong constants give different bits (the comparison can fail).
  CHECK_FALSE(same_bits(fashion.images(), clothes.to(kFloat32).div(255.0).unsqueeze(1).sub(data::MNIST::kMean)
                                              .div(data::MNIST::kStd)));
}

}  // namespace
}  // namespace chorus
