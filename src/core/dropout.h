// Attention dropout as every kernel draws it: a counter-based generator, so that the mask of a
// weight is a function of where the weight is, never of which thread or tile computed it.
//
//   the weight w_ij of batch b, query head h, query row i, key j is kept with probability
//   1 - p and then multiplied by 1 / (1 - p); dropped weights are 0. O = Σ_j (w_ij·z_ij) v_j
//   with z_ij = keep_ij / (1 - p). The softmax (and lse) is that of the weights before dropout.
//
//   p is rounded to t / 65536 (t = round(p·65536), at most 65535); weight (b, h, i, j) is kept
//   iff its 16-bit draw u_ij >= t, so the keep probability is exactly (65536 - t) / 65536 and
//   the scale 65536 / (65536 - t) makes every kept weight's expectation its own value.
//
//   u_ij comes from Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
//   SC'11; the generator of cuRAND and of FlashAttention's dropout) keyed by the 64-bit seed,
//   with the 128-bit counter
//       (8·(j / 64) + L, i, (b_base + b)·H + h, offset)       (32 bits each, wrapping)
//   where the 64 keys [64·(j/64), 64·(j/64) + 64) share eight calls L = 0..7, each giving four
//   32-bit words, eight 16-bit draws. Key j = 64·(j/64) + 16·v + x (v < 4, x < 16) takes the
//   call L = x / 2, word 2·(v / 2) + x % 2, half v % 2 (low 16 bits for v even). That order
//   puts the draws of 16 adjacent keys in one vector: a SIMD kernel runs the eight calls of a
//   row's tile in the lanes of one vector and compares whole vectors (dropout_hwy-inl.h).
//   b_base is the sequence of a packed batch (the kernels see one sequence at a time as b = 0).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

namespace qkv::core {

// The parameters of dropout at the kernel boundary (AttentionParams::dropout).
struct Dropout {
  std::uint32_t threshold = 0;  // t: drop when u < t; 0: no dropout (every kernel's plain path)
  double keep_scale = 1.0;      // 65536 / (65536 - t)
  std::uint64_t seed = 0;
  std::uint32_t offset = 0;
  std::int64_t batch_base = 0;  // added to b (a packed batch's sequence)
  std::int64_t heads = 1;       // H, for the counter's (b·H + h)

