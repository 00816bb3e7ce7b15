// No silent misreading of a run config: a [model] key that no supported config class knows is an
// error naming the nearest known key; [model] path with inline keys is an error; the keys of a
// config.json that trex does not use are listed once; the parsers read only listed keys; and the
// run config reference (docs/CONFIG.md) comes from the parser's own table, with valid defaults.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>
#include "cli/tokenizer_fns.h"
#include "model/config.h"
#include "tests/run_config_error.h"
#include "tests/tiny_configs.h"
#include "tests/unit/test_util.h"
#include "train/run_config.h"

using namespace trex;
using nlohmann::json;

namespace {

json run_config(json model) { return {{"model", std::move(model)}, {"data", {{"train", "x.jsonl"}}}}; }

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(ConfigKeys, ModelKeyTypoIsAnErrorNamingTheNearestKey) {
  json m = trex::testing::tiny_v3();
  m["routed_scalling_factor"] = 3.0;  // the default 1.0 would be used without a word
  const std::string e = trex::testing::run_config_error(run_config(m), {});
  EXPECT_TRUE(has(e, "unknown key model.routed_scalling_factor")) << e;
  EXPECT_TRUE(has(e, "did you mean 'routed_scaling_factor'?")) << e;
  EXPECT_TRUE(has(e, "run.toml")) << e;
  // Through --set too, and for a V4 config.
  json v4 = trex::testing::tiny_v4();
  const std::string e4 = trex::testing::run_config_error(run_config(v4), {"model.hc_sinkhorn_iter=3"});
  EXPECT_TRUE(has(e4, "did you mean 'hc_sinkhorn_iters'?")) << e4;
  // A word far from every key: no guess, the hint says to remove it.
  const std::string far = trex::testing::run_config_error(run_config(m), {"model.banana=1"});
  EXPECT_TRUE(has(far, "unknown key model.banana")) << far;
  EXPECT_TRUE(has(far, "remove it")) << far;
}

// --set reaches one key of a table (section.table.key=value) and reads TOML values as a config
// file writes them (inline tables, single-quoted strings), as well as JSON.
TEST(ConfigKeys, SetOverridesNestedKeysAndTomlValues) {
  const json base = run_config(trex::testing::tiny_v4());
  auto parse = [&](std::vector<std::string> ov) { return train::parse_run_config(base, "run.toml", ov); };
  const train::RunConfig a = parse({"model.compress_rates.compressed_sparse_attention=5"});
  EXPECT_EQ(a.model.v4.csa_rate, 5);
  EXPECT_EQ(a.model.v4.hca_rate, 7);  // the other key of the table is kept
  const train::RunConfig b =
      parse({"model.compress_rates={compressed_sparse_attention = 6, heavily_compressed_attention = 11}"});
  EXPECT_EQ(b.model.v4.csa_rate, 6);
  EXPECT_EQ(b.model.v4.hca_rate, 11);
  const train::RunConfig c = parse({"model.rope_parameters.factor=5.5", "optim.schedule='wsd'"});
  EXPECT_DOUBLE_EQ(c.model.v4.compress_rope.factor, 5.5);  // V4: flat YaRN keys are the compressed layers'
  EXPECT_EQ(c.model.v4.compress_rope.original_max_position_embeddings, 8);
  EXPECT_EQ(c.optim.schedule.kind, train::Schedule::Wsd);
  // What JSON can write stays JSON; a bare word or a TOML date stays a string.
  EXPECT_EQ(parse({"checkpoint.run_dir=2026-12-06"}).checkpoint.run_dir, "2026-12-06");
  // A key below a value that is not a table, and an empty key part, are errors naming the option.
  const std::string e = trex::testing::run_config_error(base, {"model.hidden_size.x=3"});
  EXPECT_TRUE(has(e, "model.hidden_size is not a table")) << e;
  EXPECT_TRUE(has(trex::testing::run_config_error(base, {"model..hidden_size=3"}), "empty key part"));
}

TEST(ConfigKeys, KnownKeysTrexDoesNotUseAreAcceptedAndListed) {
  json m = trex::testing::tiny_v3();
  m["bos_token_id"] = 0;
  m["use_cache"] = true;
  m["architectures"] = {"DeepseekV3ForCausalLM"};
  EXPECT_EQ(trex::testing::run_config_error(run_config(m), {}), "");
  // Metadata (architectures) is not listed; keys the parser never looks at are.
  EXPECT_EQ(model::unused_config_keys(m, "test"), (std::vector<std::string>{"bos_token_id", "use_cache"}));
  // A dense V3 config never looks at the MoE keys: they are unused there.
  json dense = trex::testing::tiny_v3();
  dense["n_routed_experts"] = 0;
  const std::vector<std::string> u = model::unused_config_keys(dense, "test");
  EXPECT_NE(std::find(u.begin(), u.end(), "num_experts_per_tok"), u.end());
  EXPECT_EQ(std::find(u.begin(), u.end(), "hidden_size"), u.end());
}

TEST(ConfigKeys, CheckpointConfigListsUnusedKeysOnce) {
  test::TmpDir d("trex_cfg_unused");
  json m = trex::testing::tiny_v3();
  m["use_cache"] = true;
  m["eos_token_id"] = 1;
  m["transformers_version"] = "4.46.0";
  std::ofstream(d.file("config.json")) << m.dump();
  ::testing::internal::CaptureStderr();
  model::load_config_json(d.file("config.json"));
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(has(err, "keys trex does not use (ignored): eos_token_id, use_cache")) << err;
  EXPECT_FALSE(has(err, "transformers_version")) << err;
  EXPECT_EQ(err.find("does not use"), err.rfind("does not use")) << "listed more than once: " << err;
}

TEST(ConfigKeys, PathWithInlineKeysIsAnError) {
  test::TmpDir d("trex_cfg_path");
  std::ofstream(d.file("config.json")) << trex::testing::tiny_v3().dump();
  json rc = run_config({{"path", d.str()}});
  EXPECT_EQ(trex::testing::run_config_error(rc, {}), "");
  // Before: the inline key was silently ignored (the checkpoint's 2.5 was used).
  rc["model"]["routed_scaling_factor"] = 1.0;
  const std::string e = trex::testing::run_config_error(rc, {});
  EXPECT_TRUE(has(e, "model.routed_scaling_factor is set next to model.path")) << e;
  EXPECT_TRUE(has(e, "remove model.routed_scaling_factor")) << e;
  EXPECT_TRUE(has(trex::testing::run_config_error(run_config({{"path", d.str()}}), {"model.hidden_size=64"}),
                  "model.hidden_size is set next to model.path"));
}

TEST(ConfigKeys, SectionKeyTypoNamesTheNearestKey) {
  const std::string e = trex::testing::run_config_error(run_config(trex::testing::tiny_v3()), {"train.stpes=3"});
  EXPECT_TRUE(has(e, "unknown key train.stpes")) << e;
  EXPECT_TRUE(has(e, "did you mean 'steps'?")) << e;
  EXPECT_TRUE(has(e, "allowed keys in [train]")) << e;
}

// Every key the V3 / V4 parsers look at is in read_config_keys() (so the [model] check, which
// accepts only listed keys, never rejects a key a parser reads).
TEST(ConfigKeys, ParsersReadOnlyListedKeys) {
  const std::vector<std::string>& known = model::read_config_keys();
  std::vector<json> configs = {trex::testing::tiny_v3(), trex::testing::tiny_v4()};
  json yarn = trex::testing::tiny_v3();
  yarn["rope_scaling"] = {{"type", "yarn"}, {"factor", 2.0}, {"original_max_position_embeddings", 16}};
  configs.push_back(yarn);
  json legacy = trex::testing::tiny_v4();  // the V4 legacy keys
  legacy.erase("layer_types");
  legacy.erase("mlp_layer_types");
  legacy.erase("compress_rates");
  legacy["compress_ratios"] = {4, 0, 128};
  legacy["num_hash_layers"] = 1;
  configs.push_back(legacy);
  for (const json& c : configs) {
    std::set<std::string> used;
    model::parse_config(c, "test", &used);
    for (const std::string& k : used)
      EXPECT_NE(std::find(known.begin(), known.end(), k), known.end()) << k << " is read but not listed";
  }
}

// The reference lists every section and key with a type, a default and a meaning; each default is a
// value the parser accepts.
TEST(ConfigKeys, ReferenceDefaultsParse) {
  const std::string md = train::run_config_reference();
  std::istringstream in(md);
  std::string line, section;
  int rows = 0;
  for (const char* s : {"## [model]", "## [data]", "## [train]", "## [optim]", "## [parallel]", "## [checkpoint]",
                        "## [log]"})
    EXPECT_TRUE(has(md, s)) << s;
  EXPECT_TRUE(has(md, "`routed_scaling_factor`"));
  while (std::getline(in, line)) {
    if (line.rfind("## [", 0) == 0) section = line.substr(4, line.find(']') - 4);
    if (line.rfind("| `", 0) != 0) continue;
    // | `key` | type | `default` | meaning |
    std::vector<std::string> cells;
    size_t p = 1;
    while (p < line.size()) {
      size_t q = p;
      while (q < line.size() && !(line[q] == '|' && line[q - 1] != '\\')) ++q;
      std::string c = line.substr(p, q - p);
      c.erase(0, c.find_first_not_of(' '));
      c.erase(c.find_last_not_of(' ') + 1);
      cells.push_back(c);
      p = q + 1;
    }
    ASSERT_GE(cells.size(), 4u) << line;
    const std::string key = cells[0].substr(1, cells[0].size() - 2), def = cells[2].substr(1, cells[2].size() - 2);
    EXPECT_FALSE(cells[1].empty()) << line;
    EXPECT_FALSE(cells[3].empty()) << line;
    const std::string e =
        trex::testing::run_config_error(run_config(trex::testing::tiny_v3()), {section + "." + key + "=" + def});
    EXPECT_EQ(e, "") << section << "." << key << " = " << def;
    ++rows;
  }
  EXPECT_GE(rows, 50);
}

// SFT with a template whose markers the tokenizer lacks trains on them as plain text: trex train
// warns, naming each (the committed tokenizer has DeepSeek's BOS / EOS only).
TEST(ConfigKeys, TemplateMarkersMissingFromTheTokenizerAreNamed) {
  const io::Tokenizer tok = io::Tokenizer::load("tests/data/tokenizer/trex_trained.json");
  EXPECT_EQ(cli::missing_template_tokens(tok, train::ChatTemplate::by_name("deepseek")),
            (std::vector<std::string>{"<｜User｜>", "<｜Assistant｜>"}));
  EXPECT_EQ(cli::missing_template_tokens(tok, train::ChatTemplate::by_name("chatml")),
            (std::vector<std::string>{"<|im_end|>", "<|im_start|>"}));
}

}  // namespace
