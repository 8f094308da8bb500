// chorus on one GPU against PyTorch 2.11 eager (tools/torch_peer.py, the same sections and shapes, run
// in the same call) and against the raw libraries chorus calls:
//   resnet50  ResNet-50 training steps (224², batch 128, SGD momentum): float32 with TF32, and bf16
//             autocast, channels-last ("chorus") and NCHW ("chorus_nchw"); images/s and peak memory
//   bert      BERT-base masked-LM training steps (seq 128, batch 32, AdamW, bf16 autocast);
//             sequences/s and peak memory
//   gpt2      GPT-2 124M (examples/gpt's preset gpt2, dropout 0.1) language-model training steps
//             (seq 1024, batch 8, AdamW, bf16 autocast); tokens/s and peak memory
//   gemm      matmul TFLOP/s (4096³ and BERT-base's shapes; float32, TF32, bf16) against cublasGemmEx
//   memory    layer norm, softmax, add GB/s against a device-to-device cudaMemcpyAsync of the same size
//   conv      conv2d forward + backward on ResNet-50's layer shapes against raw cuDNN
//   layers    ResNet-50's ops one by one (convs, batch norm, relu, add, pools), forward + backward,
//             channels-last against NCHW: which op makes channels-last training slow
//   blocks    ResNet-50's training step (the resnet50 section's) cut into its 18 blocks (the stem,
//             the 16 bottlenecks, the head with the loss), each block's forward + backward device
//             time (events between the blocks' forward calls and in gradient hooks on their
//             outputs): where a whole step loses time against PyTorch's
// Each timed figure is the median of --iters runs after --warmup, between two timing events on the
// device's stream. Peak memory comes from the caching allocator (max allocated / reserved), reset
// before each case. Output: a Markdown table per section and one JSON line per row
// ({"gpu_bench": "row", ...}) for tools/gpu/compare_bench.py.
//
// --device sim runs every section with tiny shapes on the simulated device (tests/bench:
// gpu_bench_sim_test), which keeps the program working without a GPU; its figures say nothing about
// a GPU. The raw cuBLAS/cuDNN rows need a CUDA device and are left out there.
//   gpu_bench [--device cuda|sim] [--only resnet50,bert,gpt2,gemm,memory,conv,layers,blocks] [--tiny] [--iters N] ...
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "examples/models/bert.h"
#include "examples/models/gpt.h"
#include "examples/models/resnet.h"
#include "kernels/cuda/cudnn_plan.h"
#include "kernels/layout_conversions.h"
#include "nn/functional.h"
#include "optim/optim.h"
#include "tensor/caching_allocator.h"
#include "tensor/ops.h"
#include "tensor/runtime.h"
#include "tests/bench/gpu_bench_raw.h"
#include "utils/cli.h"

using namespace chorus;
namespace F = chorus::nn::functional;
namespace raw = chorus::bench::raw;
namespace cudnn_plan = chorus::kernels::cudnn_plan;

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

struct Setup {
  Device device = Device::cuda(0);
  bool raw = false;  // the cuBLAS/cuDNN rows (a CUDA device and a CUDA build)
  bool tiny = false;
  int warmup = 10, iters = 50;           // single ops
  int step_warmup = 5, step_iters = 20;  // training steps
  int conv_warmup = 5, conv_iters = 20;
  int64_t resnet_batch = 128, resnet_image = 224;
  std::string bert_config = "base";
  int64_t bert_batch = 32, bert_seq = 128;
  std::string gpt_config = "gpt2";
  int64_t gpt_batch = 8, gpt_seq = 1024;
  int64_t conv_batch = 128;
};

struct Row {
  std::string section, impl, name;
  double ms = 0;
  double value = 0;  // in `unit`
  std::string unit;
  std::optional<double> peak_allocated_mib, peak_reserved_mib;
  // Training steps: what the last timed forward pass left allocated (saved activations and the
  // loss), tools/torch_peer.py's "activations_mib" likewise.
  std::optional<double> activations_mib;
  std::string note;
};

Row make_row(std::string impl, std::string name, double ms, double value, std::string unit, std::string note = "") {
  Row r;
  r.impl = std::move(impl), r.name = std::move(name), r.ms = ms, r.value = value, r.unit = std::move(unit);
  r.note = std::move(note);
  return r;
}

