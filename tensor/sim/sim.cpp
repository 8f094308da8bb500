// The sim DeviceRuntime: memory (PROT_NONE segments with a per-segment access count), streams
// (worker threads with ordered queues), events (generation counters). See sim.h for the model.
#include "tensor/sim/sim.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cerrno>
#include <cstdlib>
#include <limits>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <shared_mutex>
#include <thread>
#include <vector>

#include "tensor/error.h"
#include "tensor/fault.h"
#include "tensor/runtime.h"

namespace chorus {
// tensor/storage.cpp ([Aligned huge mapping]): `bytes` of fresh memory on a 2 MiB boundary, advised
// for huge pages; nullptr when the mapping fails. Declared here, where it is used (no header).
void* map_huge_aligned(size_t bytes, int prot);
}  // namespace chorus

namespace chorus::sim {
namespace {

using Clock = std::chrono::steady_clock;

std::atomic<uint32_t> g_delay_us{0};
std::atomic<bool> g_driver_lock{false};
std::atomic<uint64_t> g_tasks{0};

uint32_t env_u32(const char* name, uint32_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  unsigned long x = std::strtoul(v, &end, 10);
  if (*end != '\0' || *v == '-' || errno == ERANGE || x > std::numeric_limits<uint32_t>::max()) {
    fail("{}={}: expected a non-negative integer below 2^32", name, v);
  }
  return static_cast<uint32_t>(x);
}

// ---- Memory ------------------------------------------------------------------------------------

struct Segment {
  size_t bytes = 0;
  int device = 0;
  int active = 0;  // tasks running that use this segment
  bool retired = false;  // freed, waiting for the streams to pass before it is unmapped
};

class Memory {
 public:
  explicit Memory(bool protect) : protect_(protect) {}

  void* allocate(int device, size_t nbytes, size_t capacity) {
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    const size_t bytes = std::max<size_t>(page, (nbytes + page - 1) / page * page);
    std::lock_guard<std::mutex> lock(mutex_);
    if (in_use_[device] + bytes > capacity) return nullptr;
    void* p = map(bytes);
    if (p == nullptr) return nullptr;
    segments_[reinterpret_cast<uintptr_t>(p)] = Segment{bytes, device, 0, false};
    in_use_[device] += bytes;
    return p;
  }

  // Freed: no longer counted as in use; unmap() removes the mapping once the streams have passed.
  void retire(int device, void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = segments_.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == segments_.end() || it->second.device != device || it->second.retired) {
      fail("sim: free of {} which is not a live segment of sim:{}", ptr, device);
    }
    it->second.retired = true;
    in_use_[device] -= it->second.bytes;
  }
  void unmap(void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = segments_.find(reinterpret_cast<uintptr_t>(ptr));
    ::munmap(ptr, it->second.bytes);
    segments_.erase(it);
  }

  size_t in_use(int device) {
    std::lock_guard<std::mutex> lock(mutex_);
    return in_use_[device];
  }

  // Opens (delta +1) or closes (-1) the segments holding `buffers` for a task. Pointers outside
  // every segment (host memory) are ignored.
  void access(const std::vector<const void*>& buffers, int delta) {
    if (!protect_ || buffers.empty()) return;
    std::lock_guard<std::mutex> lock(mutex_);
    for (const void* b : buffers) {
      const auto addr = reinterpret_cast<uintptr_t>(b);
      auto it = segments_.upper_bound(addr);
      if (it == segments_.begin()) continue;
      --it;
      if (addr >= it->first + it->second.bytes) continue;
      Segment& s = it->second;
      const int before = s.active;
      s.active += delta;
      if (before == 0 && s.active == 1) {
        ::mprotect(reinterpret_cast<void*>(it->first), s.bytes, PROT_READ | PROT_WRITE);
      } else if (before == 1 && s.active == 0) {
        ::mprotect(reinterpret_cast<void*>(it->first), s.bytes, PROT_NONE);
      }
    }
  }

  bool protect() const { return protect_; }

  // [Illegal addresses] What a GPU refuses that sim's guard alone would let through: device
  // memory named by a kernel of another device (chorus enables no peer access, so a GPU kernel
  // faults there: cudaErrorIllegalAddress, sticky), or freed before the launch (cudaFree has
  // unmapped it on a GPU; here it stays mapped while free waits for the streams to pass it, and a
  // kernel another thread launches meanwhile would run on it without this check). Pointers in no
  // segment, live or freed, are host memory: they are appended to `host` for the runtime, which
  // knows which host memory is page-locked (launch_kernel). Returns why the kernel is illegal, or
  // nothing.
  std::optional<std::string> illegal_kernel_access(int device, const std::vector<const void*>& buffers,
                                                   std::vector<const void*>& host) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const void* b : buffers) {
      const std::optional<Found> f = find(reinterpret_cast<uintptr_t>(b));
      if (!f) {
        if (b != nullptr) host.push_back(b);
        continue;
      }
      if (f->freed()) {
        return fmt::format("named memory freed before the launch ({} in the segment of {} bytes at {:#x} that free() "
                           "released; a GPU has unmapped it: cudaErrorIllegalAddress, \"an illegal memory access was "
                           "encountered\")",
                           b, f->segment.bytes, f->base);
      }
      if (f->segment.device != device) {
        return fmt::format("named memory of sim:{} ({} in its segment of {} bytes at {:#x}); chorus enables no peer "
                           "access, so a GPU kernel faults there (cudaErrorIllegalAddress, \"an illegal memory access was "
                           "encountered\"): copy the tensor to sim:{} first (Tensor::to)",
                           f->segment.device, b, f->segment.bytes, f->base, device);
      }
    }
    return std::nullopt;
  }
  // Where p lies in a device segment, live or freed (until unmapped), said for an error; nothing for
  // host memory (and for a segment already unmapped, which is not remembered).
  std::optional<std::string> device_memory(const void* p) {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::optional<Found> f = find(reinterpret_cast<uintptr_t>(p));
    if (!f) return std::nullopt;
    return fmt::format("{} is sim:{}'s device memory (in its segment of {} bytes at {:#x}{})", p, f->segment.device,
                       f->segment.bytes, f->base, f->freed() ? ", freed" : "");
  }
  // A copy's sides ([Illegal addresses]), as cudaMemcpyAsync checks them against its allocations
  // (cudaErrorInvalidValue at the call): a device side must lie, [p, p + nbytes), in one live
  // segment; a host side in none (the kind the caller gave must be the kind of the memory). A copy
  // between two devices is legal (CUDA copies across devices without peer access, staged).
  void check_copy_side(const void* p, size_t nbytes, const char* side, bool device_side, const char* kind) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto addr = reinterpret_cast<uintptr_t>(p);
    const std::optional<Found> f = find(addr);
    if (!device_side) {
      if (f) {
        fail("sim: memcpy_async ({}): the {} {} is sim:{}'s device memory (in its segment of {} bytes at {:#x}{}), "
             "not host memory: on a GPU the copy is refused (cudaErrorInvalidValue)",
             kind, side, p, f->segment.device, f->segment.bytes, f->base, f->freed() ? ", freed" : "");
      }
      return;
    }
    if (!f) {
      fail("sim: memcpy_async ({}): the {} {} is not sim device memory (no segment holds it: host memory, or device "
           "memory freed and unmapped): on a GPU the copy is refused (cudaErrorInvalidValue)",
           kind, side, p);
    }
    if (f->freed()) {
      fail("sim: memcpy_async ({}): the {} {} is in the segment of {} bytes at {:#x} that free() released: on a GPU "
           "the copy is refused (cudaErrorInvalidValue)",
           kind, side, p, f->segment.bytes, f->base);
    }
    const size_t after = f->base + f->segment.bytes - addr;
    if (nbytes > after) {
      fail("sim: memcpy_async ({}) of {} bytes: the {} {} has only {} bytes of its segment (of {} bytes at {:#x}) "
           "after it: on a GPU the copy is refused (cudaErrorInvalidValue)",
           kind, nbytes, side, p, after, f->segment.bytes, f->base);
    }
  }

 private:
  // Where an address lies: a live or a retired (freed, not yet unmapped) segment. An unmapped
  // segment is not remembered: the process's other mappings (host allocations) may take its
  // addresses at once. Called with mutex_ held.
  struct Found {
    uintptr_t base;
    Segment segment;
    bool freed() const { return segment.retired; }
  };
  static std::optional<std::pair<uintptr_t, Segment>> holding(const std::map<uintptr_t, Segment>& m, uintptr_t addr) {
    auto it = m.upper_bound(addr);
    if (it == m.begin()) return std::nullopt;
    --it;
    if (addr >= it->first + it->second.bytes) return std::nullopt;
    return *it;
  }
  std::optional<Found> find(uintptr_t addr) const {
    if (auto seg = holding(segments_, addr)) return Found{seg->first, seg->second};
    return std::nullopt;
  }

  // [Huge segments] A segment of 2 MiB or more is mapped at a 2 MiB boundary and marked for
  // transparent huge pages (MADV_HUGEPAGE; the kernel's default "madvise" mode then backs it with
  // 2 MiB pages when touched). Opening and closing a segment is an mprotect over all of it, and
  // every page of it touched after an mprotect costs a page-table fill; with 4 KiB pages that was
  // most of sim's time on a training step (on this project's VMs, whose page tables are
  // paravirtualized, each 4 KiB entry is expensive). With 2 MiB pages, 512 times fewer entries:
  // examples/resnet --device sim --amp bf16, 6 steps, trained in 8.7-9.4 s before and 1.45-1.51 s
  // after (1.19 s with the guard off). The guard is the same: a closed segment is PROT_NONE
  // whatever its page size (sim_runtime_test reads a closed huge segment from the host and
  // crashes). Where THP is off ("never"), madvise changes nothing.
  void* map(size_t bytes) {
    const int prot = protect_ ? PROT_NONE : PROT_READ | PROT_WRITE;
    constexpr size_t kHuge = size_t{2} << 20;
    if (bytes < kHuge) {
      void* p = ::mmap(nullptr, bytes, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      return p == MAP_FAILED ? nullptr : p;
    }
    return chorus::map_huge_aligned(bytes, prot);
  }

  const bool protect_;
  std::mutex mutex_;
  std::map<uintptr_t, Segment> segments_;
  std::map<int, size_t> in_use_;
};

