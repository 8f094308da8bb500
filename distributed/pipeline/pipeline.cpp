#include "distributed/pipeline/pipeline.h"

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>
#include <optional>

#include "autograd/grad_mode.h"
#include "distributed/init.h"
#include "nn/utils/checkpoint.h"
#include "tensor/caching_allocator.h"
#include "tensor/cpu_memory.h"
#include "tensor/ops.h"

namespace chorus::distributed::pipeline {

using Clock = std::chrono::steady_clock;

// ------------------------------------------------------------------ StageModule
StageModule::StageModule(const nn::Sequential& model, int first_layer, int end_layer)
    : nn::Module("PipelineStage"), first_layer_(first_layer), end_layer_(end_layer) {
  auto children = model.named_children();
  if (first_layer < 0 || end_layer > static_cast<int>(children.size()) || first_layer >= end_layer) {
    fail("pipeline: a stage of layers [{}, {}) does not fit a model of {} layers", first_layer, end_layer,
         children.size());
  }
  for (int i = first_layer; i < end_layer; ++i) {
    register_module(children[i].first, children[i].second);
    layers_.push_back(children[i].second);
  }
}

Tensor StageModule::forward(const Tensor& input) {
  Tensor x = input;
  for (auto& layer : layers_) x = layer->forward(x);
  return x;
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

// [Boundary header] Before the first activation on a link: dtype, rank and sizes, so the receiver
// can allocate; afterwards tensors travel without one and a change is an error on the sender.
constexpr int64_t kHeaderWords = 10, kMaxDims = kHeaderWords - 3, kHeaderMagic = 0x70697065;  // "pipe"

}  // namespace

PipelineStage::PipelineStage(std::shared_ptr<nn::Sequential> model, PipelinePlan plan,
                             std::shared_ptr<ProcessGroup> group, PipelineOptions options)
    : plan_(std::move(plan)), group_(std::move(group)), options_(options) {
  if (!model) fail("pipeline: the model is null");
  if (!group_) fail("pipeline: the process group is null (call init_process_group first)");
  plan_.validate(group_->size());
  if (static_cast<int>(model->size()) != plan_.num_layers) {
    fail("pipeline: the plan has num_layers {} but the model (a Sequential) has {} layers; expected the plan made for "
         "this model",
         plan_.num_layers, model->size());
  }
  rank_ = group_->rank();
  stage_ = plan_.stage_of(rank_);
  const StagePlan& mine = plan_.stages[stage_];
  replica_ = static_cast<int>(std::find(mine.ranks.begin(), mine.ranks.end(), rank_) - mine.ranks.begin());
  rows_ = plan_.micro_batch_size() / static_cast<int64_t>(mine.ranks.size());
  schedule_ = make_schedule(plan_.schedule, plan_.num_stages(), plan_.micro_batches);
  require_valid(schedule_);
  for (const Action& a : schedule_.stages[stage_]) {
    if (a.type == ActionType::Backward) sync_micro_batch_ = a.micro_batch;
  }
  module_ = std::make_shared<StageModule>(*model, mine.first_layer, mine.end_layer);
  // The stage runs where its parameters are (move the model before making the stage); received
  // tensors are allocated there, and inputs and targets are moved there.
  for (const Tensor& p : module_->parameters()) {
    device_ = p.device();
    break;
  }
  // Replica groups: every rank makes every stage's group, in stage order (new_group's contract).
  for (const StagePlan& st : plan_.stages) {
    if (st.ranks.size() < 2) continue;
    std::vector<int> ranks = st.ranks;
    std::sort(ranks.begin(), ranks.end());
    auto g = new_group(ranks);
    if (&st == &mine) replica_group_ = g;
  }
  if (replica_group_) ddp_ = std::make_shared<DistributedDataParallel>(module_, replica_group_, options_.ddp);
  if (stage_ > 0) prev_links_ = make_links(stage_ - 1);
  if (stage_ + 1 < plan_.num_stages()) next_links_ = make_links(stage_ + 1);
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
  return fmt::format("pipeline stage {} of {} (rank {}, replica {} of {})", stage_, plan_.num_stages(), rank_, replica_,
                     num_replicas());
}

void PipelineStage::rethrow(const std::exception& e, const std::string& what, int micro_batch, int peer) const {
  fail("{}: {} of micro-batch {} {} rank {} failed in step {}: {}", where(), what, micro_batch,
       what.rfind("Send", 0) == 0 ? "to" : "from", peer, steps_, e.what());
}

void PipelineStage::send(std::vector<Link>& links, const Tensor& value, int kind, int micro_batch, const char* what,
                         bool header) {
  for (Link& l : links) {
    Tensor part = value.narrow(0, l.offset, l.rows).contiguous();
    if (header && !l.agreed) {
      if (static_cast<int64_t>(part.dim()) > kMaxDims) {
        fail("{}: {} of micro-batch {} has {} dimensions; at most {} can cross a stage boundary", where(), what,
             micro_batch, part.dim(), kMaxDims);
      }
      Tensor h = zeros({kHeaderWords}, {.dtype = kInt64});
      int64_t* p = h.data_ptr<int64_t>();
      p[0] = kHeaderMagic;
      p[1] = static_cast<int64_t>(part.dtype());
      p[2] = part.dim();
      for (int64_t d = 0; d < part.dim(); ++d) p[3 + d] = part.sizes()[d];
      pending_sends_.push_back(group_->send(h, l.peer, tag_of(kHeader, 0)));
      l.shape = part.sizes();
      l.dtype = part.dtype();
      l.agreed = true;
    }
    if (part.sizes() != l.shape || part.dtype() != l.dtype) {
      fail("{}: {} of micro-batch {} to rank {} in step {} is {} {}, but the boundary was agreed in the first step as {} "
           "{}; a tensor crossing a stage boundary must keep its shape and dtype from step to step (same global "
           "batch, same sequence length)",
           where(), what, micro_batch, l.peer, steps_, dtype_name(part.dtype()), shape_str(part.sizes()),
           dtype_name(l.dtype), shape_str(l.shape));
    }
    try {
      pending_sends_.push_back(group_->send(part, l.peer, tag_of(kind, micro_batch)));
    } catch (const std::exception& e) {
      rethrow(e, what, micro_batch, l.peer);
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

Tensor PipelineStage::receive(std::vector<Link>& links, int kind, int micro_batch, const char* what, bool header) {
  std::vector<std::shared_ptr<Work>> works;
  TensorList parts;
  for (Link& l : links) {
    if (header && !l.agreed) {
      Tensor h = zeros({kHeaderWords}, {.dtype = kInt64});
      try {
        group_->recv(h, l.peer, tag_of(kHeader, 0))->wait();
      } catch (const std::exception& e) {
        rethrow(e, fmt::format("{} (its shape header)", what), micro_batch, l.peer);
      }
      const int64_t* p = h.data_ptr<int64_t>();
      if (p[0] != kHeaderMagic || p[2] < 0 || p[2] > kMaxDims || p[1] < 0 || p[1] > static_cast<int64_t>(kFloat64)) {
        fail("{}: the shape header of {} from rank {} is malformed ({}); is rank {} running the same plan?", where(),
             what, l.peer, std::vector<int64_t>(p, p + kHeaderWords), l.peer);
      }
      l.dtype = static_cast<DType>(p[1]);
      l.shape.assign(p + 3, p + 3 + p[2]);
      if (l.shape.empty() || l.shape[0] != l.rows) {
        fail("{}: rank {} announced {} of shape {}, expected {} rows (its share of the micro-batch under the plan); "
             "is rank {} running the same plan?",
             where(), l.peer, what, shape_str(l.shape), l.rows, l.peer);
      }
      l.agreed = true;
    }
    Tensor buf = empty(l.shape, {.dtype = l.dtype, .device = device_});
    try {
      works.push_back(group_->recv(buf, l.peer, tag_of(kind, micro_batch)));
    } catch (const std::exception& e) {
      rethrow(e, what, micro_batch, l.peer);
    }
    parts.push_back(buf);
  }
  for (size_t i = 0; i < works.size(); ++i) {
    try {
      works[i]->wait();
    } catch (const std::exception& e) {
      rethrow(e, what, micro_batch, links[i].peer);
    }
  }
  return parts.size() == 1 ? parts[0] : cat(parts, 0);
}

StepStats PipelineStage::train_step(const Tensor& input, const Tensor& target, const LossFn& loss_fn,
                                    optim::Optimizer& optimizer) {
  const auto start = Clock::now();
  const int64_t B = plan_.micro_batch_size();
  const int M = plan_.micro_batches;
  if (is_first()) {
    if (!input.defined() || input.dim() == 0 || input.size(0) != plan_.global_batch) {
      fail("{}: train_step's input has shape {}; expected {} rows (the plan's global_batch) on the first stage",
           where(), input.defined() ? shape_str(input.sizes()) : "(undefined)", plan_.global_batch);
    }
  }
  if (is_last()) {
    if (!target.defined() || target.dim() == 0 || target.size(0) != plan_.global_batch) {
      fail("{}: train_step's target has shape {}; expected {} rows (the plan's global_batch) on the last stage",
           where(), target.defined() ? shape_str(target.sizes()) : "(undefined)", plan_.global_batch);
    }
    if (!loss_fn) fail("{}: train_step needs a loss function on the last stage", where());
  }
  module_->zero_grad();
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

  // Per micro-batch state; a forward's entries live until its backward (that is the activation
  // memory the schedule bounds).
  std::vector<Tensor> stage_in(M), stage_out(M), grad_out(M), grad_in(M);
  std::vector<double> losses(M, 0.0);
  std::vector<size_t> held_bytes(M, 0);  // what each forward left allocated
  size_t live_bytes = 0;
  const double loss_scale = static_cast<double>(rows_) / plan_.global_batch;  // [Loss scaling]
  int in_flight = 0;
  StepStats stats;
  auto rows_of = [&](const Tensor& t, int m) {
    Tensor rows = t.narrow(0, m * B + replica_ * rows_, rows_);
    return rows.device() == device_ ? rows : rows.to(device_);
  };

  for (const Action& a : schedule_.stages[stage_]) {
    const int m = a.micro_batch;
    switch (a.type) {
      case ActionType::RecvActivation: {
        const auto t0 = Clock::now();
        Tensor x = receive(prev_links_, kActivation, m, "RecvActivation", true);
        stats.communication_wait_ms += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        stage_in[m] = x.requires_grad_(true);
        break;
      }
      case ActionType::Forward: {
        Tensor x = is_first() ? rows_of(input, m) : stage_in[m];
        const long long before = allocated_here();
        // The micro-batch whose backward comes last syncs (its forward too: DDP prepares the
        // reduction there); every other one accumulates locally under no_sync.
        std::optional<DistributedDataParallel::NoSyncGuard> no_sync;
        if (ddp_ && m != sync_micro_batch_) no_sync.emplace(ddp_->reducer());
        auto stage_forward = [&] { return options_.recompute ? nn::utils::checkpoint(module_, x) : module_->forward(x); };
        Tensor out = ddp_ ? ddp_->forward(stage_forward) : stage_forward();
        if (is_last()) {
          Tensor loss = loss_fn(out, rows_of(target, m));
          if (loss.numel() != 1) {
            fail("{}: the loss function returned shape {}; expected a scalar (the mean over the rows)", where(),
                 shape_str(loss.sizes()));
          }
          out = loss * loss_scale;
          losses[m] = out.item<double>();
        }
        stage_out[m] = out;
        stats.max_in_flight = std::max(stats.max_in_flight, ++in_flight);
        const long long after = allocated_here();
        held_bytes[m] = static_cast<size_t>(std::max(0LL, after - before)) + (is_first() ? 0 : x.nbytes());
        live_bytes += held_bytes[m];
        stats.peak_activation_bytes = std::max(stats.peak_activation_bytes, live_bytes);
        break;
      }
      case ActionType::SendActivation:
        send(next_links_, stage_out[m].detach(), kActivation, m, "SendActivation", true);
        break;
      case ActionType::RecvGrad: {
        const auto t0 = Clock::now();
        grad_out[m] = receive(next_links_, kGrad, m, "RecvGrad", false);
        stats.communication_wait_ms += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        break;
      }
      case ActionType::Backward: {
        std::optional<DistributedDataParallel::NoSyncGuard> no_sync;
        if (ddp_ && m != sync_micro_batch_) no_sync.emplace(ddp_->reducer());
        if (is_last()) stage_out[m].backward();
        else stage_out[m].backward(grad_out[m]);
        if (!is_first()) {
          grad_in[m] = stage_in[m].grad().defined() ? stage_in[m].grad() : zeros_like(stage_in[m]);
        }
        stage_out[m] = Tensor();
        stage_in[m] = Tensor();
        grad_out[m] = Tensor();
        --in_flight;
        live_bytes -= held_bytes[m];
        break;
      }
      case ActionType::SendGrad:
        send(prev_links_, grad_in[m], kGrad, m, "SendGrad", false);
        grad_in[m] = Tensor();
        break;
      case ActionType::GradSync: {
        // DDP reduced during the last backward (its engine callback waited for every bucket); the
        // average over replicas becomes the sum of their shares ([Loss scaling]).
        if (ddp_) {
          NoGradGuard no_grad;
          const double r = static_cast<double>(num_replicas());
          for (Tensor& p : module_->parameters()) {
            if (p.grad().defined()) p.mutable_grad().mul_(r);
          }
        }
        break;
      }
      case ActionType::OptimizerStep:
        optimizer.step();
        break;
    }
  }
  // Sends were posted asynchronously (isend); the step ends when every one has been received.
  const auto sends_start = Clock::now();
  wait_sends();
  stats.communication_wait_ms += std::chrono::duration<double, std::milli>(Clock::now() - sends_start).count();
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

nn::NamedTensors PipelineStage::gather_state_dict(int dst) {
  if (dst < 0 || dst >= group_->size()) fail("{}: gather_state_dict to rank {}; expected a rank in [0, {})", where(), dst, group_->size());
  nn::NamedTensors mine = state_dict();
  nn::NamedTensors out;
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
    for (auto& [name, t] : mine) works.push_back(group_->send(t.contiguous(), dst, tag_of(kCheckpoint, i++)));
    for (auto& w : works) w->wait();
    return out;
  }
  if (rank_ != dst) return out;
  for (int s = 0; s < plan_.num_stages(); ++s) {
    if (s == stage_) {
      for (auto& [name, t] : mine) out.emplace_back(name, t.device().is_cpu() ? t.clone() : t.cpu());
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
      out.emplace_back(d[0].get<std::string>(), t);
    }
  }
  return out;
}

void PipelineStage::load_state_dict(const nn::NamedTensors& whole_model, bool strict) {
  nn::NamedTensors mine;
  for (const auto& [name, t] : whole_model) {
    const size_t dot = name.find('.');
    const std::string head = name.substr(0, dot);
    const bool numeric = !head.empty() && head.size() < 9 && std::all_of(head.begin(), head.end(), ::isdigit);
    const int layer = numeric ? std::stoi(head) : -1;
    if (dot == std::string::npos || layer < 0 || layer >= plan_.num_layers) {
      if (strict) {
        fail("{}: load_state_dict: key '{}' is not a parameter or buffer of a layer of the model (expected "
             "'<layer index in [0, {})>.<name>')",
             where(), name, plan_.num_layers);
      }
      continue;
    }
    if (layer >= module_->first_layer() && layer < module_->end_layer()) mine.emplace_back(name, t);
  }
  module_->load_state_dict(mine, strict);
}

}  // namespace chorus::distributed::pipeline
