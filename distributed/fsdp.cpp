#include "distributed/fsdp.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "kernels/dispatch.h"
#include "tensor/fault.h"
#include "tensor/ops.h"

namespace chorus::distributed {

const char* sharding_strategy_name(ShardingStrategy s) {
  return s == ShardingStrategy::FullShard ? "full_shard" : "shard_grad_op";
}

ShardingStrategy parse_sharding_strategy(const std::string& name) {
  if (name == "full_shard") return ShardingStrategy::FullShard;
  if (name == "shard_grad_op") return ShardingStrategy::ShardGradOp;
  fail("FullyShardedDataParallel: unknown sharding strategy '{}'; expected full_shard or shard_grad_op", name);
}

// One flat parameter: some of a unit's parameters laid end to end, padded to a multiple of the
// world size and cut into one shard per rank.
struct FullyShardedDataParallel::Flat {
  std::string name, key;
  size_t unit = 0;
  std::vector<std::string> names;
  std::vector<Tensor> params;  // the model's tensors: views of `full` once built
  std::vector<int64_t> offsets;
  int64_t numel = 0, shard_numel = 0;
  Tensor shard;    // [shard_numel], what the optimizer steps
  Tensor full;     // [shard_numel * world]; its storage is released between uses
  Tensor scratch;  // the all-gather's target while one is in flight (copied into `full` after)
  std::shared_ptr<Work> gather_work;
  // This backward: which parameters' gradients arrived, and the reduce-scatter once launched.
  std::vector<bool> arrived;
  size_t ready = 0;
  bool launched = false;
  Tensor reduce_in, reduce_out;
  std::shared_ptr<Work> reduce_work;
};

struct FullyShardedDataParallel::Unit {
  enum class State { Released, Gathering, Gathered };
  std::string name;
  int block = -1;  // -1: the root
  std::vector<size_t> flats;
  State state = State::Released;
  bool fresh = false;  // gathered since this iteration began: holds the shards' current values
};

namespace {

uint64_t fnv1a(uint64_t h, const std::string& s) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return (h ^ 0xff) * 1099511628211ull;
}

bool owned_by(const std::string& name, const std::string& path) {
  return name == path || (name.size() > path.size() && name.compare(0, path.size(), path) == 0 && name[path.size()] == '.');
}

}  // namespace

FullyShardedDataParallel::FullyShardedDataParallel(pipeline::BlockModel model, std::shared_ptr<ProcessGroup> group,
                                                   FSDPOptions options)
    : model_(std::move(model)), group_(std::move(group)), options_(std::move(options)) {
  if (!model_.model) fail("FullyShardedDataParallel: the BlockModel has no model");
  if (!group_) fail("FullyShardedDataParallel: no process group");
  if (model_.blocks.empty()) fail("FullyShardedDataParallel: the model has no blocks; expected at least one");
  for (size_t i = 0; i < model_.blocks.size(); ++i) {
    if (!model_.blocks[i].forward) fail("FullyShardedDataParallel: block {} ('{}') has no forward function", i, model_.blocks[i].name);
  }
  build(options_);
}

FullyShardedDataParallel::~FullyShardedDataParallel() {
  for (HookHandle& h : hooks_) h.remove();
}

