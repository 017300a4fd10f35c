#include "core/overlap.h"

#include <cstdint>
#include <numeric>
#include <string>

#include "qkv/error.h"

namespace qkv::core {
namespace {

struct Span {
  std::uintptr_t lo = 0, hi = 0;  // [lo, hi) bytes
  bool empty = true;
};

Span span_of(const TensorView& v) {
  Span s;
  if (v.data == nullptr || v.numel() == 0) return s;
  const auto element = static_cast<std::intptr_t>(dtype_size(v.dtype));
  std::intptr_t low = 0, high = 0;
  for (std::size_t axis = 0; axis < v.shape.size(); ++axis) {
    const std::intptr_t reach = static_cast<std::intptr_t>(v.shape[axis] - 1) *
                                static_cast<std::intptr_t>(v.strides[axis]) * element;
    (reach < 0 ? low : high) += reach;
  }
  const auto base = reinterpret_cast<std::uintptr_t>(v.data);
  s.lo = base + static_cast<std::uintptr_t>(low);  // low <= 0: wraps to base - |low|
  s.hi = base + static_cast<std::uintptr_t>(high + element);
  s.empty = false;
  return s;
}

// The row pitch in bytes of a view whose rows (the last dim) are contiguous and whose every
// other stride (of a dim of size > 1) is a multiple of one pitch, and the bytes of one row;
// pitch 0 when the view is not so laid out (or has a single row).
struct Rows {
  std::uintptr_t pitch = 0, width = 0;
};

Rows rows_of(const TensorView& v) {
  Rows r;
  if (v.shape.empty()) return r;
  const auto element = static_cast<std::uintptr_t>(dtype_size(v.dtype));
  if (v.shape.back() > 1 && v.strides.back() != 1) return r;
  std::uintptr_t pitch = 0;
  for (std::size_t axis = 0; axis + 1 < v.shape.size(); ++axis) {
    if (v.shape[axis] <= 1) continue;
    const auto stride =
        static_cast<std::uintptr_t>(v.strides[axis] < 0 ? -v.strides[axis] : v.strides[axis]);
    pitch = std::gcd(pitch, stride * element);
  }
  r.width = static_cast<std::uintptr_t>(v.shape.back()) * element;
  if (pitch < r.width) return Rows{};  // rows that overlap themselves, or a single row
  r.pitch = pitch;
  return r;
}

}  // namespace

bool may_overlap(const TensorView& a, const TensorView& b) noexcept {
  const Span sa = span_of(a), sb = span_of(b);
  if (sa.empty || sb.empty || sa.hi <= sb.lo || sb.hi <= sa.lo) return false;
  // Column blocks of one wider matrix: both views' rows start at the same phase of one pitch,
  // so each view's bytes lie, modulo the pitch, in one arc [start, start + width).
  const Rows ra = rows_of(a), rb = rows_of(b);
  if (ra.pitch == 0 || ra.pitch != rb.pitch) return true;
  const std::uintptr_t p = ra.pitch;
  const std::uintptr_t a0 = reinterpret_cast<std::uintptr_t>(a.data) % p;
  const std::uintptr_t b0 = reinterpret_cast<std::uintptr_t>(b.data) % p;
  // Arcs on a circle of length p: b starts inside a's arc, or a inside b's.
  const std::uintptr_t b_from_a = (b0 + p - a0) % p, a_from_b = (a0 + p - b0) % p;
  return b_from_a < ra.width || a_from_b < rb.width;
}

void require_no_overlap(const std::vector<const TensorView*>& inputs,
                        const std::vector<const TensorView*>& outputs) {
  for (std::size_t o = 0; o < outputs.size(); ++o) {
    for (const TensorView* input : inputs) {
      if (may_overlap(*outputs[o], *input)) {
        throw Error(outputs[o]->name, "output memory overlaps the input " + input->name +
                                          " (an output must not share memory with an input)");
      }
    }
    for (std::size_t p = o + 1; p < outputs.size(); ++p) {
      if (may_overlap(*outputs[o], *outputs[p])) {
        throw Error(outputs[o]->name, "output memory overlaps the output " + outputs[p]->name);
      }
    }
  }
}

}  // namespace qkv::core
