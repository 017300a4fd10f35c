// The widened bf16 backward's rounding of its P and dS tiles (bwd::round_to_bf16_f32, SIMD on
// the bits) against the definition every other bf16 rounding in qkv uses
// (core::round_to_storage: through double, core::float_to_bf16): the same bits for ties, both
// signs, subnormals, the largest finite floats (which round to infinity), infinities and NaNs,
// at every length (whole vectors and the scalar tail), in place and not.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/half.h"
#include "core/score_modifiers.h"
#include "kernels/bwd_fused_driver.h"

namespace qkv::kernels {
namespace {

std::vector<float> awkward_floats() {
  std::vector<float> values;
  for (const std::uint32_t bits :
       {0x00000000u, 0x80000000u, 0x3f808000u, 0x3f818000u, 0x3f80c000u, 0x3f807fffu, 0x00000001u,
        0x00008000u, 0x00018000u, 0x807fffffu, 0x7f7fffffu, 0xff7fffffu, 0x7f7f8000u, 0x7f800000u,
        0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffbfffffu, 0x3effffffu}) {
    values.push_back(std::bit_cast<float>(bits));
  }
  std::uint32_t state = 12345;
  for (int i = 0; i < 200; ++i) {
    state = state * 1664525u + 1013904223u;
    values.push_back(std::bit_cast<float>(state));
  }
  return values;
}

std::uint32_t expected_bits(float x) {
  const float want = static_cast<float>(
      core::round_to_storage(static_cast<double>(x), DType::kBF16));
  return std::bit_cast<std::uint32_t>(want);
}

TEST(RoundToBf16, SimdRoundingIsTheDefinitionsBitsAtEveryLength) {
  const std::vector<float> values = awkward_floats();
  for (std::size_t length : {std::size_t{0}, std::size_t{1}, std::size_t{15}, std::size_t{16},
                             std::size_t{17}, std::size_t{33}, values.size()}) {
    std::vector<float> out(length, -1.0f);
    bwd::round_to_bf16_f32(values.data(), static_cast<std::int64_t>(length), out.data());
    for (std::size_t e = 0; e < length; ++e) {
      const std::uint32_t want = expected_bits(values[e]);
      const std::uint32_t got = std::bit_cast<std::uint32_t>(out[e]);
      if (std::isnan(values[e])) {
        EXPECT_TRUE(std::isnan(out[e])) << e;
        EXPECT_EQ(got & 0xffff0000u, got) << e;  // still a bf16 value
      } else {
        EXPECT_EQ(got, want) << "element " << e << " of " << length << ": 0x" << std::hex
                             << std::bit_cast<std::uint32_t>(values[e]);
      }
      EXPECT_EQ(got, std::bit_cast<std::uint32_t>(bwd::round_float_to_bf16(values[e]))) << e;
    }
  }
  std::vector<float> in_place = values;
  bwd::round_to_bf16_f32(in_place.data(), static_cast<std::int64_t>(in_place.size()),
                         in_place.data());
  for (std::size_t e = 0; e < values.size(); ++e) {
    if (!std::isnan(values[e])) {
      EXPECT_EQ(std::bit_cast<std::uint32_t>(in_place[e]), expected_bits(values[e])) << e;
    }
  }
}

}  // namespace
}  // namespace qkv::kernels
