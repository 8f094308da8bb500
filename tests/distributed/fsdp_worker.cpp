// One process of an FSDP job (fsdp_test starts several, as chorusrun would).
//
//   fsdp_worker equivalence <model> <full_shard|shard_grad_op> [cpu|sim:0] [noprefetch] [accumulate]
//       (model: mlp, transformer, gpt, or gated: an MLP whose middle block has a layer only rank 1 uses)
//       FullyShardedDataParallel + Adam against DDP + Adam on an identical model, float64: the
//       losses, the gradient norms and, after 5 steps, every parameter within 1e-10 (relative);
//       1/N of the elements held per rank; a resharded model's parameters refuse to be read.
//   fsdp_worker scaler
//       an overflow in one rank's shard: ShardedGradScaler skips on every rank, GradScaler on one.
//   fsdp_worker errors
//       another model on one rank, a frozen parameter, a block owning nothing: errors on every rank.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string>

#include "autograd/autocast.h"
#include "distributed/ddp.h"
#include "distributed/fsdp.h"
#include "distributed/init.h"
#include "distributed/sharded_grad_scaler.h"
#include "examples/models/gpt.h"
#include "nn/nn.h"
#include "optim/grad_scaler.h"
#include "optim/optim.h"
#include "tensor/ops.h"
#include "tests/distributed/worker_checks.h"

using namespace chorus;
using namespace chorus::distributed;
using chorus::testing::check;
using chorus::testing::expect_error;
using chorus::testing::g_failures;
using chorus::testing::g_rank;
namespace F = chorus::nn::functional;

