// data::GPT2Tokenizer against an independent reference: gpt2_bpe_reference.py (Python's `regex`
// module with GPT-2's own pattern, and encoder.py's merge loop) learns merges, writes vocab.json
// (ids shuffled) and merges.txt as GPT-2 publishes them, and encodes texts in many scripts, with
// contractions, digits, whitespace runs, combining marks, emoji and Unicode spaces. chorus must cut
// each text into the same pieces and give the same ids, and decode them back to the same bytes.
#include <catch2/catch.hpp>

#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "data/gpt2_tokenizer.h"
#include "tensor/error.h"
#include "tests/utils/tfevents_testing.h"

namespace chorus {
namespace {

using chorus::testing::write_file;

const std::string& reference_dir() {
  static const std::string dir =
      chorus::testing::python_made_folder("gpt2_bpe", "tests/data/gpt2_bpe_reference.py", "python3-regex");
  return dir;
}

nlohmann::json reference() {
  std::ifstream in(reference_dir() + "/cases.json");
  return nlohmann::json::parse(in);
}

TEST_CASE("gpt2 tokenizer: the reference's pieces and ids for every text, and the bytes back", "[gpt2_tokenizer]") {
  const nlohmann::json ref = reference();
  const auto tok = data::GPT2Tokenizer::from_pretrained(reference_dir());
  CHECK(tok.vocab_size() == ref["vocab"].get<int64_t>());
  REQUIRE(ref["merges"].get<int64_t>() == 400);
  REQUIRE(ref["cases"].size() >= 20);
  for (const auto& c : ref["cases"]) {
    const std::string text = c["text"].get<std::string>();
    INFO("text: " << text);
    CHECK(data::GPT2Tokenizer::split(text) == c["pieces"].get<std::vector<std::string>>());
    const std::vector<int64_t> ids = tok.encode(text);
    CHECK(ids == c["ids"].get<std::vector<int64_t>>());
    CHECK(tok.decode(ids) == text);
  }
  // Merges happened (the ids are not just bytes), and the special token is in the vocabulary.
  CHECK(tok.encode("Hello world").size() < std::string("Hello world").size());
  CHECK(tok.id_of("<|endoftext|>").has_value());
  CHECK_FALSE(tok.id_of("no such token").has_value());
}

TEST_CASE("gpt2 tokenizer: bytes that are not UTF-8 are pieces of their own and round-trip", "[gpt2_tokenizer]") {
  const auto tok = data::GPT2Tokenizer::from_pretrained(reference_dir());
  CHECK(data::GPT2Tokenizer::split("\xff" "abc") == std::vector<std::string>{"\xff", "abc"});
  CHECK(data::GPT2Tokenizer::split(" \xc3(") == std::vector<std::string>{" \xc3("});  // a cut-off sequence is "other"
  CHECK(data::GPT2Tokenizer::split("\xed\xa0\x80x") == std::vector<std::string>{"\xed\xa0\x80", "x"});  // a surrogate
  for (const std::string s : {"\xff\xfe abc \xc3", "\xc0\xaf overlong", "end \xf4\x90\x80\x80"}) {
    CHECK(tok.decode(tok.encode(s)) == s);
  }
}

TEST_CASE("gpt2 tokenizer: encoding from several threads at once gives the same ids", "[gpt2_tokenizer]") {
  const auto tok = data::GPT2Tokenizer::from_pretrained(reference_dir());
  const std::string text = "The quick brown fox jumps over the lazy dog, again and again, 1234 times.";
  std::vector<std::vector<int64_t>> got(4);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < got.size(); ++i) {
    threads.emplace_back([&, i] {
      for (int k = 0; k < 50; ++k) got[i] = tok.encode(text + std::to_string(k % 7));
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& g : got) CHECK(g == tok.encode(text + "0"));
}

TEST_CASE("gpt2 tokenizer: files that are not GPT-2's format are refused, naming the file and line", "[gpt2_tokenizer]") {
  const std::string dir = chorus::testing::scratch_dir("gpt2_bad");
  const std::string good_vocab = reference_dir() + "/vocab.json", good_merges = reference_dir() + "/merges.txt";
  auto file = [&](const std::string& name, const std::string& text) {
    write_file(dir + "/" + name, text);
    return dir + "/" + name;
  };
  // The 256 byte stand-ins, ids 0..255, as JSON members.
  std::string bytes_json;
  {
    const auto tok = data::GPT2Tokenizer::from_pretrained(reference_dir());
    std::ifstream in(good_vocab);
    const nlohmann::json v = nlohmann::json::parse(in);
    nlohmann::json only_bytes = nlohmann::json::object();
    for (const auto& [token, id] : v.items()) {
      if (tok.decode({id.get<int64_t>()}).size() == 1) only_bytes[token] = only_bytes.size();
    }
    REQUIRE(only_bytes.size() == 256);
    bytes_json = only_bytes.dump();
  }
  using data::GPT2Tokenizer;
  CHECK_THROWS_WITH(GPT2Tokenizer::load(dir + "/absent.json", good_merges), Catch::Contains(dir + "/absent.json"));
  CHECK_THROWS_WITH(GPT2Tokenizer::load(file("broken.json", "{\"a\": "), good_merges),
                    Catch::Contains("broken.json is not valid JSON") && Catch::Contains("expected GPT-2's vocab.json"));
  CHECK_THROWS_WITH(GPT2Tokenizer::load(file("list.json", "[1, 2]"), good_merges), Catch::Contains("list.json is not GPT-2's vocab.json"));
  CHECK_THROWS_WITH(GPT2Tokenizer::load(file("space.json", "{\"a b\": 0}"), good_merges),
                    Catch::Contains("token \"a b\" is not written in GPT-2's byte stand-ins"));
  CHECK_THROWS_WITH(GPT2Tokenizer::load(file("few.json", "{\"a\": 0, \"b\": 1}"), good_merges),
                    Catch::Contains("few.json has no token for byte 0x00"));
  CHECK_THROWS_WITH(GPT2Tokenizer::load(file("id.json", "{\"a\": -1}"), good_merges),
                    Catch::Contains("the id of \"a\" is -1, expected an integer"));
  std::string twice = bytes_json;
  twice.back() = ',';
  twice += "\"ab\": 0}";
  CHECK_THROWS_WITH(GPT2Tokenizer::load(file("twice.json", twice), good_merges), Catch::Contains("id 0 is given to two tokens"));
  const std::string bytes_only = file("bytes.json", bytes_json);
  CHECK_THROWS_WITH(GPT2Tokenizer::load(bytes_only, file("three.txt", "#version: 0.2\na b c\n")),
                    Catch::Contains("three.txt line 2: \"a b c\" is not a merge"));
  CHECK_THROWS_WITH(GPT2Tokenizer::load(bytes_only, file("unknown.txt", "#version: 0.2\na b\n")),
                    Catch::Contains("unknown.txt line 2: \"a b\" needs token \"ab\"") && Catch::Contains("bytes.json does not have"));
  CHECK_THROWS_WITH(GPT2Tokenizer::load(bytes_only, dir + "/absent.txt"), Catch::Contains(dir + "/absent.txt"));
  // The bytes alone are a valid (merge-less) vocabulary.
  const auto plain = GPT2Tokenizer::load(bytes_only, file("empty.txt", "#version: 0.2\n"));
  CHECK(plain.encode("ab").size() == 2);
  CHECK_THROWS_WITH(plain.decode({256}), Catch::Contains("token id 256 is not in the vocabulary (ids 0 .. 255)"));
  CHECK_THROWS_WITH(plain.decode({-1}), Catch::Contains("token id -1"));
}

}  // namespace
}  // namespace chorus
