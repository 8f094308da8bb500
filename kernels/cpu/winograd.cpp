// chorus's own Winograd F(2x2, 3x3) convolutions (AVX2), for the CPUs where oneDNN 2.6 has no
// Winograd kernels: [Own Winograd convolutions] below. onednn_conv.cpp routes to them; the
// functions are declared there and in winograd_test.cpp ([No header], gemm.cpp).
//
// [Own Winograd convolutions] A 3x3, stride-1, padding-1 convolution computes each 2x2 block of
// outputs ("tile") from the 4x4 block of inputs around it as Y = A^T [(G g G^T) . (B^T d B)] A
// (Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks", 2016): 16 multiplications
// per tile and channel pair where the direct sum takes 36, i.e. 2.25x fewer. Summed over input
// channels, the 16 element-wise products become 16 independent matrix products
//   M[xi][o][t] = sum_i U[xi][o][i] V[xi][i][t]      (xi: one of the 16 transform positions)
// with U the transformed weights and V the transformed input tiles. The work runs over blocks of
// whole tile rows (a few hundred tiles, so that V and M stay in the core's L2): transform the
// block's input tiles, 16 products (dnnl_sgemm, on one thread), transform back into the output.
// The data gradient is the same computation on grad_out with the weights transposed and rotated by
// 180 degrees (a stride-1, padding-1 3x3 convolution's data gradient is one). The weight gradient
// is the algorithm's transpose: dW = G^T [sum over tiles (A dY A^T) . (B^T d B)] G, i.e. 16
// products that sum over the tiles, M[xi][o][i] = sum_t Yhat[xi][o][t] V[xi][i][t].
//
// Why: on an AVX2 CPU oneDNN runs its direct kernels, which already run near the core's peak, and
// libtorch runs the same ones: the small ResNet's step spent ~100 of its ~115 ms in them on both
// sides (ONEDNN_VERBOSE, AVX2 imposed on Zen 5), so no other change could take it to 0.8x libtorch.
// Forward + both gradients, AVX2 imposed on Zen 5, 1 thread, batch 32, Winograd / direct (conv_bench
// --winograd, docs/data/winograd_avx2_2026-11-30.txt): 32 channels at 32x32 0.68, 64 at 16x16 0.73,
// 128 at 8x8 0.63. The price is precision, far less than F(4x4, 3x3)'s (oneDNN's AVX-512
// Winograd): the transforms use only 1, -1 and 1/2, and every element stays within the direct
// sum's worst-case rounding bound (winograd_test: at most 0.21 of it). An Inf or NaN in an input
// tile spreads to the tile's four outputs (as in every Winograd implementation).
//
// Every result is the same bits at any thread count: the tile blocks do not depend on it, each
// product runs on one thread, and the weight gradient sums its blocks in kParts fixed groups, added
// in order (the sim device runs kernels on its own threads, and its results must match the CPU's).
#include <dnnl.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>

#include "kernels/cpu/parallel.h"

namespace chorus::kernels::cpu::winograd {

namespace {

// The even and the odd elements of the 16 floats a, b: {a0, a2, ..., b6} and {a1, a3, ..., b7}.
inline __m256 even(__m256 a, __m256 b) {
  return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xD8));
}
inline __m256 odd(__m256 a, __m256 b) {
  return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD)), 0xD8));
}

// One convolution's tiles: th x tw per image (2x2 outputs each), processed in groups of 8 along a
// tile row (a row of tw = 12 or 20 tiles ends with half a group: its other lanes are computed and
// dropped; tw = 4 pairs rows instead, [Paired rows]), in blocks of whole tile rows (an even number
// where rows are paired). `in` and `out` are the channel counts of the pass (for the
// data gradient: grad_out's and grad_x's). A transformed block is [16][channels][ld] floats; ld
// leaves room past the block's tiles for the last half group's lanes and rounds up to 8.
struct Geometry {
  int64_t n, in, out, h, w, th, tw, groups;
  int64_t rows_per_block, ld;
  int64_t row_floats;  // a padded input row: column -1 at index 0, zeros past the last column
};

