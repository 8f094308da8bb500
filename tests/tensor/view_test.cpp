// Views and shape ops: view, reshape (a view when strides allow, a copy only when they do not),
// permute/transpose/t, narrow, slice with step, select, squeeze/unsqueeze, expand, flatten,
// as_strided, contiguous and is_contiguous. Each view is checked element by element against its
// base (through strides, not through a copy) and for sharing the base's storage, and writes through
// a view must land in the base.
#include <catch2/catch.hpp>

#include <vector>

#include "tests/tensor/tensor_testing.h"

namespace chorus {
namespace {

using testing::count_of;
using testing::matches_exactly;
using testing::read;
using testing::same_storage;
using testing::unravel;
using testing::values;

Tensor random3(Generator& gen) { return randn({2, 3, 4}, {.dtype = kFloat64}, &gen); }

}  // namespace

TEST_CASE("view reinterprets contiguous memory without copying", "[tensor][view]") {
  Generator gen(1);
  Tensor x = random3(gen);
  Tensor v = x.view({6, 4});
  CHECK(same_storage(v, x));
  CHECK(v.raw_data_ptr() == x.raw_data_ptr());
  CHECK(v.strides() == Strides{4, 1});
  CHECK(values(v) == values(x));  // the same row-major sequence
  CHECK(x.view({-1}).sizes() == Shape{24});
  CHECK(x.view({4, -1, 3}).sizes() == Shape{4, 2, 3});
  CHECK(x.view({4, -1, 3}).is_contiguous());
  // A write through the view is a write to x.
  Tensor row = v.select(0, 5);
  row.fill_(7.0);
  CHECK(read(x, {1, 2, 0}) == 7.0);
  CHECK(read(x, {1, 2, 3}) == 7.0);
  // A view of a transposed tensor that keeps its dims separable is still a view.
  Tensor tt = x.transpose(1, 2);  // [2, 4, 3]
  Tensor split = tt.view({2, 2, 2, 3});
  CHECK(same_storage(split, x));
  for (int64_t i = 0; i < split.numel(); ++i) {
    auto idx = unravel(i, {2, 2, 2, 3});
    CHECK(read(split, idx) == read(x, {idx[0], idx[3], idx[1] * 2 + idx[2]}));
  }
}

TEST_CASE("reshape is a view when strides allow and copies only when it must", "[tensor][view]") {
  Generator gen(2);
  Tensor x = random3(gen);
  Tensor r = x.reshape({3, 8});
  CHECK(same_storage(r, x));
  CHECK(values(r) == values(x));

  // Transposed: no view exists, so reshape copies, in the transposed tensor's logical order.
  Tensor xt = x.transpose(0, 2);  // [4, 3, 2]
  Tensor flat = xt.reshape({-1});
  CHECK_FALSE(same_storage(flat, x));
  CHECK(flat.is_contiguous());
  CHECK(values(flat) == values(xt));

  // Every other row: rows are not adjacent any more, a copy again.
  Tensor rows = x.reshape({6, 4}).slice(0, 0, std::nullopt, 2);
  Tensor rows_flat = rows.reshape({12});
  CHECK_FALSE(same_storage(rows_flat, x));
  CHECK(values(rows_flat) == values(rows));
  // Splitting one dim of that sliced tensor is still a view.
  Tensor rows_split = rows.reshape({3, 2, 2});
  CHECK(same_storage(rows_split, x));
  CHECK(values(rows_split) == values(rows));

  // An expanded tensor flattens by copying the repeated values.
  Tensor e = tensor(std::vector<double>{1, 2, 3}).expand({2, 3});
  Tensor ef = e.reshape({6});
  CHECK_FALSE(same_storage(ef, e));
  CHECK(matches_exactly(ef, {6}, {1, 2, 3, 1, 2, 3}));
}

TEST_CASE("permute, transpose and t reorder sizes and strides over the same storage", "[tensor][view]") {
  Generator gen(3);
  Tensor x = random3(gen);  // strides [12, 4, 1]
  Tensor p = x.permute({2, 0, 1});
  CHECK(p.sizes() == Shape{4, 2, 3});
  CHECK(p.strides() == Strides{1, 12, 4});
  CHECK(same_storage(p, x));
  CHECK_FALSE(p.is_contiguous());
  for (int64_t i = 0; i < p.numel(); ++i) {
    auto idx = unravel(i, p.sizes());
    CHECK(read(p, idx) == read(x, {idx[1], idx[2], idx[0]}));
  }
  CHECK(x.permute({-1, -3, -2}).strides() == p.strides());

  Tensor tr = x.transpose(0, -1);
  CHECK(tr.sizes() == Shape{4, 3, 2});
  CHECK(tr.strides() == Strides{1, 4, 12});
  for (int64_t i = 0; i < tr.numel(); ++i) {
    auto idx = unravel(i, tr.sizes());
    CHECK(read(tr, idx) == read(x, {idx[2], idx[1], idx[0]}));
  }
  CHECK(x.transpose(1, 1).strides() == x.strides());

  Tensor m = randn({2, 5}, {.dtype = kFloat64}, &gen);
  Tensor mt = m.t();
  CHECK(mt.sizes() == Shape{5, 2});
  CHECK(read(mt, {3, 1}) == read(m, {1, 3}));
  CHECK(same_storage(mt, m));
  CHECK(mt.t().is_contiguous());
  Tensor v = randn({4}, {}, &gen);
  CHECK(v.t().sizes() == Shape{4});  // 1-D: unchanged
  CHECK(same_storage(v.t(), v));
}

TEST_CASE("narrow, slice with a step and select address the right elements", "[tensor][view]") {
  Generator gen(4);
  Tensor x = randn({5, 6}, {.dtype = kFloat64}, &gen);

  Tensor n = x.narrow(1, 2, 3);
  CHECK(n.sizes() == Shape{5, 3});
  CHECK(n.storage_offset() == 2);
  CHECK(same_storage(n, x));
  for (int64_t i = 0; i < 5; ++i)
    for (int64_t j = 0; j < 3; ++j) CHECK(read(n, {i, j}) == read(x, {i, j + 2}));
  CHECK(x.narrow(0, -2, 2).storage_offset() == 18);  // negative start counts from the end

  Tensor rows = x.slice(0, 1, std::nullopt, 2);  // rows 1 and 3
  CHECK(rows.sizes() == Shape{2, 6});
  CHECK(rows.strides() == Strides{12, 1});
  CHECK(rows.storage_offset() == 6);
  for (int64_t j = 0; j < 6; ++j) {
    CHECK(read(rows, {0, j}) == read(x, {1, j}));
    CHECK(read(rows, {1, j}) == read(x, {3, j}));
  }
  Tensor cols = x.slice(1, -4, -1, 2);  // columns 2 and 4
  CHECK(cols.sizes() == Shape{5, 2});
  CHECK(cols.strides() == Strides{6, 2});
  for (int64_t i = 0; i < 5; ++i) {
    CHECK(read(cols, {i, 0}) == read(x, {i, 2}));
    CHECK(read(cols, {i, 1}) == read(x, {i, 4}));
  }
  CHECK(x.slice(1, 0, 100, 4).sizes() == Shape{5, 2});  // end clamps to the size: columns 0, 4
  CHECK(x.slice(1, 4, 2).numel() == 0);                 // empty when end <= start

  Tensor last_col = x.select(1, -1);
  CHECK(last_col.sizes() == Shape{5});
  CHECK(last_col.strides() == Strides{6});
  for (int64_t i = 0; i < 5; ++i) CHECK(read(last_col, {i}) == read(x, {i, 5}));
  Tensor y = random3(gen);
  Tensor mid = y.select(1, 1);
  CHECK(mid.sizes() == Shape{2, 4});
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t k = 0; k < 4; ++k) CHECK(read(mid, {i, k}) == read(y, {i, 1, k}));
  CHECK(x[2].sizes() == Shape{6});
  CHECK(x[2][3].dim() == 0);
  CHECK(x[2][3].item<double>() == read(x, {2, 3}));
}

