// Device faults on sim (tensor/sim/sim.h, "Device errors are sticky"): a task a test makes fail
// (fault::fail_next_stream_task, tensor/test_faults.h) fails its device for good, as a CUDA kernel
// fault does: the host's next synchronization raises it, every later call on the device raises
// it, the device's queued work never runs, nothing hangs, frees in destructors do not throw, and
// the process's other devices go on unless they wait for the failed one. A process of its own (a
// failed device stays failed).
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tensor/caching_allocator.h"
#include "tensor/error.h"
#include "tensor/ops.h"
#include "tensor/runtime.h"
#include "tensor/sim/sim.h"
#include "tensor/test_faults.h"

using namespace chorus;
using namespace std::chrono_literals;

TEST_CASE("an injected stream failure is raised at the next synchronization and stays: every later call on the device fails") {
  const Device dev = Device::sim(1);
  DeviceRuntime& rt = runtime_for(dev, "sim_fault_test");
  Stream s = stream_from_pool(dev);
  Stream other = stream_from_pool(dev);
  StreamGuard guard(s);
  Tensor x = ones({1000}, {.device = dev});
  CHECK(x.sum().item<double>() == 1000.0);  // a healthy device first
  record_stream(x.storage(), other);         // so that its free must record an event on `other`
  {
    Tensor cached = ones({1 << 20}, {.device = dev});  // a segment of its own, cached once freed
  }
  s.synchronize();
  void* raw = rt.malloc(1, 4096);  // for the raw free after the failure
  REQUIRE(raw != nullptr);
  void* pinned = rt.host_malloc(64);
  // An allocator of the test's own, destroyed after the failure with a block waiting for an event
  // on `s` (recorded behind the held kernel below): its destructor must neither throw nor leak.
  std::optional<CachingAllocator> local(std::in_place, rt);
  void* waiting = nullptr;
  {
    const StreamGuard on_other(other);
    waiting = local->allocate(4096, dev);
  }
  local->record_stream(waiting, s);
  REQUIRE_FALSE(sim::device_error(1).has_value());

  // A kernel holds the stream while the next ones are queued behind it: the armed one (fails), one
  // after it (must never run), and an event.
  std::atomic<bool> release{false}, after_ran{false}, armed_ran{false};
  sim::launch_kernel(s.handle(), [&] { while (!release) std::this_thread::sleep_for(1ms); }, {});
  local->deallocate(waiting, dev);  // its event on `s` waits behind the held kernel
  fault::fail_next_stream_task(s);
  sim::launch_kernel(s.handle(), [&] { armed_ran = true; }, {});
  sim::launch_kernel(s.handle(), [&] { after_ran = true; }, {});
  Event done;
  done.record(s);
  release = true;

  std::string message;
  const auto start = std::chrono::steady_clock::now();
  try {
    s.synchronize();
  } catch (const Error& e) {
    message = e.what();
  }
  INFO(message);
  CHECK(std::chrono::steady_clock::now() - start < 5s);  // the host's wait ended: no hang
  CHECK_THAT(message, Catch::Contains("sim: synchronize_stream on sim:1 failed"));
  CHECK_THAT(message, Catch::Contains("injected stream failure") && Catch::Contains("sticky"));
  CHECK_FALSE(armed_ran.load());
  CHECK_FALSE(after_ran.load());  // a failed device runs none of its queued work
  REQUIRE(sim::device_error(1).has_value());
  CHECK_THAT(*sim::device_error(1), Catch::Contains("failed (an injected stream failure"));

  // Sticky: every later call on sim:1 raises, whichever stream or kind of call.
  CHECK_THROWS_WITH(other.synchronize(), Catch::Contains("synchronize_stream on sim:1") && Catch::Contains("injected"));
  CHECK_THROWS_WITH(done.query(), Catch::Contains("query_event on sim:1"));
  CHECK_THROWS_WITH(done.synchronize(), Catch::Contains("synchronize_event on sim:1"));
  CHECK_THROWS_WITH(x.to(kCPU), Catch::Contains("on sim:1 failed") && Catch::Contains("injected"));
  CHECK_THROWS_WITH((x + 1.0).sum().item<double>(), Catch::Contains("on sim:1 failed"));
  CHECK_THROWS_WITH(rt.malloc(1, 4096), Catch::Contains("malloc on sim:1"));
  CHECK_THROWS_WITH(ones({4}, {.device = dev}).to(kCPU), Catch::Contains("on sim:1 failed"));
  CHECK_THROWS_WITH(synchronize(dev), Catch::Contains("synchronize_device on sim:1"));
  // The calls that name no stream fail too, as their CUDA counterparts return the sticky error:
  // cudaFree, cudaStreamCreate, cudaMemGetInfo, and cudaHostAlloc/cudaFreeHost in the failed
  // device's context (sim:1 is current here, StreamGuard); cudaSetDevice from another device.
  CHECK_THROWS_WITH(rt.free(1, raw), Catch::Contains("free on sim:1 failed") && Catch::Contains("sticky"));
  CHECK_THROWS_WITH(rt.create_stream(1, false), Catch::Contains("create_stream on sim:1"));
  CHECK_THROWS_WITH(rt.total_memory(1), Catch::Contains("total_memory on sim:1"));
  CHECK_THROWS_WITH(rt.host_malloc(64), Catch::Contains("host_malloc on sim:1"));
  bool free_refused = false;
  try {
    rt.host_free(pinned);
  } catch (const Error& e) {
    free_refused = true;
    CHECK_THAT(e.what(), Catch::Contains("host_free on sim:1"));
  }
  CHECK(free_refused);
  {
    const DeviceGuard elsewhere(Device::sim(0));
    CHECK_THROWS_WITH(DeviceGuard(dev), Catch::Contains("set_device on sim:1 failed"));
    if (free_refused) CHECK_NOTHROW(rt.host_free(pinned));  // sim:0's context is healthy
  }
  // Leaving `elsewhere` gives sim:1 back: refused, and the thread stays on sim:0, in chorus's record
  // as in sim's (a call on sim:1's default stream would be refused as another device's).
  CHECK(current_device_index(DeviceType::Sim) == 0);
  CHECK_NOTHROW(local.reset());
  // The allocator's cached segment: empty_cache's free is refused, and the error reaches the caller
  // (the segment's record is kept with the lost blocks; LeakSanitizer checks it is not leaked).
  CHECK_THROWS_WITH(empty_cache(dev), Catch::Contains("free on sim:1 failed"));
  // A free in a destructor does not throw (its event record on `other` fails; the block is kept
  // out of the pools for good), and the error is still there afterwards.
  CHECK_NOTHROW(x = Tensor());
  CHECK_THROWS_WITH(other.synchronize(), Catch::Contains("injected"));

  // The process's other device is not affected.
  const Device healthy = Device::sim(0);
  CHECK_FALSE(sim::device_error(0).has_value());
  CHECK(ones({10}, {.device = healthy}).sum().item<double>() == 10.0);
}

