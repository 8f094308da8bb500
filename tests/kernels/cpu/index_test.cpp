// index_select and index_add ([Row-block index kernels], kernels/cpu/index.cpp) against plain loops
// written here, bit for bit: along each dim of a 3-D tensor, with repeated indices (index_add must
// sum a row named twice in index order, as the one-slice-at-a-time loop does), in float32, float64,
// bfloat16, int64 and bool, with contiguous operands (the row-block path) and with transposed ones
// (the generic path), at 1 and 2 threads (a wide row is split between threads), on cpu and sim:0.
// And an embedding's weight gradient, which is an index_add: its rows against sums written here.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/dispatch.h"
#include "nn/functional.h"
#include "tensor/ops.h"

namespace chorus {
namespace {

const std::vector<Device> kDevices = {Device::cpu(), Device::sim(0)};

template <typename T>
using Compute = std::conditional_t<std::is_same_v<T, BFloat16>, float, T>;

// n values of T drawn from rng: fractions for the floating types (so that the order of a sum shows
// in its last bits), small integers for int64, coin flips for bool.
template <typename T>
std::unique_ptr<T[]> draw(int64_t n, std::mt19937& rng) {
  auto v = std::make_unique<T[]>(static_cast<size_t>(n));
  std::uniform_real_distribution<double> real(-2.0, 2.0);
  std::uniform_int_distribution<int64_t> small(-50, 50);
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<T, bool>) v[i] = small(rng) > 0;
    else if constexpr (std::is_same_v<T, int64_t>) v[i] = small(rng);
    else v[i] = static_cast<T>(static_cast<Compute<T>>(real(rng)));
  }
  return v;
}

// A tensor of `shape` holding v in row-major order; transposed: stored with its dims reversed and
// permuted back, so that it is not contiguous.
template <typename T>
Tensor make(const Shape& shape, const T* v, bool transposed, Device device) {
  const int64_t n = numel_of(shape);
  Shape stored = shape;
  if (transposed) std::reverse(stored.begin(), stored.end());
  Tensor t = empty(stored, {.dtype = dtype_of<T>::value});
  T* p = t.data_ptr<T>();
  if (!transposed) {
    std::memcpy(p, v, static_cast<size_t>(n) * sizeof(T));
  } else {  // element (a, b, c) of shape lives at (c, b, a) of stored
    for (int64_t a = 0; a < shape[0]; ++a)
      for (int64_t b = 0; b < shape[1]; ++b)
        for (int64_t c = 0; c < shape[2]; ++c) p[(c * shape[1] + b) * shape[0] + a] = v[(a * shape[1] + b) * shape[2] + c];
  }
  // Moved before it is permuted: a copy to another device would be contiguous.
  t = t.to(device);
  return transposed ? t.permute({2, 1, 0}) : t;
}

// Whether t (any device, any layout) holds exactly want's n elements in row-major order.
template <typename T>
bool equals(const Tensor& t, const T* want, int64_t n) {
  Tensor c = t.to(Device::cpu()).contiguous();
  return std::memcmp(c.data_ptr<T>(), want, static_cast<size_t>(n) * sizeof(T)) == 0;
}

struct Case {
  Shape shape;  // of index_select's input and of index_add's destination
  int64_t dim;
  std::vector<int64_t> index;
};

// Rows repeat (index_add's order shows), and the last case has rows long enough (40,000 elements)
// for two threads to split them.
const std::vector<Case> kCases = {
    {{6, 5, 7}, 0, {3, 0, 3, 5, 3, 1, 0}},
    {{4, 6, 5}, 1, {5, 5, 0, 2, 5, 1}},
    {{3, 4, 9}, 2, {8, 0, 8, 8, 3}},
    {{5, 200, 200}, 0, {2, 4, 2, 0, 2}},
};

