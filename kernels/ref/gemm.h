// Scalar reference GEMM (the canonical definition of kernels/gemm.h), row-major:
//   C[i,j] = alpha * sum_k opA[i,k] * opB[k,j] + beta * C[i,j]
//   opA[i,k] = ta ? A[k*lda + i] : A[i*lda + k]      opB[k,j] = tb ? B[j*ldb + k] : B[k*ldb + j]
// beta == 0 overwrites C without reading it (BLAS semantics). Inputs may be float, double or
// bf16 (widened exactly); the sum is formed in T.
#pragma once
#include <cstdint>
#include <type_traits>
#include "core/dtype.h"

namespace trex::kern::ref {

template <class T, class S>
inline T widen(S x) {
  if constexpr (std::is_same_v<S, bf16>) return static_cast<T>(bf16_to_f32(x));
  else return static_cast<T>(x);
}

// A: op(A) [M, K]  B: op(B) [K, N]  C: [M, N]
template <class T, class TA, class TB, class TC>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const TA* A, int64_t lda, const TB* B,
          int64_t ldb, T beta, TC* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      T acc = 0;
      for (int64_t k = 0; k < K; ++k) {
        T a = widen<T>(ta ? A[k * lda + i] : A[i * lda + k]);
        T b = widen<T>(tb ? B[j * ldb + k] : B[k * ldb + j]);
        acc += a * b;
      }
      T c = alpha * acc;
      if (beta != T(0)) c += beta * static_cast<T>(C[i * ldc + j]);
      C[i * ldc + j] = static_cast<TC>(c);
    }
}

}  // namespace trex::kern::ref
