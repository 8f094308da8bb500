// safetensors files and checkpoints: round trips of every dtype, the exact byte layout PyTorch's
// reader expects, errors for truncated/corrupt/hostile files, atomic replacement, and checkpoints.
#include <catch2/catch.hpp>
#include <limits>
#include <random>
#include <cerrno>
#include <signal.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>

#include "nn/nn.h"
#include "optim/optim.h"
#include "nn/serialize.h"
#include "tensor/ops.h"

namespace chorus {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("chorus_serialize_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
  static inline int counter = 0;
};

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.sizes() != b.sizes()) return false;
  Tensor ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.raw_data_ptr(), cb.raw_data_ptr(), ca.numel() * ca.element_size()) == 0;
}

// A file with the given header JSON and data bytes.
std::string make_file(const std::string& header, const std::string& data) {
  uint64_t n = header.size();
  std::string out(reinterpret_cast<const char*>(&n), 8);
  return out + header + data;
}

std::string load_error(const std::string& path) {
  try {
    nn::load_safetensors(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST_CASE("safetensors round trip keeps every dtype, shape, value and the metadata", "[nn][serialize]") {
  TempDir dir;
  Generator gen(7);
  nn::NamedTensors tensors = {
      {"f32", randn({3, 4}, {}, &gen)},
      {"f64", randn({2, 3, 2}, {.dtype = kFloat64}, &gen)},
      {"f16", randn({5}, {}, &gen).to(kFloat16)},
      {"bf16", randn({2, 2}, {}, &gen).to(kBFloat16)},
      {"i64", randint(-1000, 1000, {7}, {.dtype = kInt64}, &gen)},
      {"i32", randint(-1000, 1000, {3, 1}, {.dtype = kInt32}, &gen)},
      {"u8", randint(0, 255, {4}, {.dtype = kUInt8}, &gen)},
      {"bool", gt(randn({6}, {}, &gen), 0)},
      {"scalar", tensor(std::vector<double>{3.5}).reshape({})},
      {"empty", zeros({0, 3})},
      {"transposed", randn({3, 5}, {}, &gen).t()},  // non-contiguous: saved as its logical values
  };
  nn::save_safetensors(dir.file("a.safetensors"), tensors, {{"epoch", "3"}, {"note", "hello"}});
  nn::SafetensorsFile loaded = nn::load_safetensors(dir.file("a.safetensors"));
  REQUIRE(loaded.tensors.size() == tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    INFO(tensors[i].first);
    CHECK(loaded.tensors[i].first == tensors[i].first);
    CHECK(same_bytes(loaded.tensors[i].second, tensors[i].second));
  }
  CHECK(loaded.metadata == nn::Metadata{{"epoch", "3"}, {"note", "hello"}});
}

TEST_CASE("safetensors byte layout: u64 header length, JSON header, 8-byte aligned raw data", "[nn][serialize]") {
  TempDir dir;
  Tensor a = tensor(std::vector<float>{1.0f, -2.0f, 0.5f}), b = tensor<int64_t>({7, 8});
  nn::save_safetensors(dir.file("x.safetensors"), {{"a", a}, {"b", b}});
  const std::string bytes = read_all(dir.file("x.safetensors"));
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  CHECK(n % 8 == 0);
  auto header = nlohmann::json::parse(bytes.substr(8, n));
  CHECK(header["a"]["dtype"] == "F32");
  CHECK(header["a"]["shape"] == nlohmann::json::array({3}));
  CHECK(header["a"]["data_offsets"] == nlohmann::json::array({0, 12}));
  CHECK(header["b"]["dtype"] == "I64");
  CHECK(header["b"]["data_offsets"] == nlohmann::json::array({12, 28}));
  CHECK(bytes.size() == 8 + n + 28);
  float f[3];
  std::memcpy(f, bytes.data() + 8 + n, 12);
  CHECK(f[1] == -2.0f);
  int64_t g[2];  // the second tensor's bytes follow the first's
  std::memcpy(g, bytes.data() + 8 + n + 12, 16);
  CHECK(g[0] == 7);
  CHECK(g[1] == 8);
}

TEST_CASE("loading rejects truncated, corrupt and hostile files with a clear error", "[nn][serialize][errors]") {
  TempDir dir;
  nn::save_safetensors(dir.file("good.safetensors"), {{"w", randn({16, 16})}});
  const std::string good = read_all(dir.file("good.safetensors"));
  const std::string p = dir.file("bad.safetensors");

  write_all(p, good.substr(0, good.size() - 100));
  CHECK_THAT(load_error(p), Catch::Contains("outside the data section") && Catch::Contains("bad.safetensors"));
  write_all(p, good.substr(0, 5));
  CHECK_THAT(load_error(p), Catch::Contains("too short"));
  write_all(p, good.substr(0, 40));
  CHECK_THAT(load_error(p), Catch::Contains("runs past the end of the file"));
  std::string huge = good;
  const uint64_t big = 1ull << 40;
  std::memcpy(huge.data(), &big, 8);
  write_all(p, huge);
  CHECK_THAT(load_error(p), Catch::Contains("exceeds the limit"));
  write_all(p, make_file("{not json", ""));
  CHECK_THAT(load_error(p), Catch::Contains("not valid JSON"));
  write_all(p, make_file(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,12]}})", std::string(12, '\0')));
  CHECK_THAT(load_error(p), Catch::Contains("needs 8 bytes") && Catch::Contains("'x'"));
  write_all(p, make_file(R"({"x":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})", std::string(8, '\0')));
  CHECK_THAT(load_error(p), Catch::Contains("unsupported dtype"));
  write_all(p, make_file(R"({"x":{"dtype":"U8","shape":[-2],"data_offsets":[0,8]}})", std::string(8, '\0')));
  CHECK_THAT(load_error(p), Catch::Contains("non-negative"));
  write_all(p, make_file(R"({"x":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", std::string(8, '\0')));
  CHECK_THAT(load_error(p), Catch::Contains("too large"));
  write_all(p, make_file(R"({"x":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"y":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}})",
                         std::string(12, '\0')));
  CHECK_THAT(load_error(p), Catch::Contains("overlap"));
  // shape x element size that wraps around 2^64 (2^62 float32 = 2^64 bytes = "0") with an empty
  // byte range: refused before anything is allocated or read.
  write_all(p, make_file(R"({"x":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}})", ""));
  CHECK_THAT(load_error(p), Catch::Contains("needs more bytes than the file's whole data section"));
  write_all(p, make_file(R"({"x":{"dtype":"F64","shape":[1073741824,1073741824],"data_offsets":[0,0]}})", ""));
  CHECK_THAT(load_error(p), Catch::Contains("needs more bytes"));
  // A name twice: refused, not "last one wins".
  write_all(p, make_file(R"({"x":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"x":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
                         std::string(8, '\0')));
  CHECK_THAT(load_error(p), Catch::Contains("names tensor 'x' more than once"));
  write_all(p, make_file(R"({"x":{"dtype":"U8","shape":[8]}})", std::string(8, '\0')));
  CHECK_THAT(load_error(p), Catch::Contains("dtype, shape and data_offsets"));
  CHECK_THAT(load_error(dir.file("missing.safetensors")), Catch::Contains("cannot open"));
}

TEST_CASE("saving replaces a file atomically and a failed save leaves the old file intact", "[nn][serialize]") {
  TempDir dir;
  const std::string p = dir.file("m.safetensors");
  nn::save_safetensors(p, {{"v", ones({4})}});
  const std::string before = read_all(p);
  CHECK_THROWS_WITH(nn::save_safetensors(p, {{"v", ones({4})}, {"v", zeros({2})}}), Catch::Contains("appears twice"));
  CHECK_THROWS_WITH(nn::save_safetensors(p, {{"u", Tensor()}}), Catch::Contains("undefined"));
  CHECK(read_all(p) == before);
  nn::save_safetensors(p, {{"v", full({4}, 2.0)}});
  CHECK(nn::load_safetensors(p).tensors[0].second.sum().item<float>() == 8.0f);
  // No temporary files are left behind.
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir.path)) files += entry.is_regular_file();
  CHECK(files == 1);
  CHECK_THROWS_WITH(nn::save_safetensors(dir.file("no/such/dir/x.safetensors"), {{"v", ones({1})}}),
                    Catch::Contains("does not exist"));
}

