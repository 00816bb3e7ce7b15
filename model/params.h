// Parameter layout of a DeepSeek-V3-family model: every Hugging Face tensor name maps to a
// contiguous range of one flat f32 slab. The same offsets index the gradient slab, the bf16
// shadow used by bf16 GEMMs, and the AdamW moment slabs. Experts live in one [E, ...] slab per
// layer (gate and up stacked per expert: [E, 2F, d]; down: [E, d, F]) so that expert-parallel
// sharding is a slice and a grouped GEMM sees one weight tensor.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>
#include "core/tensor.h"
#include "model/config.h"

namespace trex::model {

struct ParamEntry {
  std::string name;  // Hugging Face checkpoint name
  int64_t offset;    // elements into the slab
  Shape shape;
  bool decay;        // weight decay applies (matrices yes, norms no)
  bool frozen = false;  // never receives a gradient (V4 indexer): the optimizer skips it, as torch
                        // skips parameters whose .grad stays None (no weight decay either)
  // Sharded layouts: this entry holds a block of a checkpoint tensor. rows_total > 0: rows
  // [rows_first, rows_first + shape[0]) of rows_total (V4's merged [E, ...] expert tensors under
  // ExpertShard; a column-parallel tensor's rows, or a 1-d tensor's elements, under TpShard).
  // cols_total > 0 (2-d only): columns [cols_first, cols_first + shape[1]) of cols_total (a
  // row-parallel tensor's columns under TpShard).
  int64_t rows_first = 0, rows_total = 0;
  int64_t cols_first = 0, cols_total = 0;
  bool sliced() const { return rows_total > 0 || cols_total > 0; }
  // The checkpoint tensor's shape and elements.
  Shape whole_shape() const {
    Shape s = shape;
    if (rows_total > 0) s.d[0] = rows_total;
    if (cols_total > 0) s.d[s.ndim - 1] = cols_total;
    return s;
  }
  int64_t whole_numel() const { return sliced() ? whole_shape().numel() : shape.numel(); }
  // Calls f(local, whole, n) for each run of n consecutive elements of this entry: its elements
  // [local, local + n) are the checkpoint tensor's [whole, whole + n) (row-major).
  template <class F>
  void for_each_run(F&& f) const {
    const int64_t n = shape.numel();
    if (n == 0) return;
    if (!sliced()) return f(int64_t{0}, int64_t{0}, n);
    const int64_t rows = shape[0], per_row = n / rows;  // elements of one row of dim 0
    if (cols_total == 0) return f(int64_t{0}, rows_first * per_row, n);
    for (int64_t r = 0; r < rows; ++r) f(r * per_row, (rows_first + r) * cols_total + cols_first, per_row);
  }
  // This entry's values out of the whole checkpoint tensor / into it.
  template <class T>
  void take_from_whole(const T* whole, T* local) const {
    for_each_run([&](int64_t l, int64_t w, int64_t k) { std::copy(whole + w, whole + w + k, local + l); });
  }
  template <class T>
  void put_into_whole(const T* local, T* whole) const {
    for_each_run([&](int64_t l, int64_t w, int64_t k) { std::copy(local + l, local + l + k, whole + w); });
  }
};

// The routed experts a model holds (expert-parallel memory sharding): [first, first + count) of
// n_routed_experts. Sharded (0 <= count < n_routed_experts): the expert tensors of every layer are
// stored after all the other tensors, from ParamLayout::expert_begin (a multiple of region_align
// elements) to the end of the slab, layer by layer; V3's per-expert tensors exist for the held
// experts only, V4's merged [E, ...] tensors become [count, ...] row slices (rows_first).
struct ExpertShard {
  int64_t first = 0, count = -1;  // count < 0: every expert (not sharded)
  int64_t region_align = 16;      // elements (data parallel: 16 x ranks, so both regions split evenly)
};

// The part of the model a pipeline stage holds (pipeline memory sharding): decoder layers [l0, l1);
// the first stage also the embedding; the last also the final norm, the LM head (V4: hc_head) and
// the MTP blocks (V4) or layers (V3), and the embedding too when the head is tied to it or MTP blocks read it (the
// embedding is then "shared": it sits alone at the start of the slab, [0, ParamLayout::shared_end),
// a multiple of region_align, so the first and the last stage can reduce it together). The other
// tensors do not exist in the layout (their offsets stay -1). Buffers (router biases, hash tables)
// stay whole: every rank keeps every layer's. Not sharded: l1 < 0, or one stage holding it all.
struct StageShard {
  int64_t l0 = 0, l1 = -1;
  bool first = true, last = true;
  int64_t region_align = 16;  // elements (data parallel: 16 x ranks)
  bool on() const { return l1 >= 0 && !(first && last); }
};

// The part of the attention and dense-MLP tensors a tensor-parallel rank holds (tensor-parallel
// memory sharding): tp rank `rank` of `size` holds its heads' rows of the column-parallel tensors
// (V3: q_proj / q_b_proj, kv_b_proj, the dense MLP's gate_proj and up_proj; V4: q_b_proj,
// o_a_proj by output group, sinks) and the matching columns of the row-parallel ones (V3: o_proj,
// the dense MLP's down_proj; V4: o_b_proj), as [rows / size, cols] and [rows, cols / size]
// tensors, all after the other dense tensors, from ParamLayout::tp_begin (a multiple of
// region_align) to the expert region (or the end). Every other tensor is whole on every tp rank.
// Not sharded: size 1.
struct TpShard {
  int64_t rank = 0, size = 1;
  int64_t region_align = 16;  // elements (data parallel: 16 x ranks)
  bool on() const { return size > 1; }
};

// Offsets (elements) of one decoder layer's tensors; -1 where the layer has none.
struct LayerParams {
  int64_t in_norm = -1, post_norm = -1;
  int64_t q = -1, q_a = -1, q_a_norm = -1, q_b = -1;  // q when q_lora_rank is null, else q_a/q_b
  int64_t kv_a = -1, kv_a_norm = -1, kv_b = -1, o = -1;
  int64_t mlp_gu = -1, mlp_down = -1;                   // dense MLP: [2F, d], [d, F]
  int64_t router = -1, exp_gu = -1, exp_down = -1;      // MoE: [E, d], [E, 2Fm, d], [E, d, Fm]
  int64_t sh_gu = -1, sh_down = -1;                     // shared experts: [2Fs, d], [d, Fs]
  int64_t bias = -1;                                    // e_score_correction_bias, into buffers
  // DeepSeek-V3.2 indexer (self_attn.indexer.*; frozen: it never gets a gradient): wq_b [nI dI, rq],
  // wk [dI, d], k_norm LayerNorm weight and bias [dI], weights_proj [nI, d].
  int64_t ix_wq_b = -1, ix_wk = -1, ix_knorm_w = -1, ix_knorm_b = -1, ix_w = -1;
};

// DeepSeek-V4 per-layer tensors beyond LayerParams (which holds the norms and the MoE).
struct V4LayerParams {
  int64_t attn_hc_fn = -1, attn_hc_base = -1, attn_hc_scale = -1;  // [(2+n)n, n d], [(2+n)n], [3]
  int64_t ffn_hc_fn = -1, ffn_hc_base = -1, ffn_hc_scale = -1;
  int64_t q_a = -1, q_a_norm = -1, q_b = -1;     // [qr, d], [qr], [H hd, qr]
  int64_t kv = -1, kv_norm = -1;                 // [hd, d], [hd]
  int64_t o_a = -1, o_b = -1, sinks = -1;        // [G olr, H hd / G], [d, G olr], [H]
  int64_t c_kv = -1, c_gate = -1, c_pb = -1, c_norm = -1;  // compressor: [c hd, d] x2, [m, c hd], [hd]
  int64_t i_kv = -1, i_gate = -1, i_pb = -1, i_norm = -1;  // indexer compressor: [2 dI, d] x2, [m, 2 dI], [dI]
  int64_t i_qb = -1, i_w = -1;                   // [nI dI, qr], [nI, d]
  int64_t tid2eid = -1;                          // hash layers: [vocab, K] expert ids, into buffers
};

// A DeepSeek-V4 MTP block's own tensors (its attention / MoE / HC live in layers[L + k]).
struct V4MtpParams {
  int64_t e_proj = -1, h_proj = -1;            // [d, d]
  int64_t enorm = -1, hnorm = -1, norm = -1;   // [d]
  int64_t hc_fn = -1, hc_base = -1, hc_scale = -1;  // [n, n d], [n], [1]
};

// A DeepSeek-V3 MTP layer's own tensors (its attention / MLP live in layers[L + k]).
struct V3MtpParams {
  int64_t enorm = -1, hnorm = -1;          // [d]
  int64_t eh_proj = -1;                    // [d, 2d]: columns [0, d) take enorm(emb), [d, 2d) hnorm(h)
  int64_t head_norm = -1, head = -1;       // shared_head.norm [d], shared_head.head [vocab, d]
};

struct BufferEntry {
  std::string name;
  int64_t offset;
  int64_t size;
  int64_t cols = 0;      // > 0: a [size / cols, cols] table of integer ids (tid2eid), saved as I64
};

struct ParamLayout {
  std::vector<ParamEntry> entries;
  std::unordered_map<std::string, size_t> index;  // name -> entries[i]
  int64_t total = 0;                               // elements in the slab
  int64_t embed = -1, final_norm = -1, head = -1;  // head == embed when tied
  std::vector<LayerParams> layers;
  std::vector<BufferEntry> buffers;  // non-trained state saved in checkpoints (router biases)
  int64_t buffers_total = 0;
  std::vector<V4LayerParams> v4;     // DeepSeek-V4 only (main layers, then MTP blocks)
  std::vector<V4MtpParams> mtp;      // DeepSeek-V4 MTP blocks
  std::vector<V3MtpParams> mtp3;     // DeepSeek-V3 MTP layers (held by the last stage; -1 elsewhere)
  int64_t hc_head_fn = -1, hc_head_base = -1, hc_head_scale = -1;  // V4: [n, n d], [n], [1]
  // Routed experts held: [expert_first, expert_first + expert_count). expert_begin >= 0 (sharded
  // layouts only): the slab offset where the expert region starts (it runs to total).
  int64_t expert_first = 0, expert_count = 0;
  int64_t expert_begin = -1;
  bool expert_sharded() const { return expert_begin >= 0; }
  // Stage-sharded layouts (StageShard): the stage held, and the end of the shared embedding region
  // at the start of the slab (-1: the embedding is not shared, or absent, or not sharded).
  StageShard stage;
  int64_t shared_end = -1;
  bool stage_sharded() const { return stage.on(); }
  // Tensor-parallel-sharded layouts (TpShard): the slice held, and the start of the region of the
  // split tensors (it runs to expert_begin, or to total).
  TpShard tp;
  int64_t tp_begin = -1;
  bool tp_sharded() const { return tp_begin >= 0; }
  bool sharded() const { return expert_sharded() || stage_sharded() || tp_sharded(); }
  // Whether the layout holds decoder layer l's tensors (an MTP block or layer k: l =
  // num_hidden_layers + k, held by the last stage).
  bool holds_layer(int64_t l) const {
    if (!stage_sharded()) return true;
    return (l >= stage.l0 && l < stage.l1) || (l >= num_main_layers && stage.last);
  }
  int64_t num_main_layers = 0;  // num_hidden_layers (layers beyond it are MTP blocks / layers)

