#include "data/gpt2_tokenizer.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tensor/error.h"

namespace chorus::data {
namespace {

struct CodePointRange {
  char32_t first, last;
};
#include "data/unicode_classes.inc"

template <size_t N>
bool in(const CodePointRange (&table)[N], char32_t c) {
  const auto it = std::upper_bound(std::begin(table), std::end(table), c,
                                   [](char32_t v, const CodePointRange& r) { return v < r.first; });
  return it != std::begin(table) && c <= std::prev(it)->last;
}

enum class Kind { kLetter, kNumber, kSpace, kOther };

// One character of the text: where its bytes are and its class. Bytes that are not valid UTF-8
// become one character each, of no class.
struct Char {
  size_t begin, end;
  char32_t code;
  Kind kind;
};

constexpr char32_t kInvalid = 0xFFFFFFFF;

std::vector<Char> characters(const std::string& s) {
  std::vector<Char> out;
  const auto* b = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = b[i];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    char32_t code = kInvalid;
    if (len == 1) {
      code = c;
    } else if (len > 1 && i + len <= n) {
      code = c & (0x7F >> len);
      for (size_t k = 1; k < len && code != kInvalid; ++k) {
        code = (b[i + k] & 0xC0) == 0x80 ? (code << 6) | (b[i + k] & 0x3F) : kInvalid;
      }
      // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
      static constexpr char32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
      if (code != kInvalid && (code < kMin[len] || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF))) code = kInvalid;
    }
    if (code == kInvalid) len = 1;
    const Kind kind = code == kInvalid           ? Kind::kOther
                      : in(kLetterRanges, code)  ? Kind::kLetter
                      : in(kNumberRanges, code)  ? Kind::kNumber
                      : in(kSpaceRanges, code)   ? Kind::kSpace
                                                 : Kind::kOther;
    out.push_back({i, i + len, code, kind});
    i += len;
  }
  return out;
}

// GPT-2's bytes_to_unicode: the printable stand-in for each byte in the files.
const std::array<char32_t, 256>& byte_to_code() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    std::array<bool, 256> printable{};
    for (int b = '!'; b <= '~'; ++b) printable[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) t[b] = printable[b] ? static_cast<char32_t>(b) : next++;
    return t;
  }();
  return table;
}

// A token as the files write it (UTF-8 of stand-ins) -> its bytes; nullopt when a character is not a stand-in.
std::optional<std::string> token_bytes(const std::string& token) {
  static const std::map<char32_t, char> code_to_byte = [] {
    std::map<char32_t, char> m;
    for (int b = 0; b < 256; ++b) m[byte_to_code()[b]] = static_cast<char>(b);
    return m;
  }();
  std::string out;
  for (const Char& c : characters(token)) {
    const auto it = code_to_byte.find(c.code);
    if (it == code_to_byte.end()) return std::nullopt;
    out += it->second;
  }
  return out;
}

std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s) out += c >= 0x20 && c < 0x7F ? std::string(1, static_cast<char>(c)) : fmt::format("\\x{:02x}", c);
  return out;
}

}  // namespace

std::vector<std::string> GPT2Tokenizer::split(const std::string& text) {
  const std::vector<Char> cs = characters(text);
  const size_t n = cs.size();
  std::vector<std::string> pieces;
  auto emit = [&](size_t from, size_t to) { pieces.push_back(text.substr(cs[from].begin, cs[to - 1].end - cs[from].begin)); };
  auto run = [&](size_t from, Kind kind) {
    size_t to = from;
    while (to < n && cs[to].kind == kind) ++to;
    return to;
  };
  size_t i = 0;
  while (i < n) {
    // 's|'t|'re|'ve|'m|'ll|'d (ASCII, lower case only)
    if (cs[i].code == U'\'' && i + 1 < n) {
      const char32_t a = cs[i + 1].code, b = i + 2 < n ? cs[i + 2].code : 0;
      size_t len = 0;
      if (a == U's' || a == U't' || a == U'm' || a == U'd') len = 2;
      else if ((a == U'r' && b == U'e') || (a == U'v' && b == U'e') || (a == U'l' && b == U'l')) len = 3;
      if (len > 0) {
        emit(i, i + len);
        i += len;
        continue;
      }
    }
    // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: one optional space (U+0020 only), then a run.
    const size_t start = cs[i].code == U' ' && i + 1 < n ? i + 1 : i;
    if (cs[start].kind != Kind::kSpace) {
      const size_t end = run(start, cs[start].kind);
      emit(i, end);
      i = end;
      continue;
    }
    // `\s+(?!\S)|\s+`: a whitespace run, less its last character when a non-space follows it (that
    // character starts the next piece), unless that would leave nothing.
    size_t end = run(i, Kind::kSpace);
    if (end < n && end - i > 1) --end;
    emit(i, end);
    i = end;
  }
  return pieces;
}

