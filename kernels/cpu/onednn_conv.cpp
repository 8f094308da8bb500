// oneDNN convolutions: see onednn_conv.h.
#include "kernels/cpu/onednn_conv.h"

#include <dnnl.hpp>
#include <algorithm>
#include <omp.h>
#include <sys/mman.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu/capability.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/parallel.h"
#include "tensor/error.h"
#include "tensor/storage.h"

namespace chorus {
// tensor/storage.cpp ([Aligned huge mapping]); no header, as tensor/sim/sim.cpp.
void* map_huge_aligned(size_t bytes, int prot);
}  // namespace chorus

namespace chorus::kernels::cpu::winograd {
// chorus's own F(2x2, 3x3) Winograd convolutions (winograd.cpp; [No header], gemm.cpp): NCHW float32,
// 3x3, stride 1, padding 1, ungrouped; x [n, c, h, w], weight [k, c, 3, 3], y [n, k, h, w].
bool supports(int64_t c, int64_t k, int64_t h, int64_t w);
void forward(const float* x, const float* weight, const float* bias, float* y, int64_t n, int64_t c, int64_t k,
             int64_t h, int64_t w);
void data_grad(const float* dy, const float* weight, float* dx, int64_t n, int64_t c, int64_t k, int64_t h,
               int64_t w);
void weight_grad(const float* x, const float* dy, float* dw, int64_t n, int64_t c, int64_t k, int64_t h, int64_t w);
}  // namespace chorus::kernels::cpu::winograd

namespace chorus::kernels::cpu::onednn {

// CHORUS_CPU_CAPABILITY caps the instruction set oneDNN may use (before its first call).
void configure() {
  static const bool done = [] {
    const std::string want = requested_capability();  // validated there
    if (want.empty()) return true;
    dnnl_cpu_isa_t isa;
    if (want == "avx512") isa = dnnl_cpu_isa_avx512_core_amx;  // every AVX-512 kernel (incl. bf16, VNNI)
    else if (want == "avx2") isa = dnnl_cpu_isa_avx2;
    else isa = dnnl_cpu_isa_sse41;  // "default"
    if (dnnl_set_max_cpu_isa(isa) != dnnl_success) {
      fail("CHORUS_CPU_CAPABILITY='{}': oneDNN was already in use; set it before the program starts", want);
    }
    return true;
  }();
  (void)done;
}

// [oneDNN's cap at load] oneDNN accepts a cap only before its first use anywhere in the process,
// and chorus is not always its first user: libtorch 1.13 (tests/bench's peers) calls the same
// libdnnl, so a benchmark whose libtorch rows ran before chorus's first product failed there with
// "oneDNN was already in use" (transformer_ops_bench under CHORUS_CPU_CAPABILITY=avx2). So the cap
// is applied when this library is loaded, before any program code runs. An invalid value is not
// thrown here (that would end the program before main); configure() throws it at the first call.
namespace {
[[maybe_unused]] const bool kCappedAtLoad = [] {
  try {
    configure();
  } catch (const Error&) {
  }
  return true;
}();
}  // namespace

std::string capability() {
  configure();
  switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "other";
  }
}