  const ParamEntry* find(const std::string& name) const {
    auto it = index.find(name);
    return it == index.end() ? nullptr : &entries[it->second];
  }
};

// shard: the experts held (default: all). A shard with count outside (0, n_routed_experts], a
// first not a multiple of count, or a range past the last expert is an error. stage: the pipeline
// stage held (default: the whole model); layers outside [0, num_hidden_layers] are an error.
// tp: the tensor-parallel slice held (default: whole); its size must divide the heads, V4's
// o_groups and the dense MLP width.
ParamLayout build_layout(const ModelConfig& c, ExpertShard shard = {}, StageShard stage = {}, TpShard tp = {});
ParamLayout build_layout_v4(const ModelConfig& c, ExpertShard shard = {}, StageShard stage = {},
                            TpShard tp = {});  // model/params_v4.cpp (Hugging Face V4 names)
// Checks tp against c and sets L.tp; true when the layout is tp-sharded (then L.tp_begin is set
// by begin_tp_region).
bool apply_tp_shard(const ModelConfig& c, const TpShard& tp, ParamLayout& L);
// Checks stage against c and sets L.stage and L.num_main_layers; true when the layout is
// stage-sharded.
bool apply_stage_shard(const ModelConfig& c, const StageShard& stage, ParamLayout& L);
// Whether a stage holds the embedding (the first stage; the last too when it is shared) and
// whether the embedding is shared by two stages: tied to the head, or read by MTP blocks / layers.
bool stage_holds_embedding(const ModelConfig& c, const StageShard& s);
bool embedding_shared(const ModelConfig& c, const StageShard& s);
// Checks shard against c and fills L.expert_first / expert_count; true when the layout is sharded
// (then L.expert_begin is set by begin_expert_region).
bool apply_expert_shard(const ModelConfig& c, const ExpertShard& shard, ParamLayout& L);
// For expert-sharded layouts: the expert index in a V3 per-expert tensor name
// ("model.layers.L.mlp.experts.X.*"), or -1 for any other name.
int64_t expert_of_name(const std::string& name);

// Appends tensors to a layout: 64-byte aligned entries, or a slab holding several named views.
struct LayoutBuilder {
  explicit LayoutBuilder(ParamLayout& l) : L(l) {}
  ParamLayout& L;
  std::vector<std::function<void()>> tp_deferred;  // tp-sharded: the split tensors' adds, for tp_region
  int64_t add(const std::string& name, Shape s, bool decay) {
    int64_t off = L.total;
    L.index[name] = L.entries.size();
    L.entries.push_back({name, off, s, decay});
    L.total += (s.numel() + 15) / 16 * 16;
    return off;
  }
  int64_t slab(int64_t numel) {
    int64_t off = L.total;
    L.total += (numel + 15) / 16 * 16;
    return off;
  }
  void sub(const std::string& name, int64_t off, Shape s, bool decay) {
    L.index[name] = L.entries.size();
    L.entries.push_back({name, off, s, decay});
  }
  // Starts the expert region of a sharded layout at the next multiple of align elements.
  void begin_expert_region(int64_t align) {
    L.total = (L.total + align - 1) / align * align;
    L.expert_begin = L.total;
  }
  // Starts the region of a tp-sharded layout's split tensors at the next multiple of align.
  void begin_tp_region(int64_t align) {
    L.total = (L.total + align - 1) / align * align;
    L.tp_begin = L.total;
  }
  // Tensor-parallel-sharded layouts (L.tp set by apply_tp_shard) hold the split tensors in a region
  // of their own after the other dense tensors: tp_defer keeps f (which adds them) for tp_region,
  // which runs the kept adds in order there; not sharded, f runs now, in place.
  void tp_defer(std::function<void()> f) {
    if (L.tp.on()) tp_deferred.push_back(std::move(f));
    else f();
  }
  // A tensor a tp-sharded layout splits by rows (by_rows) or columns; whole otherwise.
  void add_split(int64_t& off, const std::string& name, Shape whole, bool decay, bool by_rows) {
    tp_defer([this, &off, name, whole, decay, by_rows] {
      off = L.tp.on() ? add_tp_slice(name, whole, decay, by_rows) : add(name, whole, decay);
    });
  }
  void tp_region(int64_t align) {
    if (!L.tp.on()) return;
    begin_tp_region(align);
    for (auto& f : tp_deferred) f();
    tp_deferred.clear();
  }
  // A tp slice of a checkpoint tensor of shape whole: rows [r0, r0 + whole[0] / parts) (by_rows)
  // or columns [c0, ...) of a 2-d one, where parts = the tp size and r0 / c0 this rank's start.
  int64_t add_tp_slice(const std::string& name, Shape whole, bool decay, bool by_rows) {
    const int64_t parts = L.tp.size, k = L.tp.rank;
    Shape s = whole;
    const int dim = by_rows ? 0 : whole.ndim - 1;
    s.d[dim] = whole[dim] / parts;
    const int64_t off = add(name, s, decay);
    ParamEntry& e = L.entries.back();
    if (by_rows) e.rows_first = k * s[0], e.rows_total = whole[0];
    else e.cols_first = k * s[dim], e.cols_total = whole[dim];
    return off;
  }
  // Ends the shared embedding region of a stage-sharded layout (the next multiple of align).
  void end_shared_region(int64_t align) {
    L.total = (L.total + align - 1) / align * align;
    L.shared_end = L.total;
  }
  int64_t buffer(const std::string& name, int64_t size, int64_t cols = 0) {
    int64_t off = L.buffers_total;
    L.buffers.push_back({name, off, size, cols});
    L.buffers_total += size;
    return off;
  }
};

}  // namespace trex::model
