// Dropout for rows of 64 weights in SIMD (core/dropout.h defines the draws): the eight
// Philox4x32-10 calls of a row's 64 keys run side by side, one call per 64-bit lane (8 lanes on
// AVX-512, two vectors of 4 on AVX2), each 32-bit word of the state in the low half of its lane.
// Rounds 1 and 2 are mostly shared by the rows of a tile (philox_row_words); each of rounds 3-10 is
// two MulEven (32 x 32 -> 64, the low halves) per vector, two shuffles and two three-way xors;
// the high halves carry garbage that MulEven ignores. The last round leaves its four output
// words packed as (w0 | w1 << 32) and (w2 | w3 << 32) (last_round_words): read as 32-bit
// lanes, their low and high 16 bits are the draws of keys 0-15, 16-31, 32-47, 48-63 in order
// (that is the order dropout.h's definition chose), so each is compared with the threshold
// once for one vector of 16 weights, and a sink takes the mask: the forward's weights scaled
// (ScaleWeights) or zeroed (ZeroDropped), or the backward's bits (KeepBits). About 55 vector
// ops per row of 64 weights on AVX-512, beside the ~600 of the row's q·K^T, exp and P·V at
// d = 64; rows64 takes a tile's rows in one call, kDropRows at a time.
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
#include <cstring>
#include <type_traits>

#include "core/dropout.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::kernels::HWY_NAMESPACE::dropout_hwy {

// Rounds 1 and 2 of a row's eight Philox calls, split by what they depend on. A call's counter
// is (call, i, head word, offset): round 1 multiplies the call number (which differs by lane
// but not by row) and the head word (which differs by row but not by lane); round 2 multiplies
// one word of each kind. Only from round 3 on does every word differ by lane and by row. So
// rows64 takes the lane-wise words of rounds 1 and 2 once for all its rows, a row's own words
// here in scalar arithmetic, and runs eight vector rounds a row instead of ten: the same words,
// bit for bit, as core::philox4x32_10.
struct PhiloxRowWords {
  std::uint32_t c0_xor;  // lo(M1·hw) ^ round 2's key 0: xored into the lanes' hi(M1·c2)
  std::uint32_t c2_xor;  // hi(M0·c0) ^ round 2's key 1: xored into the lanes' lo(M0·call)
  std::uint32_t c3;      // lo(M0·c0), the same in every lane
};
inline PhiloxRowWords philox_row_words(const core::Dropout& d, std::uint32_t head_word,
                                       std::int64_t i) noexcept {
  const auto k0 = static_cast<std::uint32_t>(d.seed);
  const auto k1 = static_cast<std::uint32_t>(d.seed >> 32);
  // Round 1: c0 = hi(M1·hw) ^ i ^ key 0, c1 = lo(M1·hw). Round 2 multiplies that c0.
  const std::uint64_t p1 = std::uint64_t{core::kPhiloxM1} * head_word;
  const std::uint32_t c0 = static_cast<std::uint32_t>(p1 >> 32) ^
                           static_cast<std::uint32_t>(static_cast<std::uint64_t>(i)) ^ k0;
  const std::uint64_t p0 = std::uint64_t{core::kPhiloxM0} * c0;
  return {static_cast<std::uint32_t>(p1) ^ (k0 + core::kPhiloxW0),
          static_cast<std::uint32_t>(p0 >> 32) ^ (k1 + core::kPhiloxW1),
          static_cast<std::uint32_t>(p0)};
}

// Rows whose Philox chains run side by side in rows64: a row's rounds are one chain of
// dependent products (a multiply, a shuffle and a three-way xor a round), and several chains
// hide each other's latency. With the round keys in memory, four rows fit the registers. On
// the Xeon four and two were level within the host's noise: the forward with dropout 1.09x
// against 1.13x the time without (per-round medians of 12 interleaved rounds); the draws
// alone, 64 rows of 64 factors, 16.3 against 20.1 ns a row (medians of 12).
inline constexpr int kDropRows = 4;

// What rows64 does with a row's decisions, one vector of n32 keys at a time: the sink's
// operator() takes row k's keys [j0 + at, j0 + at + n32) as a mask of the dropped ones, its
// portable() row k's whole block where the target has no vectors of 64-bit lanes that fit.
namespace hn = hwy::HWY_NAMESPACE;

