// WordPiece tokenization with the installed bert-base-uncased vocabulary: ids every BERT user
// knows, lower-casing and accent stripping, punctuation and CJK splitting, "##" continuations,
// [UNK], special tokens, decode, and errors.
#include <catch2/catch.hpp>

#include <fstream>
#include <iterator>

#include "data/data.h"
#include "tensor/error.h"

namespace chorus {
namespace {

using Tokens = std::vector<std::string>;
using Ids = std::vector<int64_t>;

const data::WordPieceTokenizer& tok() {
  static const data::WordPieceTokenizer t(data::WordPieceTokenizer::default_vocab_path());
  return t;
}

TEST_CASE("the installed vocabulary is bert-base-uncased's", "[data][tokenizer]") {
  CHECK(tok().vocab_size() == 30522);
  CHECK(tok().pad_id() == 0);
  CHECK(tok().unk_id() == 100);
  CHECK(tok().cls_id() == 101);
  CHECK(tok().sep_id() == 102);
  CHECK(tok().mask_id() == 103);
  CHECK(tok().token_to_id("the") == 1996);
  CHECK(tok().id_to_token(1) == "[unused0]");
  CHECK(tok().token_to_id("##s") != tok().unk_id());
}

TEST_CASE("basic tokenization: lower case, accents, punctuation, whitespace, CJK", "[data][tokenizer]") {
  CHECK(tok().encode("Hello, World!") == Ids{7592, 1010, 2088, 999});
  CHECK(tok().encode("hello world", true) == Ids{101, 7592, 2088, 102});
  CHECK(tok().tokenize("  HeLLo\t\n  WORLD  ") == Tokens{"hello", "world"});
  CHECK(tok().tokenize("Café naïve résumé") == Tokens{"cafe", "naive", "resume"});
  CHECK(tok().tokenize("e\xCC\x81t\xC3\xA9") == tok().tokenize("ete"));  // combining accent == precomposed
  CHECK(tok().tokenize("don't stop-now.") == Tokens{"don", "'", "t", "stop", "-", "now", "."});
  CHECK(tok().tokenize("\xE4\xB8\xAD\xE6\x96\x87") == Tokens{"\xE4\xB8\xAD", "\xE6\x96\x87"});  // 中文: one token each
  CHECK(tok().tokenize("a\x01" "b\x7f") == Tokens{"ab"});  // control characters dropped
  CHECK(tok().tokenize("").empty());
}

TEST_CASE("wordpiece: greedy longest match with ## continuations; [UNK] for what it cannot cover", "[data][tokenizer]") {
  const Tokens t = tok().tokenize("unaffable");
  REQUIRE(t.size() >= 2);
  CHECK(t[0].rfind("##", 0) != 0);
  for (size_t i = 1; i < t.size(); ++i) CHECK(t[i].rfind("##", 0) == 0);
  std::string joined = t[0];
  for (size_t i = 1; i < t.size(); ++i) joined += t[i].substr(2);
  CHECK(joined == "unaffable");
  CHECK(tok().tokenize("running") == Tokens{"running"});
  CHECK(tok().tokenize(std::string(101, 'a')) == Tokens{"[UNK]"});  // longer than 100 characters
  CHECK(tok().tokenize("\xE2\x98\x83") == Tokens{"[UNK]"});          // ☃ is not in the vocabulary
  CHECK(tok().decode(tok().encode("The unaffable snowman")) == "the unaffable snowman");
  // A word whose first pieces match and whose rest has none is one [UNK], not its first pieces.
  CHECK(tok().tokenize("the\xE2\x98\x83") == Tokens{"[UNK]"});
  // encode matches a word once and copies its ids for each repeat ([UNK] words too, and "the☃",
  // whose match fails after a piece): the ids of every token, in order, as token_to_id gives them
  // one by one.
  const std::string repeats =
      "unaffable \xE2\x98\x83 running the\xE2\x98\x83 unaffable, \xE2\x98\x83 unaffable the\xE2\x98\x83 running the";
  Ids one_by_one;
  for (const std::string& token : tok().tokenize(repeats)) one_by_one.push_back(tok().token_to_id(token));
  // three unaffable, two snowmen, two the☃, two running, a comma, a the
  CHECK(one_by_one.size() == 3 * t.size() + 2 + 2 + 2 + 1 + 1);
  CHECK(tok().encode(repeats) == one_by_one);
  CHECK(tok().encode(repeats, true) == [&] {
    Ids framed{tok().cls_id()};
    framed.insert(framed.end(), one_by_one.begin(), one_by_one.end());
    framed.push_back(tok().sep_id());
    return framed;
  }());
  CHECK_THROWS_WITH(tok().id_to_token(30522), Catch::Contains("outside the vocabulary"));
  CHECK_THROWS_WITH(data::WordPieceTokenizer("/nonexistent/vocab.txt"), Catch::Contains("tools/setup.sh"));
}


// The matcher against a plain reference on real text: the first State of the Union addresses, a
// word at a time (the words as tokenize's pieces join back). The reference tries every substring
// from the longest, as a string, through the public token_to_id; encode's ids are the pieces' ids.
TEST_CASE("wordpiece on real text: the greedy longest match of a plain reference, and encode's ids are the pieces'",
          "[data][tokenizer]") {
  std::string text;
  for (const char* name : {"1790_george_washington_n.txt", "1791_george_washington_n.txt", "1792_george_washington_n.txt"}) {
    std::ifstream in(data::default_data_dir() + "/sotu/" + name, std::ios::binary);
    INFO(name << " (tools/setup.sh installs the corpus)");
    REQUIRE(in);
    text += std::string((std::istreambuf_iterator<char>(in)), {}) + "\n";
  }
  const Tokens tokens = tok().tokenize(text);
  REQUIRE(tokens.size() > 5000);
  Ids ids;
  for (const std::string& t : tokens) ids.push_back(tok().token_to_id(t));
  CHECK(tok().encode(text) == ids);
  auto reference = [](const std::string& word) {
    Tokens out;
    for (size_t start = 0; start < word.size();) {
      size_t end = word.size();
      for (; end > start; --end) {
        const std::string piece = (start > 0 ? "##" : "") + word.substr(start, end - start);
        if (tok().token_to_id(piece) != tok().unk_id()) {
          out.push_back(piece);
          break;
        }
      }
      if (end == start) return Tokens{"[UNK]"};
      start = end;
    }
    return out;
  };
  size_t words = 0, continued = 0;
  for (size_t i = 0; i < tokens.size();) {
    size_t j = i + 1;
    std::string word = tokens[i];
    for (; j < tokens.size() && tokens[j].rfind("##", 0) == 0; ++j) word += tokens[j].substr(2);
    if (tokens[i] != "[UNK]") {  // (an [UNK] word cannot be joined back; the other test covers it)
      INFO(word);
      CHECK(reference(word) == Tokens(tokens.begin() + i, tokens.begin() + j));
      ++words;
      continued += j - i > 1;
    }
    i = j;
  }
  CHECK(words > 5000);
  CHECK(continued > 50);  // words of several pieces were among them
}

}  // namespace
}  // namespace chorus
