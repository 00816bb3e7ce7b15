// Communicator over MPI: every collective (blocking and async) against values computed locally
// from each rank's deterministic inputs; bf16 sums in f32; all_to_all_v with uneven and zero
// counts; sub-communicators from ParallelDims groups; count splitting; MPI errors.
// Run on 2 and 3 ranks (see main.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <thread>
#include <vector>

#include "parallel/comm_mpi.h"
#include "parallel/dims.h"

namespace trex::parallel {
Communicator& test_world();
const MpiContext& test_mpi_context();
}  // namespace trex::parallel

using namespace trex;
using namespace trex::parallel;

// ASSERT_EQ for a checking loop in a collective test: on a mismatch it records the failure and
// leaves the loop only. An early return on one rank would skip the collectives that follow and
// leave the other ranks waiting in them.
#define EXPECT_EQ_OR_BREAK(a, b, msg) \
  if (!((a) == (b))) {                \
    EXPECT_EQ(a, b) << msg;           \
    break;                            \
  }

namespace {

// Small integers: exact in every type and in f32 sums.
double val(int rank, size_t i) {
  return static_cast<double>((rank + 1) * static_cast<int>(i % 7) + static_cast<int>(i % 5));
}

template <class T>
T to(double v) {
  if constexpr (std::is_same_v<T, bf16>)
    return f32_to_bf16(static_cast<float>(v));
  else
    return static_cast<T>(v);
}
template <class T>
double from(T v) {
  if constexpr (std::is_same_v<T, bf16>)
    return bf16_to_f32(v);
  else
    return static_cast<double>(v);
}

template <class T>
std::vector<T> inputs(int rank, size_t n, size_t offset = 0) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = to<T>(val(rank, i + offset));
  return v;
}

double reduce_local(int n_ranks, size_t i, ReduceOp op) {
  double acc = val(0, i);
  for (int r = 1; r < n_ranks; ++r) acc = op == ReduceOp::Sum ? acc + val(r, i) : std::max(acc, val(r, i));
  return acc;
}

template <class T>
void check_all_reduce(Communicator& c, size_t n, ReduceOp op, bool in_place, bool async) {
  SCOPED_TRACE(testing::Message() << dtype_name(dtype_of<T>()) << " n " << n << (in_place ? " in-place" : "")
                                  << (async ? " async" : ""));
  std::vector<T> x = inputs<T>(c.rank(), n), y(n, to<T>(-99));
  T* out = in_place ? x.data() : y.data();
  if (async) {
    Handle h = c.iall_reduce(x.data(), out, n, dtype_of<T>(), op);
    while (!h.test()) {
    }
    EXPECT_FALSE(h.pending());
  } else {
    c.all_reduce(x.data(), out, n, dtype_of<T>(), op);
  }
  for (size_t i = 0; i < n; ++i) {
    double want = reduce_local(c.size(), i, op);
    if constexpr (std::is_same_v<T, uint8_t>) want = static_cast<uint8_t>(want);  // wraps like the type
    ASSERT_EQ(from(out[i]), from(to<T>(want))) << "element " << i;
  }
}

}  // namespace

TEST(Comm, ContextAndWorld) {
  Communicator& w = test_world();
  EXPECT_GE(w.size(), 2) << "run under mpirun -np 2 or more";
  EXPECT_EQ(w.size(), test_mpi_context().world_size());
  EXPECT_EQ(w.rank(), test_mpi_context().world_rank());
  EXPECT_GE(static_cast<int>(test_mpi_context().provided()), static_cast<int>(ThreadLevel::Serialized));
  EXPECT_EQ(w.backend(), "mpi");
}

TEST(Comm, AllReduceEveryTypeSyncAndAsync) {
  Communicator& w = test_world();
  for (size_t n : {size_t{1}, size_t{37}, size_t{1000}})
    for (bool in_place : {false, true})
      for (bool async : {false, true})
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
          check_all_reduce<float>(w, n, op, in_place, async);
          check_all_reduce<double>(w, n, op, in_place, async);
          check_all_reduce<bf16>(w, n, op, in_place, async);
          check_all_reduce<int32_t>(w, n, op, in_place, async);
          check_all_reduce<int64_t>(w, n, op, in_place, async);
          check_all_reduce<uint8_t>(w, n, op, in_place, async);
        }
  EXPECT_EQ(w.all_reduce_value(int64_t{w.rank()}, ReduceOp::Max), w.size() - 1);
}