namespace {

constexpr int64_t kPerRank = 3, kSeq = 8;

// A layer whose second half (`gate`) only rank 1 uses: on the other ranks its parameters get no
// gradient, in the middle of a block the others' backward goes through (as a per-rank expert
// would). FSDP must issue the same collectives in the same order on every rank anyway
// (fsdp.cpp, [Reductions before the next gather]); DDP needs find_unused_parameters.
struct GatedLinear : nn::Module {
  std::shared_ptr<nn::Linear> main, gate;
  GatedLinear(int64_t in, int64_t out) : nn::Module("GatedLinear") {
    main = register_module("main", std::make_shared<nn::Linear>(in, out));
    gate = register_module("gate", std::make_shared<nn::Linear>(in, out));
  }
  Tensor forward(const Tensor& x) override {
    Tensor y = main->forward(x);
    return g_rank == 1 ? y + gate->forward(x) : y;
  }
};

// A model as blocks, its data, its loss on the last block's outputs and on the whole model.
struct Workload {
  pipeline::BlockModel blocks;
  std::shared_ptr<nn::Module> root;
  std::function<Tensor(const TensorList& outputs, const TensorList& targets)> loss;
  std::function<Tensor(const TensorList& inputs, const TensorList& targets)> whole_loss;
  std::function<void(int64_t n, uint64_t seed, TensorList& inputs, TensorList& targets)> data;
};

Workload make_workload(const std::string& kind) {
  Workload w;
  manual_seed(42);
  if (kind == "gpt") {
    models::GPTConfig c = models::GPTConfig::named("tiny");
    auto gpt = std::make_shared<models::GPT2LMHeadModel>(c);
    gpt->to(kFloat64);
    w.root = gpt;
    w.blocks = gpt->pipeline_blocks();
    w.loss = models::GPT2LMHeadModel::pipeline_loss;
    w.whole_loss = [gpt](const TensorList& in, const TensorList& tg) { return gpt->loss(in[0], tg[0]); };
    w.data = [c](int64_t n, uint64_t s, TensorList& in, TensorList& tg) {
      manual_seed(s);
      Tensor tokens = randint(0, c.vocab_size, {n, kSeq + 1});
      in = {tokens.narrow(1, 0, kSeq).contiguous()};
      tg = {tokens.narrow(1, 1, kSeq).contiguous()};
    };
    return w;
  }
  auto seq = std::make_shared<nn::Sequential>();
  if (kind == "gated") {
    seq->push_back(std::make_shared<nn::Linear>(10, 24));
    seq->push_back(std::make_shared<nn::Tanh>());
    seq->push_back(std::make_shared<GatedLinear>(24, 17));
    seq->push_back(std::make_shared<nn::ReLU>());
    seq->push_back(std::make_shared<nn::Linear>(17, 5));
  } else if (kind == "mlp") {
    seq->push_back(std::make_shared<nn::Linear>(10, 24));
    seq->push_back(std::make_shared<nn::Tanh>());
    seq->push_back(std::make_shared<nn::Linear>(24, 17));  // 17 x 24 + 17: not a multiple of 2, 3 or 4
    seq->push_back(std::make_shared<nn::ReLU>());
    seq->push_back(std::make_shared<nn::Linear>(17, 5));
  } else if (kind == "transformer") {
    nn::TransformerEncoderLayerOptions o;
    o.dim_feedforward = 16;
    o.dropout = 0.0;
    o.batch_first = true;
    seq->push_back(std::make_shared<nn::TransformerEncoderLayer>(8, 2, o));
    seq->push_back(std::make_shared<nn::TransformerEncoderLayer>(8, 2, o));
    seq->push_back(std::make_shared<nn::Flatten>());
    seq->push_back(std::make_shared<nn::Linear>(4 * 8, 5));
  } else {
    fail("fsdp_worker: unknown model '{}'", kind);
  }
  seq->to(kFloat64);
  w.root = seq;
  w.blocks = pipeline::blocks_of(seq);
  w.loss = [](const TensorList& out, const TensorList& tg) { return F::cross_entropy(out[0], tg[0]); };
  w.whole_loss = [seq](const TensorList& in, const TensorList& tg) { return F::cross_entropy(seq->forward(in[0]), tg[0]); };
  w.data = [kind](int64_t n, uint64_t s, TensorList& in, TensorList& tg) {
    manual_seed(s);
    in = {kind == "transformer" ? randn({n, 4, 8}, {.dtype = kFloat64}) : randn({n, 10}, {.dtype = kFloat64})};
    tg = {randint(0, 5, {n})};
  };
  return w;
}

double relative_difference(const Tensor& a, const Tensor& b) {
  const double scale = std::max(b.abs().max().item<double>(), 1e-300);
  return (a - b).abs().max().item<double>() / scale;
}

void scenario_equivalence(const std::shared_ptr<ProcessGroup>& pg, const std::string& kind, const std::string& strategy,
                          Device device, bool prefetch, int accumulate) {
  const int rank = pg->rank(), world = pg->size();
  const std::string what = fmt::format("{} {} on {} (world {}{}{})", kind, strategy, device.str(), world,
                                       prefetch ? "" : ", no prefetch", accumulate > 1 ? ", accumulating" : "");
  Workload mine = make_workload(kind), ref = make_workload(kind);
  mine.root->to(device);
  ref.root->to(device);
  FSDPOptions options;
  options.sharding_strategy = parse_sharding_strategy(strategy);
  options.prefetch = prefetch;
  // Matrices and the rest in flat parameters of their own, as a weight-decay split would.
  options.flat_group = [](const std::string&, const Tensor& p) { return p.dim() >= 2 ? "matrix" : "other"; };
  FullyShardedDataParallel fsdp(mine.blocks, pg, options);
  auto ddp = std::make_shared<DistributedDataParallel>(ref.root, pg, DDPOptions{.find_unused_parameters = kind == "gated"});
  // eps 1e-4, not 1e-8: the attention's key bias has a gradient of exactly zero in exact
  // arithmetic (softmax ignores a constant added to every score), so both sides hold rounding
  // noise of ~1e-17 there, which Adam with eps 1e-8 would blow up to steps of +-lr in either
  // direction (1e-6 still left 2e-10); 1e-4 keeps that noise far below the tolerance.
  const optim::AdamOptions adam{.lr = 0.01, .eps = 1e-4, .weight_decay = 0.01};
  optim::Adam opt(fsdp.parameters(), adam);
  optim::Adam ref_opt(ref.root->parameters(), adam);
  double worst_loss = 0, worst_norm = 0;
  for (int step = 0; step < 5; ++step) {
    opt.zero_grad();
    ref_opt.zero_grad();
    for (int a = 0; a < accumulate; ++a) {
      TensorList in, tg;
      mine.data(kPerRank * world, 100 + 10 * step + a, in, tg);
      for (Tensor& t : in) t = t.narrow(0, rank * kPerRank, kPerRank).to(device);
      for (Tensor& t : tg) t = t.narrow(0, rank * kPerRank, kPerRank).to(device);
      Tensor loss = mine.loss(fsdp.forward(in), tg);
      Tensor ref_loss = ddp->forward([&] { return ref.whole_loss(in, tg); });
      loss.backward();
      ref_loss.backward();
      worst_loss = std::max(worst_loss, std::abs(loss.item<double>() - ref_loss.item<double>()));
    }
    const double norm = fsdp.clip_grad_norm_(0.05), ref_norm = optim::clip_grad_norm_(ref.root->parameters(), 0.05);
    worst_norm = std::max(worst_norm, std::abs(norm - ref_norm) / ref_norm);
    check(norm > 0.05, what + fmt::format(": gradient norm {} not above the clipping bound (clipping untested)", norm));
    opt.step();
    ref_opt.step();
  }
  check(worst_loss <= 1e-12, what + fmt::format(": losses differ from DDP's by up to {}", worst_loss));
  check(worst_norm <= 1e-10, what + fmt::format(": gradient norms differ from DDP's by up to {} (relative)", worst_norm));
  const nn::NamedTensors got = fsdp.full_state_dict(), want = ref.root->state_dict();
  check(got.size() == want.size(), what + fmt::format(": {} state entries, DDP's model {}", got.size(), want.size()));
  double worst = 0;
  std::string worst_name;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    check(got[i].first == want[i].first, what + fmt::format(": entry {} is '{}', expected '{}'", i, got[i].first, want[i].first));
    const double d = relative_difference(got[i].second, want[i].second.cpu());
    if (d > worst) {
      worst = d;
      worst_name = got[i].first;
    }
  }
  check(worst <= 1e-10, what + fmt::format(": '{}' differs from DDP + Adam's by {} (relative)", worst_name, worst));
  // Sharded: each rank steps ceil(n / world) elements per flat parameter.
  const int64_t flats = static_cast<int64_t>(fsdp.parameters().size());
  check(fsdp.shard_numel() * world >= fsdp.numel() && fsdp.shard_numel() * world < fsdp.numel() + flats * world,
        what + fmt::format(": {} elements per rank for {} in all", fsdp.shard_numel(), fsdp.numel()));
  std::printf("rank %d: %s: losses within %.2e, norms within %.2e, parameters within %.2e; %lld of %lld elements here\n",
              rank, what.c_str(), worst_loss, worst_norm, worst, static_cast<long long>(fsdp.shard_numel()),
              static_cast<long long>(fsdp.numel()));
  // Between steps the model's own parameters hold no memory: reading one is a clear error.
  expect_error([&] { (void)mine.root->parameters().front().sum().item<double>(); }, {"storage is released"},
               what + ": a resharded parameter read outside forward");
}

