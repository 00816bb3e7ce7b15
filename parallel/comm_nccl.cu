// NcclComm: Communicator over NCCL (device memory). See comm_nccl.h. Compiled with nvcc when
// TREX_CUDA is on; the two small kernels widen / narrow bf16 for f32-accumulated reductions.
#include "parallel/comm_nccl.h"

#if TREX_WITH_NCCL
#include <cuda_bf16.h>

#include <algorithm>

#include "core/error.h"

#define TREX_CHECK_CUDA(call)                                                            \
  do {                                                                                   \
    cudaError_t trex_cuda_e_ = (call);                                                   \
    if (trex_cuda_e_ != cudaSuccess) [[unlikely]]                                        \
      TREX_FAIL("CUDA call failed: ", #call, ": ", cudaGetErrorName(trex_cuda_e_), ": ", \
                cudaGetErrorString(trex_cuda_e_));                                       \
  } while (0)
#define TREX_CHECK_NCCL(call)                                                         \
  do {                                                                                \
    ncclResult_t trex_nccl_r_ = (call);                                               \
    if (trex_nccl_r_ != ncclSuccess) [[unlikely]]                                     \
      TREX_FAIL("NCCL call failed: ", #call, ": ", ncclGetErrorString(trex_nccl_r_)); \
  } while (0)

namespace trex::parallel {

namespace {

__global__ void widen_kernel(const __nv_bfloat16* __restrict__ src, float* __restrict__ dst, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    dst[i] = __bfloat162float(src[i]);
}
__global__ void narrow_kernel(const float* __restrict__ src, __nv_bfloat16* __restrict__ dst, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    dst[i] = __float2bfloat16_rn(src[i]);
}
unsigned grid_for(size_t n) { return static_cast<unsigned>(std::min<size_t>((n + 255) / 256, 4096)); }

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32:
      return ncclFloat32;
    case DType::F64:
      return ncclFloat64;
    case DType::BF16:
      return ncclBfloat16;
    case DType::I32:
      return ncclInt32;
    case DType::I64:
      return ncclInt64;
    case DType::U8:
      return ncclUint8;
    default:
      TREX_FAIL("no NCCL type for ", dtype_name(t));
  }
}
ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::Sum ? ncclSum : ncclMax; }

class NcclRequest final : public Request {
 public:
  NcclRequest(cudaEvent_t ev, ncclComm_t comm) : ev_(ev), comm_(comm) {}
  ~NcclRequest() override { cudaEventDestroy(ev_); }
  void wait() override {
    TREX_CHECK_CUDA(cudaEventSynchronize(ev_));
    check_async();
  }
  bool test() override {
    cudaError_t e = cudaEventQuery(ev_);
    if (e == cudaErrorNotReady) {
      check_async();
      return false;
    }
    TREX_CHECK_CUDA(e);
    check_async();
    return true;
  }

 private:
  void check_async() {
    ncclResult_t r = ncclSuccess;
    TREX_CHECK_NCCL(ncclCommGetAsyncError(comm_, &r));
    TREX_CHECK(r == ncclSuccess, "NCCL asynchronous error: ", ncclGetErrorString(r), ": ", ncclGetLastError(comm_));
  }
  cudaEvent_t ev_;
  ncclComm_t comm_;
};

// A stream-ordered f32 copy of n bf16 values (freed stream-ordered by release()).
float* widen_to_stage(const void* src, size_t n, cudaStream_t s) {
  float* stage = nullptr;
  TREX_CHECK_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&stage), n * sizeof(float), s));
  widen_kernel<<<grid_for(n), 256, 0, s>>>(static_cast<const __nv_bfloat16*>(src), stage, n);
  TREX_CHECK_CUDA(cudaGetLastError());
  return stage;
}
void narrow_and_release(float* stage, size_t offset, void* dst, size_t n, cudaStream_t s) {
  narrow_kernel<<<grid_for(n), 256, 0, s>>>(stage + offset, static_cast<__nv_bfloat16*>(dst), n);
  TREX_CHECK_CUDA(cudaGetLastError());
  TREX_CHECK_CUDA(cudaFreeAsync(stage, s));
}

}  // namespace

std::unique_ptr<NcclComm> NcclComm::create(Communicator& bootstrap, int device, cudaStream_t stream) {
  TREX_CHECK_CUDA(cudaSetDevice(device));
  ncclUniqueId id{};
  if (bootstrap.rank() == 0) TREX_CHECK_NCCL(ncclGetUniqueId(&id));
  bootstrap.broadcast(reinterpret_cast<uint8_t*>(id.internal), sizeof id.internal, 0);
  ncclComm_t comm = nullptr;
  TREX_CHECK_NCCL(ncclCommInitRank(&comm, bootstrap.size(), id, bootstrap.rank()));
  return std::make_unique<NcclComm>(comm, device, stream);
}

std::unique_ptr<Communicator> make_nccl_comm(Communicator& bootstrap, kern::Stream stream) {
  int device = 0;
  TREX_CHECK_CUDA(cudaGetDevice(&device));
  return NcclComm::create(bootstrap, device, reinterpret_cast<cudaStream_t>(stream));
}

