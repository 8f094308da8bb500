// ZeroRedundancyOptimizer (ZeRO stage 1): see zero_redundancy_optimizer.h.
#include "distributed/zero_redundancy_optimizer.h"

#include "distributed/checkpoint_folder.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <sstream>

#include "autograd/grad_mode.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace chorus::distributed {
using optim::NamedTensors;
namespace {

constexpr int kTag = 0x2e50;  // consolidate_state_dict's messages: kTag (length), +1 (names), +2 (data)

optim::Options defaults_of(const ZeroRedundancyOptimizer::Factory& make, const std::vector<optim::ParamGroup>& groups) {
  if (!make) fail("ZeroRedundancyOptimizer: no optimizer factory given");
  std::unique_ptr<optim::Optimizer> probe = make(groups);
  if (!probe) fail("ZeroRedundancyOptimizer: the optimizer factory returned no optimizer");
  return probe->defaults();
}

DType dtype_named(const std::string& name) {
  for (DType d : {kBool, kUInt8, kInt32, kInt64, kFloat16, kBFloat16, kFloat32, kFloat64})
    if (name == dtype_name(d)) return d;
  fail("ZeroRedundancyOptimizer: unknown dtype '{}' in a state message", name);
}

// "prefix.<index>.<rest>" -> (index, rest); nullopt when `name` does not start with prefix.
std::optional<std::pair<int64_t, std::string>> split_indexed(const std::string& name, const std::string& prefix) {
  if (name.rfind(prefix, 0) != 0) return std::nullopt;
  const std::string rest = name.substr(prefix.size());
  const size_t dot = rest.find('.');
  const std::string digits = dot == std::string::npos ? "" : rest.substr(0, dot);
  if (digits.empty() || digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos) {
    fail("ZeroRedundancyOptimizer: '{}' should be {}<index>.<name>", name, prefix);
  }
  return std::make_pair(static_cast<int64_t>(std::stoll(digits)), rest.substr(dot + 1));
}

// A list of named tensors from one rank to another: the names, dtypes and shapes as text, then
// each tensor (on the CPU).
void send_named(ProcessGroup& g, const NamedTensors& named, int dst) {
  std::string header;
  TensorList data;
  for (const auto& [name, t] : named) {
    Tensor c = t.detach().cpu().contiguous();
    std::string dims;
    for (int64_t s : c.sizes()) dims += (dims.empty() ? "" : ",") + std::to_string(s);
    header += name + '\t' + dtype_name(c.dtype()) + '\t' + dims + '\n';
    data.push_back(c);
  }
  Tensor len = zeros({1}, {.dtype = kInt64});
  len.data_ptr<int64_t>()[0] = static_cast<int64_t>(header.size());
  g.send(len, dst, kTag)->wait();
  if (header.empty()) return;
  Tensor text = empty({static_cast<int64_t>(header.size())}, {.dtype = kUInt8});
  std::memcpy(text.raw_data_ptr(), header.data(), header.size());
  g.send(text, dst, kTag + 1)->wait();
  for (const Tensor& t : data)
    if (t.numel() > 0) g.send(t, dst, kTag + 2)->wait();
}

NamedTensors recv_named(ProcessGroup& g, int src) {
  Tensor len = zeros({1}, {.dtype = kInt64});
  g.recv(len, src, kTag)->wait();
  const int64_t n = len.data_ptr<int64_t>()[0];
  NamedTensors out;
  if (n == 0) return out;
  Tensor text = empty({n}, {.dtype = kUInt8});
  g.recv(text, src, kTag + 1)->wait();
  std::istringstream lines(std::string(static_cast<const char*>(text.raw_data_ptr()), static_cast<size_t>(n)));
  std::string line;
  while (std::getline(lines, line)) {
    const size_t a = line.find('\t'), b = line.find('\t', a + 1);
    if (a == std::string::npos || b == std::string::npos) fail("ZeroRedundancyOptimizer: malformed state message '{}'", line);
    Shape shape;
    std::stringstream dims(line.substr(b + 1));
    std::string d;
    while (std::getline(dims, d, ',')) shape.push_back(std::stoll(d));
    Tensor t = empty(shape, {.dtype = dtype_named(line.substr(a + 1, b - a - 1))});
    if (t.numel() > 0) g.recv(t, src, kTag + 2)->wait();
    out.emplace_back(line.substr(0, a), t);
  }
  return out;
}

}  // namespace

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<optim::ParamGroup> groups,
                                                 std::shared_ptr<ProcessGroup> group, Factory make)
    : Optimizer("ZeroRedundancyOptimizer", groups, defaults_of(make, groups)), group_(std::move(group)), make_(make) {
  if (!group_) fail("ZeroRedundancyOptimizer: no process group given");
  const int world = group_->size(), rank = group_->rank();
  std::vector<Tensor> flat;
  std::vector<size_t> group_of;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    for (const Tensor& p : groups_[gi].params) {
      flat.push_back(p);
      group_of.push_back(gi);
    }
  }
  // Every rank must wrap the same parameters: their count and total size, against rank 0's; every
  // rank learns which ranks differ, so all of them raise (none is left waiting in a collective).
  {
    int64_t total = 0;
    for (const Tensor& p : flat) total += p.numel();
    Tensor root = zeros({2}, {.dtype = kInt64});
    root.data_ptr<int64_t>()[0] = static_cast<int64_t>(flat.size());
    root.data_ptr<int64_t>()[1] = total;
    group_->broadcast({root}, 0)->wait();
    const int64_t want_count = root.data_ptr<int64_t>()[0], want_total = root.data_ptr<int64_t>()[1];
    Tensor differs = zeros({world}, {.dtype = kInt64});
    differs.data_ptr<int64_t>()[rank] = want_count != static_cast<int64_t>(flat.size()) || want_total != total;
    group_->allreduce({differs})->wait();
    std::string which;
    for (int r = 0; r < world; ++r)
      if (differs.data_ptr<int64_t>()[r] != 0) which += (which.empty() ? "" : ", ") + std::to_string(r);
    if (!which.empty()) {
      fail("ZeroRedundancyOptimizer: rank(s) {} wrap other parameters than rank 0 ({} parameters of {} elements in "
           "all; this rank, {}: {} of {}): every rank must wrap the same model",
           which, want_count, want_total, rank, flat.size(), total);
    }
  }
  // [Partition] within each group, largest first, each to the rank with the fewest elements so far.
  owner_.assign(flat.size(), 0);
  std::vector<int64_t> load(world, 0);
  size_t first = 0;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    std::vector<size_t> order;
    for (size_t i = first; i < first + groups_[gi].params.size(); ++i) order.push_back(i);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return flat[a].numel() > flat[b].numel(); });
    for (size_t i : order) {
      const int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
      owner_[i] = r;
      load[r] += flat[i].numel();
    }
    first += groups_[gi].params.size();
  }
  owned_by_.assign(world, {});
  for (size_t i = 0; i < flat.size(); ++i) owned_by_[owner_[i]].push_back(static_cast<int64_t>(i));
  // The local optimizer: this rank's parameters, in the wrapper's groups (those it has any of).
  std::vector<optim::ParamGroup> local_groups;
  local_group_.assign(groups_.size(), -1);
  local_index_.assign(flat.size(), -1);
  int64_t next = 0;
  for (size_t i = 0; i < flat.size(); ++i) {
    if (owner_[i] != rank) continue;
    const size_t gi = group_of[i];
    if (local_group_[gi] < 0) {
      local_group_[gi] = static_cast<int>(local_groups.size());
      local_groups.push_back(optim::ParamGroup{{}, groups_[gi].options});
    }
    local_groups[local_group_[gi]].params.push_back(flat[i]);
    local_index_[i] = next++;
  }
  if (!local_groups.empty()) {
    local_ = make(std::move(local_groups));
    if (!local_) fail("ZeroRedundancyOptimizer: the optimizer factory returned no optimizer");
  }
}

