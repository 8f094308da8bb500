#include "distributed/pipeline/pipeline.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <cmath>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "autograd/autocast.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "distributed/checkpoint_folder.h"
#include "distributed/init.h"
#include "nn/utils/checkpoint.h"
#include "tensor/caching_allocator.h"
#include "tensor/cpu_memory.h"
#include "tensor/fault.h"
#include "tensor/ops.h"

namespace chorus::distributed::pipeline {

using Clock = std::chrono::steady_clock;

namespace {

std::string escaped(std::string name) {
  std::replace(name.begin(), name.end(), '.', '/');
  return name;
}
std::string unescaped(std::string name) {
  std::replace(name.begin(), name.end(), '/', '.');
  return name;
}

// The tensors a block owns, by whole-model name, in the model's state_dict order within each path.
struct Owned {
  std::vector<std::pair<std::string, std::shared_ptr<nn::Module>>> modules;  // module paths
  nn::NamedTensors parameters, buffers;  // single tensors named by the block
  nn::NamedTensors all_parameters, all_buffers;  // everything below both
};

Owned resolve(const BlockModel& model, const Block& block) {
  Owned o;
  auto modules = model.model->named_modules();
  nn::NamedTensors params = model.model->named_parameters(), buffers = model.model->named_buffers();
  auto find = [](const nn::NamedTensors& list, const std::string& name) -> const Tensor* {
    for (auto& [n, t] : list)
      if (n == name) return &t;
    return nullptr;
  };
  for (const std::string& path : block.owns) {
    if (path.empty()) fail("pipeline: block '{}' owns an empty path; expected module paths or tensor names", block.name);
    if (path.find('/') != std::string::npos) {
      fail("pipeline: block '{}' owns '{}'; names with '/' are not supported", block.name, path);
    }
    auto it = std::find_if(modules.begin(), modules.end(), [&](const auto& m) { return m.first == path; });
    if (it != modules.end()) {
      o.modules.emplace_back(path, it->second);
      for (auto& [n, t] : it->second->named_parameters()) o.all_parameters.emplace_back(path + "." + n, t);
      for (auto& [n, t] : it->second->named_buffers()) o.all_buffers.emplace_back(path + "." + n, t);
    } else if (const Tensor* t = find(params, path)) {
      o.parameters.emplace_back(path, *t);
      o.all_parameters.emplace_back(path, *t);
    } else if (const Tensor* b = find(buffers, path)) {
      o.buffers.emplace_back(path, *b);
      o.all_buffers.emplace_back(path, *b);
    } else {
      fail("pipeline: block '{}' owns '{}', which is neither a module nor a parameter or buffer of the model ({})",
           block.name, path, model.model->type_name());
    }
  }
  return o;
}

}  // namespace

// ------------------------------------------------------------------ StageModule
StageModule::StageModule(const BlockModel& model, int first_block, int end_block)
    : nn::Module("PipelineStage"), first_block_(first_block), end_block_(end_block) {
  if (first_block < 0 || end_block > static_cast<int>(model.size()) || first_block >= end_block) {
    fail("pipeline: a stage of blocks [{}, {}) does not fit a model of {} blocks", first_block, end_block, model.size());
  }
  std::set<const TensorImpl*> seen;  // a tensor registered twice would be stepped twice
  auto first_time = [&](const Tensor& t) { return seen.insert(t.unsafe_impl()).second; };
  for (int i = first_block; i < end_block; ++i) {
    const Block& block = model.blocks[i];
    if (!block.forward) fail("pipeline: block {} ('{}') has no forward function", i, block.name);
    Owned o = resolve(model, block);
    for (auto& [path, m] : o.modules) {
      for (auto& [n, t] : m->named_parameters()) {
        if (!first_time(t)) {
          fail("pipeline: block '{}' owns '{}', whose parameter '{}.{}' this stage already holds from another path; a "
               "stage's blocks must own each tensor once",
               block.name, path, path, n);
        }
      }
      for (auto& [n, t] : m->named_buffers()) first_time(t);
      register_module(escaped(path), m);
    }
    // Single tensors: a tied parameter whose module an earlier block of this stage owns is there already.
    for (auto& [name, t] : o.parameters)
      if (first_time(t)) register_parameter(escaped(name), t);
    for (auto& [name, t] : o.buffers)
      if (first_time(t)) register_buffer(escaped(name), t);
    blocks_.push_back(block);
  }
}

TensorList StageModule::forward_blocks(const TensorList& inputs) {
  TensorList x = inputs;
  for (const Block& block : blocks_) x = block.forward(x);
  return x;
}

Tensor StageModule::forward(const Tensor& input) {
  TensorList out = forward_blocks({input});
  if (out.size() != 1) {
    fail("pipeline: the stage's last block '{}' returned {} tensors; forward(Tensor) needs one (use forward_blocks)",
         blocks_.back().name, out.size());
  }
  return out[0];
}

// ------------------------------------------------------------------ PipelineStage
namespace {

// Message kinds, in the low bits of the point-to-point tag (tag = 1 + index * 4 + kind), so a
// message can only ever match the receive meant for it: a schedule bug becomes a timeout naming
// the action, never wrong data. Tags start at 1: Gloo's point-to-point slot is
// (tag << 32 | src << 16 | dst), and with tag 0 the slot of rank 0 -> 1 is 1, which Gloo 0.0.x's
// collectives also use (its Slot::build ORs logically, so every collective's base slot is 1):
// a header sent with tag 0 made the next allreduce among 3 ranks hang.
constexpr int kHeader = 0, kActivation = 1, kGrad = 2, kCheckpoint = 3;
int tag_of(int kind, int index) { return 1 + index * 4 + kind; }

// [Boundary header] Before the first activations on a link: how many tensors, the sender's device
// type, and per tensor its dtype, whether its gradient travels back, rank and sizes, so the
// receiver can allocate; afterwards tensors travel without one and a change is an error on the
// sender. Tensor i of micro-batch m across boundary b (virtual stages b and b + 1) travels with
// index (b * M + m) * kMaxTensors + i; the header with index b.
constexpr int64_t kMaxTensors = 8, kMaxDims = 6, kSpecWords = 3 + kMaxDims;
constexpr int64_t kHeaderWords = 3 + kMaxTensors * kSpecWords, kHeaderMagic = 0x70697066;  // "pipf"
int tensor_index(int boundary, int micro_batches, int micro_batch, size_t i) {
  return (boundary * micro_batches + micro_batch) * static_cast<int>(kMaxTensors) + static_cast<int>(i);
}

// A tensor's gradient crosses the boundary back when it is floating point and was computed with grad.
bool carries_grad(const Tensor& t) { return t.requires_grad() && is_floating(t.dtype()); }

std::string device_type_name(int64_t type) {
  switch (static_cast<DeviceType>(type)) {
    case DeviceType::CPU: return "cpu";
    case DeviceType::CUDA: return "cuda";
    case DeviceType::Sim: return "sim";
  }
  return fmt::format("device type {}", type);
}

// A stable hash (FNV-1a) of the blocks' names and the plan, for the ranks' agreement check.
uint64_t fnv1a(uint64_t h, const std::string& s) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return (h ^ 0xff) * 1099511628211ULL;
}

}  // namespace

