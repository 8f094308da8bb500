// The multi-tensor ("foreach" / fused) optimizer steps against the per-tensor steps: SGD (plain,
// momentum, dampening, Nesterov, weight decay), Adam (amsgrad, L2) and AdamW over many random
// tensors of varied sizes (empty, one element, odd sizes, more than a thread's share and more than
// one CUDA chunk), float32 and float64, several steps: parameters and state equal bit for bit. On
// sim:0 the multi-tensor kernel (one stream task over the whole list) equals the CPU's. Also groups
// whose parameters are at different step counts, groups spanning devices, the state_dict, the
// foreach/fused options, and the errors for bad lists.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "optim/optim.h"
#include "tensor/ops.h"

namespace chorus {
namespace {

const Device kSim = Device::sim(0);

// Sizes a multi-tensor kernel must handle: empty tensors (among others and first), one element,
// odd lengths (vector loop tails), a tensor over kGrainSize (split across threads) and over one
// CUDA chunk of 65536 elements, and several 2-D shapes.
const std::vector<Shape> kShapes = {{0},      {1},     {3},     {7, 5},  {33},    {2, 0, 3}, {1000},
                                    {65537},  {17, 3}, {1},     {129, 257}, {4, 4, 4}, {70001}, {0},
                                    {31, 33}, {2},     {513}};

std::vector<Tensor> random_params(DType dtype, uint64_t seed, Device device = Device::cpu()) {
  Generator gen(seed);
  std::vector<Tensor> out;
  for (const Shape& s : kShapes) out.push_back(randn(s, {.dtype = dtype}, &gen).to(device).requires_grad_());
  return out;
}

std::vector<Tensor> copies(const std::vector<Tensor>& params, Device device) {
  std::vector<Tensor> out;
  for (const Tensor& p : params) out.push_back(p.detach().to(device).clone().requires_grad_());
  return out;
}

// The same random gradients (drawn on the CPU, seeded by step) for every copy of the parameters.
// `has_grad(i)` false leaves parameter i without a gradient this step.
template <typename HasGrad>
void set_grads(std::vector<Tensor>& params, int step, const HasGrad& has_grad) {
  Generator gen(1000 + step);
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor g = randn(params[i].sizes(), {.dtype = params[i].dtype()}, &gen);
    params[i].mutable_grad() = has_grad(i) ? g.to(params[i].device()) : Tensor();
  }
}
void set_grads(std::vector<Tensor>& params, int step) {
  set_grads(params, step, [](size_t) { return true; });
}

void require_same(const std::vector<Tensor>& got, const std::vector<Tensor>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("parameter " << i << " of shape " << shape_str(want[i].sizes()));
    CHECK(equal(got[i].detach().cpu(), want[i].detach().cpu()));
  }
}

void require_same_state(const nn::NamedTensors& got, const nn::NamedTensors& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO(want[i].first);
    REQUIRE(got[i].first == want[i].first);
    CHECK(equal(got[i].second.cpu(), want[i].second.cpu()));
  }
}

// How many parameters differ from `before` somewhere: a step that did nothing would leave 0.
int moved(const std::vector<Tensor>& params, const std::vector<Tensor>& before) {
  int n = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].numel() > 0 && !equal(params[i].detach().cpu(), before[i].detach().cpu())) ++n;
  }
  return n;
}

int nonempty(const std::vector<Tensor>& params) {
  int n = 0;
  for (const Tensor& p : params) n += p.numel() > 0;
  return n;
}

struct SgdCase {
  const char* name;
  optim::SGDOptions options;
};
const std::vector<SgdCase> kSgdCases = {
    {"plain", {.lr = 0.1}},
    {"weight decay", {.lr = 0.1, .weight_decay = 0.01}},
    {"momentum", {.lr = 0.05, .momentum = 0.9}},
    {"momentum, dampening, weight decay", {.lr = 0.05, .momentum = 0.8, .dampening = 0.3, .weight_decay = 1e-3}},
    {"nesterov, weight decay", {.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-2, .nesterov = true}},
};

