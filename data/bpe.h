// Byte-level byte-pair encoding (the scheme of GPT-2's tokenizer): tokens 0..255 are the bytes, and
// every further token is a learned merge of two earlier ones, so any byte string encodes and
// decodes back exactly, with no unknown token.
//
// Text is first cut into chunks that merges never cross (a simplified form of GPT-2's pre-split):
// a run of letters, a run of digits or a run of other non-space characters, each with the one
// space before it if there is one; whitespace otherwise forms runs of its own. Bytes >= 0x80 (UTF-8
// beyond ASCII) count as letters, so a multi-byte character stays inside its word.
//
// Training takes the most frequent adjacent pair over all chunks (weighted by how often each chunk
// occurs; ties to the smaller pair of ids), adds it as the next token, and repeats until the
// vocabulary has the size asked for. Encoding applies the learned merges to each chunk in the order
// they were learned, as GPT-2's encoder does.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace chorus::data {

class BytePairTokenizer {
 public:
  // Learns vocab_size - 256 merges from text (fewer when the text runs out of pairs).
  // vocab_size must be in [256, 1 << 20].
  static BytePairTokenizer train(const std::string& text, int64_t vocab_size);
  // A merges file as save() writes it; a missing or malformed file is a chorus::Error naming it.
  static BytePairTokenizer load(const std::string& path);
  // "chorus-bpe 1", then one merge a line ("<left id> <right id>", the new token's id being 256 + the
  // line's index); written atomically.
  void save(const std::string& path) const;

  std::vector<int64_t> encode(const std::string& text) const;
  // The bytes of the tokens, concatenated; an id outside the vocabulary is a chorus::Error.
  std::string decode(const std::vector<int64_t>& ids) const;
  int64_t vocab_size() const { return static_cast<int64_t>(bytes_.size()); }
  const std::string& token_bytes(int64_t id) const;
  const std::vector<std::pair<int64_t, int64_t>>& merges() const { return merges_; }

  // The pre-split chunks of text (exposed for tests).
  static std::vector<std::string> split(const std::string& text);

 private:
  BytePairTokenizer();
  void add_merge(int64_t left, int64_t right);
  std::vector<int64_t> encode_chunk(const std::string& chunk) const;

  std::vector<std::pair<int64_t, int64_t>> merges_;
  std::map<std::pair<int64_t, int64_t>, int64_t> rank_;  // pair -> the merged token's id
  std::vector<std::string> bytes_;                       // token id -> its bytes
  mutable std::unordered_map<std::string, std::vector<int64_t>> cache_;  // chunk -> ids (not thread-safe)
};

}  // namespace chorus::data