PipelineStage::PipelineStage(const std::shared_ptr<nn::Sequential>& model, PipelinePlan plan,
                             std::shared_ptr<ProcessGroup> group, PipelineOptions options)
    : PipelineStage(blocks_of(model), std::move(plan), std::move(group), options) {}

PipelineStage::PipelineStage(BlockModel model, PipelinePlan plan, std::shared_ptr<ProcessGroup> group,
                             PipelineOptions options)
    : plan_(std::move(plan)), group_(std::move(group)), options_(options) {
  if (!model.model) fail("pipeline: the model is null");
  if (!group_) fail("pipeline: the process group is null (call init_process_group first)");
  // The stage runs where its parameters are (move the model before making the stage); received
  // tensors are allocated there, and inputs and targets are moved there.
  for (const Tensor& p : model.model->parameters()) {
    device_ = p.device();
    break;
  }
  rank_ = group_->rank();
  if (options_.autocast && *options_.autocast != kBFloat16) {
    fail("pipeline: autocast to {} is not supported; expected bfloat16 (float16 needs a loss scale and an overflow "
         "check shared by all stages, which is not built)",
         dtype_name(*options_.autocast));
  }
  check_agreement(model);  // before anything a rank could refuse alone: a mismatch fails on every rank
  plan_.validate(group_->size());
  if (device_.is_cuda()) {
    // NCCL makes a communicator at its first device operation, which blocks until every rank of
    // the group joins: do that here, where every rank is, not at a stage's first send, which a
    // later stage reaches only after a Gloo-borne header it would never receive (3+ stages).
    Tensor warm = zeros({1}, {.device = device_});
    group_->allreduce({warm})->wait();
  }
  if (static_cast<int>(model.size()) != plan_.num_layers) {
    fail("pipeline: the plan has num_layers {} but the model ({}) has {} blocks; expected the plan made for this model",
         plan_.num_layers, model.model->type_name(), model.size());
  }
  positions_ = plan_.num_positions();
  const int K = plan_.num_stages(), V = plan_.chunks();
  stage_ = plan_.stage_of(rank_);  // this rank's position; its virtual stages are c * positions + stage_
  const StagePlan& mine = plan_.stages[stage_];
  replica_ = static_cast<int>(std::find(mine.ranks.begin(), mine.ranks.end(), rank_) - mine.ranks.begin());
  rows_ = plan_.micro_batch_size() / static_cast<int64_t>(mine.ranks.size());
  schedule_ = plan_.schedule == "interleaved" ? interleaved_schedule(positions_, V, plan_.micro_batches)
                                              : make_schedule(plan_.schedule, positions_, plan_.micro_batches);
  require_valid(schedule_);
  // Which virtual stage holds each tensor: a parameter on several is tied; a buffer must not be.
  std::map<const TensorImpl*, std::set<int>> holders;
  for (int s = 0; s < K; ++s) {
    for (int b = plan_.stages[s].first_layer; b < plan_.stages[s].end_layer; ++b) {
      Owned o = resolve(model, model.blocks[b]);
      for (auto& [n, t] : o.all_parameters) holders[t.unsafe_impl()].insert(s);
      for (auto& [n, t] : o.all_buffers) {
        if (!holders[t.unsafe_impl()].insert(s).second) continue;
        if (holders[t.unsafe_impl()].size() > 1) {
          fail("pipeline: buffer '{}' is owned by blocks of stages {} and {}; only parameters can be tied across "
               "stages (a buffer's copies would drift apart)",
               n, *holders[t.unsafe_impl()].begin(), s);
        }
      }
    }
  }
  for (int c = 0; c < V; ++c) {
    Chunk ch;
    ch.vstage = c * positions_ + stage_;
    const StagePlan& st = plan_.stages[ch.vstage];
    ch.module = std::make_shared<StageModule>(model, st.first_layer, st.end_layer);
    for (auto& [local, t] : ch.module->state_dict()) local_name_[unescaped(local)] = {c, local};
    for (const Action& a : schedule_.stages[stage_]) {
      if (a.type == ActionType::Backward && a.chunk == c) ch.sync_micro_batch = a.micro_batch;
    }
    chunks_.push_back(std::move(ch));
  }
  // state_dict() detaches (other impls): look each name's tensor up among parameters and buffers.
  std::map<std::string, Tensor> by_name;
  for (auto& [name, t] : model.model->named_parameters()) by_name[name] = t;
  for (auto& [name, t] : model.model->named_buffers()) by_name[name] = t;
  for (auto& [name, detached] : model.model->state_dict()) {
    whole_names_.push_back(name);
    const Tensor& t = by_name.count(name) ? by_name[name] : detached;
    const auto it = holders.find(t.unsafe_impl());
    if (it == holders.end() || it->second.empty()) unowned_[name] = t.device().is_cpu() ? t.clone() : t.cpu();
  }
  // Replica groups: every rank makes every position's group, in order (new_group's contract).
  for (int p = 0; p < positions_; ++p) {
    const StagePlan& st = plan_.stages[p];
    if (st.ranks.size() < 2) continue;
    std::vector<int> ranks = st.ranks;
    std::sort(ranks.begin(), ranks.end());
    auto g = new_group(ranks);
    if (p == stage_) replica_group_ = g;
  }
  // Tied parameters' groups: one per set of virtual stages sharing parameters, in the model's
  // order of its parameters (the same on every rank).
  std::map<std::set<int>, size_t> tie_of;
  for (auto& [name, t] : model.model->named_parameters()) {
    const auto it = holders.find(t.unsafe_impl());
    if (it == holders.end() || it->second.size() < 2) continue;
    std::set<int> positions;
    for (int s : it->second) {
      if (!positions.insert(s % positions_).second) {
        fail("pipeline: parameter '{}' is tied between virtual stages on the same ranks (stages {}); expected tied "
             "parameters on different positions of the pipeline",
             name, fmt::join(it->second, ", "));
      }
    }
    auto [pos, fresh] = tie_of.emplace(it->second, ties_.size());
    if (fresh) ties_.push_back({std::vector<int>(it->second.begin(), it->second.end()), nullptr, {}, {}});
    if (positions.count(stage_)) {
      ties_[pos->second].names.push_back(name);
      ties_[pos->second].params.push_back(t);
    }
  }
  for (Tie& tie : ties_) {
    std::vector<int> ranks;
    for (int s : tie.stages) ranks.insert(ranks.end(), plan_.stages[s].ranks.begin(), plan_.stages[s].ranks.end());
    std::sort(ranks.begin(), ranks.end());
    auto g = new_group(ranks);
    for (int s : tie.stages)
      if (s % positions_ == stage_) tie.group = g;
  }
  std::erase_if(ties_, [](const Tie& t) { return !t.group; });
  model = BlockModel();  // other stages' blocks go now (the caller drops its references too)
  for (Chunk& ch : chunks_) {
    if (replica_group_) ch.ddp = std::make_shared<DistributedDataParallel>(ch.module, replica_group_, options_.ddp);
    if (ch.vstage > 0) ch.prev = make_links(ch.vstage - 1);
    if (ch.vstage + 1 < K) ch.next = make_links(ch.vstage + 1);
    ch.eval_prev = ch.prev;
    ch.eval_next = ch.next;
  }
}

