// Fuzz target: BERT's WordPiece tokenizer. An input with a 0x01 byte is a vocabulary (before it,
// one token a line) and a text (after it); without one, the text runs through a small fixed
// vocabulary. Checks: a vocabulary is accepted or refused with chorus::Error; every id encode()
// gives is in range and decodes; decode() of arbitrary ids is text or chorus::Error.
#include <algorithm>
#include <cstring>

#include "data/tokenizer.h"
#include "tensor/error.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

const char kVocabulary[] =
    "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\nun\n##aff\n##able\nrun\n##ning\n,\n.\n!\n\xe4\xb8\xad\n"
    "caf\n##e\nover\n##s\n";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace chorus;
  static const std::string vocab_path = fuzz::scratch_path("vocab.txt");
  const char* bytes = reinterpret_cast<const char*>(data);
  const char* sep = static_cast<const char*>(std::memchr(bytes, 0x01, size));
  std::string text;
  if (sep != nullptr) {
    fuzz::write_file(vocab_path, data, static_cast<size_t>(sep - bytes));
    text.assign(sep + 1, bytes + size);
  } else {
    fuzz::write_file(vocab_path, reinterpret_cast<const uint8_t*>(kVocabulary), sizeof(kVocabulary) - 1);
    text.assign(bytes, size);
  }
  try {
    data::WordPieceTokenizer tok(vocab_path);
    const std::vector<int64_t> ids = tok.encode(text, true);
    fuzz::check(ids.size() >= 2 && ids.front() == tok.cls_id() && ids.back() == tok.sep_id(),
                "encode(add_special_tokens) is not [CLS] ... [SEP]");
    for (int64_t id : ids) fuzz::check(id >= 0 && id < tok.vocab_size(), "encode gave an id outside the vocabulary");
    (void)tok.decode(ids);
    for (const std::string& token : tok.tokenize(text)) (void)tok.token_to_id(token);
    // Ids straight from the bytes: in range or a chorus::Error.
    std::vector<int64_t> raw;
    for (size_t i = 0; i + 2 <= std::min<size_t>(size, 64); i += 2)
      raw.push_back(static_cast<int16_t>(data[i] | data[i + 1] << 8));
    try {
      (void)tok.decode(raw);
    } catch (const Error&) {
    }
  } catch (const Error&) {
  }
  return 0;
}