TEST_CASE("every tensor carries a CRC-32C: a flipped bit anywhere in its bytes is caught", "[nn][serialize][errors]") {
  TempDir dir;
  const std::string p = dir.file("c.safetensors");
  Tensor a = randn({64, 32}), b = randint(0, 100, {10}, {.dtype = kInt64});
  nn::save_safetensors(p, {{"a", a}, {"b", b}}, {{"note", "kept"}});
  auto loaded = nn::load_safetensors(p);
  CHECK(loaded.metadata == nn::Metadata{{"note", "kept"}});  // the checksums are not the caller's metadata
  const std::string good = read_all(p);
  uint64_t n = 0;
  std::memcpy(&n, good.data(), 8);
  CHECK(nlohmann::json::parse(good.substr(8, n))["__metadata__"].contains("crc32c.a"));
  std::mt19937 rng(5);
  for (int trial = 0; trial < 30; ++trial) {  // 30 random single-bit flips in the data section
    std::string bad = good;
    const size_t byte = 8 + n + rng() % (good.size() - 8 - n);
    bad[byte] = static_cast<char>(bad[byte] ^ (1 << (rng() % 8)));
    write_all(p, bad);
    INFO("flipped byte " << byte);
    CHECK_THAT(load_error(p), Catch::Contains("does not match its checksum") && Catch::Contains("corrupt"));
  }
}

