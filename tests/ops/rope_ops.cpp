// Op cases for RoPE: fast vs reference for both layouts, forward and inverse, strided head
// slices inside wider rows (elements outside the slices must stay bitwise unchanged), odd pair
// counts; the inverse as the adjoint of the forward (and vice versa) in double against finite
// differences; bandwidth.
#include <string>
#include <vector>
#include "kernels/ref/rope.h"
#include "kernels/rope.h"
#include "tests/ops/harness.h"

namespace {
using namespace trex;
using namespace trex::ops;
using kern::RopeLayout;

const char* lname(RopeLayout l) { return l == RopeLayout::Interleaved ? "inter" : "half"; }

struct RopeShape {
  int64_t N;
  int H;
  int D;
  int64_t off, stride_head, stride_tok;  // slice offset inside a head row, head and token strides
};

bool rope_test(const RopeShape& sh, RopeLayout layout, bool inverse) {
  std::string name = "rope " + std::string(lname(layout)) + (inverse ? " inv" : " fwd") + " N=" +
                     std::to_string(sh.N) + " H=" + std::to_string(sh.H) + " D=" + std::to_string(sh.D) +
                     " sh=" + std::to_string(sh.stride_head) + " st=" + std::to_string(sh.stride_tok);
  // YaRN with an attention factor != 1 so that the scaling is exercised too.
  kern::RopeParams rp{sh.D, 10000.0, true, 40.0, 32, 1, 0.707, 1.0, 4096, true};
  const int64_t max_pos = 5000;
  std::vector<float> cs(max_pos * sh.D / 2), sn(max_pos * sh.D / 2);
  kern::rope_tables(rp, max_pos, cs.data(), sn.data());
  Rng r(11 + sh.N * 3 + sh.D);
  std::vector<int32_t> pos(sh.N);
  for (auto& p : pos) p = static_cast<int32_t>(r.next_u64() % max_pos);
  if (sh.N > 1) pos[1] = max_pos - 1;
  const size_t total = static_cast<size_t>(sh.N * sh.stride_tok);
  Guarded<float> x(total);
  fill_normal(x.data(), total, r);
  std::vector<float> x0(x.data(), x.data() + total), xr(x0);
  kern::rope_apply(x.data() + sh.off, sh.N, sh.H, sh.stride_tok, sh.stride_head, sh.D, pos.data(), cs.data(),
                   sn.data(), layout, inverse);
  kern::ref::rope_apply<float>(xr.data() + sh.off, sh.N, sh.H, sh.stride_tok, sh.stride_head, sh.D, pos.data(),
                               cs.data(), sn.data(), layout, inverse);
  // Elements outside the rotated slices must be untouched.
  std::vector<char> inside(total, 0);
  for (int64_t n = 0; n < sh.N; ++n)
    for (int h = 0; h < sh.H; ++h)
      for (int j = 0; j < sh.D; ++j) inside[sh.off + n * sh.stride_tok + h * sh.stride_head + j] = 1;
  size_t touched = 0;
  for (size_t i = 0; i < total; ++i) touched += !inside[i] && std::memcmp(&x[i], &x0[i], 4) != 0;
  bool mism;
  double err = nmse(x.data(), xr.data(), total, &mism);
  return report(name, "x", err, 1e-13, !mism && x.guard_ok() && touched == 0, "nan/guard/outside touched");
}

// L = <p, R(x)> with R the forward (or inverse) rotation; dL/dx = R^T p must equal the other
// direction applied to p. Random tables: the adjoint identity holds for any cos/sin values.
bool rope_grad(int64_t N, int H, int D, RopeLayout layout, bool inverse) {
  std::string name = "rope " + std::string(lname(layout)) + (inverse ? " inv" : " fwd") + " N=" + std::to_string(N) +
                     " H=" + std::to_string(H) + " D=" + std::to_string(D);
  Rng r(99 + D);
  const int64_t max_pos = 13, sth = D + 3, stt = H * sth + 1;
  std::vector<double> cs(max_pos * D / 2), sn(max_pos * D / 2);
  fill_normal(cs.data(), cs.size(), r);
  fill_normal(sn.data(), sn.size(), r);
  std::vector<int32_t> pos(N);
  for (auto& p : pos) p = static_cast<int32_t>(r.next_u64() % max_pos);
  const size_t total = static_cast<size_t>(N * stt);
  std::vector<double> x(total), p(total), y(total), g;
  fill_normal(x.data(), total, r);
  fill_normal(p.data(), total, r);
  auto loss = [&]() {
    y = x;
    kern::ref::rope_apply<double>(y.data(), N, H, stt, sth, D, pos.data(), cs.data(), sn.data(), layout, inverse);
    double s = 0;
    for (size_t i = 0; i < total; ++i) s += p[i] * y[i];
    return s;
  };
  g = p;  // backward: the other direction, applied to the output gradient (identity outside slices)
  kern::ref::rope_apply<double>(g.data(), N, H, stt, sth, D, pos.data(), cs.data(), sn.data(), layout, !inverse);
  return report(name, "dx", fd_check(x, loss, g), 1e-7);
}

void rope_perf(int64_t N, int H, int D, int64_t sth, RopeLayout layout) {
  kern::RopeParams rp{D, 10000.0};
  const int64_t max_pos = 4096;
  std::vector<float> cs(max_pos * D / 2), sn(max_pos * D / 2);
  kern::rope_tables(rp, max_pos, cs.data(), sn.data());
  std::vector<int32_t> pos(N);
  for (int64_t i = 0; i < N; ++i) pos[i] = static_cast<int32_t>(i % max_pos);
  const int64_t stt = H * sth;
  std::vector<float> x(static_cast<size_t>(N * stt), 0.5f);
  double t = time_ms([&] {
    kern::rope_apply(x.data() + (sth - D), N, H, stt, sth, D, pos.data(), cs.data(), sn.data(), layout, false);
  });
  std::printf("perf rope %s N=%ld H=%d D=%d stride_head=%ld  %.3f ms %.1f GB/s\n", lname(layout), (long)N, H, D,
              (long)sth, t, 8.0 * N * H * D / t * 1e-6);
}

}  // namespace

