// The sim device runtime (tensor/sim/): stream order, cross-stream event waits with CUDA's
// generation semantics, queries, timing, the PROT_NONE guard on device memory, and ordering under
// delay injection.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/dispatch.h"
#include "tensor/error.h"
#include "tensor/ops.h"
#include "tensor/runtime.h"
#include "tensor/sim/sim.h"
#include "tensor/test_faults.h"
#include "tests/tensor/vm_flags.h"

using namespace chorus;
using namespace std::chrono_literals;

namespace {

DeviceRuntime& sim_runtime() { return runtime_for(Device::sim(0), "sim_runtime_test"); }

// Turns delay injection on for a scope.
struct DelayScope {
  explicit DelayScope(uint32_t us) : previous(sim::delay_us()) { sim::set_delay_us(us); }
  ~DelayScope() { sim::set_delay_us(previous); }
  uint32_t previous;
};

// Streams made in its scope get k hardware queues per device ([Shared hardware queues], sim.cpp;
// 0: a queue of their own each).
struct ConnectionsScope {
  explicit ConnectionsScope(int k) { sim::set_connections(k); }
  ~ConnectionsScope() { sim::set_connections(sim::kDefaultConnections); }
};

// Turns sim's driver lock on for a scope (it is on by default; CHORUS_SIM_DRIVER_LOCK=0 turns it off).
struct DriverLockOn {
  bool previous = sim::driver_lock();
  DriverLockOn() { sim::set_driver_lock(true); }
  ~DriverLockOn() { sim::set_driver_lock(previous); }
};

// Waits (at most 20 s) until `condition` holds; whether it does.
bool eventually(const std::function<bool()>& condition) {
  const auto patience = std::chrono::steady_clock::now() + 20s;
  while (!condition() && std::chrono::steady_clock::now() < patience) std::this_thread::sleep_for(1ms);
  return condition();
}

// Reads one byte at `p` in a child process; true when the child died of SIGSEGV.
bool host_read_crashes(const unsigned char* p) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    std::signal(SIGSEGV, SIG_DFL);  // no sanitizer report: die of the signal itself
    volatile unsigned char x = *reinterpret_cast<const volatile unsigned char*>(p);
    (void)x;
    ::_exit(0);  // reached only if the read did not fault
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV;
}

// A kernel on `stream` that waits until the host sets `gate`, then sets `flag` (the held work of
// the ordering tests).
void launch_gated(StreamHandle stream, const std::atomic<int>& gate, std::atomic<int>& flag) {
  sim::launch_kernel(stream, [&gate, &flag] {
    while (gate.load() == 0) std::this_thread::sleep_for(1ms);
    flag = 1;
  }, {});
}

// Whether `call`, made on a thread of its own with `device` current, returned within `patience`
// while a kernel queued before it on `held` was held (the kernel is released and `held`
// synchronized before this returns).
bool returned_while_held(const Stream& held, const std::function<void()>& call, std::chrono::milliseconds patience) {
  std::atomic<bool> release{false}, returned{false};
  std::promise<void> busy;
  sim::launch_kernel(held.handle(), [&] {
    busy.set_value();
    while (!release) std::this_thread::sleep_for(1ms);
  }, {});
  busy.get_future().wait();
  std::thread caller([&] {
    const DeviceGuard on_thread(held.device());
    call();
    returned = true;
  });
  const auto until = std::chrono::steady_clock::now() + patience;
  while (!returned && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  const bool early = returned.load();
  release = true;
  caller.join();
  held.synchronize();
  return early;
}

// free and host_free ([host_free waits]): each call `make_free()` returns (after allocating what it
// frees) must not return while a task queued before it on a stream of sim:1 (one that never used
// the memory) is held, and with `rule` removed it must return during the hold.
void check_free_waits(fault::Point rule, const std::function<std::function<void()>()>& make_free) {
  const Device dev = Device::sim(1);
  const DeviceGuard current(dev);  // a kernel launches on a stream of the current device
  Stream other = stream_from_pool(dev);
  CHECK_FALSE(returned_while_held(other, make_free(), 300ms));
  {
    fault::RemovedScope at_once(rule);
    CHECK(returned_while_held(other, make_free(), 20s));
  }
  CHECK_FALSE(returned_while_held(other, make_free(), 300ms));
}

}  // namespace

TEST_CASE("sim: tasks on one stream run in submission order, one at a time") {
  Stream s = stream_from_pool(Device::sim(0));
  std::vector<int> order;  // written only by s's tasks: they never overlap
  std::atomic<int> running{0};
  std::atomic<int> max_running{0};
  const uint64_t tasks_before = sim::tasks_run();
  for (int i = 0; i < 200; ++i) {
    sim::launch_kernel(
        s.handle(),
        [&, i] {
          int now = running.fetch_add(1) + 1;
          int seen = max_running.load();
          while (now > seen && !max_running.compare_exchange_weak(seen, now)) {
          }
          if (i % 50 == 0) std::this_thread::sleep_for(1ms);  // a slow task must not be overtaken
          order.push_back(i);
          running.fetch_sub(1);
        },
        {});
  }
  s.synchronize();
  REQUIRE(order.size() == 200);
  for (int i = 0; i < 200; ++i) REQUIRE(order[i] == i);
  CHECK(max_running.load() == 1);
  CHECK(sim::tasks_run() - tasks_before >= 200);
}

TEST_CASE("sim: what a task captured is destroyed before synchronize returns") {
  // A tensor kept alive by a task must be freed once the host has synchronized the stream.
  struct SlowToDestroy {
    explicit SlowToDestroy(std::atomic<bool>* flag) : destroyed(flag) {}
    std::atomic<bool>* destroyed;
    ~SlowToDestroy() {
      std::this_thread::sleep_for(50ms);
      *destroyed = true;
    }
  };
  std::atomic<bool> destroyed{false};
  Stream s = stream_from_pool(Device::sim(0));
  {
    auto held = std::make_shared<SlowToDestroy>(&destroyed);
    sim::launch_kernel(s.handle(), [held] {}, {});
  }
  s.synchronize();
  CHECK(destroyed.load());
}

TEST_CASE("sim: streams run concurrently") {
  Stream a = stream_from_pool(Device::sim(0));
  Stream b = stream_from_pool(Device::sim(0));
  REQUIRE(a != b);
  // a's task waits for b's: with one thread for both (or a's queue blocking b's) this never ends.
  std::atomic<bool> b_ran{false};
  std::atomic<bool> a_saw_b{false};
  sim::launch_kernel(
      a.handle(),
      [&] {
        for (int i = 0; i < 2000 && !b_ran.load(); ++i) std::this_thread::sleep_for(1ms);
        a_saw_b = b_ran.load();
      },
      {});
  sim::launch_kernel(b.handle(), [&] { b_ran = true; }, {});
  a.synchronize();
  b.synchronize();
  CHECK(a_saw_b.load());
}

TEST_CASE("sim: a stream waiting on an event runs after the work the event captured") {
  Stream a = stream_from_pool(Device::sim(0));
  Stream b = stream_from_pool(Device::sim(0));
  REQUIRE(a != b);

  SECTION("with the wait, b sees a's write") {
    std::atomic<int> flag{0};
    std::atomic<int> seen{-1};
    sim::launch_kernel(a.handle(), [&] { std::this_thread::sleep_for(100ms); flag = 1; }, {});
    Event e;
    e.record(a);
    b.wait(e);
    sim::launch_kernel(b.handle(), [&] { seen = flag.load(); }, {});
    b.synchronize();
    CHECK(seen.load() == 1);
    a.synchronize();
  }
  SECTION("without it, b runs first (so the section above can fail)") {
    std::atomic<int> flag{0};
    std::atomic<int> seen{-1};
    sim::launch_kernel(a.handle(), [&] { std::this_thread::sleep_for(300ms); flag = 1; }, {});
    sim::launch_kernel(b.handle(), [&] { seen = flag.load(); }, {});
    b.synchronize();
    CHECK(seen.load() == 0);
    a.synchronize();
  }
}

TEST_CASE("sim: a wait captures the event's generation at the call; a later record does not move it") {
  Stream a = stream_from_pool(Device::sim(0));
  Stream b = stream_from_pool(Device::sim(0));
  std::atomic<int> first{0}, second{0};
  std::atomic<int> saw_first{-1}, saw_second{-1};
  Event e;
  sim::launch_kernel(a.handle(), [&] { std::this_thread::sleep_for(50ms); first = 1; }, {});
  e.record(a);  // generation 1: after `first`
  b.wait(e);    // waits for generation 1 only
  sim::launch_kernel(a.handle(), [&] { std::this_thread::sleep_for(500ms); second = 1; }, {});
  e.record(a);  // generation 2: after `second`; must not delay b
  sim::launch_kernel(b.handle(), [&] { saw_first = first.load(); saw_second = second.load(); }, {});
  b.synchronize();
  CHECK(saw_first.load() == 1);   // the wait did wait
  CHECK(saw_second.load() == 0);  // but only for what was recorded before it (OpenReg waits for this)
  CHECK_FALSE(e.query());         // generation 2 still pending
  a.synchronize();
  CHECK(e.query());
}