  bool active() const noexcept { return threshold != 0; }
};

inline constexpr std::uint32_t kPhiloxM0 = 0xD2511F53u;
inline constexpr std::uint32_t kPhiloxM1 = 0xCD9E8D57u;
inline constexpr std::uint32_t kPhiloxW0 = 0x9E3779B9u;
inline constexpr std::uint32_t kPhiloxW1 = 0xBB67AE85u;
inline constexpr int kPhiloxRounds = 10;
// Calls per 64 keys, and keys per tile row of draws.
inline constexpr std::int64_t kDropoutCalls = 8;
inline constexpr std::int64_t kDropoutKeys = 64;

// Philox4x32-10: ten rounds of two 32x32 -> 64-bit products, the key bumped by the Weyl
// constants between rounds.
inline std::array<std::uint32_t, 4> philox4x32_10(std::array<std::uint32_t, 4> c,
                                                  std::uint32_t k0, std::uint32_t k1) noexcept {
  for (int round = 0; round < kPhiloxRounds; ++round) {
    const std::uint64_t p0 = std::uint64_t{kPhiloxM0} * c[0];
    const std::uint64_t p1 = std::uint64_t{kPhiloxM1} * c[2];
    c = {static_cast<std::uint32_t>(p1 >> 32) ^ c[1] ^ k0, static_cast<std::uint32_t>(p1),
         static_cast<std::uint32_t>(p0 >> 32) ^ c[3] ^ k1, static_cast<std::uint32_t>(p0)};
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  return c;
}

// The counter's row-independent words for (b, h): (b_base + b)·H + h and the offset.
inline std::uint32_t dropout_head_word(const Dropout& d, std::int64_t b, std::int64_t h) noexcept {
  return static_cast<std::uint32_t>(
      static_cast<std::uint64_t>((d.batch_base + b) * d.heads + h));
}

// u_ij, the 16-bit draw of one weight, straight from the definition above (the reference's).
inline std::uint32_t dropout_draw(const Dropout& d, std::int64_t b, std::int64_t h,
                                  std::int64_t i, std::int64_t j) noexcept {
  const std::int64_t block = j / kDropoutKeys;
  const std::int64_t x = j % 16;
  const std::int64_t v = (j % kDropoutKeys) / 16;
  const std::array<std::uint32_t, 4> c{
      static_cast<std::uint32_t>(static_cast<std::uint64_t>(block * kDropoutCalls + x / 2)),
      static_cast<std::uint32_t>(static_cast<std::uint64_t>(i)), dropout_head_word(d, b, h),
      d.offset};
  const std::array<std::uint32_t, 4> out = philox4x32_10(
      c, static_cast<std::uint32_t>(d.seed), static_cast<std::uint32_t>(d.seed >> 32));
  const std::uint32_t word = out[static_cast<std::size_t>(2 * (v / 2) + x % 2)];
  return v % 2 == 0 ? (word & 0xFFFFu) : (word >> 16);
}

inline bool dropout_keeps(const Dropout& d, std::int64_t b, std::int64_t h, std::int64_t i,
                          std::int64_t j) noexcept {
  return dropout_draw(d, b, h, i, j) >= d.threshold;
}

// The 64 draws of keys [j0, j0 + 64) of row i (j0 a multiple of 64) in eight Philox calls:
// draws[k] is u_{i, j0 + k}. The portable kernels' row at a time.
inline void dropout_draws_row(const Dropout& d, std::uint32_t head_word, std::int64_t i,
                              std::int64_t j0, std::uint32_t* draws) noexcept {
  const auto block = static_cast<std::uint64_t>(j0 / kDropoutKeys);
  for (std::int64_t call = 0; call < kDropoutCalls; ++call) {
    const std::array<std::uint32_t, 4> out = philox4x32_10(
        {static_cast<std::uint32_t>(block * kDropoutCalls + static_cast<std::uint64_t>(call)),
         static_cast<std::uint32_t>(static_cast<std::uint64_t>(i)), head_word, d.offset},
        static_cast<std::uint32_t>(d.seed), static_cast<std::uint32_t>(d.seed >> 32));
    for (std::int64_t w = 0; w < 4; ++w) {
      // word w = 2·(v/2) + x%2 with x = 2·call + x%2: the keys 16·v + x, v ∈ {2·(w/2), +1}.
      const std::uint32_t word = out[static_cast<std::size_t>(w)];
      const std::int64_t x = 2 * call + w % 2;
      const std::int64_t v = 2 * (w / 2);
      draws[16 * v + x] = word & 0xFFFFu;
      draws[16 * (v + 1) + x] = word >> 16;
    }
  }
}

// s[k] := keep ? s[k]·scale : 0 for the keys j0 + k (k < count) of row i, any j0 and count:
// block of 64 keys by block, eight Philox calls each. The portable kernels' way.
template <class F>
inline void dropout_span_scalar(const Dropout& d, std::uint32_t head_word, std::int64_t i,
                                std::int64_t j0, std::int64_t count, F* s) noexcept {
  std::uint32_t draws[kDropoutKeys];
  const auto scale = static_cast<F>(d.keep_scale);
  std::int64_t k = 0;
  while (k < count) {
    const std::int64_t j = j0 + k;
    const std::int64_t block0 = j - j % kDropoutKeys;
    const std::int64_t n = std::min(count - k, block0 + kDropoutKeys - j);
    dropout_draws_row(d, head_word, i, block0, draws);
    const std::uint32_t* u = draws + (j - block0);
    for (std::int64_t x = 0; x < n; ++x) s[k + x] = u[x] >= d.threshold ? s[k + x] * scale : F(0);
    k += n;
  }
}

}  // namespace qkv::core
