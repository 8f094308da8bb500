#include "kernels/cuda/cudnn_plan.h"

#include <fmt/format.h>

#include <atomic>
#include <climits>

#include "tensor/error.h"

namespace chorus::cuda {
namespace {
std::atomic<bool> g_enabled{true}, g_deterministic{false}, g_allow_tf32{true};
std::atomic<int64_t> g_workspace_limit{int64_t{1} << 30};
}  // namespace

void set_cudnn_enabled(bool enabled) { g_enabled.store(enabled); }
bool cudnn_enabled() { return g_enabled.load(); }
void set_cudnn_deterministic(bool deterministic) { g_deterministic.store(deterministic); }
bool cudnn_deterministic() { return g_deterministic.load(); }
void set_cudnn_allow_tf32(bool allow) { g_allow_tf32.store(allow); }
bool cudnn_allow_tf32() { return g_allow_tf32.load(); }
void set_cudnn_workspace_limit(int64_t bytes) {
  if (bytes < 0) fail("set_cudnn_workspace_limit: got {} bytes, expected a size >= 0", bytes);
  g_workspace_limit.store(bytes);
}
int64_t cudnn_workspace_limit() { return g_workspace_limit.load(); }

}  // namespace chorus::cuda

namespace chorus::kernels::cudnn_plan {
namespace {

int to_int(int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX) fail("cudnn conv2d: {} = {} does not fit cuDNN's int (expected 0 to {})", what, v, INT_MAX);
  return static_cast<int>(v);
}

DataType data_type(DType dtype) {
  switch (dtype) {
    case DType::Float32: return DataType::Float;
    case DType::Float64: return DataType::Double;
    case DType::Float16: return DataType::Half;
    case DType::BFloat16: return DataType::BFloat16;
    default: fail("cudnn conv2d: dtype {} has no cuDNN type; expected float32, float64, float16 or bfloat16", dtype_name(dtype));
  }
}

TensorDesc tensor_desc(const Shape& sizes, const Strides& strides, DataType type, const char* what) {
  if (sizes.size() != 4 || strides.size() != 4) {
    fail("cudnn conv2d: {} has {} dims, expected 4 (N, C, H, W)", what, sizes.size());
  }
  TensorDesc d;
  d.type = type;
  for (int i = 0; i < 4; ++i) {
    d.dims[i] = to_int(sizes[i], what);
    d.strides[i] = to_int(strides[i], what);
  }
  return d;
}

}  // namespace

const char* type_name(DataType t) {
  switch (t) {
    case DataType::Float: return "float32";
    case DataType::Double: return "float64";
    case DataType::Half: return "float16";
    case DataType::BFloat16: return "bfloat16";
  }
  return "?";
}

bool is_channels_last(const Shape& sizes, const Strides& strides) { return is_channels_last_strides(sizes, strides); }

bool is_nchw_contiguous(const Shape& sizes, const Strides& strides) {
  return sizes.size() == 4 && strides.size() == 4 && is_contiguous_strides(sizes, strides);
}

ConvPlan plan_conv2d(const Shape& x_sizes, const Strides& x_strides, const Shape& w_sizes, const Strides& w_strides,
                     const Shape& y_sizes, const Strides& y_strides, DType dtype, const Window2d& window,
                     int64_t groups, bool allow_tf32) {
  const DataType type = data_type(dtype);
  ConvPlan p;
  p.x = tensor_desc(x_sizes, x_strides, type, "the input");
  p.y = tensor_desc(y_sizes, y_strides, type, "the output");
  if (w_sizes.size() != 4) fail("cudnn conv2d: the weight has {} dims, expected 4 (K, C/groups, R, S)", w_sizes.size());
  if (groups < 1 || x_sizes[1] % groups != 0 || w_sizes[0] % groups != 0 || w_sizes[1] * groups != x_sizes[1]) {
    fail("cudnn conv2d: groups {} do not fit input channels {} and weight {}", groups, x_sizes[1], shape_str(w_sizes));
  }
  // Channels-last when the input or the weight is channels-last and not also NCHW (the op layer
  // makes both one layout; an input of 1x1 positions, e.g. ResNet's last stage at a small image size,
  // is dense in both, and then the weight tells).
  const bool w_nhwc = is_channels_last(w_sizes, w_strides);
  const bool w_nchw = is_nchw_contiguous(w_sizes, w_strides);
  p.channels_last = (is_channels_last(x_sizes, x_strides) && !is_nchw_contiguous(x_sizes, x_strides)) ||
                    (w_nhwc && !w_nchw && is_channels_last(x_sizes, x_strides));
  if (p.channels_last ? !w_nhwc : !w_nchw) {
    fail("cudnn conv2d: the weight {} with strides {} is not dense {}; expected it in the input's layout ({})",
         shape_str(w_sizes), shape_str(w_strides), p.channels_last ? "KRSC" : "KCRS",
         p.channels_last ? "channels-last" : "NCHW");
  }
  p.w.type = type;
  p.w.format = p.channels_last ? FilterFormat::NHWC : FilterFormat::NCHW;
  for (int i = 0; i < 4; ++i) p.w.dims[i] = to_int(w_sizes[i], "the weight");
  p.conv.pad = {to_int(window.pad_h, "pad_h"), to_int(window.pad_w, "pad_w")};
  p.conv.stride = {to_int(window.stride_h, "stride_h"), to_int(window.stride_w, "stride_w")};
  p.conv.dilation = {to_int(window.dilation_h, "dilation_h"), to_int(window.dilation_w, "dilation_w")};
  if (p.conv.stride[0] < 1 || p.conv.stride[1] < 1 || p.conv.dilation[0] < 1 || p.conv.dilation[1] < 1) {
    fail("cudnn conv2d: stride {}x{} and dilation {}x{} must be at least 1", p.conv.stride[0], p.conv.stride[1],
         p.conv.dilation[0], p.conv.dilation[1]);
  }
  p.conv.groups = to_int(groups, "groups");
  p.conv.compute = type == DataType::Double ? DataType::Double : DataType::Float;
  // The output's spatial size must be the convolution's (cuDNN checks too, with a bare status).
  for (int i = 0; i < 2; ++i) {
    const int64_t in = x_sizes[2 + i], k = w_sizes[2 + i];
    const int64_t expect =
        (in + 2 * p.conv.pad[i] - p.conv.dilation[i] * (k - 1) - 1) / p.conv.stride[i] + 1;
    if (y_sizes[2 + i] != expect || y_sizes[0] != x_sizes[0] || y_sizes[1] != w_sizes[0]) {
      fail("cudnn conv2d: output {} does not match input {}, weight {} and the window (expected [{}, {}, ...] with {} "
           "in dim {})",
           shape_str(y_sizes), shape_str(x_sizes), shape_str(w_sizes), x_sizes[0], w_sizes[0], expect, 2 + i);
    }
  }
  p.bias.type = type;
  p.bias.dims = {1, p.w.dims[0], 1, 1};
  p.bias.strides = {p.w.dims[0], 1, 1, 1};
  p.tensor_ops = type == DataType::Half || type == DataType::BFloat16 || (type == DataType::Float && allow_tf32);
  p.math = type == DataType::Half || type == DataType::BFloat16 ? MathType::TensorOp
           : p.tensor_ops                                        ? MathType::Default
                                                                 : MathType::Fma;
  // [Size-1 strides] A size-1 dim's stride is any number in chorus (and PyTorch), but cuDNN wants
  // the packed stride of the layout there (PyTorch's fixSizeOneDimStride): a [N, C, 1, 1] input
  // that batch norm left with NCHW strides, before a channels-last 3x3 convolution, would otherwise
  // reach cuDNN as NCHW-strided beside an NHWC filter. The key reads these strides too.
  for (TensorDesc* t : {&p.x, &p.y}) {
    const std::array<int, 4> inner_first =
        p.channels_last ? std::array<int, 4>{1, 3, 2, 0} : std::array<int, 4>{3, 2, 1, 0};
    int64_t z = 1;
    for (int d : inner_first) {
      if (t->dims[d] == 1) t->strides[d] = to_int(z, "a size-1 dim's stride");
      else z *= t->dims[d];
    }
  }
  return p;
}