void ZeroRedundancyOptimizer::sync_options() {
  if (!local_) return;
  for (size_t gi = 0; gi < groups_.size(); ++gi)
    if (local_group_[gi] >= 0) local_->param_groups()[local_group_[gi]].options = groups_[gi].options;
}

void ZeroRedundancyOptimizer::step() {
  sync_options();
  if (local_) local_->step();
  autograd::NoGradGuard no_grad;
  std::vector<Tensor> flat;
  for (const optim::ParamGroup& g : groups_)
    for (const Tensor& p : g.params) flat.push_back(p);
  // One broadcast per owner and (device, dtype): its parameters flattened into one buffer, issued
  // all before any is waited for.
  struct Bucket {
    int root;
    std::vector<int64_t> params;
    Tensor buffer;
    std::shared_ptr<Work> work;
  };
  std::vector<Bucket> buckets;
  for (int r = 0; r < group_->size(); ++r) {
    std::vector<Bucket> mine;
    for (int64_t i : owned_by_[r]) {
      const Tensor& p = flat[static_cast<size_t>(i)];
      auto it = std::find_if(mine.begin(), mine.end(), [&](const Bucket& b) {
        const Tensor& q = flat[static_cast<size_t>(b.params.front())];
        return q.device() == p.device() && q.dtype() == p.dtype();
      });
      if (it == mine.end()) {
        mine.push_back(Bucket{r, {i}, Tensor(), nullptr});
      } else {
        it->params.push_back(i);
      }
    }
    for (Bucket& b : mine) buckets.push_back(std::move(b));
  }
  for (Bucket& b : buckets) {
    const Tensor& head = flat[static_cast<size_t>(b.params.front())];
    int64_t total = 0;
    for (int64_t i : b.params) total += flat[static_cast<size_t>(i)].numel();
    b.buffer = empty({total}, {.dtype = head.dtype(), .device = head.device()});
    if (b.root == group_->rank()) {
      int64_t offset = 0;
      for (int64_t i : b.params) {
        const Tensor& p = flat[static_cast<size_t>(i)];
        b.buffer.narrow(0, offset, p.numel()).copy_(p.reshape({-1}));
        offset += p.numel();
      }
    }
    b.work = group_->broadcast({b.buffer}, b.root);
  }
  for (Bucket& b : buckets) {
    b.work->wait();
    if (b.root == group_->rank()) continue;
    int64_t offset = 0;
    for (int64_t i : b.params) {
      Tensor p = flat[static_cast<size_t>(i)];
      p.copy_(b.buffer.narrow(0, offset, p.numel()).view(p.sizes()));
      offset += p.numel();
    }
  }
}