TEST_CASE("without a test arming it, no task fails (release binaries cannot arm one)") {
  const Device dev = Device::sim(0);
  Tensor y = ones({100}, {.device = dev});
  for (int i = 0; i < 50; ++i) y = y + 1.0;
  CHECK(y.sum().item<double>() == 5100.0);
  CHECK_FALSE(sim::device_error(0).has_value());
}

// [No device calls on a stream] (tensor/sim/sim.cpp): a CUDA kernel is device code and cannot
// allocate or free device memory or call the runtime; a sim task that does fails its device, naming
// the call, instead of passing on sim with no counterpart on a GPU.
TEST_CASE("a stream task that allocates device memory fails its device, naming the call, as no CUDA kernel can; removed, it runs") {
  const Device dev = Device::sim(2);
  std::optional<DeviceGuard> current(dev);  // a kernel launches on a stream of the current device
  Stream s = current_stream(dev);
  std::atomic<bool> allocated{false};
  sim::launch_kernel(s.handle(), [&] {
    Tensor t = empty({16}, {.device = dev});
    allocated = true;
  }, {});
  std::string message;
  try {
    s.synchronize();
  } catch (const Error& e) {
    message = e.what();
  }
  INFO(message);
  CHECK_THAT(message, Catch::Contains("sim: synchronize_stream on sim:2 failed"));
  CHECK_THAT(message, Catch::Contains("CachingAllocator::allocate") && Catch::Contains("a sim stream's worker thread"));
  CHECK_FALSE(allocated.load());
  REQUIRE(sim::device_error(2).has_value());
  CHECK_THROWS_WITH(ones({4}, {.device = dev}).to(kCPU), Catch::Contains("on sim:2 failed"));  // sticky

  // The negative control: without the rule the same task allocates on the stream and passes, on a
  // healthy device.
  const Device healthy = Device::sim(0);
  {
    fault::RemovedScope allowed(fault::Point::kSimStreamNoDeviceCalls);
    current.reset();
    const DeviceGuard now(healthy);
    Stream h = current_stream(healthy);
    sim::launch_kernel(h.handle(), [&] {
      Tensor t = empty({16}, {.device = healthy});
      allocated = true;
    }, {});
    h.synchronize();
  }
  CHECK(allocated.load());
  CHECK_FALSE(sim::device_error(0).has_value());
}

