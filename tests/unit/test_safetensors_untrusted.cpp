// Safetensors files as untrusted input (issue 9): each kind of malicious or broken file is
// rejected with a trex::UserError whose message names the file, the tensor and the field at
// fault, both through SafetensorsFile::open (a file in a temp dir) and SafetensorsFile::from_bytes
// (the in-memory entry the fuzzer uses). Also: sizes read from the file are checked before
// anything is allocated or mapped from them, and good files read the same through both entries.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"
#include "tests/unit/test_util.h"

using namespace trex;
using namespace trex::io;

namespace {

std::string le64(uint64_t n) { return std::string(reinterpret_cast<const char*>(&n), 8); }

// [u64 header length][header padded to 8 with spaces][data_bytes zero bytes]
std::string file_bytes(std::string header, size_t data_bytes) {
  header.append((8 - header.size() % 8) % 8, ' ');
  return le64(header.size()) + header + std::string(data_bytes, '\0');
}

void write_file(const std::string& p, const std::string& b) {
  std::ofstream(p, std::ios::binary).write(b.data(), static_cast<std::streamsize>(b.size()));
}

// test::user_error, and every rejection must carry a hint; returns the message alone.
template <class F>
std::string user_error(F&& f) {
  const std::string m = test::user_error(f, /*with_hint=*/true);
  const size_t h = m.find(" | hint: ");
  EXPECT_TRUE(h != std::string::npos && h + 9 < m.size()) << "no hint: " << m;
  return m.substr(0, h);
}

// Opens `bytes` both ways and expects a UserError naming the file and containing every needle.
void expect_rejected(const std::string& bytes, std::initializer_list<std::string> needles) {
  test::TmpDir d("trex_st_untrusted");
  const std::string p = d.file("bad.safetensors");
  write_file(p, bytes);
  const std::string a = user_error([&] { SafetensorsFile::open(p); });
  const std::string b = user_error([&] { SafetensorsFile::from_bytes(bytes.data(), bytes.size(), "mem.safetensors"); });
  EXPECT_NE(a.find("'" + p + "'"), std::string::npos) << a;
  EXPECT_NE(b.find("'mem.safetensors'"), std::string::npos) << b;
  for (const std::string& n : needles) {
    EXPECT_NE(a.find(n), std::string::npos) << "'" << n << "' not in: " << a;
    EXPECT_NE(b.find(n), std::string::npos) << "'" << n << "' not in: " << b;
  }
}
void expect_rejected_header(const std::string& header, size_t data_bytes,
                            std::initializer_list<std::string> needles) {
  expect_rejected(file_bytes(header, data_bytes), needles);
}

// "name": {"dtype": dtype, "shape": shape, "data_offsets": offsets}
std::string entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  const std::string& offsets) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":" + offsets + "}";
}

}  // namespace

TEST(SafetensorsUntrusted, OffsetsPastEndOfFile) {
  // End past the data section (and past the end of the file).
  expect_rejected_header("{" + entry("model.w", "F32", "[4]", "[0,16]") + "}", 8,
                         {"tensor 'model.w'", "data_offsets", "beyond the data section"});
  // Huge offsets whose span is right: begin and end both far past the file.
  expect_rejected_header("{" + entry("model.w", "U8", "[8]", "[18446744073709551600,18446744073709551608]") + "}", 8,
                         {"tensor 'model.w'", "data_offsets end 18446744073709551608", "beyond the data section"});
}

TEST(SafetensorsUntrusted, OverlappingTensors) {
  expect_rejected_header("{" + entry("a", "F32", "[2]", "[0,8]") + "," + entry("b", "F32", "[2]", "[4,12]") + "}", 12,
                         {"tensor 'b'", "data_offsets [4, 12)", "overlaps tensor 'a'"});
  // Two tensors on exactly the same bytes (aliasing).
  expect_rejected_header("{" + entry("a", "F32", "[2]", "[0,8]") + "," + entry("b", "I32", "[2]", "[0,8]") + "}", 8,
                         {"overlaps tensor"});
  // A zero-size tensor inside another one.
  expect_rejected_header("{" + entry("a", "F32", "[2]", "[0,8]") + "," + entry("z", "F32", "[0]", "[4,4]") + "}", 8,
                         {"tensor 'z'", "overlaps tensor 'a'"});
}

