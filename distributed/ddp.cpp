#include "distributed/ddp.h"

#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "autograd/grad_mode.h"
#include "tensor/ops.h"

namespace chorus::distributed {

using Clock = std::chrono::steady_clock;

namespace {
// A cap in MiB as bytes; one too large for int64 (infinity included) is no cap.
int64_t cap_bytes(double mb) {
  const double bytes = mb * 1024 * 1024;
  return bytes >= 9.2e18 ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(bytes);
}
}  // namespace

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> module, std::shared_ptr<ProcessGroup> group,
                                                 DDPOptions options)
    : nn::Module("DistributedDataParallel"), module_(std::move(module)), group_(std::move(group)), options_(options) {
  if (!module_) fail("DistributedDataParallel: module is null");
  if (!group_) fail("DistributedDataParallel: process group is null (call init_process_group first)");
  // NaN fails `> 0` too; infinity (or any cap past 2^63 bytes) means no cap: one bucket per dtype
  // and device.
  if (!(options_.bucket_cap_mb > 0) || !(options_.first_bucket_cap_mb > 0)) {
    fail("DistributedDataParallel: bucket caps must be positive, got bucket_cap_mb={} first_bucket_cap_mb={}",
         options_.bucket_cap_mb, options_.first_bucket_cap_mb);
  }
  // Registered as "module", so state_dict names are "module.<name>" as in PyTorch.
  register_module("module", module_);
  verify_same_model_across_ranks();
  {
    // Every replica starts from rank 0's parameters and buffers.
    NoGradGuard no_grad;
    TensorList state;
    for (auto& [n, t] : module_->named_parameters()) state.push_back(t);
    for (auto& [n, t] : module_->named_buffers()) state.push_back(t);
    if (group_->size() > 1 && !state.empty()) group_->broadcast(state, 0)->wait();
  }
  std::vector<Tensor> params;
  std::vector<std::string> names;
  for (auto& [n, t] : module_->named_parameters()) {
    if (!t.requires_grad()) continue;
    params.push_back(t);
    names.push_back(n);
  }
  reducer_ = std::make_unique<Reducer>(
      params, names, group_,
      ReducerOptions{.bucket_cap_bytes = cap_bytes(options_.bucket_cap_mb),
                     .first_bucket_cap_bytes = cap_bytes(options_.first_bucket_cap_mb),
                     .find_unused_parameters = options_.find_unused_parameters,
                     .gradient_as_bucket_view = options_.gradient_as_bucket_view,
                     .static_graph = options_.static_graph});
}

void DistributedDataParallel::verify_same_model_across_ranks() {
  // Each rank describes its parameters ("name shape dtype" lines); all descriptions are gathered so
  // every rank can name the first rank and parameter that differ from rank 0, and all fail alike.
  std::string desc;
  for (auto& [n, t] : module_->named_parameters()) {
    desc += fmt::format("{} {} {}\n", n, shape_str(t.sizes()), dtype_name(t.dtype()));
  }
  const int size = group_->size();
  if (size == 1) return;
  Tensor len = full({1}, static_cast<int64_t>(desc.size()), {.dtype = kInt64});
  TensorList lens;
  for (int r = 0; r < size; ++r) lens.push_back(zeros({1}, {.dtype = kInt64}));
  group_->allgather(lens, len)->wait();
  int64_t max_len = 0;
  for (auto& l : lens) max_len = std::max(max_len, l.item<int64_t>());
  Tensor mine = zeros({max_len}, {.dtype = kUInt8});
  std::copy(desc.begin(), desc.end(), mine.data_ptr<uint8_t>());
  TensorList all;
  for (int r = 0; r < size; ++r) all.push_back(zeros({max_len}, {.dtype = kUInt8}));
  group_->allgather(all, mine)->wait();
  auto lines = [&](int r) {
    std::vector<std::string> out;
    const uint8_t* p = all[r].data_ptr<uint8_t>();
    std::string s(p, p + lens[r].item<int64_t>());
    size_t pos = 0;
    while (pos < s.size()) {
      size_t nl = s.find('\n', pos);
      out.push_back(s.substr(pos, nl - pos));
      pos = nl + 1;
    }
    return out;
  };
  const auto reference = lines(0);
  for (int r = 1; r < size; ++r) {
    const auto other = lines(r);
    for (size_t k = 0; k < std::max(reference.size(), other.size()); ++k) {
      const std::string a = k < reference.size() ? reference[k] : "(none)";
      const std::string b = k < other.size() ? other[k] : "(none)";
      if (a != b) {
        fail("DistributedDataParallel: rank {} has a different model than rank 0: parameter {} is '{}' on rank 0 but "
             "'{}' on rank {} (rank 0 has {} parameters, rank {} has {}). Every rank must build the same model.",
             r, k, a, b, r, reference.size(), r, other.size());
      }
    }
  }
}