struct AdamCase {
  const char* name;
  bool decoupled;
  optim::AdamOptions options;
};
const std::vector<AdamCase> kAdamCases = {
    {"Adam", false, {.lr = 1e-2}},
    {"Adam, amsgrad", false, {.lr = 1e-2, .amsgrad = true}},
    {"Adam, L2 weight decay, amsgrad", false, {.lr = 1e-2, .beta1 = 0.8, .weight_decay = 0.05, .amsgrad = true}},
    {"AdamW", true, {.lr = 1e-2, .weight_decay = 0.1}},
    {"AdamW, amsgrad", true, {.lr = 3e-3, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.01, .amsgrad = true}},
};

std::unique_ptr<optim::Optimizer> make_adam(const AdamCase& c, std::vector<optim::ParamGroup> groups,
                                            std::optional<bool> foreach, bool fused = false) {
  optim::AdamOptions o = c.options;
  o.foreach = foreach;
  o.fused = fused;
  if (c.decoupled) return std::make_unique<optim::AdamW>(std::move(groups), o);
  return std::make_unique<optim::Adam>(std::move(groups), o);
}

std::unique_ptr<optim::Optimizer> make_sgd(const SgdCase& c, std::vector<optim::ParamGroup> groups,
                                           std::optional<bool> foreach, bool fused = false) {
  optim::SGDOptions o = c.options;
  o.foreach = foreach;
  o.fused = fused;
  return std::make_unique<optim::SGD>(std::move(groups), o);
}

// Steps a per-tensor optimizer and the foreach and fused ones on copies of the same parameters
// through `steps` steps of the same gradients, on `device`, comparing after every step.
template <typename Make>
void compare_paths(const Make& make, DType dtype, Device device, int steps) {
  const std::vector<Tensor> initial = random_params(dtype, 7);
  std::vector<Tensor> per_tensor = copies(initial, Device::cpu()), foreach = copies(initial, device),
                      fused = copies(initial, device);
  auto ref = make(optim::single_group(per_tensor), false, false);
  auto multi = make(optim::single_group(foreach), true, false);
  auto fuse = make(optim::single_group(fused), std::nullopt, true);
  REQUIRE_FALSE(ref->uses_multi_tensor(ref->param_groups()[0]));
  REQUIRE(multi->uses_multi_tensor(multi->param_groups()[0]));
  REQUIRE(fuse->uses_multi_tensor(fuse->param_groups()[0]));
  for (int step = 0; step < steps; ++step) {
    INFO("step " << step);
    set_grads(per_tensor, step);
    set_grads(foreach, step);
    set_grads(fused, step);
    ref->step();
    multi->step();
    fuse->step();
    require_same(foreach, per_tensor);
    require_same(fused, per_tensor);
  }
  CHECK(moved(per_tensor, initial) == nonempty(initial));
  require_same_state(multi->state_dict(), ref->state_dict());
  require_same_state(fuse->state_dict(), ref->state_dict());
}

}  // namespace

TEST_CASE("SGD: foreach and fused steps equal the per-tensor steps bit for bit on the CPU", "[optim][foreach]") {
  set_num_threads(2);  // the foreach loop splits the lists between threads
  for (const SgdCase& c : kSgdCases) {
    for (DType dtype : {kFloat32, kFloat64}) {
      INFO(c.name << ", " << dtype_name(dtype));
      compare_paths([&](auto groups, std::optional<bool> fe, bool fu) { return make_sgd(c, groups, fe, fu); }, dtype,
                    Device::cpu(), 4);
    }
  }
}

TEST_CASE("Adam and AdamW: foreach and fused steps equal the per-tensor steps bit for bit on the CPU",
          "[optim][foreach]") {
  set_num_threads(2);
  for (const AdamCase& c : kAdamCases) {
    for (DType dtype : {kFloat32, kFloat64}) {
      INFO(c.name << ", " << dtype_name(dtype));
      compare_paths([&](auto groups, std::optional<bool> fe, bool fu) { return make_adam(c, groups, fe, fu); }, dtype,
                    Device::cpu(), 4);
    }
  }
}

TEST_CASE("on sim:0 the multi-tensor kernels equal the CPU's per-tensor steps bit for bit", "[optim][foreach][sim]") {
  for (DType dtype : {kFloat32, kFloat64}) {
    for (const SgdCase& c : {kSgdCases[1], kSgdCases[3], kSgdCases[4]}) {
      INFO(c.name << ", " << dtype_name(dtype));
      compare_paths([&](auto groups, std::optional<bool> fe, bool fu) { return make_sgd(c, groups, fe, fu); }, dtype,
                    kSim, 3);
    }
    for (const AdamCase& c : {kAdamCases[2], kAdamCases[3], kAdamCases[4]}) {
      INFO(c.name << ", " << dtype_name(dtype));
      compare_paths([&](auto groups, std::optional<bool> fe, bool fu) { return make_adam(c, groups, fe, fu); }, dtype,
                    kSim, 3);
    }
  }
}