namespace {

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

dnnl::engine& engine() {
  configure();
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

std::atomic<bool>& enabled_flag() {
  static std::atomic<bool> on = [] {
    const char* v = std::getenv("CHORUS_ONEDNN");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return on;
}

std::atomic<bool>& winograd_flag() {
  static std::atomic<bool> on = [] {
    const char* v = std::getenv("CHORUS_ONEDNN_WINOGRAD");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return on;
}


// One convolution shape, and the thread count: oneDNN decomposes a primitive's work for the number
// of threads there were when it was made, so a primitive made at 1 thread would run on 1 thread
// after set_num_threads(2).
struct Key {
  int64_t n, c, h, w, oc, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, groups;
  bool bias;
  bool nhwc;  // channels-last input, output and weight (else NCHW and OIHW)
  int threads;
  bool winograd;  // Winograd allowed (set_winograd) when the primitives were made
  auto tie() const {
    return std::tie(n, c, h, w, oc, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, groups, bias, nhwc, threads, winograd);
  }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

// chorus's thread count (set_num_threads) for oneDNN's OpenMP regions on the calling thread, whose
// omp_get_max_threads() is that count only on the thread set_num_threads ran on: a sim stream's
// worker thread had OpenMP's default (the core count), so a convolution on sim:0 ran oneDNN at 2
// threads where the same program on the CPU ran it at 1. The direct kernels give the same bits at
// any thread count; the Winograd ones ([Winograd convolutions]) do not (the MNIST example's
// 8-step loss: 2.2059240341 on the CPU at 1 thread, 2.2059242725 on sim:0 and on the CPU at 2).
int openmp_threads() {
  const int want = num_threads();
  if (omp_get_max_threads() != want) omp_set_num_threads(want);
  return want;
}

Key key_of(const Tensor& x, const Tensor& weight, bool bias, const Window2d& w, int64_t groups) {
  return {x.size(0),  x.size(1),  w.in_h,     w.in_w,     weight.size(0), w.out_h,      w.out_w,
          w.kernel_h, w.kernel_w, w.stride_h, w.stride_w, w.pad_h,        w.pad_w,      w.dilation_h,
          w.dilation_w, groups,   bias,       !(x.is_contiguous() && weight.is_contiguous()), openmp_threads(),
          winograd_flag().load(std::memory_order_relaxed)};
}

struct Shapes {
  memory::dims src, wei, bias, dst, strides, dilates, pad_l, pad_r;
  memory::desc user_src, user_wei, user_dst;
  bool nhwc = false;
  // convolution_direct, or convolution_winograd where [Winograd convolutions] takes the shape.
  dnnl::algorithm algorithm = dnnl::algorithm::convolution_direct;
};

Shapes shapes(const Key& k) {
  Shapes s;
  s.src = {k.n, k.c, k.h, k.w};
  s.dst = {k.n, k.oc, k.oh, k.ow};
  s.bias = {k.oc};
  const bool grouped = k.groups > 1;
  s.wei = grouped ? memory::dims{k.groups, k.oc / k.groups, k.c / k.groups, k.kh, k.kw}
                  : memory::dims{k.oc, k.c, k.kh, k.kw};
  s.strides = {k.sh, k.sw};
  s.dilates = {k.dh - 1, k.dw - 1};  // oneDNN counts the gaps: 0 is a dense kernel
  s.pad_l = {k.ph, k.pw};
  // The right/bottom padding that makes the output exactly oh x ow (PyTorch's floor semantics).
  s.pad_r = {(k.oh - 1) * k.sh + (k.kh - 1) * k.dh + 1 - k.h - k.ph, (k.ow - 1) * k.sw + (k.kw - 1) * k.dw + 1 - k.w - k.pw};
  const tag image = k.nhwc ? tag::nhwc : tag::nchw;
  s.user_src = memory::desc(s.src, dt::f32, image);
  s.user_wei = memory::desc(s.wei, dt::f32, k.nhwc ? (grouped ? tag::gohwi : tag::ohwi) : (grouped ? tag::goihw : tag::oihw));
  s.user_dst = memory::desc(s.dst, dt::f32, image);
  s.nhwc = k.nhwc;
  return s;
}

memory::desc any(const memory::dims& d) { return memory::desc(d, dt::f32, tag::any); }
// The source and destination of a primitive: channels-last ones pin oneDNN to its NHWC kernels (no
// reorder of the activations at all); NCHW ones let it pick its blocked layout.
memory::desc image(const Shapes& s, const memory::dims& d) {
  return s.nhwc ? memory::desc(d, dt::f32, tag::nhwc) : any(d);
}

// Primitives with a user-managed scratchpad: each execution gets its own (Scratchpad below). oneDNN's
// default keeps one per thread, sized when a primitive is made: a primitive made on one thread and run
// on another (a sim stream's worker runs cpu kernels) then wrote through a null scratchpad.
dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

// [Shared scratchpads] A primitive's scratchpad for one execution: a block taken from a process-wide
// pool and given back after the call, so that every convolution shares the largest one. Taken from
// chorus's host allocator, each size stayed in its cache of freed large blocks, which hands a block
// out again only for a request within a quarter of its size (tensor/storage.cpp): oneDNN's
// Winograd primitives ([Winograd convolutions]) want 7.2, 9.1, 11.0 and 15.5 MB at ResNet-18's
// batch 16 of 64x64 (1 thread), and all four sizes sat idle and resident there, so ResNet-18's
// training step peaked 30 MB higher with Winograd than without, above libtorch's peak (Zen 4: 390.6
// against 374.6 MB; docs/benchmarks.md, session 53). The pool holds one block per convolution
// running at once (one, outside sim streams; a call takes the smallest free block that fits, and a
// primitive whose scratchpad is empty, as most direct ones are, takes none), mapped by itself
// ([Aligned huge mapping], tensor/storage.cpp, which defines map_huge_aligned: no header) and grown
// by mapping a larger one; the smaller goes back to the kernel. oneDNN's own default
// (scratchpad_mode::library) also keeps one grown buffer, per thread; chorus cannot use it
// (user_scratchpad above). Not counted in cpu_memory_allocated, as oneDNN's own buffers are not.
class ScratchPool {
 public:
  struct Block {
    void* ptr = nullptr;
    size_t bytes = 0;
  };

  // A block of at least `bytes`: the smallest free one that is large enough, else a fresh mapping
  // that replaces the largest free one (unmapped: the pool grows toward the largest call).
  Block take(size_t bytes) {
    Block b;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto fitting = free_.end(), largest = free_.end();
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (it->bytes >= bytes && (fitting == free_.end() || it->bytes < fitting->bytes)) fitting = it;
        if (largest == free_.end() || it->bytes > largest->bytes) largest = it;
      }
      const auto pick = fitting != free_.end() ? fitting : largest;
      if (pick != free_.end()) {
        b = *pick;
        free_.erase(pick);
      }
    }
    if (b.ptr != nullptr && b.bytes >= bytes) return b;
    if (b.ptr != nullptr) ::munmap(b.ptr, b.bytes);
    // Whole 64 KiB granules (as the host allocator's large blocks), not whole 2 MiB pages.
    constexpr size_t kGranule = size_t{64} << 10;
    b.bytes = std::max<size_t>((bytes + kGranule - 1) / kGranule * kGranule, kGranule);
    b.ptr = map_huge_aligned(b.bytes, PROT_READ | PROT_WRITE);
    if (b.ptr == nullptr) fail("convolution: out of memory mapping a {}-byte oneDNN scratchpad", b.bytes);
    return b;
  }

  // Never throws (Scratchpad's destructor calls it): a block the list has no room for goes back to
  // the kernel instead.
  void give(Block b) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    try {
      free_.push_back(b);
    } catch (...) {
      ::munmap(b.ptr, b.bytes);
    }
  }

  // What free blocks hold (conv_scratch_test, through scratch_pool_free_bytes below).
  size_t free_bytes() {
    std::lock_guard<std::mutex> lock(mutex_);
    size_t total = 0;
    for (const Block& b : free_) total += b.bytes;
    return total;
  }
  size_t free_blocks() {
    std::lock_guard<std::mutex> lock(mutex_);
    return free_.size();
  }

 private:
  std::mutex mutex_;
  std::vector<Block> free_;
};

// Never destroyed: a convolution may run from another static's destructor.
ScratchPool& scratch_pool() {
  static ScratchPool* pool = new ScratchPool;
  return *pool;
}

// A primitive's scratchpad for one execution ([Shared scratchpads]): the caller waits for the
// primitive before this goes out of scope.
class Scratchpad {
 public:
  template <typename PrimitiveDesc>
  explicit Scratchpad(const PrimitiveDesc& pd) {
    const memory::desc d = pd.scratchpad_desc();
    if (d.get_size() == 0) return;  // this primitive needs none: no block held from others
    block_ = scratch_pool().take(d.get_size());
    try {
      mem_ = memory(d, engine(), block_.ptr);
    } catch (...) {
      scratch_pool().give(block_);
      throw;
    }
  }
  ~Scratchpad() {
    if (block_.ptr != nullptr) scratch_pool().give(block_);
  }
  Scratchpad(const Scratchpad&) = delete;
  Scratchpad& operator=(const Scratchpad&) = delete;
  // Adds it to a primitive's arguments.
  void add_to(std::unordered_map<int, memory>& args) const {
    if (block_.ptr != nullptr) args.emplace(DNNL_ARG_SCRATCHPAD, mem_);
  }

 private:
  ScratchPool::Block block_;
  memory mem_;
};

// The primitives of one shape, made at first use.
struct Entry {
  Shapes s;
  dnnl::convolution_forward::primitive_desc fwd_pd;
  dnnl::convolution_forward fwd;
  // Backward ones are made at the first backward of the shape.
  std::once_flag backward_once;
  dnnl::convolution_backward_data::primitive_desc bwd_data_pd;
  dnnl::convolution_backward_data bwd_data;
  dnnl::convolution_backward_weights::primitive_desc bwd_weights_pd, bwd_weights_nobias_pd;
  dnnl::convolution_backward_weights bwd_weights, bwd_weights_nobias;
  // [Small-image weight gradients]: chorus computes the weight gradient itself (weight_grad_by_gemm).
  bool own_weight_grad = false;
  // [Small-image convolutions]: chorus computes forward and both gradients itself; no primitives.
  bool by_gemm = false;
  // [Own Winograd convolutions]: chorus's F(2x2, 3x3) kernels (winograd.cpp) take forward and both
  // gradients; no primitives.
  bool own_winograd = false;
};

using ForwardPd = dnnl::convolution_forward::primitive_desc;
using DataPd = dnnl::convolution_backward_data::primitive_desc;
using WeightsPd = dnnl::convolution_backward_weights::primitive_desc;

// The three primitives' descriptors of a shape, with its algorithm (s.algorithm).
ForwardPd forward_pd(const Shapes& s, bool bias) {
  auto desc = bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, s.algorithm, image(s, s.src),
                                                     any(s.wei), memory::desc(s.bias, dt::f32, tag::x), image(s, s.dst),
                                                     s.strides, s.dilates, s.pad_l, s.pad_r)
                   : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, s.algorithm, image(s, s.src),
                                                     any(s.wei), image(s, s.dst), s.strides, s.dilates, s.pad_l, s.pad_r);
  return ForwardPd(desc, user_scratchpad(), engine());
}

