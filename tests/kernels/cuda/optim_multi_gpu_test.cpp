// The CUDA multi-tensor optimizer kernels (sgd_step_multi, adam_step_multi: kernels/cuda/optim.cu)
// against the CPU on the same random inputs: lists longer than one launch's tensor slots (130
// tensors), a tensor longer than one launch's 320 blocks of 65536 elements, empty, one-element and
// odd-sized tensors; SGD (plain, momentum, dampening, Nesterov, weight decay), Adam (amsgrad, L2) and
// AdamW, float32 within 1e-5 relative and float64 within 1e-12, over 3 steps. Also the fused
// optimizers on cuda:0 against the per-tensor CUDA path (the same functor and --fmad=false on the
// same device: bit for bit) with a group at mixed step counts. Tagged "gpu": fails without a device.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "kernels/cuda/device.h"
#include "optim/optim.h"
#include "tensor/ops.h"

namespace chorus {
namespace {

const Device kGpu = Device::cuda(0);

std::vector<Shape> shapes() {
  std::vector<Shape> out = {{0}, {1}, {3}, {65537}, {65536 * 321 + 5}, {0}, {7, 9}};
  for (int i = 0; i < 123; ++i) out.push_back({1 + (i * 7919) % 3001});
  return out;
}

std::vector<Tensor> random_list(DType dtype, uint64_t seed, double scale, bool positive = false) {
  Generator gen(seed);
  std::vector<Tensor> out;
  for (const Shape& s : shapes()) {
    Tensor t = positive ? rand(s, {.dtype = dtype}, &gen) : randn(s, {.dtype = dtype}, &gen);
    out.push_back(t.mul(scale));
  }
  return out;
}

std::vector<Tensor> to(const std::vector<Tensor>& list, Device device) {
  std::vector<Tensor> out;
  for (const Tensor& t : list) out.push_back(t.to(device).clone());
  return out;
}

// max |gpu - cpu| / max |cpu| over one list, in float64.
double rel_diff(const std::vector<Tensor>& gpu, const std::vector<Tensor>& cpu) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (cpu[i].numel() == 0) continue;
    const Tensor a = gpu[i].cpu().to(kFloat64), b = cpu[i].to(kFloat64);
    diff = std::max(diff, (a - b).abs().max().item<double>());
    scale = std::max(scale, b.abs().max().item<double>());
  }
  return diff / std::max(scale, 1e-30);
}

int exactly_equal(const std::vector<Tensor>& gpu, const std::vector<Tensor>& cpu) {
  int n = 0;
  for (size_t i = 0; i < cpu.size(); ++i) n += equal(gpu[i].cpu(), cpu[i]);
  return n;
}

double tolerance(DType dtype) { return dtype == kFloat32 ? 1e-5 : 1e-12; }

}  // namespace

TEST_CASE("CUDA sgd_step_multi equals the CPU foreach step", "[cuda][gpu][optim]") {
  cuda::require_device("optim_multi_gpu_test");
  const std::vector<optim::SgdStepOptions> cases = {
      {.lr = 0.1},
      {.lr = 0.1, .weight_decay = 0.01},
      {.lr = 0.05, .momentum = 0.9},
      {.lr = 0.05, .momentum = 0.8, .dampening = 0.3, .weight_decay = 1e-3},
      {.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-2, .nesterov = true},
  };
  for (DType dtype : {kFloat32, kFloat64}) {
    for (size_t c = 0; c < cases.size(); ++c) {
      INFO("case " << c << ", " << dtype_name(dtype));
      std::vector<Tensor> p_cpu = random_list(dtype, 1, 1.0), m_cpu = random_list(dtype, 2, 0.0);
      std::vector<Tensor> p_gpu = to(p_cpu, kGpu), m_gpu = to(m_cpu, kGpu);
      const bool momentum = cases[c].momentum != 0;
      for (int step = 0; step < 3; ++step) {
        const std::vector<Tensor> g_cpu = random_list(dtype, 10 + step, 1.0), g_gpu = to(g_cpu, kGpu);
        optim::SgdStepOptions o = cases[c];
        o.first_step = step == 0;
        optim::foreach_sgd_step(p_cpu, g_cpu, momentum ? m_cpu : std::vector<Tensor>{}, o);
        optim::foreach_sgd_step(p_gpu, g_gpu, momentum ? m_gpu : std::vector<Tensor>{}, o);
      }
      CHECK(rel_diff(p_gpu, p_cpu) <= tolerance(dtype));
      if (momentum) CHECK(rel_diff(m_gpu, m_cpu) <= tolerance(dtype));
      WARN("sgd case " << c << " " << dtype_name(dtype) << ": " << exactly_equal(p_gpu, p_cpu) << " of "
                       << p_cpu.size() << " tensors bit for bit");
    }
  }
}