TEST(Comm, Bf16SumIsAccumulatedInF32) {
  // Rank 0 gives 256, the others 1: in f32 the sum is 256 + (n - 1), rounded once to bf16
  // (spacing 2 at 256). Summing pairwise in bf16 would give 256 at every step.
  Communicator& w = test_world();
  std::vector<bf16> x(5, f32_to_bf16(w.rank() == 0 ? 256.f : 1.f));
  x[1] = f32_to_bf16(w.rank() == 0 ? 1.f : 1.f / 128);  // 1 + (n-1)/128: exact in f32, rounded once
  w.all_reduce(x.data(), x.size());
  const float n1 = static_cast<float>(w.size() - 1);
  EXPECT_EQ(bf16_to_f32(x[0]), round_bf16(256.f + n1));
  EXPECT_EQ(bf16_to_f32(x[1]), round_bf16(1.f + n1 / 128));
  if (w.size() == 3) {  // 256 + 1 + 1: pairwise bf16 sums would stay at 256
    EXPECT_EQ(bf16_to_f32(x[0]), 258.f);
  }
}

TEST(Comm, ManyAsyncInFlight) {
  Communicator& w = test_world();
  const size_t n = 4099;
  std::vector<std::vector<float>> bufs;
  std::vector<Handle> hs;
  for (int k = 0; k < 6; ++k) bufs.push_back(inputs<float>(w.rank(), n, k));
  for (int k = 0; k < 6; ++k) hs.push_back(w.iall_reduce(bufs[k].data(), n));
  for (int k = 5; k >= 0; --k) hs[k].wait();  // out of start order
  for (int k = 0; k < 6; ++k)
    for (size_t i = 0; i < n; i += 97)
      EXPECT_EQ_OR_BREAK(bufs[k][i], reduce_local(w.size(), i + k, ReduceOp::Sum), "buffer " << k << " element " << i);
  // A dropped handle completes in its destructor.
  std::vector<float> d = inputs<float>(w.rank(), 10);
  { Handle h = w.iall_reduce(d.data(), d.size()); }
  EXPECT_EQ(d[3], reduce_local(w.size(), 3, ReduceOp::Sum));
  Handle empty;
  EXPECT_TRUE(empty.test());
  empty.wait();
}

template <class T>
void check_reduce_scatter(Communicator& c, size_t count, bool in_place, bool async) {
  SCOPED_TRACE(testing::Message() << dtype_name(dtype_of<T>()) << " count " << count << (in_place ? " in-place" : "")
                                  << (async ? " async" : ""));
  const size_t n = count * c.size();
  std::vector<T> x = inputs<T>(c.rank(), n), y(count, to<T>(-1));
  T* out = in_place ? x.data() + c.rank() * count : y.data();
  if (async) {
    Handle h = c.ireduce_scatter(x.data(), out, count, dtype_of<T>(), ReduceOp::Sum);
    while (!h.test()) {
    }
  } else {
    c.reduce_scatter(x.data(), out, count, dtype_of<T>(), ReduceOp::Sum);
  }
  for (size_t i = 0; i < count; ++i)
    ASSERT_EQ(from(out[i]), from(to<T>(reduce_local(c.size(), c.rank() * count + i, ReduceOp::Sum)))) << i;
}

TEST(Comm, ReduceScatter) {
  Communicator& w = test_world();
  for (size_t count : {size_t{0}, size_t{1}, size_t{37}, size_t{1001}, size_t{5003}})
    for (bool in_place : {false, true})
      for (bool async : {false, true}) {
        check_reduce_scatter<float>(w, count, in_place, async);
        check_reduce_scatter<bf16>(w, count, in_place, async);
        check_reduce_scatter<int64_t>(w, count, in_place, async);
      }
  // Max.
  std::vector<int32_t> x = inputs<int32_t>(w.rank(), 3 * w.size());
  std::vector<int32_t> y(3);
  w.reduce_scatter(x.data(), y.data(), 3, DType::I32, ReduceOp::Max);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(y[i], reduce_local(w.size(), w.rank() * 3 + i, ReduceOp::Max));
}