// Rows of one section: printed as a Markdown table (chorus beside the baseline of the same case)
// and as JSON lines when the section ends.
class Section {
 public:
  Section(const Setup& setup, std::string name, std::string baseline, std::string json_path)
      : setup_(setup), name_(std::move(name)), baseline_(std::move(baseline)), json_path_(std::move(json_path)) {}
  void add(Row r) {
    r.section = name_;
    rows_.push_back(std::move(r));
  }
  void print() const {
    const bool with_base = std::any_of(rows_.begin(), rows_.end(), [&](const Row& r) { return r.impl != "chorus"; });
    std::printf("\n| case | chorus ms | chorus | peak allocated MiB | peak reserved MiB |%s\n",
                with_base ? (" " + baseline_ + " ms | " + baseline_ + " | chorus / " + baseline_ + " |").c_str() : "");
    std::printf("|---|---|---|---|---|%s\n", with_base ? "---|---|---|" : "");
    for (const Row& r : rows_) {
      if (r.impl != "chorus") continue;
      std::printf("| %s | %.3f | %.4g %s | %s | %s |", r.name.c_str(), r.ms, r.value, r.unit.c_str(),
                  mib(r.peak_allocated_mib).c_str(), mib(r.peak_reserved_mib).c_str());
      if (with_base) {
        const Row* b = find(r.name, baseline_);
        if (b) std::printf(" %.3f | %.4g %s | %.3f |", b->ms, b->value, b->unit.c_str(), r.value / b->value);
        else std::printf(" | | |");
      }
      std::printf("\n");
    }
    std::string json_lines;
    for (const Row& r : rows_) {
      nlohmann::json j = {{"gpu_bench", "row"}, {"impl", r.impl}, {"section", r.section}, {"case", r.name},
                          {"ms", r.ms}, {"value", r.value}, {"unit", r.unit}, {"device", setup_.device.str()}};
      if (r.peak_allocated_mib) j["peak_allocated_mib"] = *r.peak_allocated_mib;
      if (r.peak_reserved_mib) j["peak_reserved_mib"] = *r.peak_reserved_mib;
      if (r.activations_mib) j["activations_mib"] = *r.activations_mib;
      if (!r.note.empty()) j["note"] = r.note;
      json_lines += j.dump() + "\n";
    }
    std::printf("\n%s", json_lines.c_str());
    if (!json_path_.empty()) std::ofstream(json_path_, std::ios::app) << json_lines;
    std::fflush(stdout);
  }

 private:
  static std::string mib(const std::optional<double>& v) {
    if (!v) return "";
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.0f", *v);
    return buf;
  }
  const Row* find(const std::string& name, const std::string& impl) const {
    for (const Row& r : rows_) {
      if (r.name == name && r.impl == impl) return &r;
    }
    return nullptr;
  }
  const Setup& setup_;
  std::string name_, baseline_, json_path_;
  std::vector<Row> rows_;
};