Geometry geometry(int64_t n, int64_t in, int64_t out, int64_t h, int64_t w) {
  Geometry g{n, in, out, h, w, h / 2, w / 2, (w / 2 + 7) / 8, 0, 0, 0};
  // About 16K floats of a block per channel count: 512 tiles at 32 channels, 128 at 128
  // (forward and weight gradient alike; 4K and 8K were 2-10% slower at 32-256 channels).
  const int64_t target_tiles = std::clamp<int64_t>(16384 / std::max(in, out), 16, 1024);
  g.rows_per_block = std::max<int64_t>(1, target_tiles / g.tw);
  if (g.tw == 4) g.rows_per_block = std::max<int64_t>(2, g.rows_per_block / 2 * 2);  // [Paired rows]
  g.ld = (g.rows_per_block * g.tw + 8 + 7) / 8 * 8;
  g.row_floats = 16 * g.groups + 8;
  return g;
}

int64_t total_rows(const Geometry& g) { return g.n * g.th; }
int64_t block_count(const Geometry& g) { return (total_rows(g) + g.rows_per_block - 1) / g.rows_per_block; }

// A thread's scratch, kept between calls (a sim stream's worker and the main thread each have their
// own; allocating them on each call cost page faults on every call). 0-2: a block's transforms and
// row buffer; 3: the calling thread's transformed weights or weight-gradient sums. Not zeroed:
// every float a product or a transform reads was written first, except the lanes of a last half
// group, which are computed and dropped.
enum Scratch { kTiles, kProducts, kRows, kCaller };
float* scratch(Scratch which, size_t floats) {
  struct Buffer {
    std::unique_ptr<float[]> p;
    size_t n = 0;
  };
  thread_local Buffer buffers[4];
  Buffer& b = buffers[which];
  if (b.n < floats) {
    b.p = std::make_unique_for_overwrite<float[]>(floats);
    b.n = floats;
  }
  return b.p.get();
}

// oneDNN's sgemm on the calling thread only, whatever the thread's OpenMP setting (inside
// parallel_for's team it is sequential anyway; run inline, it would use the caller's thread count,
// and a product split over threads may add in another order).
class OneThread {
 public:
  OneThread() : before_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~OneThread() { omp_set_num_threads(before_); }
  OneThread(const OneThread&) = delete;
  OneThread& operator=(const OneThread&) = delete;

 private:
  int before_;
};

void sgemm(char ta, char tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
           float beta, float* c, int64_t ldc) {
  // The sizes come from tensors chorus already holds; oneDNN fails only on invalid arguments.
  (void)dnnl_sgemm(ta, tb, m, n, k, 1.f, a, lda, b, ldb, beta, c, ldc);
}

// Lanes: a group of 8 tiles is either 8 consecutive tiles of one tile row, or, where a tile row
// has 4 tiles (width 8: ResNet-18's 128-channel stage at 64x64 inputs), the 4 of a tile row and the
// 4 of the next ([Paired rows]: a half group would compute 4 lanes for nothing). Both are 8
// consecutive tiles of the block, so a group's transformed values are one 8-float store.
bool paired(const Geometry& g) { return g.tw == 4; }

// The rows of a block's transform loop: r0, r0 + 2, ... where rows are paired.
int64_t row_step(const Geometry& g) { return paired(g) ? 2 : 1; }

