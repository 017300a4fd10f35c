// The bf16 products of the tiled backward on AMX tiles (amx_tiles.h): the Products policy
// (bwd_fused_driver.h; FloatProducts says what each step computes) that attention_bwd_fused_hwy
// runs for bf16 calls where amx_bf16_supported(). Included by attention_bwd_fused_hwy.cc after
// bwd_bf16-inl.h, inside its per-target namespace on the x86 AVX-512 targets only (no include
// guard). The operands are Bf16Products's (Bf16Operands, bwd_bf16-inl.h), rounded the same way
// (Q, K, V and dO once per call, P and dS per tile, to nearest even), and already in the layout
// tdpbf16ps reads, A in pairs along each of its rows and B as pairs of rows, once every
// reduction is padded with zero words to whole tiles of 16 pairs:
//
//   S  = Q·Kᵀ     A: Q rows (pairs over d)           B: Kᵀ pairs over d      (qw x bcp words)
//   dP = dO·Vᵀ    A: dO rows (pairs over dv)         B: Vᵀ pairs over dv     (dow x bcp)
//   dV += Pᵀ·dO   A: Pᵀ rows (pairs of query rows)   B: dO, pairs of query rows
//   dK += dSᵀ·Q   A: dSᵀ rows (pairs of query rows)  B: Q, pairs of query rows
//   dQ  = dS·K    A: dS rows (pairs of keys)         B: K, pairs of keys
//
// Pᵀ and dSᵀ are the one transpose: their pairs of rows (word (i2, j), as Bf16Products makes
// them) turned into rows of words (word (j, i2)), 16 x 16 words at a time in registers. Products are exact
// in float32 and sum in float32 (tdpbf16ps: subnormal operands read as zero, subnormal sums
// flushed); every tile of S, P, dP, dS and the accumulators is float32, as on the other paths.
// A tile's products never depend on the thread count, so neither do the gradients' bits.

#pragma GCC push_options
#pragma GCC target("avx512bf16")

struct AmxProducts : Bf16Cursor {
  using u32 = std::uint32_t;
  using Shared = Bf16Operands;

  static constexpr std::int64_t kTile = kAmxTile;
  static constexpr std::int64_t whole(std::int64_t n) noexcept { return amx_whole_tiles(n); }

  // Bf16Products' operands with every reduction padded to whole tiles, and kTile spare Q and dO
  // rows that the last query tile's A tiles may read.
  static Shared prepare(const core::BackwardParams& bp, const bwd::TilePlan& plan) {
    return Bf16Operands::pack(bp, plan, kTile, kTile);
  }

  static const u32* words(const u16* p) noexcept { return amx_words(p); }

  bwd::Tiles<float>& t;
  AmxTileSession session;  // this worker's tiles, configured while the products live
  // Per query tile: P or dS in pairs of query rows, transposed (rows_t: word (j, i2), aw
  // words a row: A of dV and dK), dS rows (dsr: bcp values a row, A of dQ).
  std::int64_t aw = 0;
  std::vector<u32> rows_t;
  std::vector<u16> dsr;

  AmxProducts(const Shared& shared, const core::BackwardParams& params, const bwd::TilePlan& plan,
              bwd::Tiles<float>& tiles)
      : Bf16Cursor(shared, params), t(tiles), aw(whole((plan.query_tile + 1) / 2)) {
    const auto z = [](std::int64_t n) { return static_cast<std::size_t>(n); };
    rows_t.assign(z(whole(plan.key_tile) * aw), 0);
    dsr.assign(z(whole(plan.query_tile) * t.bcp), 0);
  }

  void scores(float* x) noexcept {
    amx_gemm_bf16(br, t.bcp, sh.qw, words(qa), sh.qw, words(ktp), t.bcp, x, t.bcp, false);
  }
  void dp(float* x) noexcept {
    amx_gemm_bf16(br, t.bcp, sh.dow, words(doa), sh.dow, words(vtp), t.bcp, x, t.bcp, false);
  }

