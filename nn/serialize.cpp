#include "nn/serialize.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>
#include <vector>

#include "tensor/generator.h"
#include "tensor/ops.h"

namespace chorus::nn {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian; so is this code");

namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // as the reference implementation's limit

const char* st_dtype(DType d) {
  switch (d) {
    case kFloat64: return "F64";
    case kFloat32: return "F32";
    case kFloat16: return "F16";
    case kBFloat16: return "BF16";
    case kInt64: return "I64";
    case kInt32: return "I32";
    case kUInt8: return "U8";
    case kBool: return "BOOL";
  }
  return "?";
}

bool parse_dtype(const std::string& s, DType& out) {
  static const std::map<std::string, DType> table = {{"F64", kFloat64}, {"F32", kFloat32}, {"F16", kFloat16},
                                                     {"BF16", kBFloat16}, {"I64", kInt64}, {"I32", kInt32},
                                                     {"U8", kUInt8},     {"BOOL", kBool}};
  auto it = table.find(s);
  if (it == table.end()) return false;
  out = it->second;
  return true;
}

std::string errno_text() { return std::strerror(errno); }

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// CRC-32C (Castagnoli), with the SSE4.2 instruction (every x86-64 CPU chorus runs on has it).
__attribute__((target("sse4.2"))) uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t c = ~crc;
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = __builtin_ia32_crc32di(c, word);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n--) c32 = __builtin_ia32_crc32qi(c32, *p++);
  return ~c32;
}

// A tensor's checksum: its dtype and shape, then its bytes (a flipped shape or dtype is caught too).
uint32_t tensor_crc(const std::string& dtype, const Shape& shape, const void* data, size_t bytes) {
  const std::string head = dtype + shape_str(shape);
  return crc32c(data, bytes, crc32c(head.data(), head.size()));
}

constexpr const char* kCrcPrefix = "crc32c.";
// The checksum of the caller's metadata ("crc32c.__metadata__"), over each key and value with their
// lengths, in key order (the checksums themselves excluded).
constexpr const char* kMetadataCrcKey = "crc32c.__metadata__";
std::string metadata_crc(const Metadata& metadata) {
  uint32_t crc = 0;
  for (const auto& [k, v] : metadata) {
    if (k.rfind(kCrcPrefix, 0) == 0) continue;
    for (const std::string* s : {&k, &v}) {
      const uint64_t len = s->size();
      crc = crc32c(&len, sizeof len, crc);
      crc = crc32c(s->data(), s->size(), crc);
    }
  }
  return fmt::format("{:08x}", crc);
}

}  // namespace

// Writes the pieces, in order, to a temporary file beside `path`, flushes it to disk and renames it
// over `path` (atomic_write's contract, for a file held in several buffers: save_safetensors hands
// over the tensors' own memory instead of first copying a whole checkpoint into one string).
static void atomic_write_pieces(const std::string& path, const std::vector<std::string_view>& pieces) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail("save {}: folder {} does not exist", path, dir.string());
  const std::string prefix = "." + target.filename().string() + ".tmp.";
  const std::string tmp = (dir / (prefix + std::to_string(::getpid()))).string();
  // Temporaries of this file left by writers that were killed mid-save (their process is gone)
  // would pile up forever: removed here. A live writer's temporary is left alone.
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string digits = name.substr(prefix.size());
    if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t owner = static_cast<pid_t>(std::stol(digits));
    if (owner == ::getpid() || (::kill(owner, 0) != 0 && errno == ESRCH)) fs::remove(entry.path(), ec);
  }
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) fail("save {}: cannot create temporary file {}: {}", path, tmp, errno_text());
  size_t total = 0, done = 0;
  for (std::string_view piece : pieces) total += piece.size();
  for (std::string_view piece : pieces) {
    size_t written = 0;
    while (written < piece.size()) {
      ssize_t n = ::write(fd, piece.data() + written, piece.size() - written);
      if (n < 0) {
        if (errno == EINTR) continue;
        const std::string why = errno_text();
        ::close(fd);
        ::unlink(tmp.c_str());
        fail("save {}: writing {} failed after {} of {} bytes: {}", path, tmp, done, total, why);
      }
      written += static_cast<size_t>(n);
      done += static_cast<size_t>(n);
    }
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const std::string why = errno_text();
    ::unlink(tmp.c_str());
    fail("save {}: flushing {} failed: {}", path, tmp, why);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = errno_text();
    ::unlink(tmp.c_str());
    fail("save {}: renaming {} over it failed: {}", path, tmp, why);
  }
  fsync_path(dir.string(), true);  // the rename itself reaches the disk
}