DataPd data_pd(const Shapes& s, const ForwardPd& fwd) {
  return DataPd(dnnl::convolution_backward_data::desc(s.algorithm, image(s, s.src), any(s.wei), image(s, s.dst), s.strides,
                                                      s.dilates, s.pad_l, s.pad_r),
                user_scratchpad(), engine(), fwd);
}

WeightsPd weights_pd(const Shapes& s, bool bias, const ForwardPd& fwd) {
  auto desc = bias ? dnnl::convolution_backward_weights::desc(s.algorithm, image(s, s.src), any(s.wei),
                                                              memory::desc(s.bias, dt::f32, tag::x), image(s, s.dst),
                                                              s.strides, s.dilates, s.pad_l, s.pad_r)
                   : dnnl::convolution_backward_weights::desc(s.algorithm, image(s, s.src), any(s.wei), image(s, s.dst),
                                                              s.strides, s.dilates, s.pad_l, s.pad_r);
  return WeightsPd(desc, user_scratchpad(), engine(), fwd);
}

// [Winograd convolutions] A 3x3, stride-1, undilated, ungrouped NCHW convolution with channel
// counts that are multiples of 16 and at least 8x8 output positions per image runs oneDNN's
// Winograd F(4x4, 3x3) kernels ("jit_wino_4x3", AVX-512 only: elsewhere no such primitive can be
// made and the shape stays direct) for its forward, data gradient and weight gradient: 2.25x fewer
// multiplications than the direct kernels, which already run at the core's peak on these shapes.
// Measured (ONEDNN_VERBOSE, ResNet-18 at batch 16 of 64x64, 1 thread, Zen 5; docs/benchmarks.md):
// 64 channels at 16x16 1.49-1.55 -> 0.80-1.12 ms a call, 128 at 8x8 1.49-1.66 -> 0.82-1.35 ms; at 4x4
// and 2x2 (a tile of 6x6 holds 4x4 outputs) Winograd is slower, hence the 64 positions. The price
// is precision: a Winograd sum's round-off is 5-10x the direct one's (3x3, 64-256 channels: within
// 1.5e-5 of outputs of magnitude ~4, against 1.6e-6), as cuDNN's Winograd algorithms. Off with
// set_winograd(false) or CHORUS_ONEDNN_WINOGRAD=0.
bool winograd_shape(const Key& k) {
  return k.winograd && !k.nhwc && k.groups == 1 && k.kh == 3 && k.kw == 3 && k.sh == 1 && k.sw == 1 && k.dh == 1 &&
         k.dw == 1 && k.c % 16 == 0 && k.oc % 16 == 0 && k.oh * k.ow >= 64;
}