void ZeroRedundancyOptimizer::consolidate_state_dict(int to) {
  const int world = group_->size(), rank = group_->rank();
  if (to < 0 || to >= world) fail("ZeroRedundancyOptimizer::consolidate_state_dict: rank {} is not in a group of {}", to, world);
  sync_options();
  // This rank's state in the whole optimizer's names.
  NamedTensors mine;
  if (local_) {
    for (const auto& [name, t] : local_->state_dict()) {
      if (auto g = split_indexed(name, "param_groups.")) {
        const auto gi = static_cast<size_t>(std::find(local_group_.begin(), local_group_.end(), g->first) - local_group_.begin());
        Tensor value = g->second == "num_params"
                           ? full({}, static_cast<double>(groups_[gi].params.size()), {.dtype = kInt64})
                           : t;
        mine.emplace_back("param_groups." + std::to_string(gi) + "." + g->second, value);
      } else if (auto s = split_indexed(name, "state.")) {
        const int64_t global = owned_by_[rank].at(static_cast<size_t>(s->first));
        mine.emplace_back("state." + std::to_string(global) + "." + s->second, t);
      }
    }
  }
  if (rank != to) {
    send_named(*group_, mine, to);
    consolidated_.reset();
    return;
  }
  std::vector<NamedTensors> parts(world);
  parts[to] = std::move(mine);
  for (int r = 0; r < world; ++r)
    if (r != to) parts[r] = recv_named(*group_, r);
  // In a one-process optimizer's order: every group's options, then the state by parameter. The
  // options are the wrapper's (every rank's are the same; sync_options copies them into the local
  // groups), so a group no rank holds a parameter of is written too.
  std::map<int64_t, NamedTensors> state;
  for (const NamedTensors& part : parts) {
    for (const auto& entry : part) {
      if (auto s = split_indexed(entry.first, "state.")) state[s->first].emplace_back(entry.first, entry.second.cpu());
    }
  }
  NamedTensors whole;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const std::string prefix = "param_groups." + std::to_string(gi) + ".";
    for (const auto& [key, value] : groups_[gi].options) {
      whole.emplace_back(prefix + key, full({}, value, {.dtype = kFloat64}));
    }
    whole.emplace_back(prefix + "num_params", full({}, static_cast<double>(groups_[gi].params.size()), {.dtype = kInt64}));
  }
  for (auto& [index, entries] : state) whole.insert(whole.end(), entries.begin(), entries.end());
  consolidated_ = std::move(whole);
}