void FullyShardedDataParallel::build(const FSDPOptions& options) {
  NoGradGuard no_grad;
  const int world = group_->size(), rank = group_->rank();
  nn::NamedTensors params = model_.model->named_parameters();
  if (params.empty()) fail("FullyShardedDataParallel: the model ({}) has no parameters", model_.model->type_name());
  const Device device = params.front().second.device();
  for (const auto& [name, p] : params) {
    if (!p.requires_grad()) {
      fail("FullyShardedDataParallel: parameter '{}' does not require gradients; frozen parameters are not supported "
           "(every parameter is sharded and stepped)",
           name);
    }
    if (p.device() != device) {
      fail("FullyShardedDataParallel: parameter '{}' is on {}, '{}' on {}; expected one device", name, p.device().str(),
           params.front().first, device.str());
    }
  }
  // Which blocks own each parameter: one block makes it that block's; none or several, the root's.
  std::vector<std::set<int>> owners(params.size());
  std::set<std::string> tensor_names;
  for (const auto& [n, t] : model_.model->named_parameters()) tensor_names.insert(n);
  for (const auto& [n, t] : model_.model->named_buffers()) tensor_names.insert(n);
  std::set<std::string> module_names;
  for (const auto& [n, m] : model_.model->named_modules()) module_names.insert(n);
  for (size_t b = 0; b < model_.blocks.size(); ++b) {
    for (const std::string& path : model_.blocks[b].owns) {
      if (!tensor_names.count(path) && !module_names.count(path)) {
        fail("FullyShardedDataParallel: block '{}' owns '{}', which is neither a module nor a parameter or buffer of "
             "the model ({})",
             model_.blocks[b].name, path, model_.model->type_name());
      }
      for (size_t i = 0; i < params.size(); ++i)
        if (owned_by(params[i].first, path)) owners[i].insert(static_cast<int>(b));
    }
  }

  // Every rank copies rank 0's parameters and buffers, then checks it wraps the same model.
  uint64_t h = 1469598103934665603ull;
  for (const auto& b : model_.blocks) h = fnv1a(h, b.name);
  for (const auto& [name, p] : params) h = fnv1a(fnv1a(h, name), shape_str(p.sizes()) + dtype_name(p.dtype()));
  if (world > 1) {
    TensorList outs;
    for (int r = 0; r < world; ++r) outs.push_back(zeros({1}, {.dtype = kInt64}));
    group_->allgather(outs, tensor<int64_t>({static_cast<int64_t>(h >> 1)}))->wait();
    std::vector<int> differ;
    for (int r = 0; r < world; ++r)
      if (outs[r].item<int64_t>() != outs[0].item<int64_t>()) differ.push_back(r);
    if (!differ.empty()) {
      fail("FullyShardedDataParallel: rank(s) {} wrap other blocks or parameters (names, shapes or dtypes) than rank 0; "
           "every rank must wrap the same model",
           fmt::join(differ, ","));
    }
    for (const auto& [name, p] : params) group_->broadcast({p}, 0)->wait();
    for (const auto& [name, b] : model_.model->named_buffers()) group_->broadcast({b}, 0)->wait();
  }

  // Units: the root (tied and unowned parameters), then one per block.
  std::vector<std::vector<size_t>> members(model_.blocks.size() + 1);  // [0]: root
  for (size_t i = 0; i < params.size(); ++i) {
    members[owners[i].size() == 1 ? static_cast<size_t>(*owners[i].begin()) + 1 : 0].push_back(i);
  }
  std::vector<size_t> block_unit(model_.blocks.size());
  for (size_t u = 0; u < members.size(); ++u) {
    if (u == 0 && members[0].empty()) continue;
    auto unit = std::make_unique<Unit>();
    unit->block = static_cast<int>(u) - 1;
    unit->name = u == 0 ? "root" : model_.blocks[u - 1].name;
    if (u > 0) block_unit[u - 1] = units_.size();
    // One flat parameter per key and dtype, its parameters in the model's order.
    std::vector<std::pair<std::string, DType>> keys;
    std::map<std::pair<std::string, DType>, std::vector<size_t>> by_key;
    for (size_t i : members[u]) {
      const std::string key = options.flat_group ? options.flat_group(params[i].first, params[i].second) : "";
      const auto k = std::make_pair(key, params[i].second.dtype());
      if (!by_key.count(k)) keys.push_back(k);
      by_key[k].push_back(i);
    }
    for (const auto& k : keys) {
      auto flat = std::make_unique<Flat>();
      flat->key = k.first;
      flat->unit = units_.size();
      const bool several_dtypes = std::count_if(keys.begin(), keys.end(), [&](const auto& o) { return o.first == k.first; }) > 1;
      flat->name = unit->name + (k.first.empty() ? "" : "[" + k.first + "]") +
                   (several_dtypes ? std::string("[") + dtype_name(k.second) + "]" : "");
      for (size_t i : by_key[k]) {
        flat->names.push_back(params[i].first);
        flat->params.push_back(params[i].second);
        flat->offsets.push_back(flat->numel);
        flat->numel += params[i].second.numel();
      }
      flat->shard_numel = (flat->numel + world - 1) / world;
      flat->arrived.assign(flat->params.size(), false);
      flat->full = zeros({flat->shard_numel * world}, {.dtype = k.second, .device = device});
      for (size_t j = 0; j < flat->params.size(); ++j) {
        const Tensor& p = flat->params[j];
        Tensor view = flat->full.narrow(0, flat->offsets[j], p.numel());
        view.copy_(p.contiguous().reshape({-1}));
        p.set_data(view.view(p.sizes()));
      }
      flat->shard = flat->full.narrow(0, rank * flat->shard_numel, flat->shard_numel).clone();
      flat->shard.requires_grad_(true);
      const size_t index = flats_.size();
      for (size_t j = 0; j < flat->params.size(); ++j) {
        hooks_.push_back(flat->params[j].register_post_accumulate_grad_hook([this, index, j](Tensor&) {
          Flat& f = *flats_[index];
          if (!backward_queued_) {
            backward_queued_ = true;
            autograd::Engine::get().queue_callback([this] { finish_backward(); });
          }
          if (!f.arrived[j]) {
            f.arrived[j] = true;
            ++f.ready;
          }
          if (f.ready == f.params.size()) launch_ready_reductions();
        }));
      }
      flat->full.storage()->release();
      unit->flats.push_back(index);
      flats_.push_back(std::move(flat));
    }
    units_.push_back(std::move(unit));
  }
  // Reductions in a fixed order: backward meets the last block first; the root ends it.
  for (size_t u = units_.size(); u-- > 0;) {
    if (units_[u]->block < 0) continue;
    for (size_t f : units_[u]->flats) reduction_order_.push_back(f);
  }
  if (units_.front()->block < 0)
    for (size_t f : units_.front()->flats) reduction_order_.push_back(f);
}

