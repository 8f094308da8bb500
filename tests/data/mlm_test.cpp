// Masked-LM data: corpus loading and the held-out split, packing into [CLS] ... [SEP] sequences that
// keep the token stream whole, BERT's 15% / 80-10-10 masking (rates, specials never chosen, labels,
// determinism per epoch and across instances), errors, and the installed State of the Union corpus.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "data/data.h"
#include "tensor/ops.h"

namespace chorus {
namespace {

namespace fs = std::filesystem;

const data::WordPieceTokenizer& tok() {
  static const data::WordPieceTokenizer t(data::WordPieceTokenizer::default_vocab_path());
  return t;
}

struct TempDir {
  static inline int count = 0;
  fs::path path = fs::temp_directory_path() / ("chorus_mlm_" + std::to_string(::getpid()) + "_" + std::to_string(count++));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
  void write(const std::string& name, const std::string& text) const { std::ofstream(path / name) << text; }
};

// A corpus of `docs` documents of `words` words each drawn from a fixed word list.
data::TextCorpus synthetic(int docs, int words, uint64_t seed) {
  static const char* kWords[] = {"the", "nation", "congress", "people", "economy", "peace", "war", "year",
                                 "government", "union", "states", "freedom", "law", "world", "america"};
  data::TextCorpus c;
  Generator g(seed);
  for (int d = 0; d < docs; ++d) {
    std::string text;
    for (int w = 0; w < words; ++w) {
      text += kWords[Generator::philox(seed, g.reserve_blocks(1))[0] % 15];
      text += w % 9 == 8 ? ". " : " ";
    }
    c.names.push_back("doc" + std::to_string(d));
    c.documents.push_back(tok().encode(text));
  }
  return c;
}

TEST_CASE("TextCorpus loads *.txt in name order and splits every k-th document off", "[data][mlm]") {
  TempDir dir;
  dir.write("b.txt", "Hello, World!");
  dir.write("a.txt", "the state of the union");
  dir.write("c.txt", "is strong");
  dir.write("notes.md", "not text");
  data::TextCorpus c = data::TextCorpus::load(dir.path, tok());
  REQUIRE(c.names == std::vector<std::string>{"a.txt", "b.txt", "c.txt"});
  CHECK(c.documents[1] == std::vector<int64_t>{7592, 1010, 2088, 999});
  CHECK(c.num_tokens() == static_cast<int64_t>(c.documents[0].size() + 4 + c.documents[2].size()));
  auto [kept, held] = c.split(2);
  CHECK(kept.names == std::vector<std::string>{"a.txt", "c.txt"});
  CHECK(held.names == std::vector<std::string>{"b.txt"});
  CHECK(held.documents[0] == c.documents[1]);

  CHECK_THROWS_WITH(data::TextCorpus::load((dir.path / "missing").string(), tok()),
                    Catch::Contains("is not a folder") && Catch::Contains("tools/setup.sh"));
  TempDir empty;
  empty.write("x.md", "no text files");
  CHECK_THROWS_WITH(data::TextCorpus::load(empty.path, tok()), Catch::Contains("no .txt files"));
  CHECK_THROWS_WITH(c.split(1), Catch::Contains("at least 2"));
}

TEST_CASE("packing: [CLS] chunk [SEP] rows that together are the whole token stream", "[data][mlm]") {
  data::TextCorpus c = synthetic(5, 37, 7);
  std::vector<int64_t> stream;
  for (const auto& d : c.documents) {
    stream.insert(stream.end(), d.begin(), d.end());
    stream.push_back(tok().sep_id());
  }
  const int64_t t = 16;
  Tensor packed = c.pack(t, tok());
  REQUIRE(packed.dim() == 2);
  REQUIRE(packed.size(1) == t);
  const int64_t rows = packed.size(0);
  const int64_t full_rows = static_cast<int64_t>(stream.size()) / (t - 2);
  const int64_t tail = static_cast<int64_t>(stream.size()) % (t - 2);
  CHECK(rows == full_rows + (tail >= t / 2 ? 1 : 0));
  std::vector<int64_t> rebuilt;
  for (int64_t r = 0; r < rows; ++r) {
    CHECK(packed[r][0].item<int64_t>() == tok().cls_id());
    int64_t end = t - 1;
    while (packed[r][end].item<int64_t>() == tok().pad_id()) --end;  // padding only on a last row
    if (r + 1 < rows) CHECK(end == t - 1);
    CHECK(packed[r][end].item<int64_t>() == tok().sep_id());
    for (int64_t j = 1; j < end; ++j) rebuilt.push_back(packed[r][j].item<int64_t>());
  }
  REQUIRE(rebuilt.size() <= stream.size());
  CHECK(std::equal(rebuilt.begin(), rebuilt.end(), stream.begin()));
  CHECK(stream.size() - rebuilt.size() < static_cast<size_t>(t / 2));  // only a short tail dropped
  CHECK(data::TextCorpus{}.pack(t, tok()).size(0) == 0);
  CHECK_THROWS_WITH(c.pack(4, tok()), Catch::Contains("at least 8"));
}

TEST_CASE("masking: 15% of tokens chosen, 80% [MASK] / 10% random / 10% kept, specials never", "[data][mlm]") {
  Tensor packed = synthetic(60, 800, 3).pack(64, tok());
  data::MaskedLMDataset ds(packed, tok(), {.seed = 5});
  int64_t tokens = 0, chosen = 0, masked = 0, random = 0, kept = 0;
  for (int64_t i = 0; i < ds.size(); ++i) {
    data::Example e = ds.get(i);
    const int64_t* orig = packed[i].contiguous().data_ptr<int64_t>();
    const int64_t* x = e.data.data_ptr<int64_t>();
    const int64_t* y = e.target.data_ptr<int64_t>();
    for (int64_t j = 0; j < 64; ++j) {
      const bool special = orig[j] == tok().cls_id() || orig[j] == tok().sep_id() || orig[j] == tok().pad_id();
      if (special) {
        CHECK(y[j] == -100);
        CHECK(x[j] == orig[j]);
        continue;
      }
      ++tokens;
      if (y[j] == -100) {
        CHECK(x[j] == orig[j]);  // not chosen: untouched
        continue;
      }
      ++chosen;
      CHECK(y[j] == orig[j]);
      if (x[j] == tok().mask_id()) ++masked;
      else if (x[j] == orig[j]) ++kept;
      else {
        ++random;
        CHECK(x[j] >= 999);  // a word piece, not a special or [unused]
      }
    }
  }
  REQUIRE(tokens > 40000);
  CHECK(std::abs(static_cast<double>(chosen) / tokens - 0.15) < 0.01);
  CHECK(std::abs(static_cast<double>(masked) / chosen - 0.8) < 0.02);
  // Random replacements that happen to draw the original token count as kept (1 in ~29,500).
  CHECK(std::abs(static_cast<double>(random) / chosen - 0.1) < 0.015);
  CHECK(std::abs(static_cast<double>(kept) / chosen - 0.1) < 0.015);
}

TEST_CASE("masks are the same for a seed and epoch, anywhere, and change with the epoch", "[data][mlm]") {
  Tensor packed = synthetic(4, 300, 9).pack(32, tok());
  data::MaskedLMDataset a(packed, tok(), {.seed = 1}), b(packed, tok(), {.seed = 1}), c(packed, tok(), {.seed = 2});
  data::Batch ba = a.get_batch({0, 1, 2}), bb = b.get_batch({0, 1, 2}), bc = c.get_batch({0, 1, 2});
  CHECK(equal(ba.data, bb.data));
  CHECK(equal(ba.target, bb.target));
  CHECK_FALSE(equal(ba.target, bc.target));
  a.set_epoch(1);
  data::Batch a1 = a.get_batch({0, 1, 2});
  CHECK_FALSE(equal(a1.target, ba.target));
  a.set_epoch(0);
  CHECK(equal(a.get_batch({0, 1, 2}).data, ba.data));
  CHECK(equal(a.attention_mask(0), ones({32}, TensorOptions{.dtype = kInt64})));
}

TEST_CASE("MaskedLMDataset rejects bad sequences and options", "[data][mlm]") {
  CHECK_THROWS_WITH(data::MaskedLMDataset(zeros({4}, TensorOptions{.dtype = kInt64}), tok()),
                    Catch::Contains("expected int64 sequences [N, T]"));
  CHECK_THROWS_WITH(data::MaskedLMDataset(zeros({2, 8}), tok()), Catch::Contains("float32"));
  CHECK_THROWS_WITH(data::MaskedLMDataset(full({2, 8}, int64_t{40000}, TensorOptions{.dtype = kInt64}), tok()),
                    Catch::Contains("40000") && Catch::Contains("outside the vocabulary"));
  Tensor ok = full({2, 8}, int64_t{2000}, TensorOptions{.dtype = kInt64});
  CHECK_THROWS_WITH(data::MaskedLMDataset(ok, tok(), {.mask_prob = 0}), Catch::Contains("0 < mask_prob < 1"));
  CHECK_THROWS_WITH(data::MaskedLMDataset(ok, tok(), {.replace_mask = 0.95, .replace_random = 0.1}),
                    Catch::Contains("summing to at most 1"));
  data::MaskedLMDataset ds(ok, tok());
  CHECK_THROWS_WITH(ds.get(2), Catch::Contains("index 2 out of range [0, 2)"));
}

TEST_CASE("the installed State of the Union corpus: 233 addresses, 1790-2021", "[data][mlm][sotu]") {
  const std::string folder = data::default_data_dir() + "/sotu";
  data::TextCorpus c = data::TextCorpus::load(folder, tok());
  REQUIRE(c.documents.size() == 233);
  CHECK(c.names.front().rfind("1790_george_washington", 0) == 0);
  CHECK(c.names.back().rfind("2021_", 0) == 0);
  CHECK(c.num_tokens() > 1500000);
  // Washington's first address opens "Fellow-Citizens of the Senate and House of Representatives".
  CHECK(tok().decode(std::vector<int64_t>(c.documents[0].begin(), c.documents[0].begin() + 5)) ==
        "fellow - citizens of the");
  auto [train, held] = c.split(20);
  CHECK(held.documents.size() == 11);
  Tensor packed = held.pack(128, tok());
  const int64_t stream = held.num_tokens() + 11;  // a [SEP] after each document
  CHECK(packed.size(0) == stream / 126 + (stream % 126 >= 64 ? 1 : 0));
}

}  // namespace
}  // namespace chorus
