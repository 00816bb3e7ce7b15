// Error checks for CUDA runtime, cuBLASLt and kernel launches: a failure throws trex::Error
// naming the call, the file and line, and the runtime's message.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <string>
#include "core/error.h"

namespace trex::kern::cuda {

[[noreturn]] inline void fail(const char* what, const char* msg, const char* file, int line) {
  throw Error(std::string("cuda: ") + what + " failed at " + file + ":" + std::to_string(line) + ": " + msg);
}

}  // namespace trex::kern::cuda

#define TREX_CUDA_CHECK(call)                                                               \
  do {                                                                                      \
    cudaError_t e_ = (call);                                                                \
    if (e_ != cudaSuccess) ::trex::kern::cuda::fail(#call, cudaGetErrorString(e_), __FILE__, __LINE__); \
  } while (0)

#define TREX_CUBLAS_CHECK(call)                                                             \
  do {                                                                                      \
    cublasStatus_t s_ = (call);                                                             \
    if (s_ != CUBLAS_STATUS_SUCCESS)                                                        \
      ::trex::kern::cuda::fail(#call, cublasLtGetStatusString(s_), __FILE__, __LINE__);      \
  } while (0)

// After a kernel launch: the launch's own error (bad configuration, too much shared memory).
#define TREX_CUDA_LAUNCHED(name) TREX_CUDA_CHECK(cudaGetLastError())
