#include "model/checkpoint.h"

#include <filesystem>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include "core/log.h"
#include "io/atomic_file.h"
#include "io/checksum.h"
#include "io/quant.h"
#include "io/safetensors.h"
#include "model/linear.h"
#include "model/mtp_v3.h"

namespace trex::model {

namespace fs = std::filesystem;

namespace {

// Layer index of "model.layers.<i>.", or -1.
int64_t layer_of(const std::string& name) {
  const std::string pre = "model.layers.";
  if (name.rfind(pre, 0) != 0) return -1;
  return std::atoll(name.c_str() + pre.size());
}

}  // namespace

namespace detail {

// Reads one weight (plain F32/BF16/F16/F64, or FP8/FP4 with its block scales, dequantized).
void read_tensor(const io::SafetensorsDir& ck, const io::QuantizedTensorReader& q, const std::string& name,
                 const Shape& want, float* dst) {
  const io::SafetensorsFile* f = nullptr;
  const io::TensorInfo* t = ck.find(name, &f);
  TREX_USER_CHECK(t, "the checkpoint must match config.json (or set tie_word_embeddings)", ck.dir(),
                  ": tensor '", name, "' is missing");
  const Shape got = q.shape(name);  // logical shape (validates the scales of quantized weights)
  TREX_USER_CHECK(got == want, "the checkpoint must match config.json", f->path(), ": tensor '", name,
                  "' has shape ", got.str(), ", config.json implies ", want.str());
  q.read_f32(name, dst, want.numel());
}

// An integer id table (tid2eid [vocab, K], I64 or I32) into f32 buffer slots; every id must be
// an expert index.
void read_id_table(const io::SafetensorsDir& ck, const BufferEntry& b, int64_t n_experts, float* dst) {
  const io::SafetensorsFile* f = nullptr;
  const io::TensorInfo* t = ck.find(b.name, &f);
  const Shape want{b.size / b.cols, b.cols};
  TREX_USER_CHECK(t->dtype == DType::I64 || t->dtype == DType::I32, "store the hash routing table as int64",
                  f->path(), ": tensor '", b.name, "' has dtype ", dtype_name(t->dtype), ", expected I64 or I32");
  TREX_USER_CHECK(t->shape == want, "the checkpoint must match config.json", f->path(), ": tensor '", b.name,
                  "' has shape ", t->shape.str(), ", config.json implies ", want.str());
  const char* p = static_cast<const char*>(f->data(*t));
  for (int64_t i = 0; i < b.size; ++i) {
    int64_t v;
    if (t->dtype == DType::I64) std::memcpy(&v, p + 8 * i, 8);
    else { int32_t w; std::memcpy(&w, p + 4 * i, 4); v = w; }
    TREX_USER_CHECK(v >= 0 && v < n_experts, "hash routing ids must be expert indices", f->path(), ": ", b.name,
                    "[", i / b.cols, "][", i % b.cols, "] = ", v, " is outside [0, ", n_experts, ")");
    dst[i] = (float)v;
  }
}

bool has_mtp_tensors(const io::SafetensorsDir& ck) {
  for (const std::string& n : ck.names())
    if (n.rfind("mtp.", 0) == 0) return true;
  return false;
}

io::QuantConfig quant_config_of(const std::string& dir) {
  io::QuantConfig qc;
  if (fs::exists(dir + "/config.json")) {
    std::ifstream cf(dir + "/config.json");
    nlohmann::json cj = nlohmann::json::parse(cf, nullptr, false);
    if (cj.is_object()) qc = io::QuantConfig::from_hf_config(cj, dir + "/config.json");
  }
  return qc;
}

TensorList::TensorList(DType d) : dtype(d) {
  TREX_USER_CHECK(dtype == DType::F32 || dtype == DType::BF16, "use F32 or BF16", "checkpoint dtype ",
                  dtype_name(dtype), " is not supported for saving");
}

void TensorList::add(const std::string& name, const Shape& s, const float* src) {
  if (dtype == DType::F32) {
    ts.push_back({name, DType::F32, s, src});
    return;
  }
  std::vector<bf16>& v = conv.emplace_back(s.numel());
  to_bf16(src, v.data(), s.numel());
  ts.push_back({name, DType::BF16, s, v.data()});
}

void TensorList::add_buffer(const std::string& name, const BufferEntry& b, const float* buffers) {
  if (b.cols > 0) {  // integer id table, as HF stores it (int64)
    std::vector<int64_t>& v = ids.emplace_back(buffers + b.offset, buffers + b.offset + b.size);
    ts.push_back({name, DType::I64, Shape{b.size / b.cols, b.cols}, v.data()});
  } else {  // router biases stay f32, as in DeepSeek's releases
    ts.push_back({name, DType::F32, Shape{b.size}, buffers + b.offset});
  }
}

void write_config(const std::string& dir, const std::string& text) {
  io::write_file_atomic(dir + "/config.json", text + "\n");
}

void make_output_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  TREX_USER_CHECK(!ec, "give an output directory on a writable file system (its parent must be a directory you may "
                  "write to)", dir, ": cannot create the output directory: ", ec.message());
}

}  // namespace detail