TEST(SafetensorsUntrusted, BeginAfterEnd) {
  expect_rejected_header("{" + entry("w", "F32", "[2]", "[8,0]") + "}", 8,
                         {"tensor 'w'", "data_offsets begin 8 > end 0"});
}

TEST(SafetensorsUntrusted, ShapeProductOverflowsInt64) {
  // 2^32 x 2^32 = 2^64 wraps to 0 in uint64: must not pass as an empty tensor.
  expect_rejected_header("{" + entry("w", "F32", "[4294967296,4294967296]", "[0,0]") + "}", 0,
                         {"tensor 'w'", "shape [4294967296, 4294967296]", "overflows"});
  // 2^62 elements fit int64 but 2^62 x 4 bytes does not fit uint64... wraps to 0.
  expect_rejected_header("{" + entry("w", "F32", "[4611686018427387904]", "[0,0]") + "}", 0,
                         {"tensor 'w'", "overflows"});
  // Product > int64 max without wrapping uint64.
  expect_rejected_header("{" + entry("w", "U8", "[3,3074457345618258603]", "[0,0]") + "}", 0,
                         {"tensor 'w'", "overflows"});
  // Four dims whose product wraps to a small number (2^16 ^ 4 = 2^64 -> 0, times 1).
  expect_rejected_header("{" + entry("w", "U8", "[65536,65536,65536,65536]", "[0,0]") + "}", 0,
                         {"tensor 'w'", "overflows"});
}

TEST(SafetensorsUntrusted, DtypeSizeTimesElementsNotByteRange) {
  expect_rejected_header("{" + entry("w", "BF16", "[3,5]", "[0,32]") + "}", 32,
                         {"tensor 'w'", "data_offsets span 32 bytes", "shape [3, 5] x BF16 needs 30"});
  expect_rejected_header("{" + entry("w", "F4", "[8]", "[0,8]") + "}", 8, {"tensor 'w'", "needs 4"});
  expect_rejected_header("{" + entry("w", "F4", "[3]", "[0,2]") + "}", 2, {"tensor 'w'", "F4", "odd element count"});
}

TEST(SafetensorsUntrusted, AbsurdHeaderLength) {
  // Larger than the file.
  expect_rejected(le64(1000) + "{}      ", {"header length 1000", "past the end of the 16-byte file"});
  // Larger than the 100 MB bound (checked before anything is read or allocated).
  expect_rejected(le64(100'000'001) + "{}      ", {"header length 100000001", "100 MB"});
  expect_rejected(le64(std::numeric_limits<uint64_t>::max()) + "{}      ", {"header length 18446744073709551615"});
  // 2^64 - 8: 8 + n wraps to 0 if added before checking.
  expect_rejected(le64(std::numeric_limits<uint64_t>::max() - 7) + "{}      ", {"header length"});
  // Zero, and shorter than the length field itself.
  expect_rejected(le64(0), {"'{'"});
  expect_rejected(std::string("\x02\0\0", 3), {"shorter than the 8-byte header length"});
}

TEST(SafetensorsUntrusted, HeaderNotAnObject) {
  expect_rejected_header("[{\"w\":1}]", 0, {"'{'"});
  expect_rejected_header("\"str\"", 0, {"'{'"});
  expect_rejected_header("{\"w\":1} {\"x\":2}", 0, {"not valid JSON"});
  expect_rejected_header("{\"w\":", 0, {"not valid JSON"});
  // A NUL inside the header and invalid UTF-8 in a name.
  expect_rejected_header(std::string("{\"w\0\":1}", 9), 0, {"not valid JSON"});
  expect_rejected_header("{\"w\xc0\x80\":1}", 0, {"not valid JSON"});
  // A number too large for a double (nlohmann throws out_of_range, not parse_error).
  expect_rejected_header("{\"w\":1e999}", 0, {"not valid JSON", "1e999"});
  // Nesting bomb.
  expect_rejected_header("{\"w\":" + std::string(100000, '[') + "}", 0, {"nested deeper"});
  // A tensor entry that is not an object.
  expect_rejected_header("{\"w\":[1,2]}", 0, {"tensor 'w'", "not a JSON object"});
}

