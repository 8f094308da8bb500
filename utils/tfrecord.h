// TFRecord framing, the container of TensorBoard's event files: each record is
//   uint64 length (little endian) | uint32 masked CRC-32C of those 8 bytes | data | uint32 masked CRC-32C of data
// with mask(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8 (TensorFlow's crc32c.h: a CRC of data that
// itself holds CRCs is weak, so stored CRCs are rotated and offset).
//
// A writer killed mid-append leaves a partial last record; scan() reports it as a truncated tail
// and returns every whole record before it. A whole record whose CRC does not match is corruption,
// not truncation: scan() throws chorus::Error naming the file, the byte offset and both CRCs.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace chorus::utils::tfrecord {

// CRC-32C (Castagnoli, reflected polynomial 0x82f63b78, initial value and final xor 0xffffffff):
// crc32c("123456789") == 0xe3069283.
uint32_t crc32c(std::string_view data);
uint32_t mask_crc(uint32_t crc);
inline uint32_t masked_crc32c(std::string_view data) { return mask_crc(crc32c(data)); }

constexpr size_t kHeaderBytes = 12;  // length + its CRC
constexpr size_t kFooterBytes = 4;   // the data's CRC

// The bytes one record occupies in the file.
std::string frame(std::string_view data);

struct Record {
  uint64_t offset = 0;    // of the record's first byte (its length field) in the file
  std::string_view data;  // points into the scanned bytes
};

struct ScanResult {
  std::vector<Record> records;
  bool truncated = false;     // the file ends inside a record
  uint64_t truncated_at = 0;  // where that partial record starts
  uint64_t tail_bytes = 0;    // how many of its bytes are there
};

// Splits a file's bytes into records, checking both CRCs of each. `path` names the file in errors.
ScanResult scan(std::string_view file_bytes, const std::string& path);

}  // namespace chorus::utils::tfrecord
