// Durable writes (temp file, fsync, rename, fsync of the directory). See io/atomic_file.h.
#include "io/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace trex::io {

namespace fs = std::filesystem;

namespace {

std::string errno_str(int e) { return std::strerror(e); }

std::string parent_of(const std::string& path) {
  const std::string d = fs::path(path).parent_path().string();
  return d.empty() ? "." : d;
}

// Closes the fd and removes the temporary file unless committed.
struct TmpGuard {
  std::string tmp;
  int fd = -1;
  bool committed = false;
  ~TmpGuard() {
    if (fd >= 0) ::close(fd);
    if (!committed) ::unlink(tmp.c_str());
  }
};

}  // namespace

void AtomicWriter::write(const void* p, uint64_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, 1u << 30));
    const ssize_t w = ::write(fd_, c, chunk);
    if (w < 0 && errno == EINTR) continue;
    const int e = errno;
    TREX_USER_CHECK(w > 0, "check free disk space and permissions", "cannot write '", tmp_, "': ",
                    w == 0 ? std::string("no progress") : errno_str(e));
    c += w;
    n -= static_cast<uint64_t>(w);
    bytes_ += static_cast<uint64_t>(w);
  }
}

void write_file_atomic(const std::string& path, const std::function<void(AtomicWriter&)>& fill) {
  TmpGuard g{path + ".tmp"};
  g.fd = ::open(g.tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int e = errno;
  TREX_USER_CHECK(g.fd >= 0, "check that the directory exists and is writable", "cannot create '", g.tmp,
                  "' (writing '", path, "'): ", errno_str(e));
  AtomicWriter w(g.tmp, g.fd);
  fill(w);
  TREX_USER_CHECK(::fsync(g.fd) == 0, "check free disk space and permissions", "cannot fsync '", g.tmp, "': ",
                  errno_str(errno));
  const int rc = ::close(g.fd);
  g.fd = -1;
  TREX_USER_CHECK(rc == 0, "check free disk space and permissions", "cannot close '", g.tmp, "': ",
                  errno_str(errno));
  TREX_USER_CHECK(::rename(g.tmp.c_str(), path.c_str()) == 0, "check permissions of the destination directory",
                  "cannot rename '", g.tmp, "' to '", path, "': ", errno_str(errno));
  g.committed = true;
  fsync_dir(parent_of(path));
}

void write_file_atomic(const std::string& path, const void* data, uint64_t n) {
  write_file_atomic(path, [&](AtomicWriter& w) { w.write(data, n); });
}

void fsync_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TREX_USER_CHECK(fd >= 0, "check permissions", "cannot open '", path, "' to fsync it: ", errno_str(errno));
  const int rc = ::fsync(fd);
  const int e = errno;
  ::close(fd);
  TREX_USER_CHECK(rc == 0, "check free disk space and the health of that disk", "cannot fsync '", path, "': ",
                  errno_str(e));
}

void fsync_dir(const std::string& dir) {
  const std::string d = dir.empty() ? "." : dir;
  const int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  TREX_USER_CHECK(fd >= 0, "check permissions", "cannot open directory '", d, "' to fsync it: ", errno_str(errno));
  const int rc = ::fsync(fd);
  const int e = errno;
  ::close(fd);
  // Some file systems (e.g. some network mounts) do not support fsync on a directory.
  TREX_USER_CHECK(rc == 0 || e == EINVAL || e == ENOTSUP, "check free disk space and the health of that disk",
                  "cannot fsync directory '", d, "': ", errno_str(e));
}

void fsync_tree(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file()) fsync_file(e.path().string());
  TREX_USER_CHECK(!ec, "check permissions", "cannot list directory '", dir, "': ", ec.message());
  fsync_dir(dir);
}

void replace_dir_atomic(const std::string& tmp, const std::string& final_path) {
  std::error_code ec;
  const std::string old = final_path + ".old-" + std::to_string(::getpid());
  const bool had = fs::exists(final_path, ec);
  if (had) {
    fs::remove_all(old, ec);
    fs::rename(final_path, old, ec);
    TREX_USER_CHECK(!ec, "check permissions of the parent directory", "cannot rename '", final_path, "' to '", old,
                    "': ", ec.message());
  }
  fs::rename(tmp, final_path, ec);
  TREX_USER_CHECK(!ec, "check permissions of the parent directory", "cannot rename '", tmp, "' to '", final_path,
                  "': ", ec.message());
  fsync_dir(parent_of(final_path));
  if (had) fs::remove_all(old, ec);
}

void check_output_outside_input(const std::string& input, const std::string& output, const std::string& what_in,
                                const std::string& what_out) {
  std::error_code ec;
  // weakly_canonical resolves the existing prefix through realpath and normalizes the rest
  // ("a/b/", "a/./b", "a/x/../b" all become "a/b").
  fs::path in = fs::weakly_canonical(fs::absolute(input, ec), ec);
  if (ec) in = fs::absolute(input).lexically_normal();
  fs::path out = fs::weakly_canonical(fs::absolute(output, ec), ec);
  if (ec) out = fs::absolute(output).lexically_normal();
  // Drop a trailing empty element ("dir/" normalizes to "dir/").
  if (!in.has_filename()) in = in.parent_path();
  if (!out.has_filename()) out = out.parent_path();
  TREX_USER_CHECK(out != in, "write to another directory", what_out, " '", output, "' is the same directory as ",
                  what_in, " '", input, "' (both resolve to '", in.string(), "'); writing would overwrite the input");
  auto i = in.begin(), o = out.begin();
  for (; i != in.end() && o != out.end() && *i == *o; ++i, ++o) {
  }
  TREX_USER_CHECK(i != in.end(), "write to a directory outside the input", what_out, " '", output, "' (",
                  out.string(), ") lies inside ", what_in, " '", input, "' (", in.string(),
                  "); writing would change the input");
}

}  // namespace trex::io