using namespace detail;

void verify_weights(const std::string& dir) {
  io::verify_manifest(dir, "use an intact checkpoint (an older one of the run that wrote it)",
                      [](const std::string& f) { return f != "optimizer.safetensors"; });
}

void load_hf_weights(Model& m, const std::string& dir, bool verify) {
  if (verify) verify_weights(dir);
  io::SafetensorsDir ck = io::SafetensorsDir::open(dir);
  // DeepSeek-V4 under the original release's names, or under the names transformers'
  // save_pretrained writes (which are close to them): the original-layout loader reads both.
  if (m.cfg.is_v4() && (ck.find("embed.weight") || v4_saved_naming(ck.names()))) return load_v4_original(m, dir);
  io::QuantConfig qc = quant_config_of(dir);
  io::QuantizedTensorReader q(ck, qc);
  std::set<std::string> used;
  const int64_t Lm = m.cfg.num_hidden_layers;
  const bool fresh_mtp = m.cfg.v4.mtp_layers > 0 && !has_mtp_tensors(ck);
  if (fresh_mtp) {
    TREX_LOG_WARN(dir, ": no MTP tensors (mtp.*; transformers drops them); the MTP blocks start from random init");
    m.init_mtp_random(0x5eed);
  }
  // DeepSeek-V3 MTP layers the run trains but the checkpoint lacks (transformers drops them).
  const bool fresh_mtp3 = m.cfg.v3_mtp_layers > 0 && !ck.find("model.layers." + std::to_string(Lm) + ".eh_proj.weight");
  if (fresh_mtp3) {
    TREX_LOG_WARN(dir, ": no MTP layer tensors (model.layers.", Lm, ".eh_proj.weight and the rest); the MTP layers "
                  "start from random init, shared_head.head from lm_head");
  }
  auto fresh = [&](const std::string& name) {
    return (fresh_mtp && name.rfind("mtp.", 0) == 0) || (fresh_mtp3 && v3_layer_of(name) >= Lm);
  };
  std::set<std::string> elsewhere;  // a sharded model's: the whole model's tensors other ranks hold
  if (m.layout.sharded())
    for (const ParamEntry& w : build_layout(m.cfg).entries)
      if (!m.layout.find(w.name)) elsewhere.insert(w.name);
  std::vector<float> whole;
  for (const ParamEntry& e : m.layout.entries) {
    if (fresh(e.name)) continue;
    used.insert(e.name);
    if (!e.sliced()) {
      read_tensor(ck, q, e.name, e.shape, m.P() + e.offset);
      continue;
    }
    // An expert-parallel shard's rows of a merged [E, ...] expert tensor, a tensor-parallel slice.
    whole.resize((size_t)e.whole_numel());
    read_tensor(ck, q, e.name, e.whole_shape(), whole.data());
    e.take_from_whole(whole.data(), m.P() + e.offset);
  }
  for (const BufferEntry& b : m.layout.buffers) {
    if (fresh(b.name)) continue;
    if (ck.find(b.name) && b.cols > 0) {
      read_id_table(ck, b, m.cfg.n_routed_experts, m.buffers.data() + b.offset);
      used.insert(b.name);
    } else if (b.cols > 0) {
      TREX_USER_FAIL("a DeepSeek-V4 checkpoint holds the hash routing table of each hash_moe layer", dir, ": '",
                     b.name, "' is missing");
    } else if (ck.find(b.name)) {
      read_tensor(ck, q, b.name, Shape{b.size}, m.buffers.data() + b.offset);
      used.insert(b.name);
    } else {
      TREX_LOG_WARN(dir, ": '", b.name, "' absent; router bias starts at 0");
    }
  }
  if (fresh_mtp3) init_mtp_v3_random(m, 0x5eed);  // after lm_head, which shared_head.head starts from
  int64_t skipped_mtp = 0, unknown = 0;
  // DeepSeek-V3 MTP layers of a run that does not train them: kept (f32) and written back on save.
  const bool keep_mtp3 = !m.cfg.is_v4() && m.cfg.v3_mtp_layers == 0;
  m.kept.clear();
  for (const std::string& n : ck.names()) {
    if (used.count(n)) continue;
    if (m.cfg.tie_word_embeddings && n == "lm_head.weight") continue;
    if (q.is_scale(n)) continue;  // block scales of quantized weights, consumed above
    if (elsewhere.count(n)) continue;  // another expert-parallel rank's expert, another stage's tensor
    if (keep_mtp3 && layer_of(n) >= Lm && layer_of(n) < Lm + m.cfg.num_nextn_predict_layers) {
      KeptTensor& k = m.kept.emplace_back();
      k.name = n;
      k.shape = q.shape(n);
      k.v.resize((size_t)k.shape.numel());
      q.read_f32(n, k.v.data(), k.shape.numel());
      continue;
    }
    if (v3_mtp_embed_alias(n, Lm)) continue;  // the MTP layer's copy of the embedding (shared; written back on save)
    if (layer_of(n) >= m.cfg.num_hidden_layers || n.rfind("mtp.", 0) == 0 || n.rfind("model.mtp.", 0) == 0) {
      ++skipped_mtp;
      continue;
    }
    if (n.find("rotary_emb.inv_freq") != std::string::npos) continue;
    // transformers builds DeepSeek-V2's shared-expert MLP even for n_shared_experts = 0 and saves
    // its empty tensors ([0, d], [d, 0]); they hold nothing.
    if (m.cfg.n_shared_experts == 0 && n.find(".mlp.shared_experts.") != std::string::npos &&
        ck.find(n)->shape.numel() == 0)
      continue;
    if (++unknown <= 5) TREX_LOG_WARN(dir, ": unexpected tensor '", n, "' ignored");
  }
  if (skipped_mtp) TREX_LOG_INFO(dir, ": skipped ", skipped_mtp, " tensors of layers >= num_hidden_layers (MTP)");
  if (!m.kept.empty())
    TREX_LOG_INFO(dir, ": kept ", m.kept.size(), " tensors of the MTP layers unchanged (not trained: [train] "
                  "mtp_loss_weight = 0); a save writes them back");
  TREX_USER_CHECK(unknown == 0, "the checkpoint does not match config.json", dir, ": ", unknown,
                  " tensors do not belong to this model config");
  check_finite_weights(m, dir);
  m.refresh_bf16();
}

