// Illegal addresses on sim (tensor/sim/sim.h, [Illegal addresses] in sim.cpp): what a GPU faults
// on, sim refuses too, instead of running on memory that happens to be mapped. A kernel naming
// memory of another device (chorus enables no peer access), memory freed before its launch or
// pageable host memory fails its device, sticky, without running; a copy from or into freed memory,
// past the end of a segment, of the wrong kind or between overlapping areas is refused at the call.
// Six sim devices (the BUILD sets CHORUS_SIM_DEVICES): each case that fails a device fails its
// own, and sim:0 stays healthy for the others.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "kernels/dispatch.h"
#include "tensor/error.h"
#include "tensor/ops.h"
#include "tensor/runtime.h"
#include "tensor/sim/sim.h"

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

// Calls rt.free(device, ptr) on a thread of its own and returns that thread once free has counted
// the segment as freed; free then waits for the device's streams, as cudaFree does, so the caller
// joins the thread after releasing what holds them.
std::thread free_while_streams_busy(DeviceRuntime& rt, int device, void* ptr) {
  const size_t before = sim::memory_in_use(device);
  std::thread freer([&rt, device, ptr] { rt.free(device, ptr); });
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (sim::memory_in_use(device) == before && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(1ms);
  }
  CHECK(sim::memory_in_use(device) < before);
  return freer;
}

// Turns sim's driver lock off for a scope. The cases below that launch on a device while another
// thread's free of its memory waits need it off: with it on (the default), the launch waits for the
// free to return ([free holds the driver], tensor/sim/sim.cpp), as behind cuMemFree on a GPU, so the
// window in which a retired but still mapped segment could be named is closed; the rule they check
// still holds for CHORUS_SIM_DRIVER_LOCK=0.
struct DriverLockOff {
  bool previous = sim::driver_lock();
  DriverLockOff() { sim::set_driver_lock(false); }
  ~DriverLockOff() { sim::set_driver_lock(previous); }
};

}  // namespace

TEST_CASE("sim: a kernel naming another device's memory fails its device, as a GPU kernel without peer access faults") {
  REQUIRE(runtime_for(Device::sim(0), "test").device_count() == 6);
  const Device here = Device::sim(1), there = Device::sim(2);
  const DeviceGuard current(here);  // a kernel launches on a stream of the current device, as on CUDA
  Tensor src = full({256}, 3.0, {.device = there});
  Tensor dst = zeros({256}, {.device = here});
  Stream s = current_stream(here);
  s.synchronize();
  REQUIRE_FALSE(sim::device_error(1).has_value());

  // The kernel table's wrappers refuse tensors of two devices before launching anything.
  CHECK_THROWS_WITH(kernels::kernel_table(here, "copy").copy(dst, src),
                    Catch::Contains("a kernel got tensors on sim:1 and sim:2"));
  s.synchronize();
  REQUIRE_FALSE(sim::device_error(1).has_value());

  // A kernel launched with raw pointers, as a hand-written one would be: its source on sim:2.
  std::atomic<bool> ran{false};
  const auto* from = static_cast<const float*>(src.raw_data_ptr());
  auto* to = static_cast<float*>(dst.raw_data_ptr());
  sim::launch_kernel(s.handle(), [&, from, to] { std::memcpy(to, from, 256 * sizeof(float)); ran = true; }, {to, from},
                     "a copy kernel");
  const std::string message = sync_error(s);
  INFO(message);
  CHECK_THAT(message, Catch::Contains("sim: synchronize_stream on sim:1 failed"));
  CHECK_THAT(message, Catch::Contains("a copy kernel on stream") && Catch::Contains("of sim:1 named memory of sim:2"));
  CHECK_THAT(message, Catch::Contains("cudaErrorIllegalAddress"));
  CHECK_FALSE(ran.load());
  REQUIRE(sim::device_error(1).has_value());
  // Sticky, as on a GPU: every later call on sim:1 fails.
  CHECK_THROWS_WITH(dst.to(kCPU), Catch::Contains("on sim:1 failed") && Catch::Contains("named memory of sim:2"));
  CHECK_THROWS_WITH(ones({4}, {.device = here}), Catch::Contains("on sim:1 failed"));
  // The memory's own device is not affected.
  CHECK_FALSE(sim::device_error(2).has_value());
  CHECK(src.sum().item<double>() == 768.0);
  CHECK_FALSE(sim::device_error(0).has_value());
}