TEST_CASE("foreach_sgd_step / foreach_adam_step on sim lists equal the CPU kernels", "[optim][foreach][sim]") {
  // The functional form directly, with the state buffers the caller keeps: one sim stream task for
  // the whole list (every buffer named to the sim memory guard, or the task would crash).
  const std::vector<Tensor> cpu_p = random_params(kFloat32, 3);
  std::vector<Tensor> cpu_g, cpu_m, cpu_v;
  Generator gen(4);
  for (const Tensor& p : cpu_p) {
    cpu_g.push_back(randn(p.sizes(), {}, &gen));
    cpu_m.push_back(randn(p.sizes(), {}, &gen).mul(0.1));
    cpu_v.push_back(rand(p.sizes(), {}, &gen).mul(0.01));
  }
  auto on = [](const std::vector<Tensor>& list, Device d) {
    std::vector<Tensor> out;
    for (const Tensor& t : list) out.push_back(t.detach().to(d).clone());
    return out;
  };
  std::vector<Tensor> p1 = on(cpu_p, Device::cpu()), m1 = on(cpu_m, Device::cpu()), v1 = on(cpu_v, Device::cpu());
  std::vector<Tensor> p2 = on(cpu_p, kSim), g2 = on(cpu_g, kSim), m2 = on(cpu_m, kSim), v2 = on(cpu_v, kSim),
                      x2 = on(cpu_v, kSim), x1 = on(cpu_v, Device::cpu());
  const optim::AdamStepOptions adam{.lr = 1e-2, .weight_decay = 0.1, .decoupled = true, .step = 7};
  optim::foreach_adam_step(p1, cpu_g, m1, v1, x1, adam);
  optim::foreach_adam_step(p2, g2, m2, v2, x2, adam);
  const optim::SgdStepOptions sgd{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true};
  optim::foreach_sgd_step(p1, cpu_g, m1, sgd);
  optim::foreach_sgd_step(p2, g2, m2, sgd);
  require_same(p2, p1);
  require_same(m2, m1);
  require_same(v2, v1);
  require_same(x2, x1);
  CHECK(moved(p1, cpu_p) == nonempty(cpu_p));
}

TEST_CASE("parameters at different step counts in one group step as they do one at a time", "[optim][foreach]") {
  // Parameter i gets its first gradient on step i % 3, so its Adam step count (bias corrections)
  // and its SGD momentum buffer's first step lag the others': one group, several launches.
  auto has_grad = [](int step) {
    return [step](size_t i) { return static_cast<int>(i % 3) <= step; };
  };
  for (DType dtype : {kFloat32, kFloat64}) {
    for (const AdamCase& c : {kAdamCases[1], kAdamCases[3]}) {
      INFO(c.name << ", " << dtype_name(dtype));
      const std::vector<Tensor> initial = random_params(dtype, 21);
      std::vector<Tensor> a = copies(initial, Device::cpu()), b = copies(initial, Device::cpu());
      auto ref = make_adam(c, optim::single_group(a), false);
      auto multi = make_adam(c, optim::single_group(b), std::nullopt);
      REQUIRE(multi->uses_multi_tensor(multi->param_groups()[0]));  // the default for one device and dtype
      for (int step = 0; step < 5; ++step) {
        set_grads(a, step, has_grad(step));
        set_grads(b, step, has_grad(step));
        ref->step();
        multi->step();
        require_same(b, a);
      }
      // The step counts do differ within the group: 5 where every step had a gradient, 3 for the latest.
      std::vector<double> steps;
      for (const auto& [name, t] : multi->state_dict()) {
        if (name.size() > 5 && name.substr(name.size() - 5) == ".step") steps.push_back(t.item<double>());
      }
      REQUIRE(steps.size() == initial.size());
      CHECK(*std::min_element(steps.begin(), steps.end()) == 3);
      CHECK(*std::max_element(steps.begin(), steps.end()) == 5);
      require_same_state(multi->state_dict(), ref->state_dict());
    }
    const SgdCase& c = kSgdCases[3];
    INFO(c.name << ", " << dtype_name(dtype));
    const std::vector<Tensor> initial = random_params(dtype, 22);
    std::vector<Tensor> a = copies(initial, Device::cpu()), b = copies(initial, Device::cpu());
    auto ref = make_sgd(c, optim::single_group(a), false);
    auto multi = make_sgd(c, optim::single_group(b), true);
    for (int step = 0; step < 5; ++step) {
      set_grads(a, step, has_grad(step));
      set_grads(b, step, has_grad(step));
      ref->step();
      multi->step();
      require_same(b, a);
    }
    require_same_state(multi->state_dict(), ref->state_dict());
  }
}

