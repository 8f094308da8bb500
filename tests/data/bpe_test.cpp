// Byte-level BPE: the pre-split, the merges learned on a small text with known answers, exact round
// trips of any bytes, compression on the installed State of the Union text, the merges file, and
// errors.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "data/data.h"
#include "tensor/error.h"

namespace chorus {
namespace {

using Ids = std::vector<int64_t>;

std::string read_address(const std::string& name) {
  const std::string path = data::default_data_dir() + "/sotu/" + name;
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("the pre-split keeps words with their leading space and never loses a byte", "[data][bpe]") {
  const std::string text = "Mr. Speaker,  the 1990s\n\nwe \xc3\xa9t\xc3\xa9 !?";
  const std::vector<std::string> chunks = data::BytePairTokenizer::split(text);
  CHECK(chunks == std::vector<std::string>{"Mr", ".", " Speaker", ",", " ", " the", " 1990", "s", "\n\n", "we",
                                           " \xc3\xa9t\xc3\xa9", " !?"});
  std::string joined;
  for (const auto& c : chunks) joined += c;
  CHECK(joined == text);
}

TEST_CASE("BPE learns the most frequent pairs in order, ties to the smaller pair", "[data][bpe]") {
  // The textbook example: "aa" first (4 occurrences, overlapping ones counted), then "ab" (2, tied
  // with "aa"+"a" = (256, 97) and won by the smaller pair), then "aa"+"ab".
  const auto t = data::BytePairTokenizer::train("aaabdaaabac", 259);
  REQUIRE(t.vocab_size() == 259);
  CHECK(t.merges() == std::vector<std::pair<int64_t, int64_t>>{{'a', 'a'}, {'a', 'b'}, {256, 257}});
  CHECK(t.token_bytes(258) == "aaab");
  CHECK(t.encode("aaabdaaabac") == Ids{258, 'd', 258, 'a', 'c'});
  CHECK(t.decode({258, 'd', 258, 'a', 'c'}) == "aaabdaaabac");
  // Merges never cross chunks: the space starts a new word.
  CHECK(t.encode("aa ab") == Ids{256, ' ', 257});
  // A text that runs out of pairs stops early.
  CHECK(data::BytePairTokenizer::train("ab ab", 1000).vocab_size() == 258);  // "ab", then " "+"ab"
}

TEST_CASE("BPE on the State of the Union: round trips, compression, determinism, merges file", "[data][bpe]") {
  const std::string train_text = read_address("1790_george_washington_n.txt") + read_address("1791_george_washington_n.txt");
  const std::string other = read_address("1801_thomas_jefferson_dr.txt");
  const auto t = data::BytePairTokenizer::train(train_text, 600);
  CHECK(t.vocab_size() == 600);
  for (const std::string* text : {&train_text, &other}) {
    const Ids ids = t.encode(*text);
    CHECK(t.decode(ids) == *text);
    // Measured 0.37 (training text) and 0.40 (an unseen address) of a token per byte.
    CHECK(static_cast<double>(ids.size()) < 0.55 * static_cast<double>(text->size()));
  }
  // Every byte string round-trips, UTF-8 or not.
  std::mt19937 gen(5);
  std::string noise(5000, '\0');
  for (char& c : noise) c = static_cast<char>(gen() & 0xff);
  CHECK(t.decode(t.encode(noise)) == noise);
  CHECK(t.encode("").empty());
  // Training is deterministic, and the merges file gives the same tokenizer back.
  CHECK(data::BytePairTokenizer::train(train_text, 600).merges() == t.merges());
  const std::string path = (std::filesystem::temp_directory_path() / "chorus_bpe_test.merges").string();
  t.save(path);
  const auto loaded = data::BytePairTokenizer::load(path);
  CHECK(loaded.merges() == t.merges());
  CHECK(loaded.encode(other) == t.encode(other));
  std::filesystem::remove(path);
}

TEST_CASE("BPE errors name what was given and what was expected", "[data][bpe]") {
  CHECK_THAT(error_of([] { data::BytePairTokenizer::train("abc", 100); }), Catch::Contains("vocab_size 100 must be in [256,"));
  const auto t = data::BytePairTokenizer::train("abab", 257);
  CHECK_THAT(error_of([&] { t.decode({5, 257}); }), Catch::Contains("token id 257 is outside the vocabulary [0, 257)"));
  const std::string path = (std::filesystem::temp_directory_path() / "chorus_bpe_bad.merges").string();
  auto write = [&](const std::string& content) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << content;
  };
  write("something else\n");
  CHECK_THAT(error_of([&] { data::BytePairTokenizer::load(path); }), Catch::Contains("does not start with 'chorus-bpe 1'"));
  write("chorus-bpe 1\n97 98\n256 300\n");
  CHECK_THAT(error_of([&] { data::BytePairTokenizer::load(path); }),
             Catch::Contains("line 3: '256 300' should be two token ids below 257"));
  write("chorus-bpe 1\n97 98\n97 98\n");
  CHECK_THAT(error_of([&] { data::BytePairTokenizer::load(path); }), Catch::Contains("the merge 97 98 appears twice"));
  write("chorus-bpe 1\n97 x\n");
  CHECK_THAT(error_of([&] { data::BytePairTokenizer::load(path); }), Catch::Contains("line 2"));
  std::filesystem::remove(path);
  CHECK_THAT(error_of([&] { data::BytePairTokenizer::load(path); }), Catch::Contains("cannot open merges file"));
}

}  // namespace chorus