// [Own Winograd convolutions] (winograd.cpp) Where oneDNN has no Winograd kernels (AVX2 CPUs), a
// shape winograd_shape takes runs chorus's F(2x2, 3x3) kernels instead, forward and both gradients,
// if it also has padding 1 (the output as large as the input), an even height and a width that is
// a multiple of 8 (the kernels' groups of 8 tiles). Measured: docs/benchmarks.md (small ResNet and
// ResNet-18 with AVX2 imposed); the same switch turns it off (set_winograd(false)).
bool own_winograd_shape(const Key& k) {
  return k.ph == 1 && k.pw == 1 && k.oh == k.h && k.ow == k.w && winograd::supports(k.c, k.oc, k.h, k.w);
}

// [Small-image convolutions] An NCHW ungrouped convolution with at most 4 output positions per image
// (ResNet's last stage at 64x64 inputs: 2x2) is three whole-batch products over its input's columns
// (cols [N*P, C*kH*kW], P = OH*OW, as [Small-image weight gradients] lays them out):
//   forward         out[o, (n,p)]  = W[o, ckk] . cols^T             (then to [n, o, p], plus the bias)
//   data gradient   dcols[(n,p), ckk] = grad_out^T[(n,p), o] . W    (then added back, col2im)
//   weight gradient weight_grad_by_gemm
// where oneDNN ran its direct kernels: they skip the window's taps that fall on the padding (at 2x2
// with a 3x3 kernel and padding 1, 20 of 36), yet ran at 40-75 GFLOP/s of those it kept (512->512 at
// batch 16, Zen 5, 1 thread: forward 1.80, data gradient 1.94, weight gradient 3.35 ms a call) and
// reordered the 9.4 MB weight into two blocked layouts and the gradient back (about 1 ms each);
// dnnl_sgemm runs the three products, zeros included, at 160-195 GFLOP/s (1.54-1.89 ms), with the
// weight as it is. At 4x4 outputs (layer 3) the two were even, so 4 positions is the bound; the
// columns are at most 16M floats.
bool small_image_shape(const Key& k) {
  const int64_t positions = k.oh * k.ow;
  return !k.nhwc && k.groups == 1 && positions <= 4 && k.n * positions * k.c * k.kh * k.kw <= (int64_t{1} << 24);
}

std::shared_ptr<Entry> entry_for(const Key& k) {
  static std::mutex mutex;
  static std::map<Key, std::shared_ptr<Entry>> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(k);
  if (it != cache.end()) return it->second;
  auto e = std::make_shared<Entry>();
  e->s = shapes(k);
  if (small_image_shape(k)) {
    e->by_gemm = true;
    cache.emplace(k, e);
    return e;
  }
  if (winograd_shape(k)) {
    // Winograd only where oneDNN has all three of its primitives for the shape (this CPU, this
    // shape), so a shape's forward and backward use the same algorithm.
    e->s.algorithm = dnnl::algorithm::convolution_winograd;
    try {
      const ForwardPd fwd = forward_pd(e->s, k.bias);
      (void)data_pd(e->s, fwd);
      (void)weights_pd(e->s, true, fwd);
      (void)weights_pd(e->s, false, fwd);
    } catch (const dnnl::error&) {
      e->s.algorithm = dnnl::algorithm::convolution_direct;
      // No oneDNN Winograd here (an AVX2 CPU): chorus's own where its kernels take the shape.
      if (own_winograd_shape(k)) {
        e->own_winograd = true;
        cache.emplace(k, e);
        return e;
      }
    }
  }
  e->fwd_pd = forward_pd(e->s, k.bias);
  e->fwd = dnnl::convolution_forward(e->fwd_pd);
  cache.emplace(k, e);
  return e;
}