TEST_CASE("sim: a wait on one event recorded on two streams waits for the record it captured, not the latest") {
  // CUDA: cudaStreamWaitEvent captures the event's latest record at the call. Here generation 1 is
  // on stream a (held at a gate), generation 2 on stream b (free). c's wait captured generation 1, so
  // c must not run before a's gate opens, though generation 2 completes at once (a running maximum
  // of completed generations, as sim had, let c run early). The three streams need hardware queues of
  // their own: on a shared one, c's wait would hold up b's record behind a's gate, as on a GPU.
  const ConnectionsScope own_queues(0);
  DeviceRuntime& rt = sim_runtime();
  const Device dev = Device::sim(0);
  const Stream a(dev, rt.create_stream(0, false)), b(dev, rt.create_stream(0, false)), c(dev, rt.create_stream(0, false));
  std::atomic<int> gate{0}, done_a{0}, saw{-1};
  Event e;
  sim::launch_kernel(a.handle(), [&] { while (gate.load() == 0) std::this_thread::sleep_for(1ms); done_a = 1; }, {});
  e.record(a);  // generation 1
  c.wait(e);    // captures generation 1
  e.record(b);  // generation 2, completes at once
  sim::launch_kernel(c.handle(), [&] { saw = done_a.load(); }, {});
  b.synchronize();
  CHECK(e.query());  // the latest record (generation 2) has completed
  // c is held by generation 1: its task has not run while a is at the gate. (A bounded look, not a
  // synchronization: if c were wrongly free, 200 ms is far more than it needs to run its task.)
  std::this_thread::sleep_for(200ms);
  CHECK(saw.load() == -1);
  CHECK_FALSE(c.query());
  gate = 1;
  c.synchronize();
  CHECK(saw.load() == 1);
  a.synchronize();
}

TEST_CASE("sim: query reports pending and completed work; a never-recorded event is complete") {
  Stream s = stream_from_pool(Device::sim(0));
  Event never;
  CHECK(never.query());
  std::atomic<bool> release{false};
  sim::launch_kernel(s.handle(), [&] { while (!release.load()) std::this_thread::sleep_for(1ms); }, {});
  Event e;
  e.record(s);
  CHECK_FALSE(s.query());
  CHECK_FALSE(e.query());
  release = true;
  const uint64_t syncs = host_sync_count();
  e.synchronize();
  CHECK(host_sync_count() == syncs + 1);
  CHECK(e.query());
  s.synchronize();
  CHECK(s.query());
}

TEST_CASE("sim: elapsed_time between timing events measures the work between them") {
  Stream s = stream_from_pool(Device::sim(0));
  Event start(/*enable_timing=*/true), end(/*enable_timing=*/true);
  start.record(s);
  sim::launch_kernel(s.handle(), [] { std::this_thread::sleep_for(30ms); }, {});
  end.record(s);
  end.synchronize();
  const double ms = start.elapsed_time(end);
  CHECK(ms >= 29.0);
  CHECK(ms < 5000.0);
  CHECK(start.elapsed_time(start) == 0.0);
  Event untimed;
  untimed.record(s);
  untimed.synchronize();
  CHECK_THROWS_AS(start.elapsed_time(untimed), Error);
}

// The runtime itself, below Event's own checks (code in kernels/ and distributed/ calls it directly):
// what cudaEventRecord and cudaEventElapsedTime refuse, sim refuses.
TEST_CASE("sim: the runtime refuses what CUDA's event calls refuse: a record on another device's stream, elapsed time of untimed, unrecorded or two devices' events") {
  DeviceRuntime& rt = sim_runtime();
  const StreamHandle s0 = rt.default_stream(0);
  const StreamHandle s1 = rt.default_stream(1);
  EventHandle timed = rt.create_event(0, /*enable_timing=*/true);
  EventHandle timed_end = rt.create_event(0, /*enable_timing=*/true);
  EventHandle untimed = rt.create_event(0, /*enable_timing=*/false);
  EventHandle never = rt.create_event(0, /*enable_timing=*/true);

  {
    const DeviceGuard current(Device::sim(1));  // s1, a default stream, names sim:1's only there
    CHECK_THROWS_WITH(rt.record_event(timed, s1), Catch::Contains("created on sim:0 and the stream is on sim:1") &&
                                                      Catch::Contains("cudaErrorInvalidResourceHandle"));
  }
  rt.record_event(timed, s0);
  rt.record_event(untimed, s0);
  sim::launch_kernel(s0, [] { std::this_thread::sleep_for(2ms); }, {});
  rt.record_event(timed_end, s0);
  rt.synchronize_stream(s0);
  // The one legal pair first: it is what the refusals below differ from.
  CHECK(rt.elapsed_ms(timed, timed_end) >= 1.0);
  CHECK(rt.elapsed_ms(timed, timed) == 0.0);
  CHECK_THROWS_WITH(rt.elapsed_ms(timed, untimed), Catch::Contains("end event was created without timing") &&
                                                       Catch::Contains("cudaErrorInvalidResourceHandle"));
  CHECK_THROWS_WITH(rt.elapsed_ms(untimed, timed), Catch::Contains("start event was created without timing"));
  CHECK_THROWS_WITH(rt.elapsed_ms(untimed, untimed), Catch::Contains("created without timing"));
  CHECK_THROWS_WITH(rt.elapsed_ms(timed, never), Catch::Contains("end event was never recorded") &&
                                                     Catch::Contains("cudaErrorInvalidResourceHandle"));
  CHECK_THROWS_WITH(rt.elapsed_ms(never, never), Catch::Contains("start event was never recorded"));
  EventHandle other = rt.create_event(1, /*enable_timing=*/true);
  {
    const DeviceGuard current(Device::sim(1));
    rt.record_event(other, s1);
    rt.synchronize_stream(s1);
  }
  CHECK_THROWS_WITH(rt.elapsed_ms(timed, other), Catch::Contains("start event is on sim:0 and the end event on sim:1") &&
                                                     Catch::Contains("cudaErrorInvalidResourceHandle"));
  rt.destroy_event(other);
  // A refused record changed nothing: the event still measures from its one record on sim:0.
  CHECK(rt.elapsed_ms(timed, timed_end) >= 1.0);
  for (EventHandle e : {timed, timed_end, untimed, never}) rt.destroy_event(e);
}

TEST_CASE("sim: device memory is readable by a task that names it, and a host read crashes") {
  REQUIRE(sim::protection_enabled());
  DeviceRuntime& rt = sim_runtime();
  Stream s = stream_from_pool(Device::sim(0));
  const size_t n = 4096;
  auto* dev = static_cast<unsigned char*>(rt.malloc(0, n));
  REQUIRE(dev != nullptr);

  // Through the stream: H2D, a kernel-like task, D2H.
  std::vector<unsigned char> in(n, 7), out(n, 0);
  rt.memcpy_async(dev, in.data(), n, CopyKind::HostToDevice, s.handle());
  sim::launch_kernel(s.handle(), [=] { for (size_t i = 0; i < n; ++i) dev[i] = static_cast<unsigned char>(dev[i] + i % 3); }, {dev});
  rt.memcpy_async(out.data(), dev, n, CopyKind::DeviceToHost, s.handle());
  s.synchronize();
  for (size_t i = 0; i < n; ++i) REQUIRE(out[i] == 7 + i % 3);

  // Directly from the host: SIGSEGV, as on a GPU. In a child, so the test survives it.
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    std::signal(SIGSEGV, SIG_DFL);  // no sanitizer report: die of the signal itself
    volatile unsigned char x = *static_cast<volatile unsigned char*>(dev);
    (void)x;
    ::_exit(0);  // reached only if the read did not fault
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK(WIFSIGNALED(status));
  if (WIFSIGNALED(status)) CHECK(WTERMSIG(status) == SIGSEGV);
  rt.free(0, dev);
}

