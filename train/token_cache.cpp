#include "train/token_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include "core/error.h"
#include "core/log.h"
#include "io/atomic_file.h"

namespace trex::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int kVersion = 2;  // 2: plain-text CPT files are one document per blank-line separated block

struct Fnv {
  uint64_t h = 1469598103934665603ull;
  void add(const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
  void add(const std::string& s) {
    const uint64_t n = s.size();
    add(&n, sizeof n);
    add(s.data(), s.size());
  }
  void add_i(int64_t v) { add(&v, sizeof v); }
};

void hash_file_bytes(Fnv& f, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TREX_USER_CHECK(in.good(), "check data.tokenizer", path, ": cannot be read");
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), buf.size());
    f.add(buf.data(), (size_t)in.gcount());
  }
}

json stats_to_json(const DataStats& s) {
  return {{"lines", s.lines},
          {"samples", s.samples},
          {"skipped_malformed", s.skipped_malformed},
          {"skipped_no_target", s.skipped_no_target},
          {"truncated", s.truncated},
          {"dropped_too_long", s.dropped_too_long},
          {"tokens", s.tokens},
          {"target_tokens", s.target_tokens},
          {"first_errors", s.first_errors}};
}

DataStats stats_from_json(const json& j) {
  DataStats s;
  s.lines = j.at("lines"), s.samples = j.at("samples"), s.skipped_malformed = j.at("skipped_malformed");
  s.skipped_no_target = j.at("skipped_no_target"), s.truncated = j.at("truncated");
  s.dropped_too_long = j.at("dropped_too_long"), s.tokens = j.at("tokens"), s.target_tokens = j.at("target_tokens");
  s.first_errors = j.at("first_errors").get<std::vector<std::string>>();
  return s;
}

void merge(DataStats& into, const DataStats& s) {
  into.lines += s.lines, into.samples += s.samples, into.skipped_malformed += s.skipped_malformed;
  into.skipped_no_target += s.skipped_no_target, into.truncated += s.truncated;
  into.dropped_too_long += s.dropped_too_long, into.tokens += s.tokens, into.target_tokens += s.target_tokens;
  for (const std::string& e : s.first_errors)
    if (into.first_errors.size() < 5) into.first_errors.push_back(e);
}

TokenDocs tokenize(const std::vector<std::string>& files, const DocsSpec& spec, DataStats& st) {
  std::vector<Sample> docs;
  for (const std::string& f : files) {
    std::vector<Sample> d = spec.mode == "sft" ? read_sft_file(f, spec.chat, spec.encode, spec.train_on_prompt, st)
                                               : read_cpt_file(f, spec.encode, spec.eos_id, st);
    for (auto& s : d) docs.push_back(std::move(s));
  }
  return TokenDocs::from_samples(std::move(docs));
}

void write_entry(const std::string& entry, const TokenDocs& docs, const json& meta) {
  const std::string tmp = entry + ".tmp." + std::to_string(::getpid());
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  TREX_USER_CHECK(!ec, "set data.cache_dir to a writable directory, or \"none\"", tmp,
                  ": cannot create the token cache entry: ", ec.message());
  std::vector<int32_t> ids;
  std::vector<uint8_t> loss;
  std::vector<int64_t> off = {0};
  ids.reserve(docs.tokens());
  loss.reserve(docs.tokens());
  for (int64_t i = 0; i < docs.size(); ++i) {
    DocSpan d = docs.doc(i);
    ids.insert(ids.end(), d.ids, d.ids + d.n);
    loss.insert(loss.end(), d.loss, d.loss + d.n);
    off.push_back((int64_t)ids.size());
  }
  try {
    io::write_file_atomic(tmp + "/tokens.bin", ids.data(), ids.size() * sizeof(int32_t));
    io::write_file_atomic(tmp + "/loss.bin", loss.data(), loss.size());
    io::write_file_atomic(tmp + "/index.bin", off.data(), off.size() * sizeof(int64_t));
    io::write_file_atomic(tmp + "/meta.json", meta.dump(2) + "\n");
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
  fs::rename(tmp, entry, ec);
  if (ec) {  // another process wrote the same entry first: theirs is as good as ours
    fs::remove_all(tmp, ec);
    return;
  }
  io::fsync_dir(fs::path(entry).parent_path().string());
}

}  // namespace

MappedFile::MappedFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  TREX_USER_CHECK(fd >= 0, "delete the cache entry; trex rebuilds it", path, ": cannot open (", std::strerror(errno),
                  ")");
  struct stat sb {};
  if (::fstat(fd, &sb) != 0) {
    ::close(fd);
    TREX_USER_FAIL("delete the cache entry; trex rebuilds it", path, ": cannot stat");
  }
  n_ = (size_t)sb.st_size;
  if (n_ > 0) {
    p_ = ::mmap(nullptr, n_, PROT_READ, MAP_SHARED, fd, 0);
    if (p_ == MAP_FAILED) {
      p_ = nullptr;
      ::close(fd);
      TREX_USER_FAIL("delete the cache entry; trex rebuilds it", path, ": mmap failed (", std::strerror(errno), ")");
    }
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (p_) ::munmap(p_, n_);
}

std::vector<DocSpan> TokenDocs::spans() const {
  std::vector<DocSpan> v(size());
  for (int64_t i = 0; i < size(); ++i) v[i] = doc(i);
  return v;
}