// ---- Events ------------------------------------------------------------------------------------

// [A wait passes a device's failure on] An event record on a device that has failed (a sticky error,
// below) still completes on sim, so that a host synchronization returns the error instead of
// hanging; a GPU's record in a faulted context does not complete normally (CUDA: after such an error
// "any further CUDA work will return the same error"). So a stream of another device that waits for
// such a record fails its own device with an error naming the first one, and drops what follows the
// wait, instead of running it on stale or poisoned data: `y.to(sim:1)` after a fault on sim:0
// (autograd's copy_across_devices: the destination stream waits for the source stream's event, then
// copies) raises the fault at sim:1's next synchronization. Until 2026-12-04 the wait passed and
// the copy delivered the source's poisoned memory with no error (a read-only audit found it). A
// record that ran before its device failed passes as before. Since 2026-12-05 the first failure
// fails every device of the process ([A device error ends the process's CUDA], below), which covers
// this case too; this rule stays for a process run with that one removed (the tests that fail one
// device beside healthy ones). fault::Point::kSimFailedEventWait removes it (sim_fault_test).

// CUDA's semantics: a wait captures the generation of the latest record at the call and completes
// when that record's stream has reached it, whatever happens to later records of the same event on
// other streams (generations recorded on different streams complete in any order, so completion is
// a set, not a running maximum). query and synchronize look at the latest record.
struct SimEvent {
  int device = 0;
  bool timing = false;
  std::mutex mutex;
  std::condition_variable cv;
  uint64_t recorded = 0;             // generation of the last record() call
  uint64_t done_prefix = 0;          // every generation <= this has completed
  std::set<uint64_t> done_beyond;    // completed generations > done_prefix (out of order)
  uint64_t when_generation = 0;      // the latest completed generation, and when it completed
  Clock::time_point when;
  // Generations whose record ran after its device had failed, with the device's first error
  // ([A wait passes a device's failure on]).
  std::map<uint64_t, std::string> failed;

  bool done(uint64_t generation) const { return generation <= done_prefix || done_beyond.count(generation) != 0; }
  // `device_failure`: the recording device's first error, when it had failed by the time the record ran.
  void complete(uint64_t generation, std::optional<std::string> device_failure = std::nullopt) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (device_failure) failed.emplace(generation, std::move(*device_failure));
      done_beyond.insert(generation);
      while (!done_beyond.empty() && *done_beyond.begin() == done_prefix + 1) {
        done_beyond.erase(done_beyond.begin());
        ++done_prefix;
      }
      if (generation >= when_generation) {
        when_generation = generation;
        when = Clock::now();
      }
    }
    cv.notify_all();
  }
  void wait_for(uint64_t generation) {
    std::unique_lock<std::mutex> lock(mutex);
    cv.wait(lock, [&] { return done(generation); });
  }
  // After wait_for: the first error of the recording device if the record ran after it failed.
  std::optional<std::string> failure(uint64_t generation) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = failed.find(generation);
    if (it == failed.end()) return std::nullopt;
    return it->second;
  }
};

// ---- Device errors -----------------------------------------------------------------------------
// CUDA's sticky errors: after a kernel fault (an illegal address, a trap, cudaErrorLaunchFailure)
// the context is unusable, and every later runtime call of the process on that device returns the
// error. sim does the same for a failed task (only a test can make one: fault::fail_next_stream_task),
// so no code path is tested against a device more forgiving than a GPU: every later call on the
// device throws (check_healthy), and the streams run none of their queued work (a kernel, a copy, a
// host function is dropped; event records and waits still complete, so nobody waits forever for
// work that will never run, as CUDA's synchronizations return the error instead of hanging).

//
// [A device error ends the process's CUDA] CUDA's documentation of such an error
// (cudaErrorIllegalAddress, cudaErrorLaunchFailure) says it "leaves the process in an inconsistent
// state and any further CUDA work will return the same error", so the process must exit: not only
// the faulted device's calls. A GPU's other contexts may in fact go on, but nothing promises it, and
// sim must not be more forgiving than the contract: the first device to fail fails every other
// device of the process too, each naming it and its error. So a design that carries on after a fault
// on another device of the process (an emergency checkpoint from a healthy device's state, a
// pipeline stage on another device finishing its step) fails on sim as it may on a GPU. Until
// 2026-12-05 sim failed only the faulted device and those that waited for it ([A wait passes a
// device's failure on]). fault::Point::kSimProcessFault removes it (sim_process_fault_test); the
// tests that check one device's failure beside healthy ones in one process run with it removed.

struct DeviceHealth {
  std::atomic<bool> failed{false};
  std::mutex mutex;
  std::string why;
  int device = 0;
  const std::vector<std::unique_ptr<DeviceHealth>>* process = nullptr;  // every device's, this one's included

  void fail(const std::string& reason) {
    if (!set(reason)) return;  // the first error is the one every later call reports
    if (process == nullptr || fault::removed(fault::Point::kSimProcessFault)) return;
    // [A device error ends the process's CUDA]
    for (const auto& other : *process) {
      if (other.get() == this) continue;
      other->set(fmt::format("sim:{} failed, and CUDA's documentation leaves the whole process inconsistent after a "
                             "kernel fault (\"any further CUDA work will return the same error\"), every device's "
                             "work included: {}",
                             device, reason));
    }
  }
  std::string reason() {
    std::lock_guard<std::mutex> lock(mutex);
    return why;
  }

 private:
  // Records the device's first error; false if it had one already.
  bool set(const std::string& reason) {
    std::lock_guard<std::mutex> lock(mutex);
    if (failed.load()) return false;
    why = reason;
    failed.store(true);
    return true;
  }
};

// ---- Streams -----------------------------------------------------------------------------------

thread_local bool t_stream_thread = false;  // set on every SimStream's worker thread

// [No device calls on a stream] A CUDA kernel cannot call the runtime or the caching allocator (it is
// device code), so every stream task here (a cpu kernel, a copy) runs where runtime_for and the
// caching allocator throw (NoDeviceCallsGuard), and a task that threw fails its device, naming the
// call: a kernel that allocated or freed device memory on the stream would otherwise pass on sim and
// have no counterpart on a GPU. It also keeps `free` safe to block as cudaFree does
// (SimRuntime::free): no stream task waits for the allocator's lock, which `free` is called under.
// What a task captured is destroyed after the guard's scope (its tensors are non-owning aliases,
// kernels/sim/sim_kernels.cpp; a task that owned a device tensor would free it on the stream, which
// only a test's hand-made task could do). Host functions run on their own thread, under CUDA's rule
// for them ([One host-function thread]). Negative control: fault::Point::kSimStreamNoDeviceCalls
// (sim_fault_test).
constexpr const char* kStreamWorker =
    "a sim stream's worker thread (device work, as a CUDA kernel, calls no runtime and no allocator)";

struct Task {
  std::function<void()> fn;
  std::vector<const void*> buffers;
  bool is_wait = false;  // a stream-waits-event task (runs no user code, takes no delay)
  std::string failure{};  // non-empty: the task fails its device with this instead of running
                          // (an injected fault, or an illegal address found at the launch)
  bool opened = false;   // its segments were opened as the task before it ended ([Segment hand-over])
  bool blocks_queue = false;  // a wait that stalls its hardware queue until it ends ([Shared hardware queues])
  uint64_t issue = 0;         // its place in its hardware queue (SimStream::submit)
};

