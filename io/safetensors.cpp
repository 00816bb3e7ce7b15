// Safetensors reader: memory-mapped files and checkpoint directories (single file or shards +
// index). Header validation is io/safetensors_header.cpp, the writer io/safetensors_write.cpp.
// See io/safetensors.h.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "core/parallel.h"
#include "io/safetensors_header.h"

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

namespace trex::io {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace safetensors_detail;

namespace {
std::string errno_str() { return std::strerror(errno); }
}  // namespace

float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);  // inf / NaN (payload kept)
  } else if (exp != 0) {
    u = sign | ((exp + 112u) << 23) | (man << 13);  // normal: rebias 15 -> 127
  } else if (man == 0) {
    u = sign;  // +-0
  } else {
    // Subnormal man * 2^-24: normalise the mantissa into an f32 normal.
    int shift = std::countl_zero(static_cast<uint16_t>(man)) - 5;  // leading bit to bit 10
    man = (man << shift) & 0x3ffu;
    u = sign | (static_cast<uint32_t>(113 - shift) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ---------------------------------------------------------------------------------------------
// SafetensorsFile

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept { *this = std::move(o); }

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    release();
    path_ = std::move(o.path_);
    map_ = o.map_;
    own_ = std::move(o.own_);  // moving a vector keeps its buffer, so map_ stays valid
    size_ = o.size_;
    data_start_ = o.data_start_;
    tensors_ = std::move(o.tensors_);
    index_ = std::move(o.index_);
    metadata_ = std::move(o.metadata_);
    o.map_ = nullptr;
    o.own_.clear();
    o.size_ = 0;
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() { release(); }

void SafetensorsFile::release() {
  if (map_ && own_.empty()) ::munmap(const_cast<uint8_t*>(map_), size_);
  map_ = nullptr;
  own_.clear();
  own_.shrink_to_fit();
  size_ = 0;
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TREX_USER_CHECK(fd >= 0, "check the path", "cannot open safetensors file '", path,
                  "': ", errno_str());
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    TREX_USER_FAIL("pass a regular .safetensors file", "safetensors file '", path,
                   "' is not a regular file");
  }
  uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    TREX_USER_FAIL(kCorrupt, "safetensors file '", path, "' is ", size,
                   " bytes, shorter than the 8-byte header length");
  }
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  ::close(fd);
  TREX_USER_CHECK(p != MAP_FAILED, "check free address space / file permissions",
                  "cannot mmap safetensors file '", path, "': ", std::strerror(err));
  f.map_ = static_cast<const uint8_t*>(p);
  f.size_ = size;
  f.parse_header();  // f's destructor unmaps if this throws
  return f;
}

SafetensorsFile SafetensorsFile::from_bytes(const void* bytes, size_t size, const std::string& name) {
  SafetensorsFile f;
  f.path_ = name;
  TREX_USER_CHECK(size >= 8, kCorrupt, "safetensors file '", name, "' is ", size,
                  " bytes, shorter than the 8-byte header length");
  const uint8_t* b = static_cast<const uint8_t*>(bytes);
  f.own_.assign(b, b + size);
  f.map_ = f.own_.data();
  f.size_ = size;
  f.parse_header();
  return f;
}


const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

void SafetensorsFile::read_f32(const std::string& name, float* out, int64_t n) const {
  const TensorInfo* t = find(name);
  TREX_USER_CHECK(t, "check the tensor name against the checkpoint (model config mismatch?)",
                  "safetensors file '", path_, "': no tensor '", name, "'");
  TREX_USER_CHECK(n == t->shape.numel(), "the model config does not match the checkpoint",
                  "safetensors file '", path_, "': tensor '", name, "' has shape ",
                  t->shape.str(), " (", t->shape.numel(), " elements) but ", n, " were requested");
  const uint8_t* src = static_cast<const uint8_t*>(data(*t));
  constexpr int64_t grain = 1 << 18;
  switch (t->dtype) {
    case DType::F32:
      parallel_for(n, grain, [&](int64_t b, int64_t e) {
        std::memcpy(out + b, src + 4 * b, static_cast<size_t>(e - b) * 4);
      });
      break;
    case DType::BF16:
      parallel_for(n, grain, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          uint16_t h;
          std::memcpy(&h, src + 2 * i, 2);
          out[i] = bf16_to_f32(bf16{h});
        }
      });
      break;
    case DType::F16:
      parallel_for(n, grain, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          uint16_t h;
          std::memcpy(&h, src + 2 * i, 2);
          out[i] = f16_to_f32(h);
        }
      });
      break;
    case DType::F64:
      parallel_for(n, grain, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          double x;
          std::memcpy(&x, src + 8 * i, 8);
          out[i] = static_cast<float>(x);
        }
      });
      break;
    default:
      TREX_USER_FAIL("read_f32 converts F32/BF16/F16/F64 only; FP8 weights need their scale "
                     "tensor (dequantize them), integer tensors are not weights",
                     "safetensors file '", path_, "': tensor '", name, "' has dtype ",
                     dtype_name(t->dtype));
  }
}

// ---------------------------------------------------------------------------------------------
// SafetensorsDir

