// Malformed or unsupported tokenizer.json files: each must throw trex::UserError whose message
// names the file and the field (and, for unsupported kinds, what is supported) - never load
// something that would give wrong ids.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/tokenizer.h"
#include "io/tokenizer_text.h"

namespace fs = std::filesystem;
using namespace trex;
using namespace trex::io;
using json = nlohmann::json;

namespace {

// A small valid byte-level BPE tokenizer.json: 256 byte characters, merges "h e", "he l".
json valid() {
  json vocab = json::object();
  int id = 0;
  vocab["<s>"] = id++;
  for (int b = 0; b < 256; ++b) vocab[tok::to_byte_level(std::string(1, (char)b))] = id++;
  vocab["he"] = id++;
  vocab["hel"] = id++;
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens",
           {{{"id", 0}, {"content", "<s>"}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
             {"normalized", false}, {"special", true}}}},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
          {"post_processor",
           {{"type", "TemplateProcessing"},
            {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
            {"pair", json::array()},
            {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {0}}, {"tokens", {"<s>"}}}}}}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"vocab", vocab},
            {"merges", {"h e", json::array({"he", "l"})}}}}};
}

struct TmpFile {
  fs::path path;
  explicit TmpFile(const std::string& content) {
    static std::atomic<int> n{0};
    path = fs::temp_directory_path() / ("trex_tok_err_" + std::to_string(getpid()) + "_" + std::to_string(n++) + ".json");
    std::ofstream(path, std::ios::binary) << content;
  }
  ~TmpFile() { fs::remove(path); }
};

// Loads `content` from a file; expects a UserError mentioning the path and every `needles`.
void expect_user_error(const std::string& content, std::vector<std::string> needles) {
  TmpFile f(content);
  try {
    Tokenizer::load(f.path.string());
    ADD_FAILURE() << "loaded without error; expected one naming: " << needles[0];
  } catch (const UserError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(f.path.string()), std::string::npos) << "message lacks the file: " << msg;
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "message lacks '" << n << "': " << msg;
    EXPECT_FALSE(e.hint.empty());
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

void expect_mutation_error(const std::function<void(json&)>& mutate, std::vector<std::string> needles) {
  json j = valid();
  mutate(j);
  expect_user_error(j.dump(), std::move(needles));
}

}  // namespace

TEST(TokenizerErrors, ValidBaseLoadsAndEncodes) {
  TmpFile f(valid().dump());
  Tokenizer t = Tokenizer::load(f.path.string());
  EXPECT_EQ(t.encode("hello", false), (std::vector<int32_t>{258, 1 + 'l', 1 + 'o'}));
  EXPECT_EQ(t.encode("hello").front(), 0);
  EXPECT_EQ(t.decode(t.encode("hello"), true), "hello");
}

TEST(TokenizerErrors, NotJsonOrWrongShape) {
  expect_user_error("{\"model\": ", {"not valid JSON"});
  expect_user_error("[1, 2]", {"top level"});
  expect_user_error("", {"not valid JSON"});
  EXPECT_THROW(Tokenizer::load("/nonexistent/tokenizer.json"), UserError);
}

TEST(TokenizerErrors, ModelFields) {
  expect_mutation_error([](json& j) { j.erase("model"); }, {"field model"});
  expect_mutation_error([](json& j) { j["model"]["type"] = "WordPiece"; }, {"model.type", "WordPiece", "BPE"});
  expect_mutation_error([](json& j) { j["model"]["type"] = "Unigram"; }, {"model.type", "Unigram"});
  expect_mutation_error([](json& j) { j["model"].erase("vocab"); }, {"model.vocab"});
  expect_mutation_error([](json& j) { j["model"]["vocab"]["he"] = "x"; }, {"model.vocab[\"he\"]"});
  expect_mutation_error([](json& j) { j["model"]["vocab"]["he"] = -4; }, {"model.vocab[\"he\"]"});
  expect_mutation_error([](json& j) { j["model"]["vocab"]["he"] = 5; }, {"model.vocab", "id 5"});
  expect_mutation_error([](json& j) { j["model"].erase("merges"); }, {"model.merges"});
  expect_mutation_error([](json& j) { j["model"]["merges"][0] = "h e x"; }, {"model.merges[0]"});
  expect_mutation_error([](json& j) { j["model"]["merges"][0] = "hq e"; }, {"model.merges[0]", "'hq'"});
  expect_mutation_error([](json& j) { j["model"]["merges"][1] = json::array({"he", 3}); }, {"model.merges[1]"});
  expect_mutation_error([](json& j) { j["model"]["merges"].push_back("l o"); }, {"model.merges[2]", "merged token 'lo'"});
  expect_mutation_error([](json& j) { j["model"]["byte_fallback"] = true; }, {"model.byte_fallback"});
  expect_mutation_error([](json& j) { j["model"]["dropout"] = 0.1; }, {"model.dropout"});
  expect_mutation_error([](json& j) { j["model"]["continuing_subword_prefix"] = "##"; },
                        {"model.continuing_subword_prefix"});
  expect_mutation_error([](json& j) { j["model"]["end_of_word_suffix"] = "</w>"; }, {"model.end_of_word_suffix"});
}

