// One rank of a pipeline test: pipeline_test starts world_size copies of this program (RANK,
// WORLD_SIZE, MASTER_ADDR, MASTER_PORT set as chorusrun sets them); each runs the scenario named by
// argv[1] with real Gloo groups over loopback and exits 0 when everything it checked held.
//
//   equivalence CONFIG...   CONFIG = model/replicas/micro_batches/schedule, e.g. mlp/2,1/4/1f1b:
//                           5 steps of pipelined training end with the parameters (and losses) of
//                           single-process training on the same global batches (float64, 1e-9);
//                           each stage holds at most min(S - i, M) micro-batches under 1F1B and M
//                           under GPipe; the gathered whole-model state equals the reference, and
//                           loaded from a safetensors file into fresh stages it gives them back.
//   checkpoint CONFIG...    sharded checkpoints: a resumed run ends bit for bit where the
//                           uninterrupted one does; the files make the whole model; another plan
//                           is refused.
//   memory                  2 stages, M = 8: stage 0's peak activation bytes under 1F1B are well
//                           below GPipe's.
//   killed                  3 stages; rank 1 dies in the middle of step 2: ranks 0 and 2 fail with
//                           an error naming the pipeline stage and rank 1 within seconds.
//   shape_change            stage 0's output changes width in step 2: a clear error on rank 0, and
//                           rank 1 fails instead of hanging.
//   wrong_device            stages on sim:0; stage 0's output comes back on the CPU in step 2: a
//                           clear error on rank 0, and rank 1 fails instead of hanging.
//   errors                  a plan for another model, and batches of the wrong size, are refused;
//                           so are ranks that disagree on the model or the device, blocks owning
//                           what the model lacks or a buffer on two stages, and wrong tensor counts.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <sstream>

#include <fmt/ranges.h>
#include <string>

#include "distributed/init.h"
#include "distributed/pipeline/pipeline.h"
#include "examples/models/bert.h"
#include "examples/models/gpt.h"
#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "nn/nn.h"
#include "nn/serialize.h"
#include "optim/optim.h"
#include "tensor/ops.h"
#include "tensor/runtime.h"
#include "tests/distributed/stack_dump.h"
#include "tests/distributed/worker_checks.h"

using namespace chorus;
using namespace chorus::distributed;
using namespace chorus::distributed::pipeline;
namespace F = chorus::nn::functional;

namespace {

using chorus::testing::allclose_ratio;
using chorus::testing::check;
using chorus::testing::expect_error;
using chorus::testing::g_failures;
using chorus::testing::g_rank;

double max_abs(const Tensor& t) { return t.to(kFloat64).abs().max().item<double>(); }

// [B, T, D] -> [B, D]
struct MeanOverTime : nn::Module {
  MeanOverTime() : nn::Module("MeanOverTime") {}
  Tensor forward(const Tensor& x) override { return x.mean({1}); }
};

// Identity; on the `at`-th forward after arm() (on the armed rank) the process dies at once.
struct Tripwire : nn::Module {
  Tripwire() : nn::Module("Tripwire") {}
  int armed_at = -1, calls = 0;
  Tensor forward(const Tensor& x) override {
    if (armed_at >= 0 && ++calls == armed_at) {
      std::fflush(stdout);
      ::_exit(0);
    }
    return x;
  }
};

// Identity until `shrink` is set; then drops the last feature column.
struct Shrinker : nn::Module {
  Shrinker() : nn::Module("Shrinker") {}
  bool shrink = false;
  Tensor forward(const Tensor& x) override { return shrink ? x.narrow(1, 0, x.size(1) - 1) : x; }
};

// x + extra(x) on the rows whose first feature is above 2.5, x elsewhere; a micro-batch with no
// such row leaves `extra` out of its graph (as a router or a label-dependent head would), so DDP
// needs find_unused_parameters. Row by row the same function as on the whole batch.
struct Routed : nn::Module {
  std::shared_ptr<nn::Linear> extra;
  Routed() : nn::Module("Routed") { extra = register_module("extra", std::make_shared<nn::Linear>(10, 10)); }
  Tensor forward(const Tensor& x) override {
    const Tensor take = x.narrow(1, 0, 1).gt(2.5);
    if (!any(take).item<bool>()) return x;
    return x + take.to(x.dtype()) * extra->forward(x);
  }
};

// Identity until `to_cpu` is set; then returns its input on the CPU (a tensor built without the
// input's device, as a mask made with zeros() would be).
struct ToCpu : nn::Module {
  ToCpu() : nn::Module("ToCpu") {}
  bool to_cpu = false;
  Tensor forward(const Tensor& x) override { return to_cpu ? x.cpu() : x; }
};

std::shared_ptr<nn::Sequential> make_model(const std::string& kind, uint64_t seed = 42) {
  manual_seed(seed);
  auto net = std::make_shared<nn::Sequential>();
  if (kind == "mlp") {  // 7 layers
    net->push_back(std::make_shared<nn::Linear>(10, 24));
    net->push_back(std::make_shared<nn::Tanh>());
    net->push_back(std::make_shared<nn::Linear>(24, 24));
    net->push_back(std::make_shared<nn::ReLU>());
    net->push_back(std::make_shared<nn::Linear>(24, 16));
    net->push_back(std::make_shared<nn::Tanh>());
    net->push_back(std::make_shared<nn::Linear>(16, 5));
  } else if (kind == "transformer") {  // 6 layers: [B, 4, 6] -> projection, 2 encoder layers, pool, norm, head
    nn::TransformerEncoderLayerOptions o;
    o.dim_feedforward = 16;
    o.dropout = 0.0;
    o.activation = "gelu";
    o.batch_first = true;
    net->push_back(std::make_shared<nn::Linear>(6, 8));
    net->push_back(std::make_shared<nn::TransformerEncoderLayer>(8, 2, o));
    net->push_back(std::make_shared<nn::TransformerEncoderLayer>(8, 2, o));
    net->push_back(std::make_shared<MeanOverTime>());
    net->push_back(std::make_shared<nn::LayerNorm>(Shape{8}));
    net->push_back(std::make_shared<nn::Linear>(8, 5));
  } else if (kind == "routed") {  // 8 layers: a Routed layer, then the mlp's 7
    auto mlp = make_model("mlp", seed);
    net->push_back(std::make_shared<Routed>());
    for (size_t i = 0; i < mlp->size(); ++i) net->push_back((*mlp)[i]);
  } else if (kind == "wide") {  // for the memory scenario: activations much larger than parameters
    net->push_back(std::make_shared<nn::Linear>(64, 512));
    net->push_back(std::make_shared<nn::Tanh>());
    net->push_back(std::make_shared<nn::Tanh>());
    net->push_back(std::make_shared<nn::Tanh>());
    net->push_back(std::make_shared<nn::Linear>(512, 5));
  } else {
    fail("pipeline_worker: unknown model '{}'", kind);
  }
  net->to(kFloat64);
  return net;
}

Tensor make_input(const std::string& kind, int64_t n, uint64_t seed) {
  manual_seed(seed);
  if (kind == "transformer") return randn({n, 4, 6}, {.dtype = kFloat64});
  Tensor x = randn({n, kind == "wide" ? 64 : 10}, {.dtype = kFloat64});
  if (kind == "routed") {
    // Only rows 8 and 11 of 16 take the Routed layer: in 4 micro-batches of 4 rows, 2 for each of
    // 2 replicas (pipeline.cpp, [Replica mapping]), one row of each replica's third micro-batch,
    // whose backward comes after the last (synced) micro-batch's forward under GPipe and 1F1B.
    double* p = x.data_ptr<double>();
    for (int64_t r = 0; r < n; ++r) p[r * 10] = (r == 8 || r == 11) ? 3.0 : std::clamp(p[r * 10], -2.0, 2.0);
  }
  return x;
}

Tensor make_target(int64_t n, uint64_t seed) {
  manual_seed(seed + 1000);
  return randint(0, 5, {n});
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::stoi(item));
  return out;
}