std::string config_to_json(const ModelConfig& c) {
  if (c.is_v4()) return config_to_json_v4(c);
  if (c.is_v2()) return config_to_json_v2(c);
  if (c.is_v32()) return config_to_json_v32(c);
  nlohmann::ordered_json j;
  mla_moe_config_keys(j, c, "DeepseekV3ForCausalLM", "deepseek_v3");
  j["topk_method"] = topk_method_name(c.topk_method);
  j["n_group"] = c.n_group;
  j["topk_group"] = c.topk_group;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["first_k_dense_replace"] = c.first_k_dense_replace;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["scoring_func"] = scoring_name(c.scoring_func);
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  if (c.rope_scaling.yarn) {
    const RopeScaling& y = c.rope_scaling;
    j["rope_scaling"] = {{"type", "yarn"},
                         {"rope_type", "yarn"},
                         {"factor", y.factor},
                         {"original_max_position_embeddings", y.original_max_position_embeddings},
                         {"beta_fast", y.beta_fast},
                         {"beta_slow", y.beta_slow},
                         {"mscale", y.mscale},
                         {"mscale_all_dim", y.mscale_all_dim}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["rope_interleave"] = c.rope_interleave;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["attention_bias"] = false;
  j["initializer_range"] = c.initializer_range;
  j["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  return j.dump(2);
}

void save_hf_checkpoint(const Model& m, const std::string& dir, DType dtype, uint64_t max_shard_bytes) {
  TREX_CHECK(!m.layout.sharded(), "save_hf_checkpoint: the model holds an expert shard or a pipeline stage only ",
             "(gather it: train/dist.h save_checkpoint)");
  save_hf_checkpoint(WeightsView{m.cfg, m.layout, m.P(), m.buffers.data(), &m.kept}, dir, dtype, max_shard_bytes);
}

void save_hf_checkpoint(const WeightsView& w, const std::string& dir, DType dtype, uint64_t max_shard_bytes) {
  TREX_CHECK(!w.layout.sharded(), "save_hf_checkpoint: the weights are a shard's only (gather them first)");
  TensorList tl(dtype);
  make_output_dir(dir);
  for (const ParamEntry& e : w.layout.entries) tl.add(e.name, e.shape, w.P + e.offset);
  for (const BufferEntry& b : w.layout.buffers) tl.add_buffer(b.name, b, w.buffers);
  // DeepSeek-V3 MTP layers: the embedding copy the release keeps in each (model/mtp_v3.h); or the
  // layers themselves, kept unchanged by a run that does not train them.
  if (w.layout.embed >= 0)
    for (int64_t k = 0; k < w.cfg.v3_mtp_layers; ++k)
      tl.add("model.layers." + std::to_string(w.cfg.num_hidden_layers + k) + ".embed_tokens.weight",
             Shape{w.cfg.vocab_size, w.cfg.hidden_size}, w.P + w.layout.embed);
  if (w.kept)
    for (const KeptTensor& k : *w.kept) {
      if (k.name.find("e_score_correction_bias") != std::string::npos)  // f32, as the main layers' biases
        tl.ts.push_back({k.name, DType::F32, k.shape, k.v.data()});
      else
        tl.add(k.name, k.shape, k.v.data());
    }
  io::write_safetensors_dir(dir, tl.ts, max_shard_bytes);
  write_config(dir, config_to_json(w.cfg));
}

void save_gradients(const Model& m, const std::string& path) {
  TREX_CHECK(!m.layout.sharded(), "save_gradients: the model holds an expert shard or a pipeline stage only");
  std::vector<io::TensorToWrite> ts;
  for (const ParamEntry& e : m.layout.entries) ts.push_back({e.name, DType::F32, e.shape, m.G() + e.offset});
  io::write_safetensors(path, ts);
}

}  // namespace trex::model
