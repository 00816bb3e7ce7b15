// The row operations of kernels/rows.h on CUDA. Every sum keeps the order the CPU functions use
// (over r, h or k in ascending order per output element; the combine's dot in double through a
// fixed block reduction), so the results are deterministic run to run.
#include <cuda_bf16.h>
#include "kernels/cuda/check.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"

namespace trex::kern::cuda {

namespace {

__global__ void add_k(float* __restrict__ y, const float* __restrict__ x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] += x[i];
}

__global__ void to_bf16_k(const float* __restrict__ x, int64_t ldx, int64_t rows, int64_t cols,
                          __nv_bfloat16* __restrict__ y) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, j = i - r * cols;
    y[i] = __float2bfloat16_rn(x[r * ldx + j]);
  }
}

// One block row per output row (grid-stride over rows), threads over the row; T: float, or the
// 16-bit words of bf16 rows.
template <class T>
__global__ void gather_rows_k(const T* __restrict__ src, const int32_t* __restrict__ idx, int64_t R, int64_t d,
                              T* __restrict__ dst) {
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const T* s = src + (int64_t)idx[r] * d;
    T* o = dst + r * d;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) o[j] = s[j];
  }
}

// One thread per column: the rows are added in ascending r, as on the CPU.
__global__ void scatter_add_rows_k(const float* __restrict__ src, const int32_t* __restrict__ idx, int64_t R, int64_t d,
                                   float* __restrict__ dst) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < d; j += int64_t(gridDim.x) * blockDim.x)
    for (int64_t r = 0; r < R; ++r) dst[(int64_t)idx[r] * d + j] += src[r * d + j];
}

__global__ void sum_heads_k(const float* __restrict__ x, int64_t N, int64_t H, int64_t ldn, int64_t ldh, int64_t w,
                            float* __restrict__ y, int64_t ldy) {
  const int64_t n_all = N * w;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n_all; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / w, j = i - n * w;
    float s = 0.f;
    for (int64_t h = 0; h < H; ++h) s += x[n * ldn + h * ldh + j];
    y[n * ldy + j] = s;
  }
}

__global__ void moe_combine_k(const float* __restrict__ y, const float* __restrict__ probs,
                              const int32_t* __restrict__ slot_row, int64_t N, int64_t K, int64_t d,
                              float* __restrict__ out) {
  const int64_t n_all = N * d;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n_all; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / d, j = i - n * d;
    float o = out[i];
    for (int64_t k = 0; k < K; ++k) o += probs[n * K + k] * y[(int64_t)slot_row[n * K + k] * d + j];
    out[i] = o;
  }
}

// dy rows = p dout[n], one element a thread.
__global__ void moe_combine_bwd_k(const float* __restrict__ dout, const float* __restrict__ probs,
                                  const int32_t* __restrict__ slot_row, int64_t N, int64_t K, int64_t d,
                                  float* __restrict__ dy) {
  const int64_t n_all = N * K * d;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n_all; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t s = i / d, j = i - s * d;
    dy[(int64_t)slot_row[s] * d + j] = probs[s] * dout[(s / K) * d + j];
  }
}

__global__ void moe_probs_bwd_k(const double* __restrict__ q, const float* __restrict__ probs,
                                const int32_t* __restrict__ slot_row, int64_t R, float* __restrict__ dprobs) {
  for (int64_t s = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; s < R; s += int64_t(gridDim.x) * blockDim.x)
    dprobs[s] = probs[s] != 0.f ? (float)(q[slot_row[s]] / probs[s]) : 0.f;
}

// One block per row: out[r] = a[r] . b[r] in double.
__global__ void row_dot_k(const float* __restrict__ a, const float* __restrict__ b, int64_t R, int64_t w,
                          double* __restrict__ out) {
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    double dot = 0;
    for (int64_t j = threadIdx.x; j < w; j += blockDim.x) dot += (double)a[r * w + j] * b[r * w + j];
    dot = block_sum(dot);
    if (threadIdx.x == 0) out[r] = dot;
  }
}

__global__ void moe_dispatch_bwd_k(const float* __restrict__ dxs, const int32_t* __restrict__ slot_row, int64_t N,
                                   int64_t K, int64_t d, float* __restrict__ dx) {
  const int64_t n_all = N * d;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n_all; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / d, j = i - n * d;
    float o = dx[i];
    for (int64_t k = 0; k < K; ++k) o += dxs[(int64_t)slot_row[n * K + k] * d + j];
    dx[i] = o;
  }
}

int row_blocks(int64_t rows) { return static_cast<int>(rows < 1 ? 1 : (rows > 65535 * 8 ? 65535 * 8 : rows)); }

}  // namespace