TREX_OP_CASES(rope_cases) {
  const RopeShape shapes[] = {
      {37, 3, 64, 128, 192, 3 * 192 + 5},  // MLA q: rope slice at the end of 192-wide heads, padded rows
      {5, 1, 6, 0, 6, 6},                  // 3 pairs (tail only)
      {129, 16, 128, 0, 128, 16 * 128},    // contiguous
      {1, 7, 34, 2, 40, 7 * 40},           // 17 pairs
      {64, 1, 64, 512, 0, 576},            // MLA k_rot: one shared head after the 512 latent
      {3, 2, 2, 0, 2, 4},                  // 1 pair
  };
  for (const auto& sh : shapes)
    for (RopeLayout l : {RopeLayout::Interleaved, RopeLayout::HalfSplit})
      for (bool inv : {false, true}) cases.push_back({"rope", [=] { return rope_test(sh, l, inv); }, nullptr, nullptr});
  for (RopeLayout l : {RopeLayout::Interleaved, RopeLayout::HalfSplit})
    for (bool inv : {false, true}) {
      cases.push_back({"rope", nullptr, [=] { return rope_grad(3, 2, 10, l, inv); }, nullptr});
      cases.push_back({"rope", nullptr, [=] { return rope_grad(2, 1, 38, l, inv); }, nullptr});
    }
  for (RopeLayout l : {RopeLayout::Interleaved, RopeLayout::HalfSplit})
    cases.push_back({"rope", nullptr, nullptr, [=] { rope_perf(1024, 128, 64, 192, l); }});
}
