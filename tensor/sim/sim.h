// The simulated device ("sim"): a CUDA-like device run on the CPU, so that everything chorus builds
// over the device runtime — streams, events, the caching allocator, the communication stream, DDP
// on a device — runs in CI without a GPU (as PyTorch's OpenReg test backend does).
//
// - Each stream is a worker thread running its queue in order; streams run concurrently.
// - Device memory is host memory mapped PROT_NONE: a host read or write of it crashes, as on a GPU.
//   A task names the device buffers it uses; their segments are readable and writable while any
//   task using them runs (a per-segment count; mprotect is process-wide, so this is a guard against
//   host access, not a per-thread fence). CHORUS_SIM_PROTECT=0 turns the guard off for speed.
// - An event carries a generation counter: record() bumps it and the stream marks it complete when
//   it gets there; stream.wait(event) captures the generation at the call (cudaStreamWaitEvent's
//   documented semantics: a later record does not affect an earlier wait) and completes when that
//   generation has, whatever later records on other streams did (completed generations are a set).
// - CUDA's lifetimes: a kernel holds raw pointers (kernels/sim), not references, so only stream
//   order, record_stream and the caching allocator keep memory from early reuse. A block the
//   allocator hands out is poisoned first, on its stream, with a NaN pattern (poison();
//   CHORUS_SIM_POISON=0 turns it off). free() blocks the host until every stream of the device has
//   run what was queued before it, then unmaps the segment, as cudaFree synchronizes the device.
// - Host functions (launch_host_task) name host memory only: device memory is refused at the call,
//   as a CUDA host function cannot read it ([A host function reads no device memory], sim.cpp).
//   And they follow CUDA's cudaLaunchHostFunc rule: a device call inside
//   one (an allocation, a free, a copy, an event, a launch), also from a destructor of what it
//   captured, fails as cudaErrorNotPermitted does. As CUDA may, sim runs the host functions of all
//   streams on one thread, each while its stream waits ([One host-function thread], sim.cpp): a
//   host function that waits for another's hangs here as it can on a GPU. Kernels (launch_kernel)
//   run on their stream's own thread, where the runtime and the caching allocator refuse every call
//   (a CUDA kernel cannot make one); a kernel that makes one fails its device, naming the call.
// - Page-locked host allocation and free (host_malloc, host_free) are implicit synchronizations, as
//   on CUDA: work issued after them on any stream waits for everything issued before on every stream.
//   So is a device allocation (malloc) for the streams of its device. free and host_free also block
//   the host until the streams (free: of its device; host_free: all) have run what was queued before
//   them, as cudaFree and cudaFreeHost synchronize the device.
// - Streams share hardware queues, as a GPU's: a wait (stream_wait_value, an event wait, a host
//   function) holds up the work of every stream of its queue issued after it, until it ends
//   ([Shared hardware queues], sim.cpp). One queue per device by default (the strictest);
//   CHORUS_SIM_CONNECTIONS=k (1-32) gives k, taken in turn as streams are made, 0 one per stream.
// - A math library's handle (kernels/sim/sim_kernels.cpp): a host thread's first product, and its
//   first convolution, batch norm or pooling, on a device makes a kept device allocation (an
//   implicit synchronization, above) and a blocking copy on the device's default stream, as
//   cublasCreate does on CUDA.
// - Delay injection: CHORUS_SIM_DELAY_US=N (or set_delay_us) sleeps a random 0..N us before every
//   task, so a missing synchronization shows up as a wrong result in tests.
// - A copy from pageable host memory to the device waits for its stream's earlier work before it
//   returns, as CUDA's may to stage it ([A pageable copy waits for its stream], sim.cpp); the
//   source is read by then. A copy from page-locked memory (host_malloc) returns at once.
// - The driver lock (on unless CHORUS_SIM_DRIVER_LOCK=0; set_driver_lock): as CUDA's driver, a copy
//   to or from pageable host memory holds a lock while it waits for its stream, and so do free and
//   host_free while they wait for the device ([free holds the driver], sim.cpp); the device calls
//   of the process's other host threads (copies, launches, event records and waits, synchronizations
//   on entry, event and stream creation, stream memory operations, allocations, pinned allocation)
//   wait for it. Host work that device work waits for must then make no device call (the Gloo
//   staging deadlock of an H100 run, 2026-11-26). Event queries and memory info do not take it (the
//   caching allocator makes them under its mutex, which a stream thread freeing a tensor its task
//   captured, sim's artefact, may need). Calls from a stream's own thread (sim's device side) never
//   take it. Opt-in until 2026-12-02.
// - CHORUS_SIM_DEVICES (default 2) devices, each with a settable capacity (default 16 GiB;
//   CHORUS_SIM_MEMORY_MB sets every device's at start, set_memory_capacity one's in process):
//   segments beyond it are refused, and the caching allocator reports out of memory.
// - Illegal addresses, as a GPU sees them ([Illegal addresses], sim.cpp): a kernel that names memory
//   of another sim device (chorus enables no peer access), memory freed before its launch, or
//   pageable host memory (a GPU kernel reads only page-locked host memory) fails its device
//   without running (sticky, below); a copy whose device side is freed memory, host memory or runs
//   past the end of its segment, or whose host side is device memory, or a device copy between
//   overlapping areas, is refused at the call (cudaErrorInvalidValue).
// - Events as cudaEvent*: recorded only on a stream of their own device; elapsed_ms only between
//   recorded timing events of one device whose records have completed.
// - Device errors are sticky, as CUDA's: a task that fails (a kernel on an illegal address, or one a
//   test makes fail with fault::fail_next_stream_task, tensor/test_faults.h) marks its device
//   failed; from then on every call on that device throws a chorus::Error naming the call and the
//   first error, and the device's streams drop their queued kernels, copies and host functions
//   (event records and waits still complete, so a host synchronization returns the error instead
//   of hanging; a stream of another device that waits for a record made after the failure fails
//   its own device, naming the first error: [A wait passes a device's failure on], sim.cpp): free, create_stream, total_memory, set_device to it from another device, and
//   host_malloc/host_free while it is current fail too, as their CUDA calls return the error.
//   The first device to fail fails every other device of the process too, naming it, as CUDA
//   documents such an error as leaving the whole process inconsistent ([A device error ends the
//   process's CUDA], sim.cpp; fault::Point::kSimProcessFault removes it).
//   destroy_event still works (it runs in destructors; cudaEventDestroy's error is ignored). The
//   caching allocator's free in a tensor destructor does not throw: the event records it makes for a
//   block used on other streams are refused, and the block is kept out of its pools for good.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace chorus {
class DeviceRuntime;
}