std::string scratch_dir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return tmp ? tmp : "/tmp";
}

optim::SGDOptions sgd_options() { return {.lr = 0.1, .momentum = 0.9}; }

// The plan of a config: even cuts of L blocks; schedule "interleavedV": V chunks per position (the
// replicas list gives the positions), virtual stage k on the ranks of position k mod P.
PipelinePlan test_plan(int L, const std::vector<int>& replicas, int global, int M, const std::string& schedule) {
  if (schedule.rfind("interleaved", 0) != 0) return uniform_plan(L, even_cuts(L, static_cast<int>(replicas.size())),
                                                                 replicas, global, M, schedule);
  const int P = static_cast<int>(replicas.size()), V = std::stoi(schedule.substr(11));
  std::vector<int> all;
  for (int v = 0; v < V; ++v) all.insert(all.end(), replicas.begin(), replicas.end());
  PipelinePlan plan = uniform_plan(L, even_cuts(L, P * V), all, global, M, "1f1b");
  plan.schedule = "interleaved";
  for (int k = P; k < P * V; ++k) plan.stages[k].ranks = plan.stages[k % P].ranks;
  return plan;
}

// Micro-batches a stage holds at once: M under GPipe, min(S - i, M) under 1F1B, and Megatron's
// warm-up + 1 chunks (capped at M V) interleaved.
int expected_in_flight(const std::string& schedule, int S, int stage, int M) {
  if (schedule == "gpipe") return M;
  if (schedule == "1f1b") return std::min(S - stage, M);
  const int V = std::stoi(schedule.substr(11));
  return std::min((S - stage - 1) * 2 + (V - 1) * S + 1, M * V);
}

// ------------------------------------------------------------------ workloads
// A model to pipeline, its single-process reference, and its data: the Sequentials above (one
// tensor per block, cross-entropy), GPT-tiny (token ids -> logits, targets the next tokens) and
// BERT-tiny (input_ids, attention mask and labels travel through the stages; masked-LM loss with
// the same number of labels in every row, so that the row-weighted mean of the parts' means is
// the global batch's mean). All float64 without dropout.
struct Workload {
  BlockModel model;
  std::shared_ptr<nn::Module> root;  // model.model
  MultiLossFn loss;
  // The reference's loss on a whole batch (one process, no micro-batches).
  std::function<Tensor(const TensorList& inputs, const TensorList& targets)> reference_loss;
  std::function<void(int64_t n, uint64_t seed, TensorList& inputs, TensorList& targets)> data;
};

constexpr int64_t kSeq = 12, kLabelsPerRow = 3;

models::GPTConfig gpt_config() { return models::GPTConfig::named("tiny"); }

models::BertConfig bert_config() {
  models::BertConfig c = models::BertConfig::named("tiny");
  c.vocab_size = 384;
  c.max_position_embeddings = 32;
  c.hidden_dropout_prob = c.attention_probs_dropout_prob = 0;
  return c;
}

Workload make_workload(const std::string& kind, uint64_t seed = 42, DType dtype = kFloat64) {
  Workload w;
  if (kind == "gpt") {
    manual_seed(seed);
    auto gpt = std::make_shared<models::GPT2LMHeadModel>(gpt_config());
    gpt->to(dtype);
    w.model = gpt->pipeline_blocks();
    w.loss = models::GPT2LMHeadModel::pipeline_loss;
    w.reference_loss = [gpt](const TensorList& in, const TensorList& tg) { return gpt->loss(in[0], tg[0]); };
    w.data = [](int64_t n, uint64_t s, TensorList& in, TensorList& tg) {
      manual_seed(s);
      Tensor tokens = randint(0, gpt_config().vocab_size, {n, kSeq + 1});
      in = {tokens.narrow(1, 0, kSeq).contiguous()};
      tg = {tokens.narrow(1, 1, kSeq).contiguous()};
    };
  } else if (kind == "bert") {
    manual_seed(seed);
    auto bert = std::make_shared<models::BertForPreTraining>(bert_config());
    bert->to(dtype);
    w.model = bert->pipeline_blocks();
    w.loss = models::BertForPreTraining::pipeline_loss;
    w.reference_loss = [bert](const TensorList& in, const TensorList&) {
      return bert->masked_lm_loss(in[0], in[1], in[2]);
    };
    w.data = [](int64_t n, uint64_t s, TensorList& in, TensorList& tg) {
      manual_seed(s);
      Tensor ids = randint(0, bert_config().vocab_size, {n, kSeq});
      // Odd rows are padded over their last 4 tokens; every row has kLabelsPerRow labels among the
      // first 8 (unpadded) tokens, at positions 1, 4, 7 shifted by the row.
      Tensor mask = ones({n, kSeq}, {.dtype = kInt64});
      Tensor labels = full({n, kSeq}, int64_t{-100}, {.dtype = kInt64});
      int64_t* mp = mask.data_ptr<int64_t>();
      int64_t* lp = labels.data_ptr<int64_t>();
      const int64_t* ip = ids.data_ptr<int64_t>();
      for (int64_t r = 0; r < n; ++r) {
        if (r % 2 == 1)
          for (int64_t t = kSeq - 4; t < kSeq; ++t) mp[r * kSeq + t] = 0;
        for (int64_t k = 0; k < kLabelsPerRow; ++k) {
          const int64_t t = (1 + 3 * k + r) % 8;
          lp[r * kSeq + t] = (ip[r * kSeq + t] * 7 + 3) % bert_config().vocab_size;
        }
      }
      in = {ids, mask, labels};
      tg = {};
    };
  } else {
    auto seq = make_model(kind, seed);
    w.model = blocks_of(seq);
    w.loss = [](const TensorList& out, const TensorList& tg) { return F::cross_entropy(out[0], tg[0]); };
    w.reference_loss = [seq](const TensorList& in, const TensorList& tg) {
      return F::cross_entropy(seq->forward(in[0]), tg[0]);
    };
    w.data = [kind](int64_t n, uint64_t s, TensorList& in, TensorList& tg) {
      in = {make_input(kind, n, s)};
      tg = {make_target(n, s)};
    };
  }
  w.root = w.model.model;
  return w;
}

