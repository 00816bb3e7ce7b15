// Post-training data: CPT text and SFT chat/alpaca samples -> packed fixed-length training
// sequences with per-document segment ids, positions restarting per document, and targets
// already shifted (-100 where there is no loss). Tokenization is passed in as a function so the
// data code does not depend on one tokenizer implementation.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>
#include "core/rng.h"
#include "model/model.h"

namespace trex::train {

using EncodeFn = std::function<std::vector<int32_t>(std::string_view)>;

// One tokenized document: ids and, per id, whether it is trained on (predicted).
struct Sample {
  std::vector<int32_t> ids;
  std::vector<uint8_t> loss;  // loss[i] = 1: ids[i] is a target (predicted from ids[..i-1])
};

// A view of one document (its ids and loss flags), e.g. inside a mapped token cache.
struct DocSpan {
  const int32_t* ids = nullptr;
  const uint8_t* loss = nullptr;
  int64_t n = 0;
};

// Counters of what the loaders did with their input (reported, never silent).
struct DataStats {
  int64_t lines = 0, samples = 0, skipped_malformed = 0, skipped_no_target = 0, truncated = 0,
          dropped_too_long = 0, tokens = 0, target_tokens = 0;
  std::vector<std::string> first_errors;  // up to 5 messages naming file:line
  void error(const std::string& msg) {
    ++skipped_malformed;
    if (first_errors.size() < 5) first_errors.push_back(msg);
  }
};

// ---- SFT -------------------------------------------------------------------------------
struct Message {
  std::string role;  // system | user | assistant
  std::string content;
};

// Chat templates: "deepseek" (DeepSeek-V3: <｜begin▁of▁sentence｜>{system}<｜User｜>{user}
// <｜Assistant｜>{assistant}<｜end▁of▁sentence｜>), "deepseek-v2" (DeepSeek-V2 / V2.5 chat, plain text:
// <｜begin▁of▁sentence｜>{system}\n\nUser: {user}\n\nAssistant: {assistant}<｜end▁of▁sentence｜>, the
// generation prompt ending in "Assistant:") and "chatml" (<|im_start|>role\n...<|im_end|>\n).
struct ChatTemplate {
  std::string name = "deepseek";
  std::string bos = "<｜begin▁of▁sentence｜>", eos = "<｜end▁of▁sentence｜>";
  std::string user = "<｜User｜>", assistant = "<｜Assistant｜>";
  static ChatTemplate by_name(const std::string& name);  // UserError for unknown names
};

// Parses one JSONL line: {"messages": [{"role", "content"}, ...]} or alpaca {"instruction",
// "input", "output"}. Returns false (and records why in stats, naming where) when malformed.
bool parse_sft_line(std::string_view line, const std::string& where, std::vector<Message>* out, DataStats& stats);

// Renders messages with the template; assistant replies (and their end token) are targets,
// everything else only when train_on_prompt.
Sample render_chat(const std::vector<Message>& msgs, const ChatTemplate& t, const EncodeFn& encode,
                   bool train_on_prompt);

// Ids of a prompt for generation: the messages as render_chat writes them, then the assistant
// header, so the model continues with the reply (the training-time layout of the same turns).
std::vector<int32_t> render_generation_prompt(const std::vector<Message>& msgs, const ChatTemplate& t,
                                              const EncodeFn& encode);

// ---- CPT -------------------------------------------------------------------------------
// Text -> one document: its tokens + EOS, every token a target.
Sample cpt_document(std::string_view text, const EncodeFn& encode, int32_t eos_id);

// Reads a .jsonl file ({"text": ...} per line) or plain text file (one document per blank-line
// separated block) into documents.
std::vector<Sample> read_cpt_file(const std::string& path, const EncodeFn& encode, int32_t eos_id, DataStats& stats);
std::vector<Sample> read_sft_file(const std::string& path, const ChatTemplate& t, const EncodeFn& encode,
                                  bool train_on_prompt, DataStats& stats);

// ---- Packing ---------------------------------------------------------------------------
// A packed sequence: seq_len tokens; pad positions have target -100 and their own segment.
struct PackedSeq {
  std::vector<int32_t> ids, targets, pos, seg;
};

enum class OverflowPolicy { Truncate, Drop };

// Packs documents in order into sequences of seq_len (greedy: a document goes into the current
// sequence if it fits, else starts the next). Documents longer than seq_len are truncated or
// dropped (counted; a truncation that would keep no target drops the document). CPT documents
// (split_long = true) are instead cut into seq_len pieces.
std::vector<PackedSeq> pack(const std::vector<DocSpan>& docs, int64_t seq_len, OverflowPolicy policy, bool split_long,
                            int32_t pad_id, DataStats& stats);
std::vector<PackedSeq> pack(const std::vector<Sample>& docs, int64_t seq_len, OverflowPolicy policy, bool split_long,
                            int32_t pad_id, DataStats& stats);

// Deterministic order of sequences for an epoch (Fisher-Yates with Rng(seed + epoch)).
std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch);

// Views a group of packed sequences as one model batch (B = count).
struct BatchBuffer {
  std::vector<int32_t> ids, targets, pos, seg;
  model::Batch batch(int64_t B, int64_t T) const {
    return {B, T, ids.data(), targets.data(), pos.data(), seg.data()};
  }
};
BatchBuffer make_batch(const std::vector<PackedSeq>& seqs, const std::vector<int64_t>& which);

}  // namespace trex::train