// c_j (j = 0..3), column 2l - 1 + j of input row `in_row` for the 4 tiles l of a width-8 row
// ([Paired rows]; zeros for a row of the padding): the odd and the even columns, each also shifted
// by one lane for the padding columns -1 and 8.
void input_columns4(const float* plane, int64_t h, int64_t in_row, __m128 c[4]) {
  if (in_row < 0 || in_row >= h) {
    for (int j = 0; j < 4; ++j) c[j] = _mm_setzero_ps();
    return;
  }
  const __m128 a = _mm_loadu_ps(plane + in_row * 8), b = _mm_loadu_ps(plane + in_row * 8 + 4);
  const __m128 even_cols = _mm_shuffle_ps(a, b, 0x88), odd_cols = _mm_shuffle_ps(a, b, 0xDD);  // 0 2 4 6, 1 3 5 7
  c[0] = _mm_castsi128_ps(_mm_slli_si128(_mm_castps_si128(odd_cols), 4));                     // -1 1 3 5
  c[1] = even_cols;
  c[2] = odd_cols;
  c[3] = _mm_castsi128_ps(_mm_srli_si128(_mm_castps_si128(even_cols), 4));  // 2 4 6 8
}

// w floats (a multiple of 8) of src into dst, or zeros where src is null: inline vector copies (a
// memcpy call per row of 32 floats took 10% of a 32-channel 32x32 convolution's time).
inline void copy_row(float* dst, const float* src, int64_t w) {
  for (int64_t j = 0; j < w; j += 8) _mm256_storeu_ps(dst + j, src != nullptr ? _mm256_loadu_ps(src + j) : _mm256_setzero_ps());
}

// (B^T d B) of the group from d B's rows (d[i][j] = row i's column combination j), stored at `out`.
inline void store_input_tiles(const __m256 d[4][4], float* out, int64_t xi_stride) {
  for (int j = 0; j < 4; ++j) {
    _mm256_storeu_ps(out + (0 * 4 + j) * xi_stride, _mm256_sub_ps(d[0][j], d[2][j]));
    _mm256_storeu_ps(out + (1 * 4 + j) * xi_stride, _mm256_add_ps(d[1][j], d[2][j]));
    _mm256_storeu_ps(out + (2 * 4 + j) * xi_stride, _mm256_sub_ps(d[2][j], d[1][j]));
    _mm256_storeu_ps(out + (3 * 4 + j) * xi_stride, _mm256_sub_ps(d[1][j], d[3][j]));
  }
}

// d B for one input row from its four column vectors.
inline void row_times_b(__m256 c0, __m256 c1, __m256 c2, __m256 c3, __m256 d[4]) {
  d[0] = _mm256_sub_ps(c0, c2);
  d[1] = _mm256_add_ps(c1, c2);
  d[2] = _mm256_sub_ps(c2, c1);
  d[3] = _mm256_sub_ps(c1, c3);
}

// V[xi][c][t] = (B^T d B)[xi] for the tiles of tile rows [r0, r1) of x (g.in channels),
//   B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1].
// A tile row's four input rows are copied into a zero-padded row buffer first, so that every group
// of 8 tiles loads its 18 columns (two overlapping pairs of 8) without bounds checks.
void input_transform(const Geometry& g, const float* x, int64_t channels, int64_t r0, int64_t r1, float* v,
                     float* rows) {
  const int64_t xi_stride = channels * g.ld;
  std::memset(rows, 0, 4 * g.row_floats * sizeof(float));
  for (int64_t c = 0; c < channels; ++c) {
    for (int64_t r = r0; r < r1; r += row_step(g)) {
      const int64_t image = r / g.th, tile_row = r % g.th;
      const float* plane = x + (image * channels + c) * g.h * g.w;
      __m256 d[4][4];  // d B, row by row; lanes: 8 tiles
      if (paired(g)) {  // [Paired rows]: lanes 0-3 tile row r, 4-7 tile row r + 1 (zeros past r1)
        const bool second = r + 1 < r1;
        const int64_t image2 = (r + 1) / g.th, tile_row2 = (r + 1) % g.th;
        const float* plane2 = x + (image2 * channels + c) * g.h * g.w;
        for (int i = 0; i < 4; ++i) {
          __m128 lo[4], hi[4];
          input_columns4(plane, g.h, 2 * tile_row - 1 + i, lo);
          input_columns4(plane2, second ? g.h : 0, 2 * tile_row2 - 1 + i, hi);
          row_times_b(_mm256_set_m128(hi[0], lo[0]), _mm256_set_m128(hi[1], lo[1]), _mm256_set_m128(hi[2], lo[2]),
                      _mm256_set_m128(hi[3], lo[3]), d[i]);
        }
        store_input_tiles(d, v + c * g.ld + (r - r0) * g.tw, xi_stride);
        continue;
      }
      for (int i = 0; i < 4; ++i) {
        const int64_t in_row = 2 * tile_row - 1 + i;
        float* dst = rows + i * g.row_floats + 1;
        if (in_row < 0 || in_row >= g.h) copy_row(dst, nullptr, g.w);
        else copy_row(dst, plane + in_row * g.w, g.w);
      }
      for (int64_t group = 0; group < g.groups; ++group) {
        for (int i = 0; i < 4; ++i) {
          const float* p = rows + i * g.row_floats + 16 * group;
          const __m256 a = _mm256_loadu_ps(p), b = _mm256_loadu_ps(p + 8);
          const __m256 a2 = _mm256_loadu_ps(p + 2), b2 = _mm256_loadu_ps(p + 10);
          row_times_b(even(a, b), odd(a, b), even(a2, b2), odd(a2, b2), d[i]);
        }
        store_input_tiles(d, v + c * g.ld + (r - r0) * g.tw + 8 * group, xi_stride);
      }
    }
  }
}

