// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104): what the TCP store's job-token handshake
// (store_auth.h) needs. A hundred lines here rather than a crypto library for one function; checked
// against the FIPS 180-4 and RFC 4231 vectors and against Python's hashlib and hmac
// (tests/distributed/sha256_test.cpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace chorus::distributed {

using Sha256Digest = std::array<uint8_t, 32>;

// Incremental: update() any number of times, then finish() once.
class Sha256 {
 public:
  Sha256();
  void update(const uint8_t* data, size_t n);
  void update(std::string_view s) { update(reinterpret_cast<const uint8_t*>(s.data()), s.size()); }
  Sha256Digest finish();

 private:
  void compress(const uint8_t* block);
  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> block_{};
  size_t block_used_ = 0;
  uint64_t total_bytes_ = 0;
};

Sha256Digest sha256(std::string_view data);
// HMAC-SHA256 of `message` under `key` (a key longer than 64 bytes is hashed first, as RFC 2104 says).
Sha256Digest hmac_sha256(std::string_view key, std::string_view message);

// Whether a and b (n bytes each) are equal, in a time that does not depend on where they differ: a
// proof compared with memcmp would tell an attacker how many of its leading bytes were right.
bool equal_in_constant_time(const uint8_t* a, const uint8_t* b, size_t n);

std::string to_hex(const uint8_t* data, size_t n);
inline std::string to_hex(const Sha256Digest& d) { return to_hex(d.data(), d.size()); }

}  // namespace chorus::distributed
