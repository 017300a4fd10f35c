// Dropout for a row of 64 weights in SIMD (core/dropout.h defines the draws): the eight
// Philox4x32-10 calls of a row's 64 keys run side by side, one call per 64-bit lane (8 lanes on
// AVX-512, two vectors of 4 on AVX2), each 32-bit word of the state in the low half of its lane.
// A round is two MulEven (32 x 32 -> 64, the low halves) per vector, two shifts and four xors;
// the high halves carry garbage that MulEven ignores, and are cleared once at the end. The four
// output words then pack as (w0 | w1 << 32) and (w2 | w3 << 32): read as 32-bit lanes, their
// low and high 16 bits are the draws of keys 0-15, 16-31, 32-47, 48-63 in order (that is the
// order dropout.h's definition chose), so each is compared with the threshold and selects
// s·scale or 0 for one vector of 16 weights. About 90 vector ops per row of 64 weights on
// AVX-512, beside the ~600 of the row's q·K^T, exp and P·V at d = 64.
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

// s[k] := keep ? s[k]·scale : 0 for the keys [j0, j0 + 64) of row i (j0 a multiple of 64, s
// 64 floats; all 64 are written, whatever the row's count).
HWY_INLINE void row64(const core::Dropout& d, std::uint32_t head_word, std::int64_t i,
                      std::int64_t j0, float* HWY_RESTRICT s) {
#if HWY_TARGET == HWY_SCALAR
  core::dropout_span_scalar(d, head_word, i, j0, core::kDropoutKeys, s);
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
    core::dropout_span_scalar(d, head_word, i, j0, core::kDropoutKeys, s);
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
  const auto apply = [&](std::int64_t at, hn::Vec<decltype(d32)> draws) {
    const auto drop = hn::RebindMask(df, hn::Lt(hn::BitCast(di, draws), threshold));
    hn::StoreU(hn::IfThenZeroElse(drop, hn::Mul(hn::LoadU(df, s + at), scale)), df, s + at);
  };
  for (std::int64_t g = 0; g < core::kDropoutCalls / n64; ++g) {
    V64 c0 = hn::Add(hn::Iota(d64, 0),
                     hn::Set(d64, (block * core::kDropoutCalls + static_cast<std::uint64_t>(
                                                                     g * n64)) &
                                      0xFFFFFFFFull));
    V64 c1 = hn::Set(d64, static_cast<std::uint32_t>(static_cast<std::uint64_t>(i)));
    V64 c2 = hn::Set(d64, head_word);
    V64 c3 = hn::Set(d64, d.offset);
    auto k0 = static_cast<std::uint32_t>(d.seed);
    auto k1 = static_cast<std::uint32_t>(d.seed >> 32);
    for (int round = 0; round < core::kPhiloxRounds; ++round) {
      const V64 p0 = hn::MulEven(hn::BitCast(d32, c0), m0);
      const V64 p1 = hn::MulEven(hn::BitCast(d32, c2), m1);
      c0 = hn::Xor(hn::Xor(hn::ShiftRight<32>(p1), c1), hn::Set(d64, k0));
      c1 = p1;
      c2 = hn::Xor(hn::Xor(hn::ShiftRight<32>(p0), c3), hn::Set(d64, k1));
      c3 = p0;
      k0 += core::kPhiloxW0;
      k1 += core::kPhiloxW1;
    }
    const auto w01 = hn::BitCast(d32, hn::Or(hn::And(c0, low), hn::ShiftLeft<32>(c1)));
    const auto w23 = hn::BitCast(d32, hn::Or(hn::And(c2, low), hn::ShiftLeft<32>(c3)));
    apply(g * n32, hn::And(w01, half));
    apply(16 + g * n32, hn::ShiftRight<16>(w01));
    apply(32 + g * n32, hn::And(w23, half));
    apply(48 + g * n32, hn::ShiftRight<16>(w23));
  }
#endif
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
