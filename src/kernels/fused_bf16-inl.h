// The bf16 path of the fused kernel: the micro-kernels and the packing that feed AVX512-BF16's
// vdpbf16ps, for calls whose compute type is bf16 (options.dtype, or Q, K, V all stored bf16).
// Included by attention_fwd_fused_hwy.cc inside its per-target namespace, after HwyMicro, on
// the x86 AVX-512 targets only (no include guard: each such target includes it once). The loop
// nest, the online softmax on the float32 score tile, masking and the weights are the driver's
// (fused_driver-inl.h), shared with the float32 path; only the operands and the two products
// change:
//
//   vdpbf16ps acc, a, b: for each 32-bit lane l, acc[l] += a[2l]·b[2l] + a[2l+1]·b[2l+1], the
//   bf16 products exact in float32 and accumulated in float32: 64 flops per 512-bit instruction,
//   twice an FMA's 32. It treats subnormal operands (below 2^-126) as zero and flushes subnormal
//   results, as vcvtne2ps2bf16 does below: terms that small change no float32 score or output
//   beyond its last bits.
//
//   Q     rows of dp = d rounded up to even bf16 values (a zero after an odd d): each 32-bit
//         word is a pair (q[2c], q[2c+1]), broadcast to every lane.
//   K^T   tiles of [dp/2 x 64] words: word (c, j) holds (k_j[2c], k_j[2c+1]), so the 64 keys
//         of pair c are 4 vectors, one key per lane. S = Q·K^T is then the float32 micro-kernel's
//         6-row x 4-vector block with a pair of head-dim elements per step: d/2 steps.
//   S     float32, scaled and its row max taken in registers; the driver masks it and runs the
//         online softmax on it exactly as on the float32 path (the score modifiers too).
//   P     each group's rows rounded to bf16 (vcvtne2ps2bf16, round to nearest even; its flush of
//         subnormal P below 2^-126 to zero changes sums by less than that), in key order, so
//         word j holds (p[2j], p[2j+1]); the running sum l adds the float32 P.
//   V     tiles of [32 x dvp] words: word (j, c) holds (v_{2j}[c], v_{2j+1}[c]), so a row of
//         o takes one broadcast P pair per 2 keys: o = alpha·o + P·V in a 6-row x 4-vector
//         block, 32 steps per 64-key tile.
//
// Why pairs on both sides: vdpbf16ps reduces within a lane, so the reduction index (head dim for
// q·k, key for P·V) must be the pair; keeping the other index across lanes keeps the float32
// kernel's register blocking and its loads per product (4 vector + 6 broadcast loads per 24
// instructions), at twice the flops each. Operands are rounded once, when packed (RNE, as
// core::float_to_bf16; float64 through core::narrow_to_odd so that it rounds once): no
// float32 copy of Q, K or V exists, and the packed K^T and V take half the float32 path's memory.
//
// These functions are compiled with AVX512-BF16 on top of the target's AVX-512 and run only
// where the CPU has it (bf16_dots_supported()); the driver calls them per tile, not inlined.

#pragma GCC push_options
#pragma GCC target("avx512bf16")

#include "kernels/bf16_pairs-inl.h"

// The packed-operand policy (see fused_tiles.h) of the bf16 path: the layouts above.
struct Bf16Tiles {
  using T = std::uint16_t;
  static constexpr bool kReadsInPlace = false;
  static constexpr DType kInPlaceDType = DType::kBF16;  // unused: nothing is read in place
  // pack_v writes every word of its tile, padding included: the slots need no zeroing (a 4 MiB
  // memset per call at n = 2048, H = 8, d = 64 was 9 % of the call).
  static constexpr bool kWritesPadding = true;
  // Elements of the stack block pack_kt rounds 16 keys into (d <= 512: 16 KiB).
  static constexpr std::int64_t kPackBlock = 16 * 512;
  static std::int64_t q_row(std::int64_t d) noexcept { return fused::round_up(d, 2); }
  static std::int64_t kt_tile(std::int64_t d) noexcept { return q_row(d) * fused::kKeyTile; }

  static fused::Buffer make(std::int64_t elements, bool zeroed = true) noexcept {
    return fused::make_buffer((elements + 1) / 2, zeroed);
  }
  static T* data(const fused::Buffer& b) noexcept { return reinterpret_cast<T*>(b.get()); }