// ------------------------------------------------------------------ gathering
void FullyShardedDataParallel::start_gather(size_t u) {
  Unit& unit = *units_[u];
  if (unit.fresh || unit.state == Unit::State::Gathering) return;
  NoGradGuard no_grad;
  const int world = group_->size();
  for (size_t fi : unit.flats) {
    Flat& f = *flats_[fi];
    f.full.storage()->reallocate();
    if (world == 1) {
      kernels::copy(f.full, f.shard);
      continue;
    }
    // Into a scratch buffer, then copied into `full` without an in-place write's version bump:
    // the tensors autograd saved from the unit's forward must stay valid when backward gathers
    // the same values again (PyTorch preserves the version counter for the same reason).
    f.scratch = empty({f.shard_numel * world}, {.dtype = f.full.dtype(), .device = f.full.device()});
    TensorList outputs;
    for (int r = 0; r < world; ++r) outputs.push_back(f.scratch.narrow(0, r * f.shard_numel, f.shard_numel));
    f.gather_work = group_->allgather(outputs, f.shard.detach());
  }
  unit.state = Unit::State::Gathering;
}

void FullyShardedDataParallel::finish_gather(size_t u) {
  Unit& unit = *units_[u];
  if (unit.state != Unit::State::Gathering) return;
  NoGradGuard no_grad;
  for (size_t fi : unit.flats) {
    Flat& f = *flats_[fi];
    if (!f.gather_work) continue;
    // The outputs, views of scratch, hold every rank's shard (on a device: the current stream now
    // waits for the collective).
    if (!fault::removed(fault::Point::kFsdpGatherWait)) f.gather_work->wait();
    kernels::copy(f.full, f.scratch);
    f.scratch = Tensor();
    f.gather_work = nullptr;
  }
  unit.state = Unit::State::Gathered;
  unit.fresh = true;
}

void FullyShardedDataParallel::gather(size_t u) {
  start_gather(u);
  finish_gather(u);
}

void FullyShardedDataParallel::reshard(size_t u) {
  Unit& unit = *units_[u];
  finish_gather(u);  // never free memory a collective still writes
  for (size_t fi : unit.flats) flats_[fi]->full.storage()->release();
  unit.state = Unit::State::Released;
  unit.fresh = false;
}

// ------------------------------------------------------------------ forward
void FullyShardedDataParallel::reset_iteration() {
  for (auto& f : flats_) {
    std::fill(f->arrived.begin(), f->arrived.end(), false);
    f->ready = 0;
    f->launched = false;
  }
  next_reduction_ = 0;
  for (auto& u : units_) u->fresh = false;  // the shards may have been stepped since
}

