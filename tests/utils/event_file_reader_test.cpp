// The C++ reader (utils/event_file_reader.h) and the TFRecord framing: it agrees with the independent
// Python reader on what SummaryWriter wrote; a corrupted byte is a CRC mismatch for both, named by
// offset and CRCs; a file cut inside its last record (a writer killed mid-append) reads as every
// record before it, in both.
#include "utils/event_file_reader.h"

#include <catch2/catch.hpp>
#include <cstdio>

#include "tensor/error.h"
#include "tests/utils/tfevents_testing.h"
#include "utils/protobuf_wire.h"
#include "utils/summary_writer.h"
#include "utils/tfrecord.h"

using namespace chorus::testing;
using chorus::utils::read_events;
using chorus::utils::SummaryWriter;
using nlohmann::json;
namespace tfrecord = chorus::utils::tfrecord;

namespace {

// A file with scalars, a histogram and text; returns its path.
std::string write_sample(const std::string& dir) {
  SummaryWriter writer(dir);
  writer.add_scalar("loss", 0.75, 1, 100.0);
  writer.add_scalar("loss", 0.5, 2, 101.0);
  writer.add_histogram("w", std::vector<double>{-1.0, 0.0, 0.5, 2.0}, 3, chorus::utils::tensorflow_bins(), 102.0);
  writer.add_text("note", "hello", 4, 103.0);
  writer.add_scalar("accuracy", 0.125, 5, 104.0);
  return writer.event_file_path();
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

}  // namespace

TEST_CASE("crc32c matches the published CRC-32C check values", "[tfrecord]") {
  CHECK(tfrecord::crc32c("123456789") == 0xe3069283u);
  // RFC 3720 (iSCSI) B.4: 32 bytes of zeros, of 0xff, and 0x00..0x1f.
  CHECK(tfrecord::crc32c(std::string(32, '\0')) == 0x8a9136aau);
  CHECK(tfrecord::crc32c(std::string(32, '\xff')) == 0x62a8ab43u);
  std::string ascending;
  for (int i = 0; i < 32; ++i) ascending.push_back(static_cast<char>(i));
  CHECK(tfrecord::crc32c(ascending) == 0x46dd794eu);
  CHECK(tfrecord::crc32c("") == 0u);
}

TEST_CASE("read_events decodes what SummaryWriter wrote, as the Python reader does", "[event_file_reader]") {
  const std::string path = write_sample(scratch_dir("reader_agrees"));
  const chorus::utils::EventFileContents cpp = read_events(path);
  const json py = read_tfevents(path);
  CHECK_FALSE(cpp.truncated);
  CHECK(cpp.warning.empty());
  REQUIRE(cpp.events.size() == 6);
  REQUIRE(py["events"].size() == cpp.events.size());
  CHECK(cpp.events[0].file_version == "brain.Event:2");
  for (size_t i = 0; i < cpp.events.size(); ++i) {
    const auto& c = cpp.events[i];
    const json& p = py["events"][i];
    INFO("event " << i << ": " << p.dump());
    CHECK(c.offset == p["offset"].get<uint64_t>());
    CHECK(c.wall_time == p["wall_time"].get<double>());
    CHECK(c.step == p["step"].get<int64_t>());
    if (i == 0) continue;
    REQUIRE(c.values.size() == 1);
    const json& pv = p["values"][0];
    CHECK(c.values[0].tag == pv["tag"].get<std::string>());
    if (pv["kind"] == "simple_value") {
      REQUIRE(c.values[0].simple_value.has_value());
      CHECK(double(*c.values[0].simple_value) == pv["simple_value"].get<double>());
    } else if (pv["kind"] == "histo") {
      REQUIRE(c.values[0].histogram.has_value());
      const auto& h = *c.values[0].histogram;
      CHECK(h.min == pv["histo"]["min"].get<double>());
      CHECK(h.max == pv["histo"]["max"].get<double>());
      CHECK(h.num == pv["histo"]["num"].get<double>());
      CHECK(h.sum == pv["histo"]["sum"].get<double>());
      CHECK(h.sum_squares == pv["histo"]["sum_squares"].get<double>());
      CHECK(h.bucket_limit == pv["histo"]["bucket_limit"].get<std::vector<double>>());
      CHECK(h.bucket == pv["histo"]["bucket"].get<std::vector<double>>());
    } else {
      REQUIRE(pv["kind"] == "tensor");
      CHECK(c.values[0].tensor_dtype == 7);  // DT_STRING
      CHECK(c.values[0].tensor_shape == std::vector<int64_t>{1});
      CHECK(c.values[0].tensor_strings == pv["tensor"]["string_val"].get<std::vector<std::string>>());
      CHECK(c.values[0].plugin_name == "text");
    }
  }
  CHECK(cpp.events[1].values[0].simple_value == 0.75f);
  CHECK(cpp.events[4].values[0].tensor_strings == std::vector<std::string>{"hello"});
}

TEST_CASE("a corrupted byte is a CRC mismatch: the Python reader reports it, read_events throws naming offset and CRCs",
          "[event_file_reader]") {
  const std::string dir = scratch_dir("corrupt");
  const std::string path = write_sample(dir);
  const std::string bytes = read_file(path);
  const chorus::utils::EventFileContents clean = read_events(path);
  // The third record (a scalar): its length, length CRC, data and data CRC each get one bit flipped.
  const uint64_t at = clean.events[2].offset;
  const uint64_t next = clean.events[3].offset;
  struct Spot {
    std::string name;
    uint64_t byte;
    std::string field;  // which CRC the Python reader reports
  };
  const std::vector<Spot> spots = {{"length", at + 1, "length"},
                                   {"length CRC", at + 9, "length"},
                                   {"data", at + 14, "data"},
                                   {"data CRC", next - 2, "data"}};
  for (const Spot& spot : spots) {
    INFO("flipped a bit in the " << spot.name << " (byte " << spot.byte << ")");
    std::string damaged = bytes;
    damaged[spot.byte] = static_cast<char>(damaged[spot.byte] ^ 0x10);
    const std::string copy = dir + "/damaged";
    write_file(copy, damaged);

    const json py = read_tfevents(copy, /*expected_exit_code=*/1);
    REQUIRE(py["crc_error"].is_object());
    CHECK(py["crc_error"]["offset"].get<uint64_t>() == at);
    CHECK(py["crc_error"]["field"] == spot.field);
    CHECK(py["records"] == 2);  // the records before it
    const std::string stored = hex32(py["crc_error"]["stored"].get<uint32_t>());
    const std::string computed = hex32(py["crc_error"]["computed"].get<uint32_t>());
    CHECK(stored != computed);

    try {
      read_events(copy);
      FAIL("read_events accepted a corrupted record");
    } catch (const chorus::Error& e) {
      const std::string what = e.what();
      INFO(what);
      CHECK(what.find(copy) != std::string::npos);
      CHECK(what.find("byte offset " + std::to_string(at)) != std::string::npos);
      // Both CRCs, the same the independent reader found.
      CHECK(what.find("stored " + stored) != std::string::npos);
      CHECK(what.find("computed " + computed) != std::string::npos);
    }
  }
}

TEST_CASE("a file cut inside its last record reads as every record before it, in both readers",
          "[event_file_reader]") {
  const std::string dir = scratch_dir("truncated");
  const std::string path = write_sample(dir);
  const std::string bytes = read_file(path);
  const chorus::utils::EventFileContents whole = read_events(path);
  const uint64_t last = whole.events.back().offset;
  const size_t earlier = whole.events.size() - 1;

  // Every cut from the last record's first byte to one byte short of the end (a writer killed
  // anywhere inside its last append).
  std::vector<std::string> copies;
  for (uint64_t cut = last; cut < bytes.size(); ++cut) {
    const std::string copy = dir + "/cut_" + std::to_string(cut);
    write_file(copy, bytes.substr(0, cut));
    copies.push_back(copy);

    INFO("cut at byte " << cut << " of " << bytes.size());
    const chorus::utils::EventFileContents c = read_events(copy);
    REQUIRE(c.events.size() == earlier);
    CHECK(c.events.back().offset == whole.events[earlier - 1].offset);
    CHECK(c.events.back().step == whole.events[earlier - 1].step);
    if (cut == last) {  // cut on a record boundary: nothing partial
      CHECK_FALSE(c.truncated);
    } else {
      CHECK(c.truncated);
      CHECK(c.truncated_at == last);
      CHECK(c.warning.find("byte offset " + std::to_string(last)) != std::string::npos);
    }
  }
  const json py = read_tfevents(copies);  // one run for all the copies; exit status 0
  REQUIRE(py.size() == copies.size());
  for (size_t i = 0; i < copies.size(); ++i) {
    INFO(py[i]["file"]);
    CHECK(py[i]["records"] == earlier);
    CHECK(py[i]["crc_error"].is_null());
    CHECK(py[i]["truncated"] == (i != 0));
    if (i != 0) CHECK(py[i]["truncated_at"].get<uint64_t>() == last);
  }
}

TEST_CASE("the wire writer: varints, negative int64, proto3 defaults left out, oneof members kept", "[protobuf_wire]") {
  chorus::utils::wire::ProtoWriter w;
  w.varint_field(1, 0);     // left out
  w.varint_field(1, 300);   // 08 ac 02
  w.int64_field(2, -1);     // 10 + ten bytes
  w.double_field(3, 0.0);   // left out
  w.double_field(3, -0.0);  // written: not all-zero bits
  w.float_always(4, 0.0f);  // a oneof member
  w.string_field(5, "");    // left out
  w.bytes_always(5, "");    // 2a 00
  const std::string expected = std::string("\x08\xac\x02", 3) + "\x10" + std::string(9, '\xff') + "\x01" + "\x19" +
                               std::string(7, '\0') + "\x80" + "\x25" + std::string(4, '\0') + "\x2a" +
                               std::string(1, '\0');
  CHECK(w.bytes() == expected);

  chorus::utils::wire::ProtoReader r(w.bytes());
  REQUIRE(r.next());
  CHECK(r.varint() == 300);
  REQUIRE(r.next());
  CHECK(r.int64() == -1);
  REQUIRE(r.next());
  CHECK(std::signbit(r.fixed64_double()));
  REQUIRE(r.next());
  CHECK(r.fixed32_float() == 0.0f);
  REQUIRE(r.next());
  CHECK(r.bytes().empty());
  CHECK_FALSE(r.next());

  const std::string short_field("\x0a\x05" "ab", 4);  // 5 bytes promised, 2 there
  chorus::utils::wire::ProtoReader bad(short_field);
  REQUIRE(bad.next());
  CHECK_THROWS_AS(bad.bytes(), chorus::Error);
}