// Sum reduce-scatters of f32 and bf16 go by point-to-point messages (parallel/comm_mpi.h): several
// in flight at once, completed out of start order, with a caller's own message of tag 0 to the
// next rank on the same communicator in between, each land in their own buffers.
TEST(Comm, ReduceScattersInFlightKeepApart) {
  Communicator& w = test_world();
  const size_t count = 3001;
  const int K = 5;
  std::vector<std::vector<float>> xs;
  std::vector<std::vector<bf16>> xb;
  std::vector<Handle> hs;
  for (int k = 0; k < K; ++k) {
    xs.push_back(inputs<float>(w.rank() + 7 * k, count * w.size()));
    xb.push_back(inputs<bf16>(w.rank() + 7 * k, count * w.size()));
  }
  std::vector<std::vector<float>> ys(K, std::vector<float>(count, -1.f));
  std::vector<std::vector<bf16>> yb(K, std::vector<bf16>(count));
  const int next = (w.rank() + 1) % w.size(), prev = (w.rank() - 1 + w.size()) % w.size();
  float mine = 1000.f + (float)w.rank(), theirs = -1.f;
  for (int k = 0; k < K; ++k) {
    hs.push_back(w.ireduce_scatter(xs[k].data(), ys[k].data(), count, DType::F32, ReduceOp::Sum));
    hs.push_back(w.ireduce_scatter(xb[k].data(), yb[k].data(), count, DType::BF16, ReduceOp::Sum));
  }
  Handle rh = w.irecv(&theirs, 1, DType::F32, prev, 0);
  Handle sh = w.isend(&mine, 1, DType::F32, next, 0);
  for (int k = 2 * K - 1; k >= 0; --k) hs[k].wait();
  rh.wait(), sh.wait();
  EXPECT_EQ(theirs, 1000.f + (float)prev);
  for (int k = 0; k < K; ++k) {
    std::vector<double> ef(count, 0.0), eb(count, 0.0);  // the sums, exact (small integers)
    for (int r = 0; r < w.size(); ++r) {
      const std::vector<float> f = inputs<float>(r + 7 * k, count * w.size());
      const std::vector<bf16> b = inputs<bf16>(r + 7 * k, count * w.size());
      for (size_t i = 0; i < count; ++i) ef[i] += from(f[w.rank() * count + i]), eb[i] += from(b[w.rank() * count + i]);
    }
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(ys[k][i], (float)ef[i]) << "f32 buffer " << k << " element " << i;
      ASSERT_EQ(from(yb[k][i]), from(to<bf16>(eb[i]))) << "bf16 buffer " << k << " element " << i;
    }
  }
}

template <class T>
void check_all_gather(Communicator& c, size_t count, bool in_place, bool async) {
  SCOPED_TRACE(testing::Message() << dtype_name(dtype_of<T>()) << " count " << count << (in_place ? " in-place" : "")
                                  << (async ? " async" : ""));
  std::vector<T> all(count * c.size(), to<T>(-7));
  std::vector<T> mine = inputs<T>(c.rank(), count, 1000 * c.rank());
  const T* send = mine.data();
  if (in_place) {
    std::copy(mine.begin(), mine.end(), all.begin() + c.rank() * count);
    send = all.data() + c.rank() * count;
  }
  if (async) {
    Handle h = c.iall_gather(send, all.data(), count, dtype_of<T>());
    while (!h.test()) {
    }
  } else {
    c.all_gather(send, all.data(), count, dtype_of<T>());
  }
  for (int r = 0; r < c.size(); ++r)
    for (size_t i = 0; i < count; ++i)
      ASSERT_EQ(from(all[r * count + i]), from(to<T>(val(r, i + 1000 * r)))) << "from rank " << r << " element " << i;
}

