#include "plan/layout.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include "core/error.h"

namespace trex::plan {

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::None: return "none";
    case Recompute::Selective: return "selective";
    case Recompute::Full: return "full";
  }
  return "?";
}
std::string recompute_label(const Layout& l) {
  if (!l.recompute_mlp || l.recompute == Recompute::Full) return recompute_name(l.recompute);
  return l.recompute == Recompute::None ? "mlp" : std::string(recompute_name(l.recompute)) + "+mlp";
}
const char* schedule_name(Schedule s) { return s == Schedule::OneF1B ? "1f1b" : "dualpipe"; }
const char* precision_name(Precision p) {
  switch (p) {
    case Precision::BF16: return "bf16";
    case Precision::FP8: return "fp8";
    case Precision::FP8Tensor: return "fp8-tensor";
    case Precision::MXFP8: return "mxfp8";
    case Precision::MXFP4: return "mxfp4";
  }
  return "?";
}

const char* graphs_name(Graphs g) {
  switch (g) {
    case Graphs::Off: return "off";
    case Graphs::Partial: return "partial";
    case Graphs::Full: return "full";
  }
  return "?";
}

namespace {

const char* kLayoutHint =
    "layout keys: dp tp pp ep etp cp mbs gbs seq recompute(none|selective|full|mlp|selective+mlp) zero(0-3) schedule(1f1b|dualpipe) "
    "vp(>=1) precision(bf16|fp8|fp8-block|fp8-tensor|mxfp8|mxfp4) overlap(ep+tp+dp+pp+cp|all|none) mtp(0|1) "
    "moments(f32|bf16) grads(f32|bf16) dedup(0|1) graphs(off|partial|full) param_gather(overlap|exposed) "
    "expert_load(>=1) indexer_loss(0|1), e.g. dp=8,tp=2,pp=4,ep=8";

int64_t to_int(const std::string& k, const std::string& v, int64_t min) {
  size_t pos = 0;
  double x = 0;
  try {
    x = std::stod(v, &pos);
  } catch (...) {
    pos = 0;
  }
  TREX_USER_CHECK(pos == v.size() && x == std::floor(x) && x >= (double)min, kLayoutHint, "layout: ", k, "=", v,
                  " must be an integer >= ", min);
  return (int64_t)x;
}

bool to_bool(const std::string& k, const std::string& v) {
  if (v == "1" || v == "true" || v == "on") return true;
  if (v == "0" || v == "false" || v == "off") return false;
  TREX_USER_FAIL(kLayoutHint, "layout: ", k, "=", v, " must be 0 or 1");
}

int dtype_bytes(const std::string& k, const std::string& v) {
  if (v == "f32" || v == "fp32") return 4;
  if (v == "bf16") return 2;
  TREX_USER_FAIL(kLayoutHint, "layout: ", k, "=", v, " must be f32 or bf16");
}

}  // namespace