void atomic_write(const std::string& path, const std::string& bytes) { atomic_write_pieces(path, {bytes}); }

void save_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  // __metadata__ holds the caller's strings, a CRC-32C per tensor ("crc32c.<name>": 8 hex digits)
  // and one of the caller's strings ("crc32c.__metadata__"), which load_safetensors verifies; to PyTorch and Hugging Face it is
  // ordinary metadata, so the file stays a plain safetensors file.
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
  for (const auto& [k, v] : metadata) {
    if (k.rfind(kCrcPrefix, 0) == 0) {
      fail("save_safetensors {}: metadata key '{}' starts with '{}', which the file's checksums use", path, k, kCrcPrefix);
    }
    meta[k] = v;
  }
  meta[kMetadataCrcKey] = metadata_crc(metadata);
  header["__metadata__"] = meta;
  std::set<std::string> seen;
  std::vector<Tensor> dense;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name.empty() || name == "__metadata__") fail("save_safetensors {}: invalid tensor name '{}'", path, name);
    if (!seen.insert(name).second) fail("save_safetensors {}: tensor name '{}' appears twice", path, name);
    if (!t.defined()) fail("save_safetensors {}: tensor '{}' is undefined", path, name);
    Tensor c = t.detach().cpu().contiguous();  // saved from any device (a file holds host bytes)
    const uint64_t bytes = static_cast<uint64_t>(c.numel()) * c.element_size();
    header[name] = {{"dtype", st_dtype(c.dtype())}, {"shape", c.sizes()}, {"data_offsets", {offset, offset + bytes}}};
    header["__metadata__"][kCrcPrefix + name] =
        fmt::format("{:08x}", tensor_crc(st_dtype(c.dtype()), c.sizes(), c.raw_data_ptr(), static_cast<size_t>(bytes)));
    offset += bytes;
    dense.push_back(c);
  }
  std::string head = header.dump();
  head.append((8 - head.size() % 8) % 8, ' ');  // data starts 8-byte aligned, as the reference writer does
  const uint64_t n = head.size();
  std::vector<std::string_view> pieces = {std::string_view(reinterpret_cast<const char*>(&n), 8), head};
  for (const Tensor& c : dense) {
    pieces.emplace_back(static_cast<const char*>(c.raw_data_ptr()), static_cast<size_t>(c.numel()) * c.element_size());
  }
  atomic_write_pieces(path, pieces);  // the tensors' bytes straight from their memory, not copied into one string
}