TEST_CASE("squeeze and unsqueeze add and remove size-1 dims only", "[tensor][view]") {
  Generator gen(5);
  Tensor x = randn({1, 3, 1, 2}, {}, &gen);
  CHECK(x.squeeze().sizes() == Shape{3, 2});
  CHECK(x.squeeze(2).sizes() == Shape{1, 3, 2});
  CHECK(x.squeeze(-4).sizes() == Shape{3, 1, 2});
  CHECK(x.squeeze(1).sizes() == x.sizes());  // size 3: unchanged
  CHECK(same_storage(x.squeeze(), x));
  CHECK(values(x.squeeze()) == values(x));

  Tensor m = randn({3, 2}, {}, &gen);
  CHECK(m.unsqueeze(0).sizes() == Shape{1, 3, 2});
  CHECK(m.unsqueeze(1).sizes() == Shape{3, 1, 2});
  CHECK(m.unsqueeze(2).sizes() == Shape{3, 2, 1});
  CHECK(m.unsqueeze(-1).sizes() == Shape{3, 2, 1});
  CHECK(m.unsqueeze(-3).sizes() == Shape{1, 3, 2});
  CHECK(m.unsqueeze(1).is_contiguous());
  CHECK(values(m.unsqueeze(1)) == values(m));
  CHECK(same_storage(m.unsqueeze(0), m));
  Tensor s = scalar_tensor(2.0);
  CHECK(s.unsqueeze(0).sizes() == Shape{1});
  CHECK(s.squeeze().dim() == 0);
}