TEST_CASE("sim: a kernel naming memory freed before its launch fails its device; one launched before the free runs") {
  DeviceRuntime& rt = runtime_for(Device::sim(0), "test");

  // Launched before the free: legal, and free returns only once it has run, as cudaFree waits for
  // the device (sim_runtime_test checks the wait itself).
  {
    Stream s = current_stream(Device::sim(0));
    auto* seg = static_cast<unsigned char*>(rt.malloc(0, 4096));
    REQUIRE(seg != nullptr);
    std::atomic<bool> ran{false};
    sim::launch_kernel(s.handle(), [&, seg] { std::memset(seg, 1, 4096); ran = true; }, {seg});
    rt.free(0, seg);
    CHECK(ran.load());
    CHECK(sync_error(s).empty());
    CHECK_FALSE(sim::device_error(0).has_value());
  }

  // Launched by another thread after the free was called, while free still waits for the stream
  // (the segment is still mapped): refused, as on a GPU, where the memory is no longer the
  // program's once cudaFree has begun (the driver lock off: DriverLockOff; with it on, the launch
  // would wait for the free, and the free for the held kernel that is released after the launch: a
  // hang, as on a GPU).
  const DriverLockOff lock_off;
  const Device dev = Device::sim(3);
  const DeviceGuard current(dev);
  Stream s = current_stream(dev);
  auto* seg = static_cast<unsigned char*>(rt.malloc(3, 4096));
  REQUIRE(seg != nullptr);
  std::atomic<bool> release{false}, ran{false};
  std::promise<void> busy;
  sim::launch_kernel(s.handle(), [&] {
    busy.set_value();
    while (!release) std::this_thread::sleep_for(1ms);
  }, {});
  busy.get_future().wait();
  std::thread freer = free_while_streams_busy(rt, 3, seg);
  sim::launch_kernel(s.handle(), [&, seg] { std::memset(seg, 1, 4096); ran = true; }, {seg + 64}, "a test kernel");
  release = true;
  freer.join();
  const std::string message = sync_error(s);
  INFO(message);
  CHECK_THAT(message, Catch::Contains("a test kernel on stream") && Catch::Contains("of sim:3 named memory freed before the launch"));
  CHECK_THAT(message, Catch::Contains("cudaErrorIllegalAddress"));
  CHECK_FALSE(ran.load());
  CHECK(sim::device_error(3).has_value());
  CHECK_FALSE(sim::device_error(0).has_value());
}