// [Shared hardware queues] A GPU feeds its streams through a few hardware queues (connections:
// CUDA_DEVICE_MAX_CONNECTIONS, 8 by default; Megatron-LM sets 1); sim gives them to streams in turn
// as they are made (sim's choice: CUDA does not document its assignment). A queue hands out its work
// in issue order: an independent kernel or copy is launched and the next item follows at once, but
// a wait (cuStreamWaitValue32, cudaStreamWaitEvent, a host function's completion) stalls the whole
// queue until it is satisfied, so work of *another* stream issued after it on the same queue does
// not start either. The driver API warns that stream memory operations "may deadlock" when the
// scheduler serializes them in an improper order. sim keeps one such queue per connection: a task
// starts only once every waiting task issued before it on its queue has ended (stricter in one
// respect: a wait here ends only after its own stream's earlier work, where a GPU may satisfy it
// sooner; more forgiving in another: a kernel that depends on its own stream's earlier kernel holds
// a GPU's shared queue too, and not sim's; for chorus's kernels that costs only time, not a hang:
// they wait for neither the host nor later work, so such a kernel starts once the waits issued
// before it have ended, and those already hold what follows it (a test's gate kernel, which waits
// for the host, could hang there; those tests give their streams queues of their own; a GPU kernel
// that spins on its peers, NCCL's, could too, and sim runs none). By default each device has ONE queue, the strictest
// count: every wait then stalls every task of the device issued after it, so the hold-ups of any
// count and any assignment of streams to queues are among those of one (a GPU's default is 8,
// assigned in a way CUDA does not document; Megatron-LM sets 1). CHORUS_SIM_CONNECTIONS=k (1-32)
// gives k queues in turn, 0 a queue of its own to every stream (sim's default until session 44);
// sim::set_connections does the same for streams a test makes. Found with one queue (2026-12-02): a Gloo send/receive ring
// hung (a receive's lane waited for a `ready` word behind the send lane's wait; a receive now needs
// none, distributed/gloo_communicator.cpp), and tests whose gate kernel holds one stream while
// another must get past a wait (they now make their streams with queues of their own).
// fault::Point::kSimSharedQueues removes it (sim_runtime_test).
class HardwareQueue {
 public:
  // The next issue number; a blocking task is pending from here until resolved().
  uint64_t issue(bool blocking) {
    std::lock_guard<std::mutex> lock(mutex_);
    const uint64_t n = ++issued_;
    if (blocking) pending_.insert(n);
    return n;
  }
  // Whether a task issued as `n` may start now: no blocking task issued before it is pending.
  bool admissible(uint64_t n) {
    std::lock_guard<std::mutex> lock(mutex_);
    return admissible_locked(n);
  }
  // Waits until it may.
  void admit(uint64_t n) {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return admissible_locked(n); });
  }
  void resolved(uint64_t n) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      pending_.erase(n);
    }
    cv_.notify_all();
  }

 private:
  bool admissible_locked(uint64_t n) const {
    return fault::removed(fault::Point::kSimSharedQueues) || pending_.empty() || *pending_.begin() >= n;
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  uint64_t issued_ = 0;
  std::set<uint64_t> pending_;
};

class SimStream {
 public:
  SimStream(int device, Memory* memory, DeviceHealth* health, HardwareQueue* queue)
      : device_(device), memory_(memory), health_(health), hardware_(queue), worker_([this] { run(); }) {
    worker_.detach();  // streams live as long as the process, as CUDA's
  }

  int device() const { return device_; }

  void submit(Task task) {
    // A test may have armed this stream: its next piece of device work fails (tensor/fault.h).
    if (!task.is_wait && fault::take_stream_failure(this) && task.failure.empty()) {
      task.failure = fmt::format(
          "a task on stream {} of sim:{} failed (an injected stream failure, fault::fail_next_stream_task; as a CUDA "
          "kernel fault, cudaErrorLaunchFailure \"unspecified launch failure\")",
          static_cast<const void*>(this), device_);
    }
    {
      // One lock order (the stream's submission, then its queue's numbering), so that a stream's
      // tasks are numbered in the order they are queued.
      std::lock_guard<std::mutex> lock(mutex_);
      task.issue = hardware_->issue(task.blocks_queue);
      queue_.push_back(std::move(task));
      ++submitted_;
    }
    cv_.notify_all();
  }

  bool idle() {
    std::lock_guard<std::mutex> lock(mutex_);
    return done_ == submitted_;
  }
  uint64_t submitted() {
    std::lock_guard<std::mutex> lock(mutex_);
    return submitted_;
  }
  // Blocks until the first n tasks submitted here have finished.
  void wait_done(uint64_t n) {
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [&] { return done_ >= n; });
  }

  void synchronize() {
    std::unique_lock<std::mutex> lock(mutex_);
    const uint64_t target = submitted_;
    done_cv_.wait(lock, [&] { return done_ >= target; });
  }

 private:
  void run() {
    t_stream_thread = true;
    std::minstd_rand rng(static_cast<uint32_t>(reinterpret_cast<uintptr_t>(this) >> 4));
    for (;;) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return !queue_.empty(); });
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      hardware_->admit(task.issue);
      const uint32_t delay = g_delay_us.load(std::memory_order_relaxed);
      if (delay > 0 && !task.is_wait) {
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % (delay + 1)));
      }
      if (!task.failure.empty()) {
        health_->fail(task.failure);
      } else if (task.is_wait || !health_->failed.load(std::memory_order_acquire)) {
        if (!task.opened) memory_->access(task.buffers, +1);
        task.opened = true;
        try {
          std::optional<NoDeviceCallsGuard> no_device_calls;
          if (!fault::removed(fault::Point::kSimStreamNoDeviceCalls)) no_device_calls.emplace(kStreamWorker);
          task.fn();  // kernels do not throw on the stream (the op layer checked their arguments)
        } catch (const std::exception& e) {
          // A kernel that did (one that called the runtime or the caching allocator: [No device
          // calls on a stream]) faults its device, as a CUDA kernel's trap does: sticky, and named.
          // So does a wait for an event recorded after its device failed ([A wait passes a device's
          // failure on]), which throws on purpose.
          health_->fail(fmt::format("a task on stream {} of sim:{} failed: {}", static_cast<const void*>(this), device_,
                                    e.what()));
        }
        hand_over();
      }  // else: the device has failed; its queued work is dropped (see DeviceHealth)
      if (task.opened) memory_->access(task.buffers, -1);
      if (task.blocks_queue) hardware_->resolved(task.issue);
      // Destroy what the task captured (tensors kept alive for it) before it counts as done: a
      // host that synchronized the stream must see those tensors freed.
      task = Task{};
      g_tasks.fetch_add(1, std::memory_order_relaxed);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        ++done_;
      }
      done_cv_.notify_all();
    }
  }

  // [Segment hand-over] Opening a segment (PROT_READ | PROT_WRITE) and closing it again (PROT_NONE)
  // costs an mprotect of the whole segment, a page-table walk over all of it and a TLB flush: done
  // for every task, the guard made a ResNet-18 step on sim 11-13x slower than with it off
  // (2026-11-30, examples/resnet --device sim --amp bf16 --max-steps 6: 13.6-15.2 s of training
  // against 1.2 s with CHORUS_SIM_PROTECT=0). Consecutive tasks of a stream often share segments, so
  // the task that ends opens those of the next queued task (if it is already queued) before closing
  // its own: a segment both use stays open, and is closed when a task using it ends with no queued
  // successor that uses it. Measured: 2,730 -> 1,500 mprotect calls a step (strace -c), 10.6 s for
  // the 6 steps, the same loss; ~750 opens a step remain (tasks on segments their predecessor did not
  // use), the rest of the guard's cost. What the host can get away with grows by one window: a
  // segment is also open while a task naming it is next in line on a busy stream (docs/gpu.md, "what
  // sim cannot catch"); never while the stream is idle, so a synchronized host that reads device
  // memory still crashes (sim_runtime_test).
  void hand_over() {
    std::vector<const void*> next;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (queue_.empty()) return;
      Task& t = queue_.front();
      if (!t.failure.empty() || t.opened || t.buffers.empty() || health_->failed.load(std::memory_order_acquire)) return;
      // One held up behind another stream's wait on a shared queue opens its segments when it starts.
      if (!hardware_->admissible(t.issue)) return;
      t.opened = true;
      next = t.buffers;
    }
    memory_->access(next, +1);
  }

  const int device_;
  Memory* memory_;
  DeviceHealth* health_;
  HardwareQueue* hardware_;
  std::mutex mutex_;
  std::condition_variable cv_, done_cv_;
  std::deque<Task> queue_;
  uint64_t submitted_ = 0, done_ = 0;
  std::thread worker_;
};

// ---- Host functions ----------------------------------------------------------------------------
// As in a CUDA host function (cudaLaunchHostFunc), a device call made inside one fails
// (cudaErrorNotPermitted), and so does one made while destroying what the function captured.
//
// [One host-function thread] CUDA runs host functions of independent streams "in undefined order"
// and "may serialize" them (the cudaLaunchHostFunc documentation): one driver thread may run those of
// every stream, so a host function that waits for another stream's host function, or for host work
// that waits for one, deadlocks there. sim runs them all on one process-wide thread, each while its
// stream waits for it, so such a wait hangs on sim too instead of passing by luck. (Until
// 2026-12-01 each ran on its own stream's thread, more forgiving than CUDA.) The negative control:
// fault::Point::kHostFunctionThread removed runs each on its stream's thread again
// (sim_runtime_test shows two host functions of two streams overlapping then, never with it).

thread_local bool t_in_host_function = false;
std::atomic<int> g_driver_lock_holders{0};  // threads holding the driver lock exclusively (driver_lock_held)
std::atomic<int> g_frees_waiting{0};        // threads waiting for the device in free or host_free (frees_waiting)
std::atomic<int> g_event_waits{0};          // stream tasks waiting for another stream's event (event_waits_pending)