// The header's checksum entries cannot be turned off: every single-bit flip anywhere in the JSON
// header either fails to load or loads the very same tensors and metadata, and together with a
// flipped bit in either tensor's data it always fails (before these rules, 5 of 30 random header
// flips hit a "crc32c.<name>" key and left that tensor unchecked; the metadata had no checksum).
TEST_CASE("every single-bit flip in a header is refused or harmless: checksum keys must name tensors, every tensor and "
          "the metadata must have one",
          "[nn][serialize][errors]") {
  TempDir dir;
  const std::string p = dir.file("h.safetensors");
  const Tensor a = randn({4, 3}), b = randint(0, 100, {5}, {.dtype = kInt64});
  const nn::Metadata meta{{"step", "120"}, {"format", "chorus-checkpoint-1"}};
  nn::save_safetensors(p, {{"a", a}, {"b", b}}, meta);
  const std::string good = read_all(p);
  uint64_t n = 0;
  std::memcpy(&n, good.data(), 8);
  const size_t a_byte = 8 + n + 5, b_byte = 8 + n + 4 * 12 + 3;  // a's bytes come first, then b's
  int refused = 0, harmless = 0;
  for (uint64_t byte = 8; byte < 8 + n; ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string bad = good;
      bad[byte] = static_cast<char>(bad[byte] ^ (1 << bit));
      INFO("header byte " << byte << " ('" << good[byte] << "') bit " << bit << ": " << bad.substr(8, n));
      for (size_t data_byte : {a_byte, b_byte}) {  // with a corrupt tensor besides: never loads
        std::string worse = bad;
        worse[data_byte] = static_cast<char>(worse[data_byte] ^ 0x10);
        write_all(p, worse);
        INFO("and data byte " << data_byte);
        CHECK_THROWS_AS(nn::load_safetensors(p), Error);
      }
      write_all(p, bad);
      nn::SafetensorsFile f;
      try {
        f = nn::load_safetensors(p);
      } catch (const Error&) {
        ++refused;
        continue;
      }
      CHECK(f.metadata == meta);
      REQUIRE(f.tensors.size() == 2u);
      CHECK(f.tensors[0].first == "a");
      CHECK(same_bytes(f.tensors[0].second, a));
      CHECK(f.tensors[1].first == "b");
      CHECK(same_bytes(f.tensors[1].second, b));
      ++harmless;  // e.g. a space of the padding turned into another blank
    }
  }
  CHECK(refused > 0);
  UNSCOPED_INFO(refused << " flips refused, " << harmless << " harmless");
  // The rules one by one, with their messages.
  auto with_header = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json h = nlohmann::json::parse(good.substr(8, n));
    edit(h);
    write_all(p, make_file(h.dump(), good.substr(8 + n)));
    return load_error(p);
  };
  CHECK_THAT(with_header([](nlohmann::json& h) {
               h["__metadata__"]["crc32c.c"] = h["__metadata__"]["crc32c.a"];
             }),
             Catch::Contains("checksum key 'crc32c.c' names no tensor"));
  CHECK_THAT(with_header([](nlohmann::json& h) { h["__metadata__"].erase("crc32c.b"); }),
             Catch::Contains("tensor 'b' has no checksum"));
  CHECK_THAT(with_header([](nlohmann::json& h) { h["__metadata__"].erase("crc32c.__metadata__"); }),
             Catch::Contains("no 'crc32c.__metadata__'") && Catch::Contains("save it again"));
  CHECK_THAT(with_header([](nlohmann::json& h) { h["__metadata__"]["step"] = "121"; }),
             Catch::Contains("metadata does not match its checksum"));
  // A foreign file without checksums still loads (PyTorch's and Hugging Face's writers add none).
  const std::string plain =
      make_file(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"__metadata__":{"k":"v"}})", std::string(4, '\0'));
  write_all(p, plain);
  CHECK(nn::load_safetensors(p).metadata == nn::Metadata{{"k", "v"}});
  // The caller cannot write a key the checksums own.
  CHECK_THROWS_WITH(nn::save_safetensors(p, {{"a", a}}, {{"crc32c.a", "0"}}), Catch::Contains("starts with 'crc32c.'"));
}

