#include "data/bpe.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include "tensor/error.h"

namespace chorus::data {
namespace {

enum class CharClass { Space, Letter, Digit, Other };

CharClass char_class(unsigned char c) {
  if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v') return CharClass::Space;
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80) return CharClass::Letter;
  if (c >= '0' && c <= '9') return CharClass::Digit;
  return CharClass::Other;
}

constexpr int64_t kMaxVocab = int64_t{1} << 20;

// Replaces every (left, right) in ids, left to right without overlaps, by id.
void merge_pair(std::vector<int64_t>& ids, int64_t left, int64_t right, int64_t id) {
  size_t out = 0;
  for (size_t k = 0; k < ids.size(); ++k) {
    if (k + 1 < ids.size() && ids[k] == left && ids[k + 1] == right) {
      ids[out++] = id;
      ++k;
    } else {
      ids[out++] = ids[k];
    }
  }
  ids.resize(out);
}

}  // namespace

BytePairTokenizer::BytePairTokenizer() {
  for (int b = 0; b < 256; ++b) bytes_.emplace_back(1, static_cast<char>(b));
}

void BytePairTokenizer::add_merge(int64_t left, int64_t right) {
  const int64_t id = vocab_size();
  merges_.emplace_back(left, right);
  rank_[{left, right}] = id;
  bytes_.push_back(bytes_[static_cast<size_t>(left)] + bytes_[static_cast<size_t>(right)]);
}

std::vector<std::string> BytePairTokenizer::split(const std::string& text) {
  std::vector<std::string> chunks;
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    const size_t start = i;
    const auto c = static_cast<unsigned char>(text[i]);
    // One space joins the word after it; other whitespace (and a space before whitespace) forms a run.
    size_t word = i;
    if (c == ' ' && i + 1 < n && char_class(static_cast<unsigned char>(text[i + 1])) != CharClass::Space) word = i + 1;
    const CharClass cls = char_class(static_cast<unsigned char>(text[word]));
    i = word + 1;
    while (i < n && char_class(static_cast<unsigned char>(text[i])) == cls) {
      // A whitespace run leaves its last space to the word that follows it.
      if (cls == CharClass::Space && text[i] == ' ' && i + 1 < n &&
          char_class(static_cast<unsigned char>(text[i + 1])) != CharClass::Space) {
        break;
      }
      ++i;
    }
    chunks.push_back(text.substr(start, i - start));
  }
  return chunks;
}

BytePairTokenizer BytePairTokenizer::train(const std::string& text, int64_t vocab_size) {
  if (vocab_size < 256 || vocab_size > kMaxVocab) {
    fail("BytePairTokenizer: vocab_size {} must be in [256, {}] (256 byte tokens plus the merges)", vocab_size, kMaxVocab);
  }
  BytePairTokenizer t;
  // The distinct chunks with their counts, each as a sequence of token ids.
  std::unordered_map<std::string, int64_t> counts;
  for (std::string& chunk : split(text)) ++counts[std::move(chunk)];
  std::vector<std::pair<std::string, int64_t>> sorted_counts(counts.begin(), counts.end());
  std::sort(sorted_counts.begin(), sorted_counts.end());  // a fixed order: the result does not depend on hashing
  std::vector<std::vector<int64_t>> words;
  std::vector<int64_t> freq;
  for (const auto& [chunk, count] : sorted_counts) {
    if (chunk.size() < 2) continue;  // nothing to merge
    std::vector<int64_t> ids;
    for (unsigned char b : chunk) ids.push_back(b);
    words.push_back(std::move(ids));
    freq.push_back(count);
  }
  while (t.vocab_size() < vocab_size) {
    // Pair (left, right) as left << 32 | right: ids are below 2^20, and the keys order as the pairs.
    std::unordered_map<uint64_t, int64_t> pairs;
    for (size_t w = 0; w < words.size(); ++w) {
      for (size_t k = 0; k + 1 < words[w].size(); ++k) {
        pairs[static_cast<uint64_t>(words[w][k]) << 32 | static_cast<uint64_t>(words[w][k + 1])] += freq[w];
      }
    }
    if (pairs.empty()) break;
    uint64_t best_key = 0;
    int64_t best_count = -1;
    for (const auto& [key, count] : pairs) {
      if (count > best_count || (count == best_count && key < best_key)) {
        best_key = key;
        best_count = count;
      }
    }
    const auto left = static_cast<int64_t>(best_key >> 32), right = static_cast<int64_t>(best_key & 0xffffffffu);
    const int64_t id = t.vocab_size();
    t.add_merge(left, right);
    for (auto& ids : words) merge_pair(ids, left, right, id);
  }
  return t;
}

