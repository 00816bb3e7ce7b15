// The held key rows and the exchange plan of DeepSeek-V4 under context parallelism
// (model/v4_context_parallel.h v4_cp_keys), checked against a direct count over every query and
// every compressed entry, for cp sizes, chunk lengths, windows and rates that do not divide each
// other (halos shorter and longer than a chunk, rates longer than a chunk).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "model/context_parallel.h"
#include "model/v4_context_parallel.h"

using namespace trex;
using namespace trex::model;

namespace {

CpSplit split_of(int cp, int64_t c, int rank) { return {2 * cp * c, c, rank, cp}; }

// The chunk holding sequence index u and u's rank.
int64_t chunk_of(const CpSplit& s, int64_t u) { return u / s.c; }
int rank_of(const CpSplit& s, int64_t u) {
  const int64_t ch = chunk_of(s, u);
  return (int)(ch < s.size ? ch : 2 * s.size - 1 - ch);
}

// The rows a rank must hold: the sliding keys of its queries and the windows of the entries it
// owns (those whose last token it holds), straight from the definitions (kernels/hd/v4_rows.h,
// kernels/ref/compress_pool.h).
std::set<int64_t> needed(const CpSplit& s, int64_t W, int64_t m, int cc) {
  std::set<int64_t> rows;
  for (int64_t j = 0; j < s.local(); ++j) {
    const int64_t t = s.index(j);
    for (int64_t u = std::max<int64_t>(0, t - W + 1); u <= t; ++u) rows.insert(u);
  }
  if (cc > 0)
    for (int64_t w = 0; w < s.T / m; ++w)
      if (rank_of(s, (w + 1) * m - 1) == s.rank)
        for (int64_t u = std::max<int64_t>(0, (w - cc + 1) * m); u < (w + 1) * m; ++u) rows.insert(u);
  return rows;
}

struct Layer {
  int64_t W, m;
  int cc;
};

}  // namespace