TEST_CASE("a foreach group spanning devices and dtypes steps per device and dtype", "[optim][foreach][sim]") {
  // Half the parameters on sim:0, some in float64: foreach is off by default there, and forced on it
  // launches once per (device, dtype) with the results of the per-tensor path.
  std::vector<Tensor> initial = random_params(kFloat32, 31);
  for (size_t i = 0; i < initial.size(); i += 3) initial[i] = initial[i].detach().to(kFloat64).requires_grad_();
  std::vector<Tensor> a = copies(initial, Device::cpu()), b = copies(initial, Device::cpu());
  for (size_t i = 0; i < b.size(); i += 2) b[i] = b[i].detach().to(kSim).requires_grad_();
  optim::AdamW by_default(optim::single_group(b), {.lr = 1e-2, .weight_decay = 0.1});
  CHECK_FALSE(by_default.uses_multi_tensor(by_default.param_groups()[0]));
  optim::AdamW ref(optim::single_group(a), {.lr = 1e-2, .weight_decay = 0.1, .amsgrad = true, .foreach = false});
  optim::AdamW multi(optim::single_group(b), {.lr = 1e-2, .weight_decay = 0.1, .amsgrad = true, .foreach = true});
  CHECK(multi.uses_multi_tensor(multi.param_groups()[0]));
  for (int step = 0; step < 3; ++step) {
    set_grads(a, step);
    set_grads(b, step);
    ref.step();
    multi.step();
    require_same(b, a);
  }
  CHECK(moved(a, initial) == nonempty(initial));
}

TEST_CASE("the state_dict is the same with and without foreach, and loads across them", "[optim][foreach]") {
  const std::vector<Tensor> initial = random_params(kFloat32, 41);
  std::vector<Tensor> a = copies(initial, Device::cpu()), b = copies(initial, Device::cpu()),
                      c = copies(initial, Device::cpu());
  optim::Adam per_tensor(a, {.lr = 1e-2, .amsgrad = true, .foreach = false});
  optim::Adam multi(b, {.lr = 1e-2, .amsgrad = true, .foreach = true});
  for (int step = 0; step < 2; ++step) {
    set_grads(a, step);
    set_grads(b, step);
    per_tensor.step();
    multi.step();
  }
  const nn::NamedTensors saved = per_tensor.state_dict();
  require_same_state(multi.state_dict(), saved);
  for (const auto& [name, t] : saved) {
    INFO(name);
    CHECK(name.find("foreach") == std::string::npos);
    CHECK(name.find("fused") == std::string::npos);
  }
  // A per-tensor checkpoint resumed by a fused optimizer continues as the per-tensor one does.
  for (size_t i = 0; i < c.size(); ++i) {
    NoGradGuard no_grad;
    c[i].copy_(a[i]);
  }
  optim::Adam resumed(c, {.lr = 1e-2, .amsgrad = true, .fused = true});
  resumed.load_state_dict(saved);
  for (int step = 2; step < 4; ++step) {
    set_grads(a, step);
    set_grads(c, step);
    per_tensor.step();
    resumed.step();
    require_same(c, a);
  }
}

