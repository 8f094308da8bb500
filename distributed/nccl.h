// ProcessGroupNCCL: collectives on CUDA tensors through NCCL. It is the stream-ordered group
// (stream_group.h) over an NCCL communicator: each collective records an event on the caller's
// current stream, the device's high-priority communication stream waits on it and runs the NCCL
// call (ncclGroupStart/End around a coalesced group), and an end event completes the StreamWork;
// Work::wait() orders the caller's stream, synchronize() blocks. CPU tensors (DDP's small
// bookkeeping collectives) go to a Gloo group made over the same store, as PyTorch's
// "cuda:nccl,cpu:gloo"; init_process_group accepts that spec too.
//
// NCCL communicators are made lazily, one per device and group, from a unique id rank 0 publishes
// in the group's store, keyed by the order the communicators are made (rank r may use cuda:r). The group's watchdog completes works when their end events pass, aborts the
// communicator (ncclCommAbort) when a collective outlives the timeout or ncclCommGetAsyncError
// reports an error, and the failure is raised on the caller's thread at its next call, naming op,
// sequence number, ranks and timeout. Point-to-point ops ignore tags (NCCL has none): messages
// between two ranks match in issue order.
//
// Link //distributed:nccl (built where a CUDA toolkit with NCCL is found) to make the "nccl"
// backend available to init_process_group.
#pragma once

#include <chrono>
#include <functional>
#include <memory>

#include "distributed/process_group.h"
#include "distributed/store.h"

namespace chorus::distributed {

struct NcclOptions {
  std::chrono::milliseconds timeout{300000};
};

// Creates the group (rank and size of the job; `store` for the rendezvous). Throws "no CUDA
// device: ..." on a machine without a GPU.
std::shared_ptr<ProcessGroup> make_process_group_nccl(std::shared_ptr<Store> store, int rank, int size,
                                                      NcclOptions options = {});

// The NCCL unique id of a process's `index`-th communicator of a group (0 for the first it makes,
// whatever its device), agreed through the group's store: rank 0 makes it with `make_id` and
// publishes it, every other rank reads it (up to the store's timeout, then a chorus::Error naming
// the rank, `device`, the index and the key). Used by the group; declared here for its test.
Bytes agree_nccl_unique_id(Store& store, int rank, size_t index, Device device, const std::function<Bytes()>& make_id);

}  // namespace chorus::distributed
