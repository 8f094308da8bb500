// PowerSGD gradient compression (Vogels et al., NeurIPS 2019) as a DDP communication hook, with
// PyTorch's powerSGD_hook parameters (docs/distributed.md):
//
//   auto state = std::make_shared<distributed::PowerSGDState>();
//   state->matrix_approximation_rank = 2;
//   state->start_powerSGD_iter = 10;
//   ddp->register_comm_hook(distributed::powerSGD_hook(state));
//
// For each bucket: the first start_powerSGD_iter iterations allreduce it whole (as DDP's default;
// PyTorch's advice: let the learning rate warm up, and let DDP rebuild its buckets). After that,
// each parameter of 2 or more dimensions is seen as a matrix M (n rows: its first dimension) and,
// when n m > r (n + m) min_compression_rate, sent as two thin matrices instead of itself:
//   M += error (error feedback: what earlier approximations left out, kept per rank)
//   P = M Q           (Q: n x r... m x r, kept from the last step with warm_start, else fresh random)
//   allreduce P; orthogonalize P's columns (Gram-Schmidt)
//   Q = M^T P; allreduce Q
//   M~ = P Q^T         (the approximation of the sum over ranks, the same on every rank)
//   error = M - M~ / world   (per rank, in the bucket's pre-divided units)
// The other parameters (biases, norms, small matrices) are allreduced exactly, in one buffer. The
// random Q comes from a generator seeded with random_seed and the bucket's index, the same on every
// rank. The hook runs its collectives in sequence and returns a finished Work (no overlap with the
// rest of backward for the compressed buckets; the plain allreduce before start_powerSGD_iter
// overlaps as usual).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "distributed/hierarchical.h"
#include "distributed/reducer.h"

namespace chorus::distributed {

struct PowerSGDState {
  int matrix_approximation_rank = 1;
  int64_t start_powerSGD_iter = 1000;
  double min_compression_rate = 2.0;
  bool use_error_feedback = true;
  bool warm_start = true;
  double orthogonalization_epsilon = 0.0;
  uint64_t random_seed = 0;
  // Where P, Q and the exact part are summed: the DDP group's flat allreduce (null), or these
  // hierarchical groups (distributed/hierarchical.h), as a cluster of nodes would.
  std::shared_ptr<HierarchicalGroups> hierarchical;

  // Statistics since construction: elements a plain allreduce would have sent, and elements
  // actually allreduced (P, Q and the exact part), over all buckets and iterations of PowerSGD.
  int64_t uncompressed_elements = 0;
  int64_t sent_elements = 0;
  double compression_rate() const {
    return sent_elements > 0 ? static_cast<double>(uncompressed_elements) / static_cast<double>(sent_elements) : 1.0;
  }

  // Per bucket index: iterations seen, and (once PowerSGD runs) each compressed parameter's error
  // and Q, in the bucket's order.
  struct BucketState {
    int64_t iterations = 0;
    int64_t buffer_numel = 0;
    std::vector<size_t> params;  // the bucket's parameters (the reducer's indices) the state below is for
    std::vector<Tensor> errors;  // one per parameter of the bucket (undefined: sent exactly)
    std::vector<Tensor> qs;
    uint64_t draws = 0;  // Q's drawn without warm start
  };
  std::map<size_t, BucketState> buckets;
};

CommHook powerSGD_hook(std::shared_ptr<PowerSGDState> state);

}  // namespace chorus::distributed
