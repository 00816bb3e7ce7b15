// Safetensors header validation: the strict JSON pass (duplicate keys, depth), dtype tags and
// SafetensorsFile::parse_header (every field, offsets tiling the data section). See
// io/safetensors.h for the rules.
#include "io/safetensors_header.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <unordered_set>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"

namespace trex::io {

using json = nlohmann::json;

namespace safetensors_detail {
namespace {

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

}  // namespace

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

}  // namespace safetensors_detail

using namespace safetensors_detail;

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

}  // namespace trex::io
