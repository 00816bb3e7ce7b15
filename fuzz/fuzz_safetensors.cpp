// Fuzz target: a .safetensors file (8-byte header length, JSON header, data section) parsed
// by trex::io::SafetensorsFile::from_bytes (the checks of SafetensorsFile::open on a heap copy,
// so ASan sees any read past the end). On success, the parsed tensors must tile the data
// section, every tensor's bytes are touched and the float ones converted with read_f32.
#include <cstring>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "io/safetensors.h"

using namespace trex;
using namespace trex::io;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::accepts([&] {
    SafetensorsFile f = SafetensorsFile::from_bytes(data, size, "fuzz.safetensors");
    FUZZ_ASSERT(f.file_size() == size);
    FUZZ_ASSERT(f.data_start() >= 8 && f.data_start() <= size);
    const uint64_t data_bytes = size - f.data_start();
    uint64_t expect = 0;
    unsigned sum = 0;
    for (const TensorInfo& t : f.tensors()) {
      FUZZ_ASSERT(t.offset == expect, "tensor ", t.name, " at ", t.offset, ", expected ", expect);
      FUZZ_ASSERT(t.nbytes <= data_bytes - t.offset);
      FUZZ_ASSERT(f.find(t.name) == &t);
      FUZZ_ASSERT(t.shape.ndim >= 0 && t.shape.ndim <= kMaxDims);
      expect += t.nbytes;
      const uint8_t* p = static_cast<const uint8_t*>(f.data(t));
      if (t.nbytes) sum += p[0] + p[t.nbytes - 1];
      const int64_t n = t.shape.numel();
      FUZZ_ASSERT(n >= 0);
      if (t.dtype == DType::F32 || t.dtype == DType::BF16 || t.dtype == DType::F16 ||
          t.dtype == DType::F64) {
        FUZZ_ASSERT(static_cast<uint64_t>(n) * dtype_size(t.dtype) == t.nbytes);
        std::vector<float> out(static_cast<size_t>(n));
        f.read_f32(t.name, out.data(), n);
        // A wrong count is rejected, not read.
        FUZZ_ASSERT(!fuzz::accepts([&] { f.read_f32(t.name, out.data(), n + 1); }));
      }
    }
    FUZZ_ASSERT(expect == data_bytes, "tensors cover ", expect, " of ", data_bytes);
    for (const auto& [k, v] : f.metadata()) sum += static_cast<unsigned>(k.size() + v.size());
    // Moving keeps the tensors readable (the in-memory copy moves with the object).
    SafetensorsFile g = std::move(f);
    for (const TensorInfo& t : g.tensors())
      if (t.nbytes) sum += static_cast<const uint8_t*>(g.data(t))[t.nbytes - 1];
    FUZZ_ASSERT(!g.find("__metadata__"));
    volatile unsigned sink = sum;
    (void)sink;
  });
  return 0;
}