// Sharded checkpoints. "save": 3 steps of a global batch of 12 rows (each rank its share), a
// checkpoint in `dir`, 2 more steps; a fresh wrapper resumed from the checkpoint takes the same 2
// steps to the same parameters bit for bit; the folder read whole (load_fsdp_model) is the model of
// step 3 and loads into a one-process model; rank 0 writes the final state to dir/expected. "reshard":
// at another world size, resumed from that checkpoint, the same 2 steps end within 1e-10 of it.
void scenario_checkpoint(const std::shared_ptr<ProcessGroup>& pg, const std::string& kind, const std::string& strategy,
                         const std::string& dir, const std::string& mode) {
  const int rank = pg->rank(), world = pg->size();
  constexpr int64_t kGlobal = 12;
  FSDPOptions options;
  options.sharding_strategy = parse_sharding_strategy(strategy);
  options.flat_group = [](const std::string&, const Tensor& p) { return p.dim() >= 2 ? "matrix" : "other"; };
  const optim::AdamOptions adam{.lr = 0.01, .eps = 1e-4, .weight_decay = 0.01};
  struct Run {
    Workload w;
    std::unique_ptr<FullyShardedDataParallel> fsdp;
    std::unique_ptr<optim::Adam> opt;
    std::unique_ptr<optim::StepLR> sched;
  };
  auto make = [&] {
    Run r{make_workload(kind), nullptr, nullptr, nullptr};
    r.fsdp = std::make_unique<FullyShardedDataParallel>(r.w.blocks, pg, options);
    r.opt = std::make_unique<optim::Adam>(r.fsdp->parameters(), adam);
    r.sched = std::make_unique<optim::StepLR>(*r.opt, 2, 0.5);
    return r;
  };
  auto train = [&](Run& r, int from, int to) {
    for (int step = from; step < to; ++step) {
      TensorList in, tg;
      r.w.data(kGlobal, 500 + step, in, tg);
      const int64_t share = kGlobal / world;
      for (Tensor& t : in) t = t.narrow(0, rank * share, share);
      for (Tensor& t : tg) t = t.narrow(0, rank * share, share);
      r.opt->zero_grad();
      r.w.loss(r.fsdp->forward(in), tg).backward();
      r.fsdp->clip_grad_norm_(0.05);
      r.opt->step();
      r.sched->step();
    }
  };
  auto max_difference = [](const nn::NamedTensors& a, const nn::NamedTensors& b) {
    check(a.size() == b.size(), fmt::format("{} entries against {}", a.size(), b.size()));
    double worst = 0;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
      check(a[i].first == b[i].first, fmt::format("entry '{}' against '{}'", a[i].first, b[i].first));
      worst = std::max(worst, relative_difference(a[i].second.cpu(), b[i].second.cpu()));
    }
    return worst;
  };
  if (mode == "save") {
    Run a = make();
    train(a, 0, 3);
    a.fsdp->save_checkpoint(dir, *a.opt, a.sched.get(), 0, 3, {{"model", kind}});
    const nn::NamedTensors at3 = a.fsdp->full_state_dict();
    train(a, 3, 5);
    const nn::NamedTensors final_a = a.fsdp->full_state_dict();
    Run b = make();
    expect_error([&] { b.fsdp->load_checkpoint(dir, *b.opt, b.sched.get(), {{"model", "cnn"}}); },
                 {"written with model " + kind + ", not the cnn"}, "a checkpoint of another model");
    const nn::Checkpoint c = b.fsdp->load_checkpoint(dir, *b.opt, b.sched.get(), {{"model", kind}});
    check(c.step == 3, fmt::format("resumed at step {}, expected 3", c.step));
    train(b, 3, 5);
    check(max_difference(b.fsdp->full_state_dict(), final_a) == 0, "resumed at the same world size: not bit-exact");
    // Read whole: the model of step 3, loadable into a one-process model.
    const nn::NamedTensors whole = load_fsdp_model(dir);
    check(max_difference(whole, at3) == 0, "load_fsdp_model differs from the model at step 3");
    Workload plain = make_workload(kind);
    plain.root->load_state_dict(whole);
    check(max_difference(plain.root->state_dict(), at3) == 0, "a one-process model loaded from the folder");
    // One rank's file damaged (a copy of the folder, a byte of rank 1's last tensor flipped): every
    // rank's load fails, rank 1 naming the checksum and the others naming rank 1's failure, rather
    // than the others resuming and hanging in the next step's first collective.
    const std::string damaged = dir + "_damaged";
    if (rank == 0) {
      namespace fs = std::filesystem;
      fs::remove_all(damaged);
      fs::copy(dir, damaged);
      std::string rank1;
      for (const auto& e : fs::directory_iterator(damaged)) {
        const std::string name = e.path().filename().string();
        if (name.find(fmt::format("-rank1-of-{}.safetensors", world)) != std::string::npos) rank1 = e.path().string();
      }
      check(!rank1.empty(), "the damaged copy has no rank-1 file");
      std::fstream f(rank1, std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(-3, std::ios::end);
      const char byte = static_cast<char>(f.get() ^ 0x40);
      f.seekp(-3, std::ios::end);
      f.put(byte);
    }
    pg->barrier()->wait();
    Run d = make();
    if (rank == 1) {
      expect_error([&] { d.fsdp->load_checkpoint(damaged, *d.opt, d.sched.get(), {{"model", kind}}); },
                   {"loading the checkpoint in " + damaged + " failed", "does not match its checksum"},
                   "the rank whose file is damaged");
    } else {
      expect_error([&] { d.fsdp->load_checkpoint(damaged, *d.opt, d.sched.get(), {{"model", kind}}); },
                   {"loading the checkpoint in " + damaged + " failed on 1 other rank(s)"},
                   "a rank whose own file is sound");
    }
    expect_error([&] { d.fsdp->load_checkpoint(dir, *d.opt, d.sched.get(), {{"model", kind}, {"data", "x"}}); },
                 {"does not say which data it was written with"}, "an identity key the checkpoint lacks");
    if (rank == 0) nn::save_safetensors(dir + "/expected.safetensors", final_a);
    std::printf("rank %d: %s %s checkpoint at world %d: resumed bit-exactly, read whole; a damaged rank-1 file fails "
                "every rank\n",
                rank, kind.c_str(), strategy.c_str(), world);
  } else {
    Run b = make();
    const nn::Checkpoint c = b.fsdp->load_checkpoint(dir, *b.opt, b.sched.get());
    check(c.step == 3, fmt::format("resumed at step {}, expected 3", c.step));
    train(b, 3, 5);
    const double d = max_difference(b.fsdp->full_state_dict(), nn::load_safetensors(dir + "/expected.safetensors").tensors);
    check(d <= 1e-10, fmt::format("resharded to world {}: {} from the saved world's run (relative)", world, d));
    std::printf("rank %d: %s %s checkpoint resharded to world %d: within %.2e of the saved world's run\n", rank,
                kind.c_str(), strategy.c_str(), world, d);
  }
}