TokenDocs TokenDocs::from_samples(std::vector<Sample> docs) {
  TokenDocs t;
  for (const Sample& s : docs) {
    TREX_CHECK(s.ids.size() == s.loss.size(), "sample ids and loss flags differ in length");
    t.own_ids_.insert(t.own_ids_.end(), s.ids.begin(), s.ids.end());
    t.own_loss_.insert(t.own_loss_.end(), s.loss.begin(), s.loss.end());
    t.offsets_.push_back((int64_t)t.own_ids_.size());
  }
  t.ids_ = t.own_ids_.data();
  t.loss_ = t.own_loss_.data();
  return t;
}

TokenDocs TokenDocs::open(const std::string& entry) {
  const char* hint = "delete the cache entry; trex rebuilds it";
  TokenDocs t;
  std::ifstream mf(entry + "/meta.json");
  TREX_USER_CHECK(mf.good(), hint, entry, "/meta.json: missing");
  json meta;
  try {
    meta = json::parse(mf);
  } catch (const json::exception& e) {
    TREX_USER_FAIL(hint, entry, "/meta.json: ", e.what());
  }
  TREX_USER_CHECK(meta.value("version", 0) == kVersion, hint, entry, "/meta.json: version ", meta.value("version", 0),
                  ", this trex writes ", kVersion);
  const int64_t ndocs = meta.at("docs"), ntok = meta.at("tokens");
  t.map_ids_ = std::make_shared<MappedFile>(entry + "/tokens.bin");
  t.map_loss_ = std::make_shared<MappedFile>(entry + "/loss.bin");
  MappedFile idx(entry + "/index.bin");
  TREX_USER_CHECK(ndocs >= 0 && ntok >= 0 && t.map_ids_->size() == (size_t)ntok * sizeof(int32_t) &&
                      t.map_loss_->size() == (size_t)ntok && idx.size() == (size_t)(ndocs + 1) * sizeof(int64_t),
                  hint, entry, ": file sizes do not match meta.json (", ndocs, " documents, ", ntok, " tokens)");
  const int64_t* off = static_cast<const int64_t*>(idx.data());
  t.offsets_.assign(off, off + ndocs + 1);
  TREX_USER_CHECK(t.offsets_[0] == 0 && t.offsets_.back() == ntok, hint, entry, "/index.bin: bad offsets");
  for (int64_t i = 0; i < ndocs; ++i)
    TREX_USER_CHECK(t.offsets_[i] <= t.offsets_[i + 1], hint, entry, "/index.bin: offsets decrease at ", i);
  t.ids_ = static_cast<const int32_t*>(t.map_ids_->data());
  t.loss_ = static_cast<const uint8_t*>(t.map_loss_->data());
  return t;
}

std::string cache_key(const std::vector<std::string>& files, const DocsSpec& spec) {
  Fnv f;
  f.add_i(kVersion);
  f.add(spec.mode);
  f.add(spec.chat.name + "|" + spec.chat.bos + "|" + spec.chat.eos + "|" + spec.chat.user + "|" + spec.chat.assistant);
  f.add_i(spec.train_on_prompt);
  f.add_i(spec.eos_id);
  hash_file_bytes(f, spec.tokenizer_file);
  for (const std::string& p : files) {
    std::error_code ec;
    fs::path abs = fs::absolute(p, ec);
    f.add(abs.lexically_normal().string());
    struct stat sb {};
    TREX_USER_CHECK(::stat(p.c_str(), &sb) == 0, "check the [data] file list", p, ": cannot be read (",
                    std::strerror(errno), ")");
    f.add_i((int64_t)sb.st_size);
    f.add_i((int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec);
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)f.h);
  return hex;
}

TokenDocs load_docs(const std::vector<std::string>& files, const DocsSpec& spec, const std::string& cache_dir,
                    DataStats& stats, bool* hit) {
  if (hit) *hit = false;
  // Without a tokenizer file there is nothing that identifies the encoder: no cache.
  if (cache_dir.empty() || spec.tokenizer_file.empty()) return tokenize(files, spec, stats);
  const std::string entry = cache_dir + "/" + cache_key(files, spec);
  if (fs::exists(entry + "/meta.json")) {
    try {
      TokenDocs t = TokenDocs::open(entry);
      std::ifstream mf(entry + "/meta.json");
      merge(stats, stats_from_json(json::parse(mf).at("stats")));
      if (hit) *hit = true;
      return t;
    } catch (const std::exception& e) {
      TREX_LOG_WARN("token cache entry ", entry, " is unusable (", e.what(), "); rebuilding it");
      std::error_code ec;
      fs::remove_all(entry, ec);
    }
  }
  DataStats st;
  TokenDocs t = tokenize(files, spec, st);
  merge(stats, st);
  json meta = {{"version", kVersion},  {"docs", t.size()},           {"tokens", t.tokens()},
               {"files", files},       {"mode", spec.mode},          {"chat_template", spec.chat.name},
               {"eos_id", spec.eos_id}, {"train_on_prompt", spec.train_on_prompt},
               {"tokenizer", spec.tokenizer_file}, {"stats", stats_to_json(st)}};
  std::error_code ec;
  fs::create_directories(cache_dir, ec);
  TREX_USER_CHECK(!ec, "set data.cache_dir to a writable directory (or \"\" to turn the cache off)", cache_dir,
                  ": cannot create (", ec.message(), ")");
  write_entry(entry, t, meta);
  return t;
}

}  // namespace trex::train