// The tied parameter of a workload (held by its first and last stages), or "".
std::string tied_name(const std::string& kind) {
  if (kind == "gpt") return "transformer.wte.weight";
  if (kind == "bert") return "bert.embeddings.word_embeddings.weight";
  return "";
}

// ------------------------------------------------------------------ equivalence
// Element-wise within rtol 1e-10 and atol 1e-13 x max(the reference's largest, 1), in float64. The
// absolute floor is for tensors whose gradient is zero in exact arithmetic (attention's key bias:
// softmax ignores a shift shared by all keys), which hold rounding noise of ~1e-17 after training.
double param_ratio(const Tensor& actual, const Tensor& expected) {
  const double scale = std::max(1.0, max_abs(expected));
  return allclose_ratio(actual, expected, 1e-10, 1e-13 * scale / std::max(max_abs(expected), 1e-300));
}

// Under bfloat16 autocast: how far each parameter is from the reference's, as a share of 5% of how
// far the reference's moved in training (|trained - initial|, at its largest; at least 1e-4, for
// parameters whose gradient is zero in exact arithmetic, such as attention's key bias, which move
// by rounding noise only).
double bf16_ratio(const Tensor& actual, const Tensor& expected, const Tensor& initial) {
  const double moved = std::max(max_abs(expected.cpu() - initial.cpu()), 1e-4);
  return max_abs(actual.cpu() - expected.cpu()) / (0.05 * moved);
}

// Clipping at a norm below the gradients' (about 1-3 here), so that it scales every step.
constexpr double kMaxNorm = 0.25;

// [One reference per model] What single-process training of a workload gives, step by step: the
// losses, the gradient norms (with clipping), the evaluation loss after training, and the initial
// and trained parameters. It depends on the model, autocast and clipping only, not on the plan,
// the micro-batches, the schedule, recomputation or the stages' device, so each worker trains it
// once per (model, bf16, clip) and every config of its job that shares those compares with the
// same one. (Each rank trains the whole model on the whole batch, so recomputing it per config made
// the reference most of a job's work: 6 configs on 4 ranks trained it 24 times.)
struct Reference {
  std::vector<double> losses, grad_norms;
  double eval_loss = 0;
  std::map<std::string, Tensor> initial;
  nn::NamedTensors trained;
};

const Reference& reference_of(const std::string& kind, bool bf16, bool clip, int64_t global, int steps) {
  static std::map<std::string, Reference> memo;
  const std::string key = fmt::format("{}/bf16={}/clip={}/{}x{}", kind, bf16, clip, global, steps);
  if (auto it = memo.find(key); it != memo.end()) return it->second;
  Reference r;
  Workload ref = make_workload(kind, 42, bf16 ? kFloat32 : kFloat64);
  for (auto& [n, t] : ref.root->state_dict()) r.initial[n] = t.clone();
  optim::SGD ref_opt(ref.root->parameters(), sgd_options());
  for (int step = 0; step < steps; ++step) {
    TensorList x, y;
    ref.data(global, 100 + step, x, y);
    ref_opt.zero_grad();
    Tensor loss;
    {
      std::optional<autocast::AutocastGuard> amp;
      if (bf16) amp.emplace(DeviceType::CPU, kBFloat16);
      loss = ref.reference_loss(x, y);
    }
    loss.backward();
    if (clip) {
      const double norm = optim::clip_grad_norm_(ref.root->parameters(), kMaxNorm);
      check(norm > kMaxNorm, fmt::format("{} step {}: the gradient norm {} does not exceed the clipping norm", key, step, norm));
      r.grad_norms.push_back(norm);
    }
    ref_opt.step();
    r.losses.push_back(loss.item<double>());
  }
  {
    TensorList x, y;
    ref.data(global, 999, x, y);
    ref.root->eval();
    NoGradGuard no_grad;
    std::optional<autocast::AutocastGuard> amp;
    if (bf16) amp.emplace(DeviceType::CPU, kBFloat16);
    r.eval_loss = ref.reference_loss(x, y).item<double>();
  }
  for (auto& [n, t] : ref.root->state_dict()) r.trained.emplace_back(n, t.clone());
  return memo.emplace(key, std::move(r)).first->second;
}

