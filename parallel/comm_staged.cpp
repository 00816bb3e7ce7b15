// StagedComm: device buffers through host staging buffers and a host communicator. See
// comm_staged.h.
#include "parallel/comm_staged.h"

#include <algorithm>
#include <cstdlib>
#include <vector>
#include "core/error.h"

namespace trex::parallel {

namespace {

// One staged operation in flight: the host operation, its staging buffer, and the ranges copied
// back to the device once it completes.
class StagedRequest final : public Request {
 public:
  struct Out {
    void* dev;        // destination in the backend's memory
    size_t host_off;  // bytes into the staging buffer
    size_t bytes;
  };
  StagedRequest(kern::Backend& be, std::vector<char> stage) : be_(be), stage_(std::move(stage)) {}
  char* host() { return stage_.data(); }
  void start(Handle h) { h_ = std::move(h); }
  void copy_back(void* dev, size_t host_off, size_t bytes) {
    if (bytes) out_.push_back({dev, host_off, bytes});
  }
  void wait() override {
    h_.wait();
    finish();
  }
  bool test() override {
    if (!h_.test()) return false;
    finish();
    return true;
  }

 private:
  void finish() {
    if (done_) return;
    done_ = true;
    for (const Out& o : out_) be_.to_device(o.dev, stage_.data() + o.host_off, o.bytes);
    if (!out_.empty()) {  // the staging buffer must outlive the copies
      kern::Event e = be_.record();
      be_.sync(e);
      be_.delete_event(e);
    }
  }
  kern::Backend& be_;
  std::vector<char> stage_;
  Handle h_;
  std::vector<Out> out_;
  bool done_ = false;
};

// A staging buffer of `bytes` (zero-filled) for one operation.
std::unique_ptr<StagedRequest> stage(kern::Backend& be, size_t bytes) {
  return std::make_unique<StagedRequest>(be, std::vector<char>(std::max<size_t>(bytes, 1)));
}

// Fills [off, off + n) of the staging buffer from device memory src.
void fetch(kern::Backend& be, StagedRequest& r, size_t off, const void* src, size_t n) {
  if (n) be.to_host(r.host() + off, src, n);
}

}  // namespace

void StagedComm::barrier() {
  be_.synchronize();
  host_->barrier();
}

void StagedComm::abort_job(int code) {
  host_->abort_job(code);
  std::abort();  // (abort_job does not return)
}

std::unique_ptr<Communicator> StagedComm::split(int color, int key) {
  std::unique_ptr<Communicator> h = host_->split(color, key);
  if (!h) return nullptr;
  return std::make_unique<StagedComm>(std::move(h), be_);
}

Handle StagedComm::do_iall_reduce(const void* send, void* recv, size_t count, DType t, ReduceOp op) {
  const size_t n = count * dtype_size(t);
  auto r = stage(be_, n);
  fetch(be_, *r, 0, send, n);
  r->start(host_->iall_reduce(r->host(), r->host(), count, t, op));
  r->copy_back(recv, 0, n);
  return Handle(std::move(r));
}

Handle StagedComm::do_ireduce_scatter(const void* send, void* recv, size_t count, DType t, ReduceOp op) {
  const size_t n = count * dtype_size(t), me = (size_t)rank() * n;
  auto r = stage(be_, n * (size_t)size());
  fetch(be_, *r, 0, send, n * (size_t)size());
  r->start(host_->ireduce_scatter(r->host(), r->host() + me, count, t, op));  // in place on the host
  r->copy_back(recv, me, n);
  return Handle(std::move(r));
}

Handle StagedComm::do_iall_gather(const void* send, void* recv, size_t count, DType t) {
  const size_t n = count * dtype_size(t), me = (size_t)rank() * n;
  auto r = stage(be_, n * (size_t)size());
  fetch(be_, *r, me, send, n);
  r->start(host_->iall_gather(r->host() + me, r->host(), count, t));  // in place on the host
  r->copy_back(recv, 0, n * (size_t)size());
  return Handle(std::move(r));
}

Handle StagedComm::do_iall_to_all_v(const void* send, std::span<const size_t> send_counts,
                                    std::span<const size_t> send_displs, void* recv,
                                    std::span<const size_t> recv_counts, std::span<const size_t> recv_displs,
                                    DType t) {
  const size_t es = dtype_size(t);
  size_t send_end = 0, recv_end = 0;
  for (size_t i = 0; i < send_counts.size(); ++i) {
    if (send_counts[i]) send_end = std::max(send_end, send_displs[i] + send_counts[i]);
    if (recv_counts[i]) recv_end = std::max(recv_end, recv_displs[i] + recv_counts[i]);
  }
  // Staging: the send extent, then the receive extent.
  const size_t rb = send_end * es;
  auto r = stage(be_, rb + recv_end * es);
  for (size_t i = 0; i < send_counts.size(); ++i)  // only the ranges that are sent
    fetch(be_, *r, send_displs[i] * es, static_cast<const char*>(send) + send_displs[i] * es, send_counts[i] * es);
  r->start(host_->iall_to_all_v(r->host(), send_counts, send_displs, r->host() + rb, recv_counts, recv_displs, t));
  for (size_t i = 0; i < recv_counts.size(); ++i)  // only the ranges that are received
    r->copy_back(static_cast<char*>(recv) + recv_displs[i] * es, rb + recv_displs[i] * es, recv_counts[i] * es);
  return Handle(std::move(r));
}

Handle StagedComm::do_ibroadcast(void* buf, size_t count, DType t, int root) {
  const size_t n = count * dtype_size(t);
  auto r = stage(be_, n);
  if (rank() == root) fetch(be_, *r, 0, buf, n);
  r->start(host_->ibroadcast(r->host(), count, t, root));
  if (rank() != root) r->copy_back(buf, 0, n);
  return Handle(std::move(r));
}

Handle StagedComm::do_isend(const void* buf, size_t count, DType t, int dst, int tag) {
  const size_t n = count * dtype_size(t);
  auto r = stage(be_, n);
  fetch(be_, *r, 0, buf, n);
  r->start(host_->isend(r->host(), count, t, dst, tag));
  return Handle(std::move(r));
}

Handle StagedComm::do_irecv(void* buf, size_t count, DType t, int src, int tag) {
  const size_t n = count * dtype_size(t);
  auto r = stage(be_, n);
  r->start(host_->irecv(r->host(), count, t, src, tag));
  r->copy_back(buf, 0, n);
  return Handle(std::move(r));
}

}  // namespace trex::parallel
