// Fuzz target: training data files as trex train reads them (train/data.h): SFT JSONL
// ({"messages": [...]} or alpaca records, through parse_sft_line and read_sft_file, with the
// deepseek or chatml template), CPT JSONL ({"text": ...}) and CPT plain text, followed by
// packing into fixed-length sequences. The first input byte picks the mode, the rest is the
// file. Tokenization is a byte-level stand-in (one id per byte) so the run stays fast; the real
// tokenizer is fuzzed by fuzz_bpe_encode. Checks the packed sequences' invariants.
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "train/data.h"

using namespace trex;
using namespace trex::train;

namespace {

std::vector<int32_t> encode_bytes(std::string_view s) {
  std::vector<int32_t> ids;
  ids.reserve(s.size());
  for (unsigned char c : s) ids.push_back(c);
  return ids;
}

constexpr int32_t kEos = 256, kPad = 257;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  const std::string_view body = fuzz::as_text(data + 1, size - 1);
  const int kind = mode & 3;
  const bool train_on_prompt = mode & 4;
  const OverflowPolicy policy = (mode & 8) ? OverflowPolicy::Drop : OverflowPolicy::Truncate;
  const int64_t seq_len = 2 + (mode >> 4) * 5;

  // Every line also through parse_sft_line directly (what read_sft_file calls per line).
  if (kind <= 1) {
    size_t b = 0;
    std::vector<Message> msgs;
    while (b <= body.size()) {
      size_t e = body.find('\n', b);
      if (e == std::string_view::npos) e = body.size();
      DataStats st;
      bool ok = parse_sft_line(body.substr(b, e - b), "fuzz.jsonl:1", &msgs, st);
      FUZZ_ASSERT(ok ? st.skipped_malformed == 0 && !msgs.empty() : st.skipped_malformed == 1);
      for (const Message& m : msgs) FUZZ_ASSERT(m.role == "system" || m.role == "user" || m.role == "assistant");
      b = e + 1;
    }
  }

  const std::string path = fuzz::write_scratch(kind == 3 ? "data.txt" : "data.jsonl", body);
  DataStats st;
  std::vector<Sample> docs;
  const bool ok = fuzz::accepts([&] {
    if (kind <= 1)
      docs = read_sft_file(path, ChatTemplate::by_name(kind == 0 ? "deepseek" : "chatml"), encode_bytes,
                           train_on_prompt, st);
    else
      docs = read_cpt_file(path, encode_bytes, kEos, st);
  });
  if (!ok) return 0;
  FUZZ_ASSERT(!docs.empty());
  FUZZ_ASSERT(st.samples == static_cast<int64_t>(docs.size()));
  for (const Sample& s : docs) {
    FUZZ_ASSERT(s.ids.size() == s.loss.size());
    FUZZ_ASSERT(s.loss.empty() || s.loss[0] == 0, "the first token is never a target");
  }
  std::vector<PackedSeq> seqs = pack(docs, seq_len, policy, kind >= 2, kPad, st);
  for (const PackedSeq& q : seqs) {
    FUZZ_ASSERT(static_cast<int64_t>(q.ids.size()) == seq_len && q.targets.size() == q.ids.size() &&
                q.pos.size() == q.ids.size() && q.seg.size() == q.ids.size());
    for (size_t i = 0; i < q.ids.size(); ++i) {
      FUZZ_ASSERT(q.targets[i] == -100 || (i + 1 < q.ids.size() && q.targets[i] == q.ids[i + 1] &&
                                           q.seg[i + 1] == q.seg[i]),
                  "target at ", i, " is not the next token of its document");
      FUZZ_ASSERT(q.pos[i] >= 0 && q.pos[i] < seq_len);
    }
  }
  if (!seqs.empty()) {
    std::vector<int64_t> order = epoch_order(static_cast<int64_t>(seqs.size()), mode, 0);
    BatchBuffer bb = make_batch(seqs, order);
    FUZZ_ASSERT(static_cast<int64_t>(bb.ids.size()) == static_cast<int64_t>(seqs.size()) * seq_len);
  }
  return 0;
}
