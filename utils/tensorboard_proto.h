// Field numbers of the TensorBoard messages chorus writes and reads, in one table, each block with
// the .proto file it was read from (tensorflow/tensorboard at master; TensorBoard's compat/proto
// copies are TensorFlow's core/framework and core/util protos under package `tensorboard`, same
// numbers). Only the fields chorus uses are listed.
#pragma once

#include <cstdint>

namespace chorus::utils::tb_proto {

// tensorboard/compat/proto/event.proto, message Event (oneof `what`: file_version, summary).
namespace event {
constexpr uint32_t kWallTime = 1;     // double
constexpr uint32_t kStep = 2;         // int64
constexpr uint32_t kFileVersion = 3;  // string, "brain.Event:2" in a file's first record
constexpr uint32_t kSummary = 5;      // Summary
}  // namespace event

// tensorboard/compat/proto/summary.proto, message Summary.
namespace summary {
constexpr uint32_t kValue = 1;  // repeated Summary.Value
}

// tensorboard/compat/proto/summary.proto, message Summary.Value (oneof `value`: simple_value, histo,
// tensor). node_name = 7, obsolete_old_style_histogram = 3, image = 4 and audio = 6 are not used.
namespace summary_value {
constexpr uint32_t kTag = 1;          // string
constexpr uint32_t kSimpleValue = 2;  // float: what add_scalar writes (PyTorch's default, new_style=False)
constexpr uint32_t kHisto = 5;        // HistogramProto
constexpr uint32_t kTensor = 8;       // TensorProto
constexpr uint32_t kMetadata = 9;     // SummaryMetadata
}  // namespace summary_value

// tensorboard/compat/proto/summary.proto, message SummaryMetadata and SummaryMetadata.PluginData.
namespace summary_metadata {
constexpr uint32_t kPluginData = 1;  // PluginData
}
namespace plugin_data {
constexpr uint32_t kPluginName = 1;  // string
constexpr uint32_t kContent = 2;     // bytes: the plugin's own serialized message
}  // namespace plugin_data

// tensorboard/compat/proto/histogram.proto, message HistogramProto (num and the bucket counts are
// doubles; both repeated fields are [packed = true]).
namespace histogram {
constexpr uint32_t kMin = 1;
constexpr uint32_t kMax = 2;
constexpr uint32_t kNum = 3;
constexpr uint32_t kSum = 4;
constexpr uint32_t kSumSquares = 5;
constexpr uint32_t kBucketLimit = 6;
constexpr uint32_t kBucket = 7;
}  // namespace histogram

// tensorboard/compat/proto/tensor.proto, message TensorProto.
namespace tensor {
constexpr uint32_t kDtype = 1;        // DataType enum
constexpr uint32_t kTensorShape = 2;  // TensorShapeProto
constexpr uint32_t kStringVal = 8;    // repeated bytes (DT_STRING)
}  // namespace tensor

// tensorboard/compat/proto/types.proto, enum DataType.
constexpr uint64_t kDtString = 7;

// tensorboard/compat/proto/tensor_shape.proto, TensorShapeProto and TensorShapeProto.Dim.
namespace tensor_shape {
constexpr uint32_t kDim = 2;  // repeated Dim
}
namespace tensor_shape_dim {
constexpr uint32_t kSize = 1;  // int64
}

// tensorboard/plugins/hparams/plugin_data.proto (package tensorboard.hparams).
namespace hparams_plugin_data {
constexpr uint32_t kVersion = 1;           // int32; PLUGIN_DATA_VERSION = 0 (hparams/metadata.py)
constexpr uint32_t kExperiment = 2;        // oneof data: Experiment
constexpr uint32_t kSessionStartInfo = 3;  //             SessionStartInfo
constexpr uint32_t kSessionEndInfo = 4;    //             SessionEndInfo
}  // namespace hparams_plugin_data
namespace session_start_info {
constexpr uint32_t kHparams = 1;  // map<string, google.protobuf.Value>
}
namespace session_end_info {
constexpr uint32_t kStatus = 1;  // Status enum (api.proto)
}

// A map<K, V> field is a repeated message with key = 1 and value = 2 (protobuf's map encoding).
namespace map_entry {
constexpr uint32_t kKey = 1;
constexpr uint32_t kValue = 2;
}  // namespace map_entry

// tensorboard/plugins/hparams/api.proto: Experiment, HParamInfo, MetricInfo, MetricName and the
// DataType and Status enums.
namespace experiment {
constexpr uint32_t kHparamInfos = 4;  // repeated HParamInfo
constexpr uint32_t kMetricInfos = 5;  // repeated MetricInfo
}  // namespace experiment
namespace hparam_info {
constexpr uint32_t kName = 1;  // string
constexpr uint32_t kType = 4;  // DataType
}  // namespace hparam_info
namespace metric_info {
constexpr uint32_t kName = 1;  // MetricName
}
namespace metric_name {
constexpr uint32_t kGroup = 1;  // string
constexpr uint32_t kTag = 2;    // string
}  // namespace metric_name
constexpr uint64_t kDataTypeString = 1;   // DATA_TYPE_STRING
constexpr uint64_t kDataTypeBool = 2;     // DATA_TYPE_BOOL
constexpr uint64_t kDataTypeFloat64 = 3;  // DATA_TYPE_FLOAT64
constexpr uint64_t kStatusSuccess = 1;    // STATUS_SUCCESS

// google/protobuf/struct.proto, message Value (oneof kind).
namespace struct_value {
constexpr uint32_t kNumberValue = 2;  // double
constexpr uint32_t kStringValue = 3;  // string
constexpr uint32_t kBoolValue = 4;    // bool
}  // namespace struct_value

}  // namespace chorus::utils::tb_proto
