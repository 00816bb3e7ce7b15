// DeepSeek-V4 attention under context parallelism: the held key rows and their halo exchange, the
// compressed entries' owners and their gather, the local queries' positions and key lists. See
// v4_context_parallel.h; the attention itself is model/v4_attn.cpp (V4AttnIn::cp).
#include "model/v4_context_parallel.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "core/timer.h"
#include "kernels/compress_pool.h"
#include "kernels/hd/v4_rows.h"

namespace trex::model {

namespace {

// Chunk ch's entries [e0, e1): those whose window's last token (w + 1) m - 1 lies in it.
void chunk_entries(const CpSplit& s, int64_t m, int64_t ch, int64_t* e0, int64_t* e1) {
  if (m <= 0) {
    *e0 = *e1 = 0;
    return;
  }
  const int64_t nw = s.T / m;
  *e0 = std::min(nw, ch * s.c / m);
  *e1 = std::min(nw, (ch + 1) * s.c / m);
}

// The first held row of chunk ch (its rows end at (ch + 1) c): the sliding window's halo and the
// first row of the windows it pools.
int64_t chunk_first_row(const CpSplit& s, int64_t W, int64_t m, int cc, int64_t ch) {
  int64_t lo = ch * s.c - std::max<int64_t>(W - 1, 0);
  int64_t e0, e1;
  chunk_entries(s, m, ch, &e0, &e1);
  if (cc > 0 && e1 > e0) lo = std::min(lo, (e0 - cc + 1) * m);
  return std::max<int64_t>(lo, 0);
}

// The held rows of rank r, ascending: the union of its two chunks' [first row, chunk end).
std::vector<int32_t> held_rows(const CpSplit& s, int64_t W, int64_t m, int cc, int r) {
  std::vector<int32_t> out;
  const int64_t ch[2] = {r, 2 * s.size - 1 - r};
  for (int h = 0; h < 2; ++h)
    for (int64_t u = chunk_first_row(s, W, m, cc, ch[h]); u < (ch[h] + 1) * s.c; ++u) out.push_back((int32_t)u);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// The rank holding sequence index u, and u's local row there.
int owner_of(const CpSplit& s, int64_t u, int64_t* row) {
  const int64_t ch = u / s.c;
  const bool early = ch < s.size;
  *row = (early ? 0 : s.c) + u - ch * s.c;
  return (int)(early ? ch : 2 * s.size - 1 - ch);
}

// The buffer offsets of the blocks of `at` (rows of one batch row) with rank self's block left out
// (its rows are copied directly, not sent).
std::vector<int64_t> remote_at(const std::vector<int64_t>& at, int self) {
  std::vector<int64_t> r(at.size(), 0);
  for (size_t q = 0; q + 1 < at.size(); ++q) r[q + 1] = r[q] + ((int)q == self ? 0 : at[q + 1] - at[q]);
  return r;
}

std::vector<size_t> scaled(const std::vector<int64_t>& at, int64_t unit, bool counts) {
  std::vector<size_t> v(at.size() - 1);
  for (size_t q = 0; q + 1 < at.size(); ++q) v[q] = (size_t)((counts ? at[q + 1] - at[q] : at[q]) * unit);
  return v;
}

// One all-to-all-v of rows, started: to rank q go the blocks [B][n_q][w] of `send` at sat[q] B w,
// from q come those of `recv` at rat[q] B w (remote_at offsets: nothing to or from this rank
// itself).
parallel::Handle exchange_start(const ContextParallel& cp, const std::vector<int64_t>& sat,
                                const std::vector<int64_t>& rat, int64_t B, int64_t w, const float* send,
                                float* recv) {
  const int64_t unit = B * w;
  const auto sc = scaled(sat, unit, true), sd = scaled(sat, unit, false);
  const auto rc = scaled(rat, unit, true), rd = scaled(rat, unit, false);
  return cp.comm->iall_to_all_v(send, sc, sd, recv, rc, rd, DType::F32);
}

// The rows of the other ranks' blocks: rows[at[q] .. at[q + 1]) of every batch row (ld rows
// apart), packed [B][n_q][w] at bat[q] B w of buf (pack) or read back from it (unpack, adding with
// add); rank self's block is skipped.
void pack_rows(const std::vector<int32_t>& rows, const std::vector<int64_t>& at, const std::vector<int64_t>& bat,
               int self, int64_t B, int64_t ld, const float* from, float* buf, int64_t w) {
  for (size_t q = 0; q + 1 < at.size(); ++q) {
    if ((int)q == self) continue;
    const int64_t n = at[q + 1] - at[q];
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < n; ++i)
        std::memcpy(buf + ((bat[q] * B + b * n + i) * w), from + (b * ld + rows[at[q] + i]) * w, w * sizeof(float));
  }
}
void unpack_rows(const std::vector<int32_t>& rows, const std::vector<int64_t>& at, const std::vector<int64_t>& bat,
                 int self, int64_t B, int64_t ld, const float* buf, float* to, int64_t w, bool add) {
  for (size_t q = 0; q + 1 < at.size(); ++q) {
    if ((int)q == self) continue;
    const int64_t n = at[q + 1] - at[q];
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < n; ++i) {
        const float* src = buf + (bat[q] * B + b * n + i) * w;
        float* dst = to + (b * ld + rows[at[q] + i]) * w;
        if (add)
          for (int64_t e = 0; e < w; ++e) dst[e] += src[e];
        else
          std::memcpy(dst, src, w * sizeof(float));
      }
  }
}

// The self block: this rank's local rows [B, 2c, w] <-> their held rows [B, np, w] (to_held: local
// -> held; else held -> local, overwriting: every local row is held once by its own rank).
void copy_own(const V4CpKeys& k, int64_t B, const float* from, float* to, int64_t w, bool to_held) {
  const int64_t n = k.own_rows(), s0 = k.send_at[k.rank], r0 = k.recv_at[k.rank], Tl = 2 * k.c;
  TREX_CHECK(n == k.recv_at[k.rank + 1] - r0 && n == Tl, "v4_cp: the self block holds ", n, " rows of ", Tl);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t l = b * Tl + k.send_rows[s0 + i], h = b * k.np + k.recv_rows[r0 + i];
      if (to_held) std::memcpy(to + h * w, from + l * w, w * sizeof(float));
      else std::memcpy(to + l * w, from + h * w, w * sizeof(float));
    }
}

}  // namespace