// Mixed precision: param_dtype bfloat16 (gathers and compute in bf16 under bf16 autocast, float32
// shards) against DDP in float32, SGD: every loss within 2% and, after 3 steps, every parameter
// within 5% of the largest change DDP made (bf16 rounds to 3 significant digits); shards and full_state_dict
// stay float32 while the model's parameters are bf16.
void scenario_mixed(const std::shared_ptr<ProcessGroup>& pg, const std::string& kind) {
  const int rank = pg->rank(), world = pg->size();
  Workload mine = make_workload(kind), ref = make_workload(kind);
  mine.root->to(kFloat32);
  ref.root->to(kFloat32);
  nn::NamedTensors start = ref.root->state_dict();
  for (auto& [name, t] : start) t = t.clone();  // state_dict() aliases the live parameters
  FSDPOptions options;
  options.param_dtype = kBFloat16;
  FullyShardedDataParallel fsdp(mine.blocks, pg, options);
  check(fsdp.module().parameters().front().dtype() == kBFloat16, "mixed: the model's parameters are bf16");
  check(fsdp.parameters().front().dtype() == kFloat32, "mixed: the shards stay float32");
  auto ddp = std::make_shared<DistributedDataParallel>(ref.root, pg, DDPOptions{.find_unused_parameters = kind == "gated"});
  optim::SGD opt(fsdp.parameters(), {.lr = 0.1}), ref_opt(ref.root->parameters(), {.lr = 0.1});
  double worst_loss = 0;
  for (int step = 0; step < 3; ++step) {
    TensorList in, tg;
    mine.data(kPerRank * world, 300 + step, in, tg);
    for (Tensor& t : in) t = t.narrow(0, rank * kPerRank, kPerRank).to(kFloat32);
    for (Tensor& t : tg) t = t.narrow(0, rank * kPerRank, kPerRank);
    if (kind == "gpt") in[0] = in[0].to(kInt64);
    opt.zero_grad();
    ref_opt.zero_grad();
    Tensor loss;
    {
      autocast::AutocastGuard bf16(DeviceType::CPU, kBFloat16);
      loss = mine.loss(fsdp.forward(in), tg);
    }
    loss.backward();
    Tensor ref_loss = ddp->forward([&] { return ref.whole_loss(in, tg); });
    ref_loss.backward();
    opt.step();
    ref_opt.step();
    worst_loss = std::max(worst_loss, std::abs(loss.item<double>() - ref_loss.item<double>()) / ref_loss.item<double>());
  }
  check(worst_loss <= 2e-2, fmt::format("mixed {}: losses differ from float32 DDP's by up to {} (relative)", kind, worst_loss));
  const nn::NamedTensors got = fsdp.full_state_dict(), want = ref.root->state_dict();
  // Against the largest change of any parameter: the attention's key bias has an exactly-zero
  // gradient, so its own "change" is rounding noise, different in bf16 and float32.
  double largest_change = 0, largest_difference = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    check(got[i].second.dtype() == kFloat32, "mixed: full_state_dict in float32: " + got[i].first);
    largest_change = std::max(largest_change, (want[i].second - start[i].second).abs().max().item<double>());
    largest_difference = std::max(largest_difference, (got[i].second - want[i].second).abs().max().item<double>());
  }
  const double worst = largest_difference / std::max(largest_change, 1e-300);
  check(worst > 0, fmt::format("mixed {}: no parameter differs at all from float32 DDP's (bf16 not in use?)", kind));
  check(worst <= 5e-2, fmt::format("mixed {}: parameters' changes differ from DDP's by up to {} of the change", kind, worst));
  std::printf("rank %d: mixed precision %s: losses within %.2e, parameter changes within %.2e of float32 DDP's\n", rank,
              kind.c_str(), worst_loss, worst);
}

