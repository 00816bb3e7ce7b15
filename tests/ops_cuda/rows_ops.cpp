// CUDA cases for the row operations of the training step (kernels/rows.h): strided copies, the
// residual add, bf16 casts, gathers and ordered scatter-adds by index (repeated indices included),
// the sum over heads, and the MoE combine with its adjoints. Each against plain loops here, in the
// order kernels/rows.cpp sums in (so copies and casts must match bit for bit, sums to rounding);
// guards past every output must stay intact.
#include <array>
#include <cstring>
#include <string>
#include <vector>
#include "core/dtype.h"
#include "tests/ops_cuda/device.h"

namespace {
using namespace trex;
using namespace trex::ops;

std::vector<float> randv(size_t n, uint64_t seed) {
  Rng r(seed);
  std::vector<float> v(n);
  fill_normal(v.data(), n, r);
  return v;
}

bool same_bits(const void* a, const void* b, size_t bytes) { return std::memcmp(a, b, bytes) == 0; }

bool copy_case(int64_t rows, int64_t w, int64_t ls, int64_t ld) {
  const std::string name = "cuda copy_rows rows=" + std::to_string(rows) + " w=" + std::to_string(w);
  const std::vector<float> src = randv(rows * ls, 3 + rows);
  Guarded<float> dst(rows * ld, -1.f);
  std::vector<float> ref(dst.buf.begin(), dst.buf.begin() + rows * ld);
  for (int64_t r = 0; r < rows; ++r) std::memcpy(&ref[r * ld], &src[r * ls], w * sizeof(float));
  auto S = upload(src);
  DevCopy<float> D(dst);
  dev().copy_rows(D.get(), ld * 4, S.get(), ls * 4, w * 4, rows);
  D.fetch();
  return report(name, "dst", same_bits(dst.data(), ref.data(), ref.size() * 4) ? 0 : 1, 0, dst.guard_ok(), "guard");
}

bool add_bf16_case(int64_t rows, int64_t cols, int64_t ld) {
  const std::string name = "cuda add+to_bf16 rows=" + std::to_string(rows) + " cols=" + std::to_string(cols);
  const int64_t n = rows * ld;
  const std::vector<float> x = randv(n, 5), y0 = randv(n, 6);
  Guarded<float> y(n);
  for (int64_t i = 0; i < n; ++i) y[i] = y0[i];
  Guarded<bf16> b(rows * cols);
  auto X = upload(x);
  DevCopy<float> Y(y);
  DevCopy<bf16> Bd(b);
  dev().add(Y.get(), X.get(), n);
  dev().to_bf16(Y.get(), ld, rows, cols, Bd.get());
  Y.fetch(), Bd.fetch();
  std::vector<float> yr(n);
  for (int64_t i = 0; i < n; ++i) yr[i] = y0[i] + x[i];
  std::vector<bf16> br(rows * cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) br[r * cols + j] = f32_to_bf16(yr[r * ld + j]);
  bool ok = report(name, "add", same_bits(y.data(), yr.data(), n * 4) ? 0 : 1, 0, y.guard_ok(), "guard");
  ok &= report(name, "bf16", same_bits(b.data(), br.data(), br.size() * 2) ? 0 : 1, 0, b.guard_ok(), "guard");
  return ok;
}

bool gather_scatter_case(int64_t R, int64_t d, int64_t rows) {
  const std::string name = "cuda gather/scatter_add R=" + std::to_string(R) + " d=" + std::to_string(d);
  const std::vector<float> src = randv(rows * d, 7), g = randv(R * d, 8), base = randv(rows * d, 9);
  std::vector<int32_t> idx(R);
  for (int64_t r = 0; r < R; ++r) idx[r] = (int32_t)((r * 7 + r / 3) % rows);  // repeats
  Guarded<float> out(R * d), acc(rows * d);
  for (int64_t i = 0; i < rows * d; ++i) acc[i] = base[i];
  auto S = upload(src), Gd = upload(g);
  auto I = upload(idx);
  DevCopy<float> O(out), A(acc);
  dev().gather_rows(S.get(), I.get(), R, d, O.get());
  dev().scatter_add_rows(Gd.get(), I.get(), R, d, A.get());
  O.fetch(), A.fetch();
  std::vector<float> outr(R * d), accr = base;
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j = 0; j < d; ++j) outr[r * d + j] = src[idx[r] * d + j], accr[idx[r] * d + j] += g[r * d + j];
  bool ok = report(name, "gather", same_bits(out.data(), outr.data(), outr.size() * 4) ? 0 : 1, 0, out.guard_ok(), "guard");
  ok &= report(name, "scatter_add", same_bits(acc.data(), accr.data(), accr.size() * 4) ? 0 : 1, 0, acc.guard_ok(),
               "guard (in row order)");
  // bf16 rows: the rounded source's rows, bit for bit
  std::vector<bf16> srcb(rows * d), outbr(R * d);
  for (int64_t i = 0; i < rows * d; ++i) srcb[i] = f32_to_bf16(src[i]);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j = 0; j < d; ++j) outbr[r * d + j] = srcb[idx[r] * d + j];
  Guarded<bf16> outb(R * d);
  auto Sb = upload(srcb);
  DevCopy<bf16> Ob(outb);
  dev().gather_rows_bf16(Sb.get(), I.get(), R, d, Ob.get());
  Ob.fetch();
  ok &= report(name, "gather_bf16", same_bits(outb.data(), outbr.data(), outbr.size() * 2) ? 0 : 1, 0, outb.guard_ok(),
               "guard");
  return ok;
}