SafetensorsFile load_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("load_safetensors: cannot open {}: {}", path, errno_text());
  in.seekg(0, std::ios::end);
  const uint64_t file_size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  if (file_size < 8) fail("load_safetensors {}: file is {} bytes, too short for the 8-byte header length", path, file_size);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  if (n > kMaxHeaderBytes) fail("load_safetensors {}: header length {} exceeds the limit of {} bytes", path, n, kMaxHeaderBytes);
  if (n > file_size - 8) {
    fail("load_safetensors {}: header length {} runs past the end of the file ({} bytes): truncated or corrupt", path, n,
         file_size);
  }
  std::string head(n, '\0');
  in.read(head.data(), static_cast<std::streamsize>(n));
  nlohmann::json header;
  // A name given twice would otherwise be "last one wins" (nlohmann keeps the last): refused.
  std::set<std::string> names;
  std::string duplicate;
  try {
    header = nlohmann::json::parse(head, [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
      if (depth == 1 && event == nlohmann::json::parse_event_t::key && parsed.is_string() &&
          !names.insert(parsed.get<std::string>()).second && duplicate.empty()) {
        duplicate = parsed.get<std::string>();
      }
      return true;
    });
  } catch (const std::exception& e) {
    fail("load_safetensors {}: header is not valid JSON: {}", path, e.what());
  }
  if (!duplicate.empty()) fail("load_safetensors {}: the header names tensor '{}' more than once", path, duplicate);
  if (!header.is_object()) fail("load_safetensors {}: header must be a JSON object", path);
  const uint64_t data_size = file_size - 8 - n;
  SafetensorsFile result;
  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    uint64_t begin, end;
  };
  std::vector<Entry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) fail("load_safetensors {}: __metadata__ must be an object of strings", path);
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) fail("load_safetensors {}: __metadata__ value for '{}' is not a string", path, m.key());
        result.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& what) { fail("load_safetensors {}: tensor '{}': {}", path, name, what); };
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets")) {
      bad("entry must have dtype, shape and data_offsets");
    }
    Entry e;
    e.name = name;
    if (!v["dtype"].is_string() || !parse_dtype(v["dtype"].get<std::string>(), e.dtype)) {
      bad(fmt::format("unsupported dtype {}", v["dtype"].dump()));
    }
    if (!v["shape"].is_array()) bad("shape must be an array");
    uint64_t numel = 1;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned()) bad(fmt::format("shape {} must hold non-negative integers", v["shape"].dump()));
      const uint64_t dim = d.get<uint64_t>();
      if (dim != 0 && numel > (uint64_t(1) << 62) / dim) bad(fmt::format("shape {} is too large", v["shape"].dump()));
      numel *= dim;
      e.shape.push_back(static_cast<int64_t>(dim));
    }
    const auto& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      bad("data_offsets must be [begin, end]");
    }
    e.begin = off[0].get<uint64_t>();
    e.end = off[1].get<uint64_t>();
    if (e.begin > e.end || e.end > data_size) {
      bad(fmt::format("data_offsets [{}, {}] outside the data section of {} bytes (truncated file?)", e.begin, e.end,
                      data_size));
    }
    // numel * element size must not wrap (a shape of [2^62] float32 would be 0 bytes): anything
    // larger than the data section is refused before multiplying.
    const uint64_t esize = element_size(e.dtype);
    if (numel > data_size / esize) {
      bad(fmt::format("shape {} of {} needs more bytes than the file's whole data section ({} bytes)", v["shape"].dump(),
                      dtype_name(e.dtype), data_size));
    }
    const uint64_t want = numel * esize;
    if (e.end - e.begin != want) {
      bad(fmt::format("shape {} of {} needs {} bytes, but data_offsets span {}", v["shape"].dump(),
                      dtype_name(e.dtype), want, e.end - e.begin));
    }
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < entries.size(); ++i) {
    if (entries[i].begin < entries[i - 1].end) {
      fail("load_safetensors {}: tensors '{}' and '{}' overlap in the data section", path, entries[i - 1].name,
           entries[i].name);
    }
  }
  // Checksums: a file chorus wrote has one per tensor and one of the metadata. Where any is present,
  // all must be, and each must name something in the file: a flipped bit in a checksum's key or in
  // a tensor's name must not turn the check off (foreign files, with none, load unchecked).
  std::set<std::string> checked;
  for (const auto& [key, value] : result.metadata) {
    if (key.rfind(kCrcPrefix, 0) == 0) checked.insert(key.substr(std::strlen(kCrcPrefix)));
  }
  if (!checked.empty()) {
    std::set<std::string> tensor_names;
    for (const Entry& e : entries) tensor_names.insert(e.name);
    for (const std::string& name : checked) {
      if (name != "__metadata__" && !tensor_names.count(name)) {
        fail("load_safetensors {}: checksum key '{}{}' names no tensor of the file's {}: the header is corrupt", path,
             kCrcPrefix, name, entries.size());
      }
    }
    for (const Entry& e : entries) {
      if (!checked.count(e.name)) {
        fail("load_safetensors {}: tensor '{}' has no checksum while the file has {} checksums: the header is corrupt",
             path, e.name, checked.size());
      }
    }
    if (!checked.count("__metadata__")) {
      fail("load_safetensors {}: the file has tensor checksums but no '{}' (a corrupt header, or a file written by a "
           "chorus before 2026-11-28: load it with that version and save it again)",
           path, kMetadataCrcKey);
    }
    const std::string stored = result.metadata.at(kMetadataCrcKey), computed = metadata_crc(result.metadata);
    if (stored != computed) {
      fail("load_safetensors {}: the metadata does not match its checksum (CRC-32C {} stored, {} computed): the file is "
           "corrupt",
           path, stored, computed);
    }
  }
  for (const Entry& e : entries) {
    Tensor t = empty(e.shape, TensorOptions{.dtype = e.dtype});
    in.seekg(static_cast<std::streamoff>(8 + n + e.begin));
    in.read(static_cast<char*>(t.raw_data_ptr()), static_cast<std::streamsize>(e.end - e.begin));
    if (!in) fail("load_safetensors {}: reading tensor '{}' failed (file changed while reading?)", path, e.name);
    if (auto it = result.metadata.find(kCrcPrefix + e.name); it != result.metadata.end()) {
      const std::string got = fmt::format(
          "{:08x}", tensor_crc(st_dtype(e.dtype), e.shape, t.raw_data_ptr(), static_cast<size_t>(e.end - e.begin)));
      if (got != it->second) {
        fail("load_safetensors {}: tensor '{}' does not match its checksum (CRC-32C {} stored, {} computed): the file "
             "is corrupt",
             path, e.name, it->second, got);
      }
    }
    result.tensors.emplace_back(e.name, t);
  }
  // The checksums are the file's business, not the caller's metadata.
  for (auto it = result.metadata.begin(); it != result.metadata.end();) {
    if (it->first.rfind(kCrcPrefix, 0) == 0) it = result.metadata.erase(it);
    else ++it;
  }
  return result;
}

