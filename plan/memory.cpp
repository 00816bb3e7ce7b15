#include "plan/memory.h"

#include <algorithm>
#include "core/error.h"
#include "plan/precision.h"
#include "plan/timing.h"

namespace trex::plan {

double saved_bytes_per_token(const LayerCost& l, Recompute r, double cached_bytes, double expert_load,
                             double elem_bytes, bool mlp) {
  if (r == Recompute::Full) return (elem_bytes > 0 ? elem_bytes : 2.0) * l.input_elems;
  double b = 0;
  for (const SavedTensor& t : l.saved) {
    if (r == Recompute::Selective && t.selective) continue;
    if (mlp && t.mlp) continue;
    const double per = (cached_bytes > 0 && t.fp8_ok) ? cached_bytes : elem_bytes > 0 ? elem_bytes : (double)t.bytes;
    b += t.elems * per * (t.routed ? expert_load : 1.0);
  }
  return b;
}

namespace {

struct ChunkContent {
  double dense = 0, experts = 0;   // parameters
  double act_mb = 0;               // saved activation bytes of one micro-batch (this device's share)
  double work = 0;                 // working set held once (full-recompute layer, logits)
  bool moe = false;
};

ChunkContent chunk_content(const ArchModel& a, const ClusterSpec& s, const Layout& l, const Chunk& c) {
  ChunkContent r;
  const double eb = s.activation_bytes;
  const double fp8 = precision_model(s, l.precision).cached_bytes;
  const double tokens = l.local_tokens();
  auto add_layer = [&](const LayerCost& L) {
    r.dense += L.dense_params;
    r.experts += L.expert_params;
    r.moe = r.moe || L.moe;
    r.act_mb += tokens * saved_bytes_per_token(L, l.recompute, fp8, l.expert_load, eb, l.recompute_mlp);
    if (l.recompute == Recompute::Full)
      r.work = std::max(r.work, tokens * saved_bytes_per_token(L, Recompute::None, fp8, l.expert_load, eb));
  };
  for (int64_t i = 0; i < c.n_layers; ++i) add_layer(a.layers[c.first_layer + i]);
  if (c.embed) r.dense += a.embed_params;
  if (c.head) {
    r.dense += a.final_norm_params + ((a.tied_embeddings && c.embed) ? 0 : a.head_params);
    double logits = tokens * (double)a.vocab * 4.0;
    if (l.mtp) {
      for (int64_t m = 0; m < a.mtp_modules; ++m) {
        add_layer(a.mtp_block);
        r.dense += a.mtp_extra_params;
      }
      logits *= 1 + a.mtp_modules;  // each module's logits are held until its loss backward
    }
    r.work += logits;
  }
  return r;
}

}  // namespace

MemoryReport plan_memory(const ArchModel& a, const ClusterSpec& s, const Layout& l) {
  MemoryReport rep;
  rep.usable = s.usable_bytes();
  const std::vector<Chunk> chunks = pipeline_chunks(a, s, l);
  std::vector<ChunkContent> content;
  for (const Chunk& c : chunks) content.push_back(chunk_content(a, s, l, c));
  const int64_t m = l.micro_batches();
  RankMemory engine;  // the engine's own count (every rank: the largest stage's), where it runs the layout
  rep.engine = s.engine_memory && s.engine_memory(a, l, engine);
  const double dp = (double)l.dpcp(), edp = (double)l.edp();  // ZeRO shards: dense over dp x cp
  // bf16 weights, and f32 master + two moments; or (trex's CPU engine) the f32 master held
  // with the bf16 weights, only the moments in the optimizer state.
  const double f32m = s.replicated_f32_master ? 4.0 : 0.0;
  const double pb = 2 + f32m;
  const double ob = 4.0 - f32m + 2.0 * l.moment_bytes;

  for (int64_t r = 0; r < l.pp; ++r) {
    RankMemory rm;
    rm.rank = r;
    std::vector<int64_t> own = rank_chunks(l, r);
    double act = 0, work = 0;
    bool moe = false;
    for (int64_t ci : own) {
      const Chunk& c = chunks[ci];
      const ChunkContent& cc = content[ci];
      rm.layers += c.n_layers;
      rm.embed = rm.embed || c.embed;
      rm.head = rm.head || c.head;
      rm.dense_params += cc.dense;
      rm.expert_params += cc.experts;
      moe = moe || cc.moe;
      work = std::max(work, cc.work);
      double inflight;
      if (l.schedule == Schedule::DualPipe) inflight = std::min<double>((l.pp + 1) / 2.0, (double)m);
      else if (l.vp > 1)  // interleaved: warm-up of 2(pp-r-1) + (vp-1) pp chunk-micro-batches, + 1
        inflight = std::min<double>((2.0 * (l.pp - r - 1) + (l.vp - 1.0) * l.pp + 1) / l.vp, (double)m);
      else inflight = (double)std::min<int64_t>(l.pp - r, m);
      rm.inflight += inflight;
      act += inflight * cc.act_mb;
    }
    const double dense_dev = rm.dense_params / l.tp;
    const double exp_dev = rm.expert_params / (double)(l.ep * l.etp);
    auto sharded = [&](bool shard) { return shard ? dense_dev / dp + exp_dev / edp : dense_dev + exp_dev; };
    rm.params = pb * sharded(l.zero >= 3);
    rm.grads = l.grad_bytes * sharded(l.zero >= 2);
    rm.optimizer = ob * sharded(l.zero >= 1);
    rm.activations = act + work;
    const double tokens = l.local_tokens();
    if (moe && l.ep > 1)  // all-to-all send + receive buffers of one layer
      rm.buffers += 2.0 * tokens * a.topk * a.hidden * 2.0 * l.expert_load;
    if (l.tp > 1) rm.buffers += tokens * l.tp * a.hidden * 2.0;  // sequence-parallel all-gather
    if (l.cp > 1) {  // ring attention: a peer's chunk in flight beside the one in use, keys and values
      double mx = 0;  // (their gradients in the backward); the window's halo
      for (const LayerCost& L : a.layers) {
        const CpExchange x = cp_exchange_elems(L.attn, l.seq, l.tp);
        mx = std::max(mx, 2.0 * x.gathered / (double)l.cp + x.halo);
      }
      rm.buffers += 2.0 * (double)l.mbs * mx * 2.0;
    }
    if (s.dp_reduce_temp > 0)  // the library's copies of the in-flight gradient buckets
      rm.buffers += s.dp_reduce_temp * l.grad_bytes *
                    ((dp - 1) / dp * dense_dev + (edp - 1) / edp * exp_dev);
    if (l.zero >= 3) {  // gathered parameters of the layer in use and the next one
      double mx = 0;
      for (int64_t ci : own)
        for (int64_t i = 0; i < chunks[ci].n_layers; ++i) {
          const LayerCost& L = a.layers[chunks[ci].first_layer + i];
          mx = std::max(mx, L.dense_params / l.tp + L.expert_params / (double)(l.ep * l.etp));
        }
      rm.buffers += 2.0 * 2 * mx;
    }
    if (rep.engine) {
      rm.params = engine.params, rm.grads = engine.grads, rm.optimizer = engine.optimizer;
      rm.activations = engine.activations, rm.buffers = engine.buffers;
    }
    rep.ranks.push_back(rm);
  }
  for (size_t r = 0; r < rep.ranks.size(); ++r)
    if (rep.ranks[r].total() > rep.ranks[rep.worst].total()) rep.worst = (int64_t)r;
  rep.fits = rep.peak().total() <= rep.usable;
  const LayerCost* ref = &a.layers.front();
  for (const LayerCost& L : a.layers)
    if (L.moe) {
      ref = &L;
      break;
    }
  const double fp8 = precision_model(s, l.precision).cached_bytes;
  const double eb = s.activation_bytes;
  rep.act_per_token_layer[0] = saved_bytes_per_token(*ref, Recompute::None, fp8, l.expert_load, eb);
  rep.act_per_token_layer[1] = saved_bytes_per_token(*ref, Recompute::Selective, fp8, l.expert_load, eb);
  rep.act_per_token_layer[2] = saved_bytes_per_token(*ref, Recompute::Full, fp8, l.expert_load, eb);
  return rep;
}

}  // namespace trex::plan