void PipelineStage::check_agreement(const BlockModel& model) {
  // [device type, number of blocks, hash of the block names and owned paths, hash of the plan]
  uint64_t blocks = 14695981039346656037ULL, plan = blocks;
  for (const Block& b : model.blocks) {
    blocks = fnv1a(blocks, b.name);
    for (const std::string& o : b.owns) blocks = fnv1a(blocks, o);
  }
  plan = fnv1a(plan, plan_to_json(plan_));
  // The options that decide which collectives a step issues (clipping's and the loss's allreduces).
  plan = fnv1a(plan, fmt::format("{} {} {}", options_.max_grad_norm > 0, options_.report_loss, options_.recompute));
  Tensor mine = zeros({4}, {.dtype = kInt64});
  int64_t* p = mine.data_ptr<int64_t>();
  p[0] = static_cast<int64_t>(device_.type);
  p[1] = static_cast<int64_t>(model.size());
  p[2] = static_cast<int64_t>(blocks);
  p[3] = static_cast<int64_t>(plan);
  TensorList all;
  for (int r = 0; r < group_->size(); ++r) all.push_back(zeros({4}, {.dtype = kInt64}));
  group_->allgather(all, mine)->wait();
  for (int r = 0; r < group_->size(); ++r) {
    const int64_t* q = all[r].data_ptr<int64_t>();
    // Its stage in this rank's plan (not yet validated: -1 when the plan names it nowhere).
    int s = -1;
    for (int k = 0; k < plan_.num_stages() && s < 0; ++k)
      if (std::count(plan_.stages[k].ranks.begin(), plan_.stages[k].ranks.end(), r)) s = k;
    const int64_t* lo = all[0].data_ptr<int64_t>();
    if (q[0] != lo[0]) {
      fail("pipeline: rank {} (stage {}) runs on {} but rank 0 (stage 0) on {}; every stage of a pipeline must run on "
           "the same kind of device",
           r, s, device_type_name(q[0]), device_type_name(lo[0]));
    }
    if (q[1] != lo[1] || q[2] != lo[2]) {
      fail("pipeline: rank {} (stage {}) built a model of {} blocks that differs from rank 0's ({} blocks: names or "
           "owned tensors differ); every rank must build the same model",
           r, s, q[1], lo[1]);
    }
    if (q[3] != lo[3]) {
      fail("pipeline: rank {} runs another plan or other pipeline options (clipping, loss reporting, recomputation) "
           "than rank 0; every rank must load the same plan with the same options",
           r);
    }
  }
}

std::vector<PipelineStage::Link> PipelineStage::make_links(int other_stage) const {
  // [Replica mapping] (pipeline.h): rows of a micro-batch owned by both this replica and each
  // replica of the other stage, in the other stage's replica order (= row order).
  const int64_t B = plan_.micro_batch_size();
  const int64_t lo = replica_ * rows_, hi = lo + rows_;
  const auto& other = plan_.stages[other_stage].ranks;
  const int64_t other_rows = B / static_cast<int64_t>(other.size());
  std::vector<Link> links;
  for (size_t k = 0; k < other.size(); ++k) {
    const int64_t olo = static_cast<int64_t>(k) * other_rows, ohi = olo + other_rows;
    const int64_t a = std::max(lo, olo), b = std::min(hi, ohi);
    if (a >= b) continue;
    Link l;
    l.peer = other[k];
    l.offset = a - lo;
    l.rows = b - a;
    links.push_back(l);
  }
  return links;
}

std::string PipelineStage::where() const {
  return fmt::format("pipeline stage {} of {} (rank {}, replica {} of {})", stage_, positions_, rank_, replica_,
                     num_replicas());
}

void PipelineStage::rethrow(const std::exception& e, const std::string& what, int micro_batch, int peer) const {
  fail("{}: {} of micro-batch {} {} rank {} failed in step {}: {}", where(), what, micro_batch,
       what.rfind("Send", 0) == 0 ? "to" : "from", peer, steps_, e.what());
}

void PipelineStage::send(std::vector<Link>& links, const TensorList& values, int kind, int boundary, int micro_batch,
                         const char* what) {
  // [Boundary tensors on the stage's device] The receiver allocates every tensor on its own device,
  // and the group routes a send by its tensor's device: a CPU tensor from a cuda stage would go
  // through Gloo while the peer's receive is an NCCL one, which (NCCL matching by issue order,
  // ignoring tags) takes the next tensor this rank sends there, or hangs. On sim both went through
  // one Gloo group and matched by tag, so it passed (a helper's audit, 2026-12-04). Refused before
  // anything is sent, so the peer's receive fails when this rank exits rather than waiting.
  for (size_t k = 0; k < values.size(); ++k) {
    if (values[k].defined() && values[k].device() != device_) {
      fail("{}: {} of micro-batch {}: tensor {} of the stage's {} is on {}, but this stage runs on {}; every tensor "
           "crossing a stage boundary must be on the stage's device (e.g. make a mask with .device = the input's "
           "device, or .to() it)",
           where(), what, micro_batch, k, kind == kActivation ? "output" : "input gradients", values[k].device().str(),
           device_.str());
    }
  }
  for (Link& l : links) {
    if (kind == kActivation && !l.agreed) {
      if (values.empty() || values.size() > static_cast<size_t>(kMaxTensors)) {
        fail("{}: {} of micro-batch {} is {} tensors; between 1 and {} can cross a stage boundary", where(), what,
             micro_batch, values.size(), kMaxTensors);
      }
      Tensor h = zeros({kHeaderWords}, {.dtype = kInt64});
      int64_t* p = h.data_ptr<int64_t>();
      p[0] = kHeaderMagic;
      p[1] = static_cast<int64_t>(values.size());
      p[2] = static_cast<int64_t>(device_.type);
      l.specs.clear();
      for (size_t i = 0; i < values.size(); ++i) {
        const Tensor& v = values[i];
        if (!v.defined() || v.dim() == 0 || v.dim() > kMaxDims || v.size(0) != rows_) {
          fail("{}: {} of micro-batch {}: tensor {} of the stage's output is {}; a tensor crossing a stage boundary "
               "must have 1 to {} dimensions, the first of them the batch ({} rows here)",
               where(), what, micro_batch, i, v.defined() ? std::string(dtype_name(v.dtype())) + " " + shape_str(v.sizes()) : "undefined",
               kMaxDims, rows_);
        }
        Spec spec{v.sizes(), v.dtype(), carries_grad(v)};
        spec.shape[0] = l.rows;
        int64_t* w = p + 3 + i * kSpecWords;
        w[0] = static_cast<int64_t>(spec.dtype);
        w[1] = spec.grad ? 1 : 0;
        w[2] = static_cast<int64_t>(spec.shape.size());
        for (size_t d = 0; d < spec.shape.size(); ++d) w[3 + d] = spec.shape[d];
        l.specs.push_back(spec);
      }
      pending_sends_.push_back(group_->send(h, l.peer, tag_of(kHeader, boundary)));
      l.agreed = true;
    }
    // Activations: every tensor; gradients: those whose spec carries one, in order.
    std::vector<size_t> slots;
    for (size_t i = 0; i < l.specs.size(); ++i)
      if (kind == kActivation || l.specs[i].grad) slots.push_back(i);
    if (values.size() != slots.size()) {
      fail("{}: {} of micro-batch {} to rank {} in step {} is {} tensors, but the boundary was agreed in the first step "
           "as {}; the tensors crossing a stage boundary must stay the same from step to step",
           where(), what, micro_batch, l.peer, steps_, values.size(), slots.size());
    }
    for (size_t k = 0; k < slots.size(); ++k) {
      const Spec& spec = l.specs[slots[k]];
      Tensor part = values[k].detach().narrow(0, l.offset, l.rows).contiguous();
      if (part.sizes() != spec.shape || part.dtype() != spec.dtype) {
        fail("{}: {} of micro-batch {} to rank {} in step {} is {} {}{}, but the boundary was agreed in the first step "
             "as {} {}; a tensor crossing a stage boundary must keep its shape and dtype from step to step (same "
             "global batch, same sequence length)",
             where(), what, micro_batch, l.peer, steps_, dtype_name(part.dtype()), shape_str(part.sizes()),
             slots.size() > 1 ? fmt::format(" (tensor {})", slots[k]) : "", dtype_name(spec.dtype),
             shape_str(spec.shape));
      }
      try {
        pending_sends_.push_back(group_->send(
            part, l.peer, tag_of(kind, tensor_index(boundary, plan_.micro_batches, micro_batch, slots[k]))));
      } catch (const std::exception& e) {
        rethrow(e, what, micro_batch, l.peer);
      }
    }
  }
  // A finished send's Work still holds the tensor it sent (its result): drop finished ones now, or
  // every activation sent this step would stay alive until the step ends, whatever the schedule.
  std::erase_if(pending_sends_, [&](const std::shared_ptr<Work>& w) {
    if (!w->is_completed()) return false;
    if (!w->is_success()) wait_sends();
    return true;
  });
}

