#include "utils/tfrecord.h"

#include <array>
#include <bit>
#include <cstring>

#include "tensor/error.h"

namespace chorus::utils::tfrecord {

namespace {

static_assert(std::endian::native == std::endian::little, "lengths and CRCs are copied as little-endian bytes");

// Byte-at-a-time table for the reflected Castagnoli polynomial.
constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
    table[i] = c;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kTable = make_table();

uint32_t load_u32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

uint64_t load_u64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

}  // namespace

uint32_t crc32c(std::string_view data) {
  uint32_t c = 0xffffffffu;
  for (char ch : data) c = kTable[(c ^ static_cast<uint8_t>(ch)) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

uint32_t mask_crc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

std::string frame(std::string_view data) {
  std::string out(kHeaderBytes + data.size() + kFooterBytes, '\0');
  const uint64_t length = data.size();
  std::memcpy(out.data(), &length, 8);
  const uint32_t length_crc = masked_crc32c(std::string_view(out.data(), 8));
  std::memcpy(out.data() + 8, &length_crc, 4);
  std::memcpy(out.data() + kHeaderBytes, data.data(), data.size());
  const uint32_t data_crc = masked_crc32c(data);
  std::memcpy(out.data() + kHeaderBytes + data.size(), &data_crc, 4);
  return out;
}

ScanResult scan(std::string_view bytes, const std::string& path) {
  ScanResult result;
  uint64_t pos = 0;
  while (pos < bytes.size()) {
    const uint64_t left = bytes.size() - pos;
    const char* rec = bytes.data() + pos;
    // Fewer bytes than a header: a record cut short (the length cannot be checked yet).
    if (left < kHeaderBytes) {
      result.truncated = true;
      result.truncated_at = pos;
      result.tail_bytes = left;
      return result;
    }
    const uint32_t stored_length_crc = load_u32(rec + 8);
    const uint32_t length_crc = masked_crc32c(std::string_view(rec, 8));
    if (stored_length_crc != length_crc) {
      fail("read_events: {}: record at byte offset {}: CRC of the length field does not match "
           "(stored 0x{:08x}, computed 0x{:08x}): the file is corrupt",
           path, pos, stored_length_crc, length_crc);
    }
    const uint64_t length = load_u64(rec);
    if (length > left - kHeaderBytes || left - kHeaderBytes - length < kFooterBytes) {
      result.truncated = true;
      result.truncated_at = pos;
      result.tail_bytes = left;
      return result;
    }
    const std::string_view data(rec + kHeaderBytes, length);
    const uint32_t stored_data_crc = load_u32(rec + kHeaderBytes + length);
    const uint32_t data_crc = masked_crc32c(data);
    if (stored_data_crc != data_crc) {
      fail("read_events: {}: record at byte offset {} ({} data bytes): CRC of the data does not match "
           "(stored 0x{:08x}, computed 0x{:08x}): the file is corrupt",
           path, pos, length, stored_data_crc, data_crc);
    }
    result.records.push_back({pos, data});
    pos += kHeaderBytes + length + kFooterBytes;
  }
  return result;
}

}  // namespace chorus::utils::tfrecord
