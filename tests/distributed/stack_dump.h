// For hangs seen only where a debugger is not at hand (the GPU machine): with
// CHORUS_TEST_STACKS_AFTER_S=N set, N seconds after start every thread of this process writes its
// call stack to stderr (glibc backtrace: names of exported symbols, else library + offset), after
// the executable mappings (so an address can be looked up with addr2line on the unstripped build).
// A process that finishes sooner writes nothing. Test-only.
#pragma once

#include <dirent.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

namespace chorus::testing {

inline void write_own_stack(int) {
  void* frames[64];
  const int n = backtrace(frames, 64);
  char head[64];
  const int len = std::snprintf(head, sizeof head, "---- thread %ld\n", static_cast<long>(syscall(SYS_gettid)));
  if (len > 0) (void)!write(2, head, static_cast<size_t>(len));
  backtrace_symbols_fd(frames, n, 2);
}

inline void dump_stacks_after_env() {
  const char* after = std::getenv("CHORUS_TEST_STACKS_AFTER_S");
  if (!after) return;
  const double seconds = std::atof(after);
  void* warm[1];
  backtrace(warm, 1);  // loads libgcc's unwinder now, not inside the signal handler
  struct sigaction sa {};
  sa.sa_handler = write_own_stack;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGUSR2, &sa, nullptr);
  std::thread([seconds] {
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    std::fprintf(stderr, "==== stacks of pid %d after %.0f s\n", static_cast<int>(getpid()), seconds);
    std::ifstream maps("/proc/self/maps");
    for (std::string line; std::getline(maps, line);)
      if (line.find("r-xp") != std::string::npos) std::fprintf(stderr, "map %s\n", line.c_str());
    std::fflush(stderr);
    const long self = syscall(SYS_gettid);
    if (DIR* dir = opendir("/proc/self/task")) {
      while (dirent* e = readdir(dir)) {
        const long tid = std::atol(e->d_name);
        if (tid <= 0 || tid == self) continue;
        syscall(SYS_tgkill, getpid(), tid, SIGUSR2);
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      closedir(dir);
    }
    std::fprintf(stderr, "==== end of stacks\n");
    std::fflush(stderr);
  }).detach();
}

}  // namespace chorus::testing