void PipelineStage::wait_sends() {
  for (auto& w : pending_sends_) {
    try {
      w->wait();
    } catch (const std::exception& e) {
      pending_sends_.clear();
      fail("{}: a send of step {} failed: {}", where(), steps_, e.what());
    }
  }
  pending_sends_.clear();
}

TensorList PipelineStage::receive(std::vector<Link>& links, int kind, int boundary, int micro_batch, const char* what) {
  std::vector<std::shared_ptr<Work>> works;
  std::vector<int> work_peer;
  std::vector<TensorList> parts;  // per link, its tensors
  for (Link& l : links) {
    if (kind == kActivation && !l.agreed) {
      Tensor h = zeros({kHeaderWords}, {.dtype = kInt64});
      try {
        group_->recv(h, l.peer, tag_of(kHeader, boundary))->wait();
      } catch (const std::exception& e) {
        rethrow(e, fmt::format("{} (its shape header)", what), micro_batch, l.peer);
      }
      const int64_t* p = h.data_ptr<int64_t>();
      if (p[0] != kHeaderMagic || p[1] < 1 || p[1] > kMaxTensors) {
        fail("{}: the header of {} from rank {} is malformed ({} tensors, magic {:#x}); is rank {} running the same "
             "plan and version of chorus?",
             where(), what, l.peer, p[1], p[0], l.peer);
      }
      if (p[2] != static_cast<int64_t>(device_.type)) {
        fail("{}: rank {} sends {} from {} tensors, but this stage runs on {}; every stage must run on the same kind "
             "of device",
             where(), l.peer, what, device_type_name(p[2]), device_type_name(static_cast<int64_t>(device_.type)));
      }
      l.specs.clear();
      for (int64_t i = 0; i < p[1]; ++i) {
        const int64_t* w = p + 3 + i * kSpecWords;
        if (w[0] < 0 || w[0] > static_cast<int64_t>(kFloat64) || w[2] < 1 || w[2] > kMaxDims) {
          fail("{}: the header of {} from rank {} describes tensor {} as malformed ({}); is rank {} running the same "
               "plan?",
               where(), what, l.peer, i, std::vector<int64_t>(w, w + kSpecWords), l.peer);
        }
        Spec spec{Shape(w + 3, w + 3 + w[2]), static_cast<DType>(w[0]), w[1] != 0};
        if (spec.shape[0] != l.rows) {
          fail("{}: rank {} announced tensor {} of {} with shape {}, expected {} rows (its share of the micro-batch "
               "under the plan); is rank {} running the same plan?",
               where(), l.peer, i, what, shape_str(spec.shape), l.rows, l.peer);
        }
        l.specs.push_back(spec);
      }
      if (&l != &links.front() && l.specs.size() != links.front().specs.size()) {
        fail("{}: rank {} sends {} tensors of {}, rank {} sends {}; the replicas of a stage must send the same tensors",
             where(), l.peer, l.specs.size(), what, links.front().peer, links.front().specs.size());
      }
      l.agreed = true;
    }
    TensorList got;
    for (size_t i = 0; i < l.specs.size(); ++i) {
      if (kind != kActivation && !l.specs[i].grad) continue;
      Tensor buf = empty(l.specs[i].shape, {.dtype = l.specs[i].dtype, .device = device_});
      try {
        works.push_back(group_->recv(buf, l.peer, tag_of(kind, tensor_index(boundary, plan_.micro_batches, micro_batch, i))));
        work_peer.push_back(l.peer);
      } catch (const std::exception& e) {
        rethrow(e, what, micro_batch, l.peer);
      }
      got.push_back(buf);
    }
    parts.push_back(std::move(got));
  }
  for (size_t i = 0; i < works.size(); ++i) {
    try {
      works[i]->wait();
    } catch (const std::exception& e) {
      rethrow(e, what, micro_batch, work_peer[i]);
    }
  }
  if (parts.size() == 1) return parts[0];
  TensorList out;
  for (size_t i = 0; i < parts[0].size(); ++i) {
    TensorList rows;
    for (const TensorList& p : parts) rows.push_back(p[i]);
    out.push_back(cat(rows, 0));
  }
  return out;
}

StepStats PipelineStage::train_step(const Tensor& input, const Tensor& target, const LossFn& loss_fn,
                                    optim::Optimizer& optimizer) {
  MultiLossFn multi;
  if (loss_fn) {
    multi = [&](const TensorList& out, const TensorList& targets) {
      if (out.size() != 1) {
        fail("{}: the last block returned {} tensors; train_step(Tensor, Tensor, LossFn) takes one (use the TensorList "
             "overload)",
             where(), out.size());
      }
      return loss_fn(out[0], targets.empty() ? Tensor() : targets[0]);
    };
  }
  TensorList inputs, targets;
  if (is_first()) inputs.push_back(input);
  if (is_last()) targets.push_back(target);
  return train_step(inputs, targets, multi, optimizer);
}

