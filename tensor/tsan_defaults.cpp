// [TSan suppressions] ThreadSanitizer's built-in suppressions for every chorus program built with
// --config=tsan (the tests, their worker processes, the examples), so no test needs a file or an
// environment variable for them. TSan reads them by calling __tsan_default_suppressions, which its
// runtime, linked into the executable, defines weakly; a definition in a shared library never
// replaces the executable's own (the dynamic linker looks in the executable first), so this file's
// library is linked statically into each executable (tensor/BUILD: linkstatic, alwayslink), and
// tests/tensor/tsan_build_test.cpp checks that the executable sees these entries. (Until
// 2026-12-01 the libgloo entry sat in distributed/gloo.cpp, in a shared library: it never took
// effect in Bazel's dynamically linked tests.)
//
// Each entry says why it is not a race in chorus; a race in chorus's own code is never suppressed.
// - called_from_lib:libomp.so: LLVM's OpenMP runtime (the TSan build compiles with clang-14, so
//   OpenMP is libomp.so.5) is not instrumented. Every thread that first enters an OpenMP construct
//   registers with it as a new "root", and libomp hands the structures of a root whose thread ended
//   to the next one under its own spin locks, which TSan cannot see: data_test's data-loader workers
//   (each a new thread calling ops) were reported as racing in memsets of a block libomp had freed
//   by one worker and reused by the next (once in 24 runs, 2026-12-01). The entry makes TSan ignore
//   the interceptors libomp calls (its malloc, free, memset, pthread calls) and nothing else: chorus's
//   code inside a parallel region, and what it calls, is still checked. The TSan phase runs with
//   OMP_NUM_THREADS=1, so no libomp worker thread runs chorus code whose ordering libomp's ignored
//   calls would have established.
// - race:gloo::transport::tcp::UnboundBuffer::signalException: Debian's libgloo is not
//   instrumented either. An UnboundBuffer's destructor first destroys its last member, a
//   gloo::ShareableNonOwningPtr, which spins until every NonOwningPtr taken from it is released
//   (gloo/common/memory.h); the pair thread holds one while it calls signalException (lock,
//   broadcast on the buffer's condition variables), and only after that are the condition variables
//   destroyed. The hand-off is a shared_ptr's atomic count inside libgloo, which TSan does not see,
//   so it reported the broadcast and the destroy as a race (multiprocess_test's killed-rank case, a
//   rank dying during an allreduce: once, in the full run of 2026-11-30 at a3d59a3).
#include "tensor/sanitizers.h"

#if CHORUS_TSAN
extern "C" const char* __tsan_default_suppressions() {
  return "called_from_lib:libomp.so\n"
         "race:gloo::transport::tcp::UnboundBuffer::signalException\n";
}
#endif