bool sum_heads_case(int64_t N, int64_t H, int64_t w) {
  const std::string name = "cuda sum_heads N=" + std::to_string(N) + " H=" + std::to_string(H);
  const int64_t ldh = w + 3, ldn = H * ldh + 2, ldy = w + 5;
  const std::vector<float> x = randv(N * ldn, 11);
  Guarded<float> y(N * ldy, 7.f);
  std::vector<float> yr(y.buf.begin(), y.buf.begin() + N * ldy);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < w; ++j) {
      float s = 0.f;
      for (int64_t h = 0; h < H; ++h) s += x[n * ldn + h * ldh + j];
      yr[n * ldy + j] = s;
    }
  auto X = upload(x);
  DevCopy<float> Y(y);
  dev().sum_heads(X.get(), N, H, ldn, ldh, w, Y.get(), ldy);
  Y.fetch();
  bool m;
  const double e = nmse(y.data(), yr.data(), yr.size(), &m);
  return report(name, "y", e, 1e-13, !m && y.guard_ok(), "nan/guard");
}

bool combine_case(int64_t N, int64_t K, int64_t d) {
  const std::string name = "cuda moe combine N=" + std::to_string(N) + " K=" + std::to_string(K) + " d=" + std::to_string(d);
  const int64_t R = N * K;
  std::vector<float> probs = randv(R, 14);
  const std::vector<float> y = randv(R * d, 13), dout = randv(N * d, 15), o0 = randv(N * d, 16), qf = randv(R, 17);
  const std::vector<double> q(qf.begin(), qf.end());
  if (R > 2) probs[1] = 0.f;  // a probability that underflowed: its gradient is 0
  std::vector<int32_t> slot(R);
  for (int64_t i = 0; i < R; ++i) slot[i] = (int32_t)((i * 5 + 2) % R);  // a permutation (gcd(5, R) = 1)
  Guarded<float> out(N * d), dy(R * d), dp(R), dx(N * d);
  Guarded<double> rd(R);
  for (int64_t i = 0; i < N * d; ++i) out[i] = o0[i], dx[i] = o0[i];
  auto Y = upload(y), P = upload(probs), DO = upload(dout);
  auto Q = upload(q);
  auto S = upload(slot);
  DevCopy<float> O(out), DY(dy), DP(dp), DX(dx);
  DevCopy<double> RD(rd);
  dev().moe_combine(Y.get(), P.get(), S.get(), N, K, d, O.get());
  dev().moe_combine_bwd(DO.get(), P.get(), S.get(), N, K, d, DY.get());
  dev().moe_probs_bwd(Q.get(), P.get(), S.get(), N, K, DP.get());
  dev().moe_dispatch_bwd(Y.get(), S.get(), N, K, d, DX.get());
  dev().row_dot(Y.get(), DY.get(), R, d, RD.get());
  O.fetch(), DY.fetch(), DP.fetch(), DX.fetch(), RD.fetch();
  std::vector<double> outr(N * d), dyr(R * d), dpr(R), dxr(N * d), rdr(R);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < d; ++j) {
      double o = o0[n * d + j], x = o0[n * d + j];
      for (int64_t k = 0; k < K; ++k) {
        o += (double)probs[n * K + k] * y[slot[n * K + k] * d + j];
        x += y[slot[n * K + k] * d + j];
      }
      outr[n * d + j] = o, dxr[n * d + j] = x;
    }
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const int64_t s = n * K + k, row = slot[s];
      for (int64_t j = 0; j < d; ++j) dyr[row * d + j] = (double)probs[s] * dout[n * d + j];
      dpr[s] = probs[s] != 0.f ? q[row] / probs[s] : 0.0;
    }
  for (int64_t r = 0; r < R; ++r) {
    double dot = 0;
    for (int64_t j = 0; j < d; ++j) dot += (double)y[r * d + j] * dy[r * d + j];  // dy as the device wrote it
    rdr[r] = dot;
  }
  bool ok = true, m1, m2, m3, m4, m5;
  const double e1 = nmse(out.data(), outr.data(), outr.size(), &m1), e2 = nmse(dy.data(), dyr.data(), dyr.size(), &m2),
               e3 = nmse(dp.data(), dpr.data(), dpr.size(), &m3), e4 = nmse(dx.data(), dxr.data(), dxr.size(), &m4),
               e5 = nmse(rd.data(), rdr.data(), rdr.size(), &m5);
  ok &= report(name, "out", e1, 1e-12, !m1 && out.guard_ok(), "nan/guard");
  ok &= report(name, "dy", e2, 1e-12, !m2 && dy.guard_ok(), "nan/guard");
  ok &= report(name, "dprobs", e3, 1e-12, !m3 && dp.guard_ok(), "nan/guard");
  ok &= report(name, "dx", e4, 1e-12, !m4 && dx.guard_ok(), "nan/guard");
  ok &= report(name, "row_dot", e5, 1e-12, !m5 && rd.guard_ok(), "nan/guard");
  return ok;
}

}  // namespace