TEST_CASE("sim: a segment of 2 MiB or more is mapped for huge pages, and the guard still holds on all of it") {
  REQUIRE(sim::protection_enabled());
  DeviceRuntime& rt = sim_runtime();
  Stream s = stream_from_pool(Device::sim(0));
  // Two whole huge pages and a tail of small ones, as an allocator segment of 4 MiB + 4 KiB would be.
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t n = 2 * kHuge + 4096;
  auto* dev = static_cast<unsigned char*>(rt.malloc(0, n));
  REQUIRE(dev != nullptr);
  CHECK(reinterpret_cast<uintptr_t>(dev) % kHuge == 0);  // [Huge segments]: on a 2 MiB boundary

  // A task writes all of it (so its pages are present, huge ones where the kernel gave them), a
  // second task reads it back through a copy: the data survive the close and reopen.
  sim::launch_kernel(s.handle(), [=] { for (size_t i = 0; i < n; ++i) dev[i] = static_cast<unsigned char>(i * 7 + i / 4096); }, {dev});
  std::vector<unsigned char> out(n, 0);
  rt.memcpy_async(out.data(), dev, n, CopyKind::DeviceToHost, s.handle());
  s.synchronize();
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) wrong += out[i] != static_cast<unsigned char>(i * 7 + i / 4096);
  CHECK(wrong == 0);

  // Closed again: a host read faults at the start, inside the second huge page, and in the tail.
  CHECK(host_read_crashes(dev));
  CHECK(host_read_crashes(dev + kHuge + 12345));
  CHECK(host_read_crashes(dev + n - 1));

  // The mapping carries the huge-page advice ("hg" in VmFlags) where the kernel has THP at all.
  if (std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled").good()) {
    const std::string flags = chorus::testing::vm_flags_of(dev);
    INFO(flags);
    CHECK(flags.find(" hg") != std::string::npos);
  } else {
    std::printf("CHORUS-SKIP: this kernel has no transparent huge pages; the huge-page advice was not checked\n");
  }
  rt.free(0, dev);
}

TEST_CASE("sim: with delay injection, many tasks on many streams keep stream order and event order") {
  DelayScope delay(200);
  REQUIRE(sim::delay_us() == 200);
  DeviceRuntime& rt = sim_runtime();
  Stream a = stream_from_pool(Device::sim(0));
  Stream b = stream_from_pool(Device::sim(0));
  const size_t n = 64;
  auto* buf = static_cast<int*>(rt.malloc(0, n * sizeof(int)));
  REQUIRE(buf != nullptr);
  std::vector<int> zero(n, 0);
  rt.memcpy_async(buf, zero.data(), n * sizeof(int), CopyKind::HostToDevice, a.handle());
  // a increments every element 300 times, each increment checking it follows the previous one;
  // b, ordered after a by an event, reads what a left.
  std::atomic<int> out_of_order{0};
  const int steps = 300;
  for (int k = 0; k < steps; ++k) {
    sim::launch_kernel(
        a.handle(),
        [=, &out_of_order] {
          for (size_t i = 0; i < n; ++i) {
            if (buf[i] != k) out_of_order.fetch_add(1);
            buf[i] = k + 1;
          }
        },
        {buf});
  }
  Event done;
  done.record(a);
  b.wait(done);
  std::vector<int> seen(n, -1);
  // (to pageable memory: synchronous, as CUDA's, so the wait is in the copy itself)
  const auto t0 = std::chrono::steady_clock::now();
  rt.memcpy_async(seen.data(), buf, n * sizeof(int), CopyKind::DeviceToHost, b.handle());
  b.synchronize();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  CHECK(out_of_order.load() == 0);
  for (size_t i = 0; i < n; ++i) REQUIRE(seen[i] == steps);
  // 300 tasks with a random 0..200 us delay each take about 30 ms: the delay was really on.
  CHECK(ms > 5.0);
  a.synchronize();
  rt.free(0, buf);
}

TEST_CASE("sim: host functions of different streams run one at a time, as CUDA may run them; removed, they overlap") {
  // [One host-function thread] (tensor/sim/sim.cpp). Host function A (stream a) starts, then B is
  // launched on stream b, and A waits for B to start. On one host-function thread B cannot start
  // while A runs, whatever the timing, so A's wait ends by its bound and sees no B; with the rule
  // removed B runs on b's own thread and A sees it start (a wake-up, well within the bound). The two
  // streams have hardware queues of their own: on a shared one, A (a wait for the queue) would hold
  // B up with the rule removed too ([Shared hardware queues]).
  DeviceRuntime& rt = sim_runtime();
  const ConnectionsScope own_queues(0);
  const Stream a(Device::sim(0), rt.create_stream(0, false)), b(Device::sim(0), rt.create_stream(0, false));
  auto b_started_during_a = [&](std::chrono::milliseconds bound) {
    std::mutex m;
    std::condition_variable cv;
    bool a_started = false, b_started = false, seen = false;
    rt.launch_host_task(
        a.handle(),
        [&] {
          std::unique_lock<std::mutex> lock(m);
          a_started = true;
          cv.notify_all();
          seen = cv.wait_for(lock, bound, [&] { return b_started; });
        },
        {});
    {
      std::unique_lock<std::mutex> lock(m);
      cv.wait(lock, [&] { return a_started; });  // B is launched only once A runs
    }
    rt.launch_host_task(
        b.handle(),
        [&] {
          std::lock_guard<std::mutex> lock(m);
          b_started = true;
          cv.notify_all();
        },
        {});
    a.synchronize();
    b.synchronize();
    std::lock_guard<std::mutex> lock(m);
    REQUIRE(b_started);  // both ran
    return seen;
  };
  CHECK_FALSE(b_started_during_a(300ms));
  {
    fault::RemovedScope per_stream(fault::Point::kHostFunctionThread);
    CHECK(b_started_during_a(20s));
  }
  CHECK_FALSE(b_started_during_a(300ms));
}

// [The default stream is the current device's] (tensor/sim/sim.cpp): on CUDA every device's default
// stream is the null stream, which names the current device's, so a call given sim:1's default stream
// from a thread where sim:0 is current is refused (a GPU would order the copy or wait on cuda:0's
// stream, or refuse the event record); so is a kernel on any stream of a device that is not current,
// as CUDA refuses it. A copy on another device's own stream is legal there, and here. Stream, Event
// and the copies between devices make the stream's device current for their calls ([A stream's
// device is current], tensor/runtime.h); the negative control removes that and sim refuses them.
TEST_CASE("sim: a call on another device's default stream, or a kernel on another device's stream, is refused as on CUDA; Stream, Event and copies make the stream's device current (removed, refused)") {
  DeviceRuntime& rt = sim_runtime();
  REQUIRE(current_device_index(DeviceType::Sim) == 0);
  const Device zero = Device::sim(0), one = Device::sim(1);
  const StreamHandle d1 = rt.default_stream(1);
  const Stream pool1 = stream_from_pool(one);
  EventHandle e1 = rt.create_event(1, /*enable_timing=*/false);
  void* seg = rt.malloc(1, 256);
  REQUIRE(seg != nullptr);
  std::vector<float> host(64, 1.0f), back(64, 0.0f);

  // The raw runtime with sim:0 current.
  // (A matcher, not a combination of two: Catch 2's && keeps references to its operands.)
  auto names = [](const char* call) {
    return Catch::Contains(std::string(call) + " on sim:1's default stream from a thread whose current device is sim:0: "
                                               "on CUDA every device's default stream is the null stream");
  };
  CHECK_THROWS_WITH(rt.record_event(e1, d1), names("record_event"));
  CHECK_THROWS_WITH(rt.stream_wait_event(d1, e1), names("stream_wait_event"));
  CHECK_THROWS_WITH(rt.memcpy_async(seg, host.data(), 256, CopyKind::HostToDevice, d1), names("memcpy_async"));
  CHECK_THROWS_WITH(rt.launch_host_task(d1, [] {}, {}), names("launch_host_task"));
  CHECK_THROWS_WITH(rt.synchronize_stream(d1), names("synchronize_stream"));
  CHECK_THROWS_WITH(rt.query_stream(d1), names("query_stream"));
  CHECK_THROWS_WITH(sim::launch_kernel(pool1.handle(), [] {}, {}, "a test kernel"),
                    Catch::Contains("a test kernel on a stream of sim:1 from a thread whose current device is sim:0") &&
                        Catch::Contains("not current"));
  rt.memcpy_async(seg, host.data(), 256, CopyKind::HostToDevice, pool1.handle());  // legal: not the null stream
  // With sim:1 current, each is accepted.
  {
    const DeviceGuard current(one);
    rt.record_event(e1, d1);
    rt.stream_wait_event(d1, e1);
    rt.memcpy_async(seg, host.data(), 256, CopyKind::HostToDevice, d1);
    sim::launch_kernel(pool1.handle(), [] {}, {}, "a test kernel");
    rt.synchronize_stream(d1);
    CHECK(rt.query_stream(d1));
  }
  CHECK(current_device_index(DeviceType::Sim) == 0);
  pool1.synchronize();  // Stream makes sim:1 current for the call
  rt.free(1, seg);
  rt.destroy_event(e1);

  // The shared layer, sim:0 current: an event on sim:1's default stream, a wait, copies from the
  // host, from sim:0 and back to the host, all ordered on sim:1's default stream.
  {
    Event ev;
    ev.record(default_stream(one));
    default_stream(one).wait(ev);
    Tensor up = full({64}, 3.0).to(one);
    Tensor across = full({64}, 5.0, {.device = zero}).to(one);
    const Tensor sum = (up + across).to(kCPU);
    CHECK(sum.sum().item<double>() == 64 * 8.0);
    default_stream(one).synchronize();
    CHECK(default_stream(one).query());
    CHECK(current_device_index(DeviceType::Sim) == 0);
  }
  // The negative control: without the guard each of them is refused on sim (on a GPU they would
  // have gone to cuda:0's null stream).
  {
    fault::RemovedScope unguarded(fault::Point::kStreamDeviceGuard);
    Event ev;
    CHECK_THROWS_WITH(ev.record(default_stream(one)), names("record_event"));
    CHECK_THROWS_WITH(default_stream(one).synchronize(), names("synchronize_stream"));
    CHECK_THROWS_WITH(default_stream(one).query(), names("query_stream"));
    CHECK_THROWS_WITH(full({64}, 3.0).to(one), names("memcpy_async"));
    CHECK_THROWS_WITH(full({64}, 5.0, {.device = zero}).to(one), names("stream_wait_event"));
  }
  synchronize(one);
}

