// [A device error ends the process's CUDA] (tensor/sim/sim.cpp): CUDA documents a kernel fault as
// leaving the whole process inconsistent ("any further CUDA work will return the same error"), so
// the first sim device to fail fails every other device of the process too, naming it: a design
// that goes on with a healthy device's work after a fault on another one fails on sim as it may on
// a GPU. A process of its own (three sim devices, the BUILD sets CHORUS_SIM_DEVICES): the rule's
// negative control comes first, since a failure is for good.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "tensor/error.h"
#include "tensor/ops.h"
#include "tensor/runtime.h"
#include "tensor/sim/sim.h"
#include "tensor/test_faults.h"

using namespace chorus;
using namespace std::chrono_literals;

namespace {

// The message a synchronization of the stream raises, or "" if it raises none.
std::string sync_error(const Stream& s) {
  try {
    s.synchronize();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Fails sim:`index` with an injected kernel fault and returns what its stream's synchronization
// raised (the failure has been recorded, and passed on, by the time that returns: the failing task
// records it before it counts as done).
std::string fail_device(int index) {
  const Device dev = Device::sim(index);
  const DeviceGuard current(dev);  // a kernel launches on a stream of the current device
  const Stream s = current_stream(dev);
  fault::fail_next_stream_task(s);
  sim::launch_kernel(s.handle(), [] {}, {});
  return sync_error(s);
}

}  // namespace

TEST_CASE("a kernel fault on one sim device fails every device of the process, naming it; removed, the others go on") {
  REQUIRE(runtime_for(Device::sim(0), "sim_process_fault_test").device_count() == 3);
  DeviceRuntime& rt = runtime_for(Device::sim(0), "sim_process_fault_test");

  // The negative control: without the rule, sim:1's fault is its own (sim before 2026-12-05).
  {
    const fault::RemovedScope without(fault::Point::kSimProcessFault);
    const std::string message = fail_device(1);
    INFO(message);
    CHECK_THAT(message, Catch::Contains("synchronize_stream on sim:1 failed") && Catch::Contains("injected"));
    REQUIRE(sim::device_error(1).has_value());
    CHECK_FALSE(sim::device_error(0).has_value());
    CHECK_FALSE(sim::device_error(2).has_value());
    CHECK(ones({10}, {.device = Device::sim(0)}).sum().item<double>() == 10.0);
    CHECK(ones({10}, {.device = Device::sim(2)}).sum().item<double>() == 10.0);
  }
  const std::string first_error_of_1 = *sim::device_error(1);

  // With the rule: sim:0 has a kernel running and one queued behind it when sim:2 faults.
  const Device d0 = Device::sim(0);
  const DeviceGuard current(d0);
  Tensor x = ones({1000}, {.device = d0});
  CHECK(x.sum().item<double>() == 1000.0);
  const Stream s0 = current_stream(d0);
  std::atomic<bool> release{false}, after_ran{false};
  sim::launch_kernel(s0.handle(), [&] { while (!release) std::this_thread::sleep_for(1ms); }, {});
  sim::launch_kernel(s0.handle(), [&] { after_ran = true; }, {});

  const std::string message2 = fail_device(2);
  INFO(message2);
  CHECK_THAT(message2, Catch::Contains("synchronize_stream on sim:2 failed") && Catch::Contains("injected"));
  REQUIRE(sim::device_error(0).has_value());  // at once: before sim:0's held kernel has ended
  CHECK_THAT(*sim::device_error(0), Catch::Contains("sim:2 failed") && Catch::Contains("whole process") &&
                                        Catch::Contains("injected stream failure"));
  release = true;

  // sim:0's host synchronization raises sim:2's error (at its first call: making sim:0 current
  // again, which fail_device's guard could not do, so the thread is still on sim:2), and its queued
  // kernel never ran.
  const std::string message0 = sync_error(s0);
  INFO(message0);
  CHECK_THAT(message0, Catch::Contains("on sim:0 failed") && Catch::Contains("sim:2 failed") &&
                           Catch::Contains("injected"));
  CHECK_FALSE(after_ran.load());
  // Every later call on sim:0 raises it: a kernel, a copy to the host, page-locked memory.
  CHECK_THROWS_WITH(x.sum().item<double>(), Catch::Contains("on sim:0 failed") && Catch::Contains("sim:2 failed"));
  CHECK_THROWS_WITH(x.to(kCPU), Catch::Contains("on sim:0 failed"));
  CHECK_THROWS_WITH(rt.host_malloc(64), Catch::Contains("host_malloc on sim:") && Catch::Contains("sim:2 failed"));
  CHECK_THROWS_WITH(rt.malloc(0, 4096), Catch::Contains("malloc on sim:0 failed"));
  // A device that had failed before keeps its own first error.
  CHECK(*sim::device_error(1) == first_error_of_1);
  // A free in a destructor does not throw.
  CHECK_NOTHROW(x = Tensor());
}
