// cuBLAS opened at first use: kernels/cuda/cublas_api.h says why.
#include "kernels/cuda/cublas_api.h"

#include <dlfcn.h>

#include <atomic>
#include <exception>

#include "local_cuda/lib_paths.h"
#include "tensor/error.h"

// The exported name of a cuBLAS function whose header name is a macro (cublasCreate ->
// cublasCreate_v2): stringified after expansion.
#define CHORUS_CUBLAS_NAME_(x) #x
#define CHORUS_CUBLAS_NAME(x) CHORUS_CUBLAS_NAME_(x)

namespace chorus::cuda {
namespace {

// The exported functions have exactly these types: a static_cast of an overloaded name to a function
// pointer type compiles only if the header declares an overload of that type. Unevaluated (inside
// decltype): nothing here refers to libcublas at link time.
using CheckGemmEx = decltype(static_cast<CublasGemmEx>(&::cublasGemmEx));
using CheckGemmStridedBatchedEx = decltype(static_cast<CublasGemmStridedBatchedEx>(&::cublasGemmStridedBatchedEx));

std::atomic<bool> g_loaded{false};

template <typename Fn>
void resolve(void* library, const CublasApi& api, const char* name, Fn& fn) {
  dlerror();  // clear
  void* symbol = dlsym(library, name);
  if (symbol == nullptr) {
    const char* why = dlerror();
    fail("cuBLAS: {} has no function {} ({}); expected the cuBLAS {} that chorus was built with", api.path, name,
         why != nullptr ? why : "null symbol", CUBLAS_VER_MAJOR);
  }
  fn = reinterpret_cast<Fn>(symbol);
}

}  // namespace

CublasApi load_cublas(const std::vector<std::string>& candidates) {
  CHORUS_CHECK(!candidates.empty(), "cuBLAS: no library to open (an empty list of candidates)");
  void* library = nullptr;
  std::string tried;
  CublasApi api;
  for (const std::string& candidate : candidates) {
    library = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library != nullptr) {
      api.path = candidate;
      break;
    }
    const char* why = dlerror();
    tried += fmt::format("{}{} ({})", tried.empty() ? "" : "; ", candidate, why != nullptr ? why : "no reason given");
  }
  if (library == nullptr) {
    fail("cuBLAS could not be opened: tried {}; expected the CUDA toolkit's libcublas.so.{} (set LD_LIBRARY_PATH to "
         "its folder)",
         tried, CUBLAS_VER_MAJOR);
  }
  resolve(library, api, CHORUS_CUBLAS_NAME(cublasCreate), api.create);
  resolve(library, api, CHORUS_CUBLAS_NAME(cublasSetStream), api.set_stream);
  resolve(library, api, CHORUS_CUBLAS_NAME(cublasGemmEx), api.gemm_ex);
  resolve(library, api, CHORUS_CUBLAS_NAME(cublasGemmStridedBatchedEx), api.gemm_strided_batched_ex);
  resolve(library, api, CHORUS_CUBLAS_NAME(cublasGetStatusString), api.status_string);
  resolve(library, api, CHORUS_CUBLAS_NAME(cublasGetStatusName), api.status_name);
  resolve(library, api, CHORUS_CUBLAS_NAME(cublasGetProperty), api.get_property);
  int major = -1;
  const cublasStatus_t status = api.get_property(MAJOR_VERSION, &major);
  CHORUS_CHECK(status == CUBLAS_STATUS_SUCCESS, "cuBLAS: cublasGetProperty of {} failed ({})", api.path,
               api.status_name(status));
  CHORUS_CHECK(major == CUBLAS_VER_MAJOR,
               "cuBLAS: {} is version {}, but chorus was built with cuBLAS {}'s headers; put the folder of "
               "libcublas.so.{} first in LD_LIBRARY_PATH, or rebuild chorus against this toolkit (CUDA_HOME, then "
               "`bazel sync --configure`)",
               api.path, major, CUBLAS_VER_MAJOR, CUBLAS_VER_MAJOR);
  return api;
}

const CublasApi& cublas() {
  // A failed load is kept and rethrown: a second dlopen of the same candidates would fail alike.
  struct Loaded {
    CublasApi api;
    std::exception_ptr error;
  };
  static const Loaded loaded = [] {
    Loaded l;
    try {
      l.api = load_cublas({lib_paths::kCublasSoname, lib_paths::kCublasPath});
      g_loaded.store(true, std::memory_order_release);
    } catch (...) {
      l.error = std::current_exception();
    }
    return l;
  }();
  if (loaded.error) std::rethrow_exception(loaded.error);
  return loaded.api;
}

bool cublas_loaded() { return g_loaded.load(std::memory_order_acquire); }

}  // namespace chorus::cuda
