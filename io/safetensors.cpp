// Safetensors reader (mmap + strict validation) and atomic writer. See io/safetensors.h.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_set>

#include "core/error.h"
#include "core/log.h"
#include "core/parallel.h"

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

namespace trex::io {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // same limit as the Rust implementation
constexpr uint64_t kMaxIndexBytes = 256ull << 20;
constexpr int kMaxJsonDepth = 8;  // a valid header nests 3 deep
constexpr const char* kCorrupt =
    "the file is corrupt, truncated or not a safetensors file; re-download or re-convert it";
constexpr const char* kIndexHint =
    "the checkpoint index is corrupt or does not match its shards; re-download the checkpoint";
constexpr const char* kSingleName = "model.safetensors";
constexpr const char* kIndexName = "model.safetensors.index.json";

std::string errno_str() { return std::strerror(errno); }

// SAX pass that rejects duplicate object keys (at any level) and nesting deeper than
// kMaxJsonDepth. (nlohmann's parser callbacks would do this in one pass but are quadratic in
// the number of keys of an object: 8 s for a 20k-tensor header.)
struct StrictSax {
  using string_t = json::string_t;
  const std::string& where;
  const char* hint;
  const char* top_key;  // what a top-level key is ("tensor name", "key"), for messages
  std::vector<std::unordered_set<std::string>> keys;  // one set per open object
  std::vector<std::string> last;                      // the latest key of each open object
  int depth = 0;

  void enter() {
    TREX_USER_CHECK(++depth <= kMaxJsonDepth, hint, where, ": JSON nested deeper than ",
                    kMaxJsonDepth, " levels");
  }
  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(json::number_integer_t) { return true; }
  bool number_unsigned(json::number_unsigned_t) { return true; }
  bool number_float(json::number_float_t, const string_t&) { return true; }
  bool string(string_t&) { return true; }
  bool binary(json::binary_t&) { return true; }
  bool start_object(std::size_t) {
    enter();
    keys.emplace_back();
    last.emplace_back();
    return true;
  }
  bool key(string_t& k) {
    if (!keys.back().insert(k).second) {
      if (keys.size() == 1) TREX_USER_FAIL(hint, where, ": duplicate ", top_key, " '", k, "'");
      TREX_USER_FAIL(hint, where, ": duplicate JSON key '", k, "' in '", last[keys.size() - 2], "'");
    }
    last.back() = k;
    return true;
  }
  bool end_object() {
    keys.pop_back();
    last.pop_back();
    --depth;
    return true;
  }
  bool start_array(std::size_t) {
    enter();
    return true;
  }
  bool end_array() {
    --depth;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& ex) {
    TREX_USER_FAIL(hint, where, ": not valid JSON (", ex.what(), ")");
  }
};

// Parses JSON from [b, e) strictly (see StrictSax). `where` prefixes every message.
// top_key: what a top-level key is, for the duplicate-key message.
json parse_strict(const char* b, const char* e, const std::string& where, const char* hint,
                  const char* top_key) {
  StrictSax sax{where, hint, top_key, {}, {}, 0};
  json::sax_parse(b, e, &sax);
  try {
    return json::parse(b, e);
  } catch (const json::exception& ex) {  // unreachable after a clean SAX pass
    TREX_USER_FAIL(hint, where, ": not valid JSON (", ex.what(), ")");
  }
}

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

// Owns a file descriptor opened for writing; removes the temp file unless committed.
struct TmpFile {
  std::string tmp, final_path;
  int fd = -1;
  bool committed = false;
  explicit TmpFile(const std::string& path) : tmp(path + ".tmp"), final_path(path) {
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    TREX_USER_CHECK(fd >= 0, "check that the directory exists and is writable",
                    "cannot create '", tmp, "': ", errno_str());
  }
  void write(const void* p, uint64_t n) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, 1u << 30));
      ssize_t w = ::write(fd, c, chunk);
      if (w < 0 && errno == EINTR) continue;
      TREX_USER_CHECK(w > 0, "check free disk space and permissions", "cannot write '", tmp,
                      "': ", errno_str());
      c += w;
      n -= static_cast<uint64_t>(w);
    }
  }
  void commit() {
    TREX_USER_CHECK(::fsync(fd) == 0, "check free disk space and permissions", "cannot fsync '",
                    tmp, "': ", errno_str());
    int rc = ::close(fd);
    fd = -1;
    TREX_USER_CHECK(rc == 0, "check free disk space and permissions", "cannot close '", tmp,
                    "': ", errno_str());
    TREX_USER_CHECK(::rename(tmp.c_str(), final_path.c_str()) == 0,
                    "check permissions of the destination directory", "cannot rename '", tmp,
                    "' to '", final_path, "': ", errno_str());
    committed = true;
    // Make the rename durable.
    std::string dir = fs::path(final_path).parent_path().string();
    int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
  }
  ~TmpFile() {
    if (fd >= 0) ::close(fd);
    if (!committed) ::unlink(tmp.c_str());
  }
};

