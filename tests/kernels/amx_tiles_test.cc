// The AMX tile products (kernels/amx_tiles.h) against their twin, amx_gemm_bf16_reference:
// every edge the backward's packing produces (rows not a multiple of 16 or 32, one or two
// column tiles, strided A and B, accumulate or overwrite, an empty reduction), within the
// float32 summation bound of the same products; bitwise equal where every sum is exact; C
// untouched outside rows [0, m) and columns [0, n); A's spare rows (read, never used) full of
// NaNs. Skipped, with a note, where the CPU or the build has no AMX bf16 (the twin then stands
// in for the tiles, and nothing calls them).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/half.h"
#include "kernels/amx_tiles.h"

namespace qkv::kernels {
namespace {

constexpr std::uint32_t kNanPair = 0x7fc07fc0u;
constexpr float kUntouched = -12345.0f;

std::uint32_t pair(float lo, float hi) {
  return std::uint32_t{core::float_to_bf16(lo)} | (std::uint32_t{core::float_to_bf16(hi)} << 16);
}

float low(std::uint32_t w) { return std::bit_cast<float>(w << 16); }
float high(std::uint32_t w) { return std::bit_cast<float>(w & 0xffff0000u); }

struct Operands {
  std::int64_t m, n, k2, lda, ldb, ldc;
  std::vector<std::uint32_t> a, b;
  std::vector<float> c;  // ldc x (m + 3) rows: three rows past m to see untouched
};

// Values in [-2, 2) with `bits` significant bits: with few bits every product and sum is exact.
Operands make(std::int64_t m, std::int64_t n, std::int64_t k2, std::uint32_t seed, int bits) {
  Operands o{m, n, k2, k2 + 16, n + 16, n + 5, {}, {}, {}};
  std::uint32_t state = seed;
  const auto next = [&] {
    state = state * 1664525u + 1013904223u;
    const double unit = static_cast<double>(state >> 8) / 16777216.0;  // [0, 1)
    const double steps = std::ldexp(1.0, bits);
    return static_cast<float>(std::floor(unit * 4.0 * steps) / steps - 2.0);
  };
  const std::int64_t a_rows = (m + 15) / 16 * 16;
  o.a.assign(static_cast<std::size_t>(a_rows * o.lda), kNanPair);
  for (std::int64_t r = 0; r < m; ++r) {
    for (std::int64_t x = 0; x < k2; ++x) o.a[static_cast<std::size_t>(r * o.lda + x)] = pair(next(), next());
  }
  o.b.assign(static_cast<std::size_t>(std::max<std::int64_t>(k2, 1) * o.ldb), kNanPair);
  for (std::int64_t x = 0; x < k2; ++x) {
    for (std::int64_t col = 0; col < n; ++col) {
      o.b[static_cast<std::size_t>(x * o.ldb + col)] = pair(next(), next());
    }
  }
  o.c.assign(static_cast<std::size_t>((m + 3) * o.ldc), kUntouched);
  for (std::int64_t r = 0; r < m; ++r) {
    for (std::int64_t col = 0; col < n; ++col) o.c[static_cast<std::size_t>(r * o.ldc + col)] = next();
  }
  return o;
}

// |c| bound of each product's sum: Σ|a·b| (and the accumulator's start).
std::vector<double> magnitudes(const Operands& o, bool accumulate) {
  std::vector<double> mag(static_cast<std::size_t>(o.m * o.n), 0.0);
  for (std::int64_t r = 0; r < o.m; ++r) {
    for (std::int64_t col = 0; col < o.n; ++col) {
      double sum = accumulate ? std::fabs(o.c[static_cast<std::size_t>(r * o.ldc + col)]) : 0.0;
      for (std::int64_t x = 0; x < o.k2; ++x) {
        const std::uint32_t aw = o.a[static_cast<std::size_t>(r * o.lda + x)];
        const std::uint32_t bw = o.b[static_cast<std::size_t>(x * o.ldb + col)];
        sum += std::fabs(static_cast<double>(low(aw)) * low(bw)) +
               std::fabs(static_cast<double>(high(aw)) * high(bw));
      }
      mag[static_cast<std::size_t>(r * o.n + col)] = sum;
    }
  }
  return mag;
}

class AmxTiles : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!amx_bf16_supported()) {
      GTEST_SKIP() << "no AMX bf16 here (CPU, build, or QKV_BF16_AMX=0): the tiles never run";
    }
  }
};