void make_backward(Entry& e) {
  std::call_once(e.backward_once, [&] {
    if (e.by_gemm || e.own_winograd) return;
    const Shapes& s = e.s;
    e.bwd_data_pd = data_pd(s, e.fwd_pd);
    e.bwd_data = dnnl::convolution_backward_data(e.bwd_data_pd);
    e.bwd_weights_pd = weights_pd(s, true, e.fwd_pd);
    e.bwd_weights = dnnl::convolution_backward_weights(e.bwd_weights_pd);
    e.bwd_weights_nobias_pd = weights_pd(s, false, e.fwd_pd);
    e.bwd_weights_nobias = dnnl::convolution_backward_weights(e.bwd_weights_nobias_pd);
  // [Small-image weight gradients] oneDNN 2.6 has no direct kernel for the weight gradient of a
    // convolution whose output is a few positions (ResNet's last stage: 2x2 at 64x64 inputs) and
    // falls back to its GEMM-based one ("x64:gemm:jit"), which multiplies image by image with k =
    // the image's positions (4) and adds each product into the whole weight gradient: 512->512 3x3 at
    // batch 16 took 13-41 ms a call in chorus and 10.8-35.4 ms in libtorch (7-23 GFLOP/s;
    // ONEDNN_VERBOSE, Zen 3, 1 thread: docs/data/conv_small_image_zen3_2026-11-29.txt). Here the
    // whole batch's columns are laid out once, [batch x positions, C kH kW], and the gradient is one
    // product with k = batch x positions (weight_grad_by_gemm). Only for NCHW,
    // ungrouped convolutions with at most 64 positions per image (where oneDNN's per-image products
    // are short) and a column buffer of at most 16M floats.
    const int64_t positions = s.dst[2] * s.dst[3], ckk = s.src[1] * s.wei[2] * s.wei[3];
    e.own_weight_grad = !s.nhwc && s.wei.size() == 4 && positions <= 64 &&
                        s.src[0] * positions * ckk <= (int64_t{1} << 24) &&
                        std::string(e.bwd_weights_nobias_pd.impl_info_str()).find("gemm") != std::string::npos;
  });
}

// The columns of x for a window: cols[n*P + p, (c*kH + i)*kW + j] = x[n, c, oh*sh - ph + i*dh,
// ow*sw - pw + j*dw] (0 outside), P = OH*OW, p = oh*OW + ow.
Tensor columns(const Tensor& x, const Window2d& w) {
  const int64_t c = x.size(1);
  const int64_t positions = w.out_h * w.out_w, plane = w.in_h * w.in_w, ckk = c * w.kernel_h * w.kernel_w;
  const int64_t rows = x.size(0) * positions;
  Tensor cols = make_tensor({rows, ckk}, kFloat32, kCPU);
  const float* px = x.data_ptr<float>();
  float* pc = cols.data_ptr<float>();
  parallel_for(0, rows, std::max<int64_t>(1, kGrainSize / std::max<int64_t>(ckk, 1)), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const int64_t img = r / positions, oh = r % positions / w.out_w, ow = r % w.out_w;
      float* dst = pc + r * ckk;
      for (int64_t ch = 0; ch < c; ++ch) {
        const float* src = px + (img * c + ch) * plane;
        for (int64_t i = 0; i < w.kernel_h; ++i) {
          const int64_t ih = oh * w.stride_h - w.pad_h + i * w.dilation_h;
          const bool row_in = ih >= 0 && ih < w.in_h;
          for (int64_t j = 0; j < w.kernel_w; ++j) {
            const int64_t iw = ow * w.stride_w - w.pad_w + j * w.dilation_w;
            *dst++ = row_in && iw >= 0 && iw < w.in_w ? src[ih * w.in_w + iw] : 0.f;
          }
        }
      }
    }
  });
  return cols;
}

// A [rows, cols] float32 matrix over a tensor's storage from its offset: row-major (the tensor's
// contiguous elements), or with transposed = true the transpose of the row-major [cols, rows] one.
Tensor matrix(const Tensor& t, int64_t rows, int64_t cols, bool transposed = false) {
  return Tensor(std::make_shared<TensorImpl>(t.storage(), t.storage_offset(), Shape{rows, cols},
                                             transposed ? Strides{1, rows} : Strides{cols, 1}, kFloat32));
}