NcclComm::NcclComm(ncclComm_t comm, int device, cudaStream_t stream) : comm_(comm), device_(device), stream_(stream) {
  TREX_CHECK(comm_ != nullptr, "NcclComm needs a communicator");
  TREX_CHECK_CUDA(cudaSetDevice(device_));
  TREX_CHECK_NCCL(ncclCommUserRank(comm_, &rank_));
  TREX_CHECK_NCCL(ncclCommCount(comm_, &size_));
  if (!stream_) {
    TREX_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    own_stream_ = true;
  }
  TREX_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&scratch_), sizeof(int32_t)));
}

NcclComm::~NcclComm() {
  cudaStreamSynchronize(stream_);
  ncclCommDestroy(comm_);
  cudaFree(scratch_);
  if (own_stream_) cudaStreamDestroy(stream_);
}

Handle NcclComm::record() {
  cudaEvent_t ev;
  TREX_CHECK_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  TREX_CHECK_CUDA(cudaEventRecord(ev, stream_));
  return Handle(std::make_unique<NcclRequest>(ev, comm_));
}

void NcclComm::barrier() {
  TREX_CHECK_NCCL(ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_, stream_));
  TREX_CHECK_CUDA(cudaStreamSynchronize(stream_));
}

std::unique_ptr<Communicator> NcclComm::split(int color, int key) {
  ncclComm_t nc = nullptr;
  TREX_CHECK_NCCL(ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &nc, nullptr));
  if (!nc) return nullptr;
  return std::make_unique<NcclComm>(nc, device_, nullptr);
}

Handle NcclComm::do_iall_reduce(const void* send, void* recv, size_t count, DType t, ReduceOp op) {
  if (count == 0) return Handle();
  if (t == DType::BF16) {
    float* st = widen_to_stage(send, count, stream_);
    TREX_CHECK_NCCL(ncclAllReduce(st, st, count, ncclFloat32, nccl_op(op), comm_, stream_));
    narrow_and_release(st, 0, recv, count, stream_);
  } else {
    TREX_CHECK_NCCL(ncclAllReduce(send, recv, count, nccl_type(t), nccl_op(op), comm_, stream_));
  }
  return record();
}

Handle NcclComm::do_ireduce_scatter(const void* send, void* recv, size_t count, DType t, ReduceOp op) {
  if (count == 0) return Handle();
  if (t == DType::BF16) {
    float* st = widen_to_stage(send, count * size_, stream_);
    TREX_CHECK_NCCL(ncclReduceScatter(st, st + rank_ * count, count, ncclFloat32, nccl_op(op), comm_, stream_));
    narrow_and_release(st, rank_ * count, recv, count, stream_);
  } else {
    TREX_CHECK_NCCL(ncclReduceScatter(send, recv, count, nccl_type(t), nccl_op(op), comm_, stream_));
  }
  return record();
}

Handle NcclComm::do_iall_gather(const void* send, void* recv, size_t count, DType t) {
  if (count == 0) return Handle();
  TREX_CHECK_NCCL(ncclAllGather(send, recv, count, nccl_type(t), comm_, stream_));
  return record();
}

Handle NcclComm::do_iall_to_all_v(const void* send, std::span<const size_t> send_counts,
                                  std::span<const size_t> send_displs, void* recv, std::span<const size_t> recv_counts,
                                  std::span<const size_t> recv_displs, DType t) {
  const size_t es = dtype_size(t);
  TREX_CHECK_NCCL(ncclGroupStart());
  for (int r = 0; r < size_; ++r) {
    if (send_counts[r])
      TREX_CHECK_NCCL(ncclSend(static_cast<const char*>(send) + send_displs[r] * es, send_counts[r], nccl_type(t), r,
                               comm_, stream_));
    if (recv_counts[r])
      TREX_CHECK_NCCL(
          ncclRecv(static_cast<char*>(recv) + recv_displs[r] * es, recv_counts[r], nccl_type(t), r, comm_, stream_));
  }
  TREX_CHECK_NCCL(ncclGroupEnd());
  return record();
}

Handle NcclComm::do_ibroadcast(void* buf, size_t count, DType t, int root) {
  if (count == 0) return Handle();
  TREX_CHECK_NCCL(ncclBroadcast(buf, buf, count, nccl_type(t), root, comm_, stream_));
  return record();
}

Handle NcclComm::do_isend(const void* buf, size_t count, DType t, int dst, int tag) {
  TREX_CHECK(tag >= 0, "send tag ", tag, " must be >= 0");
  TREX_CHECK_NCCL(ncclSend(buf, count, nccl_type(t), dst, comm_, stream_));
  return record();
}

Handle NcclComm::do_irecv(void* buf, size_t count, DType t, int src, int tag) {
  TREX_CHECK(tag >= 0, "recv tag ", tag, " must be >= 0");
  TREX_CHECK_NCCL(ncclRecv(buf, count, nccl_type(t), src, comm_, stream_));
  return record();
}

}  // namespace trex::parallel
#endif  // TREX_WITH_NCCL