Layout parse_layout(const std::string& s, Layout l) {
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    auto eq = item.find('=');
    TREX_USER_CHECK(eq != std::string::npos, kLayoutHint, "layout: '", item, "' is not key=value");
    std::string k = item.substr(0, eq), v = item.substr(eq + 1);
    if (k == "dp") l.dp = to_int(k, v, 1);
    else if (k == "tp") l.tp = to_int(k, v, 1);
    else if (k == "cp") l.cp = to_int(k, v, 1);
    else if (k == "pp") l.pp = to_int(k, v, 1);
    else if (k == "ep") l.ep = to_int(k, v, 1);
    else if (k == "etp") l.etp = to_int(k, v, 1);
    else if (k == "vp") l.vp = to_int(k, v, 1);
    else if (k == "mbs" || k == "micro_batch") l.mbs = to_int(k, v, 1);
    else if (k == "gbs" || k == "global_batch") l.gbs = to_int(k, v, 1);
    else if (k == "seq") l.seq = to_int(k, v, 1);
    else if (k == "zero") {
      l.zero = (int)to_int(k, v, 0);
      TREX_USER_CHECK(l.zero <= 3, kLayoutHint, "layout: zero=", v, " must be 0, 1, 2 or 3");
    } else if (k == "recompute") {
      l.recompute = Recompute::None;
      l.recompute_mlp = false;
      std::stringstream vs(v);
      std::string part;
      int modes = 0;
      while (std::getline(vs, part, '+')) {
        if (part == "none") l.recompute = Recompute::None, ++modes;
        else if (part == "selective") l.recompute = Recompute::Selective, ++modes;
        else if (part == "full") l.recompute = Recompute::Full, ++modes;
        else if (part == "mlp") l.recompute_mlp = true;
        else TREX_USER_FAIL(kLayoutHint, "layout: recompute=", v, " must be none, selective, full, mlp or selective+mlp");
      }
      TREX_USER_CHECK(modes <= 1 && !(l.recompute == Recompute::Full && l.recompute_mlp), kLayoutHint, "layout: recompute=",
                      v, " must be none, selective, full, mlp or selective+mlp (full already replays the MLP)");
    } else if (k == "schedule") {
      if (v == "1f1b") l.schedule = Schedule::OneF1B;
      else if (v == "dualpipe") l.schedule = Schedule::DualPipe;
      else TREX_USER_FAIL(kLayoutHint, "layout: schedule=", v, " must be 1f1b or dualpipe");
    } else if (k == "precision") {
      if (v == "bf16") l.precision = Precision::BF16;
      else if (v == "fp8" || v == "fp8-block") l.precision = Precision::FP8;
      else if (v == "fp8-tensor") l.precision = Precision::FP8Tensor;
      else if (v == "mxfp8") l.precision = Precision::MXFP8;
      else if (v == "mxfp4" || v == "nvfp4") l.precision = Precision::MXFP4;
      else
        TREX_USER_FAIL(kLayoutHint, "layout: precision=", v,
                       " must be bf16, fp8 (= fp8-block), fp8-tensor, mxfp8 or mxfp4 (= nvfp4)");
    } else if (k == "graphs") {
      if (v == "off" || v == "none") l.graphs = Graphs::Off;
      else if (v == "partial") l.graphs = Graphs::Partial;
      else if (v == "full") l.graphs = Graphs::Full;
      else TREX_USER_FAIL(kLayoutHint, "layout: graphs=", v, " must be off, partial or full");
    } else if (k == "overlap") {
      l.overlap_ep = l.overlap_tp = l.overlap_dp = l.overlap_pp = l.overlap_cp = false;
      if (v == "all") l.overlap_ep = l.overlap_tp = l.overlap_dp = l.overlap_pp = l.overlap_cp = true;
      else if (v != "none") {
        std::stringstream vs(v);
        std::string o;
        while (std::getline(vs, o, '+')) {
          if (o == "ep") l.overlap_ep = true;
          else if (o == "tp") l.overlap_tp = true;
          else if (o == "dp") l.overlap_dp = true;
          else if (o == "pp") l.overlap_pp = true;
          else if (o == "cp") l.overlap_cp = true;
          else TREX_USER_FAIL(kLayoutHint, "layout: overlap part '", o, "' must be ep, tp, dp, pp or cp");
        }
      }
    } else if (k == "mtp") l.mtp = to_bool(k, v);
    else if (k == "indexer_loss") l.indexer_loss = to_bool(k, v);
    else if (k == "moments") l.moment_bytes = dtype_bytes(k, v);
    else if (k == "grads") l.grad_bytes = dtype_bytes(k, v);
    else if (k == "dedup") l.ep_dedup = to_bool(k, v);
    else if (k == "param_gather") {
      if (v == "overlap") l.overlap_param_gather = true;
      else if (v == "exposed") l.overlap_param_gather = false;
      else TREX_USER_FAIL(kLayoutHint, "layout: param_gather=", v, " must be overlap or exposed");
    }
    else if (k == "expert_load") {
      double x = 0;
      try {
        x = std::stod(v);
      } catch (...) {
      }
      TREX_USER_CHECK(x >= 1.0, kLayoutHint, "layout: expert_load=", v, " must be a number >= 1");
      l.expert_load = x;
    } else TREX_USER_FAIL(kLayoutHint, "layout: unknown key '", k, "'");
  }
  return l;
}

