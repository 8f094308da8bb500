// Fuzz target: byte-level BPE (data/bpe.h). An input with a 0x01 byte is a merges file (before it)
// and a text (after it); without one, a tokenizer trained on the input itself (up to 300 tokens)
// encodes it. Checks: a merges file is accepted or refused with chorus::Error; every id encode()
// gives is in range, and decode(encode(text)) is the text byte for byte; decode() of arbitrary ids
// is text or chorus::Error.
#include <cstring>
#include <optional>

#include "data/bpe.h"
#include "tensor/error.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace chorus;
  static const std::string merges_path = fuzz::scratch_path("bpe.merges");
  const char* bytes = reinterpret_cast<const char*>(data);
  const char* sep = static_cast<const char*>(std::memchr(bytes, 0x01, size));
  try {
    std::string text;
    std::optional<data::BytePairTokenizer> tok;
    if (sep != nullptr) {
      fuzz::write_file(merges_path, data, static_cast<size_t>(sep - bytes));
      text.assign(sep + 1, bytes + size);
      tok = data::BytePairTokenizer::load(merges_path);
    } else {
      text.assign(bytes, size);
      tok = data::BytePairTokenizer::train(text, 300);
    }
    const std::vector<int64_t> ids = tok->encode(text);
    for (int64_t id : ids) fuzz::check(id >= 0 && id < tok->vocab_size(), "encode gave an id outside the vocabulary");
    fuzz::check(tok->decode(ids) == text, "decode(encode(text)) is not the text");
    std::vector<int64_t> raw;
    for (size_t i = 0; i + 2 <= std::min<size_t>(size, 64); i += 2) raw.push_back(static_cast<int16_t>(data[i] | data[i + 1] << 8));
    try {
      (void)tok->decode(raw);
    } catch (const Error&) {
    }
  } catch (const Error&) {
  }
  return 0;
}
