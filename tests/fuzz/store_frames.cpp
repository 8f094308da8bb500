// Fuzz target: the TCP store server's frame handling (distributed/store_protocol.h) with any bytes
// a client could send, delivered in chunks whose sizes the first input byte picks. Checks: never a
// crash; after an accepted call, what stays buffered is less than one whole frame; every reply is
// a well-formed frame; a protocol error stops the connection (nothing more is answered).
#include "distributed/store_protocol.h"
#include "tensor/error.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace chorus::distributed;
  namespace sp = store_protocol;
  if (size == 0) return 0;
  const size_t chunk = 1 + data[0] % 64;
  sp::Table table;
  Bytes buffer;
  constexpr uint32_t kMaxFrame = 1 << 16;
  for (size_t pos = 1; pos < size; pos += chunk) {
    buffer.insert(buffer.end(), data + pos, data + std::min(size, pos + chunk));
    std::vector<Bytes> replies;
    const bool ok = sp::serve_frames(buffer, kMaxFrame, table, replies);
    for (const Bytes& r : replies) {
      chorus::fuzz::check(r.size() >= 4 && sp::get_u32(r.data()) == r.size() - 4, "a reply frame's length is wrong");
    }
    if (!ok) return 0;  // the server drops this client
    if (buffer.size() >= 4) {
      const uint32_t len = sp::get_u32(buffer.data());
      chorus::fuzz::check(len <= kMaxFrame && buffer.size() - 4 < len, "a whole frame was left unanswered");
    }
  }
  // A well-formed request still works on whatever state the input left.
  Bytes probe = sp::encode(sp::kNumKeys, {});
  std::vector<Bytes> replies;
  chorus::fuzz::check(sp::serve_frames(probe, kMaxFrame, table, replies) && replies.size() == 1 &&
                          sp::get_u32(replies[0].data()) == 8,
                      "NUM_KEYS was not answered with one 8-byte integer");
  return 0;
}
