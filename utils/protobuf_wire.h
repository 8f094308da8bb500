// The protobuf wire format, by hand: just enough to write and read the few TensorBoard messages
// chorus logs (Event, Summary, HistogramProto, TensorProto, the hparams plugin's messages), so the
// summary writer needs no libprotobuf and no generated code.
//
// Encoding rules followed (protobuf's "Encoding" guide):
// - a field is a key varint (field_number << 3 | wire_type) and a payload; wire types used: 0 varint
//   (int32/int64/bool/enum; negative numbers are their 64-bit two's complement, 10 bytes), 1 fixed64
//   (double, little endian), 2 length-delimited (string, bytes, sub-message, packed repeated),
//   5 fixed32 (float);
// - proto3 leaves a scalar field out when it holds its default (0, 0.0 as all-zero bits, "" and an
//   empty packed list). The `*_field` writers do the same; a member of a `oneof` is written even when
//   it is the default (the oneof records which member is set), which the `*_always` writers do.
//   Fields are written in field-number order, as protobuf's own serializers do.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace chorus::utils::wire {

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

// Appends encoded fields to a byte string (the message being built).
class ProtoWriter {
 public:
  // proto3 scalar fields: left out when they hold the default.
  void varint_field(uint32_t field, uint64_t value);
  void int64_field(uint32_t field, int64_t value) { varint_field(field, static_cast<uint64_t>(value)); }
  void double_field(uint32_t field, double value);
  void string_field(uint32_t field, std::string_view bytes);
  // Packed `repeated double`: one length-delimited field holding the fixed64 values back to back.
  void packed_double_field(uint32_t field, std::span<const double> values);

  // Written whatever the value: oneof members, sub-messages that are set, repeated elements, map
  // entries.
  void varint_always(uint32_t field, uint64_t value);
  void double_always(uint32_t field, double value);
  void float_always(uint32_t field, float value);
  void bytes_always(uint32_t field, std::string_view bytes);  // also strings and sub-messages

  const std::string& bytes() const { return out_; }
  std::string take() { return std::move(out_); }

 private:
  void key(uint32_t field, WireType type);
  void raw_varint(uint64_t value);
  void raw_fixed64(uint64_t bits);

  std::string out_;
};

// Reads the fields of one message in order; it points into `message`, which must outlive it.
// Malformed input (a varint past 10 bytes, a length past
// the end, an unknown wire type) throws chorus::Error; callers add where the message came from.
class ProtoReader {
 public:
  explicit ProtoReader(std::string_view message) : data_(message) {}

  // Moves to the next field; false at the end of the message.
  bool next();
  uint32_t field() const { return field_; }
  WireType wire_type() const { return type_; }

  // The current field's payload, read as the named type (checked against the wire type).
  uint64_t varint();
  int64_t int64() { return static_cast<int64_t>(varint()); }
  double fixed64_double();
  float fixed32_float();
  std::string_view bytes();
  // Skips the current field's payload (unknown fields, fields the caller does not need).
  void skip();

 private:
  void expect(WireType type) const;
  uint64_t read_raw_varint();

  std::string_view data_;
  size_t pos_ = 0;
  uint32_t field_ = 0;
  WireType type_ = kVarint;
  bool payload_pending_ = false;
};

// Appends the current `repeated double` field to `out`: a packed payload (what proto3 writes) or
// one unpacked fixed64 element (what a proto2 writer may write; parsers must accept both).
void read_repeated_double(ProtoReader& reader, std::vector<double>& out);

}  // namespace chorus::utils::wire
