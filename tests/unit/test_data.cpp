// SFT / CPT data: chat and alpaca parsing, loss masks, packing (positions, segments, targets
// never crossing documents), overflow policies, malformed input counted or refused.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include "core/error.h"
#include "train/data.h"

using namespace trex;
using namespace trex::train;
namespace fs = std::filesystem;

namespace {

// Toy tokenizer: the template's special strings are single ids, every other byte is byte+10.
std::vector<int32_t> toy_encode(std::string_view s) {
  static const std::vector<std::pair<std::string, int32_t>> sp = {
      {"<｜begin▁of▁sentence｜>", 1}, {"<｜end▁of▁sentence｜>", 2}, {"<｜User｜>", 3}, {"<｜Assistant｜>", 4}};
  for (auto& [t, id] : sp)
    if (s == t) return {id};
  std::vector<int32_t> out;
  for (unsigned char c : s) out.push_back(c + 10);
  return out;
}

std::string write_file(const std::string& name, const std::string& text) {
  fs::path p = fs::temp_directory_path() / name;
  std::ofstream(p) << text;
  return p.string();
}

TEST(Data, ChatTargetsAreAssistantTokensOnly) {
  std::vector<Message> msgs;
  DataStats st;
  ASSERT_TRUE(parse_sft_line(R"({"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"yo"}]})",
                             "t:1", &msgs, st));
  Sample s = render_chat(msgs, ChatTemplate::by_name("deepseek"), toy_encode, false);
  // bos, User, h, i, Assistant, y, o, eos
  std::vector<int32_t> ids = {1, 3, 'h' + 10, 'i' + 10, 4, 'y' + 10, 'o' + 10, 2};
  std::vector<uint8_t> loss = {0, 0, 0, 0, 0, 1, 1, 1};
  EXPECT_EQ(s.ids, ids);
  EXPECT_EQ(s.loss, loss);
  // The generation prompt for the user turn is the sample up to and including the assistant tag.
  std::vector<int32_t> prompt = render_generation_prompt({msgs[0]}, ChatTemplate::by_name("deepseek"), toy_encode);
  EXPECT_EQ(prompt, std::vector<int32_t>(ids.begin(), ids.begin() + 5));
  Sample all = render_chat(msgs, ChatTemplate::by_name("deepseek"), toy_encode, true);
  EXPECT_EQ(std::count(all.loss.begin(), all.loss.end(), 1), 7);  // all but the first token
}

TEST(Data, DeepSeekV2ChatTemplate) {
  // DeepSeek-V2-Chat's tokenizer_config.json: bos, "{system}\n\n", "User: {user}\n\n",
  // "Assistant: {reply}" + eos; generation prompt "Assistant:". The reply with its leading space and
  // the eos are the targets; "Assistant:" is context and ends the generation prompt.
  auto bytes = [](const std::string& s) {
    std::vector<int32_t> v;
    for (unsigned char c : s) v.push_back(c + 10);
    return v;
  };
  const ChatTemplate t = ChatTemplate::by_name("deepseek-v2");
  std::vector<Message> msgs = {{"system", "sys"}, {"user", "hi"}, {"assistant", "yo"}, {"user", "ok"},
                               {"assistant", "k"}};
  Sample s = render_chat(msgs, t, toy_encode, false);
  std::vector<int32_t> ids = {1};
  std::vector<uint8_t> loss = {0};
  auto add = [&](const std::vector<int32_t>& v, uint8_t target) {
    ids.insert(ids.end(), v.begin(), v.end());
    loss.insert(loss.end(), v.size(), target);
  };
  add(bytes("sys\n\n"), 0);
  add(bytes("User: hi\n\n"), 0);
  add(bytes("Assistant:"), 0);
  add(bytes(" yo"), 1);
  add({2}, 1);
  add(bytes("User: ok\n\n"), 0);
  add(bytes("Assistant:"), 0);
  add(bytes(" k"), 1);
  add({2}, 1);
  EXPECT_EQ(s.ids, ids);
  EXPECT_EQ(s.loss, loss);
  // The generation prompt is the chat so far up to and including "Assistant:", as transformers'
  // apply_chat_template(add_generation_prompt=True) renders it.
  std::vector<int32_t> prompt = render_generation_prompt({msgs[0], msgs[1]}, t, toy_encode);
  std::vector<int32_t> want = {1};
  for (const char* piece : {"sys\n\n", "User: hi\n\n", "Assistant:"})
    for (int32_t id : bytes(piece)) want.push_back(id);
  EXPECT_EQ(prompt, want);
  Sample all = render_chat(msgs, t, toy_encode, true);
  EXPECT_EQ(std::count(all.loss.begin(), all.loss.end(), 1), (long)all.ids.size() - 1);
  EXPECT_EQ(t.eos, "<｜end▁of▁sentence｜>");
}

TEST(Data, AlpacaAndMalformedLines) {
  std::vector<Message> msgs;
  DataStats st;
  ASSERT_TRUE(parse_sft_line(R"({"instruction":"add","input":"1 2","output":"3"})", "t:1", &msgs, st));
  ASSERT_EQ(msgs.size(), 2u);
  EXPECT_EQ(msgs[0].content, "add\n\n1 2");
  EXPECT_FALSE(parse_sft_line("{not json", "f.jsonl:7", &msgs, st));
  EXPECT_FALSE(parse_sft_line(R"({"messages":[{"role":"bot","content":"x"}]})", "f.jsonl:8", &msgs, st));
  EXPECT_FALSE(parse_sft_line(R"({"prompt":"x"})", "f.jsonl:9", &msgs, st));
  EXPECT_EQ(st.skipped_malformed, 3);
  ASSERT_EQ(st.first_errors.size(), 3u);
  EXPECT_NE(st.first_errors[0].find("f.jsonl:7"), std::string::npos);
}

