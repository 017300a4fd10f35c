// The score modifiers and the storage-type rounding of the contract, in one place, as the
// reference states them and the kernels must reproduce:
//   s_ij = softcap(scale · q_i·k_j) + alibi_ij + float mask_ij,
//   softcap(x) = C · tanh(x / C),  alibi_ij = -slope_h · |i + nk - nq - j|,
//   and a sink adds exp(sink_h) to each row's denominator, with no value.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/half.h"
#include "core/params.h"

namespace qkv::core {

// softcap(x) = cap · tanh(x / cap); cap <= 0 means no capping.
inline double softcap(double x, double cap) noexcept { return cap > 0 ? cap * std::tanh(x / cap) : x; }

// The ALiBi term for key j of the query row whose diagonal (i + nk - nq) is `diag`.
inline double alibi_bias(double slope, std::int64_t diag, std::int64_t j) noexcept {
  const std::int64_t distance = diag >= j ? diag - j : j - diag;
  return distance == 0 ? 0.0 : -slope * static_cast<double>(distance);  // never -0
}

// `value` rounded to the storage type `dtype` (nearest even, once, from double); kF64 and
// kF32 leave it as it is: float32 arithmetic rounds float64 inputs as it reads them, and the
// reference keeps them (it is the float64 statement of the formulas).
inline double round_to_storage(double value, DType dtype) noexcept {
  switch (dtype) {
    case DType::kBF16: return bf16_to_float(float_to_bf16(narrow_to_odd(value)));
    case DType::kF16: return f16_to_float(float_to_f16(narrow_to_odd(value)));
    default: return value;
  }
}

// Whether reading this operand for the call's storage type rounds it (a float32 or float64
// operand for bf16/f16, or one 16-bit type for the other): a kernel that reads operands as
// they are stored declines such calls.
inline bool operand_rounds(const InputOperand& op, DType compute) noexcept {
  if (compute != DType::kBF16 && compute != DType::kF16) return false;
  return op.dtype != compute;
}

inline bool inputs_round(const AttentionParams& p) noexcept {
  return operand_rounds(p.q, p.compute) || operand_rounds(p.k, p.compute) ||
         operand_rounds(p.v, p.compute);
}

// The standard slopes of Press et al. for `heads` query heads (qkv::alibi_slopes).
std::vector<double> standard_alibi_slopes(std::int64_t heads);

}  // namespace qkv::core