  // The bf16 path runs only for calls whose storage type is bf16: every operand is rounded to
  // it, whatever `round_to` (the F32Tiles interface) says.
  static void pack_q(const core::InputOperand& op, std::int64_t b, std::int64_t h,
                     std::int64_t row0, std::int64_t rows, std::int64_t cols, T* dst,
                     DType /*round_to*/) noexcept {
    const std::int64_t dp = q_row(cols);
    for (std::int64_t r = 0; r < rows; ++r) {
      bf16::round_row(op, op.strides.at(b, h, row0 + r, 0), op.strides.col, cols, dst + r * dp);
      if (dp != cols) dst[r * dp + cols] = 0;
    }
  }

  // Word (c, j) of the tile = (k_j[2c], k_j[2c + 1]); the tile is zeroed first when short.
  // 16 keys at a time: their rows rounded into a block on the stack, then each pair's 16 words
  // gathered into one 64-byte line of the tile (key by key, every word landed on another line:
  // 3 % of an n = 2048, d = 64 call).
  static void pack_kt(const core::InputOperand& op, std::int64_t b, std::int64_t h,
                      std::int64_t row0, std::int64_t rows, std::int64_t cols, T* dst,
                      DType /*round_to*/) noexcept {
    constexpr std::int64_t kBlock = 16;
    const std::int64_t dp = q_row(cols);
    if (dp * kBlock > kPackBlock) return pack_kt_by_key(op, b, h, row0, rows, cols, dst);
    alignas(64) T block[kPackBlock];
    const __m512i index =
        _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                           _mm512_set1_epi32(static_cast<int>(dp / 2)));
    for (std::int64_t j0 = 0; j0 < rows; j0 += kBlock) {
      const std::int64_t keys = std::min(kBlock, rows - j0);
      for (std::int64_t x = 0; x < keys; ++x) {
        bf16::round_row(op, op.strides.at(b, h, row0 + j0 + x, 0), op.strides.col, cols,
                        block + x * dp);
        if (dp != cols) block[x * dp + cols] = 0;
      }
      const auto live = static_cast<__mmask16>(keys == kBlock ? 0xffffu : (1u << keys) - 1u);
      for (std::int64_t c = 0; c < dp; c += 2) {
        const __m512i words =
            _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, index, block + c, 4);
        _mm512_mask_storeu_epi32(dst + (c / 2 * fused::kKeyTile + j0) * 2, live, words);
      }
    }
  }

  // pack_kt key by key, for head dims beyond the stack block.
  static void pack_kt_by_key(const core::InputOperand& op, std::int64_t b, std::int64_t h,
                             std::int64_t row0, std::int64_t rows, std::int64_t cols,
                             T* dst) noexcept {
    alignas(64) T row[bf16::kChunk];
    for (std::int64_t j = 0; j < rows; ++j) {
      const std::int64_t base = op.strides.at(b, h, row0 + j, 0);
      for (std::int64_t c0 = 0; c0 < cols; c0 += bf16::kChunk) {
        const std::int64_t width = std::min(bf16::kChunk, cols - c0);
        bf16::round_row(op, base + c0 * op.strides.col, op.strides.col, width, row);
        if (width % 2 != 0) row[width] = 0;
        for (std::int64_t c = 0; c < width; c += 2) {
          T* word = dst + ((c0 + c) / 2 * fused::kKeyTile + j) * 2;
          word[0] = row[c];
          word[1] = row[c + 1];
        }
      }
    }
  }

  // Word (j, c) of the 64-key tile at dst = (v_{2j}[c], v_{2j+1}[c]), rows of ldv words; a
  // short tile's last odd key pairs with a zero, and the words beyond its keys and beyond dv
  // are written as zeros.
  static void pack_v(const core::InputOperand& op, std::int64_t b, std::int64_t h,
                     std::int64_t row0, std::int64_t rows, std::int64_t cols, T* dst,
                     std::int64_t ldv, DType /*round_to*/) noexcept {
    alignas(64) T even[bf16::kChunk];
    alignas(64) T odd[bf16::kChunk];
    for (std::int64_t j = 0; j < fused::kKeyTile; j += 2) {
      T* row = dst + j / 2 * ldv * 2;
      if (j >= rows) {
        std::fill(row, row + ldv * 2, T{0});
        continue;
      }
      std::fill(row + cols * 2, row + ldv * 2, T{0});
      for (std::int64_t c0 = 0; c0 < cols; c0 += bf16::kChunk) {
        const std::int64_t width = std::min(bf16::kChunk, cols - c0);
        const std::int64_t col = op.strides.col;
        bf16::round_row(op, op.strides.at(b, h, row0 + j, c0), col, width, even);
        if (j + 1 < rows) {
          bf16::round_row(op, op.strides.at(b, h, row0 + j + 1, c0), col, width, odd);
        } else {
          std::fill(odd, odd + width, T{0});
        }
        T* out = dst + (j / 2 * ldv + c0) * 2;
        for (std::int64_t c = 0; c < width; c += 16) {
          const auto live =
              static_cast<__mmask16>(width - c >= 16 ? 0xffffu : (1u << (width - c)) - 1u);
          const __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(live, even + c));
          const __m512i hi = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(live, odd + c));
          _mm512_mask_storeu_epi32(out + c * 2, live,
                                   _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
        }
      }
    }
  }
};

