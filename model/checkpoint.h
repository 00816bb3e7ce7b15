// Hugging Face checkpoints of DeepseekV3ForCausalLM: config.json + model.safetensors (or
// shards + model.safetensors.index.json), tensors under their checkpoint names. Loading checks
// every expected tensor's presence, shape and dtype and names the file and tensor on error.
// FP8 checkpoints (DeepSeek-V3/R1 e4m3 + 128x128 scale_inv blocks, per config.json's
// quantization_config) are dequantized on load (io/quant.h). DeepSeek-V3 MTP layers
// (model.layers.<num_hidden_layers + k>.*, model/mtp_v3.h) load into the model when it trains them,
// else into Model::kept; a save writes both back (docs/MTP.md).
#pragma once
#include <deque>
#include <string>
#include "io/quant.h"
#include "io/safetensors.h"
#include "model/model.h"

namespace trex::model {

namespace detail {  // shared by the V3 / HF and the V4 original-layout loaders
void read_tensor(const io::SafetensorsDir& ck, const io::QuantizedTensorReader& q, const std::string& name,
                 const Shape& want, float* dst);
void read_id_table(const io::SafetensorsDir& ck, const BufferEntry& b, int64_t n_experts, float* dst);
io::QuantConfig quant_config_of(const std::string& dir);  // config.json's quantization_config
bool has_mtp_tensors(const io::SafetensorsDir& ck);       // any "mtp.*" tensor

// The tensors of a checkpoint being written, in dtype F32 or BF16 (the bf16 copies and integer
// id tables they point to live here until written).
struct TensorList {
  explicit TensorList(DType dtype);  // UserError unless F32 or BF16
  void add(const std::string& name, const Shape& s, const float* src);
  // A buffer: router bias (f32) or id table (cols > 0, written as I64 [size / cols, cols]).
  void add_buffer(const std::string& name, const BufferEntry& b, const float* buffers);
  DType dtype;
  std::vector<io::TensorToWrite> ts;
  std::deque<std::vector<bf16>> conv;
  std::deque<std::vector<int64_t>> ids;
};
// Writes dir/config.json atomically and durably (io/atomic_file.h).
void write_config(const std::string& dir, const std::string& text);
// Creates an output directory (and its parents); a UserError naming it when that fails.
void make_output_dir(const std::string& dir);
}  // namespace detail

// Reads weights (and router biases) from a checkpoint directory into the model. verify: first
// check a trex checkpoint's weight files against its manifest (verify_weights; false when the
// caller has checked the whole checkpoint already). A NaN or Inf value is a UserError naming the
// tensor (check_finite_weights).
void load_hf_weights(Model& m, const std::string& dir, bool verify = true);
// A trex checkpoint's weight files (all but optimizer.safetensors) against its manifest.json
// (io/checksum.h); UserError naming a damaged file. Directories without a manifest pass.
void verify_weights(const std::string& dir);
// UserError naming the first tensor of m (parameters, buffers) that holds a NaN or Inf, and how
// many values and tensors do; `where` names the checkpoint (model/weights_finite.cpp).
void check_finite_weights(const Model& m, const std::string& where);
// A whole model's weights to write: a Model's, or one assembled from expert-parallel shards.
struct WeightsView {
  const ModelConfig& cfg;
  const ParamLayout& layout;  // not expert-sharded
  const float* P;             // [layout.total]
  const float* buffers;       // [layout.buffers_total]
  const std::vector<KeptTensor>* kept = nullptr;  // written as they are (Model::kept)
};
// Writes config.json and model.safetensors (sharded above max_shard_bytes) into dir.
// dtype F32 or BF16 for the weights; router biases are always F32 as in DeepSeek's releases.
void save_hf_checkpoint(const Model& m, const std::string& dir, DType dtype = DType::F32,
                        uint64_t max_shard_bytes = 5ull << 30);
void save_hf_checkpoint(const WeightsView& w, const std::string& dir, DType dtype = DType::F32,
                        uint64_t max_shard_bytes = 5ull << 30);
// Gradients (same names) as one safetensors file, f32.
void save_gradients(const Model& m, const std::string& path);
// The config as a Hugging Face config.json object (string).
std::string config_to_json(const ModelConfig& c);

// DeepSeek-V4 original release layout (model/checkpoint_v4.cpp): `embed.weight`, `head.weight`,
// `layers.N.attn.*`, `layers.N.ffn.*` (experts one tensor per expert: w1 gate, w3 up, w2 down),
// `hc_head_*`; FP8 e4m3 + ue8m0 128x128 scales and FP4 e2m1 experts (ue8m0 per 32) dequantized
// on load. Names mirror transformers' conversion_mapping "deepseek_v4" renames.
std::string config_to_json_v4(const ModelConfig& c);
std::string v4_original_name(const std::string& hf_name);  // non-expert tensors and buffers
std::string v4_hf_name(const std::string& original_name);  // transformers' renames, in order
void load_v4_original(Model& m, const std::string& dir);   // load_hf_weights calls it when it sees embed.weight
// DeepSeek-V4 as transformers' save_pretrained writes it: the in-memory names with the
// conversion mapping's rules reversed behind the model. prefix (model.layers.N.attn.wq_a.weight,
// model.layers.N.ffn.experts.E.w1.weight, head.weight; the anchored rules ^embed, ^hc_head_* do
// not match behind the prefix: model.embed_tokens.weight, model.hc_head.hc_fn). Whether ck's
// names are that naming, and the original release name of one of them (the mapping's rules
// forward, then trex's original names): load_v4_original reads such a checkpoint through it.
bool v4_saved_naming(const std::vector<std::string>& names);
std::string v4_original_of_saved(const std::string& saved_name);
// The save_pretrained name of an original-layout name (MTP blocks, which transformers does not
// have, keep their mtp.K. names).
std::string v4_saved_name(const std::string& original_name);
// quantize: FP8 (e4m3, ue8m0 128x128) for the attention / indexer-query / shared-expert matrices
// and FP4 (e2m1, ue8m0 per 32) for routed experts, as the release ships them; others in dtype.
// saved_names: the same tensors under the names transformers' save_pretrained writes
// (v4_saved_name; not with quantize).
void save_v4_original(const Model& m, const std::string& dir, DType dtype, bool quantize,
                      uint64_t max_shard_bytes = 5ull << 30, bool saved_names = false);

}  // namespace trex::model