// [Small-image convolutions]: the forward, out[n, o, p] = bias[o] + (W . cols^T)[o, n*P + p].
void conv2d_by_gemm(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias, const Window2d& w) {
  const int64_t n = x.size(0), oc = weight.size(0), positions = w.out_h * w.out_w;
  const int64_t ckk = x.size(1) * w.kernel_h * w.kernel_w, rows = n * positions;
  const Tensor cols = columns(x, w);
  Tensor product = make_tensor({oc, rows}, kFloat32, kCPU);
  gemm(product, matrix(weight, oc, ckk), matrix(cols, ckk, rows, /*transposed=*/true), 1.0, 0.0);
  const float* pp = product.data_ptr<float>();
  const float* pb = bias.defined() ? bias.data_ptr<float>() : nullptr;
  float* po = out.data_ptr<float>();
  for (int64_t img = 0; img < n; ++img)
    for (int64_t o = 0; o < oc; ++o) {
      const float b = pb ? pb[o] : 0.f;
      for (int64_t p = 0; p < positions; ++p) po[(img * oc + o) * positions + p] = pp[o * rows + img * positions + p] + b;
    }
}

// [Small-image convolutions]: the data gradient, dcols = grad_out^T . W ([N*P, O] x [O, C*kH*kW]),
// whose columns are added back to the input positions they were read from (col2im), image by image.
void data_grad_by_gemm(const Tensor& grad_x, const Tensor& go, const Tensor& weight, const Window2d& w) {
  const int64_t n = grad_x.size(0), c = grad_x.size(1), oc = weight.size(0), positions = w.out_h * w.out_w;
  const int64_t ckk = c * w.kernel_h * w.kernel_w, rows = n * positions, plane = w.in_h * w.in_w;
  Tensor got = make_tensor({rows, oc}, kFloat32, kCPU);  // grad_out^T: got[n*P + p, o] = go[n, o, p]
  const float* pgo = go.data_ptr<float>();
  float* pt = got.data_ptr<float>();
  for (int64_t img = 0; img < n; ++img)
    for (int64_t o = 0; o < oc; ++o)
      for (int64_t p = 0; p < positions; ++p) pt[(img * positions + p) * oc + o] = pgo[(img * oc + o) * positions + p];
  Tensor dcols = make_tensor({rows, ckk}, kFloat32, kCPU);
  gemm(dcols, got, matrix(weight, oc, ckk), 1.0, 0.0);
  const float* pd = dcols.data_ptr<float>();
  float* px = grad_x.data_ptr<float>();
  parallel_for(0, n, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t img = lo; img < hi; ++img) {
      float* dst = px + img * c * plane;
      std::fill(dst, dst + c * plane, 0.f);
      for (int64_t p = 0; p < positions; ++p) {
        const int64_t oh = p / w.out_w, ow = p % w.out_w;
        const float* src = pd + (img * positions + p) * ckk;
        for (int64_t ch = 0; ch < c; ++ch)
          for (int64_t i = 0; i < w.kernel_h; ++i) {
            const int64_t ih = oh * w.stride_h - w.pad_h + i * w.dilation_h;
            for (int64_t j = 0; j < w.kernel_w; ++j, ++src) {
              const int64_t iw = ow * w.stride_w - w.pad_w + j * w.dilation_w;
              if (ih >= 0 && ih < w.in_h && iw >= 0 && iw < w.in_w) dst[ch * plane + ih * w.in_w + iw] += *src;
            }
          }
      }
    }
  });
}

// [Small-image weight gradients]: grad_weight [O, C, kH, kW] (and grad_bias [O]) as one product
// G [O, N*P] x cols [N*P, C*kH*kW], where G[o, n*P + p] = grad_out[n, o, p] and cols = columns(x, w).
void weight_grad_by_gemm(const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& go, const Tensor& x,
                         const Window2d& w) {
  const int64_t n = x.size(0), c = x.size(1), oc = go.size(1);
  const int64_t positions = w.out_h * w.out_w, ckk = c * w.kernel_h * w.kernel_w;
  const int64_t rows = n * positions;
  const Tensor cols = columns(x, w);
  Tensor g = make_tensor({oc, rows}, kFloat32, kCPU);
  const float* pgo = go.data_ptr<float>();
  float* pg = g.data_ptr<float>();
  for (int64_t o = 0; o < oc; ++o)
    for (int64_t img = 0; img < n; ++img)
      std::memcpy(pg + o * rows + img * positions, pgo + (img * oc + o) * positions,
                  static_cast<size_t>(positions) * sizeof(float));
  gemm(matrix(grad_weight, oc, ckk), g, cols, 1.0, 0.0);
  if (grad_bias.defined()) {
    float* b = grad_bias.data_ptr<float>();
    for (int64_t o = 0; o < oc; ++o) {
      double sum = 0;
      for (int64_t r = 0; r < rows; ++r) sum += pg[o * rows + r];
      b[o] = static_cast<float>(sum);
    }
  }
}

// Memory in the layout a primitive wants: the user's buffer when the layouts agree, else a scratch
// buffer from chorus's allocator (reused across steps) with the user's data reordered into it.
class Arg {
 public:
  Arg(const memory::desc& want, const memory::desc& user_desc, void* user_ptr, bool read, dnnl::stream& stream)
      : user_(user_desc, engine(), user_ptr) {
    if (want == user_desc) {
      mem_ = user_;
      return;
    }
    scratch_ = std::make_shared<StorageImpl>(want.get_size(), kCPU);
    mem_ = memory(want, engine(), scratch_->data());
    if (read) dnnl::reorder(user_, mem_).execute(stream, user_, mem_);
  }
  const memory& get() const { return mem_; }
  // Writes a result computed in the primitive's layout back to the user's buffer.
  void write_back(dnnl::stream& stream) {
    if (scratch_) dnnl::reorder(mem_, user_).execute(stream, mem_, user_);
  }

