// Scalar conversions between float and the 16-bit storage types (bfloat16, IEEE binary16),
// round to nearest even, for the code that is not vectorised (tails, the reference, I/O). The
// SIMD kernels convert in registers with the same rounding; a test holds the two together.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>

namespace qkv::core {

// bfloat16 is the high half of a float32: widening is exact.
inline float bf16_to_float(std::uint16_t bits) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

// Round to nearest even on the 16 dropped bits; a NaN stays a (quiet) NaN.
inline std::uint16_t float_to_bf16(float value) noexcept {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);
  const std::uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

// IEEE binary16: 1 sign, 5 exponent (bias 15), 10 fraction bits; every value is exact in float.
// Branch-free but for infinities and NaNs: the magnitude's bits shifted into float's place read
// as a float 2^-112 times the value (subnormal halves land on normal or subnormal floats whose
// product by 2^112 is exact), so one multiply rebiases normals and normalises subnormals alike.
// The kernels convert float16 tiles with this while packing (3x faster than a branch and ldexp).
inline float f16_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t magnitude = static_cast<std::uint32_t>(h & 0x7fffu) << 13;
  if (magnitude >= 0x0f800000u) {  // exponent 31: infinity or NaN (payload kept)
    return std::bit_cast<float>(sign | 0x7f800000u | (magnitude & 0x007fe000u));
  }
  const float value = std::bit_cast<float>(magnitude) * 0x1p112f;
  return std::bit_cast<float>(sign | std::bit_cast<std::uint32_t>(value));
}

// Round to nearest even; magnitudes at or above 65520 become infinity, as in F16C's vcvtps2ph.
inline std::uint16_t float_to_f16(float value) noexcept {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const std::uint16_t sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);  // NaN
  if (magnitude >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520
  if (magnitude < 0x38800000u) {
    // Below the smallest normal half (2^-14): a multiple of 2^-24, rounded to nearest even by
    // the float addition itself (adding 0.5 fixes the exponent so the fraction bits are it).
    const float scaled = std::bit_cast<float>(magnitude) + 0.5f;
    return static_cast<std::uint16_t>(sign | (std::bit_cast<std::uint32_t>(scaled) - 0x3f000000u));
  }
  const std::uint32_t rounding = 0xfffu + ((magnitude >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | ((magnitude - 0x38000000u + rounding) >> 13));
}

// A float holding `value` rounded to odd: truncated toward zero, its last bit set if that lost
// anything. Rounding this float to nearest even at 16 bits gives the same result as rounding
// `value` itself (float keeps more than two bits beyond bfloat16's and float16's precision, in
// their subnormal ranges too), where the plain double -> float -> 16-bit route rounds twice and
// can land on the wrong side of a tie. Past float's range it gives FLT_MAX, which still rounds
// to infinity at 16 bits.
inline float narrow_to_odd(double value) noexcept {
  float f = static_cast<float>(value);
  if (std::isnan(value) || static_cast<double>(f) == value) return f;
  if (std::abs(static_cast<double>(f)) > std::abs(value)) f = std::nextafter(f, 0.0f);
  return std::bit_cast<float>(std::bit_cast<std::uint32_t>(f) | 1u);
}

}  // namespace qkv::core
