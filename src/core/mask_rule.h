// The allowed(i, j) rule of the contract, in one place. Options combine by AND: a key is
// allowed only where causal, window and the explicit mask all allow it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/half.h"
#include "core/params.h"

namespace qkv::core {

// Causal and window alone (no explicit mask). diag = i + (nk - nq).
inline bool structurally_allowed(const Masking& m, std::int64_t diag, std::int64_t j) noexcept {
  if (m.causal && j > diag) return false;
  if (m.window_left >= 0 && j < diag - m.window_left) return false;
  if (m.window_right >= 0 && j > diag + m.window_right) return false;
  return true;
}

// Element access for the real operand types (kF32, kF64, kBF16, kF16).
inline double load_real(const void* data, DType dtype, std::int64_t at) noexcept {
  switch (dtype) {
    case DType::kF64: return static_cast<const double*>(data)[at];
    case DType::kBF16: return bf16_to_float(static_cast<const std::uint16_t*>(data)[at]);
    case DType::kF16: return f16_to_float(static_cast<const std::uint16_t*>(data)[at]);
    default: return static_cast<double>(static_cast<const float*>(data)[at]);
  }
}

// The explicit mask's additive term for score (b, h, i, j): 0 or -inf for a bool mask, the
// stored value for a float mask, 0 without a mask.
inline double mask_bias(const Masking& m, std::int64_t b, std::int64_t h, std::int64_t i,
                        std::int64_t j) noexcept {
  if (m.mask == nullptr) return 0.0;
  const std::int64_t at = m.mask_strides.at(b, h, i, j);
  switch (m.mask_dtype) {
    case DType::kBool:
      return static_cast<const bool*>(m.mask)[at] ? 0.0 : -std::numeric_limits<double>::infinity();
    case DType::kF32:
      return static_cast<double>(static_cast<const float*>(m.mask)[at]);
    case DType::kF64:
      return static_cast<const double*>(m.mask)[at];
    case DType::kBF16:
    case DType::kF16:
      return load_real(m.mask, m.mask_dtype, at);
    case DType::kI32:
    case DType::kI64: break;  // validation admits no integer mask
  }
  return 0.0;
}

// The first and one-past-last key that causal/window allow for a query row; the explicit mask
// may forbid more inside. Empty when first >= last.
struct KeyRange {
  std::int64_t first = 0;
  std::int64_t last = 0;
};

inline KeyRange allowed_key_range(const Masking& m, std::int64_t nk, std::int64_t diag) noexcept {
  std::int64_t first = 0;
  std::int64_t last = nk;
  if (m.causal) last = std::min(last, diag + 1);
  if (m.window_right >= 0) last = std::min(last, diag + m.window_right + 1);
  if (m.window_left >= 0) first = std::max(first, diag - m.window_left);
  if (last < first) last = first;
  return {first, last};
}

inline void store_real(void* data, DType dtype, std::int64_t at, double value) noexcept {
  if (dtype == DType::kF64) {
    static_cast<double*>(data)[at] = value;
  } else {
    static_cast<float*>(data)[at] = static_cast<float>(value);
  }
}

}  // namespace qkv::core