V4CpKeys v4_cp_keys(const CpSplit& s, int64_t W, int64_t m, int cc) {
  TREX_CHECK(s.c > 0 && s.T == 2 * s.size * s.c, "v4_cp_keys: a split of ", s.T, " positions in chunks of ", s.c);
  V4CpKeys k;
  k.T = s.T, k.c = s.c, k.nw = m > 0 ? s.T / m : 0, k.rank = s.rank;
  k.pos = held_rows(s, W, m, cc, s.rank);
  k.np = (int64_t)k.pos.size();
  k.slot.assign(s.T, -1);
  for (int64_t j = 0; j < k.np; ++j) k.slot[k.pos[j]] = (int32_t)j;
  k.chunk_e0.resize(2 * s.size), k.chunk_n.resize(2 * s.size);
  for (int64_t ch = 0; ch < 2 * s.size; ++ch) {
    int64_t e0, e1;
    chunk_entries(s, m, ch, &e0, &e1);
    k.chunk_e0[ch] = e0, k.chunk_n[ch] = e1 - e0;
    k.emax = std::max(k.emax, e1 - e0);
  }
  const int64_t ch[2] = {s.rank, 2 * s.size - 1 - s.rank};
  for (int h = 0; h < 2; ++h) {
    V4CpKeys::Own& o = k.own[h];
    o.e0 = k.chunk_e0[ch[h]], o.n = k.chunk_n[ch[h]];
    if (o.n == 0 || cc == 0) {
      o.n = 0;
      continue;
    }
    o.s0 = std::max<int64_t>(0, (o.e0 - cc + 1) * m);
    o.L = (o.e0 + o.n) * m - o.s0;
    o.skip = o.e0 - o.s0 / m;
  }
  // The exchange: q's held rows that this rank owns, in q's order; this rank's held rows by owner.
  k.send_at.assign(1, 0), k.recv_at.assign(1, 0);
  for (int q = 0; q < s.size; ++q) {
    for (int32_t u : held_rows(s, W, m, cc, q)) {
      int64_t row;
      if (owner_of(s, u, &row) == s.rank) k.send_rows.push_back((int32_t)row);
    }
    k.send_at.push_back((int64_t)k.send_rows.size());
    for (int64_t j = 0; j < k.np; ++j) {
      int64_t row;
      if (owner_of(s, k.pos[j], &row) == q) k.recv_rows.push_back((int32_t)j);
    }
    k.recv_at.push_back((int64_t)k.recv_rows.size());
  }
  return k;
}

