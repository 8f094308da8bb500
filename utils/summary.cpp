#include "utils/summary.h"

#include <algorithm>
#include <cmath>

#include "tensor/error.h"
#include "utils/protobuf_wire.h"
#include "utils/tensorboard_proto.h"

namespace chorus::utils {

namespace pb = tb_proto;
using wire::ProtoWriter;

const std::vector<double>& tensorflow_bins() {
  static const std::vector<double> edges = [] {
    // The same double arithmetic as PyTorch's Python loop (v *= 1.1 from 1e-12), so the edges are
    // bit for bit PyTorch's.
    std::vector<double> positive;
    for (double v = 1e-12; v < 1e20; v *= 1.1) positive.push_back(v);
    std::vector<double> all;
    all.reserve(2 * positive.size() + 1);
    for (auto it = positive.rbegin(); it != positive.rend(); ++it) all.push_back(-*it);
    all.push_back(0.0);
    all.insert(all.end(), positive.begin(), positive.end());
    return all;
  }();
  return edges;
}

Histogram make_histogram(std::span<const double> values, std::span<const double> edges) {
  if (values.empty()) fail("add_histogram: no values (PyTorch: \"The input has no element.\")");
  if (edges.size() < 2) fail("add_histogram: {} bin edges given, at least 2 are needed", edges.size());
  for (size_t i = 0; i < edges.size(); ++i) {
    if (!std::isfinite(edges[i])) fail("add_histogram: bin edge {} is {}", i, edges[i]);
    if (i > 0 && edges[i] < edges[i - 1]) {
      fail("add_histogram: bin edges must not decrease, edge {} is {} after {}", i, edges[i], edges[i - 1]);
    }
  }
  Histogram h;
  h.min = values[0];
  h.max = values[0];
  h.num = static_cast<double>(values.size());
  std::vector<double> counts(edges.size() - 1, 0.0);
  for (size_t i = 0; i < values.size(); ++i) {
    const double x = values[i];
    if (!std::isfinite(x)) fail("add_histogram: value {} is {}; histograms take finite values only", i, x);
    h.min = std::min(h.min, x);
    h.max = std::max(h.max, x);
    h.sum += x;
    h.sum_squares += x * x;
    // numpy.histogram: [edges[i], edges[i+1]) for every bucket but the last, which is closed.
    if (x < edges.front() || x > edges.back()) continue;
    size_t bucket;
    if (x == edges.back()) {
      bucket = counts.size() - 1;
    } else {
      bucket = static_cast<size_t>(std::upper_bound(edges.begin(), edges.end(), x) - edges.begin()) - 1;
    }
    counts[bucket] += 1;
  }
  size_t first = counts.size();
  size_t last = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] > 0) {
      first = std::min(first, i);
      last = i;
    }
  }
  if (first == counts.size()) {
    fail("add_histogram: none of the {} values lies within the bin edges [{}, {}]", values.size(),
         edges.front(), edges.back());
  }
  // TensorBoard reads only right edges, so one bucket before the first non-empty one keeps its left
  // edge; before bucket 0 there is none, and an empty bucket ending at edges[0] stands in for it.
  if (first > 0) {
    h.bucket.assign(counts.begin() + static_cast<ptrdiff_t>(first - 1), counts.begin() + static_cast<ptrdiff_t>(last + 1));
  } else {
    h.bucket.push_back(0.0);
    h.bucket.insert(h.bucket.end(), counts.begin(), counts.begin() + static_cast<ptrdiff_t>(last + 1));
  }
  h.bucket_limit.assign(edges.begin() + static_cast<ptrdiff_t>(first), edges.begin() + static_cast<ptrdiff_t>(last + 2));
  return h;
}

namespace {

// Summary { value: [Value { tag, <value_field>, metadata }] } with the value's fields in field
// order (tag 1, the oneof value 2..8, metadata 9), as protobuf serializes them.
std::string one_value_summary(std::string_view tag, const std::string& value_fields_after_tag,
                              const std::string& metadata) {
  ProtoWriter value;
  value.string_field(pb::summary_value::kTag, tag);
  std::string v = value.take() + value_fields_after_tag;
  if (!metadata.empty()) {
    ProtoWriter md;
    md.bytes_always(pb::summary_value::kMetadata, metadata);
    v += md.bytes();
  }
  ProtoWriter summary;
  summary.bytes_always(pb::summary::kValue, v);
  return summary.take();
}

// SummaryMetadata { plugin_data { plugin_name, content } }.
std::string plugin_metadata(std::string_view plugin_name, std::string_view content) {
  ProtoWriter plugin;
  plugin.string_field(pb::plugin_data::kPluginName, plugin_name);
  plugin.string_field(pb::plugin_data::kContent, content);
  ProtoWriter md;
  md.bytes_always(pb::summary_metadata::kPluginData, plugin.bytes());
  return md.take();
}

}  // namespace

std::string scalar_summary(std::string_view tag, double value) {
  ProtoWriter fields;
  // A member of the oneof: written even when it is 0.
  fields.float_always(pb::summary_value::kSimpleValue, static_cast<float>(value));
  return one_value_summary(tag, fields.bytes(), "");
}

