// Dropout for a row of 64 weights in SIMD (core/dropout.h defines the draws): the eight
// Philox4x32-10 calls of a row's 64 keys run side by side, one call per 64-bit lane (8 lanes on
// AVX-512, two vectors of 4 on AVX2), each 32-bit word of the state in the low half of its lane.
// A round is two MulEven (32 x 32 -> 64, the low halves) per vector, two shifts and two
// three-way xors; the high halves carry garbage that MulEven ignores, and are cleared once at
// the end. The four output words then pack as (w0 | w1 << 32) and (w2 | w3 << 32): read as
// 32-bit lanes, their low and high 16 bits are the draws of keys 0-15, 16-31, 32-47, 48-63 in
// order (that is the order dropout.h's definition chose), so each is compared with the
// threshold and selects s·scale or 0 for one vector of 16 weights. About 75 vector ops per row
// of 64 weights on AVX-512, beside the ~600 of the row's q·K^T, exp and P·V at d = 64; rows64
// draws two rows at once (the forward's drop_rows).
//
// Included by a Highway source after hwy/foreach_target.h; the toggling guard is Highway's
// per-target re-inclusion.
#if defined(QKV_KERNELS_DROPOUT_HWY_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_KERNELS_DROPOUT_HWY_INL_H_
#undef QKV_KERNELS_DROPOUT_HWY_INL_H_
#else
#define QKV_KERNELS_DROPOUT_HWY_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/dropout.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::kernels::HWY_NAMESPACE::dropout_hwy {

