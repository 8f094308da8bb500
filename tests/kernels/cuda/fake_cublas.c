// Not cuBLAS: a library exporting the seven functions chorus resolves from cuBLAS
// (kernels/cuda/cublas_api.h), whose cublasGetProperty says major version 1. cublas_loading_test
// opens it to see the version refusal. No cuBLAS header: the names and the C calling convention
// are all dlsym() and the one call the loader makes before refusing need.

int cublasCreate_v2(void* handle) { (void)handle; return 1; }
int cublasSetStream_v2(void* handle, void* stream) { (void)handle; (void)stream; return 1; }
int cublasGemmEx(void) { return 1; }
int cublasGemmStridedBatchedEx(void) { return 1; }
const char* cublasGetStatusString(int status) { (void)status; return "fake"; }
const char* cublasGetStatusName(int status) { (void)status; return "FAKE_STATUS"; }

// cublasGetProperty(libraryPropertyType type, int* value): MAJOR_VERSION is 0.
int cublasGetProperty(int type, int* value) {
  *value = type == 0 ? 1 : 0;
  return 0;
}