TEST_CASE("CUDA adam_step_multi equals the CPU foreach step", "[cuda][gpu][optim]") {
  cuda::require_device("optim_multi_gpu_test");
  const std::vector<optim::AdamStepOptions> cases = {
      {.lr = 1e-2},
      {.lr = 1e-2, .beta1 = 0.8, .weight_decay = 0.05},
      {.lr = 1e-2, .weight_decay = 0.1, .decoupled = true},
  };
  for (DType dtype : {kFloat32, kFloat64}) {
    for (size_t c = 0; c < cases.size(); ++c) {
      for (bool amsgrad : {false, true}) {
        INFO("case " << c << (amsgrad ? ", amsgrad, " : ", ") << dtype_name(dtype));
        std::vector<Tensor> p_cpu = random_list(dtype, 1, 1.0), m_cpu = random_list(dtype, 2, 0.0),
                            v_cpu = random_list(dtype, 3, 0.0), x_cpu = random_list(dtype, 4, 0.0);
        std::vector<Tensor> p_gpu = to(p_cpu, kGpu), m_gpu = to(m_cpu, kGpu), v_gpu = to(v_cpu, kGpu),
                            x_gpu = to(x_cpu, kGpu);
        for (int step = 1; step <= 3; ++step) {
          const std::vector<Tensor> g_cpu = random_list(dtype, 10 + step, 1.0), g_gpu = to(g_cpu, kGpu);
          optim::AdamStepOptions o = cases[c];
          o.step = step;
          optim::foreach_adam_step(p_cpu, g_cpu, m_cpu, v_cpu, amsgrad ? x_cpu : std::vector<Tensor>{}, o);
          optim::foreach_adam_step(p_gpu, g_gpu, m_gpu, v_gpu, amsgrad ? x_gpu : std::vector<Tensor>{}, o);
        }
        CHECK(rel_diff(p_gpu, p_cpu) <= tolerance(dtype));
        CHECK(rel_diff(m_gpu, m_cpu) <= tolerance(dtype));
        CHECK(rel_diff(v_gpu, v_cpu) <= tolerance(dtype));
        if (amsgrad) CHECK(rel_diff(x_gpu, x_cpu) <= tolerance(dtype));
        WARN("adam case " << c << (amsgrad ? " amsgrad " : " ") << dtype_name(dtype) << ": "
                          << exactly_equal(p_gpu, p_cpu) << " of " << p_cpu.size() << " tensors bit for bit");
      }
    }
  }
}

TEST_CASE("fused AdamW and SGD on cuda:0 equal the per-tensor CUDA path, at mixed step counts", "[cuda][gpu][optim]") {
  cuda::require_device("optim_multi_gpu_test");
  const std::vector<Tensor> initial = random_list(kFloat32, 5, 1.0);
  auto params = [&] {
    std::vector<Tensor> out;
    for (const Tensor& t : initial) out.push_back(t.to(kGpu).clone().requires_grad_());
    return out;
  };
  std::vector<Tensor> a = params(), b = params(), c = params(), d = params(), e = initial;
  for (Tensor& t : e) t = t.clone().requires_grad_();
  optim::AdamW per_tensor(a, {.lr = 1e-2, .weight_decay = 0.1, .amsgrad = true, .foreach = false});
  optim::AdamW fused(b, {.lr = 1e-2, .weight_decay = 0.1, .amsgrad = true, .fused = true});
  optim::AdamW on_cpu(e, {.lr = 1e-2, .weight_decay = 0.1, .amsgrad = true});
  optim::SGD sgd_per_tensor(c, {.lr = 0.05, .momentum = 0.9, .nesterov = true, .foreach = false});
  optim::SGD sgd_fused(d, {.lr = 0.05, .momentum = 0.9, .nesterov = true, .fused = true});
  for (int step = 0; step < 4; ++step) {
    const std::vector<Tensor> g = random_list(kFloat32, 20 + step, 1.0);
    for (size_t i = 0; i < g.size(); ++i) {
      // Parameter i first gets a gradient on step i % 3: step counts differ within the group.
      const bool has = static_cast<int>(i % 3) <= step;
      for (std::vector<Tensor>* list : {&a, &b, &c, &d}) (*list)[i].mutable_grad() = has ? g[i].to(kGpu) : Tensor();
      e[i].mutable_grad() = has ? g[i] : Tensor();
    }
    for (optim::Optimizer* opt : std::vector<optim::Optimizer*>{&per_tensor, &fused, &on_cpu, &sgd_per_tensor,
                                                                &sgd_fused}) {
      opt->step();
    }
  }
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("parameter " << i);
    CHECK(equal(a[i].detach().cpu(), b[i].detach().cpu()));
    CHECK(equal(c[i].detach().cpu(), d[i].detach().cpu()));
  }
  std::vector<Tensor> fused_params, cpu_params;
  for (size_t i = 0; i < b.size(); ++i) {
    fused_params.push_back(b[i].detach());
    cpu_params.push_back(e[i].detach());
  }
  CHECK(rel_diff(fused_params, cpu_params) <= 1e-5);
}

}  // namespace chorus