void run_equivalence(const std::shared_ptr<ProcessGroup>& pg, const std::string& config) {
  // model/replicas/M/schedule
  std::vector<std::string> parts;
  std::stringstream ss(config);
  std::string item;
  while (std::getline(ss, item, '/')) parts.push_back(item);
  bool recompute = false, clip = false, bf16 = false;
  while (!parts.empty() && (parts.back() == "recompute" || parts.back() == "clip" || parts.back() == "bf16")) {
    (parts.back() == "clip" ? clip : parts.back() == "bf16" ? bf16 : recompute) = true;
    parts.pop_back();
  }
  if (parts.size() != 4 && parts.size() != 5) {
    fail("pipeline_worker: config '{}' is not model/replicas/micro_batches/schedule[/device][/recompute][/clip]", config);
  }
  const Device device = parts.size() == 5 ? Device(parts[4]) : kCPU;
  const std::string kind = parts[0], schedule = parts[3];
  const std::vector<int> replicas = parse_list(parts[1]);
  const int M = std::stoi(parts[2]);
  const int S = static_cast<int>(replicas.size());
  const bool language = kind == "gpt" || kind == "bert";
  const int global = language ? 8 : 16, steps = language ? 3 : 5;

  // bf16: float32 models, every stage's forward and the reference's under bfloat16 autocast.
  const DType dtype = bf16 ? kFloat32 : kFloat64;
  Workload work = make_workload(kind, 42, dtype);
  const Reference& ref = reference_of(kind, bf16, clip, global, steps);
  auto compare = [&](const std::string& name, const Tensor& p, const Tensor& r) {
    return bf16 ? bf16_ratio(p, r, ref.initial.at(name)) : param_ratio(p, r);
  };
  const int L = static_cast<int>(work.model.size());
  work.root->to(device);  // the stages train there; the reference on the CPU
  PipelinePlan plan = test_plan(L, replicas, global, M, schedule);
  PipelineOptions options;
  options.recompute = recompute;
  options.ddp.find_unused_parameters = kind == "routed";
  if (bf16) options.autocast = kBFloat16;
  if (clip) options.max_grad_norm = kMaxNorm;
  PipelineStage stage(std::move(work.model), plan, pg, options);
  work.root.reset();  // the stage holds its own blocks only
  optim::SGD opt(stage.parameters(), sgd_options());
  const std::string tag = fmt::format("[{} stage {} replica {}]", config, stage.stage(), stage.replica());
  // Tied parameters: on the first and last stages of a language model, nowhere else.
  const std::string tied = tied_name(kind);
  const std::vector<std::string> ties = stage.tied_parameters();
  const bool expect_tie = !tied.empty() && S > 1 && (stage.is_first() || stage.is_last());
  check(expect_tie ? ties == std::vector<std::string>{tied} : ties.empty(),
        fmt::format("{}: tied parameters [{}], expected [{}]", tag, fmt::join(ties, ", "), expect_tie ? tied : ""));

  for (int step = 0; step < steps; ++step) {
    TensorList x, y;
    work.data(global, 100 + step, x, y);
    // Only the ranks that need them get the tensors (the others pass empty lists).
    StepStats st = stage.train_step(stage.is_first() ? x : TensorList{}, stage.is_last() ? y : TensorList{}, work.loss, opt);
    if (bf16 && step == 0) {
      // The same model without autocast, to see it took effect.
      NoGradGuard no_grad;
      const double f32 = make_workload(kind, 42, dtype).reference_loss(x, y).item<double>();
      check(std::abs(f32 - st.loss) > 1e-6 * std::abs(f32),
            fmt::format("{}: the pipeline's loss {:.9g} equals float32's {:.9g}: autocast did not take effect", tag, st.loss, f32));
    }
    if (clip) {
      const double norm = ref.grad_norms.at(step);
      check(std::abs(st.grad_norm - norm) <= 1e-10 * norm,
            fmt::format("{} step {}: gradient norm {:.17g}, single-process {:.17g}", tag, step, st.grad_norm, norm));
    }
    const double want = ref.losses.at(step);
    // bf16: the micro-batches' GEMMs round in bfloat16 with other shapes than the whole batch's.
    check(std::abs(st.loss - want) <= (bf16 ? 1e-2 : 1e-9) * std::abs(want),
          fmt::format("{} step {}: loss {:.17g}, single-process {:.17g}", tag, step, st.loss, want));
    const int expect_in_flight = expected_in_flight(schedule, S, stage.stage(), M);
    check(st.max_in_flight == expect_in_flight, fmt::format("{} step {}: held {} micro-batches at once, expected {}", tag,
                                                            step, st.max_in_flight, expect_in_flight));
    check(st.peak_activation_bytes > 0, tag + ": no activation memory was measured");
  }
  // Pipelined evaluation (forward only, eval mode, no gradients): the reference's loss on the
  // same batch; the last stage's outputs for each micro-batch; nothing trains.
  {
    TensorList x, y;
    work.data(global, 999, x, y);
    nn::NamedTensors before_eval = stage.state_dict();  // copies (state_dict shares storage)
    for (auto& [name, t] : before_eval) t = t.cpu().clone();
    EvalStats ev = stage.eval_step(stage.is_first() ? x : TensorList{}, stage.is_last() ? y : TensorList{}, work.loss);
    const double want = ref.eval_loss;
    check(std::abs(ev.loss - want) <= (bf16 ? 1e-2 : 1e-10) * std::abs(want),
          fmt::format("{} eval: loss {:.17g}, single-process {:.17g}", tag, ev.loss, want));
    check(ev.outputs.size() == (stage.is_last() ? static_cast<size_t>(M) : 0u),
          fmt::format("{} eval: {} micro-batches of outputs", tag, ev.outputs.size()));
    check(stage.module()->is_training(), tag + " eval: the stage was left in eval mode");
    const nn::NamedTensors after_eval = stage.state_dict();
    for (size_t i = 0; i < after_eval.size(); ++i) {
      check(max_abs(after_eval[i].second.cpu() - before_eval[i].second) == 0,
            fmt::format("{} eval: {} changed", tag, after_eval[i].first));
    }
  }
  // This rank's parameters against the reference's of the same name.
  const nn::NamedTensors& want_state = ref.trained;
  auto find = [&](const std::string& name) {
    for (auto& [n, t] : want_state) if (n == name) return t;
    fail("pipeline_worker: the reference has no '{}'", name);
  };
  double worst = 0;
  const nn::NamedTensors own = stage.state_dict();
  check(!own.empty(), tag + ": the stage holds no tensors");
  for (auto& [name, p] : own) {
    Tensor r = find(name);
    check(p.device() == device, fmt::format("{}: {} is on {}, expected {}", tag, name, p.device().str(), device.str()));
    const double ratio = compare(name, p, r);
    worst = std::max(worst, ratio);
    check(ratio <= 1, fmt::format("{}: {} differs from single-process training by {:.3g} of the allowed", tag, name, ratio));
  }
  // The whole model, gathered on rank 0: same names, order and values as the reference.
  nn::NamedTensors whole = stage.gather_state_dict(0);
  const std::string path = fmt::format("{}/pipeline_{}.safetensors", scratch_dir(), std::getenv("MASTER_PORT"));
  if (pg->rank() == 0) {
    check(whole.size() == want_state.size(), fmt::format("{}: gathered {} tensors, the model has {}", tag, whole.size(),
                                                         want_state.size()));
    for (size_t i = 0; i < std::min(whole.size(), want_state.size()); ++i) {
      check(whole[i].first == want_state[i].first, fmt::format("{}: gathered entry {} is '{}', expected '{}'", tag, i,
                                                               whole[i].first, want_state[i].first));
      const double ratio = compare(whole[i].first, whole[i].second, want_state[i].second);
      check(ratio <= 1, fmt::format("{}: gathered {} differs by {:.3g} of the allowed", tag, whole[i].first, ratio));
    }
    nn::save_safetensors(path, whole);
  } else {
    check(whole.empty(), tag + ": gather_state_dict returned tensors on a rank other than the destination");
  }
  // Gathered on the last rank too (a replica other than the first of its stage, in some configs).
  const int last = pg->size() - 1;
  nn::NamedTensors at_last = stage.gather_state_dict(last);
  check((pg->rank() == last) == !at_last.empty(), tag + ": gather_state_dict(last rank) returned on the wrong ranks");
  if (pg->rank() == last) {
    check(at_last.size() == want_state.size(), tag + ": gathered on the last rank: wrong count");
    for (size_t i = 0; i < std::min(at_last.size(), want_state.size()); ++i) {
      const double ratio = compare(at_last[i].first, at_last[i].second, want_state[i].second);
      check(at_last[i].first == want_state[i].first && ratio <= 1,
            fmt::format("{}: gathered on rank {}: {} differs by {:.3g} of the allowed", tag, last, at_last[i].first, ratio));
    }
  }
  pg->barrier()->wait();
  // Fresh stages (other initial values) take the checkpoint back.
  Workload fresh_work = make_workload(kind, 7);
  fresh_work.root->to(device);
  PipelineStage fresh(std::move(fresh_work.model), plan, pg);
  fresh.load_state_dict(nn::load_safetensors(path).tensors);
  if (kind == "bert") {
    // BERT's pooler is a tensor no block owns (the masked-LM loss does not use it): a strict load
    // refuses it with the wrong shape on every stage, and without it on stage 0, which saves it.
    const std::string pooler = "bert.pooler.dense.weight";
    nn::NamedTensors wrong = nn::load_safetensors(path).tensors, without;
    for (auto& [name, t] : wrong) {
      if (name == pooler) t = zeros({3}, {.dtype = t.dtype()});
    }
    for (const auto& [name, t] : nn::load_safetensors(path).tensors)
      if (name != pooler) without.emplace_back(name, t);
    expect_error([&] { fresh.load_state_dict(wrong); }, {"'" + pooler + "' has shape [3] in the state dict"},
                 tag + ": the pooler with the wrong shape");
    if (fresh.is_first()) {
      expect_error([&] { fresh.load_state_dict(without); }, {"lacks", pooler}, tag + ": stage 0 without the pooler");
    } else {
      fresh.load_state_dict(without);
    }
    fresh.load_state_dict(wrong, /*strict=*/false);  // non-strict: skipped, as a module's
  }
  nn::NamedTensors trained = stage.state_dict(), restored = fresh.state_dict();
  check(trained.size() == restored.size(), tag + ": the fresh stage has other tensors");
  for (size_t i = 0; i < std::min(trained.size(), restored.size()); ++i) {
    check(restored[i].first == trained[i].first && max_abs(restored[i].second.cpu() - trained[i].second.cpu()) == 0,
          fmt::format("{}: {} not restored from the checkpoint", tag, trained[i].first));
  }
  pg->barrier()->wait();
  std::printf("rank %d: %s ok, worst difference %.3g of the allowed\n", pg->rank(), tag.c_str(), worst);
}

