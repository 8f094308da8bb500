#include "distributed/fsdp.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "distributed/checkpoint_folder.h"
#include "distributed/streams_seen.h"
#include "kernels/dispatch.h"
#include "tensor/caching_allocator.h"
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
  Tensor gather_input;  // the shard in the gathered dtype, while its all-gather is in flight
  std::shared_ptr<Work> gather_work;
  // This backward: which parameters' gradients arrived, and the reduce-scatter once launched.
  std::vector<bool> arrived;
  size_t ready = 0;
  StreamsSeen grads_on;  // on a device: the streams the gradients were accumulated on (streams_seen.h)
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
      // The values in the parameters' dtype (the shards keep it); gathered in param_dtype if set.
      Tensor master = zeros({flat->shard_numel * world}, {.dtype = k.second, .device = device});
      for (size_t j = 0; j < flat->params.size(); ++j) {
        master.narrow(0, flat->offsets[j], flat->params[j].numel()).copy_(flat->params[j].contiguous().reshape({-1}));
      }
      const bool cast = options.param_dtype && is_floating(k.second) && *options.param_dtype != k.second;
      flat->full = cast ? master.to(*options.param_dtype) : master;
      for (size_t j = 0; j < flat->params.size(); ++j) {
        const Tensor& p = flat->params[j];
        p.set_data(flat->full.narrow(0, flat->offsets[j], p.numel()).view(p.sizes()));
      }
      flat->shard = master.narrow(0, rank * flat->shard_numel, flat->shard_numel).clone();
      flat->shard.requires_grad_(true);
      const size_t index = flats_.size();
      for (size_t j = 0; j < flat->params.size(); ++j) {
        hooks_.push_back(flat->params[j].register_post_accumulate_grad_hook([this, index, j](Tensor&) {
          Flat& f = *flats_[index];
          if (!backward_queued_) {
            backward_queued_ = true;
            autograd::Engine::get().queue_callback([this] { finish_backward(); });
          }
          if (f.launched) {
            fail("FullyShardedDataParallel: the gradient of '{}' came after its flat parameter '{}' was reduced: backward "
                 "had already reached an earlier block, so the parameter was used outside its own block (each block's "
                 "parameters must be used only in that block's forward)",
                 f.names[j], f.name);
          }
          if (!f.arrived[j]) {
            f.arrived[j] = true;
            ++f.ready;
          }
          if (!f.full.device().is_cpu()) f.grads_on.note(current_stream(f.full.device()));
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
    f.gather_input = f.shard.dtype() == f.full.dtype() ? f.shard.detach() : f.shard.detach().to(f.full.dtype());
    if (world == 1) {
      kernels::copy(f.full, f.gather_input);
      f.gather_input = Tensor();
      continue;
    }
    // Into a scratch buffer, then copied into `full` without an in-place write's version bump:
    // the tensors autograd saved from the unit's forward must stay valid when backward gathers
    // the same values again (PyTorch preserves the version counter for the same reason).
    f.scratch = empty({f.shard_numel * world}, {.dtype = f.full.dtype(), .device = f.full.device()});
    TensorList outputs;
    for (int r = 0; r < world; ++r) outputs.push_back(f.scratch.narrow(0, r * f.shard_numel, f.shard_numel));
    f.gather_work = group_->allgather(outputs, f.gather_input);
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
    f.gather_input = Tensor();
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
    f->grads_on.clear();
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
  if (options_.param_dtype) {
    for (Tensor& t : x)
      if (t.defined() && is_floating(t.dtype()) && t.dtype() != *options_.param_dtype) t = t.to(*options_.param_dtype);
  }
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
  launch_reductions_after(u);
  gather(u);
  // Backward runs the blocks in reverse: the one before this is next.
  if (options_.prefetch && u > 0 && units_[u - 1]->block >= 0) start_gather(u - 1);
}

// [Reductions before the next gather] Backward has reached block unit `u`: every gradient this
// backward gives the parameters of the units after it has arrived, since the engine runs nodes in
// the reverse order of the forward that made them (autograd/engine.cpp's ReadyOrder: the highest
// sequence number first, an AccumulateGrad as soon as it is ready) and unit u's output is made
// after none of theirs. So a flat of a later unit still waiting holds a parameter this rank did
// not use (a layer inside the block taken on some ranks only: a gate, an expert); its reduce-scatter
// goes now, with zeros for that parameter, before this unit's all-gathers. Every rank then issues
// the same collectives in the same order whatever parameters of a block it used, as NCCL needs (it matches a
// communicator's operations by issue order). Until 2026-12-04 such a flat waited for the end of
// backward while the ranks that used the parameter launched it: rank 0 issued an all-gather where
// rank 1 issued the reduce-scatter (found by a helper's read-only audit; fsdp_worker's "gated"
// model, and fault::Point::kFsdpReductionsBeforeGather removes it). A gradient that still comes
// for a launched flat (a block's parameter used in an earlier block's forward) is an error.
void FullyShardedDataParallel::launch_reductions_after(size_t u) {
  if (fault::removed(fault::Point::kFsdpReductionsBeforeGather)) return;
  while (next_reduction_ < reduction_order_.size()) {
    const size_t fi = reduction_order_[next_reduction_];
    const Flat& f = *flats_[fi];
    if (units_[f.unit]->block < 0 || f.unit <= u) break;
    ++next_reduction_;
    launch_reduction(fi);
  }
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
  // The gradients may have been made on several streams: read them on the current one after those,
  // and keep their memory from reuse until it has.
  std::optional<Stream> reading;
  if (!f.full.device().is_cpu()) reading = f.grads_on.order_current_after(f.full.device());
  for (size_t j = 0; j < f.params.size(); ++j) {
    Tensor& g = f.params[j].mutable_grad();
    if (!g.defined()) continue;
    f.reduce_in.narrow(0, f.offsets[j], f.params[j].numel()).copy_(g.reshape({-1}));
    if (reading && !fault::removed(fault::Point::kBucketCopyStreams)) record_stream(g.storage(), *reading);
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
    // In the shard's dtype (mixed precision reduces in the gathered one).
    const Tensor reduced = f.reduce_out.dtype() == f.shard.dtype() ? f.reduce_out : f.reduce_out.to(f.shard.dtype());
    Tensor& g = f.shard.mutable_grad();
    if (g.defined()) {
      g.add_(reduced);  // accumulating over backward passes, as .grad does
    } else {
      g = reduced;
    }
    // [A reduction's output is read on the caller's stream] reduce_in and reduce_out came from the
    // pool of the stream the flat's last gradient arrived on (its forward's), and were read here on
    // the caller's current stream (the add or the cast above; at world size 1 reduce_out is the
    // gradient itself): kept from reuse until that stream has passed what it queued, as PyTorch's
    // FSDP record_streams what another stream used before it frees it. Before 2026-12-04 they went
    // back to the forward stream's pool at once, and a second micro-batch's forward there could take
    // them while the caller's stream still read them (a helper's audit; stream_group_test's FSDP
    // case, fault::Point::kFsdpReduceOutStream removes it).
    if (!f.full.device().is_cpu() && !fault::removed(fault::Point::kFsdpReduceOutStream)) {
      const Stream reading = current_stream(f.full.device());
      record_stream(f.reduce_out.storage(), reading);
      if (!f.reduce_in.is_same(f.reduce_out)) record_stream(f.reduce_in.storage(), reading);
    }
    f.reduce_in = Tensor();
    f.reduce_out = Tensor();
    f.reduce_work = nullptr;
    std::fill(f.arrived.begin(), f.arrived.end(), false);
    f.ready = 0;
    f.launched = false;
    f.grads_on.clear();
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
  const int world = group_->size();
  // Each flat parameter whole, from the shards (their dtype, not the gathered one), on the CPU.
  std::map<std::string, Tensor> params;
  for (const auto& f : flats_) {
    Tensor whole = f->shard.detach();
    if (world > 1) {
      whole = empty({f->shard_numel * world}, {.dtype = f->shard.dtype(), .device = f->shard.device()});
      TensorList outputs;
      for (int r = 0; r < world; ++r) outputs.push_back(whole.narrow(0, r * f->shard_numel, f->shard_numel));
      group_->allgather(outputs, f->shard.detach())->wait();
    }
    whole = whole.to(kCPU);
    for (size_t j = 0; j < f->params.size(); ++j) {
      params[f->names[j]] = whole.narrow(0, f->offsets[j], f->params[j].numel()).reshape(f->params[j].sizes()).clone();
    }
  }
  nn::NamedTensors out;
  for (const auto& [name, t] : model_.model->named_parameters()) out.emplace_back(name, params.at(name));
  for (const auto& [name, b] : model_.model->named_buffers()) out.emplace_back(name, b.to(kCPU).clone());
  // model->state_dict()'s order: parameters and buffers as it interleaves them.
  nn::NamedTensors ordered;
  for (const auto& [name, t] : model_.model->state_dict()) {
    for (auto& entry : out)
      if (entry.first == name) ordered.push_back(entry);
  }
  return ordered;
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
    // This rank's slice of the flat parameter, in the shard's dtype.
    Tensor master = zeros({f->shard_numel * group_->size()}, {.dtype = f->shard.dtype()});
    for (size_t j = 0; j < f->params.size(); ++j) {
      const Tensor& src = find(f->names[j], f->params[j]);
      master.narrow(0, f->offsets[j], f->params[j].numel()).copy_(src.to(kCPU).to(f->shard.dtype()).reshape({-1}));
    }
    f->shard.copy_(master.narrow(0, rank * f->shard_numel, f->shard_numel).to(f->shard.device()));
  }
  for (const auto& [name, b] : model_.model->named_buffers()) {
    Tensor dst = b;
    dst.copy_(find(name, b).to(b.device()).to(b.dtype()));
  }
  for (size_t u = 0; u < units_.size(); ++u) reshard(u);
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

// ------------------------------------------------------------------ sharded checkpoints
namespace {

constexpr const char* kIndex = "fsdp-checkpoint.json";
constexpr const char* kShardPrefix = "flat/";  // a shard's entry in its rank's file: "flat/<flat name>"

std::string rank_file(int64_t step, int rank, int world, const std::string& generation) {
  return fmt::format("fsdp-step{}{}-rank{}-of-{}.safetensors", step, generation, rank, world);
}

nlohmann::json read_index(const std::string& dir) {
  const std::string path = fsdp_checkpoint_index(dir);
  nlohmann::json m = read_checkpoint_index(path, dir, "FSDP checkpoint", "index", {"step", "world_size", "files", "flats"});
  if (!m["files"].is_array() || m["files"].size() != m["world_size"].get<size_t>()) {
    fail("FSDP checkpoint: the index {} names {} files for world size {}", path, m["files"].size(),
         m["world_size"].get<int64_t>());
  }
  return m;
}

// Every rank's file of the checkpoint the index names, checked against it.
std::vector<nn::Checkpoint> read_all(const std::string& dir, const nlohmann::json& index) {
  std::vector<nn::Checkpoint> files;
  for (const auto& f : index["files"]) {
    files.push_back(nn::Checkpoint::load(dir + "/" + f.get<std::string>()));
    if (files.back().step != index["step"].get<int64_t>()) {
      fail("FSDP checkpoint: {} holds step {}, but the index names step {}", f.get<std::string>(), files.back().step,
           index["step"].get<int64_t>());
    }
  }
  return files;
}

const Tensor& entry(const nn::NamedTensors& list, const std::string& name, const std::string& where) {
  for (const auto& [n, t] : list)
    if (n == name) return t;
  fail("FSDP checkpoint: {} has no entry '{}'", where, name);
}

// A flat parameter (or a buffer of its size) whole again: the ranks' pieces end to end, unpadded.
Tensor reassemble(const std::vector<Tensor>& pieces, int64_t numel) {
  return cat(pieces).narrow(0, 0, numel).contiguous();
}

}  // namespace

std::string fsdp_checkpoint_index(const std::string& dir) { return dir + "/" + kIndex; }
bool has_fsdp_checkpoint(const std::string& dir) { return std::filesystem::exists(fsdp_checkpoint_index(dir)); }

nn::NamedTensors load_fsdp_model(const std::string& dir) {
  const nlohmann::json index = read_index(dir);
  const std::vector<nn::Checkpoint> files = read_all(dir, index);
  std::map<std::string, Tensor> by_name;
  for (const auto& flat : index["flats"]) {
    const std::string name = flat["name"].get<std::string>();
    std::vector<Tensor> pieces;
    for (size_t r = 0; r < files.size(); ++r) pieces.push_back(entry(files[r].model, kShardPrefix + name, index["files"][r]));
    const Tensor whole = reassemble(pieces, flat["numel"].get<int64_t>());
    for (const auto& p : flat["params"]) {
      Shape shape = p["shape"].get<Shape>();
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      by_name[p["name"].get<std::string>()] = whole.narrow(0, p["offset"].get<int64_t>(), n).reshape(shape).clone();
    }
  }
  for (const auto& [name, t] : files[0].model)
    if (name.rfind(kShardPrefix, 0) != 0) by_name[name] = t;
  nn::NamedTensors out;
  for (const auto& name : index["state_order"]) {
    auto it = by_name.find(name.get<std::string>());
    if (it == by_name.end()) fail("FSDP checkpoint: {} lacks '{}' of the model", dir, name.get<std::string>());
    out.emplace_back(it->first, it->second);
  }
  return out;
}

void FullyShardedDataParallel::agree(const std::string& error, const std::string& what) {
  agree_on_failure(*group_, error, "FullyShardedDataParallel", what);
}

std::vector<size_t> FullyShardedDataParallel::optimizer_flats(const optim::Optimizer& optimizer) const {
  std::vector<size_t> out;
  for (const optim::ParamGroup& g : optimizer.param_groups()) {
    for (const Tensor& p : g.params) {
      size_t found = flats_.size();
      for (size_t f = 0; f < flats_.size(); ++f)
        if (flats_[f]->shard.is_same(p)) found = f;
      if (found == flats_.size()) {
        fail("FullyShardedDataParallel: the optimizer holds a tensor of shape {} that is none of this wrapper's "
             "shards; expected an optimizer over parameters()",
             shape_str(p.sizes()));
      }
      out.push_back(found);
    }
  }
  return out;
}

void FullyShardedDataParallel::save_checkpoint(const std::string& dir, const optim::Optimizer& optimizer,
                                               const optim::LRScheduler* scheduler, int64_t epoch, int64_t step,
                                               const nn::Metadata& extra) {
  namespace fs = std::filesystem;
  if (backward_queued_) fail("FullyShardedDataParallel::save_checkpoint: called during a backward pass");
  const int world = group_->size(), rank = group_->rank();
  std::string error;
  std::vector<size_t> owners;
  try {
    owners = optimizer_flats(optimizer);
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree(error, "checking the optimizer");
  std::error_code ec;
  fs::create_directories(dir, ec);
  // Saving a step the index already names writes the other generation of names (as a pipeline's).
  bool reuse_names = false;
  if (rank == 0 && has_fsdp_checkpoint(dir)) {
    try {
      const nlohmann::json m = read_index(dir);
      reuse_names = m["step"].get<int64_t>() == step && m["files"][0].get<std::string>() == rank_file(step, 0, world, "");
    } catch (const std::exception&) {
      // an unreadable index is replaced below
    }
  }
  const std::string generation = agree_generation(*group_, reuse_names);
  try {
    NoGradGuard no_grad;
    nn::Checkpoint c;
    for (const auto& f : flats_) c.model.emplace_back(kShardPrefix + f->name, f->shard.detach().cpu().clone());
    if (rank == 0)
      for (const auto& [name, b] : model_.model->named_buffers()) c.model.emplace_back(name, b.cpu().clone());
    c.optimizer = optimizer.state_dict();
    for (auto& [name, t] : c.optimizer)
      if (!t.device().is_cpu()) t = t.cpu();
    if (scheduler) c.scheduler = scheduler->state_dict();
    c.epoch = epoch;
    c.step = step;
    c.capture_rng();
    c.extra = extra;
    c.extra["fsdp_rank"] = std::to_string(rank);
    c.extra["fsdp_world_size"] = std::to_string(world);
    for (size_t i = 0; i < owners.size(); ++i) c.extra["fsdp_optimizer_param." + std::to_string(i)] = flats_[owners[i]]->name;
    c.save(dir + "/" + rank_file(step, rank, world, generation));
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree(error, fmt::format("writing the checkpoint of step {} to {}", step, dir));
  if (rank == 0) {
    try {
      nlohmann::json m;
      m["step"] = step;
      m["world_size"] = world;
      m["strategy"] = sharding_strategy_name(options_.sharding_strategy);
      m["files"] = nlohmann::json::array();
      for (int r = 0; r < world; ++r) m["files"].push_back(rank_file(step, r, world, generation));
      m["flats"] = nlohmann::json::array();
      for (const auto& f : flats_) {
        nlohmann::json params = nlohmann::json::array();
        for (size_t j = 0; j < f->params.size(); ++j) {
          params.push_back({{"name", f->names[j]}, {"offset", f->offsets[j]}, {"shape", f->params[j].sizes()}});
        }
        m["flats"].push_back({{"name", f->name}, {"numel", f->numel}, {"shard_numel", f->shard_numel}, {"params", params}});
      }
      m["state_order"] = nlohmann::json::array();
      for (const auto& [name, t] : model_.model->named_parameters()) m["state_order"].push_back(name);
      for (const auto& [name, t] : model_.model->named_buffers()) m["state_order"].push_back(name);
      nn::atomic_write(fsdp_checkpoint_index(dir), m.dump(1) + "\n");
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  agree(error, fmt::format("writing the index of step {} in {}", step, dir));
  // The index names this step's files now: this rank's older ones can go.
  remove_superseded(dir, "fsdp-step", fmt::format("-rank{}-of-{}.safetensors", rank, world),
                    rank_file(step, rank, world, generation));
  if (world > 1) group_->barrier()->wait();
}

// A rank that cannot load (a damaged file, a mismatched model, a different `expect`) fails every
// rank with it, rather than leaving the others to hang in the first collective of the next step.
nn::Checkpoint FullyShardedDataParallel::load_checkpoint(const std::string& dir, optim::Optimizer& optimizer,
                                                         optim::LRScheduler* scheduler, const nn::Metadata& expect) {
  if (backward_queued_) fail("FullyShardedDataParallel::load_checkpoint: called during a backward pass");
  nn::Checkpoint mine;
  std::string error;
  try {
    mine = load_checkpoint_here(dir, optimizer, scheduler, expect);
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree(error, fmt::format("loading the checkpoint in {}", dir));
  mine.restore_rng();
  for (auto& u : units_) u->fresh = false;
  return mine;
}

nn::Checkpoint FullyShardedDataParallel::load_checkpoint_here(const std::string& dir, optim::Optimizer& optimizer,
                                                              optim::LRScheduler* scheduler,
                                                              const nn::Metadata& expect) {
  const int world = group_->size(), rank = group_->rank();
  const nlohmann::json index = read_index(dir);
  const int saved_world = index["world_size"].get<int>();
  const bool same = saved_world == world;
  // This world size: this rank's file alone; another: all of them.
  std::vector<nn::Checkpoint> files;
  if (same) {
    files.push_back(nn::Checkpoint::load(dir + "/" + index["files"][rank].get<std::string>()));
  } else {
    files = read_all(dir, index);
  }
  nn::Checkpoint& mine = files.front();
  for (const auto& [key, value] : expect) {
    auto it = mine.extra.find(key);
    if (it == mine.extra.end()) fail("FSDP checkpoint {} does not say which {} it was written with", dir, key);
    if (it->second != value) {
      fail("FSDP checkpoint {} was written with {} {}, not the {} asked for now", dir, key, it->second, value);
    }
  }
  const std::vector<size_t> owners = optimizer_flats(optimizer);
  NoGradGuard no_grad;
  // The flats must be laid out as saved.
  std::map<std::string, const nlohmann::json*> saved_flats;
  for (const auto& f : index["flats"]) saved_flats[f["name"].get<std::string>()] = &f;
  for (const auto& f : flats_) {
    auto it = saved_flats.find(f->name);
    if (it == saved_flats.end() || (*it->second)["numel"].get<int64_t>() != f->numel) {
      fail("FSDP checkpoint {}: flat parameter '{}' of {} elements is not in it as such; it was saved from another "
           "model or another flat_group",
           dir, f->name, f->numel);
    }
  }
  if (same) {
    for (auto& f : flats_) {
      f->shard.copy_(entry(mine.model, kShardPrefix + f->name, dir).to(f->shard.device()));
    }
    optimizer.load_state_dict(mine.optimizer);
  } else {
    for (auto& f : flats_) {
      std::vector<Tensor> pieces;
      for (const auto& file : files) pieces.push_back(entry(file.model, kShardPrefix + f->name, dir));
      Tensor whole = reassemble(pieces, f->numel);
      Tensor padded = zeros({f->shard_numel * world}, {.dtype = whole.dtype()});
      padded.narrow(0, 0, f->numel).copy_(whole);
      f->shard.copy_(padded.narrow(0, rank * f->shard_numel, f->shard_numel).to(f->shard.device()));
    }
    // The optimizer's state: buffers of a shard's size reassembled and cut again, the rest (steps,
    // options) from rank 0's file. Saved indices are mapped to ours through the flat names.
    std::map<std::string, size_t> saved_index;  // flat name -> the saved optimizer's parameter index
    for (const auto& [key, value] : files[0].extra) {
      const std::string prefix = "fsdp_optimizer_param.";
      if (key.rfind(prefix, 0) == 0) saved_index[value] = std::stoul(key.substr(prefix.size()));
    }
    nn::NamedTensors state;
    for (const auto& [name, t] : files[0].optimizer)
      if (name.rfind("state.", 0) != 0) state.emplace_back(name, t);
    for (size_t i = 0; i < owners.size(); ++i) {
      const Flat& f = *flats_[owners[i]];
      auto it = saved_index.find(f.name);
      if (it == saved_index.end()) fail("FSDP checkpoint {}: no optimizer state saved for '{}'", dir, f.name);
      const std::string from = "state." + std::to_string(it->second) + ".";
      const int64_t saved_shard = (*saved_flats[f.name])["shard_numel"].get<int64_t>();
      for (const auto& [name, t] : files[0].optimizer) {
        if (name.rfind(from, 0) != 0) continue;
        const std::string buffer = name.substr(from.size());
        Tensor value = t;
        if (t.dim() == 1 && t.numel() == saved_shard) {
          std::vector<Tensor> pieces;
          for (const auto& file : files) pieces.push_back(entry(file.optimizer, name, dir));
          Tensor whole = reassemble(pieces, f.numel);
          Tensor padded = zeros({f.shard_numel * world}, {.dtype = whole.dtype()});
          padded.narrow(0, 0, f.numel).copy_(whole);
          value = padded.narrow(0, rank * f.shard_numel, f.shard_numel).clone();
        }
        state.emplace_back("state." + std::to_string(i) + "." + buffer, value);
      }
    }
    optimizer.load_state_dict(state);
  }
  // Buffers: rank 0's file holds them (read here when it is not this rank's).
  const nn::Checkpoint* with_buffers = rank == 0 || !same ? &files.front() : nullptr;
  nn::Checkpoint rank0;
  if (with_buffers == nullptr) {
    rank0 = nn::Checkpoint::load(dir + "/" + index["files"][0].get<std::string>());
    with_buffers = &rank0;
  }
  for (const auto& [name, b] : model_.model->named_buffers()) {
    Tensor dst = b;
    dst.copy_(entry(with_buffers->model, name, dir).to(b.device()).to(b.dtype()));
  }
  if (scheduler && !mine.scheduler.empty()) scheduler->load_state_dict(mine.scheduler);
  return mine;
}

}  // namespace chorus::distributed
