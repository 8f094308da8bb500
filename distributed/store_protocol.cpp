#include "distributed/store_protocol.h"

#include "tensor/error.h"

namespace chorus::distributed::store_protocol {

void put_u32(Bytes& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

uint32_t get_u32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}

Bytes i64_bytes(int64_t v) {
  Bytes b(8);
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * i));
  return b;
}

int64_t bytes_i64(const Bytes& b) {
  if (b.size() != 8) fail("Store: expected an 8-byte integer value, got {} bytes", b.size());
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(b[i]) << (8 * i);
  return static_cast<int64_t>(v);
}

Bytes encode(uint8_t command, const std::vector<Bytes>& args) {
  Bytes body{command};
  put_u32(body, static_cast<uint32_t>(args.size()));
  for (const Bytes& a : args) {
    put_u32(body, static_cast<uint32_t>(a.size()));
    body.insert(body.end(), a.begin(), a.end());
  }
  Bytes frame;
  put_u32(frame, static_cast<uint32_t>(body.size()));
  frame.insert(frame.end(), body.begin(), body.end());
  return frame;
}

bool decode(const Bytes& body, uint8_t& command, std::vector<Bytes>& args) {
  if (body.size() < 5) return false;
  command = body[0];
  const uint32_t n = get_u32(&body[1]);
  size_t pos = 5;
  if (n > body.size()) return false;
  args.clear();
  for (uint32_t i = 0; i < n; ++i) {
    if (pos + 4 > body.size()) return false;
    const uint32_t len = get_u32(&body[pos]);
    pos += 4;
    if (len > body.size() - pos) return false;
    args.emplace_back(body.begin() + static_cast<std::ptrdiff_t>(pos),
                      body.begin() + static_cast<std::ptrdiff_t>(pos + len));
    pos += len;
  }
  return pos == body.size();
}

bool Table::handle(uint8_t command, const std::vector<Bytes>& a, Bytes& reply) {
  auto key = [&](size_t i) { return std::string(a[i].begin(), a[i].end()); };
  switch (command) {
    case kSet:
      if (a.size() != 2) return false;
      data_[key(0)] = a[1];
      return true;
    case kGet: {
      if (a.size() != 1) return false;
      auto it = data_.find(key(0));
      reply.push_back(it != data_.end());
      if (it != data_.end()) reply.insert(reply.end(), it->second.begin(), it->second.end());
      return true;
    }
    case kAdd: {
      if (a.size() != 2 || a[1].size() != 8) return false;
      auto it = data_.find(key(0));
      int64_t v = 0;
      if (it != data_.end()) {
        if (it->second.size() != 8) return false;
        v = bytes_i64(it->second);
      }
      // Wraps like the two's-complement counters it is used for, without signed-overflow UB.
      v = static_cast<int64_t>(static_cast<uint64_t>(v) + static_cast<uint64_t>(bytes_i64(a[1])));
      data_[key(0)] = i64_bytes(v);
      reply = i64_bytes(v);
      return true;
    }
    case kCompareSet: {
      if (a.size() != 3) return false;
      auto it = data_.find(key(0));
      const bool matches = it == data_.end() ? a[1].empty() : it->second == a[1];
      if (matches) data_[key(0)] = a[2];
      auto now = data_.find(key(0));
      reply = now != data_.end() ? now->second : Bytes();
      return true;
    }
    case kCheck: {
      bool all = true;
      for (size_t i = 0; i < a.size(); ++i) all = all && data_.count(key(i)) > 0;
      reply.push_back(all);
      return true;
    }
    case kDelete:
      if (a.size() != 1) return false;
      reply.push_back(data_.erase(key(0)) > 0);
      return true;
    case kNumKeys:
      reply = i64_bytes(static_cast<int64_t>(data_.size()));
      return true;
    case kHello:  // the table is only reached without a token (or after the handshake): an open store
      if (a.size() > 1) return false;
      reply.push_back(0);
      return true;
    default:
      return false;  // unknown command
  }
}

bool serve_frames(Bytes& buffer, uint32_t max_frame_bytes, Table& table, std::vector<Bytes>& replies) {
  size_t pos = 0;  // start of the first unanswered frame
  bool ok = true;
  while (buffer.size() - pos >= 4) {
    const uint32_t len = get_u32(buffer.data() + pos);
    if (len > max_frame_bytes) {  // oversized frame: protocol error
      ok = false;
      break;
    }
    if (buffer.size() - pos - 4 < len) break;  // incomplete: wait for the rest
    const Bytes body(buffer.begin() + static_cast<std::ptrdiff_t>(pos + 4),
                     buffer.begin() + static_cast<std::ptrdiff_t>(pos + 4 + len));
    pos += 4 + static_cast<size_t>(len);
    uint8_t command = 0;
    std::vector<Bytes> args;
    Bytes reply;
    if (!decode(body, command, args) || !table.handle(command, args, reply)) {
      ok = false;
      break;
    }
    Bytes frame;
    put_u32(frame, static_cast<uint32_t>(reply.size()));
    frame.insert(frame.end(), reply.begin(), reply.end());
    replies.push_back(std::move(frame));
  }
  buffer.erase(buffer.begin(), buffer.begin() + static_cast<std::ptrdiff_t>(pos));
  return ok;
}

}  // namespace chorus::distributed::store_protocol
