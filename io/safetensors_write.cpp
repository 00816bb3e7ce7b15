// Safetensors writer: byte-compatible single files and sharded checkpoint directories, written
// through io/atomic_file.h (temp file, fsync, rename, fsync of the directory). See io/safetensors.h.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "io/safetensors_header.h"

namespace trex::io {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;
using namespace safetensors_detail;

namespace {

// Rank of a dtype in the Rust `Dtype` enum; the Rust writer orders tensors by descending rank
// (which is descending alignment) and then by name.
int rust_rank(DType t) {
  switch (t) {
    case DType::BOOL: return 0;
    case DType::F4: return 1;
    case DType::U8: return 2;
    case DType::I8: return 3;
    case DType::F8_E5M2: return 4;
    case DType::F8_E4M3: return 5;
    case DType::F8_E8M0: return 6;
    case DType::I16: return 7;
    case DType::F16: return 8;
    case DType::BF16: return 9;
    case DType::I32: return 10;
    case DType::F32: return 11;
    case DType::F64: return 12;
    case DType::I64: return 13;
  }
  return -1;
}


// numel * dtype_size with overflow checks; false on overflow or negative dims.
bool tensor_bytes(const Shape& s, DType t, uint64_t* out) {
  uint64_t n = 1;
  if (s.ndim < 0 || s.ndim > kMaxDims) return false;
  for (int i = 0; i < s.ndim; ++i) {
    if (s.d[i] < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(s.d[i]), &n)) return false;
  }
  if (n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
  if (t == DType::F4) {  // two elements per byte
    if (n % 2) return false;
    *out = n / 2;
    return true;
  }
  return !__builtin_mul_overflow(n, static_cast<uint64_t>(dtype_size(t)), out);
}

// model.safetensors, model.safetensors.index.json or model-NNNNN-of-NNNNN.safetensors.
bool is_checkpoint_file(const std::string& fn) {
  if (fn == kSingleName || fn == kIndexName) return true;
  static constexpr std::string_view pat = "model-#####-of-#####.safetensors";
  if (fn.size() != pat.size()) return false;
  for (size_t i = 0; i < pat.size(); ++i)
    if (pat[i] == '#' ? !(fn[i] >= '0' && fn[i] <= '9') : fn[i] != pat[i]) return false;
  return true;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Writer

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const char* hint = "fix the tensors passed to write_safetensors";
  std::vector<uint64_t> bytes(tensors.size());
  std::set<std::string> seen;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorToWrite& t = tensors[i];
    TREX_USER_CHECK(!t.name.empty() && t.name != "__metadata__", hint, "writing '", path,
                    "': invalid tensor name '", t.name, "'");
    TREX_USER_CHECK(seen.insert(t.name).second, hint, "writing '", path,
                    "': duplicate tensor name '", t.name, "'");
    TREX_USER_CHECK(tensor_bytes(t.shape, t.dtype, &bytes[i]), hint, "writing '", path,
                    "': tensor '", t.name, "' has an invalid shape ", t.shape.str());
    TREX_USER_CHECK(t.data || bytes[i] == 0, hint, "writing '", path, "': tensor '", t.name,
                    "' has null data");
  }
  std::vector<size_t> idx(tensors.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
    int ra = rust_rank(tensors[a].dtype), rb = rust_rank(tensors[b].dtype);
    if (ra != rb) return ra > rb;
    return tensors[a].name < tensors[b].name;
  });