void run_case(std::int64_t m, std::int64_t n, std::int64_t k2, bool accumulate, int bits,
              bool exact) {
  SCOPED_TRACE("m " + std::to_string(m) + " n " + std::to_string(n) + " k2 " +
               std::to_string(k2) + (accumulate ? " accumulate" : ""));
  const Operands o = make(m, n, k2, static_cast<std::uint32_t>(m * 131 + n * 7 + k2), bits);
  std::vector<float> got = o.c, want = o.c;
  const std::vector<double> mag = magnitudes(o, accumulate);
  {
    const AmxTileSession session;
    amx_gemm_bf16(m, n, k2, o.a.data(), o.lda, o.b.data(), o.ldb, got.data(), o.ldc, accumulate);
  }
  amx_gemm_bf16_reference(m, n, k2, o.a.data(), o.lda, o.b.data(), o.ldb, want.data(), o.ldc,
                          accumulate);
  // Float32 sums of 2·k2 products (+1 for the accumulator) in any order: (2·k2 + 1)·2^-24·Σ|a·b|
  // from each, so twice that between two orders.
  const double unit = std::ldexp(1.0, -24);
  for (std::int64_t r = 0; r < m + 3; ++r) {
    for (std::int64_t col = 0; col < o.ldc; ++col) {
      const auto e = static_cast<std::size_t>(r * o.ldc + col);
      if (r >= m || col >= n) {
        ASSERT_EQ(got[e], o.c[e]) << "C written outside its rows and columns at " << r << ", "
                                  << col;
        continue;
      }
      ASSERT_TRUE(std::isfinite(got[e])) << r << ", " << col;
      if (exact) {
        ASSERT_EQ(got[e], want[e]) << r << ", " << col;
      } else {
        const double bound =
            2.0 * static_cast<double>(2 * k2 + 1) * unit * mag[static_cast<std::size_t>(r * n + col)];
        ASSERT_LE(std::fabs(static_cast<double>(got[e]) - want[e]), bound) << r << ", " << col;
      }
    }
  }
}

TEST_F(AmxTiles, MatchesTheTwinAtEveryEdge) {
  for (const std::int64_t m : {1, 5, 15, 16, 17, 31, 32, 33, 48, 64, 100, 128}) {
    for (const std::int64_t n : {16, 32, 48, 80, 128}) {
      for (const std::int64_t k2 : {16, 32, 64}) {
        for (const bool accumulate : {false, true}) run_case(m, n, k2, accumulate, 20, false);
      }
    }
  }
}

// Values with 3 significant bits and at most 128 products a sum: every partial sum is a
// multiple of 2^-6 below 2^10, exact in float32, so any order gives the same bits.
TEST_F(AmxTiles, ExactSumsAreBitwiseTheTwins) {
  for (const std::int64_t m : {7, 16, 40}) {
    for (const std::int64_t n : {16, 48}) {
      for (const bool accumulate : {false, true}) run_case(m, n, 64, accumulate, 3, true);
    }
  }
}

TEST_F(AmxTiles, EmptyReductionZeroesOrKeeps) {
  for (const bool accumulate : {false, true}) {
    Operands o = make(20, 32, 0, 3, 20);
    std::vector<float> got = o.c;
    {
      const AmxTileSession session;
      amx_gemm_bf16(20, 32, 0, nullptr, 0, nullptr, 0, got.data(), o.ldc, accumulate);
    }
    for (std::int64_t r = 0; r < 20; ++r) {
      for (std::int64_t col = 0; col < 32; ++col) {
        const auto e = static_cast<std::size_t>(r * o.ldc + col);
        EXPECT_EQ(got[e], accumulate ? o.c[e] : 0.0f);
      }
    }
  }
}

TEST(AmxTilesTwin, IsTheDefinition) {
  // 2 x 16 columns over 1 pair: c = a_lo·b_lo + a_hi·b_hi (+ c).
  std::vector<std::uint32_t> a = {pair(1.5f, -2.0f), pair(0.25f, 3.0f)};
  std::vector<std::uint32_t> b(16, pair(2.0f, 0.5f));
  std::vector<float> c(32, 1.0f);
  amx_gemm_bf16_reference(2, 16, 1, a.data(), 1, b.data(), 16, c.data(), 16, true);
  EXPECT_EQ(c[0], 1.0f + 3.0f - 1.0f);
  EXPECT_EQ(c[16 + 15], 1.0f + 0.5f + 1.5f);
  amx_gemm_bf16_reference(2, 16, 1, a.data(), 1, b.data(), 16, c.data(), 16, false);
  EXPECT_EQ(c[0], 2.0f);
}

}  // namespace
}  // namespace qkv::kernels