// While a free or host_free waits for the device (counted for tests).
class FreeWaiting {
 public:
  FreeWaiting() { g_frees_waiting.fetch_add(1); }
  ~FreeWaiting() { g_frees_waiting.fetch_sub(1); }
  FreeWaiting(const FreeWaiting&) = delete;
  FreeWaiting& operator=(const FreeWaiting&) = delete;
};

// The driver lock held exclusively by a blocking copy, free or host_free (when the lock is on),
// counted for tests.
class ExclusiveDriver {
 public:
  explicit ExclusiveDriver(std::shared_mutex& m) : lock_(m, std::defer_lock) {
    // (Never on a stream's own thread, sim's device side, as host_call below.)
    if (t_stream_thread || !g_driver_lock.load(std::memory_order_relaxed)) return;
    lock_.lock();
    g_driver_lock_holders.fetch_add(1);
  }
  ~ExclusiveDriver() {
    if (lock_.owns_lock()) g_driver_lock_holders.fetch_sub(1);
  }
  ExclusiveDriver(const ExclusiveDriver&) = delete;
  ExclusiveDriver& operator=(const ExclusiveDriver&) = delete;

 private:
  std::unique_lock<std::shared_mutex> lock_;
};
// This host thread's current sim device, as CUDA's per-thread current device ([The default stream is
// the current device's]).
thread_local int t_current_device = 0;

// As CUDA's runtime, which registers its teardown with atexit at its first call and unloads there
// (every later call fails with cudaErrorCudartUnloading, "driver shutting down"): sim's first device
// call registers the same, and after it has run every device call throws DeviceUnloading. An object
// made before the first device call (a process group) is destroyed after the unload, and what it
// frees or queries then fails, as on a GPU (seen on an H200, 2026-11-29: cudaFreeHost from the Gloo
// staging pool at exit). destroy_event is the exception, as cudaEventDestroy's result is ignored.
std::atomic<bool> g_unloaded{false};
std::once_flag g_unload_registered;

void check_loaded(const char* call) {
  std::call_once(g_unload_registered, [] { std::atexit([] { g_unloaded.store(true, std::memory_order_release); }); });
  if (g_unloaded.load(std::memory_order_acquire)) {
    throw DeviceUnloading(fmt::format("sim: {}: driver shutting down (cudaErrorCudartUnloading): the process is exiting "
                                      "and the runtime has unloaded",
                                      call));
  }
}

void refuse_in_host_function(const char* call) {
  check_loaded(call);
  if (t_in_host_function) {
    fail("sim: {} called inside a host function (launch_host_task): CUDA refuses every CUDA call there "
         "(cudaErrorNotPermitted); do it on a thread of your own",
         call);
  }
}

// Runs fn and then destroys what it captured, both under the host-function rule. An exception
// leaving fn ends the process, as one thrown through CUDA's C callback does.
void run_host_function(std::function<void()>& fn) noexcept {
  t_in_host_function = true;
  fn();
  fn = nullptr;
  t_in_host_function = false;
}

// The one thread (started on first use, living as long as the process, as the streams' threads).
class HostFunctionThread {
 public:
  static HostFunctionThread& get() {
    static HostFunctionThread* instance = new HostFunctionThread();  // never destroyed: streams may still call it at exit
    return *instance;
  }
  // Runs fn there and returns when it has run (the calling stream waits, as a CUDA stream does for
  // its host function).
  void run(std::function<void()>& fn) {
    Call call{&fn};
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(&call);
    }
    cv_.notify_all();
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [&] { return call.done; });
  }

 private:
  struct Call {
    std::function<void()>* fn;
    bool done = false;
  };
  HostFunctionThread() : worker_([this] { loop(); }) { worker_.detach(); }
  void loop() {
    for (;;) {
      Call* call;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return !queue_.empty(); });
        call = queue_.front();
        queue_.pop_front();
      }
      run_host_function(*call->fn);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        call->done = true;
      }
      done_cv_.notify_all();
    }
  }
  std::mutex mutex_;
  std::condition_variable cv_, done_cv_;
  std::deque<Call*> queue_;
  std::thread worker_;
};

// ---- The runtime -------------------------------------------------------------------------------

// The CHORUS_SIM_* settings, read once, when the runtime is made (at static initialization).
// [A refused setting is refused at the first use] A value that is not a setting (CHORUS_SIM_DEVICES=two,
// CHORUS_SIM_CONNECTIONS=40) used to throw from that static initializer, which ends the process
// with std::terminate before main runs, in every program linked with chorus, sim used or not. Now
// the refusal is kept: sim then has no device, device_count(Sim) is 0, and each use of a sim device
// fails with a chorus::Error that names the setting (runtime_for: "no sim device: ...").
struct Settings {
  int devices = 2;
  bool poison = true;        // CHORUS_SIM_POISON (on unless =0)
  bool protect = true;       // CHORUS_SIM_PROTECT (on unless =0)
  uint32_t delay_us = 0;     // CHORUS_SIM_DELAY_US
  bool driver_lock = true;   // CHORUS_SIM_DRIVER_LOCK (on unless =0)
  uint32_t memory_mb = 16 << 10;
  int connections = 1;
  std::string refused;       // why a setting was refused; empty when all were taken
};

Settings read_settings() {
  Settings s;
  try {
    const uint32_t devices = env_u32("CHORUS_SIM_DEVICES", 2);
    if (devices > 1024) fail("CHORUS_SIM_DEVICES={}: expected at most 1024 sim devices", devices);
    s.devices = static_cast<int>(devices);
    s.poison = env_u32("CHORUS_SIM_POISON", 1) != 0;
    s.protect = env_u32("CHORUS_SIM_PROTECT", 1) != 0;
    s.delay_us = env_u32("CHORUS_SIM_DELAY_US", 0);
    s.driver_lock = env_u32("CHORUS_SIM_DRIVER_LOCK", 1) != 0;
    // CHORUS_SIM_MEMORY_MB: every device's capacity in MiB (a test or an example run sets it to
    // make a job run out of device memory; set_memory_capacity changes it in process).
    s.memory_mb = env_u32("CHORUS_SIM_MEMORY_MB", 16 << 10);
    if (s.memory_mb == 0) fail("CHORUS_SIM_MEMORY_MB=0: a sim device needs some memory (the value is in MiB)");
    // [Shared hardware queues]: one per device unless CHORUS_SIM_CONNECTIONS says otherwise (not read
    // from CUDA_DEVICE_MAX_CONNECTIONS, which training set-ups export for their GPUs).
    const uint32_t connections = env_u32("CHORUS_SIM_CONNECTIONS", 1);
    if (connections > 32) {
      fail("CHORUS_SIM_CONNECTIONS={}: expected 1-32 hardware queues per device (as CUDA_DEVICE_MAX_CONNECTIONS), or 0 "
           "for a queue of its own per stream",
           connections);
    }
    s.connections = static_cast<int>(connections);
  } catch (const Error& e) {
    s = Settings{};
    s.devices = 0;
    s.refused = e.what();
  }
  return s;
}

class SimRuntime final : public DeviceRuntime {
 public:
  explicit SimRuntime(const Settings& settings)
      : count_(settings.devices), poison_(settings.poison), memory_(settings.protect), refused_(settings.refused) {
    g_delay_us.store(settings.delay_us);
    g_driver_lock.store(settings.driver_lock);
    capacity_.assign(count_, size_t(settings.memory_mb) << 20);
    default_streams_.resize(count_, nullptr);
    for (int d = 0; d < count_; ++d) {
      health_.push_back(std::make_unique<DeviceHealth>());
      health_.back()->device = d;
      health_.back()->process = &health_;
    }
    connections_ = settings.connections;
    hardware_.resize(count_);
    created_.resize(count_);
  }

  DeviceType type() const override { return DeviceType::Sim; }
  int device_count() override { return count_; }
  std::string unavailable_reason() override {
    if (refused_.empty()) return "CHORUS_SIM_DEVICES=0";
    return "a CHORUS_SIM_* setting was refused when chorus started: " + refused_;
  }
  // [The default stream is the current device's] CUDA keeps a current device per host thread (0 on a
  // new thread; cudaSetDevice changes it) and every device's default stream is one handle, the null
  // stream, which names the current device's: a copy, event record or wait, kernel or query given the
  // default stream of device d while device c is current goes to (or is refused on) c's. sim's
  // default streams are distinct objects, so before this rule a call on sim:1's default stream from a
  // thread where sim:0 is current ran on sim:1 and passed, where a GPU would order the copy on
  // cuda:0's stream or refuse the event record. Now such a call is refused, naming the call and both
  // devices (stricter than CUDA, which misorders the copy without a word). The shared layer makes
  // the stream's device current for each such call (tensor/runtime.cpp, [A stream's device is
  // current]); fault::Point::kStreamDeviceGuard removes that, and sim_runtime_test sees this refusal.
  void set_device(int device) override {
    refuse_in_host_function("set_device");  // cudaSetDevice is a CUDA call: refused there, and after the unload
    check_device(device, "set_device");
    // Switching to a device with a sticky error fails, as cudaSetDevice returns it (the cuda backend
    // switches only when the device differs, as PyTorch's c10::cuda::SetDevice); the thread stays on
    // its device, as the shared layer's record does (restore_device, tensor/runtime.cpp).
    if (device != t_current_device) check_healthy(device, "set_device");
    t_current_device = device;
  }

