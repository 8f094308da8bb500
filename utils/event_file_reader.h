// chorus::utils::read_events: reads a TensorBoard event file back (what SummaryWriter, PyTorch or
// TensorFlow wrote): every record's CRCs are checked, and each Event's step, wall time and summary
// values (scalars, histograms, string tensors, plugin names) are decoded.
//
// A file whose writer was killed mid-record ends in a partial record: read_events returns every
// whole record before it and sets `truncated`. A whole record
// whose CRC does not match is corruption: chorus::Error naming the file, the record's byte offset
// and the stored and computed CRCs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "utils/summary.h"

namespace chorus::utils {

struct SummaryValueRecord {
  std::string tag;
  std::optional<float> simple_value;           // add_scalar's values
  std::optional<Histogram> histogram;          // add_histogram's
  std::optional<int64_t> tensor_dtype;         // a TensorProto value's DataType (7 = DT_STRING)
  std::vector<int64_t> tensor_shape;           // its dims
  std::vector<std::string> tensor_strings;     // its string_val (add_text's text)
  std::string plugin_name;                     // metadata.plugin_data.plugin_name, "" when none
  std::string plugin_content;                  // metadata.plugin_data.content (serialized)
};

struct EventRecord {
  uint64_t offset = 0;  // of the record in the file
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;  // "brain.Event:2" in a file's first record
  std::vector<SummaryValueRecord> values;
};

struct EventFileContents {
  std::vector<EventRecord> events;
  bool truncated = false;     // the file ends inside a record (its writer was killed mid-append)
  uint64_t truncated_at = 0;  // byte offset of that partial record
  std::string warning;        // says so, for logs; "" when not truncated
};

EventFileContents read_events(const std::string& path);

}  // namespace chorus::utils
