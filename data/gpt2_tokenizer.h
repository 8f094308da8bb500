// GPT-2's own tokenizer: byte-level byte-pair encoding read from the files GPT-2 and Hugging Face
// publish (vocab.json: token -> id; merges.txt: "#version: ..." then one merge a line, by rank),
// computed as GPT-2's encoder.py does:
// 1. the text is cut by GPT-2's pattern
//      's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//    (the classes as the `regex` module defines them: data/unicode_classes.inc);
// 2. each piece's UTF-8 bytes are its first symbols, and the adjacent pair with the lowest merge
//    rank is merged everywhere in the piece, again and again, until no pair has a rank;
// 3. each symbol's id comes from vocab.json.
// Tokens are stored in the files as GPT-2's printable stand-ins for bytes (bytes_to_unicode); here
// they are held as the bytes themselves, so decode() gives back exactly the bytes encoded.
// Special tokens in the text ("<|endoftext|>") are encoded as plain text, as encoder.py does; look
// their ids up with id_of(). Bytes that are not valid UTF-8 count as characters of no class (each
// byte on its own) and still round-trip.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace chorus::data {

class GPT2Tokenizer {
 public:
  // A vocab.json / merges.txt pair; a file that is missing, not GPT-2's format (a token that is
  // not made of GPT-2's byte stand-ins, a vocabulary without all 256 bytes, a merge line that is
  // not two tokens, a merge whose parts or result are not in the vocabulary, duplicate ids) is a
  // chorus::Error naming the file, the line and what was expected.
  static GPT2Tokenizer load(const std::string& vocab_json, const std::string& merges_txt);
  // DIR/vocab.json and DIR/merges.txt.
  static GPT2Tokenizer from_pretrained(const std::string& dir);

  std::vector<int64_t> encode(const std::string& text) const;
  // The tokens' bytes, concatenated; an id not in the vocabulary is a chorus::Error.
  std::string decode(const std::vector<int64_t>& ids) const;
  // One more than the largest id.
  int64_t vocab_size() const { return static_cast<int64_t>(bytes_.size()); }
  // The id of a token given as its text (e.g. "<|endoftext|>"), if the vocabulary has it.
  std::optional<int64_t> id_of(const std::string& token) const;

  // Step 1 alone: the pieces GPT-2's pattern cuts text into (exposed for tests).
  static std::vector<std::string> split(const std::string& text);

 private:
  GPT2Tokenizer() = default;
  std::vector<int64_t> encode_piece(const std::string& piece) const;

  std::unordered_map<std::string, int64_t> ids_;  // token bytes -> id
  std::vector<std::string> bytes_;                // id -> token bytes
  std::vector<bool> known_;                       // id -> the vocabulary has it (ids may have gaps)
  std::map<std::pair<std::string, std::string>, int64_t> ranks_;  // merge -> its line's rank
  struct Cache {
    std::mutex mutex;
    std::unordered_map<std::string, std::vector<int64_t>> ids;  // piece -> its ids
  };
  std::shared_ptr<Cache> cache_ = std::make_shared<Cache>();  // shared by copies; thread-safe
};

}  // namespace chorus::data