bool result_math_allowed(MathType plan, int result) {
  return result != static_cast<int>(MathType::TensorOpAllowConversion) || plan == MathType::TensorOpAllowConversion;
}

size_t ConvKeyHash::operator()(const ConvKey& k) const {
  size_t h = 1469598103934665603ull;
  auto mix = [&h](int64_t v) { h = (h ^ static_cast<size_t>(v)) * 1099511628211ull; };
  mix(static_cast<int>(k.direction));
  mix(k.device);
  mix(static_cast<int>(k.type));
  mix(k.channels_last * 4 + k.tensor_ops * 2 + k.deterministic);
  for (const auto* a : {&k.x_dims, &k.x_strides, &k.w_dims, &k.y_dims, &k.y_strides})
    for (int v : *a) mix(v);
  for (const auto* a : {&k.pad, &k.stride, &k.dilation})
    for (int v : *a) mix(v);
  mix(k.groups);
  return h;
}

ConvKey conv_key(const ConvPlan& p, Direction direction, int device, bool deterministic) {
  ConvKey k;
  k.direction = direction;
  k.device = device;
  k.type = p.x.type;
  k.channels_last = p.channels_last;
  k.tensor_ops = p.tensor_ops;
  k.deterministic = deterministic;
  k.x_dims = p.x.dims;
  k.x_strides = p.x.strides;
  k.w_dims = p.w.dims;
  k.y_dims = p.y.dims;
  k.y_strides = p.y.strides;
  k.pad = p.conv.pad;
  k.stride = p.conv.stride;
  k.dilation = p.conv.dilation;
  k.groups = p.conv.groups;
  return k;
}

std::string describe(const ConvKey& k) {
  static const char* directions[] = {"forward", "backward-data", "backward-filter"};
  return fmt::format("{} {} {} x[{}] w[{}] y[{}] pad {} stride {} dilation {} groups {} on cuda:{}{}{}",
                     directions[static_cast<int>(k.direction)], type_name(k.type), k.channels_last ? "NHWC" : "NCHW",
                     fmt::join(k.x_dims, ","), fmt::join(k.w_dims, ","), fmt::join(k.y_dims, ","), fmt::join(k.pad, ","),
                     fmt::join(k.stride, ","), fmt::join(k.dilation, ","), k.groups, k.device,
                     k.tensor_ops ? ", tensor ops" : "", k.deterministic ? ", deterministic" : "");
}

std::optional<AlgoChoice> AlgoCache::find(const ConvKey& key, int64_t max_workspace) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = map_.find(key);
  if (it == map_.end() || it->second.workspace > max_workspace) return std::nullopt;
  return it->second;
}

void AlgoCache::insert(const ConvKey& key, const AlgoChoice& choice) {
  std::lock_guard<std::mutex> lock(mutex_);
  map_[key] = choice;
}

size_t AlgoCache::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return map_.size();
}

void AlgoCache::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  map_.clear();
}

std::vector<std::pair<ConvKey, AlgoChoice>> AlgoCache::entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {map_.begin(), map_.end()};
}

AlgoCache& AlgoCache::global() {
  static AlgoCache cache;
  return cache;
}

}  // namespace chorus::kernels::cudnn_plan