namespace {

// One direction of the halo exchange's lists. to_held: the local rows [B, 2c, w] go to the ranks
// holding them and the held rows [B, np, w] are filled (the gather); else the held rows go back
// to their owners and are summed into the local rows (the return, the adjoint).
struct Direction {
  const std::vector<int32_t>& srows;  // sending side's rows, by destination block
  const std::vector<int32_t>& rrows;  // receiving side's rows, by source block
  const std::vector<int64_t>& sat;
  const std::vector<int64_t>& rat;
  int64_t sld, rld;  // rows a batch row on each side
  std::vector<int64_t> sbat, rbat;  // the blocks' offsets in the buffers (the self block left out)
};
Direction direction(const V4CpKeys& k, bool to_held) {
  Direction d{to_held ? k.send_rows : k.recv_rows, to_held ? k.recv_rows : k.send_rows,
              to_held ? k.send_at : k.recv_at,     to_held ? k.recv_at : k.send_at,
              to_held ? 2 * k.c : k.np,            to_held ? k.np : 2 * k.c,
              {},                                  {}};
  d.sbat = remote_at(d.sat, k.rank), d.rbat = remote_at(d.rat, k.rank);
  return d;
}

V4HaloMove halo_start(const ContextParallel& cp, const V4CpKeys& k, int64_t B, const float* from, int64_t w,
                      bool to_held, StackArena& A) {
  const Direction d = direction(k, to_held);
  V4HaloMove g;
  g.from = from, g.B = B, g.w = w, g.to_held = to_held;
  g.sb = A.alloc<float>(std::max<int64_t>(d.sbat.back() * B * w, 1));
  g.rb = A.alloc<float>(std::max<int64_t>(d.rbat.back() * B * w, 1));
  pack_rows(d.srows, d.sat, d.sbat, k.rank, B, d.sld, from, g.sb, w);
  g.h = exchange_start(cp, d.sbat, d.rbat, B, w, g.sb, g.rb);
  return g;
}

void halo_finish(const ContextParallel& cp, const V4CpKeys& k, V4HaloMove& g, float* to) {
  const Direction d = direction(k, g.to_held);
  const double t0 = now_ms();
  g.h.wait();
  cp.wait_ms += now_ms() - t0;
  copy_own(k, g.B, g.from, to, g.w, g.to_held);
  unpack_rows(d.rrows, d.rat, d.rbat, k.rank, g.B, d.rld, g.rb, to, g.w, !g.to_held);
}

}  // namespace

V4HaloMove v4_cp_halo_gather_start(const ContextParallel& cp, const V4CpKeys& k, int64_t B, const float* local,
                                   int64_t w, StackArena& A) {
  return halo_start(cp, k, B, local, w, true, A);
}

void v4_cp_halo_gather_finish(const ContextParallel& cp, const V4CpKeys& k, V4HaloMove& g, float* held) {
  TREX_CHECK(g.to_held, "v4_cp_halo_gather_finish: the move was not started by v4_cp_halo_gather_start");
  halo_finish(cp, k, g, held);
}

void v4_cp_halo_gather(const ContextParallel& cp, const V4CpKeys& k, int64_t B, const float* local, float* held,
                       int64_t w, StackArena& A) {
  const auto mk = A.mark();
  V4HaloMove g = halo_start(cp, k, B, local, w, true, A);
  halo_finish(cp, k, g, held);
  A.release(mk);
}

void v4_cp_halo_return(const ContextParallel& cp, const V4CpKeys& k, int64_t B, const float* held, float* local,
                       int64_t w, StackArena& A) {
  const auto mk = A.mark();
  V4HaloMove g = halo_start(cp, k, B, held, w, false, A);
  halo_finish(cp, k, g, local);
  A.release(mk);
}

void v4_cp_halo_return_cols(const Ctx& c, const ContextParallel& cp, const V4CpKeys& k, int64_t B,
                            std::initializer_list<ColsIn> held, std::initializer_list<ColsOut> local) {
  int64_t w = 0;
  for (const ColsIn& q : held) w += q.cols;
  const int64_t NK = B * k.np, N = B * 2 * k.c;
  StackArena& A = *c.ws;
  const auto mk = A.mark();
  float* all = A.alloc<float>(NK * w);
  float* loc = A.alloc<float>(N * w);
  pack_cols(c, all, w, NK, held);
  v4_cp_halo_return(cp, k, B, all, loc, w, A);
  unpack_cols(c, loc, w, N, local);
  A.release(mk);
}