TEST(Comm, AllGather) {
  Communicator& w = test_world();
  for (size_t count : {size_t{0}, size_t{1}, size_t{5}, size_t{777}})
    for (bool in_place : {false, true})
      for (bool async : {false, true}) {
        check_all_gather<float>(w, count, in_place, async);
        check_all_gather<bf16>(w, count, in_place, async);
        check_all_gather<uint8_t>(w, count, in_place, async);
        check_all_gather<double>(w, count, in_place, async);
      }
}

// Rank s sends cnt(s, d) elements to rank d; element j of that message encodes (s, d, j).
TEST(Comm, AllToAllVUnevenAndZeroCounts) {
  Communicator& w = test_world();
  const int n = w.size(), me = w.rank();
  for (int pattern = 0; pattern < 3; ++pattern) {
    auto cnt = [&](int s, int d) -> size_t {
      if (pattern == 0) return static_cast<size_t>((s + 2 * d) % 4);         // uneven, some zero
      if (pattern == 1) return s == 0 ? 0 : static_cast<size_t>(3 * d + 1);  // rank 0 sends nothing
      return 0;                                                              // nothing at all
    };
    auto code = [](int s, int d, size_t j) { return static_cast<int64_t>(s * 1000000 + d * 1000 + j); };
    std::vector<size_t> sc(n), sd(n), rc(n), rd(n);
    size_t st = 0, rt = 0;
    for (int d = 0; d < n; ++d) {
      sc[d] = cnt(me, d), sd[d] = st, st += sc[d] + 1;  // gaps between blocks: displacements matter
      rc[d] = cnt(d, me), rd[d] = rt, rt += rc[d] + 2;
    }
    std::vector<int64_t> send(st, -1), recv(rt, -5);
    for (int d = 0; d < n; ++d)
      for (size_t j = 0; j < sc[d]; ++j) send[sd[d] + j] = code(me, d, j);
    for (bool async : {false, true}) {
      std::fill(recv.begin(), recv.end(), -5);
      Handle h = w.iall_to_all_v(send.data(), sc, sd, recv.data(), rc, rd, DType::I64);
      if (async)
        while (!h.test()) {
        }
      else
        h.wait();
      for (int s = 0; s < n; ++s) {
        for (size_t j = 0; j < rc[s]; ++j)
          EXPECT_EQ_OR_BREAK(recv[rd[s] + j], code(s, me, j), "pattern " << pattern << " from " << s);
        EXPECT_EQ(recv[rd[s] + rc[s]], -5) << "wrote past the block from rank " << s;
      }
    }
  }
  // bf16 payload (moved as bits).
  std::vector<size_t> one(n, 1), disp(n);
  std::iota(disp.begin(), disp.end(), size_t{0});
  std::vector<bf16> s(n), r(n);
  for (int d = 0; d < n; ++d) s[d] = f32_to_bf16(0.5f + me + 10 * d);
  w.all_to_all_v(s.data(), one, disp, r.data(), one, disp, DType::BF16);
  for (int src = 0; src < n; ++src) EXPECT_EQ(bf16_to_f32(r[src]), 0.5f + src + 10 * me);
}

TEST(Comm, Broadcast) {
  Communicator& w = test_world();
  for (int root = 0; root < w.size(); ++root) {
    std::vector<double> x(333, -1.0);
    if (w.rank() == root) x = inputs<double>(root, 333);
    if (root % 2)
      w.ibroadcast(x.data(), x.size(), DType::F64, root).wait();
    else
      w.broadcast(x.data(), x.size(), DType::F64, root);
    for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ_OR_BREAK(x[i], val(root, i), "root " << root << " element " << i);
  }
  int32_t v = w.rank() == 1 ? 42 : 0;
  w.broadcast(&v, 1, 1);
  EXPECT_EQ(v, 42);
}

