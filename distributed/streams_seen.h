// The streams a collective's inputs were written on. A backward runs each parameter's
// AccumulateGrad, and so DDP's and FSDP's gradient hooks, on the stream its forward used
// (autograd/engine.cpp, [Backward runs on the forward's streams]): the gradients of one bucket or
// flat parameter may be copied on several streams. Before the collective reads them from the
// current stream, that stream waits for each. fault::Point::kBucketCopyStreams removed (a negative
// control, stream_group_test): it waits for none.
#pragma once

#include <algorithm>
#include <vector>

#include "tensor/fault.h"
#include "tensor/runtime.h"

namespace chorus::distributed {

class StreamsSeen {
 public:
  void note(const Stream& s) {
    if (std::find(streams_.begin(), streams_.end(), s) == streams_.end()) streams_.push_back(s);
  }
  // Makes the current stream of `device` wait for the work queued so far on every noted stream,
  // and returns it.
  Stream order_current_after(Device device) const {
    const Stream current = current_stream(device);
    if (fault::removed(fault::Point::kBucketCopyStreams)) return current;
    for (const Stream& s : streams_) {
      if (s == current) continue;
      Event written;
      written.record(s);
      current.wait(written);
    }
    return current;
  }
  void clear() { streams_.clear(); }
  const std::vector<Stream>& streams() const { return streams_; }

 private:
  std::vector<Stream> streams_;
};

}  // namespace chorus::distributed
