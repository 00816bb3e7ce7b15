// File checksums and the checkpoint manifest that records them.
//
// The checksum is CRC-32 (the zlib / gzip / PNG polynomial; Python's zlib.crc32 gives the same
// value), computed in 64 MiB chunks on the worker threads and joined with crc32_combine, so a
// file is checked at several GB/s. A manifest (manifest.json in a checkpoint directory) lists
// every file of the checkpoint with its size and checksum:
//   {"format": "trex-manifest-1", "algorithm": "crc32",
//    "files": {"model.safetensors": {"bytes": 123, "crc32": "89abcdef"}, ...}}
// verify_manifest() re-reads each listed file and names the first one that is missing, has
// another size or another checksum.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace trex::io {

// CRC-32 of n bytes continuing from `crc` (0 to start). Threaded above a few MiB.
uint32_t crc32(const void* data, uint64_t n, uint32_t crc = 0);
// CRC-32 of a whole file (memory-mapped); UserError naming the file if it cannot be read.
uint32_t file_crc32(const std::string& path);

constexpr const char* kManifestName = "manifest.json";

// Writes dir/manifest.json (atomically) with the size and checksum of each named file in dir.
void write_manifest(const std::string& dir, const std::vector<std::string>& files);
// Whether dir has a manifest.
bool has_manifest(const std::string& dir);
// Checks the files of dir's manifest for which `which` (if given) returns true. Returns the
// problem ("<dir>/model.safetensors: checksum 1234abcd, manifest says 89abcdef (the file is
// damaged)"), or nullopt when every checked file matches. A directory without a manifest passes
// (checkpoints written before manifests existed). An unreadable or malformed manifest is a problem.
std::optional<std::string> check_manifest(const std::string& dir,
                                          const std::function<bool(const std::string&)>& which = {});
// check_manifest, throwing a UserError with `hint` on a problem.
void verify_manifest(const std::string& dir, const std::string& hint,
                     const std::function<bool(const std::string&)>& which = {});

}  // namespace trex::io