std::vector<std::string> layout_keys(const std::string& s) {
  std::vector<std::string> keys;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    std::string k = item.substr(0, item.find('='));
    if (k == "micro_batch") k = "mbs";
    if (k == "global_batch") k = "gbs";
    if (!k.empty()) keys.push_back(k);
  }
  return keys;
}

std::string layout_string(const Layout& l) {
  std::string ov;
  for (auto [on, n] : {std::pair{l.overlap_ep, "ep"}, {l.overlap_tp, "tp"}, {l.overlap_dp, "dp"}, {l.overlap_pp, "pp"},
                       {l.overlap_cp && l.cp > 1, "cp"}})
    if (on) ov += (ov.empty() ? "" : "+") + std::string(n);
  // (cp is written when > 1, so one-rank-per-sequence layouts read as before.)
  return detail::cat("dp=", l.dp, ",tp=", l.tp, ",pp=", l.pp, ",ep=", l.ep, ",etp=", l.etp,
                     l.cp > 1 ? detail::cat(",cp=", l.cp) : std::string(), ",mbs=", l.mbs,
                     ",gbs=", l.gbs, ",seq=", l.seq, ",recompute=", recompute_label(l), ",zero=", l.zero,
                     ",schedule=", schedule_name(l.schedule), ",vp=", l.vp, ",precision=", precision_name(l.precision),
                     ",overlap=", ov.empty() ? "none" : ov, ",mtp=", l.mtp ? 1 : 0,
                     ",moments=", l.moment_bytes == 4 ? "f32" : "bf16", ",grads=", l.grad_bytes == 4 ? "f32" : "bf16",
                     ",dedup=", l.ep_dedup ? 1 : 0, ",graphs=", graphs_name(l.graphs), ",expert_load=", l.expert_load,
                     l.overlap_param_gather ? "" : ",param_gather=exposed", l.indexer_loss ? ",indexer_loss=1" : "");
}