TEST(Comm, SendRecvRingWithTags) {
  Communicator& w = test_world();
  const int n = w.size(), me = w.rank(), next = (me + 1) % n, prev = (me + n - 1) % n;
  std::vector<float> a = inputs<float>(me, 50, 1), b = inputs<float>(me, 20, 2);
  std::vector<float> ra(50, -1), rb(20, -1);
  // Receives posted in the opposite order of the sends: tags select the message.
  Handle hb = w.irecv(rb.data(), rb.size(), DType::F32, prev, 2);
  Handle ha = w.irecv(ra.data(), ra.size(), DType::F32, prev, 1);
  Handle s1 = w.isend(a.data(), a.size(), DType::F32, next, 1);
  Handle s2 = w.isend(b.data(), b.size(), DType::F32, next, 2);
  ha.wait();
  hb.wait();
  s1.wait();
  s2.wait();
  for (size_t i = 0; i < ra.size(); ++i) EXPECT_EQ_OR_BREAK(ra[i], val(prev, i + 1), "tag 1 element " << i);
  for (size_t i = 0; i < rb.size(); ++i) EXPECT_EQ_OR_BREAK(rb[i], val(prev, i + 2), "tag 2 element " << i);
  // Blocking forms, zero-length message.
  if (me == 0) w.send(a.data(), 0, DType::F32, 1, 9);
  if (me == 1) w.recv(ra.data(), 0, DType::F32, 0, 9);
}

TEST(Comm, BarrierWaitsForTheSlowestRank) {
  Communicator& w = test_world();
  w.barrier();
  const auto t0 = std::chrono::steady_clock::now();
  if (w.rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(150));
  w.barrier();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(ms, 140.0) << "rank " << w.rank() << " left the barrier before rank 0 entered it";
}

TEST(Comm, SplitAndGroup) {
  Communicator& w = test_world();
  auto half = w.split(w.rank() % 2, -w.rank());  // key reverses the order
  ASSERT_TRUE(half);
  const int members = (w.size() + 1 - w.rank() % 2) / 2;
  EXPECT_EQ(half->size(), members);
  int64_t sum = half->all_reduce_value(int64_t{w.rank()});
  int64_t want = 0;
  for (int r = w.rank() % 2; r < w.size(); r += 2) want += r;
  EXPECT_EQ(sum, want);
  // Reversed key: the highest world rank of the color is rank 0.
  int64_t top = w.rank() % 2;
  while (top + 2 < w.size()) top += 2;
  EXPECT_EQ(half->rank(), static_cast<int>((top - w.rank()) / 2));
  auto none = w.split(w.rank() == 0 ? -1 : 5, 0);
  EXPECT_EQ(none == nullptr, w.rank() == 0);
  if (none) {
    EXPECT_EQ(none->size(), w.size() - 1);
  }
  // Explicit member list (reverse order).
  std::vector<int> rev(w.size());
  for (int r = 0; r < w.size(); ++r) rev[r] = w.size() - 1 - r;
  auto g = w.group(rev);
  EXPECT_EQ(g->rank(), w.size() - 1 - w.rank());
}

TEST(Comm, ProcessGroupsFromDims) {
  Communicator& w = test_world();
  const int n = w.size();
  int layouts = 0;
  for (int tp = 1; tp <= n; ++tp)
    for (int pp = 1; pp <= n; ++pp) {
      if (n % (tp * pp)) continue;
      const int dp = n / (tp * pp);
      for (int ep = 1; ep <= dp; ++ep) {
        if (dp % ep) continue;
        ParallelDims d;
        d.tp = tp, d.pp = pp, d.dp = dp, d.ep = ep;
        SCOPED_TRACE(d.str());
        ProcessGroups g = make_process_groups(w, d);
        const std::pair<Communicator*, std::vector<int>> pairs[] = {{g.tp.get(), d.tp_group(w.rank())},
                                                                    {g.dp.get(), d.dp_group(w.rank())},
                                                                    {g.pp.get(), d.pp_group(w.rank())},
                                                                    {g.ep.get(), d.ep_group(w.rank())},
                                                                    {g.edp.get(), d.edp_group(w.rank())}};
        for (const auto& [c, m] : pairs) {
          ASSERT_TRUE(c);
          EXPECT_EQ(c->size(), static_cast<int>(m.size()));
          EXPECT_EQ(m[c->rank()], w.rank());
          const int64_t s = c->all_reduce_value(int64_t{w.rank()});
          EXPECT_EQ(s, std::accumulate(m.begin(), m.end(), int64_t{0}));
        }
        ++layouts;
      }
    }
  EXPECT_GE(layouts, 3);
}

