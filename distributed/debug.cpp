#include "distributed/debug.h"

#include <cstdlib>
#include <cstring>

#include "distributed/flight_recorder.h"
#include "tensor/ops.h"

namespace chorus::distributed {
namespace {

constexpr int64_t kFingerprintBytes = 256;

}  // namespace

bool debug_mode_enabled() {
  const char* v = std::getenv("CHORUS_DISTRIBUTED_DEBUG");
  return v != nullptr && std::strcmp(v, "DETAIL") == 0;
}

ProcessGroupDebug::ProcessGroupDebug(std::shared_ptr<ProcessGroup> inner)
    : ProcessGroup(inner ? inner->rank() : 0, inner ? inner->size() : 1), inner_(std::move(inner)) {
  if (!inner_) fail("ProcessGroupDebug: the wrapped process group is null");
}

void ProcessGroupDebug::check(const std::string& fp) {
  const std::string fingerprint = fp.substr(0, kFingerprintBytes);
  Tensor mine = zeros({kFingerprintBytes}, {.dtype = kUInt8});
  std::memcpy(mine.raw_data_ptr(), fingerprint.data(), fingerprint.size());
  TensorList all;
  for (int r = 0; r < size_; ++r) all.push_back(zeros({kFingerprintBytes}, {.dtype = kUInt8}));
  inner_->allgather(all, mine)->wait();
  auto text = [&](int r) {
    const char* p = static_cast<const char*>(all[r].raw_data_ptr());
    return std::string(p, strnlen(p, kFingerprintBytes));
  };
  for (int r = 0; r < size_; ++r) {
    if (text(r) != text(0)) {
      fail("collective mismatch detected by CHORUS_DISTRIBUTED_DEBUG=DETAIL: rank 0 runs '{}' but rank {} runs '{}' "
           "(this is rank {}). Every rank must issue the same collectives, in the same order, with the same shapes.",
           text(0), r, text(r), rank_);
    }
  }
}

std::shared_ptr<Work> ProcessGroupDebug::allreduce(const TensorList& tensors, ReduceOp op) {
  check(fmt::format("#{} allreduce({}) {}", sequence_++, reduce_op_name(op), describe_tensors(tensors)));
  return inner_->allreduce(tensors, op);
}
std::shared_ptr<Work> ProcessGroupDebug::broadcast(const TensorList& tensors, int root) {
  check(fmt::format("#{} broadcast(root={}) {}", sequence_++, root, describe_tensors(tensors)));
  return inner_->broadcast(tensors, root);
}
std::shared_ptr<Work> ProcessGroupDebug::allgather(const TensorList& outputs, const Tensor& input) {
  check(fmt::format("#{} allgather {}", sequence_++, describe_tensors({input})));
  return inner_->allgather(outputs, input);
}
std::shared_ptr<Work> ProcessGroupDebug::reduce_scatter(const Tensor& output, const TensorList& inputs, ReduceOp op) {
  check(fmt::format("#{} reduce_scatter({}) {}", sequence_++, reduce_op_name(op), describe_tensors({output})));
  return inner_->reduce_scatter(output, inputs, op);
}
std::shared_ptr<Work> ProcessGroupDebug::all_to_all(const TensorList& outputs, const TensorList& inputs) {
  // Sizes may differ between pairs (and so between ranks): the fingerprint is the op and dtype.
  check(fmt::format("#{} all_to_all {}", sequence_++, inputs.empty() ? "" : dtype_name(inputs.front().dtype())));
  return inner_->all_to_all(outputs, inputs);
}
std::shared_ptr<Work> ProcessGroupDebug::barrier() {
  check(fmt::format("#{} barrier", sequence_++));
  return inner_->barrier();
}
// Point-to-point ops involve two ranks only: not fingerprinted.
std::shared_ptr<Work> ProcessGroupDebug::send(const Tensor& t, int dst, int tag) { return inner_->send(t, dst, tag); }
std::shared_ptr<Work> ProcessGroupDebug::recv(const Tensor& t, int src, int tag) { return inner_->recv(t, src, tag); }

}  // namespace chorus::distributed