std::vector<std::string> layout_problems(Layout& l, const ArchModel& a, int64_t devices) {
  using detail::cat;
  std::vector<std::string> p;
  if (devices < 1) return {cat("--devices must be >= 1, got ", devices)};
  if (l.dp == 0) {
    if (devices % (l.tp * l.pp * l.cp) != 0) {
      p.push_back(cat("devices (", devices, ") must be divisible by tp*pp*cp (", l.tp, "*", l.pp, "*", l.cp, " = ",
                      l.tp * l.pp * l.cp, ") to derive dp"));
      return p;
    }
    l.dp = devices / (l.tp * l.pp * l.cp);
  }
  if (l.world() != devices)
    p.push_back(cat("dp*cp*tp*pp (", l.dp, "*", l.cp, "*", l.tp, "*", l.pp, " = ", l.world(),
                    ") must equal the devices (", devices, ")"));
  if (l.gbs == 0) l.gbs = 4 * devices / l.cp;  // (4 sequences per device; a sequence spans cp devices)
  if (l.cp > 1 && l.seq % (2 * l.cp) != 0)
    p.push_back(cat("seq (", l.seq, ") must be divisible by 2*cp (2*", l.cp, " = ", 2 * l.cp,
                    "): each cp rank holds two of the 2 cp chunks of a sequence"));
  if (a.heads % l.tp != 0)
    p.push_back(cat("attention heads (", a.heads, ") must be divisible by tp (", l.tp, ")"));
  if (l.pp > a.n_layers())
    p.push_back(cat("pp (", l.pp, ") must not exceed the decoder layers (", a.n_layers(), ")"));
  if (a.n_experts == 0 && (l.ep > 1 || l.etp > 1))
    p.push_back(cat("ep (", l.ep, ") and etp (", l.etp, ") must be 1 for a model without routed experts"));
  if (a.n_experts > 0 && a.n_experts % l.ep != 0)
    p.push_back(cat("routed experts (", a.n_experts, ") must be divisible by ep (", l.ep, ")"));
  if ((l.dp * l.cp * l.tp) % (l.ep * l.etp) != 0)
    p.push_back(cat("ep*etp (", l.ep, "*", l.etp, " = ", l.ep * l.etp, ") must divide dp*cp*tp (", l.dp, "*", l.cp, "*",
                    l.tp, " = ", l.dp * l.cp * l.tp, "): expert-parallel groups are carved out of the dp x cp x tp ranks"));
  if (l.etp > 1) {
    for (const LayerCost& c : a.layers)
      if (c.moe) {
        const double I = c.expert_params / (c.n_experts * 3.0 * a.hidden);
        if (std::fmod(I, (double)l.etp) != 0) {
          p.push_back(cat("expert intermediate size (", I, ") must be divisible by etp (", l.etp, ")"));
          break;
        }
      }
  }
  if (l.gbs % (l.dp * l.mbs) != 0)
    p.push_back(cat("global batch (", l.gbs, " sequences) must be divisible by dp*mbs (", l.dp, "*", l.mbs, " = ",
                    l.dp * l.mbs, ")"));
  else if (l.schedule == Schedule::DualPipe) {
    if (l.pp % 2 != 0 || l.pp < 2) p.push_back(cat("dualpipe needs an even pp >= 2, got pp = ", l.pp));
    const int64_t m = l.micro_batches();
    if (m % 2 != 0 || m < l.pp)
      p.push_back(cat("dualpipe needs an even number of micro-batches (gbs/(dp*mbs) = ", m, ") >= pp (", l.pp, ")"));
  }
  if (l.vp > 1) {
    if (l.schedule != Schedule::OneF1B) p.push_back(cat("vp (", l.vp, ") > 1 is interleaved 1F1B: use schedule=1f1b"));
    if (l.pp < 2) p.push_back(cat("vp (", l.vp, ") > 1 needs pp >= 2, got pp = ", l.pp));
    if (l.pp * l.vp > a.n_layers())
      p.push_back(cat("pp*vp (", l.pp, "*", l.vp, " = ", l.pp * l.vp,
                      ") model chunks must not exceed the decoder layers (", a.n_layers(), ")"));
    if (l.gbs % (l.dp * l.mbs) == 0 && l.micro_batches() % l.pp != 0)
      p.push_back(cat("interleaved 1F1B (vp > 1) needs the micro-batches (", l.micro_batches(),
                      ") to be a multiple of pp (", l.pp, ")"));
  }
  if (l.zero == 3 && l.pp > 1)
    p.push_back(cat("zero=3 with pp (", l.pp, ") > 1 is not modelled: use zero<=2 with pipeline parallel"));
  if (a.mtp_modules == 0 && l.mtp) p.push_back("mtp=1 but the model has no MTP modules (num_nextn_predict_layers = 0)");
  if (l.indexer_loss &&
      std::none_of(a.layers.begin(), a.layers.end(), [](const LayerCost& L) { return L.attn.index_topk > 0; }))
    p.push_back("indexer_loss=1 but the model has no sparse-attention indexer (DeepSeek-V3.2 / V4 CSA layers)");
  return p;
}

void validate_layout(Layout& l, const ArchModel& a, int64_t devices) {
  auto p = layout_problems(l, a, devices);
  if (p.empty()) return;
  std::string all;
  for (size_t i = 0; i < p.size(); ++i) all += (i ? "; " : "") + p[i];
  TREX_USER_FAIL("change --layout or --devices so that every product and divisibility holds", "invalid layout for ",
                 a.name, " on ", devices, " devices: ", all);
}