// As cudaFree, which synchronizes the device: the host waits in free until every stream of the
// device has run what was queued before it, on any stream (here one that never used the segment).
// Removed (sim until 2026-12-01), free returned at once and the streams unmapped the segment later,
// so a host-side deadlock through cudaFree's wait could not show on sim.
TEST_CASE("sim: free waits until every stream of its device has run what was queued before it, as cudaFree; removed, it does not") {
  DeviceRuntime& rt = sim_runtime();
  check_free_waits(fault::Point::kSimFreeWaits, [&] {
    void* seg = rt.malloc(1, 4096);
    REQUIRE(seg != nullptr);
    return std::function<void()>([&rt, seg] { rt.free(1, seg); });
  });
}

// [host_free waits] (tensor/sim/sim.cpp): cudaFreeHost synchronizes the device, so the host waits
// in host_free until every stream has run what was queued before it, on any device (here a stream
// of sim:1 that never used the block, with sim:0 current). Removed (sim until 2026-12-04), host_free
// returned at once.
TEST_CASE("sim: host_free waits until every stream has run what was queued before it, as cudaFreeHost; removed, it does not") {
  DeviceRuntime& rt = sim_runtime();
  check_free_waits(fault::Point::kSimHostFreeWaits, [&] {
    void* block = rt.host_malloc(4096);
    REQUIRE(block != nullptr);
    // Called with sim:0 current while a stream of sim:1 is held: the wait reaches another device's
    // streams. (A host_free that synchronized only the current device's streams waits too, behind
    // the barrier that orders sim:0's streams after sim:1's held task: checked by hand, 2026-12-04.)
    return std::function<void()>([&rt, block] {
      const DeviceGuard zero(Device::sim(0));
      rt.host_free(block);
    });
  });
}

// [A pageable copy waits for its stream] (tensor/sim/sim.cpp): CUDA "may synchronize with the
// stream" to stage a copy from pageable host memory, so the host waits in the call until the stream
// has run what was queued before it; a copy from page-locked memory (host_malloc) returns at once.
// Removed (sim until 2026-12-02), the pageable copy returned at once too, so a host that the stream
// waits for could issue one and pass on sim, and hang on a GPU.
TEST_CASE("sim: a copy from pageable host memory waits for its stream's earlier work, one from pinned memory does not; removed, neither waits") {
  DeviceRuntime& rt = sim_runtime();
  const Device dev = Device::sim(1);
  const DeviceGuard current(dev);  // a kernel launches on a stream of the current device
  Stream s = stream_from_pool(dev);
  void* dst = rt.malloc(1, 256);
  REQUIRE(dst != nullptr);
  std::vector<float> pageable(64, 2.0f);
  auto* pinned = static_cast<float*>(rt.host_malloc(256));
  std::fill(pinned, pinned + 64, 3.0f);
  // Whether the copy returned within `patience` while a kernel queued before it on `s` was held.
  auto copy_returned_while_held = [&](const void* src, std::chrono::milliseconds patience) {
    return returned_while_held(s, [&] { rt.memcpy_async(dst, src, 256, CopyKind::HostToDevice, s.handle()); }, patience);
  };
  CHECK_FALSE(copy_returned_while_held(pageable.data(), 300ms));
  CHECK(copy_returned_while_held(pinned, 20s));
  std::vector<float> back(64);
  rt.memcpy_async(back.data(), dst, 256, CopyKind::DeviceToHost, s.handle());
  CHECK(back == std::vector<float>(64, 3.0f));
  {
    fault::RemovedScope at_once(fault::Point::kSimPageableCopyWaits);
    CHECK(copy_returned_while_held(pageable.data(), 20s));
  }
  CHECK_FALSE(copy_returned_while_held(pageable.data(), 300ms));
  rt.memcpy_async(back.data(), dst, 256, CopyKind::DeviceToHost, s.handle());
  CHECK(back == std::vector<float>(64, 2.0f));  // staged: the values of the call's time
  rt.host_free(pinned);
  rt.free(1, dst);
}