TEST_CASE("sim: copies are refused at the call from or into freed memory, past a segment's end, of the wrong kind or overlapping; across devices they run") {
  DeviceRuntime& rt = runtime_for(Device::sim(0), "test");
  const StreamHandle s0 = current_stream(Device::sim(0)).handle();
  auto* a = static_cast<unsigned char*>(rt.malloc(0, 8192));
  auto* b = static_cast<unsigned char*>(rt.malloc(2, 8192));
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  const size_t seg = 8192;  // both are whole pages: the segments are exactly this long
  std::vector<unsigned char> in(seg), out(seg, 0);
  for (size_t i = 0; i < seg; ++i) in[i] = static_cast<unsigned char>(i * 7);

  // Legal: host to sim:0, sim:0 to sim:2 (another device), sim:2 back to the host, up to the end.
  rt.memcpy_async(a, in.data(), seg, CopyKind::HostToDevice, s0);
  rt.memcpy_async(b, a, seg, CopyKind::DeviceToDevice, s0);
  rt.memcpy_async(out.data(), b + 4096, 4096, CopyKind::DeviceToHost, s0);
  rt.synchronize_stream(s0);
  CHECK(std::memcmp(out.data(), in.data() + 4096, 4096) == 0);

  // Past the end of the segment: one byte too many, on either side.
  CHECK_THROWS_WITH(rt.memcpy_async(out.data(), a + 4096, 4097, CopyKind::DeviceToHost, s0),
                    Catch::Contains("(device to host) of 4097 bytes: the source") && Catch::Contains("has only 4096 bytes") &&
                        Catch::Contains("cudaErrorInvalidValue"));
  CHECK_THROWS_WITH(rt.memcpy_async(b + 1, in.data(), seg, CopyKind::HostToDevice, s0),
                    Catch::Contains("the destination") && Catch::Contains("has only 8191 bytes"));

  // Overlapping areas of one device (undefined in CUDA's copies); adjacent ones are fine.
  CHECK_THROWS_WITH(rt.memcpy_async(a + 1, a, 16, CopyKind::DeviceToDevice, s0),
                    Catch::Contains("the two areas overlap"));
  rt.memcpy_async(a + 16, a, 16, CopyKind::DeviceToDevice, s0);
  rt.memcpy_async(out.data(), a + 16, 16, CopyKind::DeviceToHost, s0);
  CHECK(std::memcmp(out.data(), in.data(), 16) == 0);
  rt.memcpy_async(a + 16, in.data() + 16, 16, CopyKind::HostToDevice, s0);  // a is as it was

  // The kind must be the memory's: host memory where it says device, device memory where it says host.
  std::vector<unsigned char> host(16);
  CHECK_THROWS_WITH(rt.memcpy_async(host.data(), in.data(), 16, CopyKind::HostToDevice, s0),
                    Catch::Contains("(host to device): the destination") && Catch::Contains("is not sim device memory") &&
                        Catch::Contains("cudaErrorInvalidValue"));
  CHECK_THROWS_WITH(rt.memcpy_async(out.data(), host.data(), 16, CopyKind::DeviceToHost, s0),
                    Catch::Contains("(device to host): the source") && Catch::Contains("is not sim device memory"));
  CHECK_THROWS_WITH(rt.memcpy_async(a, host.data(), 16, CopyKind::DeviceToDevice, s0),
                    Catch::Contains("(device to device): the source") && Catch::Contains("is not sim device memory"));
  CHECK_THROWS_WITH(rt.memcpy_async(a, b, 16, CopyKind::HostToDevice, s0),
                    Catch::Contains("(host to device): the source") && Catch::Contains("is sim:2's device memory") &&
                        Catch::Contains("not host memory"));
  CHECK_THROWS_WITH(rt.memcpy_async(a, out.data(), 16, CopyKind::DeviceToHost, s0),
                    Catch::Contains("(device to host): the destination") && Catch::Contains("is sim:0's device memory"));

  // From and into memory already freed: still mapped while a sim:2 stream holds the free back
  // (cudaFree waits for the device), then unmapped, no segment at all.
  const Stream s2 = current_stream(Device::sim(2));
  std::atomic<bool> release{false};
  {
    const DeviceGuard current(Device::sim(2));
    sim::launch_kernel(s2.handle(), [&] { while (!release) std::this_thread::sleep_for(1ms); }, {});
  }
  std::thread freer = free_while_streams_busy(rt, 2, b);
  CHECK_THROWS_WITH(rt.memcpy_async(out.data(), b, 16, CopyKind::DeviceToHost, s0),
                    Catch::Contains("the source") && Catch::Contains("that free() released") &&
                        Catch::Contains("cudaErrorInvalidValue"));
  CHECK_THROWS_WITH(rt.memcpy_async(b, a, 16, CopyKind::DeviceToDevice, s0), Catch::Contains("the destination") &&
                                                                                 Catch::Contains("that free() released"));
  release = true;
  freer.join();  // free has returned: the streams have passed it and b is unmapped
  CHECK_THROWS_WITH(rt.memcpy_async(out.data(), b, 16, CopyKind::DeviceToHost, s0),
                    Catch::Contains("the source") && Catch::Contains("is not sim device memory") &&
                        Catch::Contains("freed and unmapped") && Catch::Contains("cudaErrorInvalidValue"));
  // Refused at the call, not sticky: the devices go on.
  rt.memcpy_async(out.data(), a, seg, CopyKind::DeviceToHost, s0);
  CHECK(std::memcmp(out.data(), in.data(), seg) == 0);
  CHECK_FALSE(sim::device_error(0).has_value());
  CHECK_FALSE(sim::device_error(2).has_value());
  rt.free(0, a);
}