// [A wait passes a device's failure on] (tensor/sim/sim.cpp): a tensor copied to another device
// (autograd's copy_across_devices: the destination's stream waits for an event recorded on the
// source's stream, then copies) after the kernel that made it faulted the source device. The event
// record runs after the fault on the source's stream, so the destination's wait fails its device
// too and the copy raises the fault instead of delivering the source's never-written memory. Removed
// (sim until 2026-12-04), the copy returned that memory with no error.
TEST_CASE("a copy from a device that failed before the copy's event fails the destination too; removed, it delivers unwritten memory") {
  // Returns the copy's error ("" if it returned), and the values it returned.
  const auto copy_after_fault = [](const Device from, const Device to, bool armed, std::vector<float>& values) {
    DeviceRuntime& rt = runtime_for(from, "sim_fault_test");
    auto* word = static_cast<uint32_t*>(rt.host_malloc(64));  // with sim:0 current (it stays healthy)
    word[0] = 0;
    std::string message;
    {
      const DeviceGuard current(from);
      Tensor x = ones({256}, {.device = from});
      const Stream held = current_stream(from);
      held.synchronize();
      // The source's stream is held until the destination's stream waits for the copy's event, so
      // that the fault comes after the event's record was issued (as behind a slow kernel on a GPU;
      // a fault seen first would make the record call itself raise it).
      rt.stream_wait_value(held.handle(), word, 1);
      if (armed) fault::fail_next_stream_task(held);
      // Armed: the first task for y (its poison fill; then its kernel is dropped) fails `from`, so y
      // is never written.
      Tensor y = x * 2.0;
      std::thread release([&] {
        // Once `to`'s stream is at the copy's wait for the event (a poll for a busy stream could
        // catch the poison fill of the copy's destination instead, before the record is issued).
        const auto patience = std::chrono::steady_clock::now() + 20s;
        while (sim::event_waits_pending() == 0 && std::chrono::steady_clock::now() < patience) {
          std::this_thread::sleep_for(1ms);
        }
        std::atomic_ref<uint32_t>(word[0]).store(1, std::memory_order_release);
      });
      try {
        Tensor z = y.to(to).to(kCPU);
        values.assign(z.data_ptr<float>(), z.data_ptr<float>() + z.numel());
      } catch (const Error& e) {
        message = e.what();
      }
      release.join();
    }
    rt.host_free(word);
    return message;
  };
  std::vector<float> values;
  // Unarmed first, on the devices the rule's case uses: the copy is right.
  CHECK(copy_after_fault(Device::sim(3), Device::sim(4), false, values).empty());
  CHECK(values == std::vector<float>(256, 2.0f));

  values.clear();
  const std::string message = copy_after_fault(Device::sim(3), Device::sim(4), true, values);
  INFO(message);
  CHECK_THAT(message, Catch::Contains("on sim:4 failed") && Catch::Contains("a wait on sim:4 for an event recorded on sim:3") &&
                          Catch::Contains("injected stream failure"));
  CHECK(values.empty());
  REQUIRE(sim::device_error(4).has_value());
  CHECK_THAT(*sim::device_error(4), Catch::Contains("injected"));
  CHECK_THROWS_WITH(ones({4}, {.device = Device::sim(4)}).to(kCPU), Catch::Contains("on sim:4 failed"));  // sticky
  CHECK_FALSE(sim::device_error(0).has_value());  // a device that waited for neither goes on

  // The negative control, on two other devices: without the rule the copy returns, and what it
  // returns is not y's values (the kernel that would have written them never ran).
  values.clear();
  std::string removed_message;
  {
    fault::RemovedScope without(fault::Point::kSimFailedEventWait);
    removed_message = copy_after_fault(Device::sim(5), Device::sim(6), true, values);
  }
  INFO(removed_message);
  CHECK(removed_message.empty());
  REQUIRE(values.size() == 256);
  CHECK(std::none_of(values.begin(), values.end(), [](float v) { return v == 2.0f; }));
  CHECK(sim::device_error(5).has_value());
  CHECK_FALSE(sim::device_error(6).has_value());
}