// The same rule, across streams: the pageable copy waits for itself, so one on an idle stream that
// shares a hardware queue with another stream's wait does not return until the wait ends (as a
// synchronous copy behind a GPU's shared queue); on a queue of its own it returns. Before
// 2026-12-04 sim waited only for the copy's own stream's earlier work, so it returned at once.
TEST_CASE("sim: a copy from pageable host memory waits for the copy itself, behind another stream's wait on its queue") {
  DeviceRuntime& rt = sim_runtime();
  const Device dev = Device::sim(1);
  const DeviceGuard current(dev);
  auto* word = static_cast<uint32_t*>(rt.host_malloc(64));
  void* dst = rt.malloc(1, 256);
  REQUIRE(dst != nullptr);
  // Streams a and b made with k queues; a waits for the word; another thread copies 64 floats of
  // `value` from pageable memory to dst on b. Whether that call returned within `patience` with the
  // word still 0; then the word is stored, and the copy must have landed.
  auto copy_returned_during_wait = [&](int k, float value, std::chrono::milliseconds patience) {
    const ConnectionsScope scope(k);
    const Stream a(dev, rt.create_stream(1, false)), b(dev, rt.create_stream(1, false));
    std::atomic_ref<uint32_t>(*word).store(0);
    rt.stream_wait_value(a.handle(), word, 1);
    const std::vector<float> pageable(64, value);
    std::atomic<bool> returned{false};
    std::thread caller([&] {
      const DeviceGuard on_thread(dev);
      rt.memcpy_async(dst, pageable.data(), 256, CopyKind::HostToDevice, b.handle());
      returned = true;
    });
    const auto until = std::chrono::steady_clock::now() + patience;
    while (!returned && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
    const bool early = returned.load();
    std::atomic_ref<uint32_t>(*word).store(1, std::memory_order_release);
    caller.join();
    a.synchronize();
    b.synchronize();
    std::vector<float> back(64);
    rt.memcpy_async(back.data(), dst, 256, CopyKind::DeviceToHost, b.handle());
    CHECK(back == std::vector<float>(64, value));
    return early;
  };
  CHECK_FALSE(copy_returned_during_wait(1, 4.0f, 300ms));  // one queue: held behind a's wait
  CHECK(copy_returned_during_wait(2, 5.0f, 20s));          // a queue of its own
  {
    fault::RemovedScope at_once(fault::Point::kSimPageableCopyWaits);
    CHECK(copy_returned_during_wait(1, 6.0f, 20s));
  }
  rt.free(1, dst);
  rt.host_free(word);
}

// [A copy from page-locked memory waits for it] (autograd/ops/view.cpp): a copy from page-locked
// host memory is not staged, so to() and copy_ wait for the stream before returning, as PyTorch's
// blocking copy does; the caller may write the memory at once. Removed (chorus until 2026-12-05),
// they returned with the copy still queued behind a held kernel, and a write made right after
// reached the device. Also: an asynchronous copy that starts in a page-locked block and runs past
// its end is refused at the call.
TEST_CASE("to() and copy_ from page-locked host memory return once the device has read it; removed, a write right after reaches the device") {
  DeviceRuntime& rt = sim_runtime();
  const Device dev = Device::sim(1);
  const DeviceGuard current(dev);  // a kernel launches on a stream of the current device
  const Stream s = current_stream(dev);  // the caller thread's current stream too (the default one)
  auto* pinned = static_cast<float*>(rt.host_malloc(64 * sizeof(float)));
  const Tensor h = from_blob(pinned, {64});
  const auto values = [](const Tensor& d) {
    const Tensor c = d.to(kCPU);
    return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
  };
  // `copy` makes the copy from h, then the same thread writes `after` into the page-locked memory
  // at once; whether that returned while a kernel queued before it on s was held.
  Tensor d;
  const auto copied_then_wrote = [&](const std::function<void()>& copy, float after, std::chrono::milliseconds patience) {
    return returned_while_held(s, [&] {
      copy();
      std::fill(pinned, pinned + 64, after);
    }, patience);
  };
  std::fill(pinned, pinned + 64, 1.0f);
  CHECK_FALSE(copied_then_wrote([&] { d = h.to(dev); }, 2.0f, 300ms));
  CHECK(values(d) == std::vector<float>(64, 1.0f));
  Tensor e = zeros({64}, {.device = dev});
  CHECK_FALSE(copied_then_wrote([&] { e.copy_(h); }, 3.0f, 300ms));
  CHECK(values(e) == std::vector<float>(64, 2.0f));
  {
    fault::RemovedScope at_once(fault::Point::kPinnedCopyWaits);
    CHECK(copied_then_wrote([&] { d = h.to(dev); }, 4.0f, 20s));
    CHECK(values(d) == std::vector<float>(64, 4.0f));  // the write made after to() returned
  }
  // Either kind of copy counts as a host synchronization (host_sync_count): the pinned one waits,
  // and one from pageable memory may (sim's waits for its stream).
  uint64_t before = host_sync_count();
  d = h.to(dev);
  CHECK(host_sync_count() > before);
  before = host_sync_count();
  d = full({64}, 1.0).to(dev);
  CHECK(host_sync_count() > before);
  // A copy starting inside the block and running past its end is refused, both directions.
  void* dst = rt.malloc(1, 256);
  REQUIRE(dst != nullptr);
  CHECK_THROWS_WITH(rt.memcpy_async(dst, pinned + 32, 256, CopyKind::HostToDevice, s.handle()),
                    Catch::Contains("the source") && Catch::Contains("has only 128 bytes of its page-locked block"));
  CHECK_THROWS_WITH(rt.memcpy_async(pinned + 48, dst, 256, CopyKind::DeviceToHost, s.handle()),
                    Catch::Contains("the destination") && Catch::Contains("has only 64 bytes of its page-locked block"));
  CHECK_NOTHROW(rt.memcpy_async(dst, pinned, 256, CopyKind::HostToDevice, s.handle()));
  s.synchronize();
  rt.free(1, dst);
  d = Tensor();
  e = Tensor();
  rt.host_free(pinned);
}

// [A host function reads no device memory] (tensor/sim/sim.cpp): a CUDA host function runs on a
// CPU thread and cannot read device memory, so sim refuses a host task that names some, live or
// freed, and runs none of it; host memory may be named. Before 2026-12-04 sim opened the named
// segment and the function's read passed.
TEST_CASE("sim: a host function naming device memory is refused, as a CUDA host function cannot read it") {
  DeviceRuntime& rt = sim_runtime();
  Stream s = stream_from_pool(Device::sim(0));
  void* device = rt.malloc(0, 256);
  REQUIRE(device != nullptr);
  std::atomic<int> ran{0};
  CHECK_THROWS_WITH(rt.launch_host_task(s.handle(), [&] { ran += 1; }, {device}),
                    Catch::Matchers::Contains("a host function cannot access device memory") &&
                        Catch::Matchers::Contains("sim:0's device memory"));
  const auto* inside = static_cast<const char*>(device) + 100;  // anywhere in the segment
  CHECK_THROWS_WITH(rt.launch_host_task(s.handle(), [&] { ran += 1; }, {inside}),
                    Catch::Matchers::Contains("cannot access device memory"));
  s.synchronize();
  CHECK(ran.load() == 0);
  std::vector<char> host(64, 1);
  void* pinned = rt.host_malloc(64);
  rt.launch_host_task(s.handle(), [&] { ran += host[0]; }, {host.data(), pinned});
  s.synchronize();
  CHECK(ran.load() == 1);
  rt.host_free(pinned);
  rt.free(0, device);
}

TEST_CASE("sim: a device call inside a host function fails as cudaErrorNotPermitted") {
  DeviceRuntime& rt = sim_runtime();
  Stream s = stream_from_pool(Device::sim(0));
  void* p = rt.malloc(0, 256);
  EventHandle outside = rt.create_event(0, /*enable_timing=*/true);
  rt.record_event(outside, s.handle());
  std::vector<std::string> refused;
  rt.launch_host_task(
      s.handle(),
      [&] {
        auto attempt = [&](const std::function<void()>& call) {
          try {
            call();
          } catch (const Error& e) {
            refused.push_back(e.what());
          }
        };
        attempt([&] { rt.free(0, p); });
        attempt([&] { rt.malloc(0, 64); });
        attempt([&] {
          EventHandle e = rt.create_event(0, false);
          rt.destroy_event(e);
        });
        attempt([&] { rt.synchronize_stream(s.handle()); });
        attempt([&] { rt.launch_host_task(s.handle(), [] {}, {}); });
        attempt([&] { sim::launch_kernel(s.handle(), [] {}, {}); });
        // Queries, timing, stream creation, memory info, an event's destruction and cudaSetDevice are
        // CUDA calls too (session 42; before, sim let them through).
        attempt([&] { rt.query_stream(s.handle()); });
        attempt([&] { rt.query_event(outside); });
        attempt([&] { rt.elapsed_ms(outside, outside); });
        attempt([&] { rt.create_stream(0, false); });
        attempt([&] { rt.total_memory(0); });
        attempt([&] { rt.destroy_event(outside); });
        attempt([&] { rt.set_device(0); });
      },
      {});
  s.synchronize();
  REQUIRE(refused.size() == 13);
  for (const std::string& m : refused) {
    INFO(m);
    CHECK(m.find("inside a host function") != std::string::npos);
    CHECK(m.find("cudaErrorNotPermitted") != std::string::npos);
  }
  rt.free(0, p);  // outside, the same calls are fine
  CHECK(rt.elapsed_ms(outside, outside) == 0.0);
  rt.destroy_event(outside);
}

TEST_CASE("sim: page-locked and device allocation order later work after all earlier work, as on CUDA") {
  // Stream a's kernel is held at a gate the host opens only after the allocation returned: had the
  // call waited for a, it would not return (caught by the 60 s bound on a helper thread, not by
  // timing the call); b's kernel, issued after it, must still see a's kernel done. Device
  // allocation is such a barrier for the device's streams (CUDA's programming guide, "Implicit
  // Synchronization"); device and page-locked free block the host until the streams are done (the
  // free and host_free cases above).
  DeviceRuntime& rt = sim_runtime();
  Stream a = stream_from_pool(Device::sim(0));
  Stream b = stream_from_pool(Device::sim(0));
  REQUIRE(a != b);
  enum class Call { kHostMalloc, kMalloc };
  for (const Call what : {Call::kHostMalloc, Call::kMalloc}) {
    INFO((what == Call::kHostMalloc ? "host_malloc" : "malloc"));
    void* pinned = nullptr;
    void* device_memory = nullptr;
    a.synchronize();
    b.synchronize();
    std::atomic<int> gate{0}, flag{0}, seen{-1};
    launch_gated(a.handle(), gate, flag);
    std::future<void> call = std::async(std::launch::async, [&] {
      if (what == Call::kHostMalloc) pinned = rt.host_malloc(64);
      else device_memory = rt.malloc(0, 4096);
    });
    const bool returned = call.wait_for(60s) == std::future_status::ready;
    CHECK(returned);  // the host does not wait for a's kernel
    CHECK(flag.load() == 0);
    sim::launch_kernel(b.handle(), [&] { seen = flag.load(); }, {});
    gate = 1;
    call.get();
    b.synchronize();
    CHECK(seen.load() == 1);  // b's kernel ran after a's, issued before the barrier
    a.synchronize();
    if (what == Call::kHostMalloc) rt.host_free(pinned);
    if (device_memory != nullptr) rt.free(0, device_memory);
  }
  // Without a barrier b's kernel overtakes a's (the check above can fail): with none issued, and
  // with a device allocation once the rule is removed (the negative control).
  for (const bool allocate : {false, true}) {
    INFO((allocate ? "malloc with sim_malloc_barrier removed" : "no call between"));
    fault::RemovedScope no_barrier(fault::Point::kSimMallocBarrier);
    std::atomic<int> gate{0}, flag{0}, seen{-1};
    launch_gated(a.handle(), gate, flag);
    void* device_memory = allocate ? rt.malloc(0, 4096) : nullptr;
    sim::launch_kernel(b.handle(), [&] { seen = flag.load(); }, {});
    b.synchronize();
    gate = 1;
    CHECK(seen.load() == 0);
    a.synchronize();
    if (device_memory != nullptr) rt.free(0, device_memory);
  }
}


TEST_CASE("sim: a stream made after an allocation starts behind the work the allocation held back, as on CUDA") {
  // CUDA's implicit synchronization is about commands: a command issued after a device (or
  // page-locked) allocation does not run beside one issued before it on another stream, whatever
  // stream it goes to, a stream made after the allocation included. Stream a's kernel (sim:0) is
  // held at a gate; after the allocation returned, stream c is made and given a kernel. While the
  // gate is shut, c must not finish (a helper thread's synchronize of c has not returned after
  // 300 ms; without the rule c's kernel runs at once); once it opens, c's kernel sees a's done. A
  // device allocation holds back the device's streams; a page-locked one every device's, so that
  // case makes c on sim:1.
  DeviceRuntime& rt = sim_runtime();
  REQUIRE(rt.device_count() >= 2);
  Stream a = stream_from_pool(Device::sim(0));
  enum class Call { kHostMalloc, kMalloc };
  for (const Call what : {Call::kHostMalloc, Call::kMalloc}) {
    INFO((what == Call::kHostMalloc ? "host_malloc, c on sim:1" : "malloc, c on sim:0"));
    a.synchronize();
    void* pinned = nullptr;
    void* device_memory = nullptr;
    std::atomic<int> gate{0}, flag{0}, seen{-1};
    launch_gated(a.handle(), gate, flag);
    std::future<void> call = std::async(std::launch::async, [&] {
      if (what == Call::kHostMalloc) pinned = rt.host_malloc(64);
      else device_memory = rt.malloc(0, 4096);
    });
    const bool returned = call.wait_for(60s) == std::future_status::ready;
    CHECK(returned);  // the host does not wait for a's kernel
    std::future<void> sync;
    if (returned) {
      call.get();
      const int device = what == Call::kHostMalloc ? 1 : 0;
      DeviceGuard on(Device::sim(device));
      const StreamHandle c = rt.create_stream(device, false);
      sim::launch_kernel(c, [&] { seen = flag.load(); }, {});
      sync = std::async(std::launch::async, [&rt, c, device] {
        DeviceGuard there(Device::sim(device));
        rt.synchronize_stream(c);
      });
      CHECK(sync.wait_for(300ms) == std::future_status::timeout);  // held behind a's kernel
    }
    gate = 1;
    if (sync.valid()) sync.get();
    if (!returned) call.get();
    CHECK(seen.load() == 1);  // c's kernel ran after a's, issued before the barrier
    a.synchronize();
    if (pinned != nullptr) rt.host_free(pinned);
    if (device_memory != nullptr) rt.free(0, device_memory);
  }
  // The negative control: with the rule removed, c's kernel runs while a's is still held (c is
  // synchronized before the gate opens, which with the rule in place does not return: bounded by
  // 60 s on a helper thread, the gate opened either way).
  fault::RemovedScope no_barrier(fault::Point::kSimNewStreamBarrier);
  a.synchronize();
  std::atomic<int> gate{0}, flag{0}, seen{-1};
  launch_gated(a.handle(), gate, flag);
  void* device_memory = rt.malloc(0, 4096);
  const StreamHandle c = rt.create_stream(0, false);
  sim::launch_kernel(c, [&] { seen = flag.load(); }, {});
  std::future<void> sync = std::async(std::launch::async, [&] { rt.synchronize_stream(c); });
  CHECK(sync.wait_for(60s) == std::future_status::ready);
  gate = 1;
  sync.get();
  CHECK(seen.load() == 0);
  a.synchronize();
  rt.free(0, device_memory);
}

// Stream memory operations (what GlooStreamCommunicator orders its staging with): write_value lands
// after the stream's earlier work (a pinned copy included), wait_value holds later work until the
// host stores the value; both refuse memory that is not page-locked.
TEST_CASE("sim: stream_write_value follows earlier work, stream_wait_value holds later work") {
  DelayScope delay(200);
  DeviceRuntime& rt = sim_runtime();
  Stream s = stream_from_pool(Device::sim(0));
  auto* words = static_cast<uint32_t*>(rt.host_malloc(64));
  auto* pinned = static_cast<int*>(rt.host_malloc(256 * sizeof(int)));
  words[0] = words[1] = 0;
  auto* buf = static_cast<int*>(rt.malloc(0, 256 * sizeof(int)));
  std::vector<int> values(256);
  for (int i = 0; i < 256; ++i) values[i] = 7 * i + 3;
  rt.memcpy_async(buf, values.data(), 256 * sizeof(int), CopyKind::HostToDevice, s.handle());
  rt.memcpy_async(pinned, buf, 256 * sizeof(int), CopyKind::DeviceToHost, s.handle());
  rt.stream_write_value(s.handle(), &words[0], 5);
  rt.stream_wait_value(s.handle(), &words[1], 9);
  std::atomic<bool> after{false};
  sim::launch_kernel(s.handle(), [&] { after.store(true); }, {});
  // The host sees the copy's data once it sees the value.
  while (std::atomic_ref<uint32_t>(words[0]).load(std::memory_order_acquire) != 5) std::this_thread::yield();
  for (int i = 0; i < 256; ++i) REQUIRE(pinned[i] == 7 * i + 3);
  std::this_thread::sleep_for(30ms);
  CHECK_FALSE(after.load());  // held by the wait: 8 < 9
  std::atomic_ref<uint32_t>(words[1]).store(8, std::memory_order_release);
  std::this_thread::sleep_for(30ms);
  CHECK_FALSE(after.load());
  std::atomic_ref<uint32_t>(words[1]).store(10, std::memory_order_release);  // >= 9 releases it
  s.synchronize();
  CHECK(after.load());
  uint32_t pageable = 0;
  CHECK_THROWS_WITH(rt.stream_write_value(s.handle(), &pageable, 1), Catch::Contains("not page-locked"));
  rt.free(0, buf);
  rt.host_free(pinned);
  rt.host_free(words);
}

// As CUDA's driver: while a copy to or from pageable memory waits for its stream, other host
// threads' device calls wait too (the lock that deadlocked Gloo's staging on an H100 when its
// thread made CUDA calls the stream waited for). Before 2026-12-02 a stream query, the
// synchronizations, event and stream creation and pinned allocation went past a held lock, so a
// thread the device waits for could make them on sim and hang on a GPU. (Event queries and memory
// info do not take it: tensor/sim/sim.h.)
TEST_CASE("sim: a blocking copy to or from pageable memory holds other threads' device calls") {
  const DriverLockOn lock_on;
  DeviceRuntime& rt = sim_runtime();
  Stream s = stream_from_pool(Device::sim(0)), other = stream_from_pool(Device::sim(0));
  auto* words = static_cast<uint32_t*>(rt.host_malloc(64));
  auto* buf = static_cast<int*>(rt.malloc(0, sizeof(int)));
  Event done;
  done.record(other);
  done.synchronize();
  const std::vector<std::pair<const char*, std::function<void()>>> calls{
      {"record_event", [&] { Event e; e.record(other); }},
      {"synchronize_event", [&] { rt.synchronize_event(done.handle()); }},
      {"query_stream", [&] { (void)rt.query_stream(other.handle()); }},
      {"synchronize_stream", [&] { rt.synchronize_stream(other.handle()); }},
      {"create_event", [&] { rt.destroy_event(rt.create_event(0, false)); }},
      {"create_stream", [&] { (void)rt.create_stream(0, false); }},
      {"host_malloc", [&] { rt.host_free(rt.host_malloc(64)); }},
  };
  for (const CopyKind kind : {CopyKind::DeviceToHost, CopyKind::HostToDevice}) {
    for (const auto& entry : calls) {  // (clang 14 cannot capture a structured binding)
      const std::function<void()>& call = entry.second;
      INFO((kind == CopyKind::DeviceToHost ? "a copy to pageable memory holds " : "a copy from pageable memory holds ")
           << entry.first);
      words[0] = 0;
      int host = 7;
      rt.stream_wait_value(s.handle(), &words[0], 1);
      std::thread copier([&] {
        if (kind == CopyKind::DeviceToHost) rt.memcpy_async(&host, buf, sizeof(int), kind, s.handle());
        else rt.memcpy_async(buf, &host, sizeof(int), kind, s.handle());
      });
      const auto patience = std::chrono::steady_clock::now() + 20s;
      while (!sim::driver_lock_held() && std::chrono::steady_clock::now() < patience) std::this_thread::sleep_for(1ms);
      const bool held = sim::driver_lock_held();  // the copier waits for s, holding the lock
      CHECK(held);
      if (!held) {
        std::atomic_ref<uint32_t>(words[0]).store(1, std::memory_order_release);
        copier.join();
        s.synchronize();
        break;  // this kind of copy takes no lock: the other calls cannot meet one either
      }
      std::atomic<bool> returned{false};
      std::thread caller([&] {
        call();
        returned.store(true);
      });
      std::this_thread::sleep_for(30ms);
      CHECK_FALSE(returned.load());
      std::atomic_ref<uint32_t>(words[0]).store(1, std::memory_order_release);
      copier.join();
      caller.join();
      CHECK(returned.load());
      s.synchronize();
    }
  }
  rt.free(0, buf);
  rt.host_free(words);
}

// [free holds the driver] (tensor/sim/sim.cpp): while free or host_free waits for the device, other
// host threads' device calls wait too, as behind the writer side of libcuda's internal lock that
// cuMemFree takes (a live capture of a hang, lupinemachines/lupine PR #679). Here the free waits for
// a stream held on a page-locked word; each call, made on another thread, must not return until
// the word is stored. Removed (sim until 2026-12-04: the wait held the lock shared), each call
// returns while the free still waits.
TEST_CASE("sim: free and host_free hold other threads' device calls while they wait; removed, the calls go on") {
  const DriverLockOn lock_on;
  DeviceRuntime& rt = sim_runtime();
  const DeviceGuard zero(Device::sim(0));
  Stream s = stream_from_pool(Device::sim(0)), other = stream_from_pool(Device::sim(0));
  auto* words = static_cast<uint32_t*>(rt.host_malloc(64));
  std::vector<void*> allocated;  // by the malloc call, freed at the end
  std::mutex allocated_mutex;
  const std::vector<std::pair<const char*, std::function<void()>>> calls{
      {"record_event", [&] { Event e; e.record(other); }},
      {"query_stream", [&] { (void)rt.query_stream(other.handle()); }},
      {"create_event", [&] { rt.destroy_event(rt.create_event(0, false)); }},
      {"create_stream", [&] { (void)rt.create_stream(0, false); }},
      {"a kernel launch", [&] { sim::launch_kernel(other.handle(), [] {}, {}); }},
      {"malloc", [&] {
         void* p = rt.malloc(1, 64);
         const std::lock_guard<std::mutex> lock(allocated_mutex);
         allocated.push_back(p);
       }},
  };
  for (const bool host : {false, true}) {
    for (const bool removed : {false, true}) {
      for (const auto& entry : calls) {  // (clang 14 cannot capture a structured binding)
        const std::function<void()>& call = entry.second;
        INFO((host ? "host_free" : "free") << (removed ? ", the hold removed, " : " holds ") << entry.first);
        std::optional<fault::RemovedScope> without;
        if (removed) without.emplace(fault::Point::kSimFreeHoldsDriver);
        void* block = host ? rt.host_malloc(64) : rt.malloc(0, 4096);
        words[0] = 0;
        rt.stream_wait_value(s.handle(), &words[0], 1);
        std::atomic<bool> freed{false}, returned{false};
        std::thread freer([&] {
          const DeviceGuard on_thread(Device::sim(0));
          if (host) rt.host_free(block);
          else rt.free(0, block);
          freed = true;
        });
        const bool waiting = eventually([] { return sim::frees_waiting(); });
        CHECK(waiting);
        CHECK(sim::driver_lock_held() == (waiting && !removed));
        std::thread caller;
        if (waiting) {
          caller = std::thread([&] {
            call();
            returned = true;
          });
          if (removed) {
            CHECK(eventually([&] { return returned.load(); }));
          } else {
            std::this_thread::sleep_for(30ms);
            CHECK_FALSE(returned.load());
          }
          CHECK_FALSE(freed.load());  // the free still waits for s
        }
        std::atomic_ref<uint32_t>(words[0]).store(1, std::memory_order_release);
        freer.join();
        if (caller.joinable()) caller.join();
        CHECK(freed.load());
        CHECK(returned.load() == waiting);
        s.synchronize();
        other.synchronize();
      }
    }
  }
  for (void* p : allocated) rt.free(1, p);
  rt.host_free(words);
}

// [Shared hardware queues] (tensor/sim/sim.cpp): streams that share a hardware queue start their
// work in issue order past a wait: a stream_wait_value on one holds up the other's kernel issued
// after it, not one issued before it; streams on two queues do not meet. Removed (sim until
// 2026-12-02), every stream ran on its own.
TEST_CASE("sim: a wait holds up later work of every stream on its hardware queue, as on a GPU; removed, it does not") {
  DeviceRuntime& rt = sim_runtime();
  const Device dev = Device::sim(1);
  const DeviceGuard current(dev);  // a kernel launches on a stream of the current device
  auto* word = static_cast<uint32_t*>(rt.host_malloc(64));
  // Streams a and b made in a row with k queues; a waits for the word, then b's kernel is issued
  // (and, first, one issued on b before the wait). Returns whether b's later kernel ran before the
  // word was stored (b synchronized with the word still 0: it never can if the queue is shared).
  auto later_ran_during_wait = [&](int k, std::chrono::milliseconds patience) {
    const ConnectionsScope scope(k);
    const Stream a(dev, rt.create_stream(1, false)), b(dev, rt.create_stream(1, false));
    std::atomic_ref<uint32_t>(*word).store(0);
    std::atomic<bool> before{false}, later{false};
    sim::launch_kernel(b.handle(), [&] { before = true; }, {});
    rt.stream_wait_value(a.handle(), word, 1);
    sim::launch_kernel(b.handle(), [&] { later = true; }, {});
    const auto until = std::chrono::steady_clock::now() + patience;
    while (!later && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
    const bool early = later.load();
    const auto at_most = std::chrono::steady_clock::now() + 20s;  // issued before the wait: never held up
    while (!before && std::chrono::steady_clock::now() < at_most) std::this_thread::sleep_for(1ms);
    CHECK(before.load());
    std::atomic_ref<uint32_t>(*word).store(1, std::memory_order_release);
    a.synchronize();
    b.synchronize();
    CHECK(later.load());
    return early;
  };
  CHECK_FALSE(later_ran_during_wait(1, 300ms));  // one queue: b's kernel waits behind a's wait
  CHECK(later_ran_during_wait(2, 20s));          // two queues, a and b on different ones
  {
    fault::RemovedScope own_queues(fault::Point::kSimSharedQueues);
    CHECK(later_ran_during_wait(1, 20s));
  }
  // An event wait holds its queue the same way (here for a kernel of a third stream held by the
  // test), and so does a host function while it runs.
  {
    const ConnectionsScope scope(1);
    const Stream a(dev, rt.create_stream(1, false)), b(dev, rt.create_stream(1, false)),
        c(dev, rt.create_stream(1, false));
    std::atomic<bool> release{false}, later{false};
    sim::launch_kernel(c.handle(), [&] { while (!release) std::this_thread::sleep_for(1ms); }, {});
    Event on_c;
    on_c.record(c);
    a.wait(on_c);
    sim::launch_kernel(b.handle(), [&] { later = true; }, {});
    std::this_thread::sleep_for(300ms);
    CHECK_FALSE(later.load());  // behind a's event wait, itself behind c's held kernel
    release = true;
    b.synchronize();
    CHECK(later.load());

    std::atomic<bool> release_host{false}, after_host{false};
    rt.launch_host_task(a.handle(), [&] { while (!release_host) std::this_thread::sleep_for(1ms); }, {});
    sim::launch_kernel(b.handle(), [&] { after_host = true; }, {});
    std::this_thread::sleep_for(300ms);
    CHECK_FALSE(after_host.load());  // behind a's host function
    release_host = true;
    b.synchronize();
    CHECK(after_host.load());
    a.synchronize();
    c.synchronize();
  }
  rt.host_free(word);
}

// The process that the next test starts (hidden: run only by name). Its holder is made before the
// process's first device call, as a process group made by init_process_group before any tensor
// reaches the device, so it is destroyed after the runtime's unload at exit.
// Runs this binary's hidden case `name` in a child process with `env_assignments` ("A=1 B=2") added
// to its environment, checks that it exited 0, and returns its output (stdout and stderr). Without
// Bazel's sharding variables, which would make the child's catch_main run another shard's cases.
static std::string run_child_case(const std::string& name, const std::string& env_assignments = "") {
  char self[4096] = {};
  REQUIRE(::readlink("/proc/self/exe", self, sizeof(self) - 1) > 0);
  const std::string command = "env -u TEST_TOTAL_SHARDS -u TEST_SHARD_INDEX -u TEST_SHARD_STATUS_FILE " +
                              env_assignments + " " + self + " '" + name + "' 2>&1";
  FILE* child = ::popen(command.c_str(), "r");
  REQUIRE(child != nullptr);
  std::string output;
  char buf[512];
  while (std::fgets(buf, sizeof buf, child)) output += buf;
  const int status = ::pclose(child);
  INFO(output);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  return output;
}

TEST_CASE("sim: unload child", "[.sim_unload_child]") {
  struct Holder {
    void* pinned = nullptr;
    EventHandle event = nullptr;
    ~Holder() {
      DeviceRuntime& rt = sim_runtime();
      for (const auto& [name, call] : std::vector<std::pair<const char*, std::function<void()>>>{
               {"host_free", [&] { rt.host_free(pinned); }},
               {"query_event", [&] { rt.query_event(event); }},
               {"malloc", [&] { rt.malloc(0, 64); }}}) {
        try {
          call();
          std::printf("%s: ran after the unload\n", name);
        } catch (const DeviceUnloading& e) {
          std::printf("%s: DeviceUnloading: %s\n", name, e.what());
        } catch (const std::exception& e) {
          std::printf("%s: another error: %s\n", name, e.what());
        }
      }
      try {
        rt.destroy_event(event);  // as cudaEventDestroy, whose result is ignored: no error
        std::printf("destroy_event: no error\n");
      } catch (const std::exception& e) {
        std::printf("destroy_event: an error: %s\n", e.what());
      }
      std::fflush(stdout);
    }
  };
  static Holder holder;
  DeviceRuntime& rt = sim_runtime();
  holder.pinned = rt.host_malloc(64);  // the first device call of this process
  holder.event = rt.create_event(0, false);
  std::printf("before exit: device calls work\n");
}

// [A library handle is made at a thread's first call] (kernels/sim/sim_kernels.cpp): a host
// thread's first product on a device (cuBLAS's handle on CUDA) does not return while the device's
// default stream is held, though the product itself goes to a side stream; nor does a new thread's
// first average pool, nor a thread's first convolution (cuDNN's handle) after products. The blocking is counted as one host
// synchronization. A later product on the same thread, or one on a thread that already made its
// handle, returns during the hold. Removed (sim_library_handle), a new thread's first product,
// convolution and average pool return at once.
TEST_CASE("sim: a thread's first product or convolution on a device waits for the default stream, as making a cuBLAS or cuDNN handle") {
  const Device dev = Device::sim(1);
  const DeviceGuard current(dev);
  const Stream held = default_stream(dev);
  const Stream side = stream_from_pool(dev);
  Tensor a, b, x, w;
  {
    // Made on the side stream, which reads them: the stream-order sanitizer orders by stream and
    // by each host thread's own synchronizations, and the products run on other threads.
    const StreamGuard on_side(side);
    a = ones({8, 8}).to(dev), b = ones({8, 8}).to(dev);
    x = ones({1, 2, 5, 5}).to(dev), w = ones({3, 2, 3, 3}).to(dev);
  }
  synchronize(dev);
  uint64_t syncs = 0;
  Tensor conv_out;
  auto product = [&] {
    const StreamGuard on_side(side);
    const uint64_t before = host_sync_count();
    Tensor c = mm(a, b);
    syncs = host_sync_count() - before;
  };
  auto convolution = [&] {
    const StreamGuard on_side(side);
    kernels::Window2d win;
    win.in_h = win.in_w = 5;
    win.out_h = win.out_w = 3;
    win.kernel_h = win.kernel_w = 3;
    Tensor out = empty({1, 3, 3, 3}, {.device = dev});
    const uint64_t before = host_sync_count();
    kernels::kernel_table(dev, "conv2d").conv2d(out, x, w, Tensor(), win, 1);
    syncs = host_sync_count() - before;
    conv_out = out;
  };
  auto average_pool = [&] {  // a classifier head's global average pool: cuDNN on CUDA too
    const StreamGuard on_side(side);
    Tensor out = empty({1, 2, 1, 1}, {.device = dev});
    const uint64_t before = host_sync_count();
    kernels::kernel_table(dev, "adaptive_avg_pool2d").adaptive_avg_pool2d(out, x, 5, 5, 1, 1);
    syncs = host_sync_count() - before;
  };
  CHECK_FALSE(returned_while_held(held, product, 300ms));
  CHECK(syncs == 1);
  CHECK_FALSE(returned_while_held(held, [&] { product(); }, 300ms));  // a new thread again
  CHECK_FALSE(returned_while_held(held, average_pool, 300ms));
  CHECK(syncs == 1);
  {
    fault::RemovedScope at_once(fault::Point::kSimLibraryHandle);
    CHECK(returned_while_held(held, product, 20s));
    CHECK(syncs == 0);
    CHECK(returned_while_held(held, convolution, 20s));
    CHECK(syncs == 0);
    CHECK(returned_while_held(held, average_pool, 20s));
    CHECK(syncs == 0);
  }
  // One thread: its first product (the stream idle) makes the handle; a second, during the hold,
  // returns; its first convolution then waits.
  std::atomic<int> step{0};
  std::atomic<bool> second_returned{false}, convolution_returned{false};
  uint64_t second_syncs = 99;
  std::thread worker([&] {
    const DeviceGuard on_thread(dev);
    product();
    step = 1;
    while (step.load() != 2) std::this_thread::sleep_for(1ms);
    product();
    second_syncs = syncs;
    second_returned = true;
    convolution();
    convolution_returned = true;
  });
  while (step.load() != 1) std::this_thread::sleep_for(1ms);
  std::atomic<bool> release{false};
  std::promise<void> busy;
  sim::launch_kernel(held.handle(), [&] {
    busy.set_value();
    while (!release) std::this_thread::sleep_for(1ms);
  }, {});
  busy.get_future().wait();
  step = 2;
  const auto until = std::chrono::steady_clock::now() + 20s;
  while (!second_returned && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  CHECK(second_returned.load());
  CHECK(second_syncs == 0);
  std::this_thread::sleep_for(300ms);
  CHECK_FALSE(convolution_returned.load());
  release = true;
  worker.join();
  CHECK(convolution_returned.load());
  CHECK(syncs == 1);
  synchronize(dev);
  CHECK(conv_out.cpu().sum().item<double>() == 27.0 * 18.0);  // each of the 27 outputs sums 2 x 3 x 3 ones
}

TEST_CASE("sim: the runtime unloads at exit as CUDA's does; later calls raise DeviceUnloading") {
  // CUDA's runtime registers its teardown at its first call; an object destroyed after it (H200,
  // 2026-11-29: the Gloo staging pool of a process group held in a static) gets "driver shutting
  // down" from cudaFreeHost. sim must not be more forgiving: the child's holder meets the same.
  const std::string output = run_child_case("sim: unload child");
  INFO(output);
  CHECK(output.find("before exit: device calls work") != std::string::npos);
  for (const char* call : {"host_free", "query_event", "malloc"}) {
    INFO(call);
    CHECK(output.find(std::string(call) + ": DeviceUnloading: sim: " + call +
                      ": driver shutting down (cudaErrorCudartUnloading)") != std::string::npos);
  }
  CHECK(output.find("ran after the unload") == std::string::npos);
  CHECK(output.find("destroy_event: no error") != std::string::npos);
}

// Run by the next case in a child whose environment holds a refused CHORUS_SIM_* setting, named by
// CHORUS_TEST_REFUSED: the process got to main, sim has no device, and a use of one fails with a
// chorus::Error that names the setting; the CPU works.
TEST_CASE("sim: refused setting child", "[.]") {
  const char* name = std::getenv("CHORUS_TEST_REFUSED");
  REQUIRE(name != nullptr);
  const char* value = std::getenv(name);
  REQUIRE(value != nullptr);
  const std::string setting = std::string(name) + "=" + value;
  CHECK(device_count(DeviceType::Sim) == 0);
  std::string message;
  try {
    (void)zeros({2}, {.device = Device::sim(0)});
  } catch (const Error& e) {
    message = e.what();
  }
  INFO(message);
  CHECK(message.find("no sim device: a CHORUS_SIM_* setting was refused when chorus started: " + setting) !=
        std::string::npos);
  CHECK(add(ones({2}), ones({2})).sum().item<float>() == 4.0f);
  std::printf("refused setting child: done\n");
}

TEST_CASE("sim: a refused CHORUS_SIM_* setting fails each use of sim with its message, not the process at start") {
  // The settings are read when the runtime registers, at static initialization: a throw there ended
  // every program linked with chorus in std::terminate before main (the old behaviour fails here:
  // the child aborts).
  const std::vector<std::pair<std::string, std::string>> refused{
      {"CHORUS_SIM_CONNECTIONS", "40"},     // past the 32 queues CUDA_DEVICE_MAX_CONNECTIONS allows
      {"CHORUS_SIM_DEVICES", "two"},        // not a number
      {"CHORUS_SIM_DEVICES", "4294967295"}, // would have been -1 devices as an int
      {"CHORUS_SIM_MEMORY_MB", "0"},
      {"CHORUS_SIM_DELAY_US", "-5"},
  };
  for (const auto& [name, value] : refused) {
    const std::string setting = name + "=" + value;
    INFO(setting);
    const std::string output = run_child_case("sim: refused setting child", setting + " CHORUS_TEST_REFUSED=" + name);
    INFO(output);
    CHECK(output.find("refused setting child: done") != std::string::npos);
  }
}