std::vector<int64_t> BytePairTokenizer::encode_chunk(const std::string& chunk) const {
  if (auto it = cache_.find(chunk); it != cache_.end()) return it->second;
  std::vector<int64_t> ids;
  for (unsigned char b : chunk) ids.push_back(b);
  while (ids.size() > 1) {
    // The earliest-learned merge present (the smallest merged id), applied left to right.
    int64_t best = -1;
    for (size_t k = 0; k + 1 < ids.size(); ++k) {
      auto it = rank_.find({ids[k], ids[k + 1]});
      if (it != rank_.end() && (best < 0 || it->second < best)) best = it->second;
    }
    if (best < 0) break;
    const auto [left, right] = merges_[static_cast<size_t>(best - 256)];
    merge_pair(ids, left, right, best);
  }
  cache_.emplace(chunk, ids);
  return ids;
}

std::vector<int64_t> BytePairTokenizer::encode(const std::string& text) const {
  std::vector<int64_t> ids;
  for (const std::string& chunk : split(text)) {
    const std::vector<int64_t> part = encode_chunk(chunk);
    ids.insert(ids.end(), part.begin(), part.end());
  }
  return ids;
}

const std::string& BytePairTokenizer::token_bytes(int64_t id) const {
  if (id < 0 || id >= vocab_size()) fail("BytePairTokenizer: token id {} is outside the vocabulary [0, {})", id, vocab_size());
  return bytes_[static_cast<size_t>(id)];
}

std::string BytePairTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  for (int64_t id : ids) out += token_bytes(id);
  return out;
}

void BytePairTokenizer::save(const std::string& path) const {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail("BytePairTokenizer: cannot write {}", tmp);
    out << "chorus-bpe 1\n";
    for (const auto& [l, r] : merges_) out << l << ' ' << r << '\n';
    out.flush();
    if (!out) fail("BytePairTokenizer: writing {} failed", tmp);
  }
  std::filesystem::rename(tmp, path);
}

BytePairTokenizer BytePairTokenizer::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("BytePairTokenizer: cannot open merges file {}", path);
  std::string line;
  if (!std::getline(in, line) || line != "chorus-bpe 1") {
    fail("BytePairTokenizer: {} does not start with 'chorus-bpe 1' (got '{}')", path, line.substr(0, 40));
  }
  BytePairTokenizer t;
  int64_t number = 1;
  while (std::getline(in, line)) {
    ++number;
    std::istringstream fields(line);
    int64_t l = -1, r = -1;
    std::string rest;
    if (!(fields >> l >> r) || (fields >> rest) || l < 0 || r < 0 || l >= t.vocab_size() || r >= t.vocab_size()) {
      fail("BytePairTokenizer: {} line {}: '{}' should be two token ids below {} (the tokens defined before it)", path,
           number, line.substr(0, 60), t.vocab_size());
    }
    if (t.vocab_size() >= kMaxVocab) fail("BytePairTokenizer: {} has more than {} tokens", path, kMaxVocab);
    if (t.rank_.count({l, r})) fail("BytePairTokenizer: {} line {}: the merge {} {} appears twice", path, number, l, r);
    t.add_merge(l, r);
  }
  return t;
}

}  // namespace chorus::data