 private:
  memory user_, mem_;
  Storage scratch_;
};

void* ptr(const Tensor& t) { return t.raw_data_ptr(); }

// The bias gradient alone: the sum of grad_out (dense, NCHW or NHWC) over batch and positions, per
// channel (in double).
void bias_grad(const Tensor& grad_bias, const Tensor& go, bool nhwc) {
  const int64_t n = go.size(0), c = go.size(1), hw = go.numel() / std::max<int64_t>(n * c, 1);
  const float* g = go.data_ptr<float>();
  float* b = grad_bias.data_ptr<float>();
  // Element (i, k, j) of NCHW memory is at (i * c + k) * hw + j, of NHWC memory at (i * hw + j) * c + k.
  const int64_t k_step = nhwc ? 1 : hw, j_step = nhwc ? c : 1;
  for (int64_t k = 0; k < c; ++k) {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < hw; ++j) sum += g[i * c * hw + k * k_step + j * j_step];
    b[k] = static_cast<float>(sum);
  }
}

}  // namespace

bool weight_grad_by_gemm(const Tensor& x, const Tensor& weight, const Window2d& w, int64_t groups) {
  if (!handles(x, weight, w)) return false;
  const std::shared_ptr<Entry> e = entry_for(key_of(x, weight, /*bias=*/false, w, groups));
  make_backward(*e);
  return e->own_weight_grad || e->by_gemm;
}

bool by_gemm(const Tensor& x, const Tensor& weight, const Window2d& w, int64_t groups) {
  return handles(x, weight, w) && entry_for(key_of(x, weight, /*bias=*/false, w, groups))->by_gemm;
}

void set_enabled(bool on) { enabled_flag().store(on); }
void set_winograd(bool on) { winograd_flag().store(on); }
bool winograd() { return winograd_flag().load(std::memory_order_relaxed); }

std::string implementation(const Tensor& x, const Tensor& weight, const Window2d& w, int64_t groups) {
  if (!handles(x, weight, w)) return "";
  const std::shared_ptr<Entry> e = entry_for(key_of(x, weight, /*bias=*/false, w, groups));
  if (e->by_gemm) return "chorus:gemm";
  if (e->own_winograd) return "chorus:winograd_2x3";
  return e->fwd_pd.impl_info_str();
}
bool enabled() { return enabled_flag().load(std::memory_order_relaxed); }

bool handles(const Tensor& x, const Tensor& weight, const Window2d& w) {
  // Below a few output positions in the whole batch (e.g. ResNet's last stage at batch 1: 2x2) the
  // per-call reorders of the weights cost more than the convolution; im2col + GEMM is faster there
  // (conv_bench: 512->512 3x3 at 2x2, batch 1: 3.4 ms against 8.2 ms).
  // NCHW input with an OIHW weight, or (channels-last) NHWC input with an OHWI weight.
  const bool layouts = (x.is_contiguous() && weight.is_contiguous()) ||
                       (x.is_contiguous(MemoryFormat::ChannelsLast) && weight.is_contiguous(MemoryFormat::ChannelsLast));
  return enabled() && x.dtype() == kFloat32 && weight.dtype() == kFloat32 && layouts && x.numel() > 0 &&
         x.size(0) * w.out_h * w.out_w >= 8;
}

void conv2d(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias, const Window2d& w,
            int64_t groups) {
  const std::shared_ptr<Entry> e = entry_for(key_of(x, weight, bias.defined(), w, groups));
  if (e->by_gemm) {
    conv2d_by_gemm(out, x, weight, bias, w);
    return;
  }
  if (e->own_winograd) {
    winograd::forward(x.data_ptr<float>(), weight.data_ptr<float>(), bias.defined() ? bias.data_ptr<float>() : nullptr,
                      out.data_ptr<float>(), x.size(0), x.size(1), weight.size(0), w.in_h, w.in_w);
    return;
  }
  dnnl::stream stream(engine());
  Arg src(e->fwd_pd.src_desc(), e->s.user_src, ptr(x), true, stream);
  Arg wei(e->fwd_pd.weights_desc(), e->s.user_wei, ptr(weight), true, stream);
  Arg dst(e->fwd_pd.dst_desc(), e->s.user_dst, ptr(out), false, stream);
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, src.get()}, {DNNL_ARG_WEIGHTS, wei.get()}, {DNNL_ARG_DST, dst.get()}};
  if (bias.defined()) args.emplace(DNNL_ARG_BIAS, memory(memory::desc(e->s.bias, dt::f32, tag::x), engine(), ptr(bias)));
  const Scratchpad scratchpad(e->fwd_pd);
  scratchpad.add_to(args);
  e->fwd.execute(stream, args);
  dst.write_back(stream);
  stream.wait();
}