std::string histogram_summary(std::string_view tag, const Histogram& h) {
  ProtoWriter histo;
  histo.double_field(pb::histogram::kMin, h.min);
  histo.double_field(pb::histogram::kMax, h.max);
  histo.double_field(pb::histogram::kNum, h.num);
  histo.double_field(pb::histogram::kSum, h.sum);
  histo.double_field(pb::histogram::kSumSquares, h.sum_squares);
  histo.packed_double_field(pb::histogram::kBucketLimit, h.bucket_limit);
  histo.packed_double_field(pb::histogram::kBucket, h.bucket);
  ProtoWriter fields;
  fields.bytes_always(pb::summary_value::kHisto, histo.bytes());
  return one_value_summary(tag, fields.bytes(), "");
}

std::string text_summary(std::string_view tag, std::string_view text) {
  ProtoWriter dim;
  dim.int64_field(pb::tensor_shape_dim::kSize, 1);
  ProtoWriter shape;
  shape.bytes_always(pb::tensor_shape::kDim, dim.bytes());
  ProtoWriter tensor;
  tensor.varint_field(pb::tensor::kDtype, pb::kDtString);
  tensor.bytes_always(pb::tensor::kTensorShape, shape.bytes());
  tensor.bytes_always(pb::tensor::kStringVal, text);  // a repeated element: written even when empty
  ProtoWriter fields;
  fields.bytes_always(pb::summary_value::kTensor, tensor.bytes());
  // PyTorch's content is TextPluginData(version=0) serialized, which proto3 makes empty.
  return one_value_summary(std::string(tag) + "/text_summary", fields.bytes(), plugin_metadata("text", ""));
}

namespace {

// HParamsPluginData { version: 0 (left out), <which>: message } as the content of an hparams summary.
std::string hparams_summary(std::string_view tag, uint32_t which, const std::string& message) {
  ProtoWriter content;
  content.varint_field(pb::hparams_plugin_data::kVersion, 0);
  content.bytes_always(which, message);  // a oneof member: written even when empty
  return one_value_summary(tag, "", plugin_metadata("hparams", content.bytes()));
}

}  // namespace

HParamsSummaries hparams_summaries(const std::map<std::string, HParamValue>& hparams,
                                   const std::map<std::string, double>& metrics) {
  ProtoWriter experiment;
  ProtoWriter start_info;
  for (const auto& [name, hp] : hparams) {
    // google.protobuf.Value: the kind is a oneof, written even when 0 / "" / false.
    ProtoWriter value;
    uint64_t type = 0;
    if (const double* d = std::get_if<double>(&hp.value)) {
      value.double_always(pb::struct_value::kNumberValue, *d);
      type = pb::kDataTypeFloat64;
    } else if (const std::string* s = std::get_if<std::string>(&hp.value)) {
      value.bytes_always(pb::struct_value::kStringValue, *s);
      type = pb::kDataTypeString;
    } else {
      // PyTorch checks isinstance(v, (int, float)) before bool, and a Python bool is an int, so
      // torch logs True as number_value 1.0. chorus writes what the hparams plugin's own API writes
      // for a bool (bool_value, DATA_TYPE_BOOL), so the dashboard shows true/false and filters on it.
      value.varint_always(pb::struct_value::kBoolValue, std::get<bool>(hp.value) ? 1 : 0);
      type = pb::kDataTypeBool;
    }
    ProtoWriter entry;
    entry.bytes_always(pb::map_entry::kKey, name);
    entry.bytes_always(pb::map_entry::kValue, value.bytes());
    start_info.bytes_always(pb::session_start_info::kHparams, entry.bytes());

    ProtoWriter info;
    info.string_field(pb::hparam_info::kName, name);
    info.varint_field(pb::hparam_info::kType, type);
    experiment.bytes_always(pb::experiment::kHparamInfos, info.bytes());
  }
  for (const auto& [tag, value] : metrics) {
    (void)value;  // the values go in as scalars of the session's run (SummaryWriter::add_hparams)
    ProtoWriter metric_name;
    metric_name.string_field(pb::metric_name::kTag, tag);
    ProtoWriter info;
    info.bytes_always(pb::metric_info::kName, metric_name.bytes());
    experiment.bytes_always(pb::experiment::kMetricInfos, info.bytes());
  }
  ProtoWriter end_info;
  end_info.varint_field(pb::session_end_info::kStatus, pb::kStatusSuccess);

  // Tags: tensorboard/plugins/hparams/metadata.py (EXPERIMENT_TAG & co.).
  return {
      .experiment = hparams_summary("_hparams_/experiment", pb::hparams_plugin_data::kExperiment, experiment.bytes()),
      .session_start_info = hparams_summary("_hparams_/session_start_info", pb::hparams_plugin_data::kSessionStartInfo,
                                            start_info.bytes()),
      .session_end_info = hparams_summary("_hparams_/session_end_info", pb::hparams_plugin_data::kSessionEndInfo,
                                          end_info.bytes()),
  };
}

std::string summary_event(double wall_time, int64_t step, std::string_view summary) {
  ProtoWriter event;
  event.double_field(pb::event::kWallTime, wall_time);
  event.int64_field(pb::event::kStep, step);
  event.bytes_always(pb::event::kSummary, summary);
  return event.take();
}

std::string file_version_event(double wall_time) {
  ProtoWriter event;
  event.double_field(pb::event::kWallTime, wall_time);
  event.bytes_always(pb::event::kFileVersion, "brain.Event:2");
  return event.take();
}

}  // namespace chorus::utils