TEST(SafetensorsUntrusted, DuplicateNames) {
  expect_rejected_header("{" + entry("w", "F32", "[1]", "[0,4]") + "," + entry("w", "F32", "[1]", "[4,8]") + "}", 8,
                         {"duplicate tensor name 'w'"});
  // A field given twice inside one tensor: names the tensor and the field.
  expect_rejected_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"shape\":[2],\"data_offsets\":[0,4]}}", 4,
                         {"duplicate JSON key 'shape' in 'w'"});
  expect_rejected_header("{\"__metadata__\":{\"a\":\"1\",\"a\":\"2\"}}", 0,
                         {"duplicate JSON key 'a' in '__metadata__'"});
}

TEST(SafetensorsUntrusted, UnknownOrBadDtype) {
  expect_rejected_header("{" + entry("w", "F6_E3M2", "[2]", "[0,2]") + "}", 2, {"tensor 'w'", "unknown dtype \"F6_E3M2\""});
  expect_rejected_header("{" + entry("w", "f32", "[2]", "[0,8]") + "}", 8, {"tensor 'w'", "unknown dtype \"f32\""});
  expect_rejected_header("{\"w\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, {"tensor 'w'", "\"dtype\" is not a string"});
  expect_rejected_header("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, {"tensor 'w'", "missing \"dtype\""});
}

TEST(SafetensorsUntrusted, NegativeOrNonIntegerDims) {
  expect_rejected_header("{" + entry("w", "F32", "[2,-1]", "[0,8]") + "}", 8, {"tensor 'w'", "negative dimension -1"});
  expect_rejected_header("{" + entry("w", "F32", "[2.5]", "[0,8]") + "}", 8, {"tensor 'w'", "shape entries must be integers, got 2.5"});
  expect_rejected_header("{" + entry("w", "F32", "[2.0]", "[0,8]") + "}", 8, {"tensor 'w'", "must be integers"});
  expect_rejected_header("{" + entry("w", "F32", "[\"2\"]", "[0,8]") + "}", 8, {"tensor 'w'", "must be integers"});
  expect_rejected_header("{" + entry("w", "F32", "[null]", "[0,8]") + "}", 8, {"tensor 'w'", "must be integers"});
  expect_rejected_header("{" + entry("w", "F32", "[1e3]", "[0,8]") + "}", 8, {"tensor 'w'", "must be integers"});
  // 2^63 does not fit int64 (trex shapes are int64).
  expect_rejected_header("{" + entry("w", "U8", "[9223372036854775808]", "[0,0]") + "}", 0, {"tensor 'w'", "too large"});
  expect_rejected_header("{" + entry("w", "F32", "2", "[0,8]") + "}", 8, {"tensor 'w'", "\"shape\" is not an array"});
  expect_rejected_header("{" + entry("w", "F32", "[1,1,1,1,2]", "[0,8]") + "}", 8, {"tensor 'w'", "5 dims"});
}

TEST(SafetensorsUntrusted, BadDataOffsetsField) {
  for (const char* off : {"[0]", "[0,4,8]", "[-4,4]", "[0,4.0]", "\"0,4\"", "{\"begin\":0}", "null"})
    expect_rejected_header("{" + entry("w", "F32", "[1]", off) + "}", 4, {"tensor 'w'", "\"data_offsets\" must be [begin, end]"});
}

TEST(SafetensorsUntrusted, ManyTensorsInTinyFileAreBoundedByTheHeader) {
  // 50k zero-size tensors: the work is bounded by the header size, nothing sized from a count.
  std::string h = "{";
  for (int i = 0; i < 50000; ++i) h += (i ? "," : "") + entry("t" + std::to_string(i), "U8", "[0]", "[0,0]");
  h += "}";
  const std::string b = file_bytes(h, 0);
  SafetensorsFile f = SafetensorsFile::from_bytes(b.data(), b.size(), "many");
  EXPECT_EQ(f.tensors().size(), 50000u);
}

