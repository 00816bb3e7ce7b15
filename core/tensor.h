// Non-owning tensor views: data pointer, dtype, shape and strides (in elements, row-major by
// default). Storage lives in an Arena or a file mapping; a view never frees.
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include "core/dtype.h"
#include "core/error.h"

namespace trex {

constexpr int kMaxDims = 4;

struct Shape {
  int ndim = 0;
  std::array<int64_t, kMaxDims> d{};
  Shape() = default;
  Shape(std::initializer_list<int64_t> il) {
    TREX_CHECK(il.size() <= kMaxDims, "too many dims");
    for (int64_t v : il) d[ndim++] = v;
  }
  int64_t operator[](int i) const { return d[i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= d[i];
    return n;
  }
  bool operator==(const Shape& o) const {
    if (ndim != o.ndim) return false;
    for (int i = 0; i < ndim; ++i)
      if (d[i] != o.d[i]) return false;
    return true;
  }
  std::string str() const {
    std::string s = "[";
    for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(d[i]);
    return s + "]";
  }
};

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::F32;
  Shape shape;
  std::array<int64_t, kMaxDims> stride{};

  TensorView() = default;
  TensorView(void* p, DType t, Shape s) : data(p), dtype(t), shape(s) {
    int64_t st = 1;
    for (int i = s.ndim - 1; i >= 0; --i) {
      stride[i] = st;
      st *= s.d[i];
    }
  }
  int64_t numel() const { return shape.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  bool contiguous() const {
    int64_t st = 1;
    for (int i = shape.ndim - 1; i >= 0; --i) {
      if (shape.d[i] != 1 && stride[i] != st) return false;
      st *= shape.d[i];
    }
    return true;
  }
  float* f32() const {
    TREX_CHECK(dtype == DType::F32, "expected f32 view, got ", dtype_name(dtype));
    return static_cast<float*>(data);
  }
  bf16* b16() const {
    TREX_CHECK(dtype == DType::BF16, "expected bf16 view, got ", dtype_name(dtype));
    return static_cast<bf16*>(data);
  }
};

}  // namespace trex