namespace chorus::sim {

// The sim DeviceRuntime, registered for DeviceType::Sim on first use: code that runs at static
// initialization (the caching allocator's installation) calls this instead of runtime_for, whose
// registry entry might not be there yet (initialization order across files is unspecified).
DeviceRuntime& device_runtime();

// The driver lock above, on or off (default on; CHORUS_SIM_DRIVER_LOCK=0 turns it off).
void set_driver_lock(bool on);
bool driver_lock();
// Whether a blocking copy, free or host_free holds the driver lock now (for tests that need a call
// to meet it).
bool driver_lock_held();
// Whether a free or host_free is waiting for the device now (for tests; whether it holds the lock
// or not).
bool frees_waiting();
// How many stream tasks are waiting for an event right now (stream_wait_event's waits that have
// started and not ended; for tests that must act once a stream is held at such a wait).
int event_waits_pending();
// The hardware queues per device for streams made from now on ([Shared hardware queues], sim.cpp):
// k >= 1 queues shared in turn, 0 a queue of its own for each stream, kDefaultConnections back to
// the process's count (CHORUS_SIM_CONNECTIONS). Earlier streams keep theirs.
inline constexpr int kDefaultConnections = -1;
void set_connections(int k);
// Maximum random delay before each task, in microseconds (0: none).
void set_delay_us(uint32_t max_delay_us);
uint32_t delay_us();
// Memory the device may hand out in total (raw segments); allocation beyond it fails as OOM.
void set_memory_capacity(int device, size_t bytes);
size_t memory_in_use(int device);
// The device's sticky error (see above), if a task on it has failed.
std::optional<std::string> device_error(int device);
// Whether device memory is PROT_NONE outside tasks (the default; CHORUS_SIM_PROTECT=0 turns it off).
bool protection_enabled();
// Number of tasks run so far on all sim streams (tests use it to see work went to the device).
uint64_t tasks_run();
// Queues a kernel on a sim stream (a StreamHandle): fn runs on the stream's own thread, with the
// device memory of `buffers` open, concurrently with other streams' kernels. The sim kernel table
// launches this way (`what` names the kernel in errors); tests use it for device work of their
// own. A kernel naming memory of another sim device, memory freed before the launch or pageable
// host memory fails its device when its stream gets to it, without running, as a GPU kernel faults
// on an illegal address ([Illegal addresses], sim.cpp).
void launch_kernel(void* stream, std::function<void()> fn, std::vector<const void*> buffers,
                   const char* what = "a kernel");

}  // namespace chorus::sim