TEST_CASE("foreach and fused options: defaults and errors", "[optim][foreach]") {
  Tensor f32 = randn({3}).requires_grad_(), f64 = randn({2}, {.dtype = kFloat64}).requires_grad_();
  optim::SGD uniform({f32, randn({4}).requires_grad_()}, {.lr = 0.1});
  CHECK(uniform.uses_multi_tensor(uniform.param_groups()[0]));
  optim::SGD mixed({f32, f64}, {.lr = 0.1});
  CHECK_FALSE(mixed.uses_multi_tensor(mixed.param_groups()[0]));
  optim::SGD off({f32}, {.lr = 0.1, .foreach = false});
  CHECK_FALSE(off.uses_multi_tensor(off.param_groups()[0]));
  CHECK_THROWS_WITH(optim::SGD({f32}, {.lr = 0.1, .foreach = true, .fused = true}),
                    Catch::Contains("SGD: `fused` and `foreach` cannot both be true"));
  CHECK_THROWS_WITH(optim::AdamW({f32}, {.lr = 0.1, .foreach = true, .fused = true}),
                    Catch::Contains("AdamW: `fused` and `foreach` cannot both be true"));
  Tensor half = randn({2}).to(kFloat16).requires_grad_();
  CHECK_THROWS_WITH(optim::Adam({f32, half}, {.lr = 0.1, .fused = true}),
                    Catch::Contains("fused=true needs float32 or float64 parameters, but parameter 1 of group 0 is "
                                    "float16"));
}

TEST_CASE("foreach steps refuse bad lists with the list, index and expectation named", "[optim][foreach]") {
  std::vector<Tensor> p = {randn({2, 3}), randn({4})}, g = {randn({2, 3}), randn({4})};
  std::vector<Tensor> m = {zeros({2, 3}), zeros({4})}, v = {zeros({2, 3}), zeros({4})};
  const optim::SgdStepOptions sgd{.lr = 0.1, .momentum = 0.9};
  const optim::AdamStepOptions adam{.lr = 0.1};

  CHECK_THROWS_WITH(optim::foreach_sgd_step(p, {g[0]}, m, sgd),
                    Catch::Contains("foreach_sgd_step: grads has 1 tensors, expected 2 (one per tensor of params)"));
  CHECK_THROWS_WITH(optim::foreach_sgd_step(p, g, {m[0]}, sgd),
                    Catch::Contains("momentum_buffers has 1 tensors, expected 2 (one per tensor of params, or none)"));
  CHECK_THROWS_WITH(optim::foreach_adam_step(p, g, m, v, {v[0], v[1], v[1]}, adam),
                    Catch::Contains("foreach_adam_step: max_exp_avg_sqs has 3 tensors, expected 2"));
  CHECK_THROWS_WITH(optim::foreach_sgd_step(p, {g[0], randn({5})}, m, sgd),
                    Catch::Contains("grads[1] has shape [5], expected [4] (the shape of params[1])"));
  CHECK_THROWS_WITH(optim::foreach_adam_step(p, g, {m[0], zeros({4}, {.dtype = kFloat64})}, v, {}, adam),
                    Catch::Contains("exp_avgs[1] is float64, expected float32 (the dtype of params[0])"));
  CHECK_THROWS_WITH(optim::foreach_sgd_step({p[0], randn({4}, {.dtype = kFloat64})}, g, m, sgd),
                    Catch::Contains("params[1] is float64, expected float32 (the dtype of params[0])"));
  CHECK_THROWS_WITH(optim::foreach_adam_step(p, g, m, {v[0], v[1].to(kSim)}, {}, adam),
                    Catch::Contains("exp_avg_sqs[1] is on sim:0, expected cpu (the device of params[0])"));
  CHECK_THROWS_WITH(optim::foreach_sgd_step(p, {g[0].t(), g[1]}, m, sgd),
                    Catch::Contains("grads[0] has shape [3, 2], expected [2, 3]"));
  Tensor strided = randn({3, 2}).t();
  CHECK_THROWS_WITH(optim::foreach_sgd_step(p, {strided, g[1]}, m, sgd),
                    Catch::Contains("grads[0] is not dense in the layout of params[0] (contiguous)"));
  // A channels-last parameter takes its gradient and state channels-last too.
  Tensor pc = randn({2, 3, 4, 5}).contiguous(MemoryFormat::ChannelsLast), gn = randn({2, 3, 4, 5});
  CHECK_THROWS_WITH(optim::foreach_sgd_step({pc}, {gn}, {zeros_like(pc)}, sgd),
                    Catch::Contains("grads[0] is not dense in the layout of params[0] (channels_last)"));
  CHECK_THROWS_WITH(optim::foreach_sgd_step({zeros({2}, {.dtype = kInt64})}, {zeros({2}, {.dtype = kInt64})}, {},
                                            {.lr = 0.1}),
                    Catch::Contains("params[0] is int64; the multi-tensor optimizer steps take float32 or float64"));
  CHECK_THROWS_WITH(optim::foreach_sgd_step({p[0], Tensor()}, g, m, sgd),
                    Catch::Contains("params[1] is an undefined tensor"));
  CHECK_THROWS_WITH(optim::foreach_sgd_step(p, g, {}, sgd),
                    Catch::Contains("foreach_sgd_step: momentum is 0.9 but momentum_buffers is empty"));
  CHECK_THROWS_WITH(optim::foreach_sgd_step(p, g, m, {.lr = 0.1}),
                    Catch::Contains("foreach_sgd_step: momentum is 0 but 2 momentum_buffers were given"));
  // Nothing was updated by the refused calls.
  CHECK(equal(m[0], zeros({2, 3})));
  // Empty lists are a no-op, as torch's foreach ops.
  CHECK_NOTHROW(optim::foreach_adam_step({}, {}, {}, {}, {}, adam));
}

}  // namespace chorus

