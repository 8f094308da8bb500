// kernels/shared/launch_plan: plans executed on the CPU. An emulated grid-stride kernel walks each
// elementwise plan's index math (IndexCalculator, sub-launches, vector loads with an alignment
// check) to compute a + b, compared bit for bit with chorus's add on random strided, broadcast,
// transposed and misaligned inputs, with splits forced by a small index limit and counted so
// every element is written exactly once; the split of a > 2^31-element shape is checked by its
// arithmetic alone. Reduction plans are walked to sum, compared exactly with chorus's sum.
#include "kernels/shared/launch_plan.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "tensor/error.h"
#include "tensor/ops.h"

namespace {

using namespace chorus;
namespace sm = chorus::kernels::shared;

sm::OperandLayout layout_of(const Tensor& t) {
  return sm::OperandLayout{t.sizes(), t.strides(), static_cast<int64_t>(t.element_size()),
                           reinterpret_cast<uint64_t>(t.raw_data_ptr())};
}

int64_t count(const Shape& s) {
  int64_t n = 1;
  for (int64_t v : s) n *= v;
  return n;
}

// A view of `shape` over random float32 values in one of several layouts: contiguous, permuted,
// sliced out of a larger tensor, or starting one element past an aligned address.
Tensor random_view(const Shape& shape, std::mt19937& rng, int kind) {
  Generator g(rng());
  const size_t nd = shape.size();
  switch (kind) {
    case 0:
      return randn(shape, {}, &g);
    case 1: {  // permuted: the base has the dims in a random order
      std::vector<int64_t> perm(nd);
      for (size_t i = 0; i < nd; ++i) perm[i] = static_cast<int64_t>(i);
      std::shuffle(perm.begin(), perm.end(), rng);
      Shape base_shape(nd);
      for (size_t i = 0; i < nd; ++i) base_shape[i] = shape[perm[i]];
      std::vector<int64_t> inverse(nd);
      for (size_t i = 0; i < nd; ++i) inverse[perm[i]] = static_cast<int64_t>(i);
      return randn(base_shape, {}, &g).permute(inverse);
    }
    case 2: {  // sliced: every dim taken from a larger one at an offset
      Shape big = shape;
      for (int64_t& s : big) s += 2;
      Tensor t = randn(big, {}, &g);
      for (size_t d = 0; d < nd; ++d) t = t.narrow(static_cast<int64_t>(d), 1, shape[d]);
      return t;
    }
    default: {  // contiguous but one element past the allocation's aligned start
      Tensor flat = randn({count(shape) + 1}, {}, &g);
      return flat.narrow(0, 1, count(shape)).view(shape);
    }
  }
}

// Runs out = a + b through `plan` as a grid-stride CUDA kernel would: per sub-launch, blocks of
// 128 threads over tiles, offsets from the IndexCalculator in 32-bit arithmetic, or vector loads
// of vector_elements when the sub-launch has them (checking each load's alignment). `writes`
// counts how often each output element is written.
void run_add_plan(const sm::ElementwisePlan& plan, const Tensor& out, const Tensor& a, const Tensor& b,
                  std::vector<int>& writes) {
  char* base[3] = {static_cast<char*>(out.raw_data_ptr()), static_cast<char*>(a.raw_data_ptr()),
                   static_cast<char*>(b.raw_data_ptr())};
  const auto out_index = [&](const char* p) { return (p - base[0]) / 4; };  // out is contiguous
  for (const sm::SubLaunch& launch : plan.launches) {
    const sm::IndexCalculator<3> calc = sm::index_calculator<3>(plan, launch);
    const int vec = launch.vector_elements;
    const int64_t units = (launch.numel + vec - 1) / vec;  // a thread's work item: one element or vector
    const sm::GridConfig grid = sm::elementwise_grid(units, 128, 4, 2);
    REQUIRE(grid.blocks >= 1);
    for (int64_t block = 0; block < grid.blocks; ++block) {
      for (int64_t tile = block; tile * grid.tile_elements() < units; tile += grid.blocks) {
        for (int j = 0; j < grid.elements_per_thread; ++j) {
          for (int t = 0; t < grid.threads_per_block; ++t) {
            const uint32_t unit = static_cast<uint32_t>(tile * grid.tile_elements() + j * grid.threads_per_block + t);
            if (unit >= units) continue;
            for (int lane = 0; lane < vec; ++lane) {
              const uint32_t i = unit * static_cast<uint32_t>(vec) + static_cast<uint32_t>(lane);
              if (i >= launch.numel) break;
              uint32_t off[3];
              if (vec > 1) {  // contiguous: element i is i * 4 bytes in, the load starts at lane 0
                for (int k = 0; k < 3; ++k) {
                  off[k] = i * 4u;
                  const uint64_t load = reinterpret_cast<uint64_t>(base[k]) + launch.base_offset_bytes[k] +
                                        static_cast<uint64_t>(unit) * vec * 4u;
                  if (lane == 0 && static_cast<int64_t>(i) + vec <= launch.numel && load % (vec * 4u) != 0) {
                    FAIL("misaligned vector load of operand " << k);
                  }
                }
              } else {
                calc.offsets(i, off);
              }
              char* p[3];
              for (int k = 0; k < 3; ++k) p[k] = base[k] + launch.base_offset_bytes[k] + off[k];
              *reinterpret_cast<float*>(p[0]) = *reinterpret_cast<const float*>(p[1]) + *reinterpret_cast<const float*>(p[2]);
              ++writes[static_cast<size_t>(out_index(p[0]))];
            }
          }
        }
      }
    }
  }
}

// Checks the plan's limits and executes it against chorus's add; returns the plan.
sm::ElementwisePlan check_add(const Tensor& a, const Tensor& b, int64_t max_index = 2147483647) {
  const Shape shape = add(a, b).sizes();
  Tensor out = full(shape, NAN);
  const sm::ElementwisePlan plan =
      sm::plan_elementwise(shape, {layout_of(out), layout_of(a), layout_of(b)}, {.max_index = max_index});
  int64_t total = 0;
  for (const sm::SubLaunch& s : plan.launches) {
    total += s.numel;
    CHECK(s.numel <= max_index);
    for (const auto& st : plan.stride_bytes) {
      int64_t reach = 0;
      for (size_t d = 0; d < s.sizes.size(); ++d) reach += (s.sizes[d] - 1) * st[d];
      CHECK(reach <= max_index);
    }
  }
  CHECK(total == count(shape));
  std::vector<int> writes(static_cast<size_t>(count(shape)), 0);
  run_add_plan(plan, out, a, b, writes);
  CHECK(std::all_of(writes.begin(), writes.end(), [](int w) { return w == 1; }));
  const Tensor expected = add(a, b);
  CHECK(std::memcmp(out.raw_data_ptr(), expected.contiguous().raw_data_ptr(), out.nbytes()) == 0);
  return plan;
}

TEST_CASE("elementwise plans of common layouts: collapsed dims, contiguity, vector width", "[shared][launch]") {
  std::mt19937 rng(1);
  SECTION("contiguous operands collapse to one dim and load 16 bytes at a time") {
    const sm::ElementwisePlan p = check_add(random_view({6, 7, 9}, rng, 0), random_view({6, 7, 9}, rng, 0));
    CHECK(p.shape == Shape{378});
    CHECK(p.contiguous);
    REQUIRE(p.launches.size() == 1);
    CHECK(p.launches[0].vector_elements == 4);
  }
  SECTION("an operand one float past an aligned address loads one element at a time") {
    const sm::ElementwisePlan p = check_add(random_view({6, 7, 9}, rng, 0), random_view({6, 7, 9}, rng, 3));
    CHECK(p.contiguous);
    CHECK(p.launches[0].vector_elements == 1);
  }
  SECTION("two floats past alignment still allow 8-byte loads") {
    Tensor flat = randn({380});
    const sm::ElementwisePlan p = check_add(randn({378}), flat.narrow(0, 2, 378));
    CHECK(p.launches[0].vector_elements == 2);
  }
  SECTION("a transposed operand keeps two dims") {
    const sm::ElementwisePlan p = check_add(randn({12, 10}).t(), randn({10, 12}));
    CHECK(p.shape == Shape{10, 12});
    CHECK_FALSE(p.contiguous);
    CHECK(p.stride_bytes[1] == std::vector<int64_t>{4, 40});
    // Linear index order is the output's memory order (innermost dim fastest), so consecutive
    // threads write consecutive addresses.
    const sm::IndexCalculator<3> calc = sm::index_calculator<3>(p, p.launches[0]);
    uint32_t off[3];
    calc.offsets(1, off);
    CHECK((off[0] == 4 && off[1] == 40 && off[2] == 4));
    calc.offsets(12 * 3 + 5, off);  // element (3, 5)
    CHECK((off[0] == 4 * (12 * 3 + 5) && off[1] == 4 * 3 + 40 * 5));
  }
  SECTION("a broadcast row gets stride 0 on the broadcast dim") {
    const sm::ElementwisePlan p = check_add(randn({5, 3, 8}), randn({8}));
    CHECK(p.shape == Shape{15, 8});
    CHECK(p.stride_bytes[2] == std::vector<int64_t>{0, 4});
    CHECK_FALSE(p.contiguous);
  }
  SECTION("a broadcast scalar and a 0-d output") {
    check_add(randn({7, 5}), full({}, 2.5));
    const sm::ElementwisePlan p = check_add(full({}, 1.5), full({}, 2.5));
    CHECK(p.shape == Shape{1});
    CHECK(p.launches.size() == 1);
  }
  SECTION("an empty output has no launch") {
    const sm::ElementwisePlan p = sm::plan_elementwise({4, 0}, {layout_of(empty({4, 0}))});
    CHECK(p.numel == 0);
    CHECK(p.launches.empty());
  }
}

TEST_CASE("a channels-last output is walked in its memory order", "[shared][launch][channels_last]") {
  // out, a: [N, C, H, W] with NHWC memory; b: a per-channel bias [1, C, 1, 1]. The plan follows the
  // output's memory order (C innermost), so out and a collapse into one dense run and the bias is
  // a two-dim broadcast; in logical order they would be four strided dims.
  const Shape shape{3, 5, 4, 6};
  Tensor a = randn(shape).contiguous(MemoryFormat::ChannelsLast), b = randn({1, 5, 1, 1});
  Tensor out = full(shape, NAN, {.memory_format = MemoryFormat::ChannelsLast});
  const sm::ElementwisePlan p = sm::plan_elementwise(shape, {layout_of(out), layout_of(a), layout_of(b)});
  CHECK(p.shape == Shape{72, 5});
  CHECK(p.stride_bytes[0] == std::vector<int64_t>{20, 4});
  CHECK(p.stride_bytes[1] == std::vector<int64_t>{20, 4});
  CHECK(p.stride_bytes[2] == std::vector<int64_t>{0, 4});
  std::vector<int> writes(static_cast<size_t>(count(shape)), 0);
  run_add_plan(p, out, a, b, writes);
  CHECK(std::all_of(writes.begin(), writes.end(), [](int w) { return w == 1; }));
  CHECK(equal(out, add(a, b)));
  // Without the bias everything is one contiguous run, loaded 16 bytes at a time.
  const sm::ElementwisePlan q = sm::plan_elementwise(shape, {layout_of(out), layout_of(a), layout_of(a)});
  CHECK(q.shape == Shape{360});
  CHECK(q.contiguous);
}

TEST_CASE("elementwise plans of random strided and broadcast inputs compute a + b", "[shared][launch]") {
  std::mt19937 rng(2);
  for (int iter = 0; iter < 300; ++iter) {
    const size_t nd = 1 + rng() % 4;
    Shape shape(nd);
    for (int64_t& s : shape) s = 1 + static_cast<int64_t>(rng() % 6);
    // b: some dims set to 1 (broadcast) and maybe fewer leading dims, sometimes expanded (stride 0).
    Shape bshape = shape;
    for (int64_t& s : bshape) if (rng() % 3 == 0) s = 1;
    const size_t drop = rng() % (nd + 1);
    bshape.erase(bshape.begin(), bshape.begin() + static_cast<int64_t>(drop));
    Tensor a = random_view(shape, rng, static_cast<int>(rng() % 4));
    Tensor b = random_view(bshape.empty() ? Shape{} : bshape, rng, bshape.empty() ? 0 : static_cast<int>(rng() % 4));
    if (rng() % 2) std::swap(a, b);  // the broadcast operand on either side
    const int64_t limit = rng() % 3 == 0 ? 64 + static_cast<int64_t>(rng() % 200) : 2147483647;
    INFO("iteration " << iter << " shape " << shape_str(shape) << " limit " << limit);
    check_add(a, b, limit);
    // An expanded operand (stride 0 with a size above 1) plans like a broadcast one.
    if (iter % 10 == 0) check_add(a, b.expand(add(a, b).sizes()), limit);
  }
}

TEST_CASE("a small index limit splits a contiguous tensor into aligned, in-range pieces", "[shared][launch]") {
  // Halving 30002 floats would start the second piece at element 15001 (4 bytes past a 16-byte
  // boundary); cuts are rounded to 4096 elements, so every piece keeps 16-byte loads.
  const Tensor a = randn({30002}), b = randn({30002});
  const sm::ElementwisePlan p = check_add(a, b, 4096 * 4 * 3);
  CHECK(p.launches.size() > 2);
  for (const sm::SubLaunch& s : p.launches) CHECK(s.vector_elements == 4);
}

// Splits of shapes too large to allocate: checked by arithmetic (boxes tile the space, no launch
// exceeds 32-bit indexing, base offsets match the box starts).
void check_split_arithmetic(const Shape& shape, const std::vector<sm::OperandLayout>& ops) {
  const sm::ElementwisePlan p = sm::plan_elementwise(shape, ops);
  const int64_t int_max = 2147483647;
  REQUIRE(p.numel == count(shape));
  REQUIRE(p.numel > int_max);
  REQUIRE(p.launches.size() > 1);
  int64_t total = 0;
  for (size_t x = 0; x < p.launches.size(); ++x) {
    const sm::SubLaunch& s = p.launches[x];
    total += s.numel;
    CHECK(s.numel == count(s.sizes));
    CHECK(s.numel <= int_max);
    for (size_t k = 0; k < ops.size(); ++k) {
      int64_t reach = 0, base = 0;
      for (size_t d = 0; d < s.sizes.size(); ++d) {
        reach += (s.sizes[d] - 1) * p.stride_bytes[k][d];
        base += s.start[d] * p.stride_bytes[k][d];
        CHECK((s.start[d] >= 0 && s.start[d] + s.sizes[d] <= p.shape[d]));
      }
      CHECK(reach <= int_max);
      CHECK(s.base_offset_bytes[k] == base);
    }
    for (size_t y = 0; y < x; ++y) {  // pairwise disjoint boxes
      bool overlap = true;
      for (size_t d = 0; d < s.sizes.size(); ++d) {
        const sm::SubLaunch& o = p.launches[y];
        overlap = overlap && s.start[d] < o.start[d] + o.sizes[d] && o.start[d] < s.start[d] + s.sizes[d];
      }
      CHECK_FALSE(overlap);
    }
  }
  CHECK(total == p.numel);  // disjoint boxes inside the space with the full count: a tiling
}

TEST_CASE("shapes above 2^31 elements split into launches within 32-bit indexing", "[shared][launch]") {
  const int64_t n = int64_t{3} << 30;
  const sm::OperandLayout dense{{n}, {1}, 4, 0};
  check_split_arithmetic({n}, {dense, dense, dense});
  // Bytes, not elements, decide: 2^30 doubles fit int32 as a count but not as byte offsets.
  const sm::OperandLayout d64{{int64_t{1} << 30}, {1}, 8, 0};
  const sm::ElementwisePlan p = sm::plan_elementwise({int64_t{1} << 30}, {d64, d64});
  CHECK(p.launches.size() >= 4);
  // Broadcast row over a transposed output: several dims, some operands stride 0.
  const int64_t rows = 70000, cols = 40000;
  check_split_arithmetic({rows, cols}, {sm::OperandLayout{{rows, cols}, {1, rows}, 4, 0},
                                        sm::OperandLayout{{rows, cols}, {cols, 1}, 2, 0},
                                        sm::OperandLayout{{cols}, {1}, 4, 0}});
}

TEST_CASE("elementwise_grid covers the work with a bounded number of blocks", "[shared][launch]") {
  const sm::GridConfig small = sm::elementwise_grid(5000, 256, 132, 4);
  CHECK(small.blocks == 5);  // ceil(5000 / 1024)
  const sm::GridConfig big = sm::elementwise_grid(int64_t{1} << 30, 256, 132, 4);
  CHECK(big.blocks == 132 * 8);
  CHECK(sm::elementwise_grid(0, 256, 132, 4).blocks == 0);
  CHECK(sm::elementwise_grid(1, 128, 1, 1).blocks == 1);
  CHECK_THROWS_AS(sm::elementwise_grid(10, 0, 132, 4), Error);
}

TEST_CASE("elementwise plans reject shapes that do not broadcast", "[shared][launch]") {
  CHECK_THROWS_AS(sm::plan_elementwise({4, 5}, {sm::OperandLayout{{4, 5}, {5, 1}}, sm::OperandLayout{{3}, {1}}}),
                  Error);
  CHECK_THROWS_AS(sm::plan_elementwise({4}, {sm::OperandLayout{{4}, {-1}}}), Error);
  CHECK_THROWS_AS(sm::index_calculator<2>(sm::plan_elementwise({4}, {sm::OperandLayout{{4}, {1}}}),
                                          sm::SubLaunch{}),
                  Error);
}

// ------------------------------------------------------------------ reductions
// Sums `t` over `dims` by walking the plan (after the copy it may ask for).
std::vector<double> run_sum_plan(const Tensor& t, const std::vector<int64_t>& dims, sm::ReductionPlan& plan) {
  plan = sm::plan_reduction(t.sizes(), t.strides(), dims);
  const Tensor src = plan.needs_copy ? t.permute(plan.permutation).contiguous() : t;
  const double* x = src.data_ptr<double>();
  std::vector<double> out(static_cast<size_t>(plan.outer * plan.inner), 0.0);
  for (int64_t o = 0; o < plan.outer; ++o)
    for (int64_t i = 0; i < plan.inner; ++i)
      for (int64_t r = 0; r < plan.reduced; ++r)
        out[static_cast<size_t>(o * plan.inner + i)] += x[o * plan.outer_stride + r * plan.reduced_stride + i * plan.inner_stride];
  return out;
}

// Small integers in float64: every summation order gives the exact same sum.
Tensor integer_values(const Shape& shape, uint64_t seed) {
  Generator g(seed);
  return randint(-50, 50, shape, TensorOptions{.dtype = kFloat64}, &g);
}

void check_sum(const Tensor& t, const std::vector<int64_t>& dims, sm::ReductionPlan& plan) {
  const std::vector<double> got = run_sum_plan(t, dims, plan);
  const Tensor expected = sum(t, dims).contiguous();
  REQUIRE(static_cast<int64_t>(got.size()) == expected.numel());
  CHECK(std::memcmp(got.data(), expected.data_ptr<double>(), got.size() * sizeof(double)) == 0);
}

TEST_CASE("reduction plans of common layouts need no copy", "[shared][launch]") {
  const Tensor x = integer_values({4, 5, 6}, 1);
  sm::ReductionPlan p;
  check_sum(x, {2}, p);  // rows
  CHECK_FALSE(p.needs_copy);
  CHECK((p.outer == 20 && p.outer_stride == 6 && p.reduced == 6 && p.reduced_stride == 1 && p.inner == 1));
  check_sum(x, {0}, p);  // columns: a bias gradient
  CHECK_FALSE(p.needs_copy);
  CHECK((p.outer == 1 && p.reduced == 4 && p.reduced_stride == 30 && p.inner == 30 && p.inner_stride == 1));
  check_sum(x, {1}, p);  // the middle dim: outer, reduced and inner
  CHECK_FALSE(p.needs_copy);
  CHECK((p.outer == 4 && p.outer_stride == 30 && p.reduced == 5 && p.reduced_stride == 6 && p.inner == 6 &&
         p.inner_stride == 1));
  check_sum(x, {0, 1, 2}, p);
  CHECK((p.outer == 1 && p.reduced == 120 && p.inner == 1 && !p.needs_copy));
  check_sum(integer_values({6, 8}, 7).t(), {1}, p);  // a transposed view reduced along its strided dim
  CHECK((p.outer == 8 && p.outer_stride == 1 && p.reduced == 6 && p.reduced_stride == 8 && !p.needs_copy));
  // Reduced dims apart in logical order but adjacent in memory: kept dims first, no copy.
  const Tensor v = integer_values({5, 4, 6}, 2).permute({1, 0, 2});  // [4, 5, 6], strides (6, 24, 1)
  check_sum(v, {0, 2}, p);
  CHECK_FALSE(p.needs_copy);
  CHECK((p.outer == 5 && p.reduced == 24 && p.reduced_stride == 1 && p.inner == 1));
  // An expanded input reduced along its stride-0 dim.
  check_sum(integer_values({1, 7}, 3).expand({9, 7}), {0}, p);
  CHECK((p.reduced == 9 && p.reduced_stride == 0 && !p.needs_copy));
}

TEST_CASE("reduction plans ask for a copy when no three-dim view exists", "[shared][launch]") {
  sm::ReductionPlan p;
  check_sum(integer_values({4, 5, 6}, 4), {0, 2}, p);  // a kept dim between two reduced ones
  CHECK(p.needs_copy);
  CHECK(p.permutation == std::vector<int64_t>{1, 0, 2});
  CHECK((p.outer == 5 && p.reduced == 24 && p.outer_stride == 24 && p.reduced_stride == 1));
  check_sum(integer_values({6, 5}, 5).narrow(1, 0, 4).t(), {0, 1}, p);  // sliced: no single stride
  CHECK(p.needs_copy);
}

TEST_CASE("reduction plans of random layouts sum like chorus's sum", "[shared][launch]") {
  std::mt19937 rng(6);
  int copies = 0, in_place = 0;
  for (int iter = 0; iter < 400; ++iter) {
    const size_t nd = 1 + rng() % 4;
    Shape shape(nd);
    for (int64_t& s : shape) s = 1 + static_cast<int64_t>(rng() % 5);
    Tensor t = integer_values(shape, rng());
    const int kind = static_cast<int>(rng() % 3);
    if (kind == 1) {  // permuted view
      std::vector<int64_t> perm(nd);
      for (size_t i = 0; i < nd; ++i) perm[i] = static_cast<int64_t>(i);
      std::shuffle(perm.begin(), perm.end(), rng);
      t = t.permute(perm);
    } else if (kind == 2) {  // sliced view
      const int64_t d = static_cast<int64_t>(rng() % nd);
      if (t.size(d) > 1) t = t.narrow(d, 1, t.size(d) - 1);
    }
    std::vector<int64_t> dims;
    for (size_t d = 0; d < nd; ++d) if (rng() % 2) dims.push_back(static_cast<int64_t>(d));
    if (dims.empty()) dims.push_back(static_cast<int64_t>(rng() % nd));
    INFO("iteration " << iter << " sizes " << shape_str(t.sizes()) << " strides " << shape_str(t.strides()));
    sm::ReductionPlan p;
    check_sum(t, dims, p);
    (p.needs_copy ? copies : in_place) += 1;
  }
  CHECK(copies > 10);     // both branches were exercised
  CHECK(in_place > 200);
}

TEST_CASE("reduction plans with empty inputs or outputs read nothing", "[shared][launch]") {
  const sm::ReductionPlan p = sm::plan_reduction({3, 0, 4}, {0, 4, 1}, {1});
  CHECK((p.outer == 12 && p.reduced == 0 && !p.needs_copy));
  const sm::ReductionPlan q = sm::plan_reduction({0, 5}, {5, 1}, {1});
  CHECK((q.outer * q.inner == 0 && !q.needs_copy));
  CHECK_THROWS_AS(sm::plan_reduction({3, 4}, {4, 1}, {1, 0}), Error);  // not sorted
  CHECK_THROWS_AS(sm::plan_reduction({3, 4}, {4, 1}, {2}), Error);
}

}  // namespace
