// CRC-32 of files and the checkpoint manifest. See io/checksum.h.
#include "io/checksum.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/parallel.h"
#include "io/atomic_file.h"

namespace trex::io {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kFormat = "trex-manifest-1";
constexpr uint64_t kChunk = 16ull << 20;  // bytes per thread task; crc32_combine joins them

uint32_t crc_serial(const uint8_t* p, uint64_t n, uint32_t crc) {
  uLong c = crc;
  while (n > 0) {  // zlib takes a uInt length
    const uInt k = (uInt)std::min<uint64_t>(n, 1u << 30);
    c = ::crc32(c, p, k);
    p += k, n -= k;
  }
  return (uint32_t)c;
}

std::string hex(uint32_t v) {
  char b[9];
  std::snprintf(b, sizeof b, "%08x", v);
  return b;
}

}  // namespace

uint32_t crc32(const void* data, uint64_t n, uint32_t crc) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  if (n <= 2 * kChunk) return crc_serial(p, n, crc);
  const int64_t chunks = (int64_t)((n + kChunk - 1) / kChunk);
  std::vector<uint32_t> part((size_t)chunks);
  parallel_for(chunks, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const uint64_t off = (uint64_t)i * kChunk;
      part[(size_t)i] = crc_serial(p + off, std::min(kChunk, n - off), 0);
    }
  });
  uLong c = crc;
  for (int64_t i = 0; i < chunks; ++i) {
    const uint64_t len = std::min(kChunk, n - (uint64_t)i * kChunk);
    c = ::crc32_combine(c, part[(size_t)i], (z_off_t)len);
  }
  return (uint32_t)c;
}

uint32_t file_crc32(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TREX_USER_CHECK(fd >= 0, "check that the file exists and is readable", "cannot open '", path,
                  "' to checksum it: ", std::strerror(errno));
  struct stat sb {};
  if (::fstat(fd, &sb) != 0) {
    const int e = errno;
    ::close(fd);
    TREX_USER_FAIL("check permissions", "cannot stat '", path, "': ", std::strerror(e));
  }
  const uint64_t n = (uint64_t)sb.st_size;
  if (n == 0) {
    ::close(fd);
    return 0;
  }
  void* m = ::mmap(nullptr, n, PROT_READ, MAP_PRIVATE, fd, 0);
  const int e = errno;
  ::close(fd);
  TREX_USER_CHECK(m != MAP_FAILED, "check the file", "cannot map '", path, "' to checksum it: ", std::strerror(e));
  ::madvise(m, n, MADV_SEQUENTIAL);
  const uint32_t c = crc32(m, n, 0);
  ::munmap(m, n);
  return c;
}

void write_manifest(const std::string& dir, const std::vector<std::string>& files) {
  json f = json::object();
  for (const std::string& name : files) {
    const std::string p = (fs::path(dir) / name).string();
    std::error_code ec;
    const uint64_t bytes = fs::file_size(p, ec);
    TREX_USER_CHECK(!ec, "check the checkpoint directory", "cannot stat '", p, "' for the manifest: ", ec.message());
    f[name] = {{"bytes", bytes}, {"crc32", hex(file_crc32(p))}};
  }
  const json j = {{"format", kFormat}, {"algorithm", "crc32"}, {"files", std::move(f)}};
  write_file_atomic((fs::path(dir) / kManifestName).string(), j.dump(2) + "\n");
}

bool has_manifest(const std::string& dir) {
  std::error_code ec;
  return fs::exists(fs::path(dir) / kManifestName, ec);
}

std::optional<std::string> check_manifest(const std::string& dir, const std::function<bool(const std::string&)>& which) {
  const std::string mp = (fs::path(dir) / kManifestName).string();
  if (!has_manifest(dir)) return std::nullopt;
  json j;
  try {
    std::ifstream in(mp);
    if (!in) return mp + ": cannot be read";
    j = json::parse(in);
  } catch (const json::exception& e) {
    return mp + ": not valid JSON (" + e.what() + ")";
  }
  if (!j.is_object() || j.value("format", "") != kFormat || !j.contains("files") || !j["files"].is_object())
    return mp + ": not a trex manifest (expected \"format\": \"" + kFormat + "\" and a \"files\" object)";
  for (auto& [name, e] : j["files"].items()) {
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
      return mp + ": file name '" + name + "' is not a plain file name";
    if (which && !which(name)) continue;
    const std::string p = (fs::path(dir) / name).string();
    if (!e.is_object() || !e.contains("bytes") || !e["bytes"].is_number_unsigned() || !e.contains("crc32") ||
        !e["crc32"].is_string())
      return mp + ": entry '" + name + "' needs \"bytes\" and \"crc32\"";
    std::error_code ec;
    if (!fs::is_regular_file(p, ec)) return p + ": missing (listed in " + kManifestName + ")";
    const uint64_t bytes = fs::file_size(p, ec), want = e["bytes"].get<uint64_t>();
    if (ec) return p + ": cannot stat (" + ec.message() + ")";
    if (bytes != want)
      return p + ": " + std::to_string(bytes) + " bytes, the manifest says " + std::to_string(want) +
             " (the file is truncated or damaged)";
    const std::string got = hex(file_crc32(p)), crc = e["crc32"].get<std::string>();
    if (got != crc) return p + ": checksum crc32 " + got + ", the manifest says " + crc + " (the file is damaged)";
  }
  return std::nullopt;
}

void verify_manifest(const std::string& dir, const std::string& hint,
                     const std::function<bool(const std::string&)>& which) {
  if (auto problem = check_manifest(dir, which)) TREX_USER_FAIL(hint, *problem);
}

}  // namespace trex::io
