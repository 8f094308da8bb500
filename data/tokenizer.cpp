#include "data/tokenizer.h"

#include <fstream>

#include "data/mnist.h"
#include "tensor/error.h"

namespace chorus::data {
namespace {

// UTF-8 -> code points; an invalid sequence becomes U+FFFD.
std::vector<char32_t> decode_utf8(const std::string& s) {
  std::vector<char32_t> out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || i + len > s.size()) {
      out.push_back(0xFFFD);
      ++i;
      continue;
    }
    char32_t cp = len == 1 ? c : c & (0x7F >> len);
    bool ok = true;
    for (int k = 1; k < len; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b >> 6) != 2) ok = false;
      cp = (cp << 6) | (b & 0x3F);
    }
    out.push_back(ok ? cp : 0xFFFD);
    i += ok ? len : 1;
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool is_whitespace(char32_t c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
         c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_control(char32_t c) {
  if (c == '\t' || c == '\n' || c == '\r') return false;
  return c < 0x20 || (c >= 0x7F && c < 0xA0) || c == 0xFFFD || c == 0 || (c >= 0x200B && c <= 0x200F);
}

bool is_punctuation(char32_t c) {
  // BERT treats every non-alphanumeric ASCII symbol as punctuation, plus Unicode punctuation.
  if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126)) return true;
  return (c >= 0xA1 && c <= 0xBF && c != 0xAA && c != 0xB2 && c != 0xB3 && c != 0xB5 && c != 0xB9 && c != 0xBA &&
          c != 0xBC && c != 0xBD && c != 0xBE) ||
         (c >= 0x2010 && c <= 0x2027) || (c >= 0x2030 && c <= 0x205E) || (c >= 0x3001 && c <= 0x3003) ||
         (c >= 0x3008 && c <= 0x3011) || (c >= 0xFF01 && c <= 0xFF0F);
}

bool is_cjk(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

// Lower-case and strip accents; 0 means "drop" (a combining mark).
char32_t normalize(char32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c >= 0x300 && c <= 0x36F) return 0;
  if (c >= 0xC0 && c <= 0xFF) {
    // Base letters of Latin-1's decomposable letters (NFD + dropping marks), lower-cased; '.' keeps
    // the character itself (lower-cased): Æ Ð × Ø Þ ß æ ð ÷ ø þ do not decompose.
    static const char base[] = "aaaaaa.ceeeeiiii.nooooo..uuuuy..aaaaaa.ceeeeiiii.nooooo..uuuuy.y";
    const char b = base[c - 0xC0];
    if (b != '.') return static_cast<char32_t>(b);
    if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 32;
    return c;
  }
  if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;  // Greek capitals
  if (c >= 0x410 && c <= 0x42F) return c + 32;                // Cyrillic А-Я
  if (c >= 0x400 && c <= 0x40F) return c + 80;                // Cyrillic Ѐ-Џ
  return c;
}

// The buffers match_pieces fills, kept across the words of one text.
struct MatchScratch {
  std::vector<size_t> offset;
  std::string candidate;
};

// Greedy longest-match WordPiece of one word (valid UTF-8: basic_tokenize re-encodes what it keeps):
// calls piece(id, text) for each piece in order ("##" before every piece but the first) and returns
// true, or returns false when some part of the word has no piece (the whole word is then [UNK], as
// BERT does; pieces already passed are the caller's to drop). The candidates are built in one
// buffer and looked up in place: no string is made for a piece that is not in the vocabulary.
template <class Piece>
bool match_pieces(const std::unordered_map<std::string, int64_t>& ids, const std::string& word, MatchScratch& scratch,
                  Piece&& piece) {
  // Byte offset of each code point's start, and the end: substrings never split a character.
  std::vector<size_t>& offset = scratch.offset;
  offset.clear();
  for (size_t i = 0; i < word.size(); ++i) {
    if ((static_cast<unsigned char>(word[i]) & 0xC0) != 0x80) offset.push_back(i);
  }
  if (offset.size() > 100) return false;
  const size_t chars = offset.size();
  offset.push_back(word.size());
  std::string& candidate = scratch.candidate;
  size_t start = 0;
  while (start < chars) {
    size_t end = chars;
    auto found = ids.end();
    for (; end > start; --end) {
      candidate.assign(start > 0 ? "##" : "");
      candidate.append(word, offset[start], offset[end] - offset[start]);
      found = ids.find(candidate);
      if (found != ids.end()) break;
    }
    if (found == ids.end()) return false;
    piece(found->second, found->first);
    start = end;
  }
  return true;
}

}  // namespace

