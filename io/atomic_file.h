// Durable writes: the one way trex puts a checkpoint, a config or a cache file on disk.
//
// write_file_atomic() writes `path + ".tmp"` (in the same directory), fsyncs it, renames it over
// `path` and fsyncs the directory: after a crash at any moment `path` is either the old complete
// file or the new complete one, and once the call returns the new one survives a power loss.
// replace_dir_atomic() does the same for a directory filled elsewhere (a checkpoint written into
// a temporary directory). Every failure is a trex::UserError naming the path and the operation
// ("cannot create", "cannot write", "cannot fsync", "cannot rename ... to ...") with the
// system's reason; the temporary file is removed.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>

namespace trex::io {

// An open temporary file being written; handed to the callback of write_file_atomic.
class AtomicWriter {
 public:
  // Appends n bytes (retries short writes and EINTR).
  void write(const void* p, uint64_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  uint64_t bytes() const { return bytes_; }
  const std::string& tmp_path() const { return tmp_; }

 private:
  friend void write_file_atomic(const std::string&, const std::function<void(AtomicWriter&)>&);
  AtomicWriter(std::string tmp, int fd) : tmp_(std::move(tmp)), fd_(fd) {}
  std::string tmp_;
  int fd_ = -1;
  uint64_t bytes_ = 0;
};

// Writes `path` atomically and durably from what `fill` writes (see the top of this file). The
// directory must exist.
void write_file_atomic(const std::string& path, const std::function<void(AtomicWriter&)>& fill);
// The same from bytes in memory.
void write_file_atomic(const std::string& path, const void* data, uint64_t n);
inline void write_file_atomic(const std::string& path, std::string_view text) {
  write_file_atomic(path, text.data(), text.size());
}

// fsync of a file (its data) or of a directory (its entries: creations, renames, removals).
void fsync_file(const std::string& path);
void fsync_dir(const std::string& dir);  // "" = "."

// Moves the complete directory `tmp` to `final_path` in one rename (both in the same parent) and
// fsyncs the parent. An existing `final_path` is first renamed to `final_path + ".old-<pid>"` and
// removed after: a crash in between leaves one of the two complete directories in place.
// Every file under tmp (and tmp itself) must already be fsynced (fsync_tree).
void replace_dir_atomic(const std::string& tmp, const std::string& final_path);
// fsyncs every regular file directly under dir, then dir.
void fsync_tree(const std::string& dir);

// Refuses (UserError) an output path that resolves (realpath, symlinks, "..", trailing slashes)
// to the input path or to a path inside it: a writer must not overwrite what it is reading.
// what_in / what_out name the options in the message (e.g. "--model", "--out").
void check_output_outside_input(const std::string& input, const std::string& output, const std::string& what_in,
                                const std::string& what_out);

}  // namespace trex::io
