// WordPiece tokenization with the installed bert-base-uncased vocabulary: ids every BERT user
// knows, lower-casing and accent stripping, punctuation and CJK splitting, "##" continuations,
// [UNK], special tokens, decode, and errors.
#include <catch2/catch.hpp>

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
  CHECK_THROWS_WITH(tok().id_to_token(30522), Catch::Contains("outside the vocabulary"));
  CHECK_THROWS_WITH(data::WordPieceTokenizer("/nonexistent/vocab.txt"), Catch::Contains("tools/setup.sh"));
}

}  // namespace
}  // namespace chorus