  // A device allocation is one of CUDA's implicit synchronizations (the programming guide,
  // "Implicit Synchronization": two commands of different streams cannot run concurrently if a
  // device memory allocation is issued between them), as page-locked allocation is: work issued
  // after it on any stream of the device starts only once everything issued before on every stream
  // of the device has finished (the host does not wait). A design that allocates while a stream
  // waits for work issued later (a collective whose peer is held behind this process's next
  // kernels) hangs here as on a GPU. fault::Point::kSimMallocBarrier removes it (sim_runtime_test).
  void* malloc(int device, size_t nbytes) override {
    refuse_in_host_function("malloc");
    check_healthy(device, "malloc");
    const auto shared = host_call();
    size_t cap;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      cap = capacity_[device];
    }
    void* p = memory_.allocate(device, nbytes, cap);
    if (p != nullptr && !fault::removed(fault::Point::kSimMallocBarrier)) barrier_streams(device);
    return p;
  }
  // [free holds the driver] While free and host_free wait for the device they hold the driver lock
  // exclusively, as a blocking copy does (driver_lock_), so every other host thread's device call
  // waits until the device has drained. CUDA does not document it, but it is what is seen: a live
  // capture of a hang (lupinemachines/lupine PR #679, 2026) shows cuMemcpyHtoDAsync blocked acquiring
  // libcuda's internal rwlock while another thread's cuMemFree was on its writer, context-quiescence
  // path, and the GPU could not drain because a queued stream wait needed a host thread that never
  // got past that copy; PyTorch held a mutex around cudaFree for years because NCCL deadlocked when
  // cudaFree came while one thread launched a collective's kernels on several devices (pytorch PR
  // #880, issue #50925): the later launches waited behind the free. So host work the device waits
  // for must make no device call at all while any thread may free, which chorus's designs already
  // keep (NoDeviceCallsGuard on the Gloo lane worker; host functions may make none). Nor may a
  // stream task or host function destroy an owning device tensor while any thread may free: that
  // needs the caching allocator's mutex, which a thread allocating a new segment holds while it
  // waits here for the lock (none does today: sim kernels hold non-owning views). Until
  // 2026-12-04 both waited holding the lock shared, so other threads' calls went on (more
  // forgiving than CUDA; a read-only audit found it). fault::Point::kSimFreeHoldsDriver removes the
  // hold and leaves the wait (sim_runtime_test).
  //
  // As cudaFree, which synchronizes the device first: the host waits until every stream of the
  // device has run the work queued on it so far (which holds raw pointers, as CUDA kernels do), then
  // the segment is unmapped. The caching allocator calls this under its lock (as PyTorch's calls
  // cudaFree), so a host function or another thread that the device's queued work waits for, and that
  // itself waits for the allocator, deadlocks here as on a GPU. Stream tasks never wait for the
  // allocator ([No device calls on a stream]). With fault::Point::kSimFreeWaits removed, it returns at
  // once and the streams unmap the segment when the last passes the free (sim's behaviour until
  // 2026-12-01, more forgiving than CUDA).
  void free(int device, void* ptr) override {
    refuse_in_host_function("free");
    check_healthy(device, "free");  // cudaFree returns a sticky error (the cuda backend throws it)
    const bool waits = !fault::removed(fault::Point::kSimFreeWaits);
    const DriverHold hold(*this, waits && !fault::removed(fault::Point::kSimFreeHoldsDriver));  // [free holds the driver]
    memory_.retire(device, ptr);
    const std::vector<SimStream*> streams = streams_of(device);
    if (streams.empty()) {
      memory_.unmap(ptr);
      return;
    }
    if (waits) {
      const FreeWaiting waiting;
      for (SimStream* s : streams) s->synchronize();
      memory_.unmap(ptr);
      return;
    }
    auto remaining = std::make_shared<std::atomic<size_t>>(streams.size());
    Memory* memory = &memory_;
    for (SimStream* s : streams) {
      s->submit(Task{[remaining, memory, ptr] {
                       if (remaining->fetch_sub(1) == 1) memory->unmap(ptr);
                     },
                     {},
                     true});
    }
  }
  // A NaN in every floating dtype (float64: signalling; float32, bf16, fp16: NaN), a large number
  // in the integer ones. Not a CUDA call: sim's own check, so it takes no driver lock.
  void poison(void* ptr, size_t nbytes, StreamHandle s) override {
    if (!poison_ || t_stream_thread || nbytes == 0) return;
    as_stream(s)->submit(Task{[ptr, nbytes] {
                                auto* w = static_cast<uint64_t*>(ptr);
                                std::fill(w, w + nbytes / 8, uint64_t{0x7FF07FF07FF07FF0});
                              },
                              {ptr}});
  }
  size_t total_memory(int device) override {
    refuse_in_host_function("total_memory");  // cudaMemGetInfo
    check_healthy(device, "total_memory");  // (no driver lock: the allocator asks under its mutex, below)
    std::lock_guard<std::mutex> lock(mutex_);
    return capacity_[device];
  }
  // Pinned host memory is remembered: an asynchronous copy from it reads it when the stream gets
  // there (as CUDA's does), while one from any other host memory reads it at the call (staged).
  // Both are calls in the current device's context: its sticky error fails them, as cudaHostAlloc
  // and cudaFreeHost return it.
  void* host_malloc(size_t nbytes) override {
    refuse_in_host_function("host_malloc");
    check_healthy(t_current_device, "host_malloc");
    const auto shared = host_call();
    barrier_all_streams();
    void* p = std::aligned_alloc(64, std::max<size_t>(64, (nbytes + 63) / 64 * 64));
    if (p == nullptr) fail("sim: out of host memory allocating {} pinned bytes", nbytes);
    std::lock_guard<std::mutex> lock(mutex_);
    pinned_.emplace(reinterpret_cast<uintptr_t>(p), nbytes);
    return p;
  }
  // [host_free waits] cudaFreeHost synchronizes the device in practice (PyTorch's caching host
  // allocator exists to avoid it; HIP documents hipFreeHost as an implicit hipDeviceSynchronize), so
  // the host waits here, as in free above, until every stream has run what was queued before it:
  // a copy still queued into the block runs before the block goes, and a design that frees pinned
  // memory while a stream waits for something this host does later hangs on sim as on a GPU. With
  // fault::Point::kSimHostFreeWaits removed it returns at once (sim until 2026-12-04), after only
  // ordering later work behind earlier work.
  void host_free(void* ptr) override {
    refuse_in_host_function("host_free");
    check_healthy(t_current_device, "host_free");
    const bool waits = !fault::removed(fault::Point::kSimHostFreeWaits);
    const DriverHold hold(*this, waits && !fault::removed(fault::Point::kSimFreeHoldsDriver));  // [free holds the driver]
    {
      // Forgotten first, as free retires its segment first: a copy another thread queues on the
      // block during the wait is not one from page-locked memory any more.
      std::lock_guard<std::mutex> lock(mutex_);
      pinned_.erase(reinterpret_cast<uintptr_t>(ptr));
    }
    barrier_all_streams();
    if (waits) {
      const FreeWaiting waiting;
      for (SimStream* s : streams_of(-1)) s->synchronize();
    }
    std::free(ptr);
  }
  void check_pinned(const void* ptr, const char* what) {
    if (!is_pinned(ptr)) fail("sim: {} on {}, which is not page-locked host memory (host_malloc)", what, ptr);
  }
  // The page-locked block (start, size) holding `ptr`, if any.
  std::optional<std::pair<uintptr_t, size_t>> pinned_block(const void* ptr) {
    const auto addr = reinterpret_cast<uintptr_t>(ptr);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = pinned_.upper_bound(addr);
    if (it == pinned_.begin()) return std::nullopt;
    --it;
    if (addr >= it->first + it->second) return std::nullopt;
    return std::make_pair(it->first, it->second);
  }
  bool is_pinned(const void* ptr) { return pinned_block(ptr).has_value(); }
  bool is_page_locked(const void* ptr) override { return is_pinned(ptr); }
  // The host side of an asynchronous copy that starts in a page-locked block must end in it: the
  // copy's task reads or writes [ptr, ptr + nbytes) later, and past the block's end is memory the
  // host may have handed to anyone (on a GPU, a range part page-locked and part not is not one
  // asynchronous copy). Refused at the call, as a device side past its segment's end is.
  void check_pinned_range(const void* ptr, size_t nbytes, const char* side, const char* kind_name) {
    const auto block = pinned_block(ptr);
    if (!block) fail("sim: memcpy_async ({}): the {} {} is no longer page-locked host memory", kind_name, side, ptr);
    const auto addr = reinterpret_cast<uintptr_t>(ptr);
    const uintptr_t end = block->first + block->second;
    if (addr + nbytes > end) {
      fail("sim: memcpy_async ({}) of {} bytes: the {} {} has only {} bytes of its page-locked block (of {} bytes at "
           "{:#x}) from there",
           kind_name, nbytes, side, ptr, end - addr, block->second, block->first);
    }
  }

  StreamHandle create_stream(int device, bool /*high_priority*/) override {
    refuse_in_host_function("create_stream");
    check_healthy(device, "create_stream");
    const auto shared = host_call();
    return new_stream(device, false);
  }
  StreamHandle default_stream(int device) override {
    check_loaded("default_stream");
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (default_streams_[device] != nullptr) return default_streams_[device];
    }
    return new_stream(device, true);
  }
  bool query_stream(StreamHandle s) override {
    refuse_in_host_function("query_stream");
    check_stream(s, "query_stream");
    const auto shared = host_call();
    return as_stream(s)->idle();
  }
  // A failure while the host waits is reported when the wait ends (the failed device drops the
  // rest of the queue, so the wait ends soon), as cudaStreamSynchronize returns it.
  void synchronize_stream(StreamHandle s) override {
    refuse_in_host_function("synchronize_stream");
    check_stream(s, "synchronize_stream");
    enter_driver();
    as_stream(s)->synchronize();
    check_healthy(as_stream(s)->device(), "synchronize_stream");
  }
  void synchronize_device(int device) override {
    refuse_in_host_function("synchronize_device");
    check_healthy(device, "synchronize_device");
    enter_driver();
    for (SimStream* s : streams_of(device)) s->synchronize();
    check_healthy(device, "synchronize_device");
  }
  // One device's streams (device >= 0) or every stream (-1), as barrier_streams takes them.
  std::vector<SimStream*> streams_of(int device) {
    std::vector<SimStream*> all;
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& s : streams_)
      if (device < 0 || s->device() == device) all.push_back(s.get());
    return all;
  }

  void memcpy_async(void* dst, const void* src, size_t nbytes, CopyKind kind, StreamHandle s) override {
    refuse_in_host_function("memcpy_async");
    check_stream(s, "memcpy_async");
    if (nbytes == 0) return;
    const char* kind_name = kind == CopyKind::HostToDevice   ? "host to device"
                            : kind == CopyKind::DeviceToHost ? "device to host"
                                                             : "device to device";
    memory_.check_copy_side(dst, nbytes, "destination", kind != CopyKind::DeviceToHost, kind_name);
    memory_.check_copy_side(src, nbytes, "source", kind != CopyKind::HostToDevice, kind_name);
    const auto d = reinterpret_cast<uintptr_t>(dst), r = reinterpret_cast<uintptr_t>(src);
    if (kind == CopyKind::DeviceToDevice && d < r + nbytes && r < d + nbytes) {
      // cudaMemcpy*'s areas "may not overlap": undefined there; refused here.
      fail("sim: memcpy_async (device to device) of {} bytes from {} to {}: the two areas overlap, which CUDA's copies "
           "leave undefined",
           nbytes, src, dst);
    }
    if (kind == CopyKind::DeviceToHost && !is_pinned(dst)) {
      // As CUDA with pageable memory: the copy is synchronous, and the driver lock is held while
      // it waits for the stream (see driver_lock_).
      ExclusiveDriver exclusive(driver_lock_);
      as_stream(s)->submit(Task{[=] { std::memcpy(dst, src, nbytes); }, {dst, src}});
      as_stream(s)->synchronize();
      check_healthy(as_stream(s)->device(), "memcpy_async (a copy to pageable host memory, synchronous)");
      return;
    }
    if (kind == CopyKind::HostToDevice && !is_pinned(src)) {
      // [A pageable copy waits for its stream]. CUDA stages pageable memory through pinned buffers
      // of its own, and a copy between device and pageable memory "might be synchronous with
      // respect to host" (the runtime API's "API synchronization behavior"): the strictest reading,
      // which sim takes, is that the host waits until the stream has run what was queued before the
      // copy and the copy itself, holding the driver lock as a copy to pageable memory does. A host
      // that issues one while the stream, or another stream on its hardware queue, waits for
      // something the same host (or a thread that needs the driver) does later hangs on a GPU; here
      // too. Until 2026-12-02 the call returned at once; until 2026-12-04 it waited for the
      // stream's earlier work only, so a copy held behind another stream's wait on the shared
      // queue returned (a read-only audit found it). The source is read before the call returns
      // (staged). fault::Point::kSimPageableCopyWaits removes the wait (sim_runtime_test).
      const bool waits = !fault::removed(fault::Point::kSimPageableCopyWaits);
      const DriverHold hold(*this, waits);
      auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                        static_cast<const char*>(src) + nbytes);
      as_stream(s)->submit(Task{[=] { std::memcpy(dst, staged->data(), nbytes); }, {dst}});
      if (waits) {
        as_stream(s)->synchronize();
        check_healthy(as_stream(s)->device(), "memcpy_async (a copy from pageable host memory, which waits for it)");
      }
      return;
    }
    if (kind == CopyKind::HostToDevice) check_pinned_range(src, nbytes, "source", kind_name);
    if (kind == CopyKind::DeviceToHost) check_pinned_range(dst, nbytes, "destination", kind_name);
    const auto shared = host_call();
    as_stream(s)->submit(Task{[=] { std::memcpy(dst, src, nbytes); }, {dst, src}});
  }

  // [A host function reads no device memory] A CUDA host function runs on a CPU thread, where
  // device memory cannot be read or written (tensor/runtime.h), so the buffers a host task names
  // must be host memory: device memory is refused at the call (stricter than a GPU, which would
  // fault only when the function touches it), and the task opens no segment. Before 2026-12-04 sim
  // opened the named segments for the function's duration, so one that read a device buffer passed
  // on sim (no chorus code named any; a read-only audit found it). tensor/runtime.h's comment on
  // launch_host_task is stale three ways: sim's kernels have not run this way since they moved to
  // sim::launch_kernel, sim opens no buffer, and the parameter is named device_buffers where device
  // memory is what sim refuses. Left for the next change to that header (every file includes it,
  // so a comment there rebuilds the project in every configuration).
  void launch_host_task(StreamHandle s, std::function<void()> fn, std::vector<const void*> buffers) override {
    refuse_in_host_function("launch_host_task");
    check_stream(s, "launch_host_task");
    for (const void* b : buffers) {
      if (const std::optional<std::string> why = memory_.device_memory(b)) {
        fail("sim: launch_host_task: a host function cannot access device memory, and the buffer {}: a CUDA host "
             "function (cudaLaunchHostFunc) runs on a CPU thread, where reading it faults; copy it to page-locked "
             "host memory in stream order first (memcpy_async)",
             *why);
      }
    }
    const auto shared = host_call();
    auto held = std::make_shared<std::function<void()>>(std::move(fn));
    Task task{[held] {
                if (fault::removed(fault::Point::kHostFunctionThread)) run_host_function(*held);
                else HostFunctionThread::get().run(*held);
              },
              {}};
    task.blocks_queue = true;  // the queue waits for the host to finish it
    as_stream(s)->submit(std::move(task));
  }
  void stream_write_value(StreamHandle s, uint32_t* word, uint32_t value) override {
    refuse_in_host_function("stream_write_value");
    check_stream(s, "stream_write_value");
    const auto shared = host_call();
    check_pinned(word, "stream_write_value");
    as_stream(s)->submit(Task{[word, value] { std::atomic_ref<uint32_t>(*word).store(value, std::memory_order_release); },
                              {}});
  }
  void stream_wait_value(StreamHandle s, const uint32_t* word, uint32_t value) override {
    refuse_in_host_function("stream_wait_value");
    check_stream(s, "stream_wait_value");
    const auto shared = host_call();
    check_pinned(word, "stream_wait_value");
    auto* w = const_cast<uint32_t*>(word);  // atomic_ref needs a non-const object; only loaded
    DeviceHealth* health = health_[as_stream(s)->device()].get();
    // A failed device waits for nothing (its work is dropped), or the host thread that would store
    // the word, waiting for this stream's earlier work, would wait forever.
    Task task{[w, value, health] {
                 while (static_cast<int32_t>(std::atomic_ref<uint32_t>(*w).load(std::memory_order_acquire) - value) < 0 &&
                        !health->failed.load(std::memory_order_acquire)) {
                   std::this_thread::sleep_for(std::chrono::microseconds(20));
                 }
               },
               {},
               true};
    task.blocks_queue = true;
    as_stream(s)->submit(std::move(task));
  }
  // A kernel: runs on the stream's own thread, concurrently with other streams' (sim.h).
  // A kernel that names memory a GPU would fault on ([Illegal addresses]) is launched, as on a GPU,
  // and fails its device when the stream gets to it (the error is sticky; the next synchronization
  // raises it), without running.
  void launch_kernel(StreamHandle s, std::function<void()> fn, std::vector<const void*> buffers, const char* what) {
    refuse_in_host_function("a kernel launch");
    const int device = as_stream(s)->device();
    check_healthy(device, "a kernel launch");
    if (device != t_current_device) {
      // The CUDA programming guide ("Stream and Event Behavior"): a kernel launch fails if it is issued
      // to a stream not associated with the current device. (chorus's CUDA kernels make the tensors'
      // device current first, kernels/cuda/cuda_common.h's LaunchContext; sim's do the same.)
      fail("sim: {} on a stream of sim:{} from a thread whose current device is sim:{}: CUDA fails a kernel launch "
           "on a stream of a device that is not current (cudaErrorInvalidResourceHandle); make sim:{} current first "
           "(DeviceGuard)",
           what, device, t_current_device, device);
    }
    const auto shared = host_call();
    Task task{std::move(fn), std::move(buffers)};
    std::vector<const void*> host;
    std::optional<std::string> why = memory_.illegal_kernel_access(device, task.buffers, host);
    for (const void* h : host) {
      if (why) break;
      // Host memory a GPU kernel can read is page-locked and mapped (host_malloc); not pageable.
      if (!is_pinned(h)) {
        why = fmt::format("named pageable host memory ({}: neither sim device memory, live or freed but still mapped, "
                          "nor page-locked host memory from host_malloc; device memory freed and unmapped looks the "
                          "same); a GPU kernel cannot read it (cudaErrorIllegalAddress, \"an illegal memory access was "
                          "encountered\")",
                          h);
      }
    }
    if (why) task.failure = fmt::format("{} on stream {} of sim:{} {}", what, s, device, *why);
    as_stream(s)->submit(std::move(task));
  }

  // An EventHandle is a heap-held shared_ptr: tasks that record or wait take their own reference,
  // so dropping an Event with work pending neither blocks the host nor frees what a stream uses.
  EventHandle create_event(int device, bool enable_timing) override {
    refuse_in_host_function("create_event");
    check_healthy(device, "create_event");
    const auto shared = host_call();
    auto ev = std::make_shared<SimEvent>();
    ev->device = device;
    ev->timing = enable_timing;
    return new std::shared_ptr<SimEvent>(std::move(ev));
  }
  // No error after the unload either (cudaEventDestroy's result is ignored); the host-side handle is
  // freed all the same, or LeakSanitizer would report every event a static outlived the unload with.
  // In a host function it is refused all the same (cudaEventDestroy is a CUDA call, which may fail
  // or hang there): dropping an Event's last reference inside one ends the process, naming the call.
  void destroy_event(EventHandle e) override {
    if (t_in_host_function) {
      fail("sim: destroy_event called inside a host function (launch_host_task): CUDA refuses every CUDA call there "
           "(cudaErrorNotPermitted); drop the event on a thread of your own");
    }
    const auto shared = host_call();
    delete static_cast<std::shared_ptr<SimEvent>*>(e);
  }
  void record_event(EventHandle e, StreamHandle s) override {
    refuse_in_host_function("record_event");
    check_stream(s, "record_event");
    const auto shared = host_call();
    std::shared_ptr<SimEvent> ev = shared_event(e);
    if (ev->device != as_stream(s)->device()) {
      fail("sim: record_event: the event was created on sim:{} and the stream is on sim:{}; CUDA records an event "
           "only on a stream of its own device (cudaErrorInvalidResourceHandle)",
           ev->device, as_stream(s)->device());
    }
    // Queued under the event's lock: a wait on another thread that sees this generation is issued
    // after the record ([Shared hardware queues]: a wait issued first on a shared queue would hold
    // up the record it waits for, which a GPU, where the record is queued before anyone sees it,
    // does not).
    std::lock_guard<std::mutex> lock(ev->mutex);
    const uint64_t generation = ++ev->recorded;
    DeviceHealth* health = health_[ev->device].get();
    as_stream(s)->submit(Task{[ev, generation, health] {
                                std::optional<std::string> failure;
                                if (health->failed.load(std::memory_order_acquire)) failure = health->reason();
                                ev->complete(generation, std::move(failure));
                              },
                              {},
                              true});
  }
  void stream_wait_event(StreamHandle s, EventHandle e) override {
    refuse_in_host_function("stream_wait_event");
    check_stream(s, "stream_wait_event");
    const auto shared = host_call();
    std::shared_ptr<SimEvent> ev = shared_event(e);
    uint64_t generation;
    {
      std::lock_guard<std::mutex> lock(ev->mutex);
      generation = ev->recorded;  // captured now: a later record() does not move this wait
    }
    if (generation == 0) return;
    const int waiter = as_stream(s)->device();
    Task task{[ev, generation, waiter] {
                g_event_waits.fetch_add(1);
                ev->wait_for(generation);
                g_event_waits.fetch_sub(1);
                // [A wait passes a device's failure on]
                if (ev->device == waiter || fault::removed(fault::Point::kSimFailedEventWait)) return;
                if (const std::optional<std::string> why = ev->failure(generation)) {
                  fail("sim: a wait on sim:{} for an event recorded on sim:{} after that device had failed ({}): on a "
                       "GPU such a wait never ends or fails, so nothing after it may run on sim:{}",
                       waiter, ev->device, *why, waiter);
                }
              },
              {},
              true};
    task.blocks_queue = true;
    as_stream(s)->submit(std::move(task));
  }
  bool query_event(EventHandle e) override {
    refuse_in_host_function("query_event");
    auto* ev = as_event(e);
    check_healthy(ev->device, "query_event");
    // No driver lock: the caching allocator polls its events under its mutex (as PyTorch's does), and
    // a stream thread here may free a tensor its task captured (sim's artefact), which needs that
    // mutex while a blocking copy holding the lock waits for the stream: a deadlock no GPU has.
    std::lock_guard<std::mutex> lock(ev->mutex);
    return ev->done(ev->recorded);
  }
  void synchronize_event(EventHandle e) override {
    refuse_in_host_function("synchronize_event");
    auto* ev = as_event(e);
    check_healthy(ev->device, "synchronize_event");
    enter_driver();
    uint64_t target;
    {
      std::lock_guard<std::mutex> lock(ev->mutex);
      target = ev->recorded;
    }
    ev->wait_for(target);
    check_healthy(ev->device, "synchronize_event");
  }
  // As cudaEventElapsedTime: both events of one device, made with timing and recorded (else
  // cudaErrorInvalidResourceHandle), their latest records completed (else cudaErrorNotReady).
  double elapsed_ms(EventHandle start, EventHandle end) override {
    refuse_in_host_function("elapsed_ms");
    auto* a = as_event(start);
    auto* b = as_event(end);
    check_healthy(a->device, "elapsed_ms");
    check_healthy(b->device, "elapsed_ms");
    const auto shared = host_call();
    if (a->device != b->device) {
      fail("sim: elapsed_ms: the start event is on sim:{} and the end event on sim:{}; CUDA times only events of one "
           "device (cudaErrorInvalidResourceHandle)",
           a->device, b->device);
    }
    if (!a->timing || !b->timing) {
      fail("sim: elapsed_ms: the {} event was created without timing (create_event(device, enable_timing=false), "
           "cudaEventDisableTiming): cudaErrorInvalidResourceHandle",
           !a->timing ? "start" : "end");
    }
    std::unique_lock<std::mutex> lock_a(a->mutex, std::defer_lock), lock_b(b->mutex, std::defer_lock);
    if (a == b) lock_a.lock();
    else std::lock(lock_a, lock_b);  // one mutex cannot be locked twice
    if (a->recorded == 0 || b->recorded == 0) {
      fail("sim: elapsed_ms: the {} event was never recorded (cudaErrorInvalidResourceHandle)",
           a->recorded == 0 ? "start" : "end");
    }
    if (!a->done(a->recorded) || !b->done(b->recorded) || a->when_generation != a->recorded ||
        b->when_generation != b->recorded) {
      fail("sim: elapsed_time of an event whose latest record has not completed (cudaErrorNotReady)");
    }
    return a == b ? 0.0 : std::chrono::duration<double, std::milli>(b->when - a->when).count();
  }

  // CUDA's driver holds a lock while a copy to pageable host memory waits for its stream (and while
  // cuMemFree waits for the device: [free holds the driver]), and the
  // other CUDA calls of the process (copies, launches, event records, allocations) wait for it: a
  // thread that device work waits for must make no CUDA call, or a blocking copy elsewhere
  // deadlocks the process (seen on an H100, 2026-11-26: the Gloo staging thread's copy,
  // docs/data/gloo_cuda_hang_stacks_rank0_2026-11-26.txt). sim holds this lock the same way.
  std::shared_mutex driver_lock_;
  // The lock as a host thread's device call takes it (shared); none on a stream's own thread, which
  // plays the device (what its tasks captured is destroyed there, sim's artefact, not a host call).
  std::shared_lock<std::shared_mutex> host_call() {
    if (t_stream_thread || !g_driver_lock.load(std::memory_order_relaxed)) return {};
    return std::shared_lock<std::shared_mutex>(driver_lock_);
  }
  // A host call's hold on the lock for its whole duration: exclusive for one that waits for the
  // device holding it (a copy from pageable memory, free, host_free), else shared as host_call.
  class DriverHold {
   public:
    DriverHold(SimRuntime& rt, bool exclusive) {
      if (exclusive) exclusive_.emplace(rt.driver_lock_);
      else shared_ = rt.host_call();
    }

   private:
    std::optional<ExclusiveDriver> exclusive_;
    std::shared_lock<std::shared_mutex> shared_;
  };
  // A call that then waits for the device (a stream, event or device synchronization) enters the
  // driver as every call does, and waits without holding the lock.
  void enter_driver() { const auto shared = host_call(); }

  void set_capacity(int device, size_t bytes) {
    check_device(device, "set_memory_capacity");
    std::lock_guard<std::mutex> lock(mutex_);
    capacity_[device] = bytes;
  }
  size_t in_use(int device) {
    check_device(device, "memory_in_use");
    return memory_.in_use(device);
  }
  bool protect() const { return memory_.protect(); }

  // Throws the device's sticky error, if it has one, naming the call that met it.
  void check_healthy(int device, const char* call) {
    check_device(device, call);
    DeviceHealth& h = *health_[device];
    if (!h.failed.load(std::memory_order_acquire)) return;
    fail("sim: {} on sim:{} failed: the device had an error earlier, and a device error is sticky (as CUDA's after a "
         "kernel fault: every later call on the device fails; the process must exit, e.g. to be started again by "
         "chorusrun --max-restarts): {}",
         call, device, h.reason());
  }
  // A call on stream `s`: its device's sticky error, then [The default stream is the current
  // device's] (set_device).
  void check_stream(StreamHandle s, const char* call) {
    const int device = as_stream(s)->device();
    check_healthy(device, call);
    if (device == t_current_device) return;
    bool is_default;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      is_default = default_streams_[device] == s;
    }
    if (!is_default) return;
    fail("sim: {} on sim:{}'s default stream from a thread whose current device is sim:{}: on CUDA every device's "
         "default stream is the null stream, which names the current device's, so on a GPU this would go to "
         "cuda:{}'s default stream (a copy or wait ordered on the wrong device, an event record refused with "
         "cudaErrorInvalidResourceHandle); make sim:{} current first (DeviceGuard, StreamGuard or set_device)",
         call, device, t_current_device, t_current_device, device);
  }
  std::optional<std::string> error(int device) {
    check_device(device, "device_error");
    DeviceHealth& h = *health_[device];
    if (!h.failed.load(std::memory_order_acquire)) return std::nullopt;
    return h.reason();
  }

 private:
  // As CUDA's implicit synchronization around page-locked allocation and free: work issued after
  // them on any stream starts only once everything issued before, on every stream, has finished
  // (the host does not wait). A stream-ordered design that allocates pinned memory while another
  // stream waits for it deadlocks here as it would on a GPU.
  void barrier_all_streams() { barrier_streams(-1); }
  // The same over one device's streams (device >= 0) or every stream (-1).
  void barrier_streams(int device) {
    Tails tails;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto& st : streams_)
        if (device < 0 || st->device() == device) tails.emplace_back(st.get(), st->submitted());
      (device < 0 ? last_barrier_all_ : last_barrier_[device]) = tails;  // for streams made later
    }
    for (auto& [stream, tail] : tails) submit_barrier(stream, tails);
  }
  // A wait on `stream` for the first n tasks of each other stream in `tails` (SimStream* never dangle:
  // sim's streams live as long as the process, as a pool's do).
  using Tails = std::vector<std::pair<SimStream*, uint64_t>>;
  static void submit_barrier(SimStream* stream, const Tails& tails) {
    stream->submit(Task{[tails, stream] {
                          for (const auto& [other, n] : tails)
                            if (other != stream) other->wait_done(n);
                        },
                        {},
                        true});
  }
  // [A new stream starts behind the last barrier] CUDA's rule is about commands, not streams: two
  // commands of different streams cannot run concurrently if an allocation was issued between
  // them. A stream made after the barrier (create_stream, or a device's default stream made on its
  // first use) has only commands issued after it, so its first work waits, as the streams that
  // existed then do, for what every stream of the device had been given before the last device
  // allocation, and every stream's before the last page-locked allocation or free. Without this
  // (sim until 2026-12-04) such a stream ran beside that work, more forgiving than a GPU: a design
  // whose new stream's work feeds what is held before the barrier passes on sim and hangs on a GPU.
  // fault::Point::kSimNewStreamBarrier removes it (sim_runtime_test).
  // The wait is queued before the lock is let go: another thread's default_stream() may hand the
  // new default stream out as soon as it is published, and its work must queue behind the wait
  // (barrier_streams takes a stream's lock under mutex_ too; nothing takes mutex_ under one).
  SimStream* new_stream(int device, bool as_default) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (as_default && default_streams_[device] != nullptr) return default_streams_[device];
    streams_.push_back(std::make_unique<SimStream>(device, &memory_, health_[device].get(), next_queue(device)));
    SimStream* stream = streams_.back().get();
    Tails behind = last_barrier_all_;
    const auto it = last_barrier_.find(device);
    if (it != last_barrier_.end()) behind.insert(behind.end(), it->second.begin(), it->second.end());
    if (!behind.empty() && !fault::removed(fault::Point::kSimNewStreamBarrier)) submit_barrier(stream, behind);
    if (as_default) default_streams_[device] = stream;
    return stream;
  }
  // The hardware queue of the device's next stream, in turn (called with mutex_ held).
  HardwareQueue* next_queue(int device) {
    const int k = set_connections_ >= 0 ? set_connections_ : connections_;
    // Each count k has a set of queues of its own (k == 0: a new queue for each stream): a stream
    // made under count k joins the streams made under the same k, the process's default count's
    // included when a test sets that same count, and no others.
    auto& queues = hardware_[device][k];
    const uint64_t n = created_[device][k]++;
    const size_t i = k > 0 ? static_cast<size_t>(n % static_cast<uint64_t>(k)) : queues.size();
    while (queues.size() <= i) queues.push_back(std::make_unique<HardwareQueue>());
    return queues[i].get();
  }
 public:
  void set_connections(int k) {
    if (k < kDefaultConnections || k > 32) {
      fail("sim::set_connections({}): expected 1-32 hardware queues, 0 (a queue per stream) or kDefaultConnections", k);
    }
    std::lock_guard<std::mutex> lock(mutex_);
    set_connections_ = k;
  }

 private:
  static SimStream* as_stream(StreamHandle s) { return static_cast<SimStream*>(s); }
  static SimEvent* as_event(EventHandle e) { return static_cast<std::shared_ptr<SimEvent>*>(e)->get(); }
  static std::shared_ptr<SimEvent> shared_event(EventHandle e) { return *static_cast<std::shared_ptr<SimEvent>*>(e); }
  void check_device(int device, const char* what) {
    if (count_ == 0) fail("sim::{}: no sim device: {}", what, unavailable_reason());
    if (device < 0 || device >= count_) fail("sim::{}: no device sim:{} (there are {})", what, device, count_);
  }

  const int count_;
  const bool poison_;
  std::mutex mutex_;
  std::vector<size_t> capacity_;
  std::vector<std::unique_ptr<DeviceHealth>> health_;  // per device, fixed after construction
  Memory memory_;
  const std::string refused_;  // the refused setting's message (read_settings); then count_ is 0
  std::vector<std::unique_ptr<SimStream>> streams_;
  std::vector<SimStream*> default_streams_;
  std::map<uintptr_t, size_t> pinned_;  // pinned host allocations: address -> bytes
  std::map<int, Tails> last_barrier_;   // per device: each stream's tasks before its last device allocation
  Tails last_barrier_all_;              // every stream's tasks before the last page-locked allocation or free
  int connections_ = 1;                                      // hardware queues per device (0: one per stream)
  int set_connections_ = -1;                                 // a test's count for streams made from now on (-1: none)
  std::vector<std::map<int, std::vector<std::unique_ptr<HardwareQueue>>>> hardware_;  // per device and count
  std::vector<std::map<int, uint64_t>> created_;             // streams made per device and count
};

