// Masked-language-model data: a folder of plain-text documents tokenized with WordPiece, packed into
// fixed-length sequences, and masked as BERT's pretraining does.
//
//   data::WordPieceTokenizer tok(data::WordPieceTokenizer::default_vocab_path());
//   auto corpus = data::TextCorpus::load(data::default_data_dir() + "/sotu", tok);
//   auto [train_docs, heldout_docs] = corpus.split(20);   // every 20th document held out
//   auto train = std::make_shared<data::MaskedLMDataset>(train_docs.pack(128, tok), tok, MaskingOptions{});
//   train->set_epoch(e);                                 // fresh masks every epoch
//   for (data::Batch& b : loader) { b.data: masked ids [B, T]; b.target: labels [B, T], -100 = not masked }
#pragma once

#include <atomic>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/tokenizer.h"

namespace chorus::data {

// Token ids of whole documents, in file-name order.
struct TextCorpus {
  std::vector<std::string> names;               // file names, sorted
  std::vector<std::vector<int64_t>> documents;  // token ids, no special tokens

  // Every *.txt file in `folder` (sorted by name), tokenized. A missing folder or one without text
  // files -> chorus::Error naming it and pointing at tools/setup.sh.
  static TextCorpus load(const std::string& folder, const WordPieceTokenizer& tokenizer);

  // {kept, held out}: document i goes to the held-out part when i % every == every - 1.
  std::pair<TextCorpus, TextCorpus> split(int64_t every) const;

  int64_t num_tokens() const;

  // Packing to a fixed length (RoBERTa's FULL-SENTENCES): the documents' tokens as one stream with
  // [SEP] after each document, cut into chunks of seq_len - 2, each wrapped as [CLS] chunk [SEP]. A
  // last chunk shorter than seq_len / 2 is dropped; a longer one is padded with [PAD]. Returns
  // int64 [N, seq_len]; N = 0 when the corpus is too short. seq_len must be at least 8.
  Tensor pack(int64_t seq_len, const WordPieceTokenizer& tokenizer) const;
};

struct MaskingOptions {
  double mask_prob = 0.15;    // share of (non-special) positions chosen for prediction
  double replace_mask = 0.8;  // of the chosen: replaced by [MASK]
  double replace_random = 0.1;  // replaced by a random non-special token; the rest stay as they were
  uint64_t seed = 0;
};

// Sequences [N, T] (from TextCorpus::pack) served as masked-LM examples: data = input ids with
// BERT's masking applied, target = labels (the original id at chosen positions, -100 elsewhere).
// Masks are drawn from Philox keyed by (seed, epoch, sequence index): the same on every run, rank
// and worker, and different each epoch (set_epoch). [CLS], [SEP] and [PAD] are never chosen.
class MaskedLMDataset : public Dataset {
 public:
  MaskedLMDataset(Tensor sequences, const WordPieceTokenizer& tokenizer, MaskingOptions options = {});
  int64_t size() const override { return sequences_.size(0); }
  Example get(int64_t index) const override;
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  const Tensor& sequences() const { return sequences_; }
  // 1 for tokens, 0 for [PAD], as int64 [T] for sequence `index`.
  Tensor attention_mask(int64_t index) const;

 private:
  Tensor sequences_;
  MaskingOptions options_;
  int64_t vocab_size_, mask_id_, cls_id_, sep_id_, pad_id_, first_word_id_;
  std::atomic<int64_t> epoch_{0};
};

}  // namespace chorus::data
