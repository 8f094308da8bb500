// BERT's WordPiece tokenizer (bert-base-uncased behaviour): basic tokenization (clean-up,
// lower-casing, accent stripping, splitting on whitespace and punctuation, CJK characters as
// single tokens), then greedy longest-match WordPiece with "##" continuations and [UNK] for words
// it cannot cover (or longer than 100 characters). The vocabulary is BERT's vocab.txt — one token
// a line, the line number its id — which tools/setup.sh installs in <data_dir>/bert/vocab.txt.
//
// Unicode coverage: text is UTF-8 (malformed bytes become U+FFFD and are dropped, as BERT's
// clean-up drops it); accents are stripped for Latin-1 (À-ÿ) and combining marks (U+0300-U+036F);
// Latin-1, Greek and Cyrillic capitals are lower-cased. Scripts beyond these keep their characters.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace chorus::data {

class WordPieceTokenizer {
 public:
  // Reads vocab.txt; a missing file -> chorus::Error naming it and tools/setup.sh.
  explicit WordPieceTokenizer(const std::string& vocab_path);
  // <data_dir>/bert/vocab.txt.
  static std::string default_vocab_path();

  std::vector<std::string> tokenize(const std::string& text) const;
  // Token ids; with add_special_tokens, [CLS] ... [SEP].
  std::vector<int64_t> encode(const std::string& text, bool add_special_tokens = false) const;
  // Tokens joined with spaces, "##" continuations glued to their word.
  std::string decode(const std::vector<int64_t>& ids) const;

  int64_t token_to_id(const std::string& token) const;  // the [UNK] id when absent
  const std::string& id_to_token(int64_t id) const;     // chorus::Error when out of range
  int64_t vocab_size() const { return static_cast<int64_t>(tokens_.size()); }
  int64_t pad_id() const { return pad_; }
  int64_t unk_id() const { return unk_; }
  int64_t cls_id() const { return cls_; }
  int64_t sep_id() const { return sep_; }
  int64_t mask_id() const { return mask_; }

 private:
  std::vector<std::string> basic_tokenize(const std::string& text) const;
  void wordpiece(const std::string& word, std::vector<std::string>& out) const;

  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int64_t> ids_;
  int64_t pad_ = 0, unk_ = 0, cls_ = 0, sep_ = 0, mask_ = 0;
};

}  // namespace chorus::data
