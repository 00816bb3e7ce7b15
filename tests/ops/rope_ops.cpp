// Op cases for RoPE: fast vs reference for both layouts, forward and inverse, strided head
// slices inside wider rows (elements outside the slices must stay bitwise unchanged), odd pair
// counts, for the dispatched kernel and the AVX2 kernel called directly ("rope[avx2]",
// kernels/cpu/rope_avx2.h; skipped on a CPU without AVX2 + FMA, so it also runs on AVX-512
// machines); results bitwise the same for 1 and 2 threads; the inverse as the adjoint of the
// forward (and vice versa) in double against finite differences; bandwidth (dispatched and AVX2,
// at the bench-v3 MLA and V4 attention shapes among others).
#include <omp.h>
#include <cstring>
#include <string>
#include <vector>
#include "core/parallel.h"
#include "kernels/cpu/rope_avx2.h"
#include "kernels/ref/rope.h"
#include "kernels/rope.h"
#include "tests/ops/harness.h"

namespace {
using namespace trex;
using namespace trex::ops;
using kern::RopeLayout;

const char* lname(RopeLayout l) { return l == RopeLayout::Interleaved ? "inter" : "half"; }

// The implementation under test: the dispatched one, or the AVX2 kernel called directly.
struct RopeImpl {
  const char* tag;
  void (*fn)(float*, int64_t, int, int64_t, int64_t, int, const int32_t*, const float*, const float*, RopeLayout,
             bool);
  bool (*usable)();
};
bool rope_always() { return true; }
bool rope_has_avx2_fma() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
const RopeImpl kRopeImpls[] = {{"rope", kern::rope_apply, rope_always},
                               {"rope[avx2]", kern::cpu::rope_apply_avx2, rope_has_avx2_fma}};
// A case of an implementation the CPU cannot run passes with a note.
bool rope_skipped(const RopeImpl& im, const std::string& name) {
  if (im.usable()) return false;
  std::printf("skip %-48s (CPU lacks AVX2 + FMA)\n", name.c_str());
  return true;
}

struct RopeShape {
  int64_t N;
  int H;
  int D;
  int64_t off, stride_head, stride_tok;  // slice offset inside a head row, head and token strides
};

bool rope_test(const RopeImpl& im, const RopeShape& sh, RopeLayout layout, bool inverse) {
  std::string name = std::string(im.tag) + " " + lname(layout) + (inverse ? " inv" : " fwd") + " N=" +
                     std::to_string(sh.N) + " H=" + std::to_string(sh.H) + " D=" + std::to_string(sh.D) +
                     " sh=" + std::to_string(sh.stride_head) + " st=" + std::to_string(sh.stride_tok);
  if (rope_skipped(im, name)) return true;
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
  im.fn(x.data() + sh.off, sh.N, sh.H, sh.stride_tok, sh.stride_head, sh.D, pos.data(), cs.data(), sn.data(),
        layout, inverse);
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

// x after the rotation must be bitwise the same for 1 and 2 threads (tokens split differently).
bool rope_threads(const RopeImpl& im, const RopeShape& sh, RopeLayout layout, bool inverse) {
  std::string name = std::string(im.tag) + " threads 1/2 " + lname(layout) + (inverse ? " inv" : " fwd") +
                     " N=" + std::to_string(sh.N) + " H=" + std::to_string(sh.H) + " D=" + std::to_string(sh.D);
  if (rope_skipped(im, name)) return true;
  kern::RopeParams rp{sh.D, 10000.0};
  const int64_t max_pos = 4096;
  std::vector<float> cs(max_pos * sh.D / 2), sn(max_pos * sh.D / 2);
  kern::rope_tables(rp, max_pos, cs.data(), sn.data());
  Rng r(21 + sh.D);
  std::vector<int32_t> pos(sh.N);
  for (auto& p : pos) p = static_cast<int32_t>(r.next_u64() % max_pos);
  const size_t total = static_cast<size_t>(sh.N * sh.stride_tok);
  std::vector<float> x1(total);
  fill_normal(x1.data(), total, r);
  std::vector<float> x2(x1);
  const int nt = num_threads();
  omp_set_num_threads(1);
  im.fn(x1.data() + sh.off, sh.N, sh.H, sh.stride_tok, sh.stride_head, sh.D, pos.data(), cs.data(), sn.data(),
        layout, inverse);
  omp_set_num_threads(2);
  im.fn(x2.data() + sh.off, sh.N, sh.H, sh.stride_tok, sh.stride_head, sh.D, pos.data(), cs.data(), sn.data(),
        layout, inverse);
  omp_set_num_threads(nt);
  size_t bad = 0;
  for (size_t i = 0; i < total; ++i) bad += std::memcmp(&x1[i], &x2[i], 4) != 0;
  return report(name, "bitwise", static_cast<double>(bad), 0);
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

void rope_perf(const RopeImpl& im, int64_t N, int H, int D, int64_t sth, RopeLayout layout, bool inverse = false) {
  if (rope_skipped(im, std::string(im.tag) + " perf")) return;
  kern::RopeParams rp{D, 10000.0};
  const int64_t max_pos = 4096;
  std::vector<float> cs(max_pos * D / 2), sn(max_pos * D / 2);
  kern::rope_tables(rp, max_pos, cs.data(), sn.data());
  std::vector<int32_t> pos(N);
  for (int64_t i = 0; i < N; ++i) pos[i] = static_cast<int32_t>(i % max_pos);
  const int64_t stt = H * sth;
  std::vector<float> x(static_cast<size_t>(N * stt), 0.5f);
  double t = time_ms([&] {
    im.fn(x.data() + (sth - D), N, H, stt, sth, D, pos.data(), cs.data(), sn.data(), layout, inverse);
  });
  std::printf("perf %s %s%s N=%ld H=%d D=%d stride_head=%ld  %.3f ms %.1f GB/s\n", im.tag, lname(layout),
              inverse ? " inv" : "", (long)N, H, D, (long)sth, t, 8.0 * N * H * D / t * 1e-6);
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
      {1000, 2, 46, 1, 50, 101},           // 23 pairs (8 + 8 + 7: the tail above 4 pairs)
      {300, 16, 64, 64, 128, 16 * 128},    // V4: the last 64 of 16 heads of 128
  };
  for (const RopeImpl& im : kRopeImpls) {
    for (const auto& sh : shapes)
      for (RopeLayout l : {RopeLayout::Interleaved, RopeLayout::HalfSplit})
        for (bool inv : {false, true})
          cases.push_back({im.tag, [=, &im] { return rope_test(im, sh, l, inv); }, nullptr, nullptr});
    for (RopeLayout l : {RopeLayout::Interleaved, RopeLayout::HalfSplit}) {
      cases.push_back({im.tag, [=, &im] { return rope_threads(im, {1000, 2, 46, 1, 50, 101}, l, false); }, nullptr,
                       nullptr});
      cases.push_back({im.tag, [=, &im] { return rope_threads(im, {300, 8, 32, 64, 96, 8 * 96}, l, true); }, nullptr,
                       nullptr});
    }
  }
  for (RopeLayout l : {RopeLayout::Interleaved, RopeLayout::HalfSplit})
    for (bool inv : {false, true}) {
      cases.push_back({"rope", nullptr, [=] { return rope_grad(3, 2, 10, l, inv); }, nullptr});
      cases.push_back({"rope", nullptr, [=] { return rope_grad(2, 1, 38, l, inv); }, nullptr});
    }
  for (const RopeImpl& im : kRopeImpls)
    for (RopeLayout l : {RopeLayout::Interleaved, RopeLayout::HalfSplit}) {
      cases.push_back({im.tag, nullptr, nullptr, [=, &im] { rope_perf(im, 1024, 128, 64, 192, l); }});
      // bench-v3 MLA (model/mla.cpp): q of 8 heads of 64 + 32 rope dims, inverse on dq; the shared k_pe.
      cases.push_back({im.tag, nullptr, nullptr, [=, &im] { rope_perf(im, 2048, 8, 32, 96, l); }});
      cases.push_back({im.tag, nullptr, nullptr, [=, &im] { rope_perf(im, 2048, 8, 32, 96, l, true); }});
      cases.push_back({im.tag, nullptr, nullptr, [=, &im] { rope_perf(im, 2048, 1, 32, 32, l); }});
    }
  // V4 attention (model/v4_attn.cpp): 16 heads of 128, the last 64 rotated, interleaved.
  for (const RopeImpl& im : kRopeImpls)
    cases.push_back(
        {im.tag, nullptr, nullptr, [&im] { rope_perf(im, 2048, 16, 64, 128, RopeLayout::Interleaved); }});
}