TEST_CASE("a save removes temporaries that killed writers left behind, not a live writer's", "[nn][serialize]") {
  TempDir dir;
  const std::string target = dir.file("w.safetensors");
  // A pid no process has (the highest ones are free on any test machine), and one that is alive.
  pid_t dead = 4194000;
  while (::kill(dead, 0) == 0 || errno != ESRCH) ++dead;
  const std::string stale = dir.file(".w.safetensors.tmp." + std::to_string(dead));
  const std::string live = dir.file(".w.safetensors.tmp." + std::to_string(::getppid()));
  const std::string other = dir.file(".v.safetensors.tmp." + std::to_string(dead));  // another file's
  for (const std::string& f : {stale, live, other}) write_all(f, "partial");
  nn::save_safetensors(target, {{"a", randn({4})}});
  CHECK_FALSE(std::filesystem::exists(stale));
  CHECK(std::filesystem::exists(live));
  CHECK(std::filesystem::exists(other));
  CHECK(nn::load_safetensors(target).tensors.size() == 1);
}

TEST_CASE("a checkpoint round-trips model, optimizer and scheduler state, counters and RNG state", "[nn][serialize]") {
  TempDir dir;
  manual_seed(99);
  nn::Sequential model;
  model.push_back(std::make_shared<nn::Linear>(4, 3));
  model.push_back(std::make_shared<nn::BatchNorm1d>(3));
  randn({10});  // advance the generator
  nn::Checkpoint c;
  c.model = model.state_dict();
  c.optimizer = {{"state.0.momentum_buffer", randn({3, 4})}, {"param_groups.0.lr", tensor(std::vector<double>{0.1}).reshape({})}};
  c.scheduler = {{"last_epoch", tensor<int64_t>({4}).reshape({})}};
  c.epoch = 2;
  c.step = 938;
  c.extra["dataset"] = "mnist";
  c.capture_rng();
  const Tensor next = randn({5});  // what the generator gives after the capture
  c.save(dir.file("ckpt.safetensors"));

  nn::Checkpoint back = nn::Checkpoint::load(dir.file("ckpt.safetensors"));
  CHECK(back.epoch == 2);
  CHECK(back.step == 938);
  CHECK(back.extra.at("dataset") == "mnist");
  REQUIRE(back.model.size() == c.model.size());
  for (size_t i = 0; i < c.model.size(); ++i) {
    CHECK(back.model[i].first == c.model[i].first);
    CHECK(same_bytes(back.model[i].second, c.model[i].second));
  }
  CHECK(back.optimizer.size() == 2);
  CHECK(same_bytes(back.optimizer[0].second, c.optimizer[0].second));
  CHECK(back.scheduler[0].first == "last_epoch");
  manual_seed(1);
  back.restore_rng();
  CHECK(same_bytes(randn({5}), next));
  // The model loads its own state back (names and shapes checked by load_state_dict).
  nn::Sequential fresh;
  fresh.push_back(std::make_shared<nn::Linear>(4, 3));
  fresh.push_back(std::make_shared<nn::BatchNorm1d>(3));
  fresh.load_state_dict(back.model);
  CHECK(same_bytes(fresh.named_parameters()[0].second, model.named_parameters()[0].second));
  // A plain safetensors file is not a checkpoint.
  nn::save_safetensors(dir.file("plain.safetensors"), {{"w", ones({2})}});
  CHECK_THROWS_WITH(nn::Checkpoint::load(dir.file("plain.safetensors")), Catch::Contains("not a chorus checkpoint"));

  // A diverged model (NaN or infinity) does not replace the last good checkpoint.
  const std::string good = read_all(dir.file("ckpt.safetensors"));
  for (double bad : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    nn::Checkpoint diverged = c;
    diverged.model[0].second = c.model[0].second.clone();
    diverged.model[0].second.view({-1})[3].fill_(bad);
    CHECK_THROWS_WITH(diverged.save(dir.file("ckpt.safetensors")),
                      Catch::Contains("holds NaN or infinity") && Catch::Contains(c.model[0].first));
    CHECK(read_all(dir.file("ckpt.safetensors")) == good);
  }
  // Lying counters are refused on load.
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"epoch", "9223372036854775807"}, {"epoch", "-1000000"}, {"step", "-5"}}) {
    nn::Checkpoint lie = c;
    lie.save(dir.file("lie.safetensors"));
    auto file = nn::load_safetensors(dir.file("lie.safetensors"));
    file.metadata[key] = value;
    nn::save_safetensors(dir.file("lie.safetensors"), file.tensors, file.metadata);
    CHECK_THROWS_WITH(nn::Checkpoint::load(dir.file("lie.safetensors")), Catch::Contains(key + " " + value));
  }
}

TEST_CASE("a scheduler refuses a lying state: last_epoch far out of range, a non-finite base learning rate",
          "[nn][serialize][errors]") {
  Tensor w = randn({3}).requires_grad_();
  optim::SGD opt({w}, {.lr = 0.1});
  optim::CosineAnnealingLR sched(opt, 10);
  auto state = sched.state_dict();
  auto with = [&](const std::string& key, const Tensor& value) {
    auto s2 = state;
    for (auto& [name, t] : s2)
      if (name == key) t = value;
    return s2;
  };
  CHECK_THROWS_WITH(sched.load_state_dict(with("last_epoch", tensor<int64_t>({-(int64_t(1) << 62)}).reshape({}))),
                    Catch::Contains("last_epoch") && Catch::Contains("outside"));
  CHECK_THROWS_WITH(
      sched.load_state_dict(with("base_lrs.0", tensor(std::vector<double>{std::numeric_limits<double>::infinity()}).reshape({}))),
      Catch::Contains("not a valid learning rate"));
  sched.load_state_dict(state);  // the real one still loads
}

}  // namespace
}  // namespace chorus