// y (g.out channels) for tile rows [r0, r1) from M[xi][o][t]: Y = A^T M A plus the bias,
//   A^T = [1 1 1 0; 0 1 -1 -1].
void output_transform(const Geometry& g, const float* m, const float* bias, int64_t r0, int64_t r1, float* y) {
  const int64_t xi_stride = g.out * g.ld;
  for (int64_t o = 0; o < g.out; ++o) {
    const __m256 b = _mm256_set1_ps(bias != nullptr ? bias[o] : 0.f);
    for (int64_t r = r0; r < r1; r += row_step(g)) {
      const int64_t image = r / g.th, tile_row = r % g.th;
      float* plane = y + (image * g.out + o) * g.h * g.w;
      for (int64_t group = 0; group < g.groups; ++group) {
        const float* in = m + o * g.ld + (r - r0) * g.tw + 8 * group;
        __m256 s[2][4];  // A^T M
        for (int j = 0; j < 4; ++j) {
          const __m256 m0 = _mm256_loadu_ps(in + (0 * 4 + j) * xi_stride);
          const __m256 m1 = _mm256_loadu_ps(in + (1 * 4 + j) * xi_stride);
          const __m256 m2 = _mm256_loadu_ps(in + (2 * 4 + j) * xi_stride);
          const __m256 m3 = _mm256_loadu_ps(in + (3 * 4 + j) * xi_stride);
          s[0][j] = _mm256_add_ps(_mm256_add_ps(m0, m1), m2);
          s[1][j] = _mm256_sub_ps(_mm256_sub_ps(m1, m2), m3);
        }
        for (int i = 0; i < 2; ++i) {
          const __m256 y0 = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(s[i][0], s[i][1]), s[i][2]), b);
          const __m256 y1 = _mm256_add_ps(_mm256_sub_ps(_mm256_sub_ps(s[i][1], s[i][2]), s[i][3]), b);
          // Interleaved: tile l's two columns side by side, lanes 0-3 then 4-7.
          const __m256 lo = _mm256_unpacklo_ps(y0, y1), hi = _mm256_unpackhi_ps(y0, y1);
          const __m256 first = _mm256_permute2f128_ps(lo, hi, 0x20), second = _mm256_permute2f128_ps(lo, hi, 0x31);
          _mm256_storeu_ps(plane + (2 * tile_row + i) * g.w + 16 * group, first);
          if (paired(g)) {  // lanes 4-7: tile row r + 1
            if (r + 1 < r1) {
              const int64_t image2 = (r + 1) / g.th, tile_row2 = (r + 1) % g.th;
              _mm256_storeu_ps(y + ((image2 * g.out + o) * g.h + 2 * tile_row2 + i) * g.w, second);
            }
          } else if (16 * group + 16 <= g.w) {
            _mm256_storeu_ps(plane + (2 * tile_row + i) * g.w + 16 * group + 8, second);
          }
        }
      }
    }
  }
}