void PipelineStage::check_step_inputs(const char* call, const TensorList& inputs, const TensorList& targets,
                                      bool has_loss) const {
  auto check_rows = [&](const TensorList& list, const char* what, const char* stage) {
    for (size_t i = 0; i < list.size(); ++i) {
      const Tensor& t = list[i];
      if (!t.defined() || t.dim() == 0 || t.size(0) != plan_.global_batch) {
        fail("{}: {}'s {}{} has shape {}; expected {} rows (the plan's global_batch) on the {} stage", where(), call,
             what, list.size() > 1 ? fmt::format(" {}", i) : "", t.defined() ? shape_str(t.sizes()) : "(undefined)",
             plan_.global_batch, stage);
      }
    }
  };
  if (is_first()) {
    if (inputs.empty()) fail("{}: {} was given no input; the first stage needs the first block's inputs", where(), call);
    check_rows(inputs, "input", "first");
  }
  if (is_last()) {
    check_rows(targets, "target", "last");
    if (!has_loss) fail("{}: {} needs a loss function on the last stage", where(), call);
  }
}

TensorList PipelineStage::rows_of(const TensorList& list, int micro_batch) const {
  // [Replica mapping] this replica's rows of micro-batch m, on the stage's device.
  TensorList out;
  for (const Tensor& t : list) {
    Tensor rows = t.narrow(0, micro_batch * plan_.micro_batch_size() + replica_ * rows_, rows_);
    out.push_back(rows.device() == device_ ? rows : rows.to(device_));
  }
  return out;
}

StepStats PipelineStage::train_step(const TensorList& inputs, const TensorList& targets, const MultiLossFn& loss_fn,
                                    optim::Optimizer& optimizer) {
  const auto start = Clock::now();
  const int M = plan_.micro_batches;
  check_step_inputs("train_step", inputs, targets, static_cast<bool>(loss_fn));
  for (Chunk& ch : chunks_) ch.module->zero_grad();
  // Memory counters of the stage's device: the CPU's (tensor/cpu_memory.h) or its allocator's.
  // A forward's share is measured on this thread only on the CPU, so that a communication thread
  // freeing an older tensor meanwhile does not hide what the forward kept.
  auto allocated = [&] { return device_.is_cpu() ? cpu_memory_allocated() : memory_allocated(device_); };
  auto allocated_here = [&]() -> long long {
    return device_.is_cpu() ? cpu_memory_allocated_by_this_thread() : static_cast<long long>(memory_allocated(device_));
  };
  auto peak = [&] { return device_.is_cpu() ? cpu_max_memory_allocated() : max_memory_allocated(device_); };
  if (device_.is_cpu()) reset_cpu_peak_memory_stats();
  else reset_peak_memory_stats(device_);
  const size_t base_bytes = allocated();

  // Per micro-batch (and chunk: slot c * M + m) state; a forward's entries live until its backward
  // (that is the activation memory the schedule bounds).
  const int K = plan_.num_stages();
  const size_t slots = static_cast<size_t>(M) * chunks_.size();
  std::vector<TensorList> stage_in(slots), stage_out(slots), grad_out(slots), grad_in(slots);
  std::vector<Tensor> loss_of(slots);
  std::vector<double> losses(slots, 0.0);
  std::vector<size_t> held_bytes(slots, 0);  // what each forward left allocated
  size_t live_bytes = 0;
  const double loss_scale = static_cast<double>(rows_) / plan_.global_batch;  // [Loss scaling]
  int in_flight = 0;
  StepStats stats;
  auto wait_ms = [](Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); };

  for (const Action& a : schedule_.stages[stage_]) {
    const int m = a.micro_batch;
    Chunk& ch = chunks_[a.type == ActionType::GradSync || a.type == ActionType::OptimizerStep ? 0 : a.chunk];
    const size_t slot = static_cast<size_t>(a.chunk) * M + (m < 0 ? 0 : m);
    const bool first_v = ch.vstage == 0, last_v = ch.vstage == K - 1;
    switch (a.type) {
      case ActionType::RecvActivation: {
        const auto t0 = Clock::now();
        TensorList x = receive(ch.prev, kActivation, ch.vstage - 1, m, "RecvActivation");
        stats.communication_wait_ms += wait_ms(t0);
        for (size_t i = 0; i < x.size(); ++i)
          if (ch.prev.front().specs[i].grad) x[i].requires_grad_(true);
        stage_in[slot] = std::move(x);
        break;
      }
      case ActionType::Forward: {
        const TensorList x = first_v ? rows_of(inputs, m) : stage_in[slot];
        const long long before = allocated_here();
        // The micro-batch whose backward comes last syncs (its forward too: DDP prepares the
        // reduction there); every other one accumulates locally under no_sync.
        std::optional<DistributedDataParallel::NoSyncGuard> no_sync;
        if (ch.ddp && m != ch.sync_micro_batch) no_sync.emplace(ch.ddp->reducer());
        StageModule* stage_module = ch.module.get();
        auto stage_forward = [&] {
          if (!options_.recompute) return stage_module->forward_blocks(x);
          return nn::utils::checkpoint([stage_module](const TensorList& in) { return stage_module->forward_blocks(in); },
                                       x, stage_module->parameters());
        };
        std::optional<autocast::AutocastGuard> amp;
        if (options_.autocast) amp.emplace(device_.type, *options_.autocast);
        TensorList out = ch.ddp ? ch.ddp->forward_multi(stage_forward) : stage_forward();
        if (last_v) {
          Tensor loss = loss_fn(out, rows_of(targets, m));
          if (!loss.defined() || loss.numel() != 1) {
            fail("{}: the loss function returned shape {}; expected a scalar (the mean over the rows)", where(),
                 loss.defined() ? shape_str(loss.sizes()) : "(undefined)");
          }
          loss_of[slot] = loss * loss_scale;
          losses[slot] = loss_of[slot].item<double>();
        }
        stage_out[slot] = std::move(out);
        stats.max_in_flight = std::max(stats.max_in_flight, ++in_flight);
        const long long after = allocated_here();
        size_t received = 0;
        if (!first_v)
          for (const Tensor& t : x) received += t.nbytes();
        held_bytes[slot] = static_cast<size_t>(std::max(0LL, after - before)) + received;
        live_bytes += held_bytes[slot];
        stats.peak_activation_bytes = std::max(stats.peak_activation_bytes, live_bytes);
        break;
      }
      case ActionType::SendActivation:
        send(ch.next, stage_out[slot], kActivation, ch.vstage, m, "SendActivation");
        break;
      case ActionType::RecvGrad: {
        const auto t0 = Clock::now();
        grad_out[slot] = receive(ch.next, kGrad, ch.vstage, m, "RecvGrad");
        stats.communication_wait_ms += wait_ms(t0);
        break;
      }
      case ActionType::Backward: {
        std::optional<DistributedDataParallel::NoSyncGuard> no_sync;
        if (ch.ddp && m != ch.sync_micro_batch) no_sync.emplace(ch.ddp->reducer());
        if (last_v) {
          loss_of[slot].backward();
        } else {
          // The outputs whose gradients came back (those that carry one, in order).
          TensorList roots, grads;
          size_t k = 0;
          for (size_t i = 0; i < stage_out[slot].size(); ++i) {
            if (!ch.next.front().specs[i].grad) continue;
            roots.push_back(stage_out[slot][i]);
            grads.push_back(grad_out[slot][k++]);
          }
          if (!roots.empty()) autograd::backward(roots, grads);
        }
        if (!first_v) {
          for (size_t i = 0; i < stage_in[slot].size(); ++i) {
            if (!ch.prev.front().specs[i].grad) continue;
            const Tensor& in = stage_in[slot][i];
            grad_in[slot].push_back(in.grad().defined() ? in.grad() : zeros_like(in));
          }
        }
        stage_out[slot].clear();
        stage_in[slot].clear();
        grad_out[slot].clear();
        loss_of[slot] = Tensor();
        --in_flight;
        live_bytes -= held_bytes[slot];
        break;
      }
      case ActionType::SendGrad:
        send(ch.prev, grad_in[slot], kGrad, ch.vstage - 1, m, "SendGrad");
        grad_in[slot].clear();
        break;
      case ActionType::GradSync: {
        // DDP reduced during each chunk's last backward (its engine callback waited for every
        // bucket); the average over replicas becomes the sum of their shares ([Loss scaling]).
        if (replica_group_) {
          NoGradGuard no_grad;
          const double r = static_cast<double>(num_replicas());
          for (Tensor& p : parameters()) {
            if (p.grad().defined()) p.mutable_grad().mul_(r);
          }
        }
        reduce_tied_gradients();
        break;
      }
      case ActionType::OptimizerStep:
        if (options_.max_grad_norm > 0) stats.grad_norm = clip_gradients(options_.max_grad_norm);
        optimizer.step();
        break;
    }
  }
  // Sends were posted asynchronously (isend); the step ends when every one has been received.
  const auto sends_start = Clock::now();
  wait_sends();
  stats.communication_wait_ms += wait_ms(sends_start);
  stats.peak_step_bytes = peak() - std::min(base_bytes, peak());
  double loss = 0;
  for (double l : losses) loss += l;
  if (options_.report_loss) {
    Tensor t = full({1}, is_last() ? loss : 0.0, {.dtype = kFloat64});
    group_->allreduce({t})->wait();
    loss = t.item<double>();
  }
  stats.loss = loss;
  stats.step_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  ++steps_;
  return stats;
}

