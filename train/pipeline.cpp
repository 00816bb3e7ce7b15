// Pipeline parallel: the 1F1B schedule and the pipelined forward. See pipeline.h.
#include "train/pipeline.h"

#include <algorithm>
#include <deque>
#include "core/error.h"
#include "core/timer.h"

namespace trex::train {

namespace {

constexpr int kTagAct = 4101, kTagGrad = 4102;  // activations go forward, their gradients back

// Sends in flight with the buffers they read; a buffer lives until its send completes.
struct Outbox {
  std::deque<std::pair<parallel::Handle, std::vector<float>>> q;
  void send(parallel::Communicator& c, std::vector<float>&& buf, int dst, int tag) {
    q.emplace_back(parallel::Handle{}, std::move(buf));
    q.back().first = c.isend(q.back().second.data(), q.back().second.size(), DType::F32, dst, tag);
    while (!q.empty() && q.front().first.test()) q.pop_front();  // drop the finished ones
  }
  void drain() {
    for (auto& [h, buf] : q) h.wait();
    q.clear();
  }
};

void recv(parallel::Communicator& c, std::vector<float>& buf, int src, int tag, double* wait_ms) {
  const double t0 = now_ms();
  c.recv(buf.data(), buf.size(), DType::F32, src, tag);
  if (wait_ms) *wait_ms += now_ms() - t0;
}

}  // namespace

std::vector<model::LossParts> pipeline_step(model::Model& m, parallel::Communicator& pp,
                                            const std::vector<model::Batch>& micro, const std::vector<float>& scale,
                                            const std::function<void(bool last)>& before,
                                            const std::function<void(bool last)>& after, double* wait_ms) {
  const int s = pp.rank(), P = pp.size();
  const model::PipelineStage& st = m.pipeline_stage();
  TREX_CHECK(st.first == (s == 0) && st.last == (s == P - 1), "pipeline_step: rank ", s, " of ", P,
             " holds a model stage with first = ", st.first, ", last = ", st.last);
  const int64_t n = (int64_t)micro.size();
  TREX_CHECK(scale.size() == micro.size(), "pipeline_step: ", scale.size(), " scales for ", n, " micro-batches");
  std::vector<model::LossParts> out(n);
  std::vector<std::vector<float>> x_in(n);  // stage inputs of the micro-batches in flight
  Outbox outbox;
  auto io_floats = [&](int64_t k) { return (size_t)m.stage_io_floats(micro[k].B * micro[k].T); };

  auto forward = [&](int64_t k) {
    if (!st.first) {
      x_in[k].resize(io_floats(k));
      recv(pp, x_in[k], s - 1, kTagAct, wait_ms);
    }
    if (st.last) return;  // the last stage runs its forward inside the backward
    std::vector<float> y(io_floats(k));
    model::StageIO io;
    io.x_in = st.first ? nullptr : x_in[k].data();
    io.x_out = y.data();
    io.count = false;  // counted once, by the backward's forward
    m.stage_forward(micro[k], io);
    outbox.send(pp, std::move(y), s + 1, kTagAct);
  };
  auto backward = [&](int64_t k) {
    std::vector<float> dy, dx;
    if (!st.last) {
      dy.resize(io_floats(k));
      recv(pp, dy, s + 1, kTagGrad, wait_ms);
    }
    if (!st.first) dx.resize(io_floats(k));
    model::StageIO io;
    io.x_in = st.first ? nullptr : x_in[k].data();
    io.dy = st.last ? nullptr : dy.data();
    io.dx_in = st.first ? nullptr : dx.data();
    const bool last = k + 1 == n;
    if (before) before(last);
    out[k] = m.stage_forward_backward(micro[k], io, scale[k]);
    if (after) after(last);
    std::vector<float>().swap(x_in[k]);
    if (!st.first) outbox.send(pp, std::move(dx), s - 1, kTagGrad);
  };

  const int64_t warm = std::min<int64_t>(P - s - 1, n);
  for (int64_t k = 0; k < warm; ++k) forward(k);
  for (int64_t k = 0; k < n - warm; ++k) {
    forward(warm + k);
    backward(k);
  }
  for (int64_t k = n - warm; k < n; ++k) backward(k);
  outbox.drain();
  return out;
}

model::LossParts pipeline_forward(model::Model& m, parallel::Communicator& pp, const model::Batch& b,
                                  double* wait_ms) {
  const int s = pp.rank();
  const model::PipelineStage& st = m.pipeline_stage();
  const size_t nf = (size_t)m.stage_io_floats(b.B * b.T);
  std::vector<float> x, y;
  model::StageIO io;
  if (!st.first) {
    x.resize(nf);
    recv(pp, x, s - 1, kTagAct, wait_ms);
    io.x_in = x.data();
  }
  if (!st.last) {
    y.resize(nf);
    io.x_out = y.data();
  }
  const model::LossParts lp = m.stage_forward(b, io);
  if (!st.last) pp.send(y.data(), nf, DType::F32, s + 1, kTagAct);
  return lp;
}

}  // namespace trex::train