TEST(SafetensorsUntrusted, FromBytesMatchesOpenOnGoodFiles) {
  const auto dir = test::data_dir("safetensors", "mixed.safetensors");
  for (const char* name : {"mixed.safetensors", "all_dtypes.safetensors", "f16.safetensors", "metadata.safetensors"}) {
    const std::string p = (dir / name).string();
    std::ifstream in(p, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), {});
    SafetensorsFile a = SafetensorsFile::open(p);
    SafetensorsFile b = SafetensorsFile::from_bytes(bytes.data(), bytes.size(), p);
    SafetensorsFile c = std::move(b);  // the in-memory copy moves with the object
    ASSERT_EQ(a.tensors().size(), c.tensors().size()) << name;
    EXPECT_EQ(a.metadata(), c.metadata());
    EXPECT_EQ(a.data_start(), c.data_start());
    for (size_t i = 0; i < a.tensors().size(); ++i) {
      const TensorInfo &x = a.tensors()[i], &y = c.tensors()[i];
      EXPECT_EQ(x.name, y.name);
      EXPECT_EQ(x.dtype, y.dtype);
      EXPECT_EQ(x.offset, y.offset);
      ASSERT_EQ(x.nbytes, y.nbytes);
      if (x.nbytes > 0) EXPECT_EQ(std::memcmp(a.data(x), c.data(y), x.nbytes), 0) << x.name;
      if (x.dtype == DType::F32 || x.dtype == DType::BF16 || x.dtype == DType::F16 || x.dtype == DType::F64) {
        const int64_t n = x.shape.numel();
        std::vector<float> va(n), vc(n);
        a.read_f32(x.name, va.data(), n);
        c.read_f32(y.name, vc.data(), n);
        if (n > 0) EXPECT_EQ(std::memcmp(va.data(), vc.data(), n * sizeof(float)), 0) << x.name;  // empty: no data pointer
      }
    }
  }
}

TEST(SafetensorsUntrusted, IndexFileRejections) {
  test::TmpDir d("trex_st_untrusted_idx");
  const auto src = test::data_dir("safetensors", "mixed.safetensors") / "sharded";
  for (const char* s : {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                        "model-00003-of-00003.safetensors"})
    std::filesystem::copy_file(src / s, d.path / s);
  const std::string ip = d.file("model.safetensors.index.json");
  auto rejected = [&](const std::string& index, std::initializer_list<std::string> needles) {
    write_file(ip, index);
    const std::string m = user_error([&] { SafetensorsDir::open(d.str()); });
    EXPECT_NE(m.find(ip), std::string::npos) << m;
    for (const std::string& n : needles) EXPECT_NE(m.find(n), std::string::npos) << "'" << n << "' not in: " << m;
  };
  rejected("{\"weight_map\":{\"embed\":\"../model-00001-of-00003.safetensors\"}}", {"'embed'", "not a plain file name"});
  rejected("{\"weight_map\":{\"embed\":\"/etc/passwd\"}}", {"'embed'", "not a plain file name"});
  rejected("{\"weight_map\":{\"embed\":\"nope.safetensors\"}}", {"'embed'", "missing shard"});
  rejected("{\"weight_map\":{\"embed\":\"model-00002-of-00003.safetensors\"}}", {"'embed'", "does not contain it"});
  rejected("{\"weight_map\":{\"embed\":3}}", {"'embed'", "not a string"});
  rejected("{\"weight_map\":[]}", {"weight_map"});
  rejected("{\"weight_map\":{}}", {"\"weight_map\" is empty"});
  rejected("{\"metadata\":{\"total_size\":1e999},\"weight_map\":{\"embed\":\"x\"}}", {"not valid JSON"});
  rejected("{\"weight_map\":{\"embed\":\"model-00001-of-00003.safetensors\",\"embed\":\"model-00001-of-00003.safetensors\"}}",
           {"duplicate JSON key 'embed' in 'weight_map'"});
  rejected("[]", {"not a JSON object"});
}