NamedTensors ZeroRedundancyOptimizer::state_dict() const {
  if (!consolidated_) {
    fail("ZeroRedundancyOptimizer::state_dict on rank {}: call consolidate_state_dict(to) on every rank first, and "
         "read the state on rank `to` (this rank has no consolidated state)",
         group_->rank());
  }
  return *consolidated_;
}

void ZeroRedundancyOptimizer::check_options(const optim::Options& options) const {
  Tensor probe = zeros({1}).requires_grad_();
  (void)make_({optim::ParamGroup{{probe}, options}});
}

// Every rank calls it. The state is checked whole (the local optimizer's load included) before the
// wrapper's options change, and the ranks agree: a refusal on one rank (one that holds the
// parameters whose state is wrong) is raised on every rank, and no rank changes anything.
void ZeroRedundancyOptimizer::load_state_dict(const NamedTensors& state) {
  std::string error;
  std::vector<optim::Options> options;
  try {
    options = read_whole_state(state);
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree_on_failure(*group_, error, "ZeroRedundancyOptimizer", "load_state_dict");
  for (size_t gi = 0; gi < groups_.size(); ++gi) groups_[gi].options = options[gi];
  consolidated_.reset();
}

std::vector<optim::Options> ZeroRedundancyOptimizer::read_whole_state(const NamedTensors& state) {
  const int rank = group_->rank();
  std::vector<optim::Options> options;
  for (const optim::ParamGroup& g : groups_) options.push_back(g.options);
  NamedTensors local;
  for (const auto& [name, t] : state) {
    if (auto g = split_indexed(name, "param_groups.")) {
      const auto gi = static_cast<size_t>(g->first);
      if (gi >= groups_.size()) {
        fail("ZeroRedundancyOptimizer::load_state_dict: '{}' names a parameter group this optimizer does not have ({} "
             "groups)",
             name, groups_.size());
      }
      const int lg = local_group_[gi];
      if (g->second == "num_params") {
        if (t.item<int64_t>() != static_cast<int64_t>(groups_[gi].params.size())) {
          fail("ZeroRedundancyOptimizer::load_state_dict: group {} has {} parameters in the state but {} here", gi,
               t.item<int64_t>(), groups_[gi].params.size());
        }
        if (lg >= 0) {
          local.emplace_back("param_groups." + std::to_string(lg) + ".num_params",
                             full({}, static_cast<double>(local_->param_groups()[lg].params.size()), {.dtype = kInt64}));
        }
        continue;
      }
      if (!defaults_.count(g->second)) fail("ZeroRedundancyOptimizer::load_state_dict: unknown option '{}' in '{}'", g->second, name);
      options[gi][g->second] = t.item<double>();
      if (lg >= 0) local.emplace_back("param_groups." + std::to_string(lg) + "." + g->second, t);
    } else if (auto s = split_indexed(name, "state.")) {
      if (s->first >= static_cast<int64_t>(owner_.size())) {
        fail("ZeroRedundancyOptimizer::load_state_dict: '{}' refers to parameter {}, but this optimizer has {} parameters",
             name, s->first, owner_.size());
      }
      if (owner_[static_cast<size_t>(s->first)] != rank) continue;
      local.emplace_back("state." + std::to_string(local_index_[static_cast<size_t>(s->first)]) + "." + s->second, t);
    } else {
      fail("ZeroRedundancyOptimizer::load_state_dict: unexpected key '{}' (expected param_groups.* and state.*)", name);
    }
  }
  // The local optimizer checks its shard's buffers, and changes nothing when it refuses; every
  // group's options are checked by the wrapped kind's rules on every rank (check_options).
  for (size_t gi = 0; gi < groups_.size(); ++gi) check_options(options[gi]);
  if (local_) local_->load_state_dict(local);
  return options;
}

}  // namespace chorus::distributed
