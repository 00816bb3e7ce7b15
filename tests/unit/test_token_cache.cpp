// The pre-tokenized, memory-mapped token cache: a second read maps what the first wrote and
// gives the same documents and counters; any change of input makes a new entry; a damaged
// entry is rebuilt; a run from the cache trains exactly as a run that tokenized.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>
#include "io/tokenizer.h"
#include "tests/unit/test_util.h"
#include "train/loop.h"
#include "train/token_cache.h"

using namespace trex;
using namespace trex::train;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct Fixture {
  test::TmpDir tmp{"tcache"};
  std::string tok_file = (test::data_dir("tokenizer", "trex_trained.json") / "trex_trained.json").string();
  io::Tokenizer tok = io::Tokenizer::load(tok_file);
  std::string sft = (tmp.path / "sft.jsonl").string(), cpt = (tmp.path / "cpt.jsonl").string();
  std::string cache = (tmp.path / "cache").string();

  Fixture() {
    std::ofstream s(sft), c(cpt);
    for (int i = 0; i < 30; ++i) {
      s << json{{"messages", {{{"role", "user"}, {"content", "How much is " + std::to_string(i) + " + 7?"}},
                              {{"role", "assistant"}, {"content", std::to_string(i + 7) + ", said the model."}}}}}
               .dump()
        << "\n";
      c << json{{"text", "Document " + std::to_string(i) + ": demand " + std::to_string(13 * i % 97) + " units."}}.dump()
        << "\n";
    }
    s << "{not json\n";  // counted as malformed, also on a cache hit
  }
  DocsSpec spec(const std::string& mode) const {
    DocsSpec sp;
    sp.mode = mode;
    sp.chat = ChatTemplate::by_name("deepseek");
    sp.eos_id = 1;
    sp.encode = [this](std::string_view t) { return tok.encode(t, false); };
    sp.tokenizer_file = tok_file;
    return sp;
  }
};

void expect_same(const TokenDocs& a, const TokenDocs& b) {
  ASSERT_EQ(a.size(), b.size());
  for (int64_t i = 0; i < a.size(); ++i) {
    DocSpan x = a.doc(i), y = b.doc(i);
    ASSERT_EQ(x.n, y.n) << i;
    EXPECT_TRUE(std::equal(x.ids, x.ids + x.n, y.ids)) << i;
    EXPECT_TRUE(std::equal(x.loss, x.loss + x.n, y.loss)) << i;
  }
}

TEST(TokenCache, SecondReadMapsTheSameDocumentsAndCounters) {
  Fixture f;
  for (const std::string mode : {"sft", "cpt"}) {
    const std::string& file = mode == "sft" ? f.sft : f.cpt;
    DataStats plain, first, second;
    TokenDocs ref = load_docs({file}, f.spec(mode), "", plain);
    bool hit = true;
    TokenDocs a = load_docs({file}, f.spec(mode), f.cache, first, &hit);
    EXPECT_FALSE(hit);
    EXPECT_FALSE(a.mapped());
    TokenDocs b = load_docs({file}, f.spec(mode), f.cache, second, &hit);
    EXPECT_TRUE(hit);
    EXPECT_TRUE(b.mapped());
    expect_same(ref, a);
    expect_same(ref, b);
    EXPECT_EQ(ref.size(), 30);
    EXPECT_EQ(second.tokens, plain.tokens);
    EXPECT_EQ(second.target_tokens, plain.target_tokens);
    EXPECT_EQ(second.skipped_malformed, plain.skipped_malformed);
    EXPECT_EQ(second.first_errors, plain.first_errors);
    EXPECT_EQ(plain.skipped_malformed, mode == "sft" ? 1 : 0);
    // Packing from the mapped spans equals packing the in-memory documents.
    DataStats s1, s2;
    auto p1 = pack(ref.spans(), 40, OverflowPolicy::Truncate, mode == "cpt", 1, s1);
    auto p2 = pack(b.spans(), 40, OverflowPolicy::Truncate, mode == "cpt", 1, s2);
    ASSERT_EQ(p1.size(), p2.size());
    for (size_t i = 0; i < p1.size(); ++i) {
      EXPECT_EQ(p1[i].ids, p2[i].ids);
      EXPECT_EQ(p1[i].targets, p2[i].targets);
      EXPECT_EQ(p1[i].seg, p2[i].seg);
    }
  }
}