// s_r[k] := keep ? s_r[k]·scale : 0 for the keys [j0, j0 + 64) of rows i[r] of the heads
// head_word[r], r < R (j0 a multiple of 64, each s_r 64 floats; all 64 are written, whatever
// the row's count). A row's Philox rounds are one chain of dependent products (ten rounds of a
// multiply, a shift and a three-way xor): R = 2 runs two rows' chains side by side, so each
// hides the other's latency.
template <int R>
HWY_INLINE void rows64(const core::Dropout& d, const std::uint32_t* head_word,
                       const std::int64_t* i, std::int64_t j0, float* const* s) {
#if HWY_TARGET == HWY_SCALAR
  for (int r = 0; r < R; ++r) {
    core::dropout_span_scalar(d, head_word[r], i[r], j0, core::kDropoutKeys, s[r]);
  }
#else
  namespace hn = hwy::HWY_NAMESPACE;
  const hn::ScalableTag<std::uint64_t> d64;
  const hn::Repartition<std::uint32_t, decltype(d64)> d32;
  const hn::Repartition<std::int32_t, decltype(d64)> di;
  const hn::Repartition<float, decltype(d64)> df;
  const std::int64_t n64 = static_cast<std::int64_t>(hn::Lanes(d64));
  const std::int64_t n32 = 2 * n64;
  if (n64 > core::kDropoutCalls ||
      core::kDropoutCalls % n64 != 0) {
    for (int r = 0; r < R; ++r) {
      core::dropout_span_scalar(d, head_word[r], i[r], j0, core::kDropoutKeys, s[r]);
    }
    return;
  }
  using V64 = hn::Vec<decltype(d64)>;
  const auto m0 = hn::Set(d32, core::kPhiloxM0);
  const auto m1 = hn::Set(d32, core::kPhiloxM1);
  const V64 low = hn::Set(d64, 0xFFFFFFFFull);
  const auto half = hn::Set(d32, 0xFFFFu);
  const auto threshold = hn::Set(di, static_cast<std::int32_t>(d.threshold));
  const auto scale = hn::Set(df, static_cast<float>(d.keep_scale));
  const auto block = static_cast<std::uint64_t>(j0 / core::kDropoutKeys);
  const auto apply = [&](float* HWY_RESTRICT row, std::int64_t at,
                         hn::Vec<decltype(d32)> draws) {
    const auto drop = hn::RebindMask(df, hn::Lt(hn::BitCast(di, draws), threshold));
    hn::StoreU(hn::IfThenZeroElse(drop, hn::Mul(hn::LoadU(df, row + at), scale)), df, row + at);
  };
  for (std::int64_t g = 0; g < core::kDropoutCalls / n64; ++g) {
    const V64 calls = hn::Add(
        hn::Iota(d64, 0),
        hn::Set(d64, (block * core::kDropoutCalls + static_cast<std::uint64_t>(g * n64)) &
                         0xFFFFFFFFull));
    V64 c0[R], c1[R], c2[R], c3[R];
    for (int r = 0; r < R; ++r) {
      c0[r] = calls;
      c1[r] = hn::Set(d64, static_cast<std::uint32_t>(static_cast<std::uint64_t>(i[r])));
      c2[r] = hn::Set(d64, head_word[r]);
      c3[r] = hn::Set(d64, d.offset);
    }
    auto k0 = static_cast<std::uint32_t>(d.seed);
    auto k1 = static_cast<std::uint32_t>(d.seed >> 32);
    for (int round = 0; round < core::kPhiloxRounds; ++round) {
      const V64 key0 = hn::Set(d64, k0), key1 = hn::Set(d64, k1);
      for (int r = 0; r < R; ++r) {
        const V64 p0 = hn::MulEven(hn::BitCast(d32, c0[r]), m0);
        const V64 p1 = hn::MulEven(hn::BitCast(d32, c2[r]), m1);
        // Xor3: one vpternlog on AVX-512.
        c0[r] = hn::Xor3(hn::ShiftRight<32>(p1), c1[r], key0);
        c1[r] = p1;
        c2[r] = hn::Xor3(hn::ShiftRight<32>(p0), c3[r], key1);
        c3[r] = p0;
      }
      k0 += core::kPhiloxW0;
      k1 += core::kPhiloxW1;
    }
    for (int r = 0; r < R; ++r) {
      const auto w01 = hn::BitCast(d32, hn::Or(hn::And(c0[r], low), hn::ShiftLeft<32>(c1[r])));
      const auto w23 = hn::BitCast(d32, hn::Or(hn::And(c2[r], low), hn::ShiftLeft<32>(c3[r])));
      apply(s[r], g * n32, hn::And(w01, half));
      apply(s[r], 16 + g * n32, hn::ShiftRight<16>(w01));
      apply(s[r], 32 + g * n32, hn::And(w23, half));
      apply(s[r], 48 + g * n32, hn::ShiftRight<16>(w23));
    }
  }
#endif
}

HWY_INLINE void row64(const core::Dropout& d, std::uint32_t head_word, std::int64_t i,
                      std::int64_t j0, float* HWY_RESTRICT s) {
  float* const rows[1] = {s};
  rows64<1>(d, &head_word, &i, j0, rows);
}

// Any span of a row: whole aligned blocks of 64 in SIMD, the ragged ends the portable way.
template <class F>
HWY_INLINE void span(const core::Dropout& d, std::uint32_t head_word, std::int64_t i,
                     std::int64_t j0, std::int64_t count, F* HWY_RESTRICT s) {
  std::int64_t k = 0;
  while (k < count) {
    const std::int64_t j = j0 + k;
    const std::int64_t block0 = j - j % core::kDropoutKeys;
    const std::int64_t n = std::min(count - k, block0 + core::kDropoutKeys - j);
    if constexpr (std::is_same_v<F, float>) {
      if (j == block0 && n == core::kDropoutKeys) {
        row64(d, head_word, i, j, s + k);
        k += n;
        continue;
      }
    }
    core::dropout_span_scalar(d, head_word, i, j, n, s + k);
    k += n;
  }
}

}  // namespace qkv::kernels::HWY_NAMESPACE::dropout_hwy
HWY_AFTER_NAMESPACE();

#endif  // QKV_KERNELS_DROPOUT_HWY_INL_H_