// An overflow only one rank's shard holds (rank 1's first shard gets an inf after backward, as a
// float16 step's reduce-scatter would leave it): with distributed::ShardedGradScaler every rank
// skips its step and backs the scale off to 32768; with a plain optim::GradScaler (the case is
// real) rank 1 alone skips and backs off while the others step at 65536.
void scenario_scaler(const std::shared_ptr<ProcessGroup>& pg) {
  const int rank = pg->rank(), world = pg->size();
  for (const bool sharded : {false, true}) {
    Workload w = make_workload("mlp");
    FullyShardedDataParallel fsdp(w.blocks, pg, {});
    optim::SGD opt(fsdp.parameters(), {.lr = 0.1});
    std::unique_ptr<optim::GradScaler> scaler =
        sharded ? std::make_unique<ShardedGradScaler>(pg) : std::make_unique<optim::GradScaler>();
    TensorList in, tg;
    w.data(kPerRank * world, 7, in, tg);
    for (Tensor& t : in) t = t.narrow(0, rank * kPerRank, kPerRank);
    for (Tensor& t : tg) t = t.narrow(0, rank * kPerRank, kPerRank);
    scaler->scale(w.loss(fsdp.forward(in), tg)).backward();
    if (rank == 1) fsdp.parameters().front().mutable_grad().data_ptr<double>()[0] = std::numeric_limits<double>::infinity();
    const bool stepped = scaler->step(opt);
    scaler->update();
    Tensor mine = tensor<double>({stepped ? 1.0 : 0.0, scaler->get_scale()});
    Tensor high = mine.clone(), low = mine.clone();
    pg->allreduce({high}, ReduceOp::Max)->wait();
    pg->allreduce({low}, ReduceOp::Min)->wait();
    const double* h = high.data_ptr<double>();
    const double* l = low.data_ptr<double>();
    if (sharded) {
      check(h[0] == 0.0, fmt::format("ShardedGradScaler: rank {} stepped over an overflow on rank 1", rank));
      check(h[1] == 32768.0 && l[1] == 32768.0,
            fmt::format("ShardedGradScaler: the scales are {} to {}, expected 32768 on every rank", l[1], h[1]));
    } else {
      check(stepped == (rank != 1) && h[1] == 65536.0 && l[1] == 32768.0,
            fmt::format("a plain GradScaler: rank {} stepped {}, scales {} to {} (expected rank 1 alone to skip)", rank,
                        stepped, l[1], h[1]));
    }
  }
  std::printf("rank %d: ShardedGradScaler: every rank skipped an overflow in rank 1's shard\n", rank);
}