// dY A^T for one row of a group's output tiles from its even and odd columns.
inline void row_times_at(__m256 e0, __m256 e1, __m256 z[4]) {
  z[0] = e0;
  z[1] = _mm256_add_ps(e0, e1);
  z[2] = _mm256_sub_ps(e0, e1);
  z[3] = _mm256_sub_ps(_mm256_setzero_ps(), e1);
}

// Yhat[xi][o][t] = (A dY A^T)[xi] for the tiles of tile rows [r0, r1) of dy (g.out channels),
//   A = [1 0; 1 1; 1 -1; 0 -1].
void grad_transform(const Geometry& g, const float* dy, int64_t r0, int64_t r1, float* yhat, float* rows) {
  const int64_t xi_stride = g.out * g.ld;
  std::memset(rows, 0, 2 * g.row_floats * sizeof(float));
  for (int64_t o = 0; o < g.out; ++o) {
    for (int64_t r = r0; r < r1; r += row_step(g)) {
      const int64_t image = r / g.th, tile_row = r % g.th;
      const float* plane = dy + (image * g.out + o) * g.h * g.w;
      __m256 z[2][4];  // dY A^T, row by row
      auto store = [&](float* out) {
        for (int j = 0; j < 4; ++j) {
          _mm256_storeu_ps(out + (0 * 4 + j) * xi_stride, z[0][j]);
          _mm256_storeu_ps(out + (1 * 4 + j) * xi_stride, _mm256_add_ps(z[0][j], z[1][j]));
          _mm256_storeu_ps(out + (2 * 4 + j) * xi_stride, _mm256_sub_ps(z[0][j], z[1][j]));
          _mm256_storeu_ps(out + (3 * 4 + j) * xi_stride, _mm256_sub_ps(_mm256_setzero_ps(), z[1][j]));
        }
      };
      if (paired(g)) {  // [Paired rows]
        const bool second = r + 1 < r1;
        const int64_t image2 = (r + 1) / g.th, tile_row2 = (r + 1) % g.th;
        for (int i = 0; i < 2; ++i) {
          const float* lo = plane + (2 * tile_row + i) * 8;
          const __m128 a = _mm_loadu_ps(lo), b = _mm_loadu_ps(lo + 4);
          __m128 a2 = _mm_setzero_ps(), b2 = _mm_setzero_ps();
          if (second) {
            const float* hi = dy + ((image2 * g.out + o) * g.h + 2 * tile_row2 + i) * 8;
            a2 = _mm_loadu_ps(hi);
            b2 = _mm_loadu_ps(hi + 4);
          }
          row_times_at(_mm256_set_m128(_mm_shuffle_ps(a2, b2, 0x88), _mm_shuffle_ps(a, b, 0x88)),
                       _mm256_set_m128(_mm_shuffle_ps(a2, b2, 0xDD), _mm_shuffle_ps(a, b, 0xDD)), z[i]);
        }
        store(yhat + o * g.ld + (r - r0) * g.tw);
        continue;
      }
      for (int i = 0; i < 2; ++i) {
        copy_row(rows + i * g.row_floats, plane + (2 * tile_row + i) * g.w, g.w);
      }
      for (int64_t group = 0; group < g.groups; ++group) {
        for (int i = 0; i < 2; ++i) {
          const float* p = rows + i * g.row_floats + 16 * group;
          const __m256 a = _mm256_loadu_ps(p), b = _mm256_loadu_ps(p + 8);
          row_times_at(even(a, b), odd(a, b), z[i]);
        }
        store(yhat + o * g.ld + (r - r0) * g.tw + 8 * group);
      }
    }
  }
}