TensorList FullyShardedDataParallel::forward(const TensorList& inputs) {
  if (backward_queued_) fail("FullyShardedDataParallel::forward: called during a backward pass");
  reset_iteration();
  const bool grad = autograd::GradMode::is_enabled();
  const bool full_shard = options_.sharding_strategy == ShardingStrategy::FullShard;
  const size_t first_block = units_.front()->block < 0 ? 1 : 0;
  if (first_block == 1) gather(0);
  if (options_.prefetch && first_block < units_.size()) start_gather(first_block);
  TensorList x = inputs;
  for (size_t u = first_block; u < units_.size(); ++u) {
    gather(u);
    if (options_.prefetch && u + 1 < units_.size()) start_gather(u + 1);
    x = model_.blocks[static_cast<size_t>(units_[u]->block)].forward(x);
    if (!grad) {
      if (full_shard) reshard(u);
      continue;
    }
    const bool last = u + 1 == units_.size();
    if (full_shard && !last) {
      // Gathered again when backward reaches this block's outputs.
      for (const Tensor& t : x) {
        if (!t.defined() || !t.requires_grad()) continue;
        t.register_hook([this, u](const Tensor&) {
          pre_backward(u);
          return Tensor();
        });
      }
      reshard(u);
    }
  }
  if (!grad) {
    for (size_t u = 0; u < units_.size(); ++u) reshard(u);  // no backward will come
  }
  return x;
}

// ------------------------------------------------------------------ backward
void FullyShardedDataParallel::pre_backward(size_t u) {
  if (fault::removed(fault::Point::kFsdpPreBackwardGather)) return;
  gather(u);
  // Backward runs the blocks in reverse: the one before this is next.
  if (options_.prefetch && u > 0 && units_[u - 1]->block >= 0) start_gather(u - 1);
}

void FullyShardedDataParallel::launch_ready_reductions() {
  // Strictly in order, so every rank issues the same collectives in the same sequence.
  while (next_reduction_ < reduction_order_.size()) {
    Flat& f = *flats_[reduction_order_[next_reduction_]];
    if (f.ready != f.params.size()) break;
    launch_reduction(reduction_order_[next_reduction_++]);
  }
}

void FullyShardedDataParallel::launch_reduction(size_t fi) {
  NoGradGuard no_grad;
  Flat& f = *flats_[fi];
  const int world = group_->size();
  f.reduce_in = zeros({f.shard_numel * world}, {.dtype = f.full.dtype(), .device = f.full.device()});
  for (size_t j = 0; j < f.params.size(); ++j) {
    Tensor& g = f.params[j].mutable_grad();
    if (!g.defined()) continue;
    f.reduce_in.narrow(0, f.offsets[j], f.params[j].numel()).copy_(g.reshape({-1}));
    g = Tensor();  // the full gradient is not kept
  }
  if (world > 1) {
    // Pre-divided so the sum is the average (as DDP's buckets).
    f.reduce_in.mul_(1.0 / static_cast<double>(world));
    f.reduce_out = empty({f.shard_numel}, {.dtype = f.full.dtype(), .device = f.full.device()});
    TensorList chunks;
    for (int r = 0; r < world; ++r) chunks.push_back(f.reduce_in.narrow(0, r * f.shard_numel, f.shard_numel));
    f.reduce_work = group_->reduce_scatter(f.reduce_out, chunks);
  } else {
    f.reduce_out = f.reduce_in;
  }
  f.launched = true;
  // FullShard: a block whose every gradient is on its way is done with its parameters.
  Unit& unit = *units_[f.unit];
  if (options_.sharding_strategy == ShardingStrategy::FullShard && unit.block >= 0 &&
      std::all_of(unit.flats.begin(), unit.flats.end(), [&](size_t k) { return flats_[k]->launched; })) {
    reshard(f.unit);
  }
}

void FullyShardedDataParallel::finish_backward() {
  NoGradGuard no_grad;
  // Parameters that got no gradient (unused in this forward) reduce zeros.
  while (next_reduction_ < reduction_order_.size()) launch_reduction(reduction_order_[next_reduction_++]);
  for (size_t fi : reduction_order_) {
    Flat& f = *flats_[fi];
    if (f.reduce_work) {
      f.reduce_work->wait();
      const TensorList& result = f.reduce_work->result();
      if (!result.empty() && !result[0].is_same(f.reduce_out)) f.reduce_out.copy_(result[0]);
    }
    Tensor& g = f.shard.mutable_grad();
    if (g.defined()) {
      g.add_(f.reduce_out);  // accumulating over backward passes, as .grad does
    } else {
      g = f.reduce_out;
    }
    f.reduce_in = Tensor();
    f.reduce_out = Tensor();
    f.reduce_work = nullptr;
    std::fill(f.arrived.begin(), f.arrived.end(), false);
    f.ready = 0;
    f.launched = false;
  }
  next_reduction_ = 0;
  for (size_t u = 0; u < units_.size(); ++u) reshard(u);
  backward_queued_ = false;
}