// ------------------------------------------------------------------ checkpoints
namespace {

constexpr const char* kFormatKey = "format";
constexpr const char* kFormat = "chorus-checkpoint-1";
const char* const kSections[] = {"model.", "optimizer.", "scheduler.", "grad_scaler."};
constexpr int kNumSections = 4;

int64_t parse_int(const Metadata& m, const std::string& key, const std::string& path) {
  auto it = m.find(key);
  if (it == m.end()) fail("load checkpoint {}: metadata has no '{}'", path, key);
  try {
    size_t used = 0;
    long long v = std::stoll(it->second, &used);
    if (used != it->second.size()) throw std::invalid_argument(it->second);
    return v;
  } catch (const std::exception&) {
    fail("load checkpoint {}: metadata '{}' = '{}' is not an integer", path, key, it->second);
  }
}

uint64_t parse_u64(const Metadata& m, const std::string& key, const std::string& path) {
  auto it = m.find(key);
  if (it == m.end()) fail("load checkpoint {}: metadata has no '{}'", path, key);
  try {
    size_t used = 0;
    unsigned long long v = std::stoull(it->second, &used);
    if (used != it->second.size() || it->second.empty() || it->second[0] == '-') throw std::invalid_argument(it->second);
    return v;
  } catch (const std::exception&) {
    fail("load checkpoint {}: metadata '{}' = '{}' is not an unsigned integer", path, key, it->second);
  }
}

}  // namespace

