// Fuzz target: model.safetensors.index.json of a sharded checkpoint, opened by
// trex::io::SafetensorsDir::open. The input is the index; the directory also holds the three
// shards of tests/data/safetensors/sharded (so valid indexes reach the shard checks), a
// single-file checkpoint, a subdirectory and a symlink to /dev/null (names an index may point
// at that are not shards).
// On success every listed tensor must resolve to a shard that contains it.
#include <filesystem>

#include "fuzz/fuzz_util.h"
#include "io/safetensors.h"

using namespace trex;
using namespace trex::io;
namespace fs = std::filesystem;

namespace {

const fs::path& checkpoint_dir() {
  static const fs::path dir = [] {
    fs::path d = fuzz::scratch_dir() / "ckpt";
    fs::create_directories(d);
    const fs::path src = fuzz::repo_file("tests/data/safetensors/sharded");
    for (const char* s : {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                          "model-00003-of-00003.safetensors"})
      fs::copy_file(src / s, d / s, fs::copy_options::overwrite_existing);
    fs::copy_file(fuzz::repo_file("tests/data/safetensors/mixed.safetensors"), d / "mixed.safetensors",
                  fs::copy_options::overwrite_existing);
    fs::create_directories(d / "subdir");
    std::error_code ec;
    fs::create_symlink("/dev/null", d / "devnull.safetensors", ec);
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const fs::path& d = checkpoint_dir();
  {
    std::ofstream f(d / "model.safetensors.index.json", std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  fuzz::accepts([&] {
    SafetensorsDir c = SafetensorsDir::open(d.string());
    FUZZ_ASSERT(c.sharded());
    FUZZ_ASSERT(c.size() > 0);
    for (const std::string& name : c.names()) {
      const SafetensorsFile* file = nullptr;
      const TensorInfo* t = c.find(name, &file);
      FUZZ_ASSERT(t && file && t->name == name);
      FUZZ_ASSERT(file->find(name) == t);
    }
    FUZZ_ASSERT(!c.find("no such tensor"));
  });
  return 0;
}
