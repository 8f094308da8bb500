// The TCP store's wire format and its server's key-value table, without sockets: store.cpp's
// server feeds serve_frames() the bytes each client sends and writes back what it returns, and the
// fuzz target (tests/fuzz/store_frames_fuzz.cpp) feeds it anything.
//
// Every request and reply is a frame [u32 body length][body], with a request body
// [u8 command][u32 argument count]([u32 length][bytes])*, all little-endian.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "distributed/store.h"

namespace chorus::distributed::store_protocol {

// kHello and kAuth are the job-token handshake's (store_auth.h); a server without a token answers
// kHello with [0] ("no token here") and knows no kAuth.
enum Command : uint8_t { kSet = 1, kGet, kAdd, kCompareSet, kCheck, kDelete, kNumKeys, kHello, kAuth };

void put_u32(Bytes& out, uint32_t v);
uint32_t get_u32(const uint8_t* p);
Bytes i64_bytes(int64_t v);
// chorus::Error unless `b` holds exactly 8 bytes.
int64_t bytes_i64(const Bytes& b);

// A whole request frame.
Bytes encode(uint8_t command, const std::vector<Bytes>& args);
// Parses a request body; false on any inconsistency (arguments overrunning the body, bytes left
// over).
bool decode(const Bytes& body, uint8_t& command, std::vector<Bytes>& args);

// The server's keys and values.
class Table {
 public:
  // Answers one request; false for a malformed one (unknown command, wrong argument count, an
  // integer that is not 8 bytes), which the server treats as a protocol error.
  bool handle(uint8_t command, const std::vector<Bytes>& args, Bytes& reply);
  size_t size() const { return data_.size(); }

 private:
  std::map<std::string, Bytes> data_;
};

// Answers every complete frame at the front of `buffer` (what one client has sent so far), removing
// them and appending each reply frame to `replies`; an incomplete frame stays for the next call.
// False on a protocol error (a frame longer than max_frame_bytes, a malformed body or request):
// the server then drops that client.
bool serve_frames(Bytes& buffer, uint32_t max_frame_bytes, Table& table, std::vector<Bytes>& replies);

}  // namespace chorus::distributed::store_protocol