TEST(TokenCache, AnyChangedInputMakesANewEntry) {
  Fixture f;
  const DocsSpec base = f.spec("sft");
  const std::string k0 = cache_key({f.sft}, base);
  EXPECT_EQ(k0, cache_key({f.sft}, f.spec("sft")));
  DocsSpec s = base;
  s.train_on_prompt = true;
  EXPECT_NE(cache_key({f.sft}, s), k0);
  s = base;
  s.chat = ChatTemplate::by_name("chatml");
  EXPECT_NE(cache_key({f.sft}, s), k0);
  s = base;
  s.eos_id = 2;
  EXPECT_NE(cache_key({f.sft}, s), k0);
  s = base;
  s.mode = "cpt";
  EXPECT_NE(cache_key({f.sft}, s), k0);
  EXPECT_NE(cache_key({f.sft, f.cpt}, base), k0);
  s = base;  // another tokenizer file
  s.tokenizer_file = (test::data_dir("tokenizer", "gpt2_style.json") / "gpt2_style.json").string();
  EXPECT_NE(cache_key({f.sft}, s), k0);

  // Editing the data file: a new key, and the new entry holds the new text.
  DataStats st;
  bool hit = false;
  TokenDocs a = load_docs({f.sft}, base, f.cache, st, &hit);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  {
    std::ofstream o(f.sft, std::ios::app);
    o << json{{"messages", {{{"role", "user"}, {"content", "one more"}}, {{"role", "assistant"}, {"content", "ok"}}}}}
             .dump()
      << "\n";
  }
  EXPECT_NE(cache_key({f.sft}, base), k0);
  TokenDocs b = load_docs({f.sft}, base, f.cache, st, &hit);
  EXPECT_FALSE(hit);
  EXPECT_EQ(b.size(), a.size() + 1);

  // An encoder without a tokenizer file is never cached.
  s = base;
  s.tokenizer_file = "";
  load_docs({f.sft}, s, f.cache + "_nofile", st, &hit);
  load_docs({f.sft}, s, f.cache + "_nofile", st, &hit);
  EXPECT_FALSE(hit);
  EXPECT_FALSE(fs::exists(f.cache + "_nofile"));
}

TEST(TokenCache, DamagedEntryIsRebuilt) {
  Fixture f;
  DataStats st;
  bool hit = false;
  TokenDocs ref = load_docs({f.cpt}, f.spec("cpt"), "", st);
  load_docs({f.cpt}, f.spec("cpt"), f.cache, st, &hit);
  const fs::path entry = fs::path(f.cache) / cache_key({f.cpt}, f.spec("cpt"));
  ASSERT_TRUE(fs::exists(entry / "tokens.bin"));
  fs::resize_file(entry / "tokens.bin", fs::file_size(entry / "tokens.bin") - 4);  // cut one id
  TokenDocs b = load_docs({f.cpt}, f.spec("cpt"), f.cache, st, &hit);
  EXPECT_FALSE(hit);
  expect_same(ref, b);
  TokenDocs c = load_docs({f.cpt}, f.spec("cpt"), f.cache, st, &hit);  // the rebuilt entry serves
  EXPECT_TRUE(hit);
  expect_same(ref, c);
  // No temporary directories are left behind.
  for (const auto& e : fs::directory_iterator(f.cache))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  // Opening garbage directly is a UserError naming the entry.
  fs::create_directories(f.tmp.path / "junk");
  std::ofstream(f.tmp.path / "junk" / "meta.json") << "{\"version\": 1, \"docs\": 3, \"tokens\": 9}";
  try {
    TokenDocs::open((f.tmp.path / "junk").string());
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("junk"), std::string::npos) << e.what();
  }
}

TEST(TokenCache, RunFromTheCacheTrainsAsARunThatTokenized) {
  Fixture f;
  json j = {{"model",
             {{"vocab_size", (int)f.tok.vocab_size()}, {"hidden_size", 24}, {"num_hidden_layers", 2},
              {"num_attention_heads", 2}, {"q_lora_rank", 12}, {"kv_lora_rank", 8}, {"qk_nope_head_dim", 6},
              {"qk_rope_head_dim", 4}, {"v_head_dim", 6}, {"intermediate_size", 40}, {"moe_intermediate_size", 10},
              {"n_routed_experts", 3}, {"n_shared_experts", 1}, {"num_experts_per_tok", 2},
              {"first_k_dense_replace", 1}, {"initializer_range", 0.05}}},
            {"data", {{"mode", "sft"}, {"train", {f.sft}}, {"seq_len", 40}, {"cache_dir", f.cache}}},
            {"train", {{"batch_size", 2}, {"steps", 3}, {"precision", "fp32"}}},
            {"optim", {{"lr", 3e-3}}},
            {"log", {{"progress", "lines"}}}};
  TokenizerFns fns{[&f](std::string_view s) { return f.tok.encode(s, false); }, 1, 1, f.tok_file};
  std::vector<double> loss[2];
  for (int run = 0; run < 2; ++run) {
    j["checkpoint"] = {{"dir", (f.tmp.path / ("run" + std::to_string(run))).string()}};
    TrainResult r = run_training(parse_run_config(j, "test"), fns);
    EXPECT_EQ(r.data_from_cache, run == 1);
    std::ifstream m((f.tmp.path / ("run" + std::to_string(run)) / "metrics.jsonl").string());
    std::string line;
    while (std::getline(m, line)) loss[run].push_back(json::parse(line)["loss"].get<double>());
  }
  ASSERT_EQ(loss[0].size(), 3u);
  EXPECT_EQ(loss[0], loss[1]);
}

}  // namespace