// ------------------------------------------------------------------ the rest
std::vector<Tensor> FullyShardedDataParallel::parameters() const {
  std::vector<Tensor> out;
  for (const auto& f : flats_) out.push_back(f->shard);
  return out;
}

std::vector<Tensor> FullyShardedDataParallel::parameters(const std::string& key) const {
  std::vector<Tensor> out;
  for (const auto& f : flats_)
    if (f->key == key) out.push_back(f->shard);
  return out;
}

nn::NamedTensors FullyShardedDataParallel::named_parameters() const {
  nn::NamedTensors out;
  for (const auto& f : flats_) out.emplace_back(f->name, f->shard);
  return out;
}

double FullyShardedDataParallel::clip_grad_norm_(double max_norm) {
  NoGradGuard no_grad;
  double local = 0;
  for (const auto& f : flats_) {
    const Tensor& g = f->shard.grad();
    if (g.defined()) local += g.to(kFloat64).pow(2).sum().item<double>();
  }
  Tensor t = tensor<double>({local});
  if (group_->size() > 1) group_->allreduce({t})->wait();
  const double total = std::sqrt(t.item<double>());
  const double coef = max_norm / (total + 1e-6);
  if (coef < 1.0) {
    for (const auto& f : flats_) {
      Tensor g = f->shard.grad();
      if (g.defined()) g.mul_(coef);
    }
  }
  return total;
}

nn::NamedTensors FullyShardedDataParallel::full_state_dict() {
  if (backward_queued_) fail("FullyShardedDataParallel::full_state_dict: called during a backward pass");
  NoGradGuard no_grad;
  for (auto& u : units_) u->fresh = false;
  for (size_t u = 0; u < units_.size(); ++u) gather(u);
  nn::NamedTensors out;
  for (const auto& [name, t] : model_.model->state_dict()) out.emplace_back(name, t.to(kCPU).clone());
  for (size_t u = 0; u < units_.size(); ++u) reshard(u);
  return out;
}

void FullyShardedDataParallel::load_full_state_dict(const nn::NamedTensors& state) {
  if (backward_queued_) fail("FullyShardedDataParallel::load_full_state_dict: called during a backward pass");
  NoGradGuard no_grad;
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : state) by_name[name] = &t;
  auto find = [&](const std::string& name, const Tensor& like) -> const Tensor& {
    auto it = by_name.find(name);
    if (it == by_name.end()) fail("FullyShardedDataParallel::load_full_state_dict: '{}' is missing from the state dict", name);
    if (it->second->sizes() != like.sizes()) {
      fail("FullyShardedDataParallel::load_full_state_dict: '{}' has shape {}, the model's {}", name,
           shape_str(it->second->sizes()), shape_str(like.sizes()));
    }
    return *it->second;
  };
  const int rank = group_->rank();
  for (auto& f : flats_) {
    f->full.storage()->reallocate();
    for (size_t j = 0; j < f->params.size(); ++j) {
      const Tensor& src = find(f->names[j], f->params[j]);
      f->full.narrow(0, f->offsets[j], f->params[j].numel()).copy_(src.to(f->full.device()).to(f->full.dtype()).reshape({-1}));
    }
    f->shard.copy_(f->full.narrow(0, rank * f->shard_numel, f->shard_numel));
  }
  for (const auto& [name, b] : model_.model->named_buffers()) {
    Tensor dst = b;
    dst.copy_(find(name, b).to(b.device()).to(b.dtype()));
  }
  for (size_t u = 0; u < units_.size(); ++u) {
    units_[u]->state = Unit::State::Gathered;
    reshard(u);
  }
}

int64_t FullyShardedDataParallel::numel() const {
  int64_t n = 0;
  for (const auto& f : flats_) n += f->numel;
  return n;
}

int64_t FullyShardedDataParallel::shard_numel() const {
  int64_t n = 0;
  for (const auto& f : flats_) n += f->shard_numel;
  return n;
}

size_t FullyShardedDataParallel::largest_unit_bytes() const {
  size_t most = 0;
  for (const auto& u : units_) {
    size_t bytes = 0;
    for (size_t fi : u->flats) bytes += flats_[fi]->full.storage()->nbytes();
    most = std::max(most, bytes);
  }
  return most;
}

}  // namespace chorus::distributed
