#include "distributed/hierarchical.h"

#include <vector>

#include "autograd/grad_mode.h"
#include "distributed/init.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace chorus::distributed {

std::shared_ptr<HierarchicalGroups> HierarchicalGroups::make(int local_size) {
  auto world = default_group();
  if (!world) fail("HierarchicalGroups: no default group (call init_process_group first)");
  const int size = world->size(), rank = world->rank();
  if (local_size < 1 || size % local_size != 0) {
    fail("HierarchicalGroups: {} processes per node does not divide the {} processes of the job", local_size, size);
  }
  auto h = std::make_shared<HierarchicalGroups>();
  h->local_size_ = local_size;
  h->nodes_ = size / local_size;
  // Every rank makes every subgroup, in the same order (new_group's rule); each keeps its own.
  for (int node = 0; node < h->nodes_; ++node) {
    std::vector<int> ranks;
    for (int l = 0; l < local_size; ++l) ranks.push_back(node * local_size + l);
    auto g = new_group(ranks);
    if (node == rank / local_size) h->intra_ = g;
  }
  for (int l = 0; l < local_size; ++l) {
    std::vector<int> ranks;
    for (int node = 0; node < h->nodes_; ++node) ranks.push_back(node * local_size + l);
    auto g = new_group(ranks);
    if (l == rank % local_size) h->inter_ = g;
  }
  return h;
}

HierarchicalGroups::~HierarchicalGroups() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void HierarchicalGroups::allreduce(Tensor& t) {
  if (!t.device().is_cpu()) {
    sum_now(t);
    return;
  }
  allreduce_async(t)->wait();
}

std::shared_ptr<Work> HierarchicalGroups::allreduce_async(Tensor t) {
  if (!t.device().is_cpu()) {
    sum_now(t);
    return completed_work("hierarchical allreduce", {t});
  }
  if (!t.is_contiguous()) fail("HierarchicalGroups::allreduce: expected a contiguous tensor, got strides {}", shape_str(t.strides()));
  auto work = std::make_shared<Work>("hierarchical allreduce");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!worker_.joinable()) worker_ = std::thread([this] { serve(); });
    queue_.emplace_back(std::move(t), work);
  }
  wake_.notify_one();
  return work;
}

void HierarchicalGroups::serve() {
  for (;;) {
    std::pair<Tensor, std::shared_ptr<Work>> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    try {
      sum_now(job.first);
      job.second->finish({job.first});
    } catch (...) {
      job.second->finish({job.first}, std::current_exception());
    }
  }
}

void HierarchicalGroups::sum_now(Tensor& t) {
  NoGradGuard no_grad;
  if (!t.is_contiguous()) fail("HierarchicalGroups::allreduce: expected a contiguous tensor, got strides {}", shape_str(t.strides()));
  const int64_t n = t.numel(), L = local_size_;
  const int64_t chunk = (n + L - 1) / L;
  // Padded to L chunks; the padding reduces zeros.
  Tensor flat = zeros({chunk * L}, {.dtype = t.dtype(), .device = t.device()});
  flat.narrow(0, 0, n).copy_(t.reshape({-1}));
  Tensor mine = empty({chunk}, {.dtype = t.dtype(), .device = t.device()});
  TensorList parts;
  for (int64_t l = 0; l < L; ++l) parts.push_back(flat.narrow(0, l * chunk, chunk));
  if (L > 1) {
    intra_->reduce_scatter(mine, parts)->wait();  // the node's sum of this rank's chunk
  } else {
    mine.copy_(flat);
  }
  if (nodes_ > 1) inter_->allreduce({mine})->wait();  // summed over the nodes
  if (L > 1) {
    intra_->allgather(parts, mine)->wait();  // every chunk back on every process of the node
  } else {
    flat.copy_(mine);
  }
  t.copy_(flat.narrow(0, 0, n).view(t.sizes()));
}

CommHook hierarchical_allreduce_hook(std::shared_ptr<HierarchicalGroups> groups) {
  if (!groups) fail("hierarchical_allreduce_hook: no groups");
  return [groups](ProcessGroup&, Bucket& bucket) -> std::shared_ptr<Work> { return groups->allreduce_async(bucket.buffer); };
}

}  // namespace chorus::distributed