template <typename T>
void check_index_kernels(Device device, bool transposed, int threads) {
  std::mt19937 rng(7);
  for (const Case& k : kCases) {
    const int64_t outer = k.dim == 0 ? 1 : k.dim == 1 ? k.shape[0] : k.shape[0] * k.shape[1];
    const int64_t inner = k.dim == 2 ? 1 : k.dim == 1 ? k.shape[2] : k.shape[1] * k.shape[2];
    const int64_t rows = k.shape[static_cast<size_t>(k.dim)], n = static_cast<int64_t>(k.index.size());
    Shape picked_shape = k.shape;
    picked_shape[static_cast<size_t>(k.dim)] = n;
    const int64_t total = numel_of(k.shape), picked_total = numel_of(picked_shape);
    std::ostringstream what;
    what << dtype_name(dtype_of<T>::value) << " on " << device.str() << ", shape " << shape_str(k.shape) << ", dim "
         << k.dim << (transposed ? ", transposed operands" : ", contiguous operands") << ", " << threads << " thread(s)";
    INFO(what.str());
    const Tensor index = tensor<int64_t>(k.index).to(device);

    // index_select: picked[o, i, c] = x[o, index[i], c].
    auto x = draw<T>(total, rng);
    auto want = std::make_unique<T[]>(static_cast<size_t>(picked_total));
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t c = 0; c < inner; ++c) want[(o * n + i) * inner + c] = x[(o * rows + k.index[i]) * inner + c];
    CHECK(equals<T>(index_select(make<T>(k.shape, x.get(), transposed, device), k.dim, index), want.get(), picked_total));

    // index_add: dst[o, index[i], c] += src[o, i, c], i in order.
    auto dst = draw<T>(total, rng);
    auto src = draw<T>(picked_total, rng);
    auto sum = std::make_unique<T[]>(static_cast<size_t>(total));
    std::memcpy(sum.get(), dst.get(), static_cast<size_t>(total) * sizeof(T));
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t c = 0; c < inner; ++c) {
          T& d = sum[(o * rows + k.index[i]) * inner + c];
          d = static_cast<T>(static_cast<Compute<T>>(d) + static_cast<Compute<T>>(src[(o * n + i) * inner + c]));
        }
    Tensor out = make<T>(k.shape, dst.get(), transposed, device);
    kernels::index_add(out, k.dim, index, make<T>(picked_shape, src.get(), transposed, device));
    CHECK(equals<T>(out, sum.get(), total));
  }
}

TEST_CASE("index_select and index_add equal plain loops, repeated indices summed in order", "[kernels][index]") {
  const int threads_before = get_num_threads();
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (const Device& device : kDevices) {
      for (bool transposed : {false, true}) {
        check_index_kernels<float>(device, transposed, threads);
        check_index_kernels<double>(device, transposed, threads);
        check_index_kernels<BFloat16>(device, transposed, threads);
        check_index_kernels<int64_t>(device, transposed, threads);
        check_index_kernels<bool>(device, transposed, threads);
      }
    }
  }
  set_num_threads(threads_before);
}

TEST_CASE("an embedding's weight gradient sums each token's output gradients in order", "[kernels][index]") {
  // 40 tokens over a 9-row table (most rows repeat, rows 7 and 8 never appear), width 33.
  const int64_t vocab = 9, width = 33;
  const std::vector<int64_t> ids = {1, 4, 4, 0, 6, 2, 1, 1, 5, 3, 4, 0, 6, 6, 2, 5, 1, 3, 3, 0,
                                    2, 2, 4, 6, 5, 1, 0, 0, 3, 6, 4, 2, 5, 5, 1, 3, 0, 6, 4, 2};
  std::mt19937 rng(11);
  auto g = draw<float>(static_cast<int64_t>(ids.size()) * width, rng);
  std::vector<float> want(static_cast<size_t>(vocab * width), 0.f);
  for (size_t i = 0; i < ids.size(); ++i)
    for (int64_t c = 0; c < width; ++c) want[static_cast<size_t>(ids[i] * width + c)] += g[static_cast<int64_t>(i) * width + c];
  for (const Device& device : kDevices) {
    INFO("on " << device.str());
    Tensor weight = randn({vocab, width}).to(device);
    weight.requires_grad_();
    Tensor out = nn::functional::embedding(tensor<int64_t>(ids, Shape{5, 8}).to(device), weight, std::nullopt);
    out.backward(make<float>({5, 8, width}, g.get(), false, device));
    CHECK(equals<float>(weight.grad(), want.data(), vocab * width));
  }
}

}  // namespace
}  // namespace chorus
