// The backward's dropout mask as bits (bwd::dropout_keep_bits) and its product with a tile
// (bwd::apply_keep_bits_f32), on every SIMD target this CPU has: the bits are core/dropout.h's
// definition key by key (dropout_keeps) for tiles that start off a block of 64 keys, end
// inside one, span more rows than one rows64 call takes, or have padding columns; and the
// product has the bits of src·z with z the float factor 1/(1 - p) or 0 (infinities and NaNs
// included), in place and not.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/dropout.h"
#include "kernels/bwd_fused_driver.h"
#include "kernels/kernel.h"

namespace qkv::kernels {
namespace {

core::Dropout make_dropout(std::uint32_t threshold, std::uint64_t seed, std::uint32_t offset) {
  core::Dropout d;
  d.threshold = threshold;
  d.keep_scale = 65536.0 / (65536.0 - threshold);
  d.seed = seed;
  d.offset = offset;
  d.batch_base = 2;
  d.heads = 5;
  return d;
}

// Every target the CPU has, then the CPU's best again (0); the portable build has none and
// runs its one path.
std::vector<std::int64_t> targets_then_best() {
  std::vector<std::int64_t> targets = simd_targets();
  targets.push_back(0);
  return targets;
}

struct Tile {
  std::int64_t i0, rows, j0, cols, ld;
};

TEST(DropoutKeepBits, EveryBitIsTheDefinitionsOnEveryTarget) {
  const Tile tiles[] = {
      {0, 3, 0, 64, 64},      // one aligned block
      {5, 70, 128, 128, 128}, // more rows than one rows64 call takes (64)
      {17, 9, 37, 100, 112},  // starts inside a block: the bits straddle words
      {0, 4, 64, 130, 144},   // a ragged last block, padding columns
      {1, 2, 0, 1, 16},       // one key
      {3, 2, 0, 0, 16},       // no key: every bit clear
  };
  const std::int64_t b = 1, h = 3;
  for (const std::int64_t target : targets_then_best()) {
    simd_force_target(target);
    const std::string name = simd_target_name();
    for (const std::uint32_t threshold : {1u, 6554u, 32768u, 65535u}) {
      for (const auto& [seed, offset] :
           {std::pair<std::uint64_t, std::uint32_t>{3, 0}, {0xDEADBEEFCAFEF00Dull, 7}}) {
        const core::Dropout d = make_dropout(threshold, seed, offset);
        for (const Tile& t : tiles) {
          const std::int64_t words = bwd::keep_words(t.ld);
          // Garbage on entry: the call must write every word.
          std::vector<std::uint64_t> bits(static_cast<std::size_t>(t.rows * words),
                                          0xA5A5A5A5A5A5A5A5ull);
          bwd::dropout_keep_bits(d, core::dropout_head_word(d, b, h), t.i0, t.rows, t.j0,
                                 t.cols, t.ld, bits.data());
          std::int64_t wrong = 0;
          for (std::int64_t r = 0; r < t.rows; ++r) {
            for (std::int64_t c = 0; c < words * 64; ++c) {
              const bool want =
                  c < t.cols && core::dropout_keeps(d, b, h, t.i0 + r, t.j0 + c);
              const bool got = ((bits[static_cast<std::size_t>(r * words + c / 64)] >>
                                 (c % 64)) & 1u) != 0;
              if (got != want && ++wrong <= 3) {
                ADD_FAILURE() << name << " t=" << threshold << " seed=" << seed << " tile ("
                              << t.i0 << ", " << t.rows << ", " << t.j0 << ", " << t.cols
                              << ", " << t.ld << "): row " << r << " column " << c << " got "
                              << got << ", the definition " << want;
              }
            }
          }
        }
      }
    }
  }
  simd_force_target(0);
}

TEST(DropoutKeepBits, ProductHasTheBitsOfTheFloatFactorsOnEveryTarget) {
  std::vector<float> awkward;
  for (const std::uint32_t bits : {0x00000000u, 0x80000000u, 0x3f800000u, 0xbf800000u,
                                   0x00000001u, 0x807fffffu, 0x7f7fffffu, 0xff7fffffu,
                                   0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc01234u}) {
    awkward.push_back(std::bit_cast<float>(bits));
  }
  std::uint32_t state = 2024;
  const auto next = [&] {
    state = state * 1664525u + 1013904223u;
    return state;
  };
  const float scale = static_cast<float>(65536.0 / (65536.0 - 6554.0));
  for (const std::int64_t target : targets_then_best()) {
    simd_force_target(target);
    const std::string name = simd_target_name();
    for (const std::int64_t ld : {1, 15, 16, 17, 33, 64, 128, 144}) {
      const std::int64_t rows = 3, words = bwd::keep_words(ld);
      std::vector<std::uint64_t> bits(static_cast<std::size_t>(rows * words));
      for (auto& w : bits) w = (std::uint64_t{next()} << 32) | next();
      std::vector<float> src(static_cast<std::size_t>(rows * ld));
      for (std::size_t e = 0; e < src.size(); ++e) {
        src[e] = e < awkward.size() ? awkward[e]
                                    : static_cast<float>(static_cast<std::int32_t>(next())) *
                                          1e-9f;
      }
      std::vector<float> want(src.size());
      for (std::int64_t r = 0; r < rows; ++r) {
        for (std::int64_t c = 0; c < ld; ++c) {
          const bool kept = ((bits[static_cast<std::size_t>(r * words + c / 64)] >> (c % 64)) &
                             1u) != 0;
          const auto e = static_cast<std::size_t>(r * ld + c);
          want[e] = src[e] * (kept ? scale : 0.0f);
        }
      }
      std::vector<float> out(src.size(), -7.0f);
      bwd::apply_keep_bits_f32(src.data(), bits.data(), rows, ld, scale, out.data());
      std::vector<float> in_place = src;
      bwd::apply_keep_bits_f32(in_place.data(), bits.data(), rows, ld, scale, in_place.data());
      for (std::size_t e = 0; e < src.size(); ++e) {
        if (std::isnan(want[e])) {
          EXPECT_TRUE(std::isnan(out[e]) && std::isnan(in_place[e])) << name << " ld " << ld;
        } else {
          EXPECT_EQ(std::bit_cast<std::uint32_t>(out[e]), std::bit_cast<std::uint32_t>(want[e]))
              << name << " ld " << ld << " element " << e;
          EXPECT_EQ(std::bit_cast<std::uint32_t>(in_place[e]),
                    std::bit_cast<std::uint32_t>(want[e]))
              << name << " ld " << ld << " element " << e << " (in place)";
        }
      }
    }
  }
  simd_force_target(0);
}

}  // namespace
}  // namespace qkv::kernels