// ------------------------------------------------------------------ checkpoint
// Sharded checkpoints (PipelineStage::save_checkpoint): 2 steps of Adam with a StepLR schedule, a
// checkpoint, 2 more steps; fresh stages (other initial values) loaded from the checkpoint and
// trained on the same 2 batches end bit for bit where the first ones did; the files make the whole
// model for a one-process run; a second checkpoint replaces the first's files; another plan is refused.
// The folder holds the manifest and the S stage files pipeline-<step>-stage<s>-of-<S>, nothing else.
void check_checkpoint_folder(const std::string& dir, const std::string& step, int S, const std::string& tag) {
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  std::vector<std::string> want{"pipeline-checkpoint.json"};
  for (int s = 0; s < S; ++s) want.push_back(fmt::format("pipeline-{}-stage{}-of-{}.safetensors", step, s, S));
  std::sort(want.begin(), want.end());
  check(files == want, fmt::format("{}: the folder holds [{}], expected [{}]", tag, fmt::join(files, ", "), fmt::join(want, ", ")));
}

void run_checkpoint(const std::shared_ptr<ProcessGroup>& pg, const std::string& config) {
  std::vector<std::string> parts;
  std::stringstream ss(config);
  std::string item;
  while (std::getline(ss, item, '/')) parts.push_back(item);
  if (parts.size() != 4 && parts.size() != 5) fail("pipeline_worker: config '{}' is not model/replicas/M/schedule[/device]", config);
  const Device device = parts.size() == 5 ? Device(parts[4]) : kCPU;
  const std::string kind = parts[0];
  const std::vector<int> replicas = parse_list(parts[1]);
  const int S = static_cast<int>(replicas.size()), M = std::stoi(parts[2]), global = 8;
  const std::string dir = fmt::format("{}/ckpt_{}_{}", scratch_dir(), std::getenv("MASTER_PORT"), kind);
  auto make = [&](uint64_t seed, PipelinePlan plan) {
    Workload w = make_workload(kind, seed);
    w.root->to(device);
    auto stage = std::make_unique<PipelineStage>(std::move(w.model), std::move(plan), pg);
    auto opt = std::make_unique<optim::Adam>(stage->parameters(), optim::AdamOptions{.lr = 1e-2});
    auto sched = std::make_unique<optim::StepLR>(*opt, 1, 0.5);
    return std::make_tuple(std::move(stage), std::move(opt), std::move(sched), std::move(w));
  };
  const int L = static_cast<int>(make_workload(kind).model.size());
  const PipelinePlan plan = test_plan(L, replicas, global, M, parts[3]);
  // (No structured bindings: clang 14 cannot capture them in the lambdas below.)
  auto first = make(42, plan);
  auto& stage = std::get<0>(first);
  auto& opt = std::get<1>(first);
  auto& sched = std::get<2>(first);
  auto& work = std::get<3>(first);
  const std::string tag = fmt::format("[checkpoint {} stage {} replica {}]", config, stage->stage(), stage->replica());
  auto train = [&](PipelineStage& st, optim::Optimizer& o, optim::LRScheduler& sc, int step) {
    TensorList x, y;
    work.data(global, 300 + step, x, y);
    st.train_step(st.is_first() ? x : TensorList{}, st.is_last() ? y : TensorList{}, work.loss, o);
    sc.step();
  };
  for (int step = 0; step < 2; ++step) train(*stage, *opt, *sched, step);
  stage->save_checkpoint(dir, *opt, sched.get(), 0, 2, {{"model", kind}});
  check(has_pipeline_checkpoint(dir), tag + ": no manifest after save_checkpoint");
  nn::NamedTensors at_two = stage->gather_state_dict(0);
  for (int step = 2; step < 4; ++step) train(*stage, *opt, *sched, step);

  auto second = make(7, plan);
  auto& fresh = std::get<0>(second);
  auto& fresh_opt = std::get<1>(second);
  auto& fresh_sched = std::get<2>(second);
  nn::Checkpoint c = fresh->load_checkpoint(dir, *fresh_opt, fresh_sched.get());
  check(c.step == 2 && c.extra["model"] == kind, fmt::format("{}: loaded step {} of model '{}'", tag, c.step, c.extra["model"]));
  for (int step = 2; step < 4; ++step) train(*fresh, *fresh_opt, *fresh_sched, step);
  nn::NamedTensors a = stage->state_dict(), b = fresh->state_dict();
  check(a.size() == b.size() && !a.empty(), tag + ": the resumed stage holds other tensors");
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    check(a[i].first == b[i].first && max_abs(a[i].second.cpu() - b[i].second.cpu()) == 0,
          fmt::format("{}: {} after resuming differs from the uninterrupted run", tag, a[i].first));
  }
  // The files make the whole model at step 2, which loads strictly into a one-process model.
  if (pg->rank() == 0) {
    int64_t step = -1;
    nn::NamedTensors whole = load_pipeline_model(dir, &step);
    check(step == 2 && whole.size() == at_two.size(),
          fmt::format("{}: the checkpoint's whole model has {} tensors at step {}, expected {} at 2", tag, whole.size(),
                      step, at_two.size()));
    std::map<std::string, Tensor> by_name(whole.begin(), whole.end());
    for (auto& [name, t] : at_two) {
      check(by_name.count(name) && max_abs(by_name[name] - t) == 0, fmt::format("{}: {} in the checkpoint differs", tag, name));
    }
    Workload one = make_workload(kind, 7);
    one.root->load_state_dict(whole);  // strict: every tensor of the model, nothing else
  }
  pg->barrier()->wait();
  // A second checkpoint replaces the first's files.
  stage->save_checkpoint(dir, *opt, sched.get(), 0, 4);
  if (pg->rank() == 0) check_checkpoint_folder(dir, "step4", S, tag + " after the second checkpoint");
  pg->barrier()->wait();
  // Saving the step the manifest names again writes the other generation of names (a crash midway
  // leaves the first set complete), and it loads.
  stage->save_checkpoint(dir, *opt, sched.get(), 0, 4);
  if (pg->rank() == 0) check_checkpoint_folder(dir, "step4b", S, tag + " after saving step 4 again");
  {
    auto again = make(7, plan);
    check(std::get<0>(again)->load_checkpoint(dir, *std::get<1>(again), std::get<2>(again).get()).step == 4,
          tag + ": the second generation does not load");
  }
  // Another plan (other micro-batches) is refused, naming both.
  // The first other micro-batch count the plan allows.
  PipelinePlan other_plan;
  for (int c : {1, 2, 4, 8}) {
    if (c == M) continue;
    try {
      other_plan = test_plan(L, replicas, global, c, parts[3]);
      other_plan.validate(pg->size());
      break;
    } catch (const Error&) {
      other_plan = PipelinePlan();
    }
  }
  check(other_plan.num_stages() > 0, tag + ": no other valid plan to refuse");
  auto third = make(7, other_plan);
  expect_error([&] { std::get<0>(third)->load_checkpoint(dir, *std::get<1>(third), std::get<2>(third).get()); },
               {"was written under another plan", "load_pipeline_model reads the model of any plan"},
               "a checkpoint of another plan");
  pg->barrier()->wait();
  std::printf("rank %d: %s ok\n", pg->rank(), tag.c_str());
}

