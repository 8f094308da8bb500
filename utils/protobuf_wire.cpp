#include "utils/protobuf_wire.h"

#include <bit>
#include <cstring>

#include "tensor/error.h"

namespace chorus::utils::wire {

static_assert(std::endian::native == std::endian::little,
              "the fixed-width fields are copied as little-endian bytes");

void ProtoWriter::key(uint32_t field, WireType type) { raw_varint((uint64_t{field} << 3) | type); }

void ProtoWriter::raw_varint(uint64_t value) {
  while (value >= 0x80) {
    out_.push_back(static_cast<char>((value & 0x7F) | 0x80));
    value >>= 7;
  }
  out_.push_back(static_cast<char>(value));
}

void ProtoWriter::raw_fixed64(uint64_t bits) {
  char b[8];
  std::memcpy(b, &bits, 8);
  out_.append(b, 8);
}

void ProtoWriter::varint_field(uint32_t field, uint64_t value) {
  if (value != 0) varint_always(field, value);
}

void ProtoWriter::double_field(uint32_t field, double value) {
  // proto3 compares the bits: -0.0 is not the default and is written.
  if (std::bit_cast<uint64_t>(value) != 0) double_always(field, value);
}

void ProtoWriter::string_field(uint32_t field, std::string_view bytes) {
  if (!bytes.empty()) bytes_always(field, bytes);
}

void ProtoWriter::packed_double_field(uint32_t field, std::span<const double> values) {
  if (values.empty()) return;
  key(field, kLengthDelimited);
  raw_varint(values.size() * 8);
  for (double v : values) raw_fixed64(std::bit_cast<uint64_t>(v));
}

void ProtoWriter::varint_always(uint32_t field, uint64_t value) {
  key(field, kVarint);
  raw_varint(value);
}

void ProtoWriter::double_always(uint32_t field, double value) {
  key(field, kFixed64);
  raw_fixed64(std::bit_cast<uint64_t>(value));
}

void ProtoWriter::float_always(uint32_t field, float value) {
  key(field, kFixed32);
  char b[4];
  std::memcpy(b, &value, 4);
  out_.append(b, 4);
}

void ProtoWriter::bytes_always(uint32_t field, std::string_view bytes) {
  key(field, kLengthDelimited);
  raw_varint(bytes.size());
  out_.append(bytes);
}

uint64_t ProtoReader::read_raw_varint() {
  uint64_t value = 0;
  for (int shift = 0; shift < 70; shift += 7) {
    if (pos_ >= data_.size()) fail("protobuf: varint runs past the end of the message (byte {})", pos_);
    const auto byte = static_cast<uint8_t>(data_[pos_++]);
    value |= uint64_t{byte & 0x7Fu} << shift;
    if ((byte & 0x80) == 0) return value;
  }
  fail("protobuf: varint longer than 10 bytes (ends at byte {})", pos_);
}

bool ProtoReader::next() {
  if (payload_pending_) skip();
  if (pos_ >= data_.size()) return false;
  const uint64_t k = read_raw_varint();
  field_ = static_cast<uint32_t>(k >> 3);
  const auto type = static_cast<uint32_t>(k & 7);
  if (field_ == 0) fail("protobuf: field number 0 at byte {}", pos_);
  if (type != kVarint && type != kFixed64 && type != kLengthDelimited && type != kFixed32) {
    fail("protobuf: field {} has wire type {}, which TensorBoard's messages do not use", field_, type);
  }
  type_ = static_cast<WireType>(type);
  payload_pending_ = true;
  return true;
}

void ProtoReader::expect(WireType type) const {
  if (!payload_pending_) fail("protobuf: field {} read twice", field_);
  if (type_ != type) fail("protobuf: field {} has wire type {}, expected {}", field_, int(type_), int(type));
}

uint64_t ProtoReader::varint() {
  expect(kVarint);
  payload_pending_ = false;
  return read_raw_varint();
}

double ProtoReader::fixed64_double() {
  expect(kFixed64);
  payload_pending_ = false;
  if (data_.size() - pos_ < 8) fail("protobuf: field {} (fixed64) runs past the end of the message", field_);
  double v;
  std::memcpy(&v, data_.data() + pos_, 8);
  pos_ += 8;
  return v;
}

float ProtoReader::fixed32_float() {
  expect(kFixed32);
  payload_pending_ = false;
  if (data_.size() - pos_ < 4) fail("protobuf: field {} (fixed32) runs past the end of the message", field_);
  float v;
  std::memcpy(&v, data_.data() + pos_, 4);
  pos_ += 4;
  return v;
}

std::string_view ProtoReader::bytes() {
  expect(kLengthDelimited);
  payload_pending_ = false;
  const uint64_t n = read_raw_varint();
  if (n > data_.size() - pos_) {
    fail("protobuf: field {} says {} bytes, {} are left in the message", field_, n, data_.size() - pos_);
  }
  const std::string_view out = data_.substr(pos_, n);
  pos_ += n;
  return out;
}

void ProtoReader::skip() {
  switch (type_) {
    case kVarint: varint(); break;
    case kFixed64: fixed64_double(); break;
    case kFixed32: fixed32_float(); break;
    case kLengthDelimited: bytes(); break;
  }
}

void read_repeated_double(ProtoReader& reader, std::vector<double>& out) {
  if (reader.wire_type() == kFixed64) {
    out.push_back(reader.fixed64_double());
    return;
  }
  const std::string_view packed = reader.bytes();
  if (packed.size() % 8 != 0) fail("protobuf: packed doubles of {} bytes (not a multiple of 8)", packed.size());
  for (size_t i = 0; i < packed.size(); i += 8) {
    double v;
    std::memcpy(&v, packed.data() + i, 8);
    out.push_back(v);
  }
}

}  // namespace chorus::utils::wire