namespace {

// [size][B][2][emax][w] (the entries' collective order) <-> [B][nw][w]: every chunk's entries.
void permute_entries(const ContextParallel& cp, const V4CpKeys& k, int64_t B, const float* from, float* to,
                     int64_t w, bool to_rows) {
  const int size = cp.size;
  for (int q = 0; q < size; ++q)
    for (int64_t b = 0; b < B; ++b)
      for (int h = 0; h < 2; ++h) {
        const int64_t ch = h == 0 ? q : 2 * size - 1 - q, n = k.chunk_n[ch];
        const int64_t gi = (((q * B + b) * 2 + h) * k.emax) * w, ei = (b * k.nw + k.chunk_e0[ch]) * w;
        if (n == 0) continue;
        if (to_rows) std::memcpy(to + ei, from + gi, n * w * sizeof(float));
        else std::memcpy(to + gi, from + ei, n * w * sizeof(float));
      }
}

}  // namespace

void v4_cp_entries_gather(const ContextParallel& cp, const V4CpKeys& k, int64_t B, const float* own, float* all,
                          int64_t w, StackArena& A) {
  const int64_t n = B * 2 * k.emax * w;
  if (n == 0) return;
  const auto mk = A.mark();
  float* buf = A.alloc<float>(cp.size * n);
  std::memcpy(buf + cp.rank * n, own, n * sizeof(float));
  const double t0 = now_ms();
  cp.comm->all_gather(buf + cp.rank * n, buf, (size_t)n, DType::F32);
  cp.wait_ms += now_ms() - t0;
  permute_entries(cp, k, B, buf, all, w, true);
  A.release(mk);
}

void v4_cp_entries_return(const ContextParallel& cp, const V4CpKeys& k, int64_t B, const float* all, float* own,
                          int64_t w, StackArena& A) {
  const int64_t n = B * 2 * k.emax * w;
  if (n == 0) return;
  const auto mk = A.mark();
  float* buf = A.alloc<float>(cp.size * n);
  std::memset(buf, 0, (size_t)(cp.size * n) * sizeof(float));
  permute_entries(cp, k, B, all, buf, w, false);
  const double t0 = now_ms();
  cp.comm->reduce_scatter(buf, buf + cp.rank * n, (size_t)n, DType::F32, parallel::ReduceOp::Sum);
  cp.wait_ms += now_ms() - t0;
  std::memcpy(own, buf + cp.rank * n, n * sizeof(float));
  A.release(mk);
}

int32_t* v4_cp_entry_positions(const V4CpKeys& k, int64_t B, int64_t m, StackArena& A) {
  int32_t* p = A.alloc<int32_t>(std::max<int64_t>(B * 2 * k.emax, 1));
  p[0] = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int h = 0; h < 2; ++h)
      for (int64_t j = 0; j < k.emax; ++j)
        p[(b * 2 + h) * k.emax + j] = (int32_t)(j < k.own[h].n ? (k.own[h].e0 + j) * m : 0);
  return p;
}

namespace {

int64_t max_pool_rows(const V4CpKeys& k) { return std::max(k.own[0].L, k.own[1].L); }

}  // namespace

void v4_cp_pool_fwd(const Ctx& c, const V4CpKeys& k, int64_t B, int64_t m, int64_t hd, int cc, const float* kv,
                    const float* gate, const float* pb, float* pool) {
  const int64_t C = cc * hd;
  c.k().zero(pool, (size_t)std::max<int64_t>(B * 2 * k.emax * hd, 1) * sizeof(float));
  const int64_t Lmax = max_pool_rows(k);
  if (Lmax == 0) return;
  StackArena& A = *c.ws;
  const auto mk = A.mark();
  float* t = A.alloc<float>(Lmax / m * hd);
  for (int64_t b = 0; b < B; ++b)
    for (int h = 0; h < 2; ++h) {
      const V4CpKeys::Own& o = k.own[h];
      if (o.n == 0) continue;
      const int64_t r0 = b * k.np + k.slot[o.s0];
      c.k().compress_pool_fwd(1, o.L, m, hd, cc, kv + r0 * C, gate + r0 * C, pb, t);
      c.k().copy(pool + ((b * 2 + h) * k.emax) * hd, t + o.skip * hd, o.n * hd * sizeof(float));
    }
  A.release(mk);
}