// The bf16 micro-kernels: scores and accumulate_pv on the pairs above; the softmax steps on the
// float32 score tile (row_max, exp1, exp_accumulate, softmax_rows, exp_scale) are HwyMicro's.
struct Bf16Micro : HwyMicro<float> {
  static constexpr std::int64_t kGroupRows = 4 * kRows;  // the driver's row group

  template <int MR, int NK>
  static HWY_INLINE void scores_block(const std::uint16_t* HWY_RESTRICT q, std::int64_t dp,
                                      const std::uint16_t* HWY_RESTRICT kt, float scale,
                                      float* HWY_RESTRICT s, float* HWY_RESTRICT row_max) {
    __m512 acc[MR][NK];
    for (int r = 0; r < MR; ++r) {
      for (int u = 0; u < NK; ++u) acc[r][u] = _mm512_setzero_ps();
    }
    for (std::int64_t c = 0; c < dp; c += 2) {
      __m512i k[NK];
      for (int u = 0; u < NK; ++u) {
        k[u] = _mm512_loadu_si512(kt + (c / 2 * kTile + u * kLanes) * 2);
      }
      for (int r = 0; r < MR; ++r) {
        const __m512i qr = _mm512_set1_epi32(static_cast<int>(bf16::pair_at(q, r * dp + c)));
        for (int u = 0; u < NK; ++u) {
          acc[r][u] = _mm512_dpbf16_ps(acc[r][u], bf16::as_bh(qr), bf16::as_bh(k[u]));
        }
      }
    }
    const D df;
    const V vs = hn::Set(df, scale);
    for (int r = 0; r < MR; ++r) {
      V m = hn::Set(df, -fused::kInfF);
      for (int u = 0; u < NK; ++u) {
        const V x = hn::Mul(V{acc[r][u]}, vs);
        hn::Store(x, df, s + r * kTile + u * kLanes);
        m = hn::Max(m, x);
      }
      row_max[r] = std::max(row_max[r], hn::GetLane(hn::MaxOfLanes(df, m)));
    }
  }

  template <int MR>
  static HWY_INLINE void scores_rows(const std::uint16_t* q, std::int64_t dp,
                                     const std::uint16_t* kt, std::int64_t vectors, float scale,
                                     float* s, float* row_max) {
    for (int r = 0; r < MR; ++r) row_max[r] = -fused::kInfF;
    std::int64_t u = 0;
    for (; u + kKeyVectors <= vectors; u += kKeyVectors) {
      scores_block<MR, kKeyVectors>(q, dp, kt + u * kLanes * 2, scale, s + u * kLanes, row_max);
    }
    const std::int64_t off = u * kLanes;
    switch (vectors - u) {
      case 3:
        scores_block<MR, 3>(q, dp, kt + off * 2, scale, s + off, row_max);
        break;
      case 2:
        scores_block<MR, 2>(q, dp, kt + off * 2, scale, s + off, row_max);
        break;
      case 1:
        scores_block<MR, 1>(q, dp, kt + off * 2, scale, s + off, row_max);
        break;
      default:
        break;
    }
  }

  // Calls f.template operator()<MR>(r) over the rows in blocks of kRows, then the remainder.
  template <class F>
  static HWY_INLINE void row_blocks(std::int64_t rows, F&& f) {
    std::int64_t r = 0;
    for (; r + kRows <= rows; r += kRows) f.template operator()<kRows>(r);
    switch (rows - r) {
      case 5:
        f.template operator()<5>(r);
        break;
      case 4:
        f.template operator()<4>(r);
        break;
      case 3:
        f.template operator()<3>(r);
        break;
      case 2:
        f.template operator()<2>(r);
        break;
      case 1:
        f.template operator()<1>(r);
        break;
      default:
        break;
    }
  }