WordPieceTokenizer::WordPieceTokenizer(const std::string& vocab_path) {
  std::ifstream in(vocab_path);
  if (!in) {
    fail("WordPieceTokenizer: cannot read {} (run tools/setup.sh to install the bert-base-uncased vocabulary, or "
         "point CHORUS_DATA_DIR at the folder holding bert/vocab.txt)",
         vocab_path);
  }
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    ids_.emplace(line, static_cast<int64_t>(tokens_.size()));
    tokens_.push_back(line);
  }
  auto need = [&](const char* t) {
    auto it = ids_.find(t);
    if (it == ids_.end()) fail("WordPieceTokenizer: {} has no {} token ({} tokens read)", vocab_path, t, tokens_.size());
    return it->second;
  };
  pad_ = need("[PAD]");
  unk_ = need("[UNK]");
  cls_ = need("[CLS]");
  sep_ = need("[SEP]");
  mask_ = need("[MASK]");
}

std::string WordPieceTokenizer::default_vocab_path() { return default_data_dir() + "/bert/vocab.txt"; }

namespace {

// Basic tokenization: calls word(w) for each word of `text` in order, `w` one buffer reused for every
// word (no string per word is kept).
template <class Word>
void for_each_word(const std::string& text, Word&& word) {
  std::string current;
  auto flush = [&] {
    if (!current.empty()) word(static_cast<const std::string&>(current));
    current.clear();
  };
  for (char32_t c : decode_utf8(text)) {
    if (is_control(c)) continue;
    if (is_whitespace(c)) {
      flush();
      continue;
    }
    if (is_cjk(c) || is_punctuation(c)) {
      flush();
      append_utf8(current, c);
      flush();
      continue;
    }
    const char32_t n = normalize(c);
    if (n != 0) append_utf8(current, n);
  }
  flush();
}

}  // namespace

std::vector<std::string> WordPieceTokenizer::basic_tokenize(const std::string& text) const {
  std::vector<std::string> words;
  for_each_word(text, [&](const std::string& w) { words.push_back(w); });
  return words;
}

void WordPieceTokenizer::wordpiece(const std::string& word, std::vector<std::string>& out) const {
  const size_t before = out.size();
  MatchScratch scratch;
  if (!match_pieces(ids_, word, scratch, [&](int64_t, const std::string& text) { out.push_back(text); })) {
    out.resize(before);
    out.push_back("[UNK]");
  }
}

std::vector<std::string> WordPieceTokenizer::tokenize(const std::string& text) const {
  std::vector<std::string> out;
  for (const std::string& w : basic_tokenize(text)) wordpiece(w, out);
  return out;
}

// Each distinct word of the text is matched once: a repeat copies the ids its first occurrence got
// (natural text repeats most of its words; a State of the Union address of ~9,000 words has ~2,000
// distinct ones). The result is the same as matching every word (tokenizer_test compares encode with
// a plain reference on real text).
std::vector<int64_t> WordPieceTokenizer::encode(const std::string& text, bool add_special_tokens) const {
  std::vector<int64_t> ids;
  if (add_special_tokens) ids.push_back(cls_);
  std::unordered_map<std::string, std::pair<size_t, size_t>> seen;  // word -> [begin, end) of its ids in `ids`
  MatchScratch scratch;
  for_each_word(text, [&](const std::string& word) {
    const size_t before = ids.size();
    auto [it, first] = seen.try_emplace(word);
    if (!first) {
      for (size_t i = it->second.first; i < it->second.second; ++i) {
        const int64_t id = ids[i];  // (a copy: push_back may move `ids`)
        ids.push_back(id);
      }
      return;
    }
    if (!match_pieces(ids_, word, scratch, [&](int64_t id, const std::string&) { ids.push_back(id); })) {
      ids.resize(before);
      ids.push_back(unk_);
    }
    it->second = {before, ids.size()};
  });
  if (add_special_tokens) ids.push_back(sep_);
  return ids;
}

std::string WordPieceTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  for (int64_t id : ids) {
    const std::string& t = id_to_token(id);
    if (t.rfind("##", 0) == 0) {
      out += t.substr(2);
    } else {
      if (!out.empty()) out += ' ';
      out += t;
    }
  }
  return out;
}

int64_t WordPieceTokenizer::token_to_id(const std::string& token) const {
  auto it = ids_.find(token);
  return it == ids_.end() ? unk_ : it->second;
}

const std::string& WordPieceTokenizer::id_to_token(int64_t id) const {
  if (id < 0 || id >= vocab_size()) fail("WordPieceTokenizer: id {} is outside the vocabulary [0, {})", id, vocab_size());
  return tokens_[id];
}

}  // namespace chorus::data