TEST(Data, SftFileCountsSkipsAndRefusesEmpty) {
  std::string p = write_file("trex_sft.jsonl",
                             R"({"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]})"
                             "\nnot json\n"
                             R"({"messages":[{"role":"user","content":"only a prompt"}]})"
                             "\n\n");
  DataStats st;
  auto docs = read_sft_file(p, ChatTemplate::by_name("deepseek"), toy_encode, false, st);
  EXPECT_EQ(docs.size(), 1u);
  EXPECT_EQ(st.skipped_malformed, 1);
  EXPECT_EQ(st.skipped_no_target, 1);
  std::string e = write_file("trex_empty.jsonl", "");
  DataStats st2;
  EXPECT_THROW(read_sft_file(e, ChatTemplate::by_name("deepseek"), toy_encode, false, st2), UserError);
  EXPECT_THROW(read_sft_file("/no/such/file.jsonl", ChatTemplate::by_name("deepseek"), toy_encode, false, st2),
               UserError);
  EXPECT_THROW(ChatTemplate::by_name("llama9"), UserError);
}

TEST(Data, PackingRestartsPositionsAndNeverCrossesDocuments) {
  std::vector<Sample> docs(3);
  for (int d = 0; d < 3; ++d) {
    for (int i = 0; i < 4 + d; ++i) docs[d].ids.push_back(100 * (d + 1) + i);
    docs[d].loss.assign(docs[d].ids.size(), 1);
    docs[d].loss[0] = 0;
  }
  DataStats st;
  auto seqs = pack(docs, 10, OverflowPolicy::Drop, false, 0, st);
  ASSERT_EQ(seqs.size(), 2u);  // [4 + 5] then [6]
  const PackedSeq& a = seqs[0];
  EXPECT_EQ(a.pos, (std::vector<int32_t>{0, 1, 2, 3, 0, 1, 2, 3, 4, 0}));
  EXPECT_EQ(a.seg, (std::vector<int32_t>{0, 0, 0, 0, 1, 1, 1, 1, 1, -1}));
  EXPECT_EQ(a.targets[3], -100);  // end of doc 0: no target from doc 1
  EXPECT_EQ(a.targets[2], 103);
  EXPECT_EQ(a.targets[8], -100);
  EXPECT_EQ(a.targets[9], -100);  // pad
  EXPECT_EQ(seqs[1].ids[0], 300);
}

TEST(Data, OverflowPolicies) {
  Sample big;
  for (int i = 0; i < 25; ++i) big.ids.push_back(i), big.loss.push_back(1);
  DataStats st;
  EXPECT_TRUE(pack({big}, 10, OverflowPolicy::Drop, false, 0, st).empty());
  EXPECT_EQ(st.dropped_too_long, 1);
  auto t = pack({big}, 10, OverflowPolicy::Truncate, false, 0, st);
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(st.truncated, 1);
  auto c = pack({big}, 10, OverflowPolicy::Drop, true, 0, st);  // CPT: cut into pieces
  EXPECT_EQ(c.size(), 3u);
  Sample late = big;  // only the tail is trained on: truncating would keep no target
  std::fill(late.loss.begin(), late.loss.begin() + 20, 0);
  DataStats st2;
  EXPECT_TRUE(pack({late}, 10, OverflowPolicy::Truncate, false, 0, st2).empty());
  EXPECT_EQ(st2.dropped_too_long, 1);
}

TEST(Data, CptJsonlAndText) {
  std::string p = write_file("trex_cpt.jsonl", "{\"text\": \"ab\"}\n{\"txt\": 1}\n{\"text\": \"c\"}\n");
  DataStats st;
  auto docs = read_cpt_file(p, toy_encode, 2, st);
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[0].ids, (std::vector<int32_t>{'a' + 10, 'b' + 10, 2}));
  EXPECT_EQ(st.skipped_malformed, 1);
  std::string q = write_file("trex_cpt.txt", "hello");
  DataStats st2;
  EXPECT_EQ(read_cpt_file(q, toy_encode, 2, st2).at(0).ids.size(), 6u);
}

// Plain text follows the documented boundary: one document per blank-line separated block (lines
// holding only spaces or tabs count as blank; several blank lines are one boundary). Before, the
// whole file was one document, so eval_fraction held nothing out.
TEST(Data, PlainTextIsOneDocumentPerBlankLineSeparatedBlock) {
  std::string q = write_file("trex_cpt_blocks.txt", "\nab\ncd\n\n  \t\n\nef\n\ngh");
  DataStats st;
  auto docs = read_cpt_file(q, toy_encode, 2, st);
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[0].ids, (std::vector<int32_t>{'a' + 10, 'b' + 10, '\n' + 10, 'c' + 10, 'd' + 10, 2}));
  EXPECT_EQ(docs[1].ids, (std::vector<int32_t>{'e' + 10, 'f' + 10, 2}));
  EXPECT_EQ(docs[2].ids, (std::vector<int32_t>{'g' + 10, 'h' + 10, 2}));
  EXPECT_EQ(st.samples, 3);
  // Only blank lines: no document, an error.
  std::string blank = write_file("trex_cpt_blank.txt", "\n \n\n");
  DataStats st2;
  EXPECT_THROW(read_cpt_file(blank, toy_encode, 2, st2), UserError);
}

TEST(Data, EpochOrderIsADeterministicPermutation) {
  auto a = epoch_order(50, 7, 0), b = epoch_order(50, 7, 0), c = epoch_order(50, 7, 1);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  std::sort(c.begin(), c.end());
  for (int i = 0; i < 50; ++i) EXPECT_EQ(c[i], i);
}

}  // namespace