void v4_cp_pool_bwd(const Ctx& c, const V4CpKeys& k, int64_t B, int64_t m, int64_t hd, int cc, const float* kv,
                    const float* gate, const float* pb, const float* dpool, float* dkv, float* dgate, float* dpb) {
  const int64_t C = cc * hd, Lmax = max_pool_rows(k);
  if (Lmax == 0) return;
  StackArena& A = *c.ws;
  const auto mk = A.mark();
  float* dt = A.alloc<float>(Lmax / m * hd);
  float* dk = A.alloc<float>(Lmax * C);
  float* dg = A.alloc<float>(Lmax * C);
  float* work = A.alloc<float>(std::max<size_t>(kern::compress_pool_bwd_workspace_floats(1, Lmax, m, hd, cc), 1));
  for (int64_t b = 0; b < B; ++b)
    for (int h = 0; h < 2; ++h) {
      const V4CpKeys::Own& o = k.own[h];
      if (o.n == 0) continue;
      const int64_t r0 = b * k.np + k.slot[o.s0];
      c.k().zero(dt, o.skip * hd * sizeof(float));
      c.k().copy(dt + o.skip * hd, dpool + ((b * 2 + h) * k.emax) * hd, o.n * hd * sizeof(float));
      c.k().compress_pool_bwd(1, o.L, m, hd, cc, kv + r0 * C, gate + r0 * C, pb, dt, dk, dg, dpb, work);
      c.k().add(dkv + r0 * C, dk, o.L * C);
      c.k().add(dgate + r0 * C, dg, o.L * C);
    }
  A.release(mk);
}

int32_t* v4_cp_query_positions(const CpAttn& cp, int64_t B, StackArena& A) {
  const int64_t Tl = cp.split.local();
  int32_t* p = A.alloc<int32_t>(std::max<int64_t>(B * Tl, 1));
  for (int64_t i = 0; i < B * Tl; ++i) p[i] = cp.qidx[i % Tl];
  return p;
}

void v4_cp_key_lists(const kern::V4KeyShape& ks, const CpAttn& cp, const V4CpKeys& k, const int32_t* seg,
                     const int32_t* cnt, const int32_t* sel, int64_t* off, int32_t** idx, StackArena& A) {
  const int64_t B = ks.B, T = ks.T, Tl = cp.split.local(), Nl = B * Tl, topk = ks.topk;
  TREX_CHECK(T == cp.split.T, "v4_cp_key_lists: rows of ", T, " positions, split made for ", cp.split.T);
  // Local query i is whole-row query g(i) = b T + qidx[i % Tl]; the selection moves to those rows
  // (the other rows' stay empty: nothing reads them) so the lists are one process's, row for row.
  auto whole = [&](int64_t i) { return (i / Tl) * T + cp.qidx[i % Tl]; };
  // (Heap scratch: the arena keeps only the lists.)
  std::vector<int32_t> vcnt, vsel;
  if (ks.kind == kern::V4Keys::Csa) {
    vcnt.assign(B * T, 0), vsel.assign(std::max<int64_t>(B * T * topk, 1), -1);
    for (int64_t i = 0; i < Nl; ++i) {
      const int64_t g = whole(i);
      vcnt[g] = cnt[i];
      std::memcpy(vsel.data() + g * topk, sel + i * topk, topk * sizeof(int32_t));
    }
  }
  const int32_t* wcnt = vcnt.empty() ? nullptr : vcnt.data();
  const int32_t* wsel = vsel.empty() ? nullptr : vsel.data();
  off[0] = 0;
  for (int64_t i = 0; i < Nl; ++i) off[i + 1] = off[i] + kern::hd::v4_query_keys(ks, seg, wcnt, wsel, whole(i), nullptr);
  int32_t* out = A.alloc<int32_t>(std::max<int64_t>(off[Nl], 1));
  // The whole rows' key rows b T + u and B T + b nw + w, renumbered to the held rows b np + slot[u]
  // and B np + b nw + w.
  const int64_t NT = B * T, NH = B * k.np;
  std::atomic<int64_t> missing{-1};  // a sliding row not held (a planning error): its sequence index
  parallel_for(Nl, 64, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      int32_t* o = out + off[i];
      const int64_t n = kern::hd::v4_query_keys(ks, seg, wcnt, wsel, whole(i), o);
      for (int64_t j = 0; j < n; ++j) {
        const int64_t r = o[j];
        if (r >= NT) {
          o[j] = (int32_t)(r - NT + NH);
        } else {
          const int32_t at = k.slot[r % T];
          if (at < 0) missing = r % T;
          o[j] = (int32_t)((r / T) * k.np + std::max(at, 0));
        }
      }
    }
  });
  TREX_CHECK(missing < 0, "v4_cp_key_lists: a local query attends row ", missing.load(), " that rank ",
             cp.split.rank, " does not hold");
  *idx = out;
}

}  // namespace trex::model