// Median milliseconds of `iters` runs of fn after `warmup` untimed ones. Each run sits between two
// timing events on the device's current stream and the host waits for the second before the next
// run, so a run's time includes any gap in which the device waited for the host.
double median_ms(const Setup& s, int warmup, int iters, const std::function<void()>& fn) {
  const Stream stream = current_stream(s.device);
  for (int i = 0; i < warmup; ++i) fn();
  synchronize(s.device);
  std::vector<double> ms;
  Event start(true), end(true);
  for (int i = 0; i < iters; ++i) {
    start.record(stream);
    fn();
    end.record(stream);
    end.synchronize();
    ms.push_back(start.elapsed_time(end));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Frees what earlier cases left cached, so each case's peak reserved is its own.
void fresh_peak(const Setup& s) {
  synchronize(s.device);
  empty_cache(s.device);
  reset_peak_memory_stats(s.device);
}
// Bytes the device's caching allocator holds now, after the work queued so far (a synchronize: the
// timed steps that call it include one more host wait, as tools/torch_peer.py's do).
size_t allocated_now(const Setup& s) {
  synchronize(s.device);
  return memory_allocated(s.device);
}

void set_peaks(const Setup& s, Row& r) {
  r.peak_allocated_mib = max_memory_allocated(s.device) / kMiB;
  r.peak_reserved_mib = max_memory_reserved(s.device) / kMiB;
}

Tensor random(const Setup& s, const Shape& shape, DType dtype = kFloat32) {
  Tensor t = randn(shape, {.device = s.device});
  return dtype == kFloat32 ? t : t.to(dtype);
}

// ---- resnet50 ----------------------------------------------------------------------------------

// The resnet50 and blocks sections' training step: ResNet-50 (TF32 allowed), SGD with momentum, one
// batch of random images in the layout asked for, after a fresh peak.
struct ResNetStep {
  std::shared_ptr<models::ResNet> model;
  std::unique_ptr<optim::SGD> opt;
  Tensor images, labels;
  ResNetStep(const Setup& s, bool channels_last) {
    fresh_peak(s);
    raw::set_chorus_tf32(true);
    raw::set_chorus_cudnn_tf32(true);
    manual_seed(1);
    model = models::resnet50();
    model->to(s.device);
    if (channels_last) model->to(MemoryFormat::ChannelsLast);
    model->train();
    opt = std::make_unique<optim::SGD>(model->parameters(),
                                       optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-4});
    images = random(s, {s.resnet_batch, 3, s.resnet_image, s.resnet_image});
    if (channels_last) images = images.contiguous(MemoryFormat::ChannelsLast);
    labels = randint(0, 1000, {s.resnet_batch}, {.dtype = kInt64, .device = s.device});
  }
};

void resnet50(const Setup& s, Section& out) {
  // Channels-last (model->to(ChannelsLast), NHWC images) is the "chorus" row, beside PyTorch's
  // channels-last "torch" row; NCHW runs too ("chorus_nchw", beside "torch_nchw").
  for (const bool channels_last : {true, false}) {
    for (const std::string mode : {"tf32", "bf16"}) {
      ResNetStep r50(s, channels_last);
      auto& model = r50.model;
      optim::SGD& opt = *r50.opt;
      const Tensor &images = r50.images, &labels = r50.labels;
      double held = 0;
      auto step = [&] {
        opt.zero_grad();
        const size_t before = allocated_now(s);
        Tensor loss;
        {
          std::optional<autocast::AutocastGuard> amp;
          if (mode == "bf16") amp.emplace(s.device.type, kBFloat16);
          loss = F::cross_entropy(model->forward(images), labels);
        }
        held = static_cast<double>(allocated_now(s) - before) / kMiB;
        loss.backward();
        opt.step();
      };
      const double ms = median_ms(s, s.step_warmup, s.step_iters, step);
      // One more step counting the copies that changed a tensor's memory format (none in PyTorch's
      // channels-last step; tests/nn/layout_conversions_test holds sim to that): named in the note.
      layout_conversions::reset();
      step();
      const layout_conversions::Stats conversions = layout_conversions::stats();
      if (conversions.count > 0) std::fprintf(stderr, "resnet50 %s layout conversions a step:\n%s", mode.c_str(), conversions.str().c_str());
      Row r = make_row(channels_last ? "chorus" : "chorus_nchw",
                       fmt::format("batch {} x 3x{}² {}", s.resnet_batch, s.resnet_image, mode), ms,
                       s.resnet_batch / (ms / 1e3), "images/s",
                       fmt::format("{}; {} layout conversions a step", channels_last ? "channels-last" : "nchw",
                                   conversions.count));
      set_peaks(s, r);
      r.activations_mib = held;
      out.add(r);
    }
  }
}

// ---- blocks ------------------------------------------------------------------------------------

// The step of the resnet50 section with an event on the device's stream between blocks: before each
// block's forward and after the last; in backward, one in a gradient hook on each block's output
// (it runs once that output's gradient is complete: after the next block's backward) and one after
// backward() returns (the stem's backward). A block's time is its forward's span plus its
// backward's; the optimizer step is left out. tools/torch_peer.py cuts PyTorch's step the same way.
void blocks(const Setup& s, Section& out) {
  for (const bool channels_last : {true, false}) {
    for (const std::string mode : {"tf32", "bf16"}) {
      ResNetStep r50(s, channels_last);
      std::vector<std::string> names{"stem"};
      std::vector<std::shared_ptr<nn::Module>> bottlenecks;
      const std::vector<std::pair<std::string, std::shared_ptr<nn::Sequential>>> stages = {
          {"layer1", r50.model->layer1},
          {"layer2", r50.model->layer2},
          {"layer3", r50.model->layer3},
          {"layer4", r50.model->layer4}};
      for (const auto& [stage, seq] : stages) {
        for (size_t i = 0; i < seq->size(); ++i) {
          names.push_back(fmt::format("{}.{}", stage, i));
          bottlenecks.push_back((*seq)[i]);
        }
      }
      names.push_back("head");
      const size_t n = names.size();
      // ms[block][step]
      std::vector<std::vector<double>> ms(n);
      const Stream stream = current_stream(s.device);
      auto step = [&](bool timed) {
        std::vector<Event> fwd(n + 1, Event(true)), bwd(n + 1, Event(true));
        std::vector<HookHandle> hooks;
        r50.opt->zero_grad();
        Tensor loss;
        {
          std::optional<autocast::AutocastGuard> amp;
          if (mode == "bf16") amp.emplace(s.device.type, kBFloat16);
          fwd[0].record(stream);
          Tensor h = F::relu(r50.model->bn1->forward(r50.model->conv1->forward(r50.images)));
          h = r50.model->maxpool->forward(h);
          // bwd[k + 1]: the gradient of block k's output is complete (block k + 1's backward ran).
          hooks.push_back(h.register_hook([&bwd, &stream](const Tensor&) {
            bwd[1].record(current_stream(stream.device()));
            return Tensor();
          }));
          fwd[1].record(stream);
          for (size_t k = 0; k < bottlenecks.size(); ++k) {
            h = bottlenecks[k]->forward(h);
            hooks.push_back(h.register_hook([&bwd, &stream, k](const Tensor&) {
              bwd[k + 2].record(current_stream(stream.device()));
              return Tensor();
            }));
            fwd[k + 2].record(stream);
          }
          const Tensor logits = r50.model->fc->forward(r50.model->avgpool->forward(h).flatten(1));
          loss = F::cross_entropy(logits, r50.labels);
          fwd[n].record(stream);
        }
        bwd[n].record(stream);  // backward starts: the head's runs first
        loss.backward();
        bwd[0].record(stream);  // after the stem's backward
        r50.opt->step();
        for (HookHandle& hook : hooks) hook.remove();
        if (!timed) return;
        bwd[0].synchronize();
        // Block k: forward fwd[k] -> fwd[k + 1]; backward bwd[k + 1] -> bwd[k].
        for (size_t k = 0; k < n; ++k) {
          ms[k].push_back(fwd[k].elapsed_time(fwd[k + 1]) + bwd[k + 1].elapsed_time(bwd[k]));
        }
      };
      for (int i = 0; i < s.step_warmup; ++i) step(false);
      synchronize(s.device);
      for (int i = 0; i < s.step_iters; ++i) step(true);
      for (size_t k = 0; k < n; ++k) {
        std::sort(ms[k].begin(), ms[k].end());
        const double median = ms[k][ms[k].size() / 2];
        Row r = make_row(channels_last ? "chorus" : "chorus_nchw", fmt::format("{} {}", mode, names[k]), median,
                         1e3 / median, "runs/s", channels_last ? "channels-last" : "nchw");
        set_peaks(s, r);  // the whole step's
        out.add(r);
      }
    }
  }
}

// ---- bert, gpt2 --------------------------------------------------------------------------------

// A language model's training step under bf16 autocast with AdamW (the bert and gpt2 sections),
// timed: `items` sequences or tokens a step, the peaks, and what forward left allocated.
Row language_model_row(const Setup& s, nn::Module& model, optim::AdamOptions adam, const std::function<Tensor()>& loss_of,
                       std::string name, double items, std::string unit) {
  optim::AdamW opt(model.parameters(), adam);
  double held = 0;
  const double ms = median_ms(s, s.step_warmup, s.step_iters, [&] {
    opt.zero_grad();
    const size_t before = allocated_now(s);
    Tensor loss;
    {
      autocast::AutocastGuard amp(s.device.type, kBFloat16);
      loss = loss_of();
    }
    held = static_cast<double>(allocated_now(s) - before) / kMiB;
    loss.backward();
    opt.step();
  });
  Row r = make_row("chorus", std::move(name), ms, items / (ms / 1e3), std::move(unit));
  set_peaks(s, r);
  r.activations_mib = held;
  return r;
}

// A model of `config` on the device in training mode, seeded, after a fresh peak (TF32 allowed).
template <typename Model, typename Config>
std::shared_ptr<Model> fresh_model(const Setup& s, uint64_t seed, const Config& config) {
  fresh_peak(s);
  raw::set_chorus_tf32(true);
  manual_seed(seed);
  auto model = std::make_shared<Model>(config);
  model->to(s.device);
  model->train();
  return model;
}

void bert(const Setup& s, Section& out) {
  const models::BertConfig config = models::BertConfig::named(s.bert_config);
  auto model = fresh_model<models::BertForPreTraining>(s, 2, config);
  // Random word pieces; 15% of the positions, evenly spread, carry a label (the masked-LM head and
  // the vocabulary-wide decoder run on those only, as examples/bert and tools/torch_peer.py do).
  const int64_t b = s.bert_batch, t = s.bert_seq, n = b * t;
  Tensor ids_host = randint(999, config.vocab_size, {b, t});
  Tensor labels_host = full({b, t}, -100, {.dtype = kInt64});
  const int64_t masked = std::max<int64_t>(1, std::llround(0.15 * static_cast<double>(n)));
  {
    const int64_t* ids = ids_host.data_ptr<int64_t>();
    int64_t* labels = labels_host.data_ptr<int64_t>();
    for (int64_t j = 0; j < masked; ++j) labels[j * n / masked] = ids[j * n / masked];
  }
  Tensor ids = ids_host.to(s.device), labels = labels_host.to(s.device);
  Tensor attention = ones({b, t}, {.dtype = kInt64, .device = s.device});
  out.add(language_model_row(
      s, *model, {.lr = 1e-4, .weight_decay = 0.01}, [&] { return model->masked_lm_loss(ids, attention, labels); },
      fmt::format("BERT-{} batch {} x seq {} bf16", s.bert_config, b, t), static_cast<double>(b), "sequences/s"));
}

// Next-token training of examples/gpt's GPT-2 (tools/torch_peer.py writes the same model): random
// tokens and random targets over the whole vocabulary, every position predicted, the LM head tied to
// the token embedding, dropout as the preset has it (0.1 for gpt2).
void gpt2(const Setup& s, Section& out) {
  const models::GPTConfig config = models::GPTConfig::named(s.gpt_config);
  auto model = fresh_model<models::GPT2LMHeadModel>(s, 3, config);
  const int64_t b = s.gpt_batch, t = std::min(s.gpt_seq, config.n_positions);
  Tensor ids = randint(0, config.vocab_size, {b, t}, {.dtype = kInt64, .device = s.device});
  Tensor targets = randint(0, config.vocab_size, {b, t}, {.dtype = kInt64, .device = s.device});
  out.add(language_model_row(s, *model, {.lr = 3e-4, .weight_decay = 0.1}, [&] { return model->loss(ids, targets); },
                             fmt::format("GPT-2 {} batch {} x seq {} bf16", s.gpt_config, b, t),
                             static_cast<double>(b * t), "tokens/s"));
}

// ---- gemm --------------------------------------------------------------------------------------

struct GemmShape {
  std::string what;
  int64_t batch, m, n, k;  // batch 0: a plain 2-D matmul
};

std::vector<GemmShape> gemm_shapes(const Setup& s) {
  const models::BertConfig c = models::BertConfig::named(s.bert_config);
  const int64_t tokens = s.bert_batch * s.bert_seq, h = c.hidden_size, heads = c.num_attention_heads;
  const int64_t d = h / heads, t = s.bert_seq;
  const int64_t masked = std::max<int64_t>(1, std::llround(0.15 * static_cast<double>(tokens)));
  const int64_t square = s.tiny ? 64 : 4096;
  return {
      {"square", 0, square, square, square},
      {"BERT QKV / attention output", 0, tokens, h, h},
      {"BERT FFN up", 0, tokens, c.intermediate_size, h},
      {"BERT FFN down", 0, tokens, h, c.intermediate_size},
      {"BERT MLM decoder (masked positions)", 0, masked, c.vocab_size, h},
      {"BERT attention scores (bmm)", s.bert_batch * heads, t, t, d},
      {"BERT attention context (bmm)", s.bert_batch * heads, t, d, t},
  };
}

void gemm(const Setup& s, Section& out) {
  NoGradGuard no_grad;
  for (const GemmShape& g : gemm_shapes(s)) {
    for (const std::string mode : {"fp32", "tf32", "bf16"}) {
      const DType dtype = mode == "bf16" ? kBFloat16 : kFloat32;
      const raw::GemmMath math = mode == "bf16"   ? raw::GemmMath::BFloat16
                                 : mode == "tf32" ? raw::GemmMath::TF32
                                                  : raw::GemmMath::Float32;
      raw::set_chorus_tf32(mode == "tf32");
      const Shape as = g.batch ? Shape{g.batch, g.m, g.k} : Shape{g.m, g.k};
      const Shape bs = g.batch ? Shape{g.batch, g.k, g.n} : Shape{g.k, g.n};
      const Shape cs = g.batch ? Shape{g.batch, g.m, g.n} : Shape{g.m, g.n};
      const std::string name = g.batch ? fmt::format("{} {}x[{}x{}x{}] {}", g.what, g.batch, g.m, g.n, g.k, mode)
                                       : fmt::format("{} {}x{}x{} {}", g.what, g.m, g.n, g.k, mode);
      const double flop = 2.0 * std::max<int64_t>(g.batch, 1) * g.m * g.n * g.k;
      fresh_peak(s);
      Tensor a = random(s, as, dtype), b = random(s, bs, dtype);
      const double ms = median_ms(s, s.warmup, s.iters, [&] { matmul(a, b); });
      Row r = make_row("chorus", name, ms, flop / ms / 1e9, "TFLOP/s");
      set_peaks(s, r);
      out.add(r);
      if (s.raw) {
        Tensor c = empty(cs, {.dtype = dtype, .device = s.device});
        const double raw_ms = median_ms(s, s.warmup, s.iters, [&] { raw::gemm(a, b, c, math); });
        out.add(make_row("cublas", name, raw_ms, flop / raw_ms / 1e9, "TFLOP/s"));
      }
    }
  }
  raw::set_chorus_tf32(true);  // chorus's default
}

// ---- memory ------------------------------------------------------------------------------------

// A device-to-device copy of `bytes` through the runtime (cudaMemcpyAsync on cuda), the bandwidth a
// memory-bound kernel is measured against; counted as bytes read plus bytes written.
Row copy_row(const Setup& s, const std::string& name, int64_t bytes) {
  Tensor src = empty({bytes}, {.dtype = kUInt8, .device = s.device});
  Tensor dst = empty({bytes}, {.dtype = kUInt8, .device = s.device});
  src.zero_();
  DeviceRuntime& rt = runtime_for(s.device, "gpu_bench copy");
  const Stream stream = current_stream(s.device);
  const double ms = median_ms(s, s.warmup, s.iters, [&] {
    rt.memcpy_async(dst.raw_data_ptr(), src.raw_data_ptr(), static_cast<size_t>(bytes), CopyKind::DeviceToDevice,
                    stream.handle());
  });
  return make_row("copy", name, ms, 2.0 * bytes / ms / 1e6, "GB/s");
}

void memory(const Setup& s, Section& out) {
  NoGradGuard no_grad;
  raw::set_chorus_tf32(true);
  const models::BertConfig c = models::BertConfig::named(s.bert_config);
  const int64_t tokens = s.bert_batch * s.bert_seq, heads = c.num_attention_heads;
  const int64_t big_rows = s.tiny ? 64 : 65536, big_cols = s.tiny ? 128 : 1024;
  const int64_t add_n = s.tiny ? 4096 : int64_t(1) << 26;
  struct Case {
    std::string name;
    std::function<std::function<void()>()> make;  // allocates the inputs, returns the timed call
    int64_t elements;                             // of the output (the copy baseline's size)
    double bytes;                                 // read + written by the op
  };
  auto ln = [&](int64_t rows, int64_t cols) {
    return Case{fmt::format("layer_norm [{}, {}] fp32", rows, cols),
                [&s, rows, cols]() -> std::function<void()> {
                  Tensor x = random(s, {rows, cols}), w = random(s, {cols}), bias = random(s, {cols});
                  return [x, w, bias, cols] { F::layer_norm(x, {cols}, w, bias, 1e-12); };
                },
                rows * cols, 4.0 * (2.0 * rows * cols + 2.0 * cols)};
  };
  auto sm = [&](int64_t rows, int64_t cols) {
    return Case{fmt::format("softmax [{}, {}] fp32", rows, cols),
                [&s, rows, cols]() -> std::function<void()> {
                  Tensor x = random(s, {rows, cols});
                  return [x] { softmax(x, -1); };
                },
                rows * cols, 4.0 * 2.0 * rows * cols};
  };
  const std::vector<Case> cases = {
      {fmt::format("add [{}] fp32", add_n),
       [&s, add_n]() -> std::function<void()> {
         Tensor a = random(s, {add_n}), b = random(s, {add_n});
         return [a, b] { add(a, b); };
       },
       add_n, 4.0 * 3.0 * add_n},
      ln(big_rows, big_cols),
      ln(tokens, c.hidden_size),
      sm(big_rows, big_cols),
      sm(s.bert_batch * heads * s.bert_seq, s.bert_seq),
  };
  for (const Case& k : cases) {
    fresh_peak(s);
    {
      const std::function<void()> op = k.make();
      const double ms = median_ms(s, s.warmup, s.iters, op);
      Row r = make_row("chorus", k.name, ms, k.bytes / ms / 1e6, "GB/s");
      set_peaks(s, r);
      out.add(r);
    }
    out.add(copy_row(s, k.name, 4 * k.elements));
  }
}

// ---- conv --------------------------------------------------------------------------------------

struct ConvShape {
  std::string where;
  int64_t in_channels, out_channels, kernel, stride, pad, in_size;  // at a 224² input
};

// Every distinct convolution of ResNet-50 (torchvision v1.5: the stride on the 3x3).
std::vector<ConvShape> resnet50_convs() {
  std::vector<ConvShape> v = {{"conv1", 3, 64, 7, 2, 3, 224}};
  const int64_t planes[4] = {64, 128, 256, 512}, sizes[4] = {56, 56, 28, 14};
  int64_t inplanes = 64;
  for (int stage = 0; stage < 4; ++stage) {
    const int64_t p = planes[stage], in = sizes[stage], stride = stage == 0 ? 1 : 2, out = in / stride;
    const std::string l = "layer" + std::to_string(stage + 1);
    v.push_back({l + ".0.conv1", inplanes, p, 1, 1, 0, in});
    v.push_back({l + ".0.conv2", p, p, 3, stride, 1, in});
    v.push_back({l + ".*.conv3", p, 4 * p, 1, 1, 0, out});
    if (stage > 0) v.push_back({l + ".0.downsample", inplanes, 4 * p, 1, 2, 0, in});  // layer1's is conv3's shape
    v.push_back({l + ".1.conv1", 4 * p, p, 1, 1, 0, out});
    if (stage > 0) v.push_back({l + ".1.conv2", p, p, 3, 1, 1, out});  // layer1's is .0.conv2's shape
    inplanes = 4 * p;
  }
  return v;
}

// The cuDNN algorithms chorus chose since the cache was cleared, as the raw rows note theirs
// ("fwd 1 m1 / bwd-data 1 m1 / bwd-filter 5 m1"; m: cudnnMathType_t). Empty where cuDNN did not run.
std::string chosen_algorithms() {
  const char* names[] = {"fwd", "bwd-data", "bwd-filter"};  // in Direction's order
  auto entries = cudnn_plan::AlgoCache::global().entries();
  std::sort(entries.begin(), entries.end(),
            [](const auto& a, const auto& b) { return a.first.direction < b.first.direction; });
  std::string note;
  for (const auto& [key, choice] : entries) {
    note += fmt::format("{}{} {} m{}", note.empty() ? "" : " / ", names[static_cast<int>(key.direction)],
                        choice.algorithm, choice.math_type);
  }
  return note;
}

void conv(const Setup& s, Section& out) {
  for (const std::string mode : {"tf32", "bf16"}) {
    const DType dtype = mode == "bf16" ? kBFloat16 : kFloat32;
    raw::set_chorus_cudnn_tf32(true);
    for (ConvShape c : resnet50_convs()) {
      if (s.tiny) {
        // The same layer structure at a size the simulated device runs in moments.
        c.in_size = std::max<int64_t>(2, c.in_size / 8);
        if (c.in_channels > 3) c.in_channels = std::max<int64_t>(1, c.in_channels / 16);
        c.out_channels = std::max<int64_t>(1, c.out_channels / 16);
      }
      const int64_t o = (c.in_size + 2 * c.pad - c.kernel) / c.stride + 1, n = s.conv_batch;
      const std::string name = fmt::format("{} {}x{}x{}² -> {}x{}² k{} s{} {}", c.where, n, c.in_channels, c.in_size,
                                           c.out_channels, o, c.kernel, c.stride, mode);
      // Forward and both backward products (input and weight gradients).
      const double flop = 3.0 * 2.0 * n * c.out_channels * o * o * c.in_channels * c.kernel * c.kernel;
      fresh_peak(s);
      Tensor x = random(s, {n, c.in_channels, c.in_size, c.in_size}, dtype).requires_grad_();
      Tensor w = random(s, {c.out_channels, c.in_channels, c.kernel, c.kernel}, dtype).requires_grad_();
      Tensor dy = random(s, {n, c.out_channels, o, o}, dtype);
      {
        cudnn_plan::AlgoCache::global().clear();  // so that chorus's choices for this case can be noted
        const double ms = median_ms(s, s.conv_warmup, s.conv_iters, [&] {
          Tensor y = F::conv2d(x, w, Tensor(), {c.stride, c.stride}, {c.pad, c.pad});
          y.backward(dy);
          // Fresh gradients each run, as the raw calls write theirs (no accumulation kernel).
          x.mutable_grad() = Tensor();
          w.mutable_grad() = Tensor();
        });
        Row r = make_row("chorus", name, ms, flop / ms / 1e9, "TFLOP/s", chosen_algorithms());
        set_peaks(s, r);
        out.add(r);
      }
      if (s.raw) {
        NoGradGuard no_grad;
        Tensor xd = x.detach(), wd = w.detach();
        Tensor y = empty(dy.sizes(), {.dtype = dtype, .device = s.device});
        Tensor dx = empty(xd.sizes(), {.dtype = dtype, .device = s.device});
        Tensor dw = empty(wd.sizes(), {.dtype = dtype, .device = s.device});
        raw::Conv call(xd, wd, y, dy, dx, dw, c.stride, c.pad, true);
        const double ms = median_ms(s, s.conv_warmup, s.conv_iters, [&] { call.run(); });
        out.add(make_row("cudnn", name, ms, flop / ms / 1e9, "TFLOP/s", call.algorithms()));
      }
    }
  }
}

// ---- layers -------------------------------------------------------------------------------------

// ResNet-50's building blocks one by one, forward + backward, channels-last ("chorus") beside the
// same op on NCHW tensors ("chorus_nchw"): which op makes a channels-last training step slower than
// an NCHW one (12x at TF32 on an H100, 2026-11-26) shows as the row whose ratio is far below 1.
void layers(const Setup& s, Section& out) {
  struct Case {
    std::string name;
    int64_t channels, size;  // the input's, at batch s.conv_batch
    std::function<Tensor(const Tensor&)> op;  // of the input, given the case's parameters below
  };
  const int64_t n = s.conv_batch, scale = s.tiny ? 16 : 1, side = s.tiny ? 8 : 1;
  for (const std::string mode : {"tf32", "bf16"}) {
    const DType dtype = mode == "bf16" ? kBFloat16 : kFloat32;
    raw::set_chorus_cudnn_tf32(true);
    for (const bool channels_last : {true, false}) {
      const MemoryFormat format = channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
      // Parameters as a channels-last (or NCHW) model holds them: weights in the input's format,
      // batch-norm affine parameters and statistics in float32 (as under autocast).
      auto weight = [&](int64_t out_c, int64_t in_c, int64_t k) {
        return random(s, {out_c, in_c, k, k}, dtype).contiguous(format).requires_grad_();
      };
      const int64_t c256 = 256 / scale, c64 = 64 / scale, c2048 = 2048 / scale;
      Tensor w1x1 = weight(c64, c256, 1), w3x3 = weight(c64, c64, 3), w7x7 = weight(c64, 3, 7);
      Tensor gamma = random(s, {c256}).requires_grad_(), beta = random(s, {c256}).requires_grad_();
      Tensor mean = zeros({c256}, {.device = s.device}), var = ones({c256}, {.device = s.device});
      const std::vector<Case> cases = {
          {"conv1 7x7 s2", 3, 224 / side, [&](const Tensor& x) { return F::conv2d(x, w7x7, Tensor(), {2, 2}, {3, 3}); }},
          {"conv 1x1", c256, 56 / side, [&](const Tensor& x) { return F::conv2d(x, w1x1); }},
          {"conv 3x3", c64, 56 / side, [&](const Tensor& x) { return F::conv2d(x, w3x3, Tensor(), {1, 1}, {1, 1}); }},
          {"batch_norm (training)", c256, 56 / side,
           [&](const Tensor& x) { return F::batch_norm(x, mean, var, gamma, beta, /*training=*/true); }},
          {"relu", c256, 56 / side, [&](const Tensor& x) { return F::relu(x); }},
          {"add (residual)", c256, 56 / side, [&](const Tensor& x) { return x + x * 0.5; }},
          {"max_pool2d 3x3 s2", c64, 112 / side, [&](const Tensor& x) { return F::max_pool2d(x, {3, 3}, F::Pair{2, 2}, {1, 1}); }},
          {"adaptive_avg_pool2d", c2048, 7, [&](const Tensor& x) { return F::adaptive_avg_pool2d(x, {1, 1}); }},
      };
      for (const Case& c : cases) {
        fresh_peak(s);
        Tensor x = random(s, {n, c.channels, c.size, c.size}, dtype).contiguous(format).requires_grad_();
        Tensor dy;
        {
          NoGradGuard no_grad;
          dy = random(s, c.op(x.detach()).sizes(), dtype);
        }
        // The incoming gradient in the format the op's output has (as the next layer would give it).
        dy = dy.contiguous(format);
        const double ms = median_ms(s, s.conv_warmup, s.conv_iters, [&] {
          c.op(x).backward(dy);
          x.mutable_grad() = Tensor();
        });
        const std::string name = fmt::format("{} {}x{}x{}² {}", c.name, n, c.channels, c.size, mode);
        Row r = make_row(channels_last ? "chorus" : "chorus_nchw", name, ms, 1e3 / ms, "runs/s",
                         channels_last ? "channels-last" : "nchw");
        set_peaks(s, r);
        out.add(r);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"chorus GPU benchmark: models, GEMM, memory-bound kernels and convolutions against raw libraries"};
  std::string device = "cuda", only = "resnet50,bert,gpt2,gemm,memory,conv,layers,blocks", json_path;
  bool tiny = false;
  std::optional<int> warmup, iters, step_warmup, step_iters;
  std::optional<int64_t> resnet_batch, resnet_image, bert_batch, bert_seq;
  std::optional<std::string> bert_config, gpt_config;
  std::optional<int64_t> gpt_batch, gpt_seq;
  app.add_option("--device", device, "cuda or sim (sim: tiny shapes, few iterations)")->check(CLI::IsMember({"cuda", "sim"}));
  app.add_option("--only", only, "comma-separated sections: resnet50,bert,gpt2,gemm,memory,conv,layers,blocks");
  app.add_flag("--tiny", tiny, "tiny shapes and few iterations (always on for sim)");
  app.add_option("--warmup", warmup, "untimed runs before each timed op or convolution");
  app.add_option("--iters", iters, "timed runs of each op or convolution (the median is reported)");
  app.add_option("--step-warmup", step_warmup, "untimed training steps (resnet50, bert, gpt2)");
  app.add_option("--step-iters", step_iters, "timed training steps (resnet50, bert, gpt2)");
  app.add_option("--json", json_path, "also append the JSON lines to this file");
  // Model shapes (after --tiny): e.g. the real ResNet-50 at a small batch on sim, whose caching
  // allocator counts every byte as a GPU's would (docs/gpu.md, "Memory on sim").
  app.add_option("--resnet-batch", resnet_batch, "resnet50 batch size (default 128; tiny: 2)")->check(CLI::PositiveNumber);
  app.add_option("--resnet-image", resnet_image, "resnet50 image side (default 224; tiny: 32)")->check(CLI::Range(32, 1024));
  app.add_option("--bert-batch", bert_batch, "bert sequences per batch (default 32; tiny: 2)")->check(CLI::PositiveNumber);
  app.add_option("--bert-seq", bert_seq, "bert tokens per sequence (default 128; tiny: 16)")->check(CLI::Range(2, 512));
  app.add_option("--bert-config", bert_config, "bert size: tiny, mini, small or base (default base; tiny: tiny)");
  app.add_option("--gpt-batch", gpt_batch, "gpt2 sequences per batch (default 8; tiny: 2)")->check(CLI::PositiveNumber);
  app.add_option("--gpt-seq", gpt_seq, "gpt2 tokens per sequence (default 1024; tiny: 16)")->check(CLI::Range(2, 1024));
  app.add_option("--gpt-config", gpt_config, "gpt2 preset of examples/gpt: tiny, mini, gpt2, ... (default gpt2; tiny: tiny)");
  chorus::cli::refuse_non_finite(app);
  CLI11_PARSE(app, argc, argv);

  Setup s;
  s.device = Device::parse(device);
  s.tiny = tiny || s.device.is_sim();
  struct Entry {
    std::string name, title, baseline;
    void (*run)(const Setup&, Section&);
  };
  const std::vector<Entry> entries = {
      {"resnet50", "ResNet-50 training step (SGD momentum; TF32 / bf16 autocast)", "torch", resnet50},
      {"bert", "BERT masked-LM training step (AdamW, bf16 autocast)", "torch", bert},
      {"gpt2", "GPT-2 language-model training step (AdamW, bf16 autocast)", "torch", gpt2},
      {"gemm", "GEMM (matmul) against cublasGemmEx", "cublas", gemm},
      {"memory", "memory-bound kernels against a device-to-device copy of the output's size", "copy", memory},
      {"conv", "conv2d forward + backward (input and weight gradients) against raw cuDNN", "cudnn", conv},
      {"layers", "ResNet-50's layers forward + backward, channels-last against NCHW", "chorus_nchw", layers},
      {"blocks", "ResNet-50's training step block by block, forward + backward, channels-last and NCHW", "chorus_nchw",
       blocks},
  };
  std::set<std::string> sections;
  std::stringstream list(only);
  for (std::string item; std::getline(list, item, ',');) {
    if (item.empty()) continue;
    if (std::none_of(entries.begin(), entries.end(), [&](const Entry& e) { return e.name == item; })) {
      std::string known;
      for (const Entry& e : entries) known += (known.empty() ? "" : ", ") + e.name;
      std::fprintf(stderr, "gpu_bench: unknown section '%s' (expected %s)\n", item.c_str(), known.c_str());
      return 2;
    }
    sections.insert(item);
  }
  if (s.device.type == DeviceType::CUDA && device_count(DeviceType::CUDA) == 0) {
    std::fprintf(stderr, "gpu_bench: no CUDA device (run it on a GPU, or with --device sim)\n");
    return 2;
  }
  if (s.tiny) {
    s.warmup = 1, s.iters = 3, s.step_warmup = 1, s.step_iters = 2, s.conv_warmup = 1, s.conv_iters = 2;
    s.resnet_batch = 2, s.resnet_image = 32;
    s.bert_config = "tiny", s.bert_batch = 2, s.bert_seq = 16;
    s.gpt_config = "tiny", s.gpt_batch = 2, s.gpt_seq = 16;
    s.conv_batch = 2;
  }
  if (warmup) s.warmup = s.conv_warmup = *warmup;
  if (iters) s.iters = s.conv_iters = *iters;
  if (step_warmup) s.step_warmup = *step_warmup;
  if (step_iters) s.step_iters = *step_iters;
  if (resnet_batch) s.resnet_batch = *resnet_batch;
  if (resnet_image) s.resnet_image = *resnet_image;
  if (bert_batch) s.bert_batch = *bert_batch;
  if (bert_seq) s.bert_seq = *bert_seq;
  if (bert_config) s.bert_config = *bert_config;
  if (gpt_config) s.gpt_config = *gpt_config;
  if (gpt_batch) s.gpt_batch = *gpt_batch;
  if (gpt_seq) s.gpt_seq = *gpt_seq;
  s.raw = s.device.type == DeviceType::CUDA && raw::available();
  if (!json_path.empty()) std::ofstream(json_path, std::ios::trunc);

  std::printf("gpu_bench on %s%s: medians of %d runs after %d (ops), %d training steps after %d\n",
              s.device.str().c_str(), s.tiny ? " (tiny shapes)" : "", s.iters, s.warmup, s.step_iters, s.step_warmup);
  if (s.device.is_sim()) {
    std::printf("sim: the simulated device on the CPU, to check that every section runs; its figures say "
                "nothing about a GPU. Raw cuBLAS/cuDNN baselines need a CUDA device: chorus rows only "
                "(the copy baseline goes through the sim runtime).\n");
  }
  for (const Entry& e : entries) {
    if (!sections.count(e.name)) continue;
    std::printf("\n## %s: %s\n", e.name.c_str(), e.title.c_str());
    std::fflush(stdout);
    Section section(s, e.name, e.baseline, json_path);
    e.run(s, section);
    section.print();
  }
  return 0;
}
