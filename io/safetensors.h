// Hugging Face safetensors: read (memory-mapped, strictly validated: io/safetensors.cpp and
// io/safetensors_header.cpp) and write (atomic: io/safetensors_write.cpp),
// single file and sharded checkpoint directories.
//
// File layout: [u64 little-endian header length N][N bytes of JSON header][data section].
// The header maps tensor name -> {"dtype", "shape", "data_offsets": [begin, end]} (offsets
// into the data section), plus an optional "__metadata__" object of string -> string.
//
// Files are untrusted input. open() checks everything the Rust reference implementation
// checks (header length bounds, JSON object, field types, known dtype, shape-product
// overflow, nbytes == numel * dtype size, offsets inside the data section, tensors covering
// the data section contiguously with no overlap, no gap and no trailing bytes) plus
// duplicate JSON keys, and throws trex::UserError naming the file and the tensor.
// No size read from a file is ever allocated without being bounded by the file size.
//
// Writer: byte-compatible with the Rust/Python `safetensors` writer (compact JSON,
// "__metadata__" first, tensors ordered by descending dtype alignment then by name, data
// contiguous in that order, header padded with spaces to a multiple of 8 bytes). With that
// order every tensor's data is aligned to its dtype size in the file. Python's output is
// byte-identical to ours when the metadata has at most one key (Rust emits metadata keys
// in HashMap order; we emit them sorted).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>
#include "core/dtype.h"
#include "core/tensor.h"

namespace trex::io {

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  uint64_t offset = 0;  // byte offset into the data section
  uint64_t nbytes = 0;
};

// IEEE half -> float, exact for every input (subnormals, inf, NaN payload kept). Portable.
float f16_to_f32(uint16_t h);
// Parses a safetensors dtype tag ("F32", "BF16", "F8_E4M3", ...); false if unknown.
bool parse_dtype(const std::string& s, DType* out);

// One .safetensors file, memory-mapped read-only for its lifetime (or an in-memory copy, see
// from_bytes). Move-only.
class SafetensorsFile {
 public:
  // Maps and validates the file; throws UserError naming the file (and tensor) on any problem.
  static SafetensorsFile open(const std::string& path);
  // Validates an in-memory file image with exactly the checks of open() and keeps a copy of
  // it (heap, `size` bytes, so a sanitizer sees any read past the end); `name` stands for the
  // path in messages and path(). For tests and fuzzing (fuzz/fuzz_safetensors.cpp).
  static SafetensorsFile from_bytes(const void* bytes, size_t size, const std::string& name);

  SafetensorsFile(SafetensorsFile&& o) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& o) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // ordered by offset
  const TensorInfo* find(const std::string& name) const;              // nullptr if absent
  // Pointer into the mapping (aligned to the dtype size only if the writer ordered tensors
  // by alignment, as ours and the Rust writer do; use memcpy-style access otherwise).
  const void* data(const TensorInfo& t) const { return map_ + data_start_ + t.offset; }
  // Converts F32/BF16/F16/F64 to f32 into out[n]; n must equal numel. Throws UserError if the
  // tensor is absent, n mismatches or the dtype is not a float type.
  // out: [numel] (threaded for large tensors)
  void read_f32(const std::string& name, float* out, int64_t n) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }
  uint64_t file_size() const { return size_; }
  uint64_t data_start() const { return data_start_; }  // 8 + header length

 private:
  SafetensorsFile() = default;
  void parse_header();
  void release();

  std::string path_;
  const uint8_t* map_ = nullptr;  // the mapping, or own_.data() for from_bytes
  std::vector<uint8_t> own_;      // non-empty only for from_bytes (then nothing is mapped)
  uint64_t size_ = 0;
  uint64_t data_start_ = 0;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// A checkpoint directory: either model.safetensors, or model.safetensors.index.json
// ({"metadata": {...}, "weight_map": {tensor: shard file}}) plus the shards it names.
// Having both is rejected as ambiguous. Every weight_map entry must exist in its shard;
// tensors present in a shard but not listed in weight_map are ignored with a warning.
class SafetensorsDir {
 public:
  static SafetensorsDir open(const std::string& dir);

  // nullptr if absent; *file (if file != nullptr) receives the file holding the tensor.
  const TensorInfo* find(const std::string& name, const SafetensorsFile** file = nullptr) const;
  std::vector<std::string> names() const;  // sorted bytewise
  size_t size() const { return where_.size(); }
  // out: [numel]; see SafetensorsFile::read_f32.
  void read_f32(const std::string& name, float* out, int64_t n) const;
  const std::vector<SafetensorsFile>& files() const { return files_; }
  const std::string& dir() const { return dir_; }
  bool sharded() const { return sharded_; }
  // Looks every tensor up under to(stored name) from now on (a checkpoint written under another
  // naming, read under the one a loader asks for). Two stored names that map to the same name
  // are a UserError naming both. stored_name() gives a tensor's name in its file.
  void rename(const std::function<std::string(const std::string&)>& to);
  std::string stored_name(const std::string& name) const;

 private:
  std::string dir_;
  bool sharded_ = false;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, uint32_t> where_;        // tensor name -> index into files_
  std::map<std::string, std::string> stored_;    // after rename(): tensor name -> name in its file
};

struct TensorToWrite {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  const void* data = nullptr;  // numel * dtype_size bytes, contiguous row-major
};

// Writes atomically (io/atomic_file.h: path + ".tmp", fsync, rename, fsync of the directory). metadata defaults
// to {"format": "pt"}. Throws UserError on bad input (duplicate / empty / reserved names,
// negative dims, null data) or on I/O failure.
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Writes a checkpoint directory (created if missing). Tensors are packed into shards of at
// most max_shard_bytes in the given order, as huggingface_hub does (a tensor bigger than the
// limit gets a shard of its own): model-00001-of-0000N.safetensors + model.safetensors.index.json
// ({"metadata": {"total_size": bytes}, "weight_map": {...}}, keys sorted, indent 2). If all
// fits one shard, writes model.safetensors only. Afterwards removes stale model.safetensors /
// index / model-NNNNN-of-NNNNN.safetensors files that this write did not produce.
void write_safetensors_dir(const std::string& dir, const std::vector<TensorToWrite>& tensors,
                           uint64_t max_shard_bytes = 5ull << 30);

}  // namespace trex::io