TensorList DistributedDataParallel::run_forward(const std::function<TensorList()>& call) {
  const auto start = Clock::now();
  const bool grad = autograd::GradMode::is_enabled();
  if (grad) reducer_->prepare_for_forward();
  if (joining_) join_round(true);
  // [Buffers as PyTorch syncs them] Broadcast only when the previous forward was a synced one with
  // gradients on (PyTorch's require_forward_param_sync), so an evaluation under NoGrad syncs once,
  // whatever number of batches each rank evaluates; and, inside join(), from the highest rank that
  // still has data (PyTorch's _find_common_rank), not from rank 0, which may have joined with stale
  // statistics. Until 2026-12-04 every forward broadcast from rank 0: ranks evaluating different
  // numbers of batches issued different numbers of broadcasts (a hang or mixed data over NCCL), and
  // a joined rank 0 reset the others' BatchNorm statistics every round (a helper's audit;
  // multiprocess_test's "DDP's buffers" case).
  if (options_.broadcast_buffers && group_->size() > 1 && (joining_ || require_forward_param_sync_)) {
    TensorList buffers = module_->buffers();
    if (!buffers.empty()) {
      NoGradGuard no_grad;
      group_->broadcast(buffers, joining_ ? last_active_rank_ : 0)->wait();
    }
  }
  TensorList outputs = call();
  const auto end = Clock::now();
  reducer_->set_forward_times(start, end);
  require_forward_param_sync_ = grad && reducer_->require_sync();
  if (require_forward_param_sync_) reducer_->prepare_for_backward(outputs);
  return outputs;
}

Tensor DistributedDataParallel::forward(const Tensor& input) {
  return run_forward([&] { return TensorList{module_->forward(input)}; })[0];
}

Tensor DistributedDataParallel::forward(const std::function<Tensor()>& call) {
  return run_forward([&] { return TensorList{call()}; })[0];
}

TensorList DistributedDataParallel::forward_multi(const std::function<TensorList()>& call) { return run_forward(call); }

int64_t DistributedDataParallel::join_round(bool active) {
  Tensor flags = zeros({group_->size()}, {.dtype = kInt64});
  if (active) flags.data_ptr<int64_t>()[group_->rank()] = 1;
  group_->allreduce({flags})->wait();
  const int64_t* f = flags.data_ptr<int64_t>();
  int64_t count = 0;
  int highest = -1;
  for (int r = 0; r < group_->size(); ++r) {
    count += f[r];
    if (f[r] > 0) highest = r;
  }
  if (count > 0) last_active_rank_ = highest;
  return count;
}

void DistributedDataParallel::join(const std::function<void()>& loop) {
  if (joining_) fail("DistributedDataParallel::join: already inside join()");
  joining_ = true;
  last_active_rank_ = -1;
  try {
    loop();
  } catch (...) {
    joining_ = false;
    throw;
  }
  joining_ = false;
  if (group_->size() == 1) return;
  if (!reducer_->rebuilt() && !options_.find_unused_parameters) {
    fail("DistributedDataParallel::join: rank {} ran no training iteration before joining; every rank needs at "
         "least one (the bucket layout is agreed in the first)",
         group_->rank());
  }
  // Shadow the ranks that still have data until none has.
  while (join_round(false) > 0) {
    NoGradGuard no_grad;
    if (options_.broadcast_buffers) {
      TensorList buffers = module_->buffers();
      if (!buffers.empty()) group_->broadcast(buffers, last_active_rank_)->wait();  // [Buffers as PyTorch syncs them]
    }
    reducer_->shadow_backward();
  }
  // Everyone takes the state of the rank that trained last.
  if (last_active_rank_ >= 0) {
    NoGradGuard no_grad;
    TensorList state = module_->parameters();
    for (const Tensor& b : module_->buffers()) state.push_back(b);
    if (!state.empty()) group_->broadcast(state, last_active_rank_)->wait();
  }
}

void DistributedDataParallel::write_chrome_trace(const std::string& path, int64_t iteration) const {
  const auto& all = reducer_->stats();
  if (all.empty()) fail("DistributedDataParallel::write_chrome_trace: no iteration has been recorded yet");
  const IterationStats* st = &all.back();
  if (iteration >= 0) {
    st = nullptr;
    for (const auto& s : all) if (s.iteration == iteration) st = &s;
    if (!st) fail("DistributedDataParallel::write_chrome_trace: iteration {} was not recorded", iteration);
  }
  nlohmann::json events = nlohmann::json::array();
  const int pid = group_->rank();
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", fmt::format("rank {}", pid)}}}});
  events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", 0}, {"args", {{"name", "compute"}}}});
  events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", 1}, {"args", {{"name", "communication"}}}});
  for (const auto& sp : st->spans) {
    events.push_back({{"name", sp.name}, {"ph", "X"}, {"pid", pid}, {"tid", sp.lane}, {"ts", sp.start_us},
                      {"dur", std::max(1.0, sp.end_us - sp.start_us)}});
  }
  nlohmann::json doc = {{"traceEvents", events}, {"displayTimeUnit", "ms"},
                        {"otherData", {{"iteration", st->iteration}, {"forward_ms", st->forward_ms},
                                       {"backward_ms", st->backward_ms}, {"communication_ms", st->communication_ms},
                                       {"overlapped_ms", st->overlapped_ms}}}};
  std::ofstream out(path);
  if (!out) fail("DistributedDataParallel::write_chrome_trace: cannot write '{}'", path);
  out << doc.dump(1);
}

}  // namespace chorus::distributed