// Created and registered on first use, so that any static initializer may call it.
SimRuntime& runtime() {
  static SimRuntime* rt = [] {
    auto* r = new SimRuntime(read_settings());  // leaked: worker threads run until the process exits
    register_runtime(DeviceType::Sim, r);
    return r;
  }();
  return *rt;
}

// Registers at static-initialization time, as every backend does.
const bool g_registered = (runtime(), true);

}  // namespace

DeviceRuntime& device_runtime() { return runtime(); }
void set_delay_us(uint32_t max_delay_us) { g_delay_us.store(max_delay_us); }
void set_driver_lock(bool on) { g_driver_lock.store(on); }
bool driver_lock() { return g_driver_lock.load(); }
bool driver_lock_held() { return g_driver_lock_holders.load() > 0; }
bool frees_waiting() { return g_frees_waiting.load() > 0; }
int event_waits_pending() { return g_event_waits.load(); }
void set_connections(int k) { runtime().set_connections(k); }
uint32_t delay_us() { return g_delay_us.load(); }
void set_memory_capacity(int device, size_t bytes) { runtime().set_capacity(device, bytes); }
size_t memory_in_use(int device) { return runtime().in_use(device); }
bool protection_enabled() { return runtime().protect(); }
std::optional<std::string> device_error(int device) { return runtime().error(device); }
uint64_t tasks_run() { return g_tasks.load(); }
void launch_kernel(void* stream, std::function<void()> fn, std::vector<const void*> buffers, const char* what) {
  runtime().launch_kernel(stream, std::move(fn), std::move(buffers), what);
}

}  // namespace chorus::sim