// U[xi][o][i] = (G f G^T)[xi], G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1], with f = weight[o][i]
// (forward: o < k, i < c), or weight[i][o] rotated by 180 degrees (data gradient: o < c, i < k).
void weight_transform(const float* weight, int64_t in, int64_t out, bool rotated, float* u) {
  // Eight input channels at a time (in is a multiple of 16): f[a][b] of channels i..i+7 gathered
  // (stride 9 floats, or out * 9 rotated), G f G^T in vector arithmetic, 16 contiguous stores.
  const int32_t stride = static_cast<int32_t>(rotated ? out * 9 : 9);
  const __m256i lanes = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(stride));
  const __m256 half = _mm256_set1_ps(0.5f);
  parallel_for(0, out, std::max<int64_t>(1, 1024 / in), [&](int64_t lo, int64_t hi) {
    for (int64_t o = lo; o < hi; ++o) {
      for (int64_t i = 0; i < in; i += 8) {
        __m256 f[3][3];
        for (int a = 0; a < 3; ++a) {
          for (int b = 0; b < 3; ++b) {
            const float* at = rotated ? weight + ((i * out + o) * 3 + (2 - a)) * 3 + (2 - b)
                                      : weight + ((o * in + i) * 3 + a) * 3 + b;
            f[a][b] = _mm256_i32gather_ps(at, lanes, 4);
          }
        }
        __m256 t[4][3];  // G f
        for (int b = 0; b < 3; ++b) {
          t[0][b] = f[0][b];
          t[1][b] = (f[0][b] + f[1][b] + f[2][b]) * half;
          t[2][b] = (f[0][b] - f[1][b] + f[2][b]) * half;
          t[3][b] = f[2][b];
        }
        for (int a = 0; a < 4; ++a) {
          const __m256 row[4] = {t[a][0], (t[a][0] + t[a][1] + t[a][2]) * half, (t[a][0] - t[a][1] + t[a][2]) * half,
                                 t[a][2]};
          for (int b = 0; b < 4; ++b) _mm256_storeu_ps(u + ((a * 4 + b) * out + o) * in + i, row[b]);
        }
      }
    }
  });
}

// The forward pass of x (in channels) with transformed weights u into y (out channels).
void convolve(const float* x, const float* u, const float* bias, float* y, int64_t n, int64_t in, int64_t out,
              int64_t h, int64_t w) {
  const Geometry g = geometry(n, in, out, h, w);
  parallel_for(0, block_count(g), 1, [&](int64_t lo, int64_t hi) {
    const OneThread one;
    float* v = scratch(kTiles, 16 * in * g.ld);
    float* m = scratch(kProducts, 16 * out * g.ld);
    float* rows = scratch(kRows, 4 * g.row_floats);
    for (int64_t block = lo; block < hi; ++block) {
      const int64_t r0 = block * g.rows_per_block, r1 = std::min(total_rows(g), r0 + g.rows_per_block);
      const int64_t tiles = (r1 - r0) * g.tw;
      input_transform(g, x, in, r0, r1, v, rows);
      for (int xi = 0; xi < 16; ++xi) {
        sgemm('N', 'N', out, tiles, in, u + xi * out * in, in, v + xi * in * g.ld, g.ld, 0.f, m + xi * out * g.ld, g.ld);
      }
      output_transform(g, m, bias, r0, r1, y);
    }
  });
}

// The weight gradient's tile blocks are summed in this many groups, each in block order, then the
// groups in order: the same bits at any thread count.
constexpr int64_t kParts = 2;

}  // namespace

bool supports(int64_t c, int64_t k, int64_t h, int64_t w) {
  return c > 0 && k > 0 && c % 16 == 0 && k % 16 == 0 && h >= 2 && h % 2 == 0 && w >= 8 && w % 8 == 0;
}