  static void scores(const std::uint16_t* q, std::int64_t rows, std::int64_t d,
                     const std::uint16_t* kt, std::int64_t keys, float scale, float* s,
                     float* row_max) noexcept {
    const std::int64_t dp = Bf16Tiles::q_row(d);
    const std::int64_t vectors = (keys + kLanes - 1) / kLanes;
    row_blocks(rows, [&]<int MR>(std::int64_t r) {
      scores_rows<MR>(q + r * dp, dp, kt, vectors, scale, s + r * kTile, row_max + r);
    });
  }

  template <int MR, int NV>
  static HWY_INLINE void pv_block(const std::uint16_t* HWY_RESTRICT p, std::int64_t pairs,
                                  const std::uint16_t* HWY_RESTRICT v, std::int64_t ldv,
                                  std::int64_t dvp, const float* HWY_RESTRICT alpha,
                                  float* HWY_RESTRICT o) {
    __m512 acc[MR][NV];
    for (int r = 0; r < MR; ++r) {
      const __m512 a = _mm512_set1_ps(alpha[r]);
      for (int u = 0; u < NV; ++u) {
        acc[r][u] = _mm512_mul_ps(_mm512_load_ps(o + r * dvp + u * kLanes), a);
      }
    }
    for (std::int64_t j = 0; j < pairs; ++j) {
      __m512i vj[NV];
      for (int u = 0; u < NV; ++u) vj[u] = _mm512_loadu_si512(v + (j * ldv + u * kLanes) * 2);
      for (int r = 0; r < MR; ++r) {
        const __m512i w = _mm512_set1_epi32(static_cast<int>(bf16::pair_at(p, r * kTile + 2 * j)));
        for (int u = 0; u < NV; ++u) {
          acc[r][u] = _mm512_dpbf16_ps(acc[r][u], bf16::as_bh(w), bf16::as_bh(vj[u]));
        }
      }
    }
    for (int r = 0; r < MR; ++r) {
      for (int u = 0; u < NV; ++u) _mm512_store_ps(o + r * dvp + u * kLanes, acc[r][u]);
    }
  }

  template <int MR>
  static HWY_INLINE void pv_rows(const std::uint16_t* p, std::int64_t pairs, const std::uint16_t* v,
                                 std::int64_t ldv, std::int64_t dvp, const float* alpha, float* o) {
    const std::int64_t vectors = dvp / kLanes;
    std::int64_t u = 0;
    for (; u + kKeyVectors <= vectors; u += kKeyVectors) {
      pv_block<MR, kKeyVectors>(p, pairs, v + u * kLanes * 2, ldv, dvp, alpha, o + u * kLanes);
    }
    const std::int64_t off = u * kLanes;
    switch (vectors - u) {
      case 3:
        pv_block<MR, 3>(p, pairs, v + off * 2, ldv, dvp, alpha, o + off);
        break;
      case 2:
        pv_block<MR, 2>(p, pairs, v + off * 2, ldv, dvp, alpha, o + off);
        break;
      case 1:
        pv_block<MR, 1>(p, pairs, v + off * 2, ldv, dvp, alpha, o + off);
        break;
      default:
        break;
    }
  }

  // o = alpha·o + P·V over the first bk keys (rounded up to a pair: the key after a group's
  // last allowed one has P = 0, masked, or is the zero padding of V).
  static void accumulate_pv(const float* p, std::int64_t rows, std::int64_t bk,
                            const std::uint16_t* v, std::int64_t ldv, std::int64_t dvp,
                            const float* alpha, float* o) noexcept {
    alignas(64) std::uint16_t pb[kGroupRows * kTile];
    const std::int64_t pairs = (bk + 1) / 2;
    for (std::int64_t r0 = 0; r0 < rows; r0 += kGroupRows) {
      const std::int64_t nr = std::min(kGroupRows, rows - r0);
      for (std::int64_t r = 0; r < nr; ++r) {
        const float* pr = p + (r0 + r) * kTile;
        for (std::int64_t j = 0; j < kTile; j += 2 * kLanes) {
          const __m512bh x =
              _mm512_cvtne2ps_pbh(_mm512_load_ps(pr + j + kLanes), _mm512_load_ps(pr + j));
          _mm512_store_si512(pb + r * kTile + j, reinterpret_cast<__m512i>(x));
        }
      }
      row_blocks(nr, [&]<int MR>(std::int64_t r) {
        pv_rows<MR>(pb + r * kTile, pairs, v, ldv, dvp, alpha + r0 + r, o + (r0 + r) * dvp);
      });
    }
  }
};

#pragma GCC pop_options
