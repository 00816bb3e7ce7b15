// Lightning-indexer top-k (kernels/indexer.h): selection semantics (causal threshold with
// positions that are not t, topk > nw, topk < valid count, negative weights, zero scores and ties,
// NaN, empty cases), the dispatched kernel against the reference, and a case against the real
// Hugging Face DeepseekV4Indexer (numbers pasted below, script in the comment).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/rng.h"
#include "kernels/indexer.h"
#include "kernels/ref/indexer.h"

namespace {

using trex::kern::IndexerShape;

struct Out {
  std::vector<int32_t> cnt, sel;
  std::vector<float> scores;
};

// Runs the dispatched kernel (with scores_out) and checks that it selects the same without it.
Out run(const IndexerShape& sh, const std::vector<float>& q, const std::vector<float>& k,
        const std::vector<float>& w, const std::vector<int32_t>& pos) {
  const size_t nq = sh.B * sh.T;
  Out o{std::vector<int32_t>(nq, 77), std::vector<int32_t>(nq * sh.topk, 77), std::vector<float>(nq * sh.nw, 7.f)};
  std::vector<float> ws(trex::kern::indexer_workspace_floats(sh));
  trex::kern::indexer_topk(sh, q.data(), k.data(), w.data(), pos.data(), o.cnt.data(), o.sel.data(), o.scores.data(),
                           ws.data());
  std::vector<int32_t> cnt2(nq), sel2(nq * sh.topk);
  trex::kern::indexer_topk(sh, q.data(), k.data(), w.data(), pos.data(), cnt2.data(), sel2.data(), nullptr, ws.data());
  EXPECT_EQ(cnt2, o.cnt);
  EXPECT_EQ(sel2, o.sel);
  return o;
}

Out run_ref(const IndexerShape& sh, const std::vector<float>& q, const std::vector<float>& k,
            const std::vector<float>& w, const std::vector<int32_t>& pos) {
  const size_t nq = sh.B * sh.T;
  Out o{std::vector<int32_t>(nq), std::vector<int32_t>(nq * sh.topk), std::vector<float>(nq * sh.nw)};
  trex::kern::ref::indexer_topk<float>(sh, q.data(), k.data(), w.data(), pos.data(), o.cnt.data(), o.sel.data(),
                                       o.scores.data());
  return o;
}

std::vector<int32_t> row(const Out& o, int64_t i, int topk) {
  return std::vector<int32_t>(o.sel.begin() + i * topk, o.sel.begin() + (i + 1) * topk);
}

// nh = 1, dI = 1, q = 1, w = 1, scale = 1: score[s] = relu(k[s]) = s + 1 with k[s] = s + 1.
TEST(Indexer, CausalThresholdWithPositionsNotT) {
  const int64_t nw = 6;
  const std::vector<int32_t> pos = {5, 0, 3, 11, -1, 7, 100, -9};
  IndexerShape sh{1, static_cast<int64_t>(pos.size()), nw, 1, 1, 4, 2, 1.f};
  std::vector<float> q(pos.size(), 1.f), w(pos.size(), 1.f), k(nw);
  for (int64_t s = 0; s < nw; ++s) k[s] = static_cast<float>(s + 1);
  for (const Out& o : {run(sh, q, k, w, pos), run_ref(sh, q, k, w, pos)}) {
    // valid counts floor((pos + 1) / 4) clamped to [0, 6]: 1, 0, 1, 3, 0, 2, 6, 0
    EXPECT_EQ(o.cnt, (std::vector<int32_t>{1, 0, 1, 2, 0, 2, 2, 0}));
    EXPECT_EQ(row(o, 0, 2), (std::vector<int32_t>{0, -1}));
    EXPECT_EQ(row(o, 1, 2), (std::vector<int32_t>{-1, -1}));
    EXPECT_EQ(row(o, 3, 2), (std::vector<int32_t>{1, 2}));  // best 2 of {0, 1, 2}
    EXPECT_EQ(row(o, 5, 2), (std::vector<int32_t>{0, 1}));
    EXPECT_EQ(row(o, 6, 2), (std::vector<int32_t>{4, 5}));
    EXPECT_EQ(row(o, 7, 2), (std::vector<int32_t>{-1, -1}));
    // scores_out: the score where valid, -inf for future entries
    EXPECT_EQ(o.scores[0 * nw + 0], 1.f);
    EXPECT_EQ(o.scores[0 * nw + 1], -std::numeric_limits<float>::infinity());
    EXPECT_EQ(o.scores[3 * nw + 2], 3.f);
    EXPECT_EQ(o.scores[3 * nw + 3], -std::numeric_limits<float>::infinity());
    EXPECT_EQ(o.scores[6 * nw + 5], 6.f);
  }
}

TEST(Indexer, TopkLargerThanNw) {
  const int64_t nw = 6;
  const std::vector<int32_t> pos = {100, 9};
  IndexerShape sh{1, 2, nw, 1, 1, 4, 10, 1.f};
  std::vector<float> q(2, 1.f), w(2, 1.f), k = {3, -1, 2, 5, 0, 1};
  for (const Out& o : {run(sh, q, k, w, pos), run_ref(sh, q, k, w, pos)}) {
    EXPECT_EQ(o.cnt, (std::vector<int32_t>{6, 2}));
    EXPECT_EQ(row(o, 0, 10), (std::vector<int32_t>{0, 1, 2, 3, 4, 5, -1, -1, -1, -1}));
    EXPECT_EQ(row(o, 1, 10), (std::vector<int32_t>{0, 1, -1, -1, -1, -1, -1, -1, -1, -1}));
  }
}

// Two heads with weights (1, -1) and q = (1, -1): score = relu(k) - relu(-k) = k (negative
// weights give negative scores). topk = 3 < 8 valid entries.
TEST(Indexer, NegativeWeightsAndTopkBelowValidCount) {
  const int64_t nw = 8;
  IndexerShape sh{1, 1, nw, 2, 1, 1, 3, 0.5f};
  std::vector<float> q = {1, -1}, w = {1, -1}, k = {3, -1, 2, -5, 0.5f, 4, -0.25f, 2.5f};
  std::vector<int32_t> pos = {20};
  for (const Out& o : {run(sh, q, k, w, pos), run_ref(sh, q, k, w, pos)}) {
    EXPECT_EQ(o.cnt[0], 3);
    EXPECT_EQ(row(o, 0, 3), (std::vector<int32_t>{0, 5, 7}));
    for (int64_t s = 0; s < nw; ++s) EXPECT_FLOAT_EQ(o.scores[s], 0.5f * k[s]);
  }
  k = {-3, -1, -2, -5, -0.5f, -4, -0.25f, -2.5f};  // all negative: the least negative win
  for (const Out& o : {run(sh, q, k, w, pos), run_ref(sh, q, k, w, pos)})
    EXPECT_EQ(row(o, 0, 3), (std::vector<int32_t>{1, 4, 6}));
}

// Weights (1, -2) and q = (1, 1): score = -relu(k): entries with k <= 0 all score 0 (exact ties,
// some of them -0); the lower index wins.
TEST(Indexer, ZeroScoresTieToLowerIndex) {
  const int64_t nw = 7;
  IndexerShape sh{1, 2, nw, 2, 1, 1, 2, 1.f};
  std::vector<float> q = {1, 1, 1, 1}, w = {1, -2, 1, -2}, k = {1, 2, -1, 0, -3, -0.f, 3};
  std::vector<int32_t> pos = {6, 3};  // valid 7, 4
  for (const Out& o : {run(sh, q, k, w, pos), run_ref(sh, q, k, w, pos)}) {
    EXPECT_EQ(row(o, 0, 2), (std::vector<int32_t>{2, 3}));  // zeros at 2, 3, 4, 5
    EXPECT_EQ(row(o, 1, 2), (std::vector<int32_t>{2, 3}));
    EXPECT_EQ(o.scores[0], -1.f);
    EXPECT_EQ(o.scores[2], 0.f);
  }
  // All scores zero (w = 0): the first topk entries.
  w.assign(4, 0.f);
  for (const Out& o : {run(sh, q, k, w, pos), run_ref(sh, q, k, w, pos)}) {
    EXPECT_EQ(row(o, 0, 2), (std::vector<int32_t>{0, 1}));
    EXPECT_EQ(row(o, 1, 2), (std::vector<int32_t>{0, 1}));
  }
}

// A NaN score ranks above every number (torch.topk); NaNs among themselves by index.
TEST(Indexer, NanRanksFirst) {
  const int64_t nw = 5;
  IndexerShape sh{1, 1, nw, 1, 1, 1, 2, 1.f};
  std::vector<float> q = {1}, w = {1}, k = {1, std::numeric_limits<float>::quiet_NaN(), 5, 2, 4};
  std::vector<int32_t> pos = {10};
  for (const Out& o : {run(sh, q, k, w, pos), run_ref(sh, q, k, w, pos)}) EXPECT_EQ(row(o, 0, 2), (std::vector<int32_t>{1, 2}));
  q[0] = std::numeric_limits<float>::quiet_NaN();  // every score NaN
  for (const Out& o : {run(sh, q, k, w, pos), run_ref(sh, q, k, w, pos)}) EXPECT_EQ(row(o, 0, 2), (std::vector<int32_t>{0, 1}));
}

TEST(Indexer, EmptyCases) {
  {  // nw = 0 (T < m): nothing selectable
    IndexerShape sh{2, 3, 0, 2, 4, 4, 3, 0.5f};
    std::vector<float> q(2 * 3 * 2 * 4, 1.f), k, w(2 * 3 * 2, 1.f);
    std::vector<int32_t> pos = {0, 1, 2, 0, 1, 2};
    Out o = run(sh, q, k, w, pos);
    EXPECT_EQ(o.cnt, std::vector<int32_t>(6, 0));
    EXPECT_EQ(o.sel, std::vector<int32_t>(18, -1));
  }
  {  // topk = 0
    IndexerShape sh{1, 2, 4, 1, 1, 1, 0, 1.f};
    std::vector<float> q(2, 1.f), k = {1, 2, 3, 4}, w(2, 1.f);
    std::vector<int32_t> pos = {3, 9};
    Out o = run(sh, q, k, w, pos);
    EXPECT_EQ(o.cnt, (std::vector<int32_t>{0, 0}));
  }
}

// The dispatched kernel against the reference in double on random data (no near-ties expected:
// the selections must agree exactly).
TEST(Indexer, DispatchMatchesReference) {
  IndexerShape sh{2, 333, 333 / 4, 9, 40, 4, 17, 1.f / std::sqrt(40.f)};
  trex::Rng r(11);
  std::vector<float> q(sh.B * sh.T * sh.nh * sh.dI), k(sh.B * sh.nw * sh.dI), w(sh.B * sh.T * sh.nh);
  for (auto& v : q) v = static_cast<float>(r.normal());
  for (auto& v : k) v = static_cast<float>(r.normal());
  for (auto& v : w) v = static_cast<float>(r.normal() / 3);
  std::vector<int32_t> pos(sh.B * sh.T);
  for (int64_t t = 0; t < sh.T; ++t) pos[t] = static_cast<int32_t>(t), pos[sh.T + t] = static_cast<int32_t>(t % 150);
  Out o = run(sh, q, k, w, pos);
  std::vector<double> qd(q.begin(), q.end()), kd(k.begin(), k.end()), wd(w.begin(), w.end()), sd(sh.B * sh.T * sh.nw);
  std::vector<int32_t> cnt(sh.B * sh.T), sel(sh.B * sh.T * sh.topk);
  trex::kern::ref::indexer_topk<double>(sh, qd.data(), kd.data(), wd.data(), pos.data(), cnt.data(), sel.data(),
                                        sd.data());
  EXPECT_EQ(o.cnt, cnt);
  EXPECT_EQ(o.sel, sel);
  for (size_t i = 0; i < sd.size(); ++i) {
    if (std::isinf(sd[i])) EXPECT_EQ(o.scores[i], -std::numeric_limits<float>::infinity());
    else EXPECT_NEAR(o.scores[i], sd[i], 1e-5 * (1 + std::fabs(sd[i])));
  }
}

// ---------------------------------------------------------------------------------------------
// Against transformers' DeepseekV4Indexer (torch 2.15 in the repo's .venv), T = 20 tokens packed
// as two documents (position ids 0..11, 0..7), compress rate 2 (nw = 10), 3 heads, dI = 4,
// topk = 3; random weights; seed 1 has no tie at any selection boundary. The same run produced
// the compressor numbers of tests/ops/compress_pool_ops.cpp.
//   import torch, sys
//   from transformers.models.deepseek_v4.configuration_deepseek_v4 import DeepseekV4Config
//   from transformers.models.deepseek_v4 import modeling_deepseek_v4 as M
//   fmt = lambda t: ", ".join("%.9g" % v for v in t.detach().double().flatten().tolist())
//   torch.manual_seed(1)
//   cfg = DeepseekV4Config(hidden_size=6, head_dim=4, partial_rotary_factor=0.5, q_lora_rank=5,
//       num_hidden_layers=1, compress_rates={"compressed_sparse_attention": 2,
//       "heavily_compressed_attention": 3}, index_n_heads=3, index_head_dim=4, index_topk=3)
//   def pool_case(mod, T):
//       for p in mod.parameters(): p.data.copy_(torch.randn_like(p))
//       cap = {}
//       mod.kv_proj.register_forward_hook(lambda m, i, o: cap.__setitem__("kv", o))
//       mod.gate_proj.register_forward_hook(lambda m, i, o: cap.__setitem__("gate", o))
//       mod.kv_norm.register_forward_pre_hook(lambda m, i: cap.__setitem__("out", i[0]))
//       mod(torch.randn(1, T, 6), torch.randn(1, T, 5), torch.arange(T)[None], None, 0)
//       P = torch.randn_like(cap["out"])
//       grads = torch.autograd.grad((cap["out"] * P).sum(), [cap["kv"], cap["gate"], mod.position_bias])
//       for t in [cap["kv"], cap["gate"], mod.position_bias, cap["out"], P, *grads]: print(fmt(t))
//   pool_case(M.DeepseekV4HCACompressor(cfg), 8); pool_case(M.DeepseekV4CSACompressor(cfg), 7)
//   idx = M.DeepseekV4Indexer(cfg)
//   for p in idx.parameters(): p.data.copy_(torch.randn_like(p))
//   cap = {}
//   idx.scorer.register_forward_hook(lambda m, i, o: cap.update(q=i[0], k=i[1], h=i[2], scores=o))
//   pos = torch.tensor([list(range(12)) + list(range(8))])
//   with torch.no_grad():
//       sel = idx(torch.randn(1, 20, 6), torch.randn(1, 20, 5), pos, None, 0)
//       wts = idx.scorer.weights_proj(cap["h"]).float() * idx.scorer.weights_scaling
//   for t in [pos, cap["q"], cap["k"], wts, cap["scores"], sel]:  # ints for pos and sel
//       print(fmt(t) if t.dtype.is_floating_point else ", ".join(str(v) for v in t.flatten().tolist()))
// The output, in order: HCA then CSA compressor (kv, gate, position_bias, out = kv_norm's input,
// dout, dkv, dgate, dposition_bias: tests/ops/compress_pool_ops.cpp), then the indexer: pos, q (roped),
// k (compressed keys), wts, scores (unmasked index scores), sel (top_k_indices, -1 = invalid).
const int32_t kIdx_pos[] = {
    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 0, 1, 2, 3, 4, 5, 6, 7
};
const float kIdx_q[] = {
    -2.55535364, -1.87298441, -3.27332473, 2.07228565, 3.62437057, -1.06151116, -0.411078513, 7.19756842,
    2.89649963, -2.69042015, -4.56554508, -1.61637008, -1.56202328, 3.53071213, 0.966979504, -1.00011182,
    4.99653244, -1.2114861, 1.6986599, -0.905271828, 3.25497389, -5.65525055, 1.72720826, -1.23718619,
    -0.54213798, -1.15178752, -1.21783578, -0.672063172, -1.28083682, 1.33688509, -0.936464787, -3.39026976,
    -2.94070363, 3.91038489, -0.194135487, -0.278216779, 1.68789721, -1.85869098, 1.76865685, 0.306932509,
    -0.169708312, -2.88523102, -7.43577957, -0.899281859, 6.56767368, -5.07276344, 4.39465952, -1.9691782,
    1.16982138, 1.33732092, -1.23392475, 0.809997678, 0.177922741, -0.814150095, -3.90726566, -1.57960081,
    3.78906679, -3.78382826, 2.53039598, -0.781399548, -1.91142595, 1.43145669, 0.106832519, 0.860777974,
    2.96763515, 0.512697756, 0.851774573, 2.32502317, 0.860972762, -1.99056828, -0.166725054, 0.54278934,
    4.51326847, -1.01299679, 0.614663184, -2.30208945, -4.74295616, -1.90977621, 6.61906004, -5.85735321,
    3.40890503, -1.01382053, -0.492341995, 3.3403163, 2.89766788, 0.319127828, 3.84158707, 0.511858821,
    -3.97603941, 0.225403562, 5.84695959, -5.28668022, -3.39402866, 2.44907165, 5.07141113, 3.86398244,
    2.22834682, -2.95725775, -0.149948359, 0.823131919, -3.92706966, -0.926826, 1.06514037, 1.95457554,
    -2.32047629, 3.59746981, 1.59268332, 1.68628788, 0.388133228, 0.208795533, -0.894116759, -0.112389624,
    -1.8177774, 0.976337731, 1.3147316, -0.634057283, -2.56624293, 4.012187, 0.281566292, -0.58806777, 3.84948921,
    -0.905784428, -2.59726906, -0.00866246223, -5.95007277, 0.602443337, -5.49609184, 1.45200849, -0.664646387,
    2.44131136, 0.986877799, -4.76281977, 2.47372818, -2.89728928, -1.28464079, -0.681757927, -3.02567935,
    -0.737446845, -3.24820995, -4.00216389, 1.12514913, -2.4248383, 1.72960591, -4.48043394, 2.37233496,
    1.51035404, 2.00896406, -1.71423507, -2.18459582, -1.01714516, 2.48988676, -4.92055225, -0.546649635,
    1.55768037, 0.491086483, -1.03438914, -0.239897415, -4.64682341, -2.29942584, -0.453390121, -0.791015923,
    -1.16694093, -3.16108441, 2.27907419, -0.861572623, 1.15306818, 2.47681069, -1.65826118, 0.345326453,
    2.80049229, 0.418826997, 0.770199656, 0.541832685, -0.266757786, 0.493573546, 1.28836012, 1.2654686,
    0.0969595313, 0.737899959, -3.03633809, -1.25541103, -0.458692312, 1.96711612, -1.24939585, 2.72411323,
    -1.71637404, -1.77818739, -4.08840704, 3.02434635, -2.13721895, 5.0863905, 1.38699389, -0.650116503,
    3.61046076, -1.51742804, -0.462818146, 2.12303829, -0.784945011, -1.03984737, 3.83836079, -2.1220572,
    1.82638717, -3.88012767, 3.34680462, -2.26670957, 2.2228899, 0.0960848033, 1.53876662, 4.21073818,
    -0.383029759, 2.44283271, 1.96340895, 2.36659217, -2.49719667, -2.04112315, 3.36321259, -0.839265347,
    1.55276322, 0.515198946, 0.285748869, 0.777684391, 0.346728653, -2.43817616, 0.832094073, -2.19729638,
    2.8084445, -1.5545131, -1.78517199, 1.87104332, -2.23873281, -0.320895612, -0.104643054, -2.89485765,
    -0.631232202, 1.95276177, 3.1800797, 1.46133935, 0.501763642, -2.87561989, 0.368881822
};
const float kIdx_k[] = {
    0.729321361, -0.169222787, -0.106168658, -0.456062347, -0.474894881, -0.388041198, -0.343393028, 0.0324965864,
    -0.106962554, -0.589205265, -0.22247304, 0.11712943, -0.19548972, -0.539342701, 0.156283766, 0.283736527,
    0.0653551444, -0.462542295, 0.322292924, 0.190480322, 0.530248582, 0.467113853, -0.0329528078, 0.285589278,
    0.36668697, 0.592094243, -0.0122551993, -0.15620023, -0.101958759, -0.0875341669, 0.458032012, 0.166711494,
    0.218381196, -0.254559308, -0.0418084413, -0.482918322, -0.436867595, -0.572910547, -0.045961868, -0.155444443
};
const float kIdx_wts[] = {
    -1.19952178, 1.33513308, 0.034324564, -0.647387266, 1.01344943, -0.150631055, 0.121961839, -0.591139734,
    0.617515206, 0.835658967, 0.143038705, -0.22669664, -0.753693521, 0.0570970103, 1.15210223, -0.233834088,
    1.01668739, -1.1126951, 1.61597526, -1.12388527, -0.308882058, 1.17206156, 1.38209081, -1.5835613,
    -0.171397001, -0.146227166, 1.16952085, -0.436252356, 1.03716803, -0.082222864, -0.0842313841, -0.844264328,
    -0.172688514, 0.0926061869, 0.518214107, -1.84845901, -0.682768941, 2.40505481, -1.5545162, 1.40178728,
    -4.59075594, 1.75044417, -0.660171688, 1.74928081, -1.14383566, 0.517799139, -1.35461164, -0.419570595,
    0.541753709, 0.0950906724, -0.922691226, 1.00978649, -0.0509344116, 0.787582934, 0.519425094, 1.0361408,
    -1.50175178, 0.327268034, -1.78879893, 1.33340585
};
const float kIdx_scores[] = {
    0.065038912, -1.85795522, -0.589505315, 0.278324664, 1.28924024, 2.33318877, 0, 0.490669727, 0.039282158,
    -1.19750357, 1.78869569, -0.00115866587, -0.184882686, -0.175688833, 0.402248919, 0.733412266, 0.0880119205,
    0.016122058, 0.693203211, -0.145425856, -0.129068032, -0.0218117386, 0.0566418208, 0.0211099982, 0,
    0.0599708036, 0.141028106, 0, -0.278668582, -0.0430267304, -0.0684514642, 0.266363323, 0.344227403,
    0.266073465, 0.235274762, -0.0225259848, 0, 0.190560654, -0.0338509679, 0.224892318, 1.9049232, 0.0434458368,
    0.706488788, 0.848986804, 1.53488994, -0.571663439, -0.418065637, 0.560854793, 1.22141659, 0.32141912,
    0.0622624755, -0.284092844, -0.65728569, -0.574840426, -0.228448451, 1.2449367, 0.516296208, 0.132143244,
    -0.244562313, -0.382531196, 3.41040945, -0.297938854, -0.113283321, -0.863250077, -0.651934445, 0.647872806,
    1.1163224, -1.53182507, 0.757049561, -2.11989665, 0.831010222, 0, 0, -0.922988236, 0.357559502, 0.777005076,
    0.658967555, -0.0536980629, 1.039904, 1.49328995, -0.151355267, -0.15490827, -0.210070014, -0.26275757,
    -0.203897357, 0.51061666, 0.582559109, 0.44189322, -0.0726886168, -0.189856261, -0.0859252959, -0.00190822594,
    -0.00462723617, 0, 0, -0.0794123039, -0.12684238, 0.309262753, -0.026887713, 0.141525239, -0.237455308,
    -1.91073549, -0.73619467, -0.165177181, 0, -0.0716470033, -0.205216914, 0, -0.178706974, -0.962947607,
    -2.70667648, 0.718826473, -0.0300332606, -0.0486151315, -0.786648571, 0, 0, -0.131991461, -2.24019718,
    -0.713571906, -0.0257778168, 0.501738608, 0, 0, 0.231970623, -0.57861495, -1.36723232, 0.671025634,
    2.17041659, 2.63058281, 0.744550347, -2.67649698, -1.74110699, -0.702528238, 0.915523529, 0, 0.521163702,
    0.739492059, 1.20188236, 0.214751363, -1.26562166, 0, 0.122727253, 0.420390248, 0.492668152, -0.110398471,
    -1.11202216, 0.344528407, -0.964897156, 0, -3.22572517, 0.0150381038, -0.431203008, -0.251706451,
    -0.511964381, -0.174925372, -0.435537368, -0.288931131, -2.05985117, -0.108862475, 0.00195293559,
    -0.802837908, -0.143783748, 0.0444498546, 0.0426870845, 0.0566140115, 0.539107919, 0.000754194742, 0, 0,
    0.276970178, 0.374637246, 0.813671947, 0.590147257, 0.467885703, 0.512691677, 0.09794496, 0.143434033, 0, 0,
    0.200948402, -0.135765523, 0.182575092, 0, 0, 0.551861286, -0.519434571, 0.0605820678, 0, 0, 1.04400599,
    -0.853252769, -0.207394972, -1.76596916, -1.02733159, 0.806285381, 0.540407598, -1.58755338, 0.259574234,
    -0.850973785
};
const int32_t kIdx_sel[] = {
    -1, -1, -1, 0, -1, -1, 0, -1, -1, 1, 0, -1, 0, 1, -1, 0, 1, 2, 0, 2, 1, 0, 2, 1, 0, 1, 2, 4, 3, 1, 4, 3, 0, 1,
    5, 2, -1, -1, -1, 0, -1, -1, 0, -1, -1, 1, 0, -1, 0, 1, -1, 2, 1, 0, 0, 2, 1, 0, 2, 1
};

TEST(Indexer, MatchesHuggingFace) {
  IndexerShape sh{1, 20, 10, 3, 4, 2, 3, 0.5f};
  const std::vector<float> q(std::begin(kIdx_q), std::end(kIdx_q)), k(std::begin(kIdx_k), std::end(kIdx_k)),
      w(std::begin(kIdx_wts), std::end(kIdx_wts));
  const std::vector<int32_t> pos(std::begin(kIdx_pos), std::end(kIdx_pos));
  ASSERT_EQ(q.size(), size_t{20 * 3 * 4});
  ASSERT_EQ(k.size(), size_t{10 * 4});
  for (const Out& o : {run(sh, q, k, w, pos), run_ref(sh, q, k, w, pos)}) {
    for (int t = 0; t < 20; ++t) {
      std::vector<int32_t> want;
      for (int j = 0; j < 3; ++j)
        if (kIdx_sel[t * 3 + j] >= 0) want.push_back(kIdx_sel[t * 3 + j]);
      std::sort(want.begin(), want.end());
      EXPECT_EQ(o.cnt[t], static_cast<int32_t>(want.size())) << "t=" << t;
      want.resize(3, -1);
      EXPECT_EQ(row(o, t, 3), want) << "t=" << t;
      const int64_t nv = trex::kern::indexer_valid_count(pos[t], 2, 10);
      for (int s = 0; s < 10; ++s) {
        if (s < nv) EXPECT_NEAR(o.scores[t * 10 + s], kIdx_scores[t * 10 + s], 2e-6 * (1 + std::fabs(kIdx_scores[t * 10 + s])));
        else EXPECT_EQ(o.scores[t * 10 + s], -std::numeric_limits<float>::infinity());
      }
    }
  }
}

}  // namespace