// ------------------------------------------------------------------ memory
void scenario_memory(const std::shared_ptr<ProcessGroup>& pg) {
  std::map<std::string, StepStats> got;
  for (const std::string run : {"gpipe", "1f1b", "1f1b+recompute"}) {
    const std::string schedule = run == "gpipe" ? "gpipe" : "1f1b";
    auto model = make_model("wide");
    PipelinePlan plan = uniform_plan(5, {4}, {1, 1}, 1024, 8, schedule);
    PipelineOptions options;
    options.recompute = run == "1f1b+recompute";
    PipelineStage stage(model, plan, pg, options);
    model.reset();
    optim::SGD opt(stage.parameters(), sgd_options());
    Tensor x = make_input("wide", 1024, 1), y = make_target(1024, 1);
    for (int step = 0; step < 2; ++step) {
      got[run] = stage.train_step(x, y, [](const Tensor& o, const Tensor& t) { return F::cross_entropy(o, t); }, opt);
    }
  }
  const double g = static_cast<double>(got["gpipe"].peak_activation_bytes);
  const double f = static_cast<double>(got["1f1b"].peak_activation_bytes);
  const double gs = static_cast<double>(got["gpipe"].peak_step_bytes);
  const double fs = static_cast<double>(got["1f1b"].peak_step_bytes);
  std::printf("rank %d: peak activation bytes gpipe %.0f (in flight %d, step peak %.0f), 1f1b %.0f (in flight %d, step "
              "peak %.0f)\n",
              pg->rank(), g, got["gpipe"].max_in_flight, gs, f, got["1f1b"].max_in_flight, fs);
  // Stage i holds 8 micro-batches under GPipe and 2 - i under 1F1B, all of the same size: the
  // activation bytes scale exactly so. Stage 0's activations (128 rows x 512 doubles = 512 KiB per
  // layer output; the three tanh outputs are saved per micro-batch) also dominate what the step allocates.
  const int held = pg->rank() == 0 ? 2 : 1;
  check(got["gpipe"].max_in_flight == 8 && got["1f1b"].max_in_flight == held, "in-flight counts");
  check(g > 0 && std::abs(f * 8 / held - g) <= 0.02 * g,
        fmt::format("1F1B's activation bytes {} are not {}/8 of GPipe's {}", f, held, g));
  // With recomputation, stage 0 keeps per micro-batch only its output (128 x 512 doubles: the
  // input is the caller's); stage 1 its received input and the loss (its layer's saved input is
  // that same tensor).
  const double r = static_cast<double>(got["1f1b+recompute"].peak_activation_bytes);
  std::printf("rank %d: 1f1b with recomputation: peak activation bytes %.0f (in flight %d)\n", pg->rank(), r,
              got["1f1b+recompute"].max_in_flight);
  check(got["1f1b+recompute"].max_in_flight == held, "in-flight count with recomputation");
  if (pg->rank() == 0) {
    check(r <= held * (128 * 512 * 8) * 1.05,
          fmt::format("stage 0 with recomputation holds {} bytes, more than {} outputs of 512 KiB", r, held));
    check(r < f / 2, fmt::format("stage 0: recomputation's {} bytes are not well below 1F1B's {}", r, f));
  }
  if (pg->rank() == 0) {
    check(g >= 8 * 3 * (128 * 512 * 8), fmt::format("stage 0 under GPipe holds {} bytes, less than its 8 x 3 saved tanh outputs", g));
    check(fs < 0.5 * gs, fmt::format("stage 0: 1F1B's step peak {} is not well below GPipe's {}", fs, gs));
  }
}

