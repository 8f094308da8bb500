#include "distributed/powersgd.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace chorus::distributed {

namespace {

// Gram-Schmidt on the columns of p [n, r], in place.
void orthogonalize(Tensor& p, double epsilon) {
  const int64_t r = p.size(1);
  for (int64_t i = 0; i < r; ++i) {
    Tensor col = p.narrow(1, i, 1);
    const double n = norm(col).item<double>() + epsilon;
    if (n > 0) col.div_(n);  // a zero column (a zero gradient) stays zero
    for (int64_t j = i + 1; j < r; ++j) {
      Tensor other = p.narrow(1, j, 1);
      other.sub_(col * (col * other).sum());
    }
  }
}

// Whether an n x m matrix is worth sending as P and Q of rank r.
bool should_compress(int64_t n, int64_t m, int r, double min_rate) {
  return static_cast<double>(n * m) > static_cast<double>(r * (n + m)) * min_rate;
}

}  // namespace

CommHook powerSGD_hook(std::shared_ptr<PowerSGDState> state) {
  if (!state) fail("powerSGD_hook: no state");
  if (state->matrix_approximation_rank < 1) {
    fail("powerSGD_hook: matrix_approximation_rank {} must be at least 1", state->matrix_approximation_rank);
  }
  if (state->min_compression_rate < 1) {
    fail("powerSGD_hook: min_compression_rate {} must be at least 1", state->min_compression_rate);
  }
  return [state](ProcessGroup& group, Bucket& bucket) -> std::shared_ptr<Work> {
    PowerSGDState::BucketState& bs = state->buckets[bucket.index];
    const int64_t numel = bucket.buffer.numel();
    // A new or rebuilt bucket: its errors and Q's belonged to other parameters. DDP rebuilds its
    // buckets after iteration 0 in the order the gradients arrived, which can reorder a bucket's
    // parameters without changing its size; until 2026-12-04 only a size change reset the state, so
    // with start_powerSGD_iter 0 each error went to another parameter of the bucket (a shape error,
    // or a silently wrong sum between equal shapes; found by a helper's audit). PyTorch refuses
    // start_powerSGD_iter <= 1 with error feedback or warm start instead; here the state follows the
    // parameters (dist_worker's powersgd scenario, "a bucket reordered by DDP's rebuild").
    if (bs.buffer_numel != numel || bs.params != bucket.params) {
      const int64_t iterations = bs.iterations;
      bs = PowerSGDState::BucketState();
      bs.iterations = iterations;
      bs.buffer_numel = numel;
      bs.params = bucket.params;
    }
    if (state->hierarchical && state->hierarchical->nodes() * state->hierarchical->local_size() != group.size()) {
      fail("powerSGD_hook: the hierarchical groups span {} processes ({} nodes x {}), DDP's group {}",
           state->hierarchical->nodes() * state->hierarchical->local_size(), state->hierarchical->nodes(),
           state->hierarchical->local_size(), group.size());
    }
    if (bs.iterations++ < state->start_powerSGD_iter) {
      return state->hierarchical ? state->hierarchical->allreduce_async(bucket.buffer) : allreduce_hook(group, bucket);
    }
    NoGradGuard no_grad;
    auto sum = [&](Tensor& t) {
      if (state->hierarchical) state->hierarchical->allreduce(t);
      else group.allreduce({t})->wait();
    };
    const int r = state->matrix_approximation_rank;
    const size_t count = bucket.views.size();
    if (bs.errors.size() != count) {
      bs.errors.assign(count, Tensor());
      bs.qs.assign(count, Tensor());
    }
    // The matrices to compress and the rest, sent exactly in one buffer.
    std::vector<size_t> compressed, exact;
    for (size_t i = 0; i < count; ++i) {
      const Tensor& v = bucket.views[i];
      const int64_t n = v.dim() >= 2 ? v.size(0) : 0, m = n > 0 ? v.numel() / n : 0;
      (n > 0 && should_compress(n, m, r, state->min_compression_rate) ? compressed : exact).push_back(i);
    }
    std::shared_ptr<Work> exact_work;
    Tensor exact_buffer;
    if (!exact.empty()) {
      TensorList parts;
      for (size_t i : exact) parts.push_back(bucket.views[i].reshape({-1}));
      exact_buffer = cat(parts);
      exact_work = state->hierarchical ? state->hierarchical->allreduce_async(exact_buffer) : group.allreduce({exact_buffer});
      state->sent_elements += exact_buffer.numel();
    }
    state->uncompressed_elements += numel;
    if (!compressed.empty()) {
      const TensorOptions opts{.dtype = bucket.buffer.dtype(), .device = bucket.buffer.device()};
      std::vector<Tensor> ms, ps, qs;
      TensorList p_parts;
      for (size_t i : compressed) {
        const Tensor& v = bucket.views[i];
        const int64_t n = v.size(0), m = v.numel() / n;
        Tensor mat = v.reshape({n, m});
        if (state->use_error_feedback) {
          if (!bs.errors[i].defined()) bs.errors[i] = zeros({n, m}, opts);
          mat = mat + bs.errors[i];
        }
        if (!state->warm_start || !bs.qs[i].defined()) {
          // The same on every rank: a generator of the seed, the bucket and the draw.
          Generator gen(state->random_seed * 1000003ull + bucket.index * 7919ull + bs.draws++);
          bs.qs[i] = randn({m, r}, {.dtype = bucket.buffer.dtype()}, &gen).to(bucket.buffer.device());
        }
        ms.push_back(mat);
        qs.push_back(bs.qs[i]);
        Tensor p = mm(mat, bs.qs[i]);
        ps.push_back(p);
        p_parts.push_back(p.reshape({-1}));
      }
      Tensor p_flat = cat(p_parts);
      sum(p_flat);
      state->sent_elements += p_flat.numel();
      TensorList q_parts;
      int64_t offset = 0;
      for (size_t k = 0; k < compressed.size(); ++k) {
        const int64_t n = ps[k].size(0);
        Tensor p = p_flat.narrow(0, offset, n * r).reshape({n, r}).contiguous();
        offset += n * r;
        orthogonalize(p, state->orthogonalization_epsilon);
        ps[k] = p;
        q_parts.push_back(mm(ms[k].transpose(0, 1), p).reshape({-1}));
      }
      Tensor q_flat = cat(q_parts);
      sum(q_flat);
      state->sent_elements += q_flat.numel();
      // [An overflowed bucket keeps no state] Q is a sum over ranks: an inf or NaN in any rank's
      // gradients (float16 training whose loss scale was too large: the GradScaler skips that step)
      // reaches it on every rank alike. Kept as error or warm-start Q, it would make every later
      // gradient NaN and every later step skipped, the scale halving for ever (orthogonalize leaves
      // a NaN column as it is); so the bucket's errors and Q's start again (a helper's audit,
      // 2026-12-04; dist_worker's powersgd scenario). The bucket itself comes back non-finite, for
      // the scaler to see.
      const bool finite = std::isfinite(mul(q_flat, 0.0).sum().to(kFloat64).item<double>());
      offset = 0;
      const double world = static_cast<double>(group.size());
      for (size_t k = 0; k < compressed.size(); ++k) {
        const size_t i = compressed[k];
        const int64_t m = ms[k].size(1);
        Tensor q = q_flat.narrow(0, offset, m * r).reshape({m, r}).contiguous();
        offset += m * r;
        Tensor approx = mm(ps[k], q.transpose(0, 1));  // the sum over ranks, approximated
        // What this rank's input held beyond its share of the approximation, for the next step.
        if (state->use_error_feedback) bs.errors[i] = finite ? ms[k] - approx / world : Tensor();
        bucket.views[i].copy_(approx.reshape(bucket.views[i].sizes()));
        // Warm start: next step's Q starts from this one (it converges over the steps).
        if (state->warm_start) bs.qs[i] = finite ? q : Tensor();
      }
    }
    if (exact_work) {
      exact_work->wait();
      const TensorList& result = exact_work->result();
      if (!result.empty() && !result[0].is_same(exact_buffer)) exact_buffer.copy_(result[0]);
      int64_t offset = 0;
      for (size_t i : exact) {
        Tensor& v = bucket.views[i];
        v.copy_(exact_buffer.narrow(0, offset, v.numel()).view(v.sizes()));
        offset += v.numel();
      }
    }
    return completed_work("powerSGD", {bucket.buffer});
  };
}

}  // namespace chorus::distributed