void scenario_errors(const std::shared_ptr<ProcessGroup>& pg) {
  {
    Workload w = make_workload("mlp");
    if (pg->rank() == 1) {
      auto seq = std::static_pointer_cast<nn::Sequential>(w.root);
      seq->push_back(std::make_shared<nn::Linear>(5, 5));
      w.blocks = pipeline::blocks_of(seq);
    }
    expect_error([&] { FullyShardedDataParallel f(w.blocks, pg); }, {"rank(s) 1 wrap other blocks", "same model"},
                 "another model on rank 1");
  }
  {
    Workload w = make_workload("mlp");
    w.root->named_parameters().front().second.requires_grad_(false);
    expect_error([&] { FullyShardedDataParallel f(w.blocks, pg); }, {"'0.weight' does not require gradients"},
                 "a frozen parameter");
  }
  {
    Workload w = make_workload("mlp");
    w.blocks.blocks[1].owns = {"9"};
    expect_error([&] { FullyShardedDataParallel f(w.blocks, pg); }, {"block '1' owns '9', which is neither"},
                 "a block owning nothing of the model");
  }
  expect_error([] { parse_sharding_strategy("zero3"); }, {"unknown sharding strategy 'zero3'", "full_shard"},
               "an unknown strategy");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: fsdp_worker <scenario> [args]\n");
    return 2;
  }
  const std::string scenario = argv[1];
  try {
    InitOptions init;
    init.timeout = std::chrono::milliseconds(60000);
    auto pg = init_process_group(init);
    g_rank = pg->rank();
    if (scenario == "equivalence" && argc >= 4) {
      Device device = kCPU;
      bool prefetch = true;
      int accumulate = 1;
      for (int i = 4; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "noprefetch") prefetch = false;
        else if (a == "accumulate") accumulate = 2;
        else device = Device::parse(a);
      }
      scenario_equivalence(pg, argv[2], argv[3], device, prefetch, accumulate);
    } else if (scenario == "checkpoint" && argc == 6) {
      scenario_checkpoint(pg, argv[2], argv[3], argv[4], argv[5]);
    } else if (scenario == "mixed" && argc == 3) {
      scenario_mixed(pg, argv[2]);
    } else if (scenario == "errors") {
      scenario_errors(pg);
    } else if (scenario == "scaler") {
      scenario_scaler(pg);
    } else {
      std::fprintf(stderr, "fsdp_worker: unknown scenario %s\n", scenario.c_str());
      return 2;
    }
    pg->barrier()->wait();  // rank 0 hosts the store: nobody leaves before everyone is done
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: unexpected error in %s: %s\n", g_rank, scenario.c_str(), e.what());
    std::fflush(stderr);
    ::_exit(1);
  }
  destroy_process_group();
  return g_failures == 0 ? 0 : 1;
}