// The forward's weights, in place: s := keep ? s·scale : 0 (row k at s + k·ld).
struct ScaleWeights {
  float* HWY_RESTRICT s;
  std::int64_t ld;
  float scale;
  template <class D32, class M>
  HWY_INLINE void operator()(D32, std::int64_t k, std::int64_t at, M dropped) const {
    const hn::Repartition<float, D32> df;
    float* row = s + k * ld + at;
    hn::StoreU(hn::IfThenZeroElse(hn::RebindMask(df, dropped),
                                  hn::Mul(hn::LoadU(df, row), hn::Set(df, scale))),
               df, row);
  }
  void portable(const core::Dropout& d, std::uint32_t head_word, std::int64_t i,
                std::int64_t j0, std::int64_t k) const {
    core::dropout_span_scalar(d, head_word, i, j0, core::kDropoutKeys, s + k * ld);
  }
};

// The forward's weights with the scale left to the output's normalization (fused_driver-inl.h
// multiplies 1/l by 1/(1 - p)): s := keep ? s : 0, one masked store of zeros a vector.
struct ZeroDropped {
  float* HWY_RESTRICT s;
  std::int64_t ld;
  template <class D32, class M>
  HWY_INLINE void operator()(D32, std::int64_t k, std::int64_t at, M dropped) const {
    const hn::Repartition<float, D32> df;
    hn::BlendedStore(hn::Zero(df), hn::RebindMask(df, dropped), df, s + k * ld + at);
  }
  void portable(const core::Dropout& d, std::uint32_t head_word, std::int64_t i,
                std::int64_t j0, std::int64_t k) const {
    std::uint32_t draws[core::kDropoutKeys];
    core::dropout_draws_row(d, head_word, i, j0, draws);
    float* row = s + k * ld;
    for (std::int64_t c = 0; c < core::kDropoutKeys; ++c) {
      if (draws[c] < d.threshold) row[c] = 0.0f;
    }
  }
};

// The backward's keep mask (bwd_fused_driver.h, keep_words): bit c of word k·stride is set
// when key j0 + c of row k is kept. The words must be 0 on entry: the sink ors its bits in.
struct KeepBits {
  std::uint64_t* HWY_RESTRICT words;
  std::int64_t stride;
  template <class D32, class M>
  HWY_INLINE void operator()(D32 d32, std::int64_t k, std::int64_t at, M dropped) const {
    // StoreMaskBits writes ceil(lanes / 8) bytes; reading back exactly those lets the store
    // forward to the load.
    constexpr std::size_t kBytes = (hn::MaxLanes(D32()) + 7) / 8;
    std::uint8_t bytes[8] = {};
    hn::StoreMaskBits(d32, hn::Not(dropped), bytes);
    std::uint64_t kept = 0;
    std::memcpy(&kept, bytes, kBytes);
    words[k * stride] |= kept << at;
  }
  void portable(const core::Dropout& d, std::uint32_t head_word, std::int64_t i,
                std::int64_t j0, std::int64_t k) const {
    std::uint32_t draws[core::kDropoutKeys];
    core::dropout_draws_row(d, head_word, i, j0, draws);
    std::uint64_t kept = 0;
    for (std::int64_t c = 0; c < core::kDropoutKeys; ++c) {
      if (draws[c] >= d.threshold) kept |= std::uint64_t{1} << c;
    }
    words[k * stride] = kept;
  }
};

// Philox's last round for one pair of output words: c0 = hi(p1) ^ c1 ^ key0 in the low 32 bits
// of each 64-bit lane, and c1 = lo(p1) in the high ones, which is where the swapped product
// `swapped` (hi(p1) low, lo(p1) high) already holds it. So the xor goes to the even 32-bit
// lanes only, and the pair comes out packed (w0 | w1 << 32) with no blend: on AVX-512 one
// merge-masked vpternlogd (Highway 1.0 has no masked Xor3), elsewhere the xor and a blend.
template <class D32, class V64>
HWY_INLINE hn::Vec<D32> last_round_words(D32 d32, V64 swapped, V64 c1, V64 key0) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  return hn::Vec<D32>{_mm512_mask_ternarylogic_epi32(hn::BitCast(d32, swapped).raw, 0x5555,
                                                     hn::BitCast(d32, c1).raw,
                                                     hn::BitCast(d32, key0).raw, 0x96)};