void Checkpoint::capture_rng() {
  rng_seed = default_generator().seed();
  rng_offset = default_generator().offset();
}

void Checkpoint::restore_rng() const { default_generator().set_state(rng_seed, rng_offset); }

void Checkpoint::save(const std::string& path) const {
  // A model that diverged (NaN or infinity in a parameter) must not replace the last good
  // checkpoint: the save is refused and the file on disk stays as it was.
  for (const auto& [name, t] : model) {
    if (!t.defined() || !t.is_floating_point()) continue;
    // Summed in float64 (no float32 values can overflow it): NaN or infinity anywhere shows.
    if (!std::isfinite(t.detach().to(kFloat64).sum().item<double>())) {
      fail("save checkpoint {}: parameter or buffer '{}' holds NaN or infinity (the training diverged); refusing to "
           "overwrite the last good checkpoint",
           path, name);
    }
  }
  if (epoch < 0 || step < 0) fail("save checkpoint {}: epoch {} and step {} must be >= 0", path, epoch, step);
  NamedTensors all;
  const NamedTensors* parts[] = {&model, &optimizer, &scheduler, &grad_scaler};
  for (int s = 0; s < kNumSections; ++s) {
    for (const auto& [name, t] : *parts[s]) all.emplace_back(kSections[s] + name, t);
  }
  Metadata meta = extra;
  meta[kFormatKey] = kFormat;
  meta["epoch"] = std::to_string(epoch);
  meta["step"] = std::to_string(step);
  // 64-bit values as strings: JSON numbers lose precision above 2^53.
  meta["rng_seed"] = std::to_string(rng_seed);
  meta["rng_offset"] = std::to_string(rng_offset);
  save_safetensors(path, all, meta);
}

Checkpoint Checkpoint::load(const std::string& path) {
  SafetensorsFile file = load_safetensors(path);
  auto format = file.metadata.find(kFormatKey);
  if (format == file.metadata.end() || format->second != kFormat) {
    fail("load checkpoint {}: not a chorus checkpoint (metadata format is '{}', expected '{}')", path,
         format == file.metadata.end() ? "" : format->second, kFormat);
  }
  Checkpoint c;
  NamedTensors* parts[] = {&c.model, &c.optimizer, &c.scheduler, &c.grad_scaler};
  for (auto& [name, t] : file.tensors) {
    bool placed = false;
    for (int s = 0; s < kNumSections && !placed; ++s) {
      const std::string prefix = kSections[s];
      if (name.rfind(prefix, 0) == 0) {
        parts[s]->emplace_back(name.substr(prefix.size()), t);
        placed = true;
      }
    }
    if (!placed) fail("load checkpoint {}: tensor '{}' belongs to no section (model., optimizer., scheduler., grad_scaler.)", path, name);
  }
  c.epoch = parse_int(file.metadata, "epoch", path);
  c.step = parse_int(file.metadata, "step", path);
  // Values a real run reaches; a lying file (epoch 2^63-1 or -1000000) is refused, not trained on.
  if (c.epoch < 0 || c.epoch > (int64_t(1) << 31)) fail("load checkpoint {}: epoch {} is outside [0, 2^31]", path, c.epoch);
  if (c.step < 0 || c.step > (int64_t(1) << 48)) fail("load checkpoint {}: step {} is outside [0, 2^48]", path, c.step);
  c.rng_seed = parse_u64(file.metadata, "rng_seed", path);
  c.rng_offset = parse_u64(file.metadata, "rng_offset", path);
  for (auto& [k, v] : file.metadata) {
    if (k != kFormatKey && k != "epoch" && k != "step" && k != "rng_seed" && k != "rng_offset") c.extra[k] = v;
  }
  return c;
}

int64_t metadata_int(const Metadata& metadata, const std::string& key, const std::string& path) {
  return parse_int(metadata, key, path);
}

}  // namespace chorus::nn