TEST(TokenizerErrors, NormalizerPreTokenizerDecoderPostProcessor) {
  expect_mutation_error([](json& j) { j["normalizer"] = {{"type", "NFC"}}; }, {"normalizer.type", "NFC", "ICU"});
  expect_mutation_error([](json& j) { j["normalizer"] = {{"type", "Lowercase"}}; }, {"normalizer.type", "Lowercase"});
  expect_mutation_error([](json& j) { j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFKC"}}}}}; },
                        {"normalizer.normalizers[0].type"});
  expect_mutation_error([](json& j) { j["pre_tokenizer"] = nullptr; }, {"pre_tokenizer", "ByteLevel"});
  expect_mutation_error([](json& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "▁"}}; },
                        {"pre_tokenizer.type", "Metaspace"});
  expect_mutation_error(
      [](json& j) {
        j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}}}};
      },
      {"pre_tokenizer", "no ByteLevel"});
  expect_mutation_error(
      [](json& j) {
        j["pre_tokenizer"] = {{"type", "Sequence"},
                              {"pretokenizers", {{{"type", "ByteLevel"}}, {{"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", "Isolated"}}}}};
      },
      {"pre_tokenizer.pretokenizers[1]", "after ByteLevel"});
  auto split = [](json pattern, std::string behavior) {
    return [=](json& j) {
      j["pre_tokenizer"] = {{"type", "Sequence"},
                            {"pretokenizers", {{{"type", "Split"}, {"pattern", pattern}, {"behavior", behavior}},
                                               {{"type", "ByteLevel"}, {"use_regex", false}}}}};
    };
  };
  expect_mutation_error(split({{"Regex", "a"}}, "Bogus"), {"pre_tokenizer.pretokenizers[0].behavior", "Bogus"});
  expect_mutation_error(split({{"Regex", "([a-"}}, "Isolated"), {"pre_tokenizer.pretokenizers[0].pattern", "([a-"});
  expect_mutation_error(split({{"Regex", "[a[b]]"}}, "Isolated"), {"pre_tokenizer.pretokenizers[0].pattern", "nested"});
  expect_mutation_error(split({{"Glob", "*"}}, "Isolated"), {"pre_tokenizer.pretokenizers[0].pattern"});
  expect_mutation_error([](json& j) { j["decoder"] = {{"type", "WordPiece"}}; }, {"decoder.type", "WordPiece"});
  expect_mutation_error([](json& j) { j["decoder"] = nullptr; }, {"decoder"});
  expect_mutation_error([](json& j) { j["post_processor"]["type"] = "Weird"; }, {"post_processor.type", "Weird"});
  expect_mutation_error([](json& j) { j["post_processor"]["single"][0]["SpecialToken"]["id"] = "<x>"; },
                        {"post_processor.special_tokens[\"<x>\"]"});
  expect_mutation_error([](json& j) { j["post_processor"]["single"].erase(1); }, {"post_processor.single"});
  expect_mutation_error([](json& j) { j["truncation"] = {{"max_length", 512}}; }, {"truncation"});
  expect_mutation_error([](json& j) { j["padding"] = {{"length", 512}}; }, {"padding"});
}

TEST(TokenizerErrors, AddedTokens) {
  expect_mutation_error([](json& j) { j["added_tokens"] = "x"; }, {"added_tokens"});
  expect_mutation_error([](json& j) { j["added_tokens"][0].erase("content"); }, {"added_tokens[0].content"});
  expect_mutation_error([](json& j) { j["added_tokens"][0]["special"] = "yes"; }, {"added_tokens[0].special"});
  expect_mutation_error([](json& j) { j["added_tokens"][0]["id"] = "0"; }, {"added_tokens[0].id"});
}

// Files of other tokenizer kinds: BERT WordPiece and a SentencePiece-style Unigram.
TEST(TokenizerErrors, OtherTokenizerKinds) {
  json bert = {{"version", "1.0"},
               {"truncation", nullptr},
               {"padding", nullptr},
               {"added_tokens", json::array()},
               {"normalizer", {{"type", "BertNormalizer"}, {"lowercase", true}}},
               {"pre_tokenizer", {{"type", "BertPreTokenizer"}}},
               {"post_processor", {{"type", "BertProcessing"}, {"sep", {"[SEP]", 102}}, {"cls", {"[CLS]", 101}}}},
               {"decoder", {{"type", "WordPiece"}, {"prefix", "##"}}},
               {"model", {{"type", "WordPiece"}, {"unk_token", "[UNK]"}, {"vocab", {{"[UNK]", 0}, {"a", 1}}}}}};
  expect_user_error(bert.dump(), {"normalizer.type", "BertNormalizer"});
  json sp = {{"version", "1.0"},
             {"added_tokens", json::array()},
             {"normalizer", nullptr},
             {"pre_tokenizer", {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "always"}}},
             {"decoder", {{"type", "Metaspace"}}},
             {"model", {{"type", "Unigram"}, {"unk_id", 0}, {"vocab", {{"<unk>", 0.0}}}}}};
  expect_user_error(sp.dump(), {"pre_tokenizer.type", "Metaspace"});
}
