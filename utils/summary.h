// The Summary messages SummaryWriter logs, built as PyTorch's torch/utils/tensorboard/summary.py
// builds them (same tags, plugins, fields and histogram buckets), serialized with the hand-written
// wire writer (utils/protobuf_wire.h; field numbers in utils/tensorboard_proto.h).
#pragma once

#include <concepts>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace chorus::utils {

// A HistogramProto's content. Each bucket_limit is the right edge of its bucket; bucket holds the
// counts (doubles, as in the proto).
struct Histogram {
  double min = 0;
  double max = 0;
  double num = 0;
  double sum = 0;
  double sum_squares = 0;
  std::vector<double> bucket_limit;
  std::vector<double> bucket;
};

// PyTorch's bins="tensorflow" (SummaryWriter.default_bins): v = 1e-12, then v *= 1.1 while
// v < 1e20, mirrored to the negatives, with 0 in the middle; 1549 edges.
const std::vector<double>& tensorflow_bins();

// PyTorch's make_histogram: numpy.histogram's counts over the bin edges (bucket i holds
// edges[i] <= x < edges[i+1], the last one closed on the right; values outside the edges are left
// out of the buckets but not of min/max/num/sum), then only the buckets from the first to the last
// non-empty one are kept, with one bucket before them (an empty one when the first bucket is
// non-empty) so the leftmost limit is there too. Empty values, a non-finite value, fewer than two
// edges, decreasing or non-finite edges, or no value inside the edges: chorus::Error.
Histogram make_histogram(std::span<const double> values, std::span<const double> bin_edges);

// An hparams value: a number (integers too), a string or a bool.
struct HParamValue {
  std::variant<double, std::string, bool> value;

  HParamValue(bool b) : value(b) {}
  template <typename T>
    requires(std::integral<T> || std::floating_point<T>) && (!std::same_as<T, bool>)
  HParamValue(T number) : value(static_cast<double>(number)) {}
  HParamValue(std::string s) : value(std::move(s)) {}
  HParamValue(const char* s) : value(std::string(s)) {}
};

// Serialized Summary messages, one Summary.Value each.
std::string scalar_summary(std::string_view tag, double value);  // simple_value (a float)
std::string histogram_summary(std::string_view tag, const Histogram& histogram);
// Tag "<tag>/text_summary", plugin "text", a DT_STRING tensor of shape [1] holding the text.
std::string text_summary(std::string_view tag, std::string_view text);

// The hparams plugin's three summaries (tags _hparams_/experiment, _hparams_/session_start_info,
// _hparams_/session_end_info), each a Summary.Value with only metadata: plugin "hparams", content a
// serialized HParamsPluginData (version 0).
struct HParamsSummaries {
  std::string experiment;          // HParamInfo per hparam (name, type), MetricInfo per metric tag
  std::string session_start_info;  // the hparam values
  std::string session_end_info;    // status STATUS_SUCCESS
};
HParamsSummaries hparams_summaries(const std::map<std::string, HParamValue>& hparams,
                                   const std::map<std::string, double>& metrics);

// Serialized Event messages.
std::string summary_event(double wall_time, int64_t step, std::string_view summary);
std::string file_version_event(double wall_time);  // file_version "brain.Event:2"

}  // namespace chorus::utils
