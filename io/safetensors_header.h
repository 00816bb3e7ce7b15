// Internal to the safetensors module (io/safetensors*.cpp): the header limits and messages shared
// by the reader and the writer, and the strict JSON parser that validates headers and indexes.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace trex::io::safetensors_detail {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // same limit as the Rust implementation
constexpr uint64_t kMaxIndexBytes = 256ull << 20;
constexpr int kMaxJsonDepth = 8;  // a valid header nests 3 deep
constexpr const char* kCorrupt =
    "the file is corrupt, truncated or not a safetensors file; re-download or re-convert it";
constexpr const char* kIndexHint =
    "the checkpoint index is corrupt or does not match its shards; re-download the checkpoint";
constexpr const char* kSingleName = "model.safetensors";
constexpr const char* kIndexName = "model.safetensors.index.json";

// Parses JSON from [b, e), rejecting duplicate object keys (at any level) and nesting deeper
// than kMaxJsonDepth; UserError with `hint`, prefixed by `where`, on any problem.
// top_key: what a top-level key is ("tensor name", "key"), for the duplicate-key message.
nlohmann::json parse_strict(const char* b, const char* e, const std::string& where, const char* hint,
                            const char* top_key);

}  // namespace trex::io::safetensors_detail