EvalStats PipelineStage::eval_step(const TensorList& inputs, const TensorList& targets, const MultiLossFn& loss_fn) {
  const auto start = Clock::now();
  const int M = plan_.micro_batches;
  check_step_inputs("eval_step", inputs, targets, static_cast<bool>(loss_fn));
  // Replicas evaluate with replica 0's buffers (BatchNorm's running statistics), as DDP's forward
  // broadcasts them before each training forward: the last training forward updated each replica's
  // own copy from its own rows.
  if (replica_group_ && options_.ddp.broadcast_buffers) {
    TensorList buffers;
    for (Chunk& ch : chunks_)
      for (const Tensor& b : ch.module->buffers()) buffers.push_back(b);
    if (!buffers.empty()) replica_group_->broadcast(buffers, 0)->wait();
  }
  const bool was_training = module()->is_training();
  for (Chunk& ch : chunks_) ch.module->eval();
  struct RestoreMode {
    std::vector<Chunk>& chunks;
    bool training;
    ~RestoreMode() {
      for (Chunk& ch : chunks) ch.module->train(training);
    }
  } restore{chunks_, was_training};
  NoGradGuard no_grad;
  EvalStats stats;
  const double loss_scale = static_cast<double>(rows_) / plan_.global_batch;  // [Loss scaling]
  double loss = 0;
  // The forward half of the training schedule: its receives, forwards and sends in the same order
  // (a subsequence of an order that runs under blocking sends runs too; interleaved included).
  const int K = plan_.num_stages();
  std::vector<TensorList> received(static_cast<size_t>(M) * chunks_.size()), produced(received.size());
  for (const Action& a : schedule_.stages[stage_]) {
    if (a.type != ActionType::RecvActivation && a.type != ActionType::Forward && a.type != ActionType::SendActivation) {
      continue;
    }
    Chunk& ch = chunks_[a.chunk];
    const int m = a.micro_batch;
    const size_t slot = static_cast<size_t>(a.chunk) * M + m;
    if (a.type == ActionType::RecvActivation) {
      received[slot] = receive(ch.eval_prev, kActivation, ch.vstage - 1, m, "RecvActivation (eval)");
    } else if (a.type == ActionType::SendActivation) {
      send(ch.eval_next, produced[slot], kActivation, ch.vstage, m, "SendActivation (eval)");
      produced[slot].clear();
    } else {
      TensorList x = ch.vstage == 0 ? rows_of(inputs, m) : std::move(received[slot]);
      received[slot].clear();
      std::optional<autocast::AutocastGuard> amp;
      if (options_.autocast) amp.emplace(device_.type, *options_.autocast);
      TensorList out = ch.module->forward_blocks(x);
      if (ch.vstage == K - 1) {
        Tensor l = loss_fn(out, rows_of(targets, m));
        if (!l.defined() || l.numel() != 1) {
          fail("{}: the loss function returned shape {}; expected a scalar (the mean over the rows)", where(),
               l.defined() ? shape_str(l.sizes()) : "(undefined)");
        }
        loss += l.item<double>() * loss_scale;
        stats.outputs.push_back(std::move(out));
      } else {
        produced[slot] = std::move(out);
      }
    }
  }
  wait_sends();
  if (options_.report_loss) {
    Tensor t = full({1}, is_last() ? loss : 0.0, {.dtype = kFloat64});
    group_->allreduce({t})->wait();
    loss = t.item<double>();
  }
  stats.loss = loss;
  stats.step_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  return stats;
}

void PipelineStage::reduce_tied_gradients() {
  // [Tied parameters] each stage's gradient, once over its replicas, summed over the stages.
  if (fault::removed(fault::Point::kTiedGradientSum)) return;  // a negative control (tensor/fault.h)
  NoGradGuard no_grad;
  const double share = 1.0 / num_replicas();
  for (Tie& tie : ties_) {
    TensorList grads;
    for (Tensor& p : tie.params) {
      if (!p.grad().defined()) p.mutable_grad() = zeros_like(p);
      if (share != 1.0) p.mutable_grad().mul_(share);
      grads.push_back(p.grad());
    }
    try {
      tie.group->allreduce(grads)->wait();
    } catch (const std::exception& e) {
      fail("{}: summing the gradients of the tied parameters ({}) over stages {} failed in step {}: {}", where(),
           fmt::join(tie.names, ", "), fmt::join(tie.stages, ", "), steps_, e.what());
    }
  }
}