GPT2Tokenizer GPT2Tokenizer::load(const std::string& vocab_json, const std::string& merges_txt) {
  GPT2Tokenizer t;
  std::ifstream vin(vocab_json);
  if (!vin) fail("GPT2Tokenizer: cannot open {} ({})", vocab_json, std::strerror(errno));
  nlohmann::json vocab;
  try {
    vocab = nlohmann::json::parse(vin);
  } catch (const nlohmann::json::exception& e) {
    fail("GPT2Tokenizer: {} is not valid JSON ({}); expected GPT-2's vocab.json, an object of token -> id", vocab_json, e.what());
  }
  if (!vocab.is_object() || vocab.empty()) {
    fail("GPT2Tokenizer: {} is not GPT-2's vocab.json (expected a non-empty object of token -> id)", vocab_json);
  }
  constexpr int64_t kMaxId = 1 << 24;
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= kMaxId) {
      fail("GPT2Tokenizer: {}: the id of \"{}\" is {}, expected an integer in [0, {})", vocab_json, token, id.dump(), kMaxId);
    }
    const std::optional<std::string> bytes = token_bytes(token);
    if (!bytes || bytes->empty()) {
      fail("GPT2Tokenizer: {}: token \"{}\" is not written in GPT-2's byte stand-ins (bytes_to_unicode); this is not a "
           "byte-level BPE vocabulary",
           vocab_json, token);
    }
    const int64_t i = id.get<int64_t>();
    if (i >= static_cast<int64_t>(t.bytes_.size())) {
      t.bytes_.resize(static_cast<size_t>(i) + 1);
      t.known_.resize(static_cast<size_t>(i) + 1, false);
    }
    if (t.known_[i]) fail("GPT2Tokenizer: {}: id {} is given to two tokens", vocab_json, i);
    if (!t.ids_.emplace(*bytes, i).second) fail("GPT2Tokenizer: {}: token \"{}\" appears twice", vocab_json, token);
    t.bytes_[i] = *bytes;
    t.known_[i] = true;
  }
  for (int b = 0; b < 256; ++b) {
    if (!t.ids_.count(std::string(1, static_cast<char>(b)))) {
      fail("GPT2Tokenizer: {} has no token for byte 0x{:02x}; GPT-2's vocabulary has all 256 bytes", vocab_json, b);
    }
  }
  std::ifstream min(merges_txt);
  if (!min) fail("GPT2Tokenizer: cannot open {} ({})", merges_txt, std::strerror(errno));
  std::string line;
  int64_t line_no = 0;
  while (std::getline(min, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line_no == 1 && line.starts_with("#version")) continue;
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 == line.size() || line.find(' ', space + 1) != std::string::npos) {
      fail("GPT2Tokenizer: {} line {}: \"{}\" is not a merge (expected two tokens separated by one space)", merges_txt, line_no,
           line);
    }
    const std::optional<std::string> left = token_bytes(line.substr(0, space)), right = token_bytes(line.substr(space + 1));
    if (!left || !right) fail("GPT2Tokenizer: {} line {}: \"{}\" is not written in GPT-2's byte stand-ins", merges_txt, line_no, line);
    for (const std::string& s : {*left, *right, *left + *right}) {
      if (!t.ids_.count(s)) {
        fail("GPT2Tokenizer: {} line {}: \"{}\" needs token \"{}\", which {} does not have", merges_txt, line_no, line,
             printable(s), vocab_json);
      }
    }
    t.ranks_.emplace(std::make_pair(*left, *right), static_cast<int64_t>(t.ranks_.size()));
  }
  if (min.bad()) fail("GPT2Tokenizer: reading {} failed", merges_txt);
  return t;
}

GPT2Tokenizer GPT2Tokenizer::from_pretrained(const std::string& dir) {
  return load(dir + "/vocab.json", dir + "/merges.txt");
}

std::vector<int64_t> GPT2Tokenizer::encode_piece(const std::string& piece) const {
  {
    std::lock_guard<std::mutex> lock(cache_->mutex);
    if (const auto it = cache_->ids.find(piece); it != cache_->ids.end()) return it->second;
  }
  std::vector<std::string> symbols;
  for (char c : piece) symbols.emplace_back(1, c);
  while (symbols.size() > 1) {
    // The adjacent pair of lowest rank; merge it everywhere, left to right.
    int64_t best = std::numeric_limits<int64_t>::max();
    const std::pair<std::string, std::string>* best_pair = nullptr;
    for (size_t k = 0; k + 1 < symbols.size(); ++k) {
      const auto it = ranks_.find({symbols[k], symbols[k + 1]});
      if (it != ranks_.end() && it->second < best) {
        best = it->second;
        best_pair = &it->first;
      }
    }
    if (!best_pair) break;
    std::vector<std::string> merged;
    for (size_t k = 0; k < symbols.size(); ++k) {
      if (k + 1 < symbols.size() && symbols[k] == best_pair->first && symbols[k + 1] == best_pair->second) {
        merged.push_back(symbols[k] + symbols[k + 1]);
        ++k;
      } else {
        merged.push_back(symbols[k]);
      }
    }
    symbols = std::move(merged);
  }
  std::vector<int64_t> ids;
  for (const std::string& s : symbols) ids.push_back(ids_.at(s));  // every byte and merge result is in the vocabulary (load checked)
  std::lock_guard<std::mutex> lock(cache_->mutex);
  cache_->ids.emplace(piece, ids);
  return ids;
}

std::vector<int64_t> GPT2Tokenizer::encode(const std::string& text) const {
  std::vector<int64_t> ids;
  for (const std::string& piece : split(text)) {
    const std::vector<int64_t> p = encode_piece(piece);
    ids.insert(ids.end(), p.begin(), p.end());
  }
  return ids;
}

std::string GPT2Tokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  for (int64_t id : ids) {
    if (id < 0 || id >= vocab_size() || !known_[id]) {
      fail("GPT2Tokenizer::decode: token id {} is not in the vocabulary (ids 0 .. {})", id, vocab_size() - 1);
    }
    out += bytes_[id];
  }
  return out;
}

std::optional<int64_t> GPT2Tokenizer::id_of(const std::string& token) const {
  const auto it = ids_.find(token);
  return it == ids_.end() ? std::nullopt : std::optional<int64_t>(it->second);
}

}  // namespace chorus::data