void copy_rows(const Ctx& c, void* dst, int64_t ldd, const void* src, int64_t lds, int64_t row_bytes, int64_t rows) {
  if (row_bytes <= 0 || rows <= 0) return;
  TREX_CUDA_CHECK(cudaMemcpy2DAsync(dst, (size_t)ldd, src, (size_t)lds, (size_t)row_bytes, (size_t)rows,
                                    cudaMemcpyDeviceToDevice, c.stream));
}

void add(const Ctx& c, float* y, const float* x, int64_t n) {
  if (n <= 0) return;
  add_k<<<grid_for(n), 256, 0, c.stream>>>(y, x, n);
  TREX_CUDA_LAUNCHED("add");
}

void to_bf16(const Ctx& c, const float* x, int64_t ldx, int64_t rows, int64_t cols, bf16* y) {
  if (rows <= 0 || cols <= 0) return;
  to_bf16_k<<<grid_for(rows * cols), 256, 0, c.stream>>>(x, ldx, rows, cols, reinterpret_cast<__nv_bfloat16*>(y));
  TREX_CUDA_LAUNCHED("to_bf16");
}

void gather_rows(const Ctx& c, const float* src, const int32_t* idx, int64_t R, int64_t d, float* dst) {
  if (R <= 0 || d <= 0) return;
  gather_rows_k<float><<<row_blocks(R), 128, 0, c.stream>>>(src, idx, R, d, dst);
  TREX_CUDA_LAUNCHED("gather_rows");
}

void gather_rows_bf16(const Ctx& c, const bf16* src, const int32_t* idx, int64_t R, int64_t d, bf16* dst) {
  if (R <= 0 || d <= 0) return;
  gather_rows_k<uint16_t><<<row_blocks(R), 128, 0, c.stream>>>(reinterpret_cast<const uint16_t*>(src), idx, R, d,
                                                                 reinterpret_cast<uint16_t*>(dst));
  TREX_CUDA_LAUNCHED("gather_rows_bf16");
}

void scatter_add_rows(const Ctx& c, const float* src, const int32_t* idx, int64_t R, int64_t d, float* dst) {
  if (R <= 0 || d <= 0) return;
  scatter_add_rows_k<<<grid_for(d, 64), 64, 0, c.stream>>>(src, idx, R, d, dst);
  TREX_CUDA_LAUNCHED("scatter_add_rows");
}

void sum_heads(const Ctx& c, const float* x, int64_t N, int64_t H, int64_t ldn, int64_t ldh, int64_t w, float* y,
               int64_t ldy) {
  if (N <= 0 || w <= 0) return;
  sum_heads_k<<<grid_for(N * w), 256, 0, c.stream>>>(x, N, H, ldn, ldh, w, y, ldy);
  TREX_CUDA_LAUNCHED("sum_heads");
}

void moe_combine(const Ctx& c, const float* y, const float* probs, const int32_t* slot_row, int64_t N, int64_t K,
                 int64_t d, float* out) {
  if (N <= 0 || d <= 0) return;
  moe_combine_k<<<grid_for(N * d), 256, 0, c.stream>>>(y, probs, slot_row, N, K, d, out);
  TREX_CUDA_LAUNCHED("moe_combine");
}

void moe_combine_bwd(const Ctx& c, const float* dout, const float* probs, const int32_t* slot_row, int64_t N,
                     int64_t K, int64_t d, float* dy) {
  if (N <= 0 || K <= 0 || d <= 0) return;
  moe_combine_bwd_k<<<grid_for(N * K * d), 256, 0, c.stream>>>(dout, probs, slot_row, N, K, d, dy);
  TREX_CUDA_LAUNCHED("moe_combine_bwd");
}

void moe_probs_bwd(const Ctx& c, const double* q, const float* probs, const int32_t* slot_row, int64_t N, int64_t K,
                   float* dprobs) {
  if (N <= 0 || K <= 0) return;
  moe_probs_bwd_k<<<grid_for(N * K), 256, 0, c.stream>>>(q, probs, slot_row, N * K, dprobs);
  TREX_CUDA_LAUNCHED("moe_probs_bwd");
}

void row_dot(const Ctx& c, const float* a, const float* b, int64_t R, int64_t w, double* out) {
  if (R <= 0) return;
  row_dot_k<<<row_blocks(R), 128, 0, c.stream>>>(a, b, R, w, out);
  TREX_CUDA_LAUNCHED("row_dot");
}

void moe_dispatch_bwd(const Ctx& c, const float* dxs, const int32_t* slot_row, int64_t N, int64_t K, int64_t d,
                      float* dx) {
  if (N <= 0 || d <= 0) return;
  moe_dispatch_bwd_k<<<grid_for(N * d), 256, 0, c.stream>>>(dxs, slot_row, N, K, d, dx);
  TREX_CUDA_LAUNCHED("moe_dispatch_bwd");
}

}  // namespace trex::kern::cuda