double PipelineStage::clip_gradients(double max_norm) {
  NoGradGuard no_grad;
  // Each rank's squared norm over its stage's parameters, divided by the stage's replicas (they all
  // hold the same gradients); a tied parameter counts on the lowest stage holding it only.
  std::set<const TensorImpl*> skip;
  for (const Tie& tie : ties_)
    if (tie.stages.front() % positions_ != stage_)
      for (const Tensor& p : tie.params) skip.insert(p.unsafe_impl());
  double sum = 0;
  for (const Tensor& p : parameters()) {
    if (!p.grad().defined() || skip.count(p.unsafe_impl())) continue;
    const Tensor g = p.grad().to(kFloat64);
    sum += (g * g).sum().item<double>();
  }
  Tensor total = full({1}, sum / num_replicas(), {.dtype = kFloat64});
  group_->allreduce({total})->wait();
  const double norm = std::sqrt(total.item<double>());
  const double scale = max_norm / (norm + 1e-6);
  if (scale < 1) {
    for (Tensor& p : parameters())
      if (p.grad().defined()) p.mutable_grad().mul_(scale);
  }
  return norm;
}

std::vector<std::string> PipelineStage::tied_parameters() const {
  std::vector<std::string> out;
  for (const Tie& t : ties_) out.insert(out.end(), t.names.begin(), t.names.end());
  return out;
}

std::vector<Tensor> PipelineStage::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters()) out.push_back(t);
  return out;
}

nn::NamedTensors PipelineStage::named_parameters() const {
  nn::NamedTensors out;
  std::set<const TensorImpl*> seen;
  for (const Chunk& ch : chunks_)
    for (auto& [name, t] : ch.module->named_parameters())
      if (seen.insert(t.unsafe_impl()).second) out.emplace_back(unescaped(name), t);
  return out;
}

nn::NamedTensors PipelineStage::state_dict() const {
  nn::NamedTensors out;
  std::map<std::string, Tensor> by_name;
  for (const Chunk& ch : chunks_)
    for (auto& [n, t] : ch.module->state_dict()) by_name.emplace(unescaped(n), t);
  for (const std::string& name : whole_names_) {
    auto it = by_name.find(name);
    if (it != by_name.end()) out.emplace_back(name, it->second);
  }
  return out;
}

nn::NamedTensors PipelineStage::gather_state_dict(int dst) {
  if (dst < 0 || dst >= group_->size()) fail("{}: gather_state_dict to rank {}; expected a rank in [0, {})", where(), dst, group_->size());
  nn::NamedTensors mine = state_dict();
  // Replica 0 of every stage but dst's sends its part (dst has its own stage's tensors).
  const bool sender = replica_ == 0 && stage_ != plan_.stage_of(dst);
  if (sender) {
    // Names, shapes and dtypes as JSON bytes (length first), then each tensor.
    nlohmann::json desc = nlohmann::json::array();
    for (auto& [name, t] : mine) desc.push_back({name, static_cast<int>(t.dtype()), t.sizes()});
    const std::string text = desc.dump();
    Tensor len = full({1}, static_cast<int64_t>(text.size()), {.dtype = kInt64});
    Tensor bytes = zeros({static_cast<int64_t>(text.size())}, {.dtype = kUInt8});
    std::copy(text.begin(), text.end(), bytes.data_ptr<uint8_t>());
    std::vector<std::shared_ptr<Work>> works{group_->send(len, dst, tag_of(kCheckpoint, 0)),
                                             group_->send(bytes, dst, tag_of(kCheckpoint, 1))};
    int i = 2;
    // From host memory, as dst receives (a device tensor would go over the device transport).
    for (auto& [name, t] : mine)
      works.push_back(group_->send(t.device().is_cpu() ? t.contiguous() : t.cpu(), dst, tag_of(kCheckpoint, i++)));
    for (auto& w : works) w->wait();
    return {};
  }
  if (rank_ != dst) return {};
  std::map<std::string, Tensor> got(unowned_.begin(), unowned_.end());
  for (int s = 0; s < positions_; ++s) {
    if (s == stage_) {
      for (auto& [name, t] : mine) got.emplace(name, t.device().is_cpu() ? t.clone() : t.cpu());
      continue;
    }
    const int src = plan_.stages[s].ranks[0];
    Tensor len = zeros({1}, {.dtype = kInt64});
    group_->recv(len, src, tag_of(kCheckpoint, 0))->wait();
    Tensor bytes = zeros({len.item<int64_t>()}, {.dtype = kUInt8});
    group_->recv(bytes, src, tag_of(kCheckpoint, 1))->wait();
    const uint8_t* p = bytes.data_ptr<uint8_t>();
    nlohmann::json desc = nlohmann::json::parse(std::string(p, p + bytes.numel()));
    int i = 2;
    for (const auto& d : desc) {
      Tensor t = empty(d[2].get<Shape>(), {.dtype = static_cast<DType>(d[1].get<int>())});
      group_->recv(t, src, tag_of(kCheckpoint, i++))->wait();
      got.emplace(d[0].get<std::string>(), t);  // a tied parameter: the first stage's copy
    }
  }
  nn::NamedTensors out;
  for (const std::string& name : whole_names_) {
    auto it = got.find(name);
    if (it != got.end()) out.emplace_back(name, it->second);
  }
  return out;
}

void PipelineStage::load_state_dict(const nn::NamedTensors& whole_model, bool strict) {
  std::set<std::string> known(whole_names_.begin(), whole_names_.end());
  std::vector<nn::NamedTensors> mine(chunks_.size());
  std::vector<std::pair<Tensor*, Tensor>> pending_unowned;  // set once every check has passed
  std::set<std::string> given;
  for (const auto& [name, t] : whole_model) {
    if (!known.count(name)) {
      if (strict) {
        fail("{}: load_state_dict: key '{}' is not a parameter or buffer of the model (expected names such as '{}')",
             where(), name, whole_names_.empty() ? std::string("?") : whole_names_.front());
      }
      continue;
    }
    given.insert(name);
    auto local = local_name_.find(name);
    if (local != local_name_.end()) {
      mine[local->second.first].emplace_back(local->second.second, t);
    } else if (auto u = unowned_.find(name); u != unowned_.end()) {
      // A tensor no block owns (kept with the stage so the gathered state dict is whole): checked as
      // the owned ones, so strict loading refuses a wrong shape rather than keeping the old value.
      if (u->second.sizes() != t.sizes()) {
        if (strict) {
          fail("{}: load_state_dict: '{}' has shape {} in the state dict, but the model's is {}", where(), name,
               shape_str(t.sizes()), shape_str(u->second.sizes()));
        }
        continue;
      }
      pending_unowned.emplace_back(&u->second, t);
    }
  }
  if (strict) {
    std::vector<std::string> missing;
    for (const auto& [name, local] : local_name_)
      if (!given.count(name)) missing.push_back(name);
    // What no block owns is stage 0's to save (its checkpoint file holds them; the other stages'
    // files do not), so stage 0 requires them.
    if (stage_ == 0)
      for (const auto& [name, t] : unowned_)
        if (!given.count(name)) missing.push_back(name);
    if (!missing.empty()) {
      fail("{}: load_state_dict: the state dict lacks {} tensor(s) of this stage: {}", where(), missing.size(),
           fmt::join(missing, ", "));
    }
  }
  for (size_t c = 0; c < chunks_.size(); ++c) chunks_[c].module->load_state_dict(mine[c], strict);
  for (auto& [dst, t] : pending_unowned) *dst = t.to(dst->dtype()).cpu().clone();
}