TEST_CASE("expand broadcasts size-1 dims with stride 0 and keeps -1 dims", "[tensor][view]") {
  Generator gen(6);
  Tensor col = randn({3, 1}, {.dtype = kFloat64}, &gen);
  Tensor e = col.expand({2, 3, 4});
  CHECK(e.sizes() == Shape{2, 3, 4});
  CHECK(e.strides() == Strides{0, 1, 0});
  CHECK(same_storage(e, col));
  CHECK_FALSE(e.is_contiguous());
  for (int64_t i = 0; i < e.numel(); ++i) {
    auto idx = unravel(i, e.sizes());
    CHECK(read(e, idx) == read(col, {idx[1], 0}));
  }
  CHECK(col.expand({-1, 5}).sizes() == Shape{3, 5});
  Tensor other = zeros({7, 3, 2});
  CHECK(col.expand_as(other).sizes() == Shape{7, 3, 2});
  CHECK(scalar_tensor(1.5).expand({2, 2}).strides() == Strides{0, 0});
}

TEST_CASE("flatten merges a range of dims, as a view when it can", "[tensor][view]") {
  Generator gen(7);
  Tensor x = random3(gen);
  CHECK(x.flatten().sizes() == Shape{24});
  CHECK(x.flatten(1).sizes() == Shape{2, 12});
  CHECK(x.flatten(0, 1).sizes() == Shape{6, 4});
  CHECK(x.flatten(-2, -1).sizes() == Shape{2, 12});
  CHECK(x.flatten(1, 1).sizes() == x.sizes());
  CHECK(same_storage(x.flatten(), x));
  Tensor xt = x.transpose(0, 1);
  Tensor f = xt.flatten();
  CHECK_FALSE(same_storage(f, x));
  CHECK(values(f) == values(xt));
  CHECK(scalar_tensor(3.0).flatten().sizes() == Shape{1});
}

TEST_CASE("as_strided builds overlapping windows over the storage", "[tensor][view]") {
  Tensor x = arange(0, 10, 1, TensorOptions{.dtype = kFloat32});
  Tensor w = x.as_strided({4, 3}, {2, 1}, 1);  // windows of 3 starting at 1, 3, 5, 7
  CHECK(same_storage(w, x));
  CHECK(matches_exactly(w, {4, 3}, {1, 2, 3, 3, 4, 5, 5, 6, 7, 7, 8, 9}));
  // The offset defaults to the input's own: as_strided on a narrowed view starts where it starts.
  Tensor tail = x.narrow(0, 6, 4);
  CHECK(matches_exactly(tail.as_strided({2, 2}, {1, 1}), {2, 2}, {6, 7, 7, 8}));
  CHECK(matches_exactly(x.as_strided({3}, {0}, 4), {3}, {4, 4, 4}));
}

TEST_CASE("contiguous copies only non-contiguous tensors; is_contiguous reports the layout", "[tensor][view]") {
  Generator gen(8);
  Tensor x = random3(gen);
  CHECK(x.is_contiguous());
  Tensor same = x.contiguous();
  CHECK(same_storage(same, x));
  CHECK(same.raw_data_ptr() == x.raw_data_ptr());

  const std::vector<std::pair<const char*, Tensor>> layouts = {
      {"transposed", x.transpose(1, 2)},
      {"sliced with step", x.slice(2, 0, std::nullopt, 2)},
      {"narrowed columns", x.narrow(2, 1, 2)},
      {"expanded", x.select(0, 0).unsqueeze(0).expand({3, 3, 4})},
  };
  for (const auto& [name, v] : layouts) {
    INFO(name);
    CHECK_FALSE(v.is_contiguous());
    Tensor c = v.contiguous();
    CHECK(c.is_contiguous());
    CHECK_FALSE(same_storage(c, x));
    CHECK(c.strides() == contiguous_strides(v.sizes()));
    CHECK(values(c) == values(v));
  }
  // Contiguous views: a narrowed leading dim, a selected row, size-1 dims with any stride.
  CHECK(x.narrow(0, 1, 1).is_contiguous());
  CHECK(x.select(0, 1).is_contiguous());
  CHECK(x.narrow(1, 1, 1).squeeze(1).is_contiguous() == false);  // [2, 4] rows 12 apart
  CHECK(x.select(1, 0).select(1, 0).is_contiguous() == false);   // stride 12
  CHECK(x.narrow(0, 0, 1).narrow(1, 0, 1).is_contiguous());      // [1, 1, 4]
  CHECK(x.as_strided({2, 1, 4}, {4, 99, 1}).is_contiguous());    // size-1 dim: stride is free
}

TEST_CASE("writes through a chain of views land in the base and bump its version", "[tensor][view]") {
  Tensor x = zeros({3, 4});
  const uint32_t before = x.version();
  Tensor piece = x.t().select(0, 2).narrow(0, 1, 2);  // x[1][2], x[2][2]
  piece.fill_(5.0);
  CHECK(matches_exactly(x, {3, 4}, {0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 5, 0}));
  CHECK(x.version() == before + 1);
  CHECK(piece.version() == x.version());  // one counter per storage
  x.view({12}).slice(0, 0, std::nullopt, 5).fill_(1.0);  // elements 0, 5, 10
  CHECK(matches_exactly(x, {3, 4}, {1, 0, 0, 0, 0, 1, 5, 0, 0, 0, 1, 0}));
  CHECK(count_of(x.sizes()) == 12);
}

}  // namespace chorus