#else
  const auto s = hn::BitCast(d32, swapped);
  return hn::OddEven(s, hn::Xor3(s, hn::BitCast(d32, c1), hn::BitCast(d32, key0)));
#endif
}

// For the keys [j0, j0 + 64) of rows k < count, row k being row i[k] of the head head_word[k]
// (j0 a multiple of 64), the sink takes every key's decision (all 64, whatever the row's count
// of keys). The constants, the lane-wise words of rounds 1 and 2 and the round keys are set
// up once for all the rows, which then run kDropRows at a time.
template <class Sink>
HWY_INLINE void rows64(const core::Dropout& d, std::int64_t count,
                       const std::uint32_t* head_word, const std::int64_t* i, std::int64_t j0,
                       const Sink& sink) {
  const auto portable = [&](std::int64_t k) { sink.portable(d, head_word[k], i[k], j0, k); };
#if HWY_TARGET == HWY_SCALAR
  for (std::int64_t k = 0; k < count; ++k) portable(k);
#else
  const hn::ScalableTag<std::uint64_t> d64;
  const hn::Repartition<std::uint32_t, decltype(d64)> d32;
  const std::int64_t n64 = static_cast<std::int64_t>(hn::Lanes(d64));
  const std::int64_t n32 = 2 * n64;
  if (n64 > core::kDropoutCalls || core::kDropoutCalls % n64 != 0) {
    for (std::int64_t k = 0; k < count; ++k) portable(k);
    return;
  }
  using V64 = hn::Vec<decltype(d64)>;
  const auto m0 = hn::Set(d32, core::kPhiloxM0);
  const auto m1 = hn::Set(d32, core::kPhiloxM1);
  const auto half = hn::Set(d32, 0xFFFFu);
  // A word's low draw u is dropped when u < t; its high draw when the whole word is below
  // t·65536 (its low 16 bits cannot lift it past), which spares a shift.
  const auto threshold = hn::Set(d32, d.threshold);
  const auto threshold_high = hn::Set(d32, d.threshold << 16);
  const auto block = static_cast<std::uint64_t>(j0 / core::kDropoutKeys);
  // The high 32-bit word of each 64-bit lane moved to the low one, where MulEven and the xors
  // read it: a shuffle, which runs beside the multiplies (a shift by 32 would share their port
  // on AVX-512). The high word then holds the old low one, which nothing reads.
  const auto swap_halves = [&](V64 v) {
    return hn::BitCast(d64, hn::Shuffle2301(hn::BitCast(d32, v)));
  };
  const auto seed0 = static_cast<std::uint32_t>(d.seed);
  const auto seed1 = static_cast<std::uint32_t>(d.seed >> 32);
  // The round keys, in memory: the rounds read them as broadcast operands rather than
  // holding 16 vectors in registers.
  std::uint64_t keys[2][core::kPhiloxRounds];
  for (int round = 0; round < core::kPhiloxRounds; ++round) {
    keys[0][round] = static_cast<std::uint32_t>(seed0 + static_cast<std::uint32_t>(round) *
                                                            core::kPhiloxW0);
    keys[1][round] = static_cast<std::uint32_t>(seed1 + static_cast<std::uint32_t>(round) *
                                                            core::kPhiloxW1);
  }
  // Each row's own words of rounds 1 and 2 (philox_row_words), for up to kWordRows rows at a
  // time, computed once for all the calls' lane groups.
  constexpr std::int64_t kWordRows = 64;
  std::uint64_t row_c0[kWordRows], row_c2[kWordRows], row_c3[kWordRows];
  for (std::int64_t k0 = 0; k0 < count; k0 += kWordRows) {
    const std::int64_t k1 = std::min(count, k0 + kWordRows);
    for (std::int64_t k = k0; k < k1; ++k) {
      const PhiloxRowWords own = philox_row_words(d, head_word[k], i[k]);
      row_c0[k - k0] = own.c0_xor;
      row_c2[k - k0] = own.c2_xor;
      row_c3[k - k0] = own.c3;
    }
    for (std::int64_t g = 0; g < core::kDropoutCalls / n64; ++g) {
      const V64 calls = hn::Add(
          hn::Iota(d64, 0),
          hn::Set(d64, (block * core::kDropoutCalls + static_cast<std::uint64_t>(g * n64)) &
                           0xFFFFFFFFull));
      // Round 1's lane-wise words (c2 = hi(M0·call) ^ offset ^ key 1, c3 = lo(M0·call)), then
      // round 2's (hi and lo of M1·c2); the high halves of the lanes are garbage MulEven ignores.
      const V64 r1p0 = hn::MulEven(hn::BitCast(d32, calls), m0);
      const V64 r1c2 = hn::Xor(hn::ShiftRight<32>(r1p0), hn::Set(d64, d.offset ^ seed1));
      const V64 r2p1 = hn::MulEven(hn::BitCast(d32, r1c2), m1);
      const V64 r2p1_hi = hn::ShiftRight<32>(r2p1);
      // RR rows from row k on: their rounds 3-10 interleaved, then their weights.
      const auto run = [&]<int RR>(std::int64_t k) {
        V64 c0[RR], c1[RR], c2[RR], c3[RR];
        for (int r = 0; r < RR; ++r) {
          // Broadcast from memory: a load, where a broadcast from a general register takes the
          // vector shuffle port.
          c0[r] = hn::Xor(r2p1_hi, hn::Set(d64, row_c0[k - k0 + r]));
          c1[r] = r2p1;
          c2[r] = hn::Xor(r1p0, hn::Set(d64, row_c2[k - k0 + r]));
          c3[r] = hn::Set(d64, row_c3[k - k0 + r]);
        }
        for (int round = 2; round + 1 < core::kPhiloxRounds; ++round) {
          const V64 key0 = hn::Set(d64, keys[0][round]), key1 = hn::Set(d64, keys[1][round]);
          for (int r = 0; r < RR; ++r) {
            const V64 p0 = hn::MulEven(hn::BitCast(d32, c0[r]), m0);
            const V64 p1 = hn::MulEven(hn::BitCast(d32, c2[r]), m1);
            // Xor3: one vpternlog on AVX-512.
            c0[r] = hn::Xor3(swap_halves(p1), c1[r], key0);
            c1[r] = p1;
            c2[r] = hn::Xor3(swap_halves(p0), c3[r], key1);
            c3[r] = p0;
          }
        }
        const V64 key0 = hn::Set(d64, keys[0][core::kPhiloxRounds - 1]);
        const V64 key1 = hn::Set(d64, keys[1][core::kPhiloxRounds - 1]);
        for (int r = 0; r < RR; ++r) {
          // The last round, its output words packed as it goes: (w0 | w1 << 32) and
          // (w2 | w3 << 32).
          const V64 p0 = hn::MulEven(hn::BitCast(d32, c0[r]), m0);
          const V64 p1 = hn::MulEven(hn::BitCast(d32, c2[r]), m1);
          const auto w01 = last_round_words(d32, swap_halves(p1), c1[r], key0);
          const auto w23 = last_round_words(d32, swap_halves(p0), c3[r], key1);
          sink(d32, k + r, g * n32, hn::Lt(hn::And(w01, half), threshold));
          sink(d32, k + r, 16 + g * n32, hn::Lt(w01, threshold_high));
          sink(d32, k + r, 32 + g * n32, hn::Lt(hn::And(w23, half), threshold));
          sink(d32, k + r, 48 + g * n32, hn::Lt(w23, threshold_high));
        }
      };
      std::int64_t k = k0;
      for (; k + kDropRows <= k1; k += kDropRows) run.template operator()<kDropRows>(k);
      for (; k < k1; ++k) run.template operator()<1>(k);
    }
  }
#endif
}

HWY_INLINE void row64(const core::Dropout& d, std::uint32_t head_word, std::int64_t i,
                      std::int64_t j0, float* HWY_RESTRICT s) {
  rows64(d, 1, &head_word, &i, j0,
         ScaleWeights{s, core::kDropoutKeys, static_cast<float>(d.keep_scale)});
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