void conv2d_backward(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& grad_out,
                     const Tensor& x, const Tensor& weight, const Window2d& w, int64_t groups) {
  const std::shared_ptr<Entry> e = entry_for(key_of(x, weight, /*bias=*/false, w, groups));
  make_backward(*e);
  dnnl::stream stream(engine());
  // grad_out dense in the input's layout, through the copy kernel (Tensor::contiguous belongs to the
  // autograd layer above).
  const MemoryFormat format = e->s.nhwc ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
  Tensor go = grad_out;
  if (!grad_out.is_contiguous(format)) {
    go = make_tensor(grad_out.sizes(), grad_out.dtype(), kCPU, format);
    copy(go, grad_out);
  }
  // [One diff_dst reorder] grad_out in the data gradient's layout, kept for the weight gradient: an
  // NCHW convolution's two backward primitives both want it in the same blocked layout (nChw8c on
  // AVX2), so it is reordered once, not once for each (small ResNet, batch 32: 52 activation reorders
  // a step took 26 ms of its 230; this saves 8 of them).
  if (e->own_winograd) {  // [Own Winograd convolutions]
    const int64_t n = x.size(0), c = x.size(1), k = weight.size(0);
    if (grad_x.defined()) {
      winograd::data_grad(go.data_ptr<float>(), weight.data_ptr<float>(), grad_x.data_ptr<float>(), n, c, k, w.in_h,
                          w.in_w);
    }
    if (grad_weight.defined()) {
      winograd::weight_grad(x.data_ptr<float>(), go.data_ptr<float>(), grad_weight.data_ptr<float>(), n, c, k,
                            w.in_h, w.in_w);
    }
    if (grad_bias.defined()) bias_grad(grad_bias, go, /*nhwc=*/false);
    return;
  }
  if (e->by_gemm) {  // [Small-image convolutions]
    if (grad_x.defined()) data_grad_by_gemm(grad_x, go, weight, w);
    if (grad_weight.defined()) {
      weight_grad_by_gemm(grad_weight, grad_bias, go, x, w);
      return;
    }
  }
  std::optional<Arg> data_diff_dst;
  if (grad_x.defined() && !e->by_gemm) {
    data_diff_dst.emplace(e->bwd_data_pd.diff_dst_desc(), e->s.user_dst, ptr(go), true, stream);
    Arg wei(e->bwd_data_pd.weights_desc(), e->s.user_wei, ptr(weight), true, stream);
    Arg diff_src(e->bwd_data_pd.diff_src_desc(), e->s.user_src, ptr(grad_x), false, stream);
    std::unordered_map<int, memory> args{{DNNL_ARG_DIFF_DST, data_diff_dst->get()},
                                         {DNNL_ARG_WEIGHTS, wei.get()},
                                         {DNNL_ARG_DIFF_SRC, diff_src.get()}};
    const Scratchpad scratchpad(e->bwd_data_pd);
    scratchpad.add_to(args);
    e->bwd_data.execute(stream, args);
    diff_src.write_back(stream);
    stream.wait();  // before the scratch buffers go
  }
  if (grad_weight.defined() && e->own_weight_grad) {
    data_diff_dst.reset();  // not used below: no grad_out-sized copy beside the columns
    weight_grad_by_gemm(grad_weight, grad_bias, go, x, w);
  } else if (grad_weight.defined()) {
    const bool with_bias = grad_bias.defined();
    const auto& pd = with_bias ? e->bwd_weights_pd : e->bwd_weights_nobias_pd;
    Arg src(pd.src_desc(), e->s.user_src, ptr(x), true, stream);
    // [One diff_dst reorder]: the data gradient's copy where the layouts agree.
    std::optional<Arg> own_diff_dst;
    if (!data_diff_dst || data_diff_dst->get().get_desc() != pd.diff_dst_desc()) {
      data_diff_dst.reset();  // a layout this primitive does not take: not kept beside its own
      own_diff_dst.emplace(pd.diff_dst_desc(), e->s.user_dst, ptr(go), true, stream);
    }
    const memory& diff_dst = own_diff_dst ? own_diff_dst->get() : data_diff_dst->get();
    Arg diff_wei(pd.diff_weights_desc(), e->s.user_wei, ptr(grad_weight), false, stream);
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC, src.get()}, {DNNL_ARG_DIFF_DST, diff_dst}, {DNNL_ARG_DIFF_WEIGHTS, diff_wei.get()}};
    if (with_bias) {
      args.emplace(DNNL_ARG_DIFF_BIAS, memory(memory::desc(e->s.bias, dt::f32, tag::x), engine(), ptr(grad_bias)));
    }
    const Scratchpad scratchpad(pd);
    scratchpad.add_to(args);
    (with_bias ? e->bwd_weights : e->bwd_weights_nobias).execute(stream, args);
    diff_wei.write_back(stream);
    stream.wait();
  } else if (grad_bias.defined()) {
    bias_grad(grad_bias, go, e->s.nhwc);
  }
}

// [Shared scratchpads] What the pool holds between calls, for tests ([No header]: conv_scratch_test
// declares these itself).
size_t scratch_pool_free_bytes() { return scratch_pool().free_bytes(); }
size_t scratch_pool_free_blocks() { return scratch_pool().free_blocks(); }

}  // namespace chorus::kernels::cpu::onednn