  // The 16 x 16 words of w transposed (w[c] word r becomes w[r] word c): 32-bit unpacks
  // within 128-bit lanes, then the lanes gathered.
  static HWY_INLINE void transpose16(__m512i* w) noexcept {
    __m512i t[16];
    for (int k = 0; k < 8; ++k) {
      t[2 * k] = _mm512_unpacklo_epi32(w[2 * k], w[2 * k + 1]);
      t[2 * k + 1] = _mm512_unpackhi_epi32(w[2 * k], w[2 * k + 1]);
    }
    // u[4k + c]: lane L holds column 4L + c of rows 4k .. 4k + 3.
    __m512i u[16];
    for (int k = 0; k < 4; ++k) {
      u[4 * k] = _mm512_unpacklo_epi64(t[4 * k], t[4 * k + 2]);
      u[4 * k + 1] = _mm512_unpackhi_epi64(t[4 * k], t[4 * k + 2]);
      u[4 * k + 2] = _mm512_unpacklo_epi64(t[4 * k + 1], t[4 * k + 3]);
      u[4 * k + 3] = _mm512_unpackhi_epi64(t[4 * k + 1], t[4 * k + 3]);
    }
    for (int c = 0; c < 4; ++c) {
      const __m512i ab_low = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44);  // a0 a1 b0 b1
      const __m512i ab_high = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xee);
      const __m512i cd_low = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44);
      const __m512i cd_high = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xee);
      w[c] = _mm512_shuffle_i32x4(ab_low, cd_low, 0x88);       // lane 0 of each
      w[4 + c] = _mm512_shuffle_i32x4(ab_low, cd_low, 0xdd);   // lane 1
      w[8 + c] = _mm512_shuffle_i32x4(ab_high, cd_high, 0x88);
      w[12 + c] = _mm512_shuffle_i32x4(ab_high, cd_high, 0xdd);
    }
  }

  // A tile of P or dS (x: br rows of bcp floats) rounded to bf16 and transposed into pairs of
  // query rows: rows_t word (j, i2) = (x[2i2][j], x[2i2 + 1][j]), for keys j < bc (rounded up
  // to 16: the product reads whole tiles and drops what rows past bc give), an odd last row
  // paired with zero, zero words to the next whole tile of pairs (the reduction's padding,
  // returned). With `rows`, x's rows rounded to bf16 too (bcp values a row, columns past bc
  // zeroed: they meet K's zero padding in dQ's product and must be finite). Built 16 x 16
  // words at a time in registers.
  std::int64_t pair_transposed(const float* x, u16* rows) noexcept {
    const std::int64_t ld = t.bcp;
    const std::int64_t h2 = (br + 1) / 2;
    const std::int64_t k2 = whole(h2);
    for (std::int64_t i0 = 0; i0 < k2; i0 += kTile) {
      for (std::int64_t j0 = 0; j0 < bc; j0 += kTile) {
        __m512i w[kTile];
        for (std::int64_t u = 0; u < kTile; ++u) {
          const std::int64_t i2 = i0 + u;
          if (i2 >= h2) {
            w[u] = _mm512_setzero_si512();
            continue;
          }
          const std::int64_t lo_row = 2 * i2;
          const __m256i lo = bf16::round16(_mm512_loadu_ps(x + lo_row * ld + j0));
          const __m256i hi = lo_row + 1 < br
                                 ? bf16::round16(_mm512_loadu_ps(x + (lo_row + 1) * ld + j0))
                                 : _mm256_setzero_si256();
          if (rows != nullptr) {
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(rows + lo_row * ld + j0), lo);
            if (lo_row + 1 < br) {
              _mm256_storeu_si256(reinterpret_cast<__m256i*>(rows + (lo_row + 1) * ld + j0), hi);
            }
          }
          w[u] = _mm512_or_si512(_mm512_cvtepu16_epi32(lo),
                                 _mm512_slli_epi32(_mm512_cvtepu16_epi32(hi), 16));
        }
        transpose16(w);
        for (std::int64_t v = 0; v < kTile; ++v) {
          _mm512_storeu_si512(rows_t.data() + (j0 + v) * aw + i0, w[v]);
        }
      }
    }
    if (rows != nullptr && bc < ld) {
      for (std::int64_t i = 0; i < br; ++i) std::fill(rows + i * ld + bc, rows + (i + 1) * ld, u16{0});
    }
    return k2;
  }

  // dV_j += Pᵀ·dO_i.
  HWY_NOINLINE void add_dv(const float* pv) noexcept {
    const std::int64_t k2 = pair_transposed(pv, nullptr);
    amx_gemm_bf16(bc, t.dvp, k2, rows_t.data(), aw, words(dob), sh.dvp, t.dv.data(), t.dvp,
                  true);
  }
  // dK_j += dSᵀ·Q_i; the dQ tile = dS·K_j.
  HWY_NOINLINE void add_dk_dq(float* ds) noexcept {
    const std::int64_t k2 = pair_transposed(ds, dsr.data());
    amx_gemm_bf16(bc, t.dp, k2, rows_t.data(), aw, words(qb), sh.dp, t.dk.data(), t.dp, true);
    amx_gemm_bf16(br, t.dp, whole((bc + 1) / 2), words(dsr.data()), t.bcp / 2, words(kp), sh.dp,
                  t.dq.data(), t.dp, false);
  }
};

#pragma GCC pop_options