TEST_CASE("sim: a kernel naming pageable host memory fails its device; page-locked host memory it may read") {
  DeviceRuntime& rt = runtime_for(Device::sim(0), "test");

  // Page-locked (host_malloc): a GPU kernel reads it through its mapping. Legal.
  {
    Stream s = current_stream(Device::sim(0));
    auto* pinned = static_cast<int*>(rt.host_malloc(64 * sizeof(int)));
    REQUIRE(pinned != nullptr);
    std::atomic<bool> ran{false};
    sim::launch_kernel(s.handle(), [&, pinned] { pinned[3] = 7; ran = true; }, {pinned}, "a pinned kernel");
    CHECK(sync_error(s).empty());
    CHECK(ran.load());
    CHECK(pinned[3] == 7);
    rt.host_free(pinned);
    CHECK_FALSE(sim::device_error(0).has_value());
  }

  // Pageable (a std::vector's): refused, sticky.
  const Device dev = Device::sim(4);
  const DeviceGuard current(dev);
  Stream s = current_stream(dev);
  std::vector<int> pageable(64, 0);
  std::atomic<bool> ran{false};
  int* p = pageable.data();
  sim::launch_kernel(s.handle(), [&, p] { p[3] = 7; ran = true; }, {p}, "a pageable kernel");
  const std::string message = sync_error(s);
  INFO(message);
  CHECK_THAT(message, Catch::Contains("a pageable kernel on stream") && Catch::Contains("of sim:4 named pageable host memory"));
  CHECK_THAT(message, Catch::Contains("cudaErrorIllegalAddress"));
  CHECK_FALSE(ran.load());
  CHECK(pageable[3] == 0);
  CHECK(sim::device_error(4).has_value());
  CHECK_FALSE(sim::device_error(0).has_value());
}

TEST_CASE("sim: an op on a from_blob tensor over device memory freed under it fails its device, naming the op's kernel") {
  const Device dev = Device::sim(5);
  const DeviceGuard current(dev);
  DeviceRuntime& rt = runtime_for(dev, "test");
  void* seg = rt.malloc(5, 1024 * sizeof(float));
  REQUIRE(seg != nullptr);
  Tensor t = from_blob(seg, {1024}, {.device = dev});
  t.fill_(1.0);  // legal while the memory is live
  Stream s = current_stream(dev);
  CHECK(sync_error(s).empty());
  // The user's memory goes (the tensor does not own it; another thread frees it) while earlier work
  // still holds the stream, so the segment is freed but not yet unmapped when the op launches
  // (the driver lock off: DriverLockOff).
  const DriverLockOff lock_off;
  std::atomic<bool> release{false};
  sim::launch_kernel(s.handle(), [&] { while (!release) std::this_thread::sleep_for(1ms); }, {});
  std::thread freer = free_while_streams_busy(rt, 5, seg);
  t.fill_(2.0);
  release = true;
  freer.join();
  const std::string message = sync_error(s);
  INFO(message);
  CHECK_THAT(message, Catch::Contains("the kernel fill on stream") && Catch::Contains("of sim:5 named memory freed before the launch"));
  CHECK(sim::device_error(5).has_value());
  CHECK_FALSE(sim::device_error(0).has_value());
}

// [A copy between overlapping areas] (kernels/sim/sim_kernels.cpp): the kernel copy between two
// contiguous views of one dtype and size is one cudaMemcpyAsync on CUDA, undefined when the areas
// overlap, so sim refuses it at the launch (not sticky); copy_ between overlapping views goes
// through a temporary and is right; a view copied onto itself copies nothing (as PyTorch's copy_ of
// the same tensor) and leaves the values.
TEST_CASE("sim: the kernel copy between overlapping areas is refused, as one cudaMemcpyAsync between them is undefined; copy_ gets them right") {
  const Device dev = Device::sim(0);
  const DeviceGuard current(dev);
  Tensor buf = arange(64, TensorOptions{.dtype = kFloat32}).to(dev);
  Tensor head = buf.narrow(0, 0, 48), tail = buf.narrow(0, 16, 48);
  CHECK_THROWS_WITH(kernels::kernel_table(dev, "copy").copy(tail, head),
                    Catch::Contains("the kernel copy on sim:0") && Catch::Contains("overlap") &&
                        Catch::Contains("cudaMemcpyAsync"));
  CHECK_FALSE(sim::device_error(0).has_value());  // refused at the call: the device goes on
  std::vector<float> expected(64);
  for (int i = 0; i < 64; ++i) expected[i] = static_cast<float>(i < 16 ? i : i - 16);
  tail.copy_(head);  // through a temporary
  Tensor host = buf.to(kCPU);
  CHECK(std::vector<float>(host.data_ptr<float>(), host.data_ptr<float>() + 64) == expected);

  // The same view: no kernel runs, the values stay, the version moves.
  synchronize(dev);  // every stream of the device (the clone's allocation queued barrier waits)
  const uint64_t tasks_before = sim::tasks_run();
  const auto version = buf.version();
  buf.copy_(buf);
  synchronize(dev);
  CHECK(sim::tasks_run() == tasks_before);
  CHECK(buf.version() == version + 1);
  host = buf.to(kCPU);
  CHECK(std::vector<float>(host.data_ptr<float>(), host.data_ptr<float>() + 64) == expected);
}