SafetensorsDir SafetensorsDir::open(const std::string& dir) {
  std::error_code ec;
  const fs::path d(dir);
  TREX_USER_CHECK(fs::is_directory(d, ec), "pass the checkpoint directory",
                  "checkpoint directory '", dir, "' does not exist or is not a directory");
  const fs::path single = d / kSingleName, index = d / kIndexName;
  const bool has_single = fs::exists(single, ec), has_index = fs::exists(index, ec);
  TREX_USER_CHECK(!(has_single && has_index), "remove the stale one of the two files",
                  "checkpoint directory '", dir, "' has both ", kSingleName, " and ", kIndexName,
                  "; it is ambiguous which holds the weights");
  TREX_USER_CHECK(has_single || has_index,
                  "point at a Hugging Face checkpoint directory (safetensors weights)",
                  "checkpoint directory '", dir, "' has neither ", kSingleName, " nor ",
                  kIndexName);
  SafetensorsDir r;
  r.dir_ = dir;
  if (has_single) {
    r.files_.push_back(SafetensorsFile::open(single.string()));
    for (const TensorInfo& t : r.files_[0].tensors()) r.where_.emplace(t.name, 0);
    return r;
  }
  r.sharded_ = true;
  const std::string ip = index.string(), where = "safetensors index '" + ip + "'";
  uint64_t isize = fs::file_size(index, ec);
  TREX_USER_CHECK(!ec, kIndexHint, where, ": cannot stat: ", ec.message());
  TREX_USER_CHECK(isize <= kMaxIndexBytes, kIndexHint, where, ": ", isize,
                  " bytes is larger than the 256 MB limit for an index");
  std::string text(isize, '\0');
  {
    std::ifstream in(ip, std::ios::binary);
    TREX_USER_CHECK(in && in.read(text.data(), static_cast<std::streamsize>(isize)),
                    "check permissions", where, ": cannot read");
  }
  json j = parse_strict(text.data(), text.data() + text.size(), where, kIndexHint, "key");
  TREX_USER_CHECK(j.is_object(), kIndexHint, where, ": not a JSON object");
  auto wm = j.find("weight_map");
  TREX_USER_CHECK(wm != j.end() && wm->is_object(), kIndexHint, where,
                  ": missing \"weight_map\" object");
  TREX_USER_CHECK(!wm->empty(), kIndexHint, where, ": \"weight_map\" is empty");
  auto md = j.find("metadata");
  TREX_USER_CHECK(md == j.end() || md->is_object() || md->is_null(), kIndexHint, where,
                  ": \"metadata\" is not an object");

  std::map<std::string, uint32_t> shard_of;  // shard file name -> index into files_
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    const std::string& name = it.key();
    TREX_USER_CHECK(it.value().is_string(), kIndexHint, where, ": weight_map entry '", name,
                    "' is not a string");
    const std::string& shard = it.value().get_ref<const std::string&>();
    TREX_USER_CHECK(!shard.empty() && shard != "." && shard != ".." &&
                        shard.find('/') == std::string::npos &&
                        shard.find('\\') == std::string::npos &&
                        shard.find('\0') == std::string::npos,
                    kIndexHint, where, ": weight_map entry '", name, "' names shard '", shard,
                    "', which is not a plain file name in the checkpoint directory");
    auto s = shard_of.find(shard);
    if (s == shard_of.end()) {
      const fs::path sp = d / shard;
      TREX_USER_CHECK(fs::is_regular_file(sp, ec),
                      "download the missing shard or fix the index", where,
                      ": weight_map entry '", name, "' points at missing shard '", sp.string(),
                      "'");
      r.files_.push_back(SafetensorsFile::open(sp.string()));
      s = shard_of.emplace(shard, static_cast<uint32_t>(r.files_.size() - 1)).first;
    }
    const SafetensorsFile& f = r.files_[s->second];
    TREX_USER_CHECK(f.find(name), kIndexHint, where, ": tensor '", name,
                    "' is listed for shard '", f.path(), "' but that file does not contain it");
    r.where_.emplace(name, s->second);
  }
  for (const SafetensorsFile& f : r.files_) {
    size_t extra = 0;
    for (const TensorInfo& t : f.tensors()) {
      auto w = r.where_.find(t.name);
      if (w == r.where_.end() || &r.files_[w->second] != &f) ++extra;
    }
    if (extra)
      TREX_LOG_WARN("safetensors shard '", f.path(), "' holds ", extra,
                    " tensor(s) not mapped to it by ", ip, "; ignoring them");
  }
  return r;
}

const TensorInfo* SafetensorsDir::find(const std::string& name,
                                       const SafetensorsFile** file) const {
  auto it = where_.find(name);
  if (it == where_.end()) return nullptr;
  const SafetensorsFile& f = files_[it->second];
  if (file) *file = &f;
  return f.find(stored_name(name));
}

std::string SafetensorsDir::stored_name(const std::string& name) const {
  auto it = stored_.find(name);
  return it == stored_.end() ? name : it->second;
}

void SafetensorsDir::rename(const std::function<std::string(const std::string&)>& to) {
  std::map<std::string, uint32_t> where;
  std::map<std::string, std::string> stored;
  for (const auto& [name, file] : where_) {
    const std::string from = stored_name(name), n = to(from);
    auto [it, fresh] = where.emplace(n, file);
    TREX_USER_CHECK(fresh, "a checkpoint holds each tensor once", "checkpoint '", dir_, "': tensors '",
                    stored[n].empty() ? n : stored[n], "' and '", from, "' are both '", n, "' under this model's names");
    if (n != from) stored[n] = from;
  }
  where_ = std::move(where);
  stored_ = std::move(stored);
}

std::vector<std::string> SafetensorsDir::names() const {
  std::vector<std::string> v;
  v.reserve(where_.size());
  for (const auto& kv : where_) v.push_back(kv.first);
  return v;
}

void SafetensorsDir::read_f32(const std::string& name, float* out, int64_t n) const {
  auto it = where_.find(name);
  TREX_USER_CHECK(it != where_.end(),
                  "check the tensor name against the checkpoint (model config mismatch?)",
                  "checkpoint '", dir_, "': no tensor '", name, "'");
  files_[it->second].read_f32(stored_name(name), out, n);
}

}  // namespace trex::io