std::vector<int64_t> stage_layers(const std::vector<double>& w, double first_extra, double last_extra, int64_t pp,
                                  bool paired) {
  const int64_t L = (int64_t)w.size();
  TREX_CHECK(pp >= 1 && L >= pp, "stage_layers: ", L, " layers over ", pp, " stages");
  std::vector<double> pre(L + 1, 0);
  for (int64_t i = 0; i < L; ++i) pre[i + 1] = pre[i] + w[i];
  // best[s][i]: (max stage weight, sum of squared stage weights) splitting layers [0, i) into s stages.
  using Cost = std::pair<double, double>;
  const Cost inf{1e300, 1e300};
  std::vector<std::vector<Cost>> best(pp + 1, std::vector<Cost>(L + 1, inf));
  std::vector<std::vector<int64_t>> cut(pp + 1, std::vector<int64_t>(L + 1, -1));
  best[0][0] = {0, 0};
  for (int64_t s = 1; s <= pp; ++s)
    for (int64_t i = s; i <= L - (pp - s); ++i)
      for (int64_t j = s - 1; j < i; ++j) {
        if (best[s - 1][j].first >= 1e300) continue;
        double wt = pre[i] - pre[j] + (s == 1 ? first_extra : 0) + (s == pp ? last_extra : 0);
        Cost c{std::max(best[s - 1][j].first, wt), best[s - 1][j].second + wt * wt};
        const double tol = 1e-9 * std::max(1.0, c.first);
        const bool better = c.first < best[s][i].first - tol ||
                            (c.first <= best[s][i].first + tol && c.second < best[s][i].second);
        if (better) best[s][i] = c, cut[s][i] = j;
      }
  std::vector<int64_t> n(pp);
  for (int64_t s = pp, i = L; s >= 1; --s) {
    const int64_t j = cut[s][i];
    n[s - 1] = i - j;
    i = j;
  }
  if (!paired || pp < 2) return n;
  // DualPipe: rank r runs stages r and pp-1-r. Move one layer across a stage boundary while that
  // lowers (heaviest rank, sum of squared rank loads).
  auto score = [&](const std::vector<int64_t>& c) {
    std::vector<double> sw(pp);
    for (int64_t s = 0, i = 0; s < pp; i += c[s], ++s)
      sw[s] = pre[i + c[s]] - pre[i] + (s == 0 ? first_extra : 0) + (s == pp - 1 ? last_extra : 0);
    Cost r{0, 0};
    for (int64_t k = 0; k < pp / 2 + pp % 2; ++k) {
      const double x = sw[k] + (pp - 1 - k != k ? sw[pp - 1 - k] : 0);
      r.first = std::max(r.first, x);
      r.second += x * x;
    }
    return r;
  };
  Cost cur = score(n);
  for (int iter = 0; iter < 4 * L; ++iter) {
    std::vector<int64_t> bestn;
    Cost bestc = cur;
    for (int64_t b = 0; b + 1 < pp; ++b)
      for (int dir : {-1, 1}) {
        std::vector<int64_t> c = n;
        c[b] += dir;
        c[b + 1] -= dir;
        if (c[b] < 1 || c[b + 1] < 1) continue;
        Cost x = score(c);
        const double tol = 1e-9 * std::max(1.0, x.first);
        if (x.first < bestc.first - tol || (x.first <= bestc.first + tol && x.second < bestc.second - tol))
          bestc = x, bestn = c;
      }
    if (bestn.empty()) break;
    n = bestn;
    cur = bestc;
  }
  return n;
}

std::vector<int64_t> rank_chunks(const Layout& l, int64_t r) {
  if (l.schedule == Schedule::DualPipe && l.pp - 1 - r != r) return {r, l.pp - 1 - r};
  return {r};
}

}  // namespace trex::plan
