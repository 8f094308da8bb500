#include "utils/event_file_reader.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "tensor/error.h"
#include "utils/protobuf_wire.h"
#include "utils/tensorboard_proto.h"
#include "utils/tfrecord.h"

namespace chorus::utils {

namespace {

namespace pb = tb_proto;
using wire::ProtoReader;

Histogram parse_histogram(std::string_view bytes) {
  Histogram h;
  ProtoReader r(bytes);
  while (r.next()) {
    switch (r.field()) {
      case pb::histogram::kMin: h.min = r.fixed64_double(); break;
      case pb::histogram::kMax: h.max = r.fixed64_double(); break;
      case pb::histogram::kNum: h.num = r.fixed64_double(); break;
      case pb::histogram::kSum: h.sum = r.fixed64_double(); break;
      case pb::histogram::kSumSquares: h.sum_squares = r.fixed64_double(); break;
      case pb::histogram::kBucketLimit: wire::read_repeated_double(r, h.bucket_limit); break;
      case pb::histogram::kBucket: wire::read_repeated_double(r, h.bucket); break;
      default: r.skip();
    }
  }
  return h;
}

void parse_tensor(std::string_view bytes, SummaryValueRecord& out) {
  out.tensor_dtype = 0;
  ProtoReader r(bytes);
  while (r.next()) {
    if (r.field() == pb::tensor::kDtype) {
      out.tensor_dtype = r.int64();
    } else if (r.field() == pb::tensor::kTensorShape) {
      ProtoReader shape(r.bytes());
      while (shape.next()) {
        if (shape.field() != pb::tensor_shape::kDim) {
          shape.skip();
          continue;
        }
        ProtoReader dim(shape.bytes());
        int64_t size = 0;
        while (dim.next()) {
          if (dim.field() == pb::tensor_shape_dim::kSize) {
            size = dim.int64();
          } else {
            dim.skip();
          }
        }
        out.tensor_shape.push_back(size);
      }
    } else if (r.field() == pb::tensor::kStringVal) {
      out.tensor_strings.emplace_back(r.bytes());
    } else {
      r.skip();
    }
  }
}

void parse_metadata(std::string_view bytes, SummaryValueRecord& out) {
  ProtoReader md(bytes);
  while (md.next()) {
    if (md.field() != pb::summary_metadata::kPluginData) {
      md.skip();
      continue;
    }
    ProtoReader plugin(md.bytes());
    while (plugin.next()) {
      if (plugin.field() == pb::plugin_data::kPluginName) {
        out.plugin_name = plugin.bytes();
      } else if (plugin.field() == pb::plugin_data::kContent) {
        out.plugin_content = plugin.bytes();
      } else {
        plugin.skip();
      }
    }
  }
}

SummaryValueRecord parse_value(std::string_view bytes) {
  SummaryValueRecord v;
  ProtoReader r(bytes);
  while (r.next()) {
    switch (r.field()) {
      case pb::summary_value::kTag: v.tag = r.bytes(); break;
      case pb::summary_value::kSimpleValue: v.simple_value = r.fixed32_float(); break;
      case pb::summary_value::kHisto: v.histogram = parse_histogram(r.bytes()); break;
      case pb::summary_value::kTensor: parse_tensor(r.bytes(), v); break;
      case pb::summary_value::kMetadata: parse_metadata(r.bytes(), v); break;
      default: r.skip();
    }
  }
  return v;
}

EventRecord parse_event(std::string_view bytes) {
  EventRecord e;
  ProtoReader r(bytes);
  while (r.next()) {
    switch (r.field()) {
      case pb::event::kWallTime: e.wall_time = r.fixed64_double(); break;
      case pb::event::kStep: e.step = r.int64(); break;
      case pb::event::kFileVersion: e.file_version = r.bytes(); break;
      case pb::event::kSummary: {
        ProtoReader summary(r.bytes());
        while (summary.next()) {
          if (summary.field() == pb::summary::kValue) {
            e.values.push_back(parse_value(summary.bytes()));
          } else {
            summary.skip();
          }
        }
        break;
      }
      default: r.skip();  // graph_def, session_log, ...: not decoded
    }
  }
  return e;
}

}  // namespace

EventFileContents read_events(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("read_events: cannot open '{}': {}", path, std::strerror(errno));
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail("read_events: reading '{}' failed", path);

  const tfrecord::ScanResult scan = tfrecord::scan(bytes, path);
  EventFileContents out;
  for (const tfrecord::Record& record : scan.records) {
    try {
      out.events.push_back(parse_event(record.data));
    } catch (const Error& e) {
      // The CRC matched, so the writer wrote these bytes: it wrote something that is not an Event.
      fail("read_events: {}: record at byte offset {} is not a valid Event: {}", path, record.offset, e.what());
    }
    out.events.back().offset = record.offset;
  }
  if (scan.truncated) {
    out.truncated = true;
    out.truncated_at = scan.truncated_at;
    out.warning = fmt::format(
        "read_events: {}: the last record (at byte offset {}, {} bytes present) is incomplete, as its writer "
        "was stopped mid-append; the {} whole records before it were read",
        path, scan.truncated_at, scan.tail_bytes, scan.records.size());
  }
  return out;
}

}  // namespace chorus::utils