TEST(Comm, LargeCountsAreSplitOrRefused) {
  Communicator& w = test_world();
  MPI_Comm dup;
  ASSERT_EQ(MPI_Comm_dup(static_cast<MpiComm&>(w).native(), &dup), MPI_SUCCESS);
  MpiComm small(dup, 7);  // at most 7 elements per MPI call
  check_all_reduce<float>(small, 100, ReduceOp::Sum, true, true);
  check_all_reduce<float>(small, 100, ReduceOp::Sum, false, false);
  check_all_reduce<bf16>(small, 50, ReduceOp::Max, false, true);
  std::vector<float> b(50, -1);
  if (small.rank() == 0) b = inputs<float>(0, 50);
  small.broadcast(b.data(), b.size(), 0);
  for (size_t i = 0; i < b.size(); ++i) EXPECT_EQ_OR_BREAK(b[i], val(0, i), "broadcast element " << i);
  std::vector<float> s = inputs<float>(small.rank(), 30), r(30, -1);
  const int n = small.size(), next = (small.rank() + 1) % n, prev = (small.rank() + n - 1) % n;
  Handle hr = small.irecv(r.data(), r.size(), DType::F32, prev, 3);
  small.send(s.data(), s.size(), DType::F32, next, 3);
  hr.wait();
  for (size_t i = 0; i < r.size(); ++i) EXPECT_EQ_OR_BREAK(r[i], val(prev, i), "recv element " << i);
  // Block collectives refuse (identically on every rank, before any MPI call).
  std::vector<float> big(8 * n), out(8 * n);
  auto msg = [](auto&& fn) -> std::string {
    try {
      fn();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(msg([&] {
              small.reduce_scatter(big.data(), out.data(), 8, DType::F32, ReduceOp::Sum);
            }).find("reduce_scatter: 8 elements per rank exceed the MPI count limit"),
            std::string::npos);
  EXPECT_NE(msg([&] { small.all_gather(big.data(), out.data(), 8, DType::F32); }).find("max_chunk = 7"),
            std::string::npos);
  std::vector<size_t> c8(n, 8), d0(n, 0);
  EXPECT_NE(msg([&] {
              small.all_to_all_v(big.data(), c8, d0, out.data(), c8, d0, DType::F32);
            }).find("all_to_all_v: send_counts[0] = 8"),
            std::string::npos);
}

TEST(Comm, ErrorsCarryFileLineAndMpiMessage) {
  Communicator& w = test_world();
  float x = 0;
  std::string m;
  try {
    w.isend(&x, 1, DType::F32, 0, -5);  // MPI rejects the tag locally (MPI_ERRORS_RETURN)
  } catch (const Error& e) {
    m = e.what();
  }
  EXPECT_NE(m.find("comm_mpi.cpp:"), std::string::npos) << m;
  EXPECT_NE(m.find("MPI_Isend"), std::string::npos) << m;
  EXPECT_NE(m.find("MPI_ERR_TAG"), std::string::npos) << m;
  EXPECT_THROW(w.irecv(&x, 1, DType::F32, 0, -1), Error);
  EXPECT_THROW(w.isend(&x, 1, DType::F32, w.size(), 0), Error);
  EXPECT_THROW(w.all_reduce(&x, &x, 1, DType::F16, ReduceOp::Sum), Error);
  std::vector<size_t> wrong(w.size() + 1);
  EXPECT_THROW(w.all_to_all_v(&x, wrong, wrong, &x, wrong, wrong, DType::F32), Error);
}

// --- benchmarks (disabled by default) -----------------------------------------------------------
// mpirun -np 2 trex_mpi_tests --gtest_also_run_disabled_tests --gtest_filter='CommBench.*'
// Rank 0 prints min / median over reps. busbw follows the nccl-tests convention (all_reduce:
// 2 (n-1)/n x bytes / t; reduce_scatter, all_gather: (n-1)/n x bytes / t).
namespace {

struct Timing {
  double min_s, med_s;
};
template <class F>
Timing time_reps(Communicator& w, int reps, F&& fn) {
  std::vector<double> t;
  fn();  // warm-up
  for (int i = 0; i < reps; ++i) {
    w.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  // The slowest rank decides: max over ranks of each statistic.
  return {w.all_reduce_value(t.front(), ReduceOp::Max), w.all_reduce_value(t[t.size() / 2], ReduceOp::Max)};
}
void report(Communicator& w, const char* what, double bytes, double bus_factor, Timing t) {
  if (w.rank() != 0) return;
  std::printf(
      "[ BENCH    ] %-34s %4d ranks %7.1f MB  min %8.2f ms  median %8.2f ms  algbw %6.2f GB/s  busbw %6.2f GB/s\n",
      what, w.size(), bytes / 1e6, 1e3 * t.min_s, 1e3 * t.med_s, bytes / t.min_s / 1e9,
      bus_factor * bytes / t.min_s / 1e9);
}

volatile double g_sink = 0;

// Serial arithmetic on this core in `chunks` pieces; calls between(k) after each piece.
template <class F>
double busy_compute(int chunks, long iters_per_chunk, F&& between) {
  double acc = 1.0;
  for (int k = 0; k < chunks; ++k) {
    for (long i = 0; i < iters_per_chunk; ++i) acc = acc * 1.0000001 + 1e-9;
    between(k);
  }
  g_sink = acc;  // keeps the loop
  return acc;
}

}  // namespace

TEST(CommBench, DISABLED_Collectives64MB) {
  Communicator& w = test_world();
  const int n = w.size(), reps = 5;
  const size_t N = size_t{16} << 20;  // 16 Mi floats = 64 MiB... reported in MB (1e6)
  const double bytes = 4.0 * N, ring = double(n - 1) / n;
  std::vector<float> x(N, 1.0f), y(N);
  report(w, "all_reduce f32", bytes, 2 * ring, time_reps(w, reps, [&] { w.all_reduce(x.data(), N); }));
  std::vector<bf16> xb(N, f32_to_bf16(1.0f));
  report(w, "all_reduce bf16 (f32 staging)", 2.0 * N, 2 * ring,
         time_reps(w, reps, [&] { w.all_reduce(xb.data(), N); }));
  const size_t blk = N / n;
  report(w, "reduce_scatter f32 (in place)", 4.0 * blk * n, ring, time_reps(w, reps, [&] {
           w.reduce_scatter(x.data(), x.data() + w.rank() * blk, blk, DType::F32, ReduceOp::Sum);
         }));
  report(w, "all_gather f32 (in place)", 4.0 * blk * n, ring,
         time_reps(w, reps, [&] { w.all_gather(x.data() + w.rank() * blk, x.data(), blk, DType::F32); }));
  std::vector<size_t> c(n, blk), d(n);
  for (int r = 0; r < n; ++r) d[r] = r * blk;
  report(w, "all_to_all_v f32 (even)", 4.0 * blk * n, ring,
         time_reps(w, reps, [&] { w.all_to_all_v(x.data(), c, d, y.data(), c, d, DType::F32); }));
  // Overlap: the same all-reduce started async while this rank computes, calling test() between
  // compute pieces, against compute then all-reduce one after the other.
  const long iters = 2'000'000;
  const int chunks = 40;
  Timing tc = time_reps(w, 3, [&] { busy_compute(chunks, iters, [](int) {}); });
  Timing tseq = time_reps(w, 3, [&] {
    busy_compute(chunks, iters, [](int) {});
    w.all_reduce(x.data(), N);
  });
  Timing tov = time_reps(w, 3, [&] {
    Handle h = w.iall_reduce(x.data(), N);
    busy_compute(chunks, iters, [&](int) { h.test(); });
    h.wait();
  });
  if (w.rank() == 0)
    std::printf(
        "[ BENCH    ] overlap: compute %.1f ms, compute + all_reduce sequential %.1f ms, async with test() "
        "between compute pieces %.1f ms (min)\n",
        1e3 * tc.min_s, 1e3 * tseq.min_s, 1e3 * tov.min_s);
}

#if TREX_WITH_NCCL
#include <cuda_runtime_api.h>

#include "parallel/comm_nccl.h"

// NCCL backend: the same checks on device buffers, one GPU per rank. Skipped (on every rank)
// when there are fewer visible GPUs than ranks.
TEST(CommNccl, CollectivesOnDevice) {
  Communicator& w = test_world();
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess) ndev = 0;
  const int32_t short_of_gpus = w.all_reduce_value(int32_t{ndev < w.size() ? 1 : 0}, ReduceOp::Max);
  if (short_of_gpus) GTEST_SKIP() << "needs one GPU per rank (" << ndev << " visible)";
  auto nc = NcclComm::create(w, w.rank() % ndev);
  ASSERT_EQ(nc->size(), w.size());
  const size_t n = 1001 * w.size();
  auto dev = [](size_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
    return p;
  };
  // f32 and bf16 all-reduce, in place.
  std::vector<float> xf = inputs<float>(w.rank(), n);
  std::vector<bf16> xb = inputs<bf16>(w.rank(), n);
  float* df = static_cast<float*>(dev(n * 4));
  bf16* db = static_cast<bf16*>(dev(n * 2));
  cudaMemcpy(df, xf.data(), n * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(db, xb.data(), n * 2, cudaMemcpyHostToDevice);
  Handle h1 = nc->iall_reduce(df, n);
  Handle h2 = nc->iall_reduce(db, n);
  h1.wait();
  h2.wait();
  cudaMemcpy(xf.data(), df, n * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(xb.data(), db, n * 2, cudaMemcpyDeviceToHost);
  for (size_t i = 0; i < n; ++i) {
    const double want = reduce_local(w.size(), i, ReduceOp::Sum);
    EXPECT_EQ_OR_BREAK(xf[i], want, "f32 element " << i);
    EXPECT_EQ_OR_BREAK(bf16_to_f32(xb[i]), round_bf16(static_cast<float>(want)), "bf16 element " << i);
  }
  // Reduce-scatter then all-gather, in place: every rank ends with the full sum.
  xf = inputs<float>(w.rank(), n);
  cudaMemcpy(df, xf.data(), n * 4, cudaMemcpyHostToDevice);
  const size_t blk = n / w.size();
  nc->reduce_scatter(df, df + w.rank() * blk, blk, DType::F32, ReduceOp::Sum);
  nc->all_gather(df + w.rank() * blk, df, blk, DType::F32);
  cudaMemcpy(xf.data(), df, n * 4, cudaMemcpyDeviceToHost);
  for (size_t i = 0; i < n; ++i) EXPECT_EQ_OR_BREAK(xf[i], reduce_local(w.size(), i, ReduceOp::Sum), "rs+ag " << i);
  // all_to_all_v: rank s sends s + d + 1 elements to rank d, each equal to s * 100 + d.
  const int m = w.size(), me = w.rank();
  std::vector<size_t> sc(m), sd(m), rc(m), rd(m);
  size_t st = 0, rt = 0;
  for (int d = 0; d < m; ++d) sc[d] = me + d + 1, sd[d] = st, st += sc[d], rc[d] = d + me + 1, rd[d] = rt, rt += rc[d];
  std::vector<int32_t> s(st), r(rt, -1);
  for (int d = 0; d < m; ++d)
    for (size_t j = 0; j < sc[d]; ++j) s[sd[d] + j] = me * 100 + d;
  int32_t* ds = static_cast<int32_t*>(dev(st * 4));
  int32_t* dr = static_cast<int32_t*>(dev(rt * 4));
  cudaMemcpy(ds, s.data(), st * 4, cudaMemcpyHostToDevice);
  nc->all_to_all_v(ds, sc, sd, dr, rc, rd, DType::I32);
  cudaMemcpy(r.data(), dr, rt * 4, cudaMemcpyDeviceToHost);
  for (int src = 0; src < m; ++src)
    for (size_t j = 0; j < rc[src]; ++j) EXPECT_EQ_OR_BREAK(r[rd[src] + j], src * 100 + me, "from " << src);
  nc->barrier();
  for (void* p : {static_cast<void*>(df), static_cast<void*>(db), static_cast<void*>(ds), static_cast<void*>(dr)})
    cudaFree(p);
}
#endif  // TREX_WITH_NCCL