// ------------------------------------------------------------------ faults
// The MLP with `extra` inserted as layer `at`.
std::shared_ptr<nn::Sequential> mlp_with(std::shared_ptr<nn::Module> extra, size_t at) {
  auto base = make_model("mlp");
  auto net = std::make_shared<nn::Sequential>();
  for (size_t i = 0; i < base->size(); ++i) {
    if (i == at) net->push_back(extra);
    net->push_back((*base)[i]);
  }
  return net;
}

auto cross_entropy = [](const Tensor& o, const Tensor& t) { return F::cross_entropy(o, t); };

void scenario_killed(const std::shared_ptr<ProcessGroup>& pg) {
  auto trip = std::make_shared<Tripwire>();
  auto model = mlp_with(trip, 3);  // 8 layers; the tripwire is layer 3, in stage 1 = [3, 6)
  PipelinePlan plan = uniform_plan(8, {3, 6}, {1, 1, 1}, 16, 4, "1f1b");
  PipelineStage stage(model, plan, pg);
  optim::SGD opt(stage.parameters(), sgd_options());
  Tensor x = make_input("mlp", 16, 1), y = make_target(16, 1);
  stage.train_step(x, y, cross_entropy, opt);  // everyone is up
  if (pg->rank() == 1) trip->armed_at = 2;  // dies at its second forward of the next step
  const auto start = std::chrono::steady_clock::now();
  expect_error([&] { stage.train_step(x, y, cross_entropy, opt); }, {"pipeline stage", "rank 1", "failed in step 1"},
               "a dead neighbour");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  check(s < 10.0, fmt::format("the dead neighbour was noticed within the timeout (took {:.1f} s)", s));
}

