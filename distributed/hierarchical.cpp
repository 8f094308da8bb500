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

void HierarchicalGroups::allreduce(Tensor& t) {
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
  return [groups](ProcessGroup&, Bucket& bucket) -> std::shared_ptr<Work> {
    groups->allreduce(bucket.buffer);
    return completed_work("hierarchical allreduce", {bucket.buffer});
  };
}

}  // namespace chorus::distributed
