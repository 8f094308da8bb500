#include "data/mlm.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tensor/generator.h"
#include "tensor/ops.h"

namespace chorus::data {

namespace fs = std::filesystem;

TextCorpus TextCorpus::load(const std::string& folder, const WordPieceTokenizer& tokenizer) {
  if (!fs::is_directory(folder)) {
    fail("TextCorpus: {} is not a folder (the State of the Union corpus is installed by tools/setup.sh)", folder);
  }
  TextCorpus corpus;
  for (const auto& entry : fs::directory_iterator(folder)) {
    if (entry.is_regular_file() && entry.path().extension() == ".txt") corpus.names.push_back(entry.path().filename());
  }
  if (corpus.names.empty()) fail("TextCorpus: no .txt files in {} (tools/setup.sh installs the corpus)", folder);
  std::sort(corpus.names.begin(), corpus.names.end());
  for (const std::string& name : corpus.names) {
    std::ifstream in(fs::path(folder) / name, std::ios::binary);
    if (!in) fail("TextCorpus: cannot read {}/{}", folder, name);
    std::stringstream text;
    text << in.rdbuf();
    corpus.documents.push_back(tokenizer.encode(text.str()));
  }
  return corpus;
}

std::pair<TextCorpus, TextCorpus> TextCorpus::split(int64_t every) const {
  if (every < 2) fail("TextCorpus::split: every must be at least 2, got {}", every);
  TextCorpus kept, held;
  for (size_t i = 0; i < documents.size(); ++i) {
    TextCorpus& to = static_cast<int64_t>(i) % every == every - 1 ? held : kept;
    to.names.push_back(names[i]);
    to.documents.push_back(documents[i]);
  }
  return {kept, held};
}

int64_t TextCorpus::num_tokens() const {
  int64_t n = 0;
  for (const auto& d : documents) n += static_cast<int64_t>(d.size());
  return n;
}

Tensor TextCorpus::pack(int64_t seq_len, const WordPieceTokenizer& tokenizer) const {
  if (seq_len < 8) fail("TextCorpus::pack: seq_len must be at least 8, got {}", seq_len);
  std::vector<int64_t> stream;
  stream.reserve(num_tokens() + documents.size());
  for (const auto& d : documents) {
    stream.insert(stream.end(), d.begin(), d.end());
    stream.push_back(tokenizer.sep_id());
  }
  const int64_t body = seq_len - 2;
  std::vector<int64_t> out;
  int64_t rows = 0;
  for (size_t start = 0; start < stream.size(); start += body) {
    const size_t end = std::min(stream.size(), start + static_cast<size_t>(body));
    if (static_cast<int64_t>(end - start) < seq_len / 2 && start > 0) break;
    out.push_back(tokenizer.cls_id());
    out.insert(out.end(), stream.begin() + start, stream.begin() + end);
    out.push_back(tokenizer.sep_id());
    for (int64_t k = static_cast<int64_t>(end - start) + 2; k < seq_len; ++k) out.push_back(tokenizer.pad_id());
    ++rows;
  }
  if (rows == 0) return zeros({0, seq_len}, TensorOptions{.dtype = kInt64});
  return tensor<int64_t>(out).reshape({rows, seq_len});
}

MaskedLMDataset::MaskedLMDataset(Tensor sequences, const WordPieceTokenizer& tokenizer, MaskingOptions options)
    : sequences_(sequences.contiguous()), options_(options) {
  if (sequences_.dim() != 2 || sequences_.dtype() != kInt64) {
    fail("MaskedLMDataset: expected int64 sequences [N, T], got {} {}", dtype_name(sequences_.dtype()),
         sequences_.sizes());
  }
  const double p = options.mask_prob, m = options.replace_mask, r = options.replace_random;
  if (!(p > 0 && p < 1) || m < 0 || r < 0 || m + r > 1) {
    fail("MaskedLMDataset: need 0 < mask_prob < 1 and replace_mask, replace_random >= 0 summing to at most 1; got "
         "{}, {}, {}",
         p, m, r);
  }
  vocab_size_ = tokenizer.vocab_size();
  mask_id_ = tokenizer.mask_id();
  cls_id_ = tokenizer.cls_id();
  sep_id_ = tokenizer.sep_id();
  pad_id_ = tokenizer.pad_id();
  // Random replacements come from the word pieces: ids from the first token that is not a bracketed
  // special or [unusedK] ("!" = 999 in bert-base-uncased) to the end.
  first_word_id_ = 0;
  while (first_word_id_ < vocab_size_) {
    const std::string& t = tokenizer.id_to_token(first_word_id_);
    if (!(t.size() >= 2 && t.front() == '[' && t.back() == ']')) break;
    ++first_word_id_;
  }
  if (first_word_id_ >= vocab_size_) fail("MaskedLMDataset: the vocabulary has no word pieces");
  const int64_t* d = sequences_.data_ptr<int64_t>();
  for (int64_t i = 0; i < sequences_.numel(); ++i) {
    if (d[i] < 0 || d[i] >= vocab_size_) {
      fail("MaskedLMDataset: token id {} at position {} is outside the vocabulary [0, {})", d[i], i, vocab_size_);
    }
  }
}

Example MaskedLMDataset::get(int64_t index) const {
  if (index < 0 || index >= size()) fail("MaskedLMDataset: index {} out of range [0, {})", index, size());
  const int64_t t = sequences_.size(1);
  Tensor ids = sequences_[index].clone();
  Tensor labels = full({t}, int64_t{-100}, TensorOptions{.dtype = kInt64});
  int64_t* x = ids.data_ptr<int64_t>();
  int64_t* y = labels.data_ptr<int64_t>();
  const uint64_t key = options_.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch_.load());
  for (int64_t j = 0; j < t; ++j) {
    if (x[j] == cls_id_ || x[j] == sep_id_ || x[j] == pad_id_) continue;
    const auto bits = Generator::philox(key, static_cast<uint64_t>(index) * static_cast<uint64_t>(t) + j);
    if (Generator::uniform_float(bits[0]) >= options_.mask_prob) continue;
    y[j] = x[j];
    const float what = Generator::uniform_float(bits[1]);
    if (what < options_.replace_mask) {
      x[j] = mask_id_;
    } else if (what < options_.replace_mask + options_.replace_random) {
      x[j] = first_word_id_ + static_cast<int64_t>(bits[2] % static_cast<uint32_t>(vocab_size_ - first_word_id_));
    }
  }
  return {ids, labels};
}

Tensor MaskedLMDataset::attention_mask(int64_t index) const {
  return ne(sequences_[index], pad_id_).to(kInt64);
}

}  // namespace chorus::data