// A 2-stage MLP pipeline with `extra` as layer 3 (the last of stage 0) trains one step; then rank 0
// arms `extra` (`arm`) and the second step must fail there with an error holding every one of
// `sender`, and on rank 1 with one holding every one of `receiver`, both within 10 s.
void expect_second_step_fails(const std::shared_ptr<ProcessGroup>& pg, std::shared_ptr<nn::Module> extra,
                              const std::function<void()>& arm, Device device, const std::string& schedule,
                              const std::vector<std::string>& sender, const std::vector<std::string>& receiver,
                              const std::string& what) {
  auto model = mlp_with(std::move(extra), 3);  // layer 3 sees [rows, 24]; stage 0 = layers [0, 4)
  model->to(device);
  PipelinePlan plan = uniform_plan(8, {4}, {1, 1}, 16, 4, schedule);
  PipelineStage stage(model, plan, pg);
  optim::SGD opt(stage.parameters(), sgd_options());
  Tensor x = make_input("mlp", 16, 1), y = make_target(16, 1);
  stage.train_step(x, y, cross_entropy, opt);
  const auto start = std::chrono::steady_clock::now();
  if (pg->rank() == 0) {
    arm();
    expect_error([&] { stage.train_step(x, y, cross_entropy, opt); }, sender, what);
  } else {
    expect_error([&] { stage.train_step(x, y, cross_entropy, opt); }, receiver, "the neighbour of a stage that failed");
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  check(s < 10.0, fmt::format("the failure ended the step within the timeout (took {:.1f} s)", s));
}

void scenario_shape_change(const std::shared_ptr<ProcessGroup>& pg) {
  auto shrink = std::make_shared<Shrinker>();
  expect_second_step_fails(pg, shrink, [&] { shrink->shrink = true; }, kCPU, "gpipe",
                           {"pipeline stage 0 of 2 (rank 0", "SendActivation of micro-batch 0 to rank 1 in step 1 is float64 [4, 23]",
                            "agreed in the first step as float64 [4, 24]"},
                           {"RecvActivation of micro-batch 0 from rank 0"}, "a boundary tensor changing shape");
}

// pipeline.cpp, [Boundary tensors on the stage's device]: stages on sim:0; in step 2 stage 0's
// output comes back on the CPU. Over NCCL the CPU tensor would go through Gloo while the peer's
// receive is an NCCL one (a wrong tensor or a hang); on sim both went through Gloo and training went
// on. Now: a clear error on rank 0 before anything is sent, and rank 1 fails instead of hanging (on
// a device a receive is ordered on the stream and fails at a later synchronization: which
// micro-batch's action reports it depends on timing).
void scenario_wrong_device(const std::shared_ptr<ProcessGroup>& pg) {
  auto mover = std::make_shared<ToCpu>();
  expect_second_step_fails(pg, mover, [&] { mover->to_cpu = true; }, Device::sim(0), "1f1b",
                           {"pipeline stage 0 of 2 (rank 0", "SendActivation of micro-batch 0",
                            "tensor 0 of the stage's output is on cpu, but this stage runs on sim:0"},
                           {"RecvActivation of micro-batch", "from rank 0 failed in step 1"}, "a boundary tensor on another device");
}

void scenario_errors(const std::shared_ptr<ProcessGroup>& pg) {
  auto model = make_model("mlp");
  expect_error([&] { PipelineStage(model, uniform_plan(6, {3}, {1, 1}, 16, 4, "1f1b"), pg); },
               {"the plan has num_layers 6 but the model (Sequential) has 7 blocks"}, "plan for another model");
  expect_error([&] { PipelineStage(model, uniform_plan(7, {3}, {2, 1}, 16, 4, "1f1b"), pg); },
               {"stage 1 names rank 2; expected ranks in [0, 2)"}, "plan for another world size");
  // Models given as blocks: a cut for another model, ranks that disagree on the model or the
  // device, blocks owning what the model lacks or a buffer on two stages, a wrong tensor count.
  expect_error([&] { PipelineStage(make_workload("gpt").model, uniform_plan(5, {2}, {1, 1}, 8, 2, "1f1b"), pg); },
               {"the plan has num_layers 5 but the model (GPT2LMHeadModel) has 4 blocks"}, "GPT plan for another model");
  {
    Workload w = make_workload("gpt");
    if (pg->rank() == 1) w.root->to(Device("sim:0"));
    expect_error([&] { PipelineStage(std::move(w.model), uniform_plan(4, {2}, {1, 1}, 8, 2, "1f1b"), pg); },
                 {"rank 1 (stage 1) runs on sim but rank 0 (stage 0) on cpu",
                  "every stage of a pipeline must run on the same kind of device"},
                 "stages on different kinds of device");
  }
  {
    Workload w = make_workload("gpt");
    if (pg->rank() == 1) w.model.blocks[1].owns = {"transformer.h.1"};
    expect_error([&] { PipelineStage(std::move(w.model), uniform_plan(4, {2}, {1, 1}, 8, 2, "1f1b"), pg); },
                 {"rank 1 (stage 1) built a model of 4 blocks that differs from rank 0's", "every rank must build the same model"},
                 "ranks with different models");
  }
  {
    Workload w = make_workload("gpt");
    w.model.blocks[3].owns.push_back("transformer.lm_head.weight");
    expect_error([&] { PipelineStage(std::move(w.model), uniform_plan(4, {2}, {1, 1}, 8, 2, "1f1b"), pg); },
                 {"block 'head' owns 'transformer.lm_head.weight', which is neither a module nor a parameter or buffer"},
                 "a block owning what the model lacks");
  }
  {
    auto net = std::make_shared<nn::Sequential>();
    net->push_back(std::make_shared<nn::Linear>(4, 4));
    net->push_back(std::make_shared<nn::BatchNorm1d>(4));
    BlockModel bm = blocks_of(net);
    bm.blocks[0].owns.push_back("1.running_mean");
    expect_error([&] { PipelineStage(std::move(bm), uniform_plan(2, {1}, {1, 1}, 8, 2, "1f1b"), pg); },
                 {"buffer '1.running_mean' is owned by blocks of stages 0 and 1; only parameters can be tied"},
                 "a buffer on two stages");
  }
  {
    Workload w = make_workload("bert");
    expect_error([&] { w.model.blocks.back().forward({zeros({2, 4})}); },
                 {"block 'head' was given 1 tensor(s); expected 3 (hidden states, additive mask, labels)"},
                 "a block given the wrong number of tensors");
  }
  PipelineStage stage(model, uniform_plan(7, {3}, {1, 1}, 16, 4, "1f1b"), pg);
  optim::SGD opt(stage.parameters(), sgd_options());
  Tensor x = make_input("mlp", 16, 1), y = make_target(16, 1);
  if (stage.is_first()) {
    expect_error([&] { stage.train_step(x.narrow(0, 0, 15), y, cross_entropy, opt); },
                 {"pipeline stage 0 of 2 (rank 0", "input has shape [15, 10]; expected 16 rows"}, "short input");
  } else {
    expect_error([&] { stage.train_step(Tensor(), Tensor(), cross_entropy, opt); },
                 {"target has shape (undefined); expected 16 rows"}, "missing target");
  }
  expect_error([&] { stage.load_state_dict({{"encoder.weight", zeros({2})}}); },
               {"key 'encoder.weight' is not a parameter or buffer of the model"}, "foreign checkpoint");
  expect_error([&] { stage.load_state_dict({{"0.weight", zeros({24, 10}, {.dtype = kFloat64})}}); },
               {stage.is_first() ? "0.bias" : "6.weight"}, "checkpoint missing this stage's tensors");
  // Nothing was sent: the stages still train together.
  StepStats st = stage.train_step(x, y, cross_entropy, opt);
  check(std::isfinite(st.loss) && st.loss > 0, fmt::format("a step after refused ones has loss {}", st.loss));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: pipeline_worker <scenario> [args]\n");
    return 2;
  }
  const std::string scenario = argv[1];
  chorus::testing::dump_stacks_after_env();
  const bool faulty = scenario == "killed" || scenario == "shape_change" || scenario == "wrong_device";
  try {
    InitOptions init;
    init.timeout = std::chrono::milliseconds(faulty ? 2000 : 60000);
    init.backend = chorus::testing::test_backend(init.backend);  // multiprocess_gpu_test: NCCL stages
    auto pg = init_process_group(init);
    g_rank = pg->rank();
    chorus::testing::use_side_streams_if_asked();
    if (scenario == "equivalence") {
      for (int i = 2; i < argc; ++i) run_equivalence(pg, argv[i]);
    } else if (scenario == "checkpoint") {
      for (int i = 2; i < argc; ++i) run_checkpoint(pg, argv[i]);
    } else if (scenario == "memory") {
      scenario_memory(pg);
    } else if (scenario == "killed") {
      scenario_killed(pg);
    } else if (scenario == "shape_change") {
      scenario_shape_change(pg);
    } else if (scenario == "wrong_device") {
      scenario_wrong_device(pg);
    } else if (scenario == "errors") {
      scenario_errors(pg);
    } else {
      std::fprintf(stderr, "pipeline_worker: unknown scenario %s\n", scenario.c_str());
      return 2;
    }
    if (faulty) {
      // A group with a dead peer: skip the orderly teardown.
      std::fflush(stdout);
      std::fflush(stderr);
      ::_exit(g_failures == 0 ? 0 : 1);
    }
    pg->barrier()->wait();  // rank 0 hosts the store: nobody leaves before everyone is done
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: unexpected error in %s: %s\n", g_rank, scenario.c_str(), e.what());
    std::fflush(stderr);
    ::_exit(1);
  }
  std::fflush(stdout);
  return g_failures == 0 ? 0 : 1;
}