void write_file_atomic(const std::string& path, const std::string& content) {
  TmpFile f(path);
  f.write(content.data(), content.size());
  f.commit();
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

bool parse_dtype(const std::string& s, DType* out) {
  static constexpr DType all[] = {DType::F32, DType::BF16, DType::F16, DType::F64,
                                  DType::I64, DType::I32, DType::I16, DType::I8,
                                  DType::U8, DType::BOOL, DType::F8_E4M3, DType::F8_E5M2,
                                  DType::F8_E8M0, DType::F4};
  for (DType t : all)
    if (s == dtype_name(t)) {
      *out = t;
      return true;
    }
  return false;
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

void SafetensorsFile::parse_header() {
  const std::string where = "safetensors file '" + path_ + "'";
  uint64_t n;
  std::memcpy(&n, map_, 8);
  TREX_USER_CHECK(n <= kMaxHeaderBytes, kCorrupt, where, ": header length ", n,
                  " exceeds the 100 MB limit");
  TREX_USER_CHECK(n <= size_ - 8, kCorrupt, where, ": header length ", n,
                  " runs past the end of the ", size_, "-byte file");
  TREX_USER_CHECK(n > 0 && map_[8] == '{', kCorrupt, where,
                  ": header does not start with '{' (not a safetensors file?)");
  data_start_ = 8 + n;
  const uint64_t data_size = size_ - data_start_;
  const char* hb = reinterpret_cast<const char*>(map_ + 8);
  json j = parse_strict(hb, hb + n, where, kCorrupt, "tensor name");
  TREX_USER_CHECK(j.is_object(), kCorrupt, where, ": header is not a JSON object");

  tensors_.reserve(j.size());
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (v.is_null()) continue;  // Rust reads `null` as "no metadata"
      TREX_USER_CHECK(v.is_object(), kCorrupt, where, ": __metadata__ is not a JSON object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        TREX_USER_CHECK(m.value().is_string(), kCorrupt, where, ": __metadata__ value for '",
                        m.key(), "' is not a string");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string tw = where + ": tensor '" + name + "'";
    TREX_USER_CHECK(v.is_object(), kCorrupt, tw, ": entry is not a JSON object");
    TensorInfo t;
    t.name = name;

    auto d = v.find("dtype");
    TREX_USER_CHECK(d != v.end(), kCorrupt, tw, ": missing \"dtype\"");
    TREX_USER_CHECK(d->is_string(), kCorrupt, tw, ": \"dtype\" is not a string");
    TREX_USER_CHECK(parse_dtype(d->get_ref<const std::string&>(), &t.dtype),
                    "supported dtypes: F32 BF16 F16 F64 I64 I32 I16 I8 U8 BOOL F8_E4M3 F8_E5M2 F8_E8M0 F4; "
                    "convert the checkpoint with a tool that writes one of them",
                    tw, ": unknown dtype \"", d->get_ref<const std::string&>(), "\"");

    auto s = v.find("shape");
    TREX_USER_CHECK(s != v.end(), kCorrupt, tw, ": missing \"shape\"");
    TREX_USER_CHECK(s->is_array(), kCorrupt, tw, ": \"shape\" is not an array");
    TREX_USER_CHECK(s->size() <= static_cast<size_t>(kMaxDims),
                    "trex tensors have at most 4 dims; reshape the tensor when converting",
                    tw, ": shape has ", s->size(), " dims");
    uint64_t numel = 1;
    bool overflow = false;
    for (const json& dim : *s) {
      TREX_USER_CHECK(dim.is_number_integer(), kCorrupt, tw,
                      ": shape entries must be integers, got ", dim.dump());
      TREX_USER_CHECK(dim.is_number_unsigned(), kCorrupt, tw, ": negative dimension ",
                      dim.dump(), " in shape");
      uint64_t x = dim.get<uint64_t>();
      TREX_USER_CHECK(x <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), kCorrupt,
                      tw, ": dimension ", x, " is too large");
      t.shape.d[t.shape.ndim++] = static_cast<int64_t>(x);
      overflow |= __builtin_mul_overflow(numel, x, &numel);
    }
    uint64_t nbytes = 0;
    overflow = overflow || numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    if (t.dtype == DType::F4) {
      TREX_USER_CHECK(numel % 2 == 0, kCorrupt, tw, ": F4 packs two elements per byte; shape ", t.shape.str(),
                      " has an odd element count");
      nbytes = numel / 2;
    } else {
      overflow = overflow || __builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(t.dtype)), &nbytes);
    }
    TREX_USER_CHECK(!overflow, kCorrupt, tw, ": shape ", t.shape.str(),
                    " overflows 64-bit element / byte counts");

    auto o = v.find("data_offsets");
    TREX_USER_CHECK(o != v.end(), kCorrupt, tw, ": missing \"data_offsets\"");
    TREX_USER_CHECK(o->is_array() && o->size() == 2 && (*o)[0].is_number_unsigned() &&
                        (*o)[1].is_number_unsigned(),
                    kCorrupt, tw, ": \"data_offsets\" must be [begin, end] non-negative integers, got ",
                    o->dump());
    uint64_t b = (*o)[0].get<uint64_t>(), e = (*o)[1].get<uint64_t>();
    TREX_USER_CHECK(b <= e, kCorrupt, tw, ": data_offsets begin ", b, " > end ", e);
    TREX_USER_CHECK(e - b == nbytes, kCorrupt, tw, ": data_offsets span ", e - b,
                    " bytes but shape ", t.shape.str(), " x ", dtype_name(t.dtype), " needs ",
                    nbytes);
    TREX_USER_CHECK(e <= data_size, kCorrupt, tw, ": data_offsets end ", e,
                    " is beyond the data section (", data_size, " bytes)");
    t.offset = b;
    t.nbytes = nbytes;
    tensors_.push_back(std::move(t));
  }

  // Tensors must tile the data section exactly: no overlap, no gap, no trailing bytes.
  std::sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    if (a.offset != b.offset) return a.offset < b.offset;
    if (a.nbytes != b.nbytes) return a.nbytes < b.nbytes;
    return a.name < b.name;
  });
  uint64_t expect = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TensorInfo& t = tensors_[i];
    TREX_USER_CHECK(t.offset >= expect, kCorrupt, where, ": tensor '", t.name,
                    "': data_offsets [", t.offset, ", ", t.offset + t.nbytes,
                    ") overlaps tensor '", tensors_[i - 1].name, "' ending at ", expect);
    TREX_USER_CHECK(t.offset == expect, kCorrupt, where, ": tensor '", t.name,
                    "': data_offsets start at ", t.offset, " leaving a ", t.offset - expect,
                    "-byte hole after offset ", expect, " (data must be contiguous)");
    expect = t.offset + t.nbytes;
  }
  TREX_USER_CHECK(expect == data_size, kCorrupt, where, ": tensors cover ", expect,
                  " bytes but the data section has ", data_size, " (trailing bytes)");
  index_.reserve(tensors_.size());
  for (size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
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
  return f.find(name);
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
  files_[it->second].read_f32(name, out, n);
}

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

  TmpFile f(path);
  uint64_t n = h.size();
  f.write(&n, 8);
  f.write(h.data(), h.size());
  for (size_t i : idx) f.write(tensors[i].data, bytes[i]);
  f.commit();
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
