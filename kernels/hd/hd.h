// TREX_HD marks math that both the CPU reference (kernels/ref) and the CUDA kernels
// (kernels/cuda) call: __host__ __device__ under nvcc, plain inline C++ elsewhere. The op harness
// runs these functions on the CPU, so a CUDA kernel built on them can differ from the reference
// only in how it walks the data (launch, indexing, reduction order), not in its arithmetic.
#pragma once
#include <cmath>

#if defined(__CUDACC__)
#define TREX_HD __host__ __device__ __forceinline__
#else
#define TREX_HD inline
#endif