  ojson hdr = ojson::object();
  ojson meta = ojson::object();
  if (metadata.empty()) meta["format"] = "pt";
  for (const auto& kv : metadata) meta[kv.first] = kv.second;
  hdr["__metadata__"] = std::move(meta);
  uint64_t off = 0;
  for (size_t i : idx) {
    const TensorToWrite& t = tensors[i];
    ojson shape = ojson::array();
    for (int k = 0; k < t.shape.ndim; ++k) shape.push_back(t.shape.d[k]);
    ojson e = ojson::object();
    e["dtype"] = std::string(dtype_name(t.dtype));
    e["shape"] = std::move(shape);
    e["data_offsets"] = ojson::array({off, off + bytes[i]});
    hdr[t.name] = std::move(e);
    off += bytes[i];
  }
  std::string h;
  try {
    h = hdr.dump(-1, ' ', false, ojson::error_handler_t::strict);
  } catch (const ojson::exception& ex) {
    TREX_USER_FAIL("tensor names and metadata must be valid UTF-8", "writing '", path, "': ",
                   ex.what());
  }
  h.append((8 - h.size() % 8) % 8, ' ');
  TREX_USER_CHECK(h.size() <= kMaxHeaderBytes, "split the tensors over several files",
                  "writing '", path, "': header of ", h.size(), " bytes exceeds 100 MB");

  write_file_atomic(path, [&](AtomicWriter& f) {
    const uint64_t n = h.size();
    f.write(&n, 8);
    f.write(h.data(), h.size());
    for (size_t i : idx) f.write(tensors[i].data, bytes[i]);
  });
}

void write_safetensors_dir(const std::string& dir, const std::vector<TensorToWrite>& tensors,
                           uint64_t max_shard_bytes) {
  TREX_USER_CHECK(max_shard_bytes > 0, "pass a positive shard size", "writing checkpoint '",
                  dir, "': max_shard_bytes is 0");
  std::set<std::string> seen;
  std::vector<std::vector<TensorToWrite>> shards;
  std::vector<TensorToWrite> cur;
  uint64_t cur_bytes = 0, total = 0;
  for (const TensorToWrite& t : tensors) {
    uint64_t b = 0;
    TREX_USER_CHECK(seen.insert(t.name).second, "fix the tensors passed to write_safetensors_dir",
                    "writing checkpoint '", dir, "': duplicate tensor name '", t.name, "'");
    TREX_USER_CHECK(tensor_bytes(t.shape, t.dtype, &b), "fix the tensors passed",
                    "writing checkpoint '", dir, "': tensor '", t.name, "' has an invalid shape ",
                    t.shape.str());
    total += b;
    if (b > max_shard_bytes) {  // huggingface_hub: an oversized tensor gets a shard of its own
      shards.push_back({t});
      continue;
    }
    if (cur_bytes + b > max_shard_bytes) {
      shards.push_back(std::move(cur));
      cur.clear();
      cur_bytes = 0;
    }
    cur.push_back(t);
    cur_bytes += b;
  }
  if (!cur.empty() || shards.empty()) shards.push_back(std::move(cur));

  std::error_code ec;
  fs::create_directories(dir, ec);
  TREX_USER_CHECK(!ec, "check permissions", "cannot create checkpoint directory '", dir, "': ",
                  ec.message());
  const fs::path d(dir);
  std::set<std::string> produced;
  if (shards.size() == 1) {
    write_safetensors((d / kSingleName).string(), shards[0]);
    produced.insert(kSingleName);
  } else {
    json wmap = json::object();
    const size_t ns = shards.size();
    for (size_t i = 0; i < ns; ++i) {
      char name[64];
      std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, ns);
      write_safetensors((d / name).string(), shards[i]);
      produced.insert(name);
      for (const TensorToWrite& t : shards[i]) wmap[t.name] = name;
    }
    json idx = {{"metadata", {{"total_size", total}}}, {"weight_map", std::move(wmap)}};
    write_file_atomic((d / kIndexName).string(), idx.dump(2) + "\n");
    produced.insert(kIndexName);
  }
  // Remove files of an earlier checkpoint in this directory that would confuse the loader.
  for (const auto& e : fs::directory_iterator(d, ec)) {
    std::string fn = e.path().filename().string();
    if (is_checkpoint_file(fn) && !produced.count(fn)) {
      std::error_code rm;
      fs::remove(e.path(), rm);
      if (rm) TREX_LOG_WARN("cannot remove stale '", e.path().string(), "': ", rm.message());
    }
  }
}

}  // namespace trex::io