// ------------------------------------------------------------------ checkpoints
namespace {

constexpr const char* kManifest = "pipeline-checkpoint.json";

// generation: "" or "b" (save_checkpoint alternates them when it saves a step the manifest names).
std::string stage_file(int64_t step, int stage, int stages, const std::string& generation) {
  return fmt::format("pipeline-step{}{}-stage{}-of-{}.safetensors", step, generation, stage, stages);
}

nlohmann::json read_manifest(const std::string& dir) {
  nlohmann::json m = read_checkpoint_index(pipeline_checkpoint_manifest(dir), dir, "pipeline checkpoint", "manifest",
                                           {"step", "files", "plan"});
  if (!m["files"].is_array()) fail("pipeline checkpoint: the manifest {}'s files are not a list", pipeline_checkpoint_manifest(dir));
  return m;
}

}  // namespace

std::string pipeline_checkpoint_manifest(const std::string& dir) { return dir + "/" + kManifest; }

bool has_pipeline_checkpoint(const std::string& dir) {
  return std::filesystem::exists(pipeline_checkpoint_manifest(dir));
}

void PipelineStage::agree(const std::string& error, const std::string& what) {
  agree_on_failure(*group_, error, where(), what);
}

void PipelineStage::save_checkpoint(const std::string& dir, const optim::Optimizer& optimizer,
                                    const optim::LRScheduler* scheduler, int64_t epoch, int64_t step,
                                    const nn::Metadata& extra) {
  namespace fs = std::filesystem;
  const int S = positions_;
  std::error_code ec;
  fs::create_directories(dir, ec);
  // Saving a step the manifest already names (a rerun into the same folder) writes the other
  // generation of file names, so a crash midway leaves the complete previous set named.
  bool reuse_names = false;
  if (rank_ == 0 && has_pipeline_checkpoint(dir)) {
    try {
      const nlohmann::json m = read_manifest(dir);
      reuse_names = m["step"].get<int64_t>() == step && m["files"][0].get<std::string>() == stage_file(step, 0, S, "");
    } catch (const std::exception&) {
      // an unreadable manifest is replaced below
    }
  }
  const std::string generation = agree_generation(*group_, reuse_names);
  std::string error;
  if (replica_ == 0) {
    try {
      nn::Checkpoint c;
      for (auto& [name, t] : state_dict()) c.model.emplace_back(name, t.device().is_cpu() ? t : t.cpu());
      // Stage 0's file also holds what no block owns (BERT's pooler), so the files make the whole model.
      if (stage_ == 0)
        for (auto& [name, t] : unowned_) c.model.emplace_back(name, t);
      c.optimizer = optimizer.state_dict();
      for (auto& [name, t] : c.optimizer)
        if (!t.device().is_cpu()) t = t.cpu();
      if (scheduler) c.scheduler = scheduler->state_dict();
      c.epoch = epoch;
      c.step = step;
      c.capture_rng();
      c.extra = extra;
      c.extra["pipeline_stage"] = std::to_string(stage_);
      c.extra["pipeline_stages"] = std::to_string(S);
      c.save(dir + "/" + stage_file(step, stage_, S, generation));
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  // Every stage's file is on disk before the manifest names them.
  agree(error, fmt::format("writing the checkpoint of step {} to {}", step, dir));
  if (rank_ == 0) {
    try {
      nlohmann::json m;
      m["step"] = step;
      m["stages"] = S;
      m["files"] = nlohmann::json::array();
      for (int s = 0; s < S; ++s) m["files"].push_back(stage_file(step, s, S, generation));
      m["plan"] = nlohmann::json::parse(plan_to_json(plan_));
      nn::atomic_write(pipeline_checkpoint_manifest(dir), m.dump(1) + "\n");
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  agree(error, fmt::format("writing the manifest of step {} in {}", step, dir));
  // The manifest names this step's files now: the others of this stage can go.
  if (replica_ == 0) {
    remove_superseded(dir, "pipeline-step", fmt::format("-stage{}-of-{}.safetensors", stage_, S),
                      stage_file(step, stage_, S, generation));
  }
  // Returns with the folder holding this checkpoint only, on every rank.
  group_->barrier()->wait();
}

nn::Checkpoint PipelineStage::load_checkpoint(const std::string& dir, optim::Optimizer& optimizer,
                                              optim::LRScheduler* scheduler, const nn::Metadata& expect) {
  nn::Checkpoint c;
  std::string error;
  try {
    const nlohmann::json m = read_manifest(dir);
    const std::string theirs = m["plan"].dump(), ours = nlohmann::json::parse(plan_to_json(plan_)).dump();
    if (theirs != ours) {
      fail("the pipeline checkpoint in {} was written under another plan ({}); this run's plan is {}. Resuming "
           "needs the same plan; load_pipeline_model reads the model of any plan",
           dir, theirs, ours);
    }
    const std::string path = dir + "/" + m["files"].at(stage_).get<std::string>();
    c = nn::Checkpoint::load(path);
    if (c.step != m["step"].get<int64_t>()) {
      fail("{} holds step {}, but the manifest names step {}", path, c.step, m["step"].get<int64_t>());
    }
    for (const auto& [key, value] : expect) {
      auto it = c.extra.find(key);
      if (it == c.extra.end()) fail("the checkpoint {} does not say which {} it was written with", dir, key);
      if (it->second != value) {
        fail("the checkpoint {} was written with {} {}, not the {} asked for now", dir, key, it->second, value);
      }
    }
    load_state_dict(c.model, true);
    optimizer.load_state_dict(c.optimizer);
    if (scheduler) scheduler->load_state_dict(c.scheduler);
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree(error, fmt::format("loading the pipeline checkpoint in {}", dir));
  c.restore_rng();
  return c;
}

nn::NamedTensors load_pipeline_model(const std::string& dir, int64_t* step) {
  const nlohmann::json m = read_manifest(dir);
  nn::NamedTensors out;
  std::set<std::string> seen;
  for (const auto& f : m["files"]) {
    nn::Checkpoint c = nn::Checkpoint::load(dir + "/" + f.get<std::string>());
    for (auto& [name, t] : c.model)
      if (seen.insert(name).second) out.emplace_back(name, t);  // a tied parameter: the first stage's copy
  }
  if (step) *step = m["step"].get<int64_t>();
  return out;
}

}  // namespace chorus::distributed::pipeline