TREX_OP_CASES(cuda_rows_cases) {
  for (auto [rows, w, ls, ld] : {std::array<int64_t, 4>{1, 1, 1, 1}, {13, 7, 11, 9}, {300, 64, 128, 192}, {5, 0, 3, 3}})
    cases.push_back({"cuda copy_rows", [=] { return copy_case(rows, w, ls, ld); }, nullptr, nullptr});
  for (auto [r, c, ld] : {std::array<int64_t, 3>{1, 1, 1}, {37, 45, 45}, {19, 33, 41}, {513, 2048, 2048}})
    cases.push_back({"cuda add+to_bf16", [=] { return add_bf16_case(r, c, ld); }, nullptr, nullptr});
  for (auto [R, d, rows] : {std::array<int64_t, 3>{1, 1, 1}, {37, 45, 11}, {600, 129, 61}, {4096, 7, 3}})
    cases.push_back({"cuda gather/scatter_add", [=] { return gather_scatter_case(R, d, rows); }, nullptr, nullptr});
  for (auto [N, H, w] : {std::array<int64_t, 3>{1, 1, 1}, {13, 5, 7}, {300, 16, 64}})
    cases.push_back({"cuda sum_heads", [=] { return sum_heads_case(N, H, w); }, nullptr, nullptr});
  for (auto [N, K, d] : {std::array<int64_t, 3>{1, 1, 1}, {11, 3, 29}, {257, 6, 2048}, {9, 1, 1000}})
    cases.push_back({"cuda moe combine", [=] { return combine_case(N, K, d); }, nullptr, nullptr});
}