void forward(const float* x, const float* weight, const float* bias, float* y, int64_t n, int64_t c, int64_t k,
             int64_t h, int64_t w) {
  float* u = scratch(kCaller, static_cast<size_t>(16 * k * c));
  weight_transform(weight, c, k, /*rotated=*/false, u);
  convolve(x, u, bias, y, n, c, k, h, w);
}

void data_grad(const float* dy, const float* weight, float* dx, int64_t n, int64_t c, int64_t k, int64_t h,
               int64_t w) {
  float* u = scratch(kCaller, static_cast<size_t>(16 * c * k));
  weight_transform(weight, k, c, /*rotated=*/true, u);
  convolve(dy, u, nullptr, dx, n, k, c, h, w);
}

void weight_grad(const float* x, const float* dy, float* dw, int64_t n, int64_t c, int64_t k, int64_t h, int64_t w) {
  const Geometry g = geometry(n, c, k, h, w);
  const int64_t blocks = block_count(g), parts = std::min(kParts, blocks), slab = 16 * k * c;
  float* sums = scratch(kCaller, static_cast<size_t>(parts * slab));  // M[part][xi][o][i]
  std::memset(sums, 0, static_cast<size_t>(parts * slab) * sizeof(float));
  parallel_for(0, parts, 1, [&](int64_t lo, int64_t hi) {
    const OneThread one;
    float* v = scratch(kTiles, 16 * c * g.ld);
    float* yhat = scratch(kProducts, 16 * k * g.ld);
    float* rows = scratch(kRows, 4 * g.row_floats);
    for (int64_t part = lo; part < hi; ++part) {
      float* m = sums + part * slab;
      for (int64_t block = blocks * part / parts; block < blocks * (part + 1) / parts; ++block) {
        const int64_t r0 = block * g.rows_per_block, r1 = std::min(total_rows(g), r0 + g.rows_per_block);
        const int64_t tiles = (r1 - r0) * g.tw;
        input_transform(g, x, c, r0, r1, v, rows);
        grad_transform(g, dy, r0, r1, yhat, rows);
        for (int xi = 0; xi < 16; ++xi) {
          sgemm('N', 'T', k, c, tiles, yhat + xi * k * g.ld, g.ld, v + xi * c * g.ld, g.ld, 1.f, m + xi * k * c, c);
        }
      }
    }
  });
  for (int64_t part = 1; part < parts; ++part) {
    const float* from = sums + part * slab;
    for (int64_t j = 0; j < slab; ++j) sums[j] += from[j];
  }
  // dW = G^T M G, G^T = [1 1/2 1/2 0; 0 1/2 -1/2 0; 0 1/2 1/2 1].
  parallel_for(0, k, std::max<int64_t>(1, 1024 / c), [&](int64_t lo, int64_t hi) {
  for (int64_t o = lo; o < hi; ++o) {
    for (int64_t i = 0; i < c; ++i) {
      float m[4][4];
      for (int p = 0; p < 4; ++p)
        for (int q = 0; q < 4; ++q) m[p][q] = sums[((p * 4 + q) * k + o) * c + i];
      float t[3][4];  // G^T M
      for (int q = 0; q < 4; ++q) {
        t[0][q] = m[0][q] + 0.5f * (m[1][q] + m[2][q]);
        t[1][q] = 0.5f * (m[1][q] - m[2][q]);
        t[2][q] = 0.5f * (m[1][q] + m[2][q]) + m[3][q];
      }
      for (int a = 0; a < 3; ++a) {
        float* out = dw + ((o * c + i) * 3 + a) * 3;
        out[0] = t[a][0] + 0.5f * (t[a][1] + t[a][2]);
        out[1] = 0.5f * (t[a][1] - t[a][2]);
        out[2] = 0.5f * (t[a][1] + t[a][2]) + t[a][3];
      }
    }
  }
  });
}

}  // namespace chorus::kernels::cpu::winograd