namespace chorus {
namespace {

// SGD (momentum, Nesterov, weight decay) and Adam(W) (amsgrad) on a channels-last parameter: the same
// values as on its NCHW twin, per-tensor and foreach paths, updated in place (no copy each step),
// with the state channels-last.
TEST_CASE("optimizers update channels-last parameters in place, as NCHW ones", "[optim][channels_last]") {
  for (bool foreach : {false, true}) {
    INFO((foreach ? "foreach" : "per tensor"));
    for (int which = 0; which < 2; ++which) {
      INFO((which == 0 ? "SGD" : "AdamW"));
      manual_seed(4);
      Tensor a = randn({4, 3, 3, 3}), b = a.contiguous(MemoryFormat::ChannelsLast);
      Tensor bias_a = randn({4}), bias_b = bias_a.clone();
      a.requires_grad_();
      b.requires_grad_();
      bias_a.requires_grad_();
      bias_b.requires_grad_();
      const void* b_data = b.raw_data_ptr();
      std::unique_ptr<optim::Optimizer> oa, ob;
      if (which == 0) {
        const optim::SGDOptions o{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-2, .nesterov = true, .foreach = foreach};
        oa = std::make_unique<optim::SGD>(std::vector<Tensor>{a, bias_a}, o);
        ob = std::make_unique<optim::SGD>(std::vector<Tensor>{b, bias_b}, o);
      } else {
        optim::AdamOptions o;
        o.lr = 0.05;
        o.weight_decay = 1e-2;
        o.amsgrad = true;
        o.foreach = foreach;
        oa = std::make_unique<optim::AdamW>(std::vector<Tensor>{a, bias_a}, o);
        ob = std::make_unique<optim::AdamW>(std::vector<Tensor>{b, bias_b}, o);
      }
      for (int step = 0; step < 4; ++step) {
        Tensor x = randn({4, 3, 3, 3}), y = randn({4});
        oa->zero_grad();
        ob->zero_grad();
        (sum(a * a * x) + sum(bias_a * y)).backward();
        (sum(b * b * x) + sum(bias_b * y)).backward();
        CHECK(b.grad().is_contiguous(MemoryFormat::ChannelsLast));
        oa->step();
        ob->step();
      }
      CHECK(b.raw_data_ptr() == b_data);  // updated where it lives
      CHECK(b.is_contiguous(MemoryFormat::ChannelsLast));
      CHECK(equal(b.detach().contiguous(), a.detach()));
      CHECK(equal(bias_b.detach(), bias_a.detach()));
      int states_4d = 0;
      for (auto& [name, t] : ob->state_dict()) {  // (state_dict clones, keeping the layout)
        INFO(name);
        if (t.dim() != 4) continue;
        ++states_4d;
        CHECK(t.suggest_memory_format() == MemoryFormat::ChannelsLast);
      }
      CHECK(states_4d == (which == 0 ? 1 : 3));  // momentum; exp_avg, exp_avg_sq, max_exp_avg_sq
    }
  }
}

}  // namespace
}  // namespace chorus