TEST(V4CpKeys, HoldWhatTheQueriesAndTheOwnEntriesNeedAndTheExchangeAgrees) {
  const Layer layers[] = {{7, 0, 0}, {11, 3, 2}, {7, 5, 1}, {1, 7, 1}, {13, 3, 2}, {2, 9, 2}, {5, 1, 1}};
  for (int cp : {1, 2, 3, 5})
    for (int64_t c : {1, 4, 7, 10})
      for (const Layer& L : layers) {
        std::vector<V4CpKeys> plans;
        for (int r = 0; r < cp; ++r) plans.push_back(v4_cp_keys(split_of(cp, c, r), L.W, L.m, L.cc));
        const int64_t T = 2 * cp * c, nw = L.m ? T / L.m : 0;
        std::vector<int> owners(nw, 0);
        for (int r = 0; r < cp; ++r) {
          const CpSplit s = split_of(cp, c, r);
          const V4CpKeys& k = plans[r];
          const std::string what = "cp " + std::to_string(cp) + " rank " + std::to_string(r) + " c " +
                                   std::to_string(c) + " W " + std::to_string(L.W) + " m " + std::to_string(L.m);
          // Held rows: ascending, every needed row, nothing beyond a halo of max(W - 1, cc m) a chunk.
          ASSERT_EQ(k.np, (int64_t)k.pos.size()) << what;
          EXPECT_TRUE(std::is_sorted(k.pos.begin(), k.pos.end())) << what;
          for (int64_t u : needed(s, L.W, L.m, L.cc)) EXPECT_GE(k.slot[u], 0) << what << " row " << u;
          for (int64_t j = 0; j < k.np; ++j) EXPECT_EQ(k.slot[k.pos[j]], j) << what;
          const int64_t halo = std::max<int64_t>(L.W - 1, L.cc * L.m);
          EXPECT_LE(k.np, 2 * c + 2 * halo) << what;
          // Own entries: chunk h's are those whose last token it holds; their pooled rows are held
          // and contiguous, and the pooling's first `skip` entries are the previous chunk's.
          for (int h = 0; h < 2; ++h) {
            const int64_t ch = h == 0 ? r : 2 * cp - 1 - r;
            const V4CpKeys::Own& o = k.own[h];
            for (int64_t j = 0; j < o.n; ++j) {
              const int64_t w = o.e0 + j;
              ASSERT_LT(w, nw) << what;
              EXPECT_EQ(chunk_of(s, (w + 1) * L.m - 1), ch) << what << " entry " << w;
              ++owners[w];
            }
            if (o.n == 0) continue;
            EXPECT_EQ(o.s0 % L.m, 0) << what;
            EXPECT_EQ(o.L % L.m, 0) << what;
            EXPECT_EQ(o.s0 + o.L, (o.e0 + o.n) * L.m) << what;
            EXPECT_EQ(o.skip + o.n, o.L / L.m) << what;
            EXPECT_EQ(o.s0, std::max<int64_t>(0, (o.e0 - L.cc + 1) * L.m)) << what;
            EXPECT_GE(k.emax, o.n) << what;
            const int32_t at = k.slot[o.s0];
            ASSERT_GE(at, 0) << what;
            for (int64_t u = o.s0; u < o.s0 + o.L; ++u) EXPECT_EQ(k.slot[u], at + (u - o.s0)) << what << " row " << u;
          }
          // The exchange: what r sends q are q's held rows that r holds as its own tokens, in q's
          // order; what r receives from q, the held rows q owns.
          ASSERT_EQ((int64_t)k.send_at.size(), cp + 1) << what;
          ASSERT_EQ((int64_t)k.recv_at.size(), cp + 1) << what;
          EXPECT_EQ(k.recv_at.back(), k.np) << what;
          // The self block pairs the rank's 2c tokens with their held rows.
          EXPECT_EQ(k.rank, r) << what;
          EXPECT_EQ(k.own_rows(), 2 * c) << what;
          EXPECT_EQ(k.recv_at[r + 1] - k.recv_at[r], 2 * c) << what;
          for (int q = 0; q < cp; ++q) {
            const V4CpKeys& kq = plans[q];
            std::vector<int64_t> sent, expected;
            for (int64_t i = k.send_at[q]; i < k.send_at[q + 1]; ++i) sent.push_back(s.index(k.send_rows[i]));
            for (int64_t i = kq.recv_at[r]; i < kq.recv_at[r + 1]; ++i) expected.push_back(kq.pos[kq.recv_rows[i]]);
            EXPECT_EQ(sent, expected) << what << " to " << q;
            for (int64_t i = k.recv_at[q]; i < k.recv_at[q + 1]; ++i)
              EXPECT_EQ(rank_of(s, k.pos[k.recv_rows[i]]), q) << what;
          }
        }
        for (int64_t w = 0; w < nw; ++w) EXPECT_EQ(owners[w], L.cc ? 1 : 0) << "entry " << w << " cp " << cp;
      }
}

// The halo, not the sequence: at 32768 tokens on cp 4 (chunks of 4096), a layer of window 128 and
// CSA rate 4 holds its 8192 tokens and two halos of 127 rows (rank 0's early chunk has none),
// where gathering whole rows held all 32768.
TEST(V4CpKeys, HoldTheHaloNotTheWholeRow) {
  const V4CpKeys k0 = v4_cp_keys(split_of(4, 4096, 0), 128, 4, 2);
  EXPECT_EQ(k0.np, 8192 + 127);
  const V4CpKeys k2 = v4_cp_keys(split_of(4, 4096, 2), 128, 4, 2);
  EXPECT_EQ(k2.np, 8192 + 2 * 127);
  EXPECT_EQ(k2.emax, 1024);
  // Sent: its own tokens to itself, and the last 127 rows of each of its chunks to the ranks
  // holding the chunks after them (3 and 6).
  EXPECT_EQ(k2.send_at.back(), 8192 + 2 * 127);
  // Its own rows are copied, not sent: 254 rows go out, 254 come in.
  EXPECT_EQ(k2.own_rows(), 8192);
  EXPECT_EQ(k2.sent_rows(), 254);
  EXPECT_EQ(k2.received_rows(), 254);
}
