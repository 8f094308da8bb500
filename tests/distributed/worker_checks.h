// Checks inside a worker process of a multi-process test (tests/distributed/dist_worker,
// tests/pipeline/pipeline_worker): a failed check prints "rank R: CHECK FAILED: ..." and counts,
// and the worker exits non-zero when any failed (the driver requires every rank to exit 0).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "tensor/ops.h"
#include "tensor/runtime.h"
#include "tensor/tensor.h"

namespace chorus::testing {

inline int g_failures = 0;
inline int g_rank = 0;

inline void check(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "rank %d: CHECK FAILED: %s\n", g_rank, what.c_str());
    ++g_failures;
  }
}

// Element-wise closeness, as torch.allclose: max_i |actual_i - expected_i| / (atol + rtol |expected_i|)
// in float64, on the CPU; <= 1 means every element is within atol + rtol |expected_i|. With
// atol = atol_scale * max |expected|: a reduction's rounding is relative to the largest terms that
// enter it, so an element that cancels to near zero is held to that, and to nothing looser.
inline double allclose_ratio(const Tensor& actual, const Tensor& expected, double rtol, double atol_scale) {
  const Tensor a = actual.detach().cpu().to(kFloat64), e = expected.detach().cpu().to(kFloat64);
  if (a.numel() == 0) return 0;
  const double atol = atol_scale * e.abs().max().item<double>();
  return ((a - e).abs() / (e.abs() * rtol + (atol + 1e-300))).max().item<double>();
}

// CHORUS_TEST_SIDE_STREAM=1: every sim device's current stream on this thread becomes a pool stream,
// not the default one, for the rest of the worker (DDP, SyncBatchNorm, pipelines and the optimizers
// must order their work against the caller's current stream, whichever it is).
inline void use_side_streams_if_asked() {
  const char* side = std::getenv("CHORUS_TEST_SIDE_STREAM");
  if (side == nullptr || std::string(side) != "1") return;
  for (int i = 0; i < device_count(DeviceType::Sim); ++i) set_current_stream(stream_from_pool(Device::sim(i)));
  std::printf("rank %d: current streams are side streams\n", g_rank);
}

// The backend a GPU test asks a worker for (CHORUS_TEST_BACKEND, e.g. "nccl"; else `fallback`), and
// with CHORUS_TEST_NCCL_HOSTID=1 a host id of the rank's own (NCCL_HOSTID=chorus-host-RANK), so that
// NCCL takes two ranks on one GPU for two hosts (its duplicate-GPU check compares host hashes and
// bus ids) and connects them over its socket transport.
inline std::string test_backend(const std::string& fallback) {
  if (std::getenv("CHORUS_TEST_NCCL_HOSTID")) {
    const char* r = std::getenv("RANK");
    ::setenv("NCCL_HOSTID", (std::string("chorus-host-") + (r ? r : "0")).c_str(), 1);
  }
  const char* backend = std::getenv("CHORUS_TEST_BACKEND");
  return backend ? backend : fallback;
}

// Runs f, expecting an error whose message contains every one of `parts`.
inline void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts, const std::string& what) {
  try {
    f();
  } catch (const std::exception& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts) check(msg.find(p) != std::string::npos, what + ": message lacks '" + p + "': " + msg);
    std::printf("rank %d: expected error: %s\n", g_rank, msg.c_str());
    return;
  }
  check(false, what + ": no error was raised");
}

}  // namespace chorus::testing
