// The bf16 products of the tiled backward on AMX tiles (amx_tiles.h): the Products policy
// (bwd_fused_driver.h; FloatProducts says what each step computes) that attention_bwd_fused_hwy
// runs for bf16 calls where amx_bf16_supported(). Included by attention_bwd_fused_hwy.cc after
// bwd_bf16-inl.h, inside its per-target namespace on the x86 AVX-512 targets only (no include
// guard). The operands are Bf16Products's, rounded the same way (Q, K, V and dO once per call,
// P and dS per tile, to nearest even); what changes is their layout, the one tdpbf16ps reads:
// A in pairs along each of its rows, B as pairs of rows, the reduction padded with zero words
// to whole tiles of 16 pairs:
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

struct AmxProducts {
  using u16 = std::uint16_t;
  using u32 = std::uint32_t;

  // Rows of a tile, and pairs (32-bit words) in a tile's row.
  static constexpr std::int64_t kTile = 16;
  static constexpr std::int64_t whole(std::int64_t n) noexcept {
    return (n + kTile - 1) / kTile * kTile;
  }

  // Packed once per call: Q and dO rows (qr, dor: qw / dow words a row, a whole number of
  // tiles, and kTile spare rows at the end that the last query tile's A tiles may read) and
  // pairs of rows per (b, h) (qp, dop: `pairs` rows of dp / dvp words, zero rows to a whole
  // tile); per (b, hk, key tile): Kᵀ and Vᵀ pairs over the head dim (ktp, vtp: qw / dow rows
  // of bcp words) and K as pairs of keys (kp: kp_rows rows of dp words).
  struct Shared {
    std::int64_t qw = 0, dow = 0, dp = 0, dvp = 0, pairs = 0, bcp = 0, kp_rows = 0;
    std::int64_t key_tile = 1, key_tiles = 0, kt_words = 0, vt_words = 0, kp_words = 0;
    std::vector<u16> qr, dor, qp, dop, ktp, vtp, kp;
  };

  static Shared prepare(const core::BackwardParams& bp, const bwd::TilePlan& plan) {
    const core::AttentionParams& p = bp.forward;
    const core::AttentionShape& s = p.shape;
    Shared sh;
    sh.qw = whole((s.d + 1) / 2);
    sh.dow = whole((s.dv + 1) / 2);
    sh.dp = bwd::padded<float>(s.d);
    sh.dvp = bwd::padded<float>(s.dv);
    sh.pairs = whole((s.nq + 1) / 2);
    sh.bcp = bwd::padded<float>(plan.key_tile);
    sh.kp_rows = whole((plan.key_tile + 1) / 2);
    sh.key_tile = plan.key_tile;
    sh.key_tiles = (s.nk + plan.key_tile - 1) / plan.key_tile;
    sh.kt_words = sh.qw * sh.bcp;
    sh.vt_words = sh.dow * sh.bcp;
    sh.kp_words = sh.kp_rows * sh.dp;
    const auto z = [](std::int64_t n) { return static_cast<std::size_t>(n); };
    const std::int64_t kv_tiles = s.b * s.hkv * sh.key_tiles;
    sh.ktp.assign(z(kv_tiles * sh.kt_words * 2), 0);
    sh.vtp.assign(z(kv_tiles * sh.vt_words * 2), 0);
    sh.kp.assign(z(kv_tiles * sh.kp_words * 2), 0);
    core::parallel_for(kv_tiles, p.threads, [&](std::int64_t begin, std::int64_t end) {
      // Zeros past d and dv stay: they are the reduction's padding.
      std::vector<u16> krow(z(plan.key_tile * sh.qw * 2), 0), vrow(z(plan.key_tile * sh.dow * 2), 0);
      for (std::int64_t task = begin; task < end; ++task) {
        const std::int64_t kt = task % sh.key_tiles;
        const std::int64_t hk = (task / sh.key_tiles) % s.hkv;
        const std::int64_t b = task / (sh.key_tiles * s.hkv);
        const std::int64_t j0 = kt * plan.key_tile;
        const std::int64_t bc = std::min(plan.key_tile, s.nk - j0);
        for (std::int64_t j = 0; j < bc; ++j) {
          bf16::round_row(p.k, p.k.strides.at(b, hk, j0 + j, 0), p.k.strides.col, s.d,
                          krow.data() + j * sh.qw * 2);
          bf16::round_row(p.v, p.v.strides.at(b, hk, j0 + j, 0), p.v.strides.col, s.dv,
                          vrow.data() + j * sh.dow * 2);
        }
        Bf16Products::transpose_pairs(krow.data(), bc, sh.qw, s.d, sh.bcp,
                                      sh.ktp.data() + task * sh.kt_words * 2);
        Bf16Products::transpose_pairs(vrow.data(), bc, sh.dow, s.dv, sh.bcp,
                                      sh.vtp.data() + task * sh.vt_words * 2);
        bwd_bf16::pair_rows(krow.data(), bc, s.d, sh.qw * 2,
                            sh.kp.data() + task * sh.kp_words * 2, sh.dp);
      }
    });
    const std::int64_t heads = s.b * s.h;
    sh.qr.assign(z((heads * s.nq + kTile) * sh.qw * 2), 0);
    sh.dor.assign(z((heads * s.nq + kTile) * sh.dow * 2), 0);
    sh.qp.assign(z(heads * sh.pairs * sh.dp * 2), 0);
    sh.dop.assign(z(heads * sh.pairs * sh.dvp * 2), 0);
    core::parallel_for(heads, p.threads, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t bh = begin; bh < end; ++bh) {
        const std::int64_t b = bh / s.h, h = bh % s.h;
        u16* qr = sh.qr.data() + bh * s.nq * sh.qw * 2;
        u16* dor = sh.dor.data() + bh * s.nq * sh.dow * 2;
        for (std::int64_t i = 0; i < s.nq; ++i) {
          bf16::round_row(p.q, p.q.strides.at(b, h, i, 0), p.q.strides.col, s.d,
                          qr + i * sh.qw * 2);
          bf16::round_row(bp.grad_out, bp.grad_out.strides.at(b, h, i, 0),
                          bp.grad_out.strides.col, s.dv, dor + i * sh.dow * 2);
        }
        bwd_bf16::pair_rows(qr, s.nq, s.d, sh.qw * 2, sh.qp.data() + bh * sh.pairs * sh.dp * 2,
                            sh.dp);
        bwd_bf16::pair_rows(dor, s.nq, s.dv, sh.dow * 2,
                            sh.dop.data() + bh * sh.pairs * sh.dvp * 2, sh.dvp);
      }
    });
    return sh;
  }

  static const u32* words(const u16* p) noexcept { return reinterpret_cast<const u32*>(p); }

  const Shared& sh;
  const core::BackwardParams& bp;
  bwd::Tiles<float>& t;
  AmxTileSession session;  // this worker's tiles, configured while the products live
  // Per query tile: P or dS in pairs of query rows, transposed (rows_t: word (j, i2), aw
  // words a row: A of dV and dK), dS rows (dsr: bcp values a row, A of dQ).
  std::int64_t aw = 0;
  std::vector<u32> rows_t;
  std::vector<u16> dsr;
  const u16 *qa = nullptr, *doa = nullptr, *qb = nullptr, *dob = nullptr;
  const u16 *ktp = nullptr, *vtp = nullptr, *kp = nullptr;
  std::int64_t br = 0, bc = 0;
  std::int64_t panel_b = 0, panel_hk = 0;

  AmxProducts(const Shared& shared, const core::BackwardParams& params, const bwd::TilePlan& plan,
              bwd::Tiles<float>& tiles)
      : sh(shared), bp(params), t(tiles), aw(whole((plan.query_tile + 1) / 2)) {
    const auto z = [](std::int64_t n) { return static_cast<std::size_t>(n); };
    rows_t.assign(z(whole(plan.key_tile) * aw), 0);
    dsr.assign(z(whole(plan.query_tile) * t.bcp), 0);
  }

  void key_tile(std::int64_t b, std::int64_t hk, std::int64_t j0, std::int64_t keys,
                bool /*rows*/) noexcept {
    const core::AttentionShape& s = bp.forward.shape;
    bc = keys;
    const std::int64_t tile = (b * s.hkv + hk) * sh.key_tiles + j0 / sh.key_tile;
    ktp = sh.ktp.data() + tile * sh.kt_words * 2;
    vtp = sh.vtp.data() + tile * sh.vt_words * 2;
    kp = sh.kp.data() + tile * sh.kp_words * 2;
  }

  // The key tiles are packed once per call (prepare): these only choose kv head (b, hk) and
  // point at its tile (bwd_row_panel_driver.h).
  void pack_keys(std::int64_t b, std::int64_t hk) noexcept {
    panel_b = b;
    panel_hk = hk;
  }
  void packed_key_tile(std::int64_t tile, std::int64_t count) noexcept {
    key_tile(panel_b, panel_hk, tile * sh.key_tile, count, true);
  }

  void query_tile(std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t rows) noexcept {
    const core::AttentionShape& s = bp.forward.shape;
    br = rows;
    const std::int64_t bh = b * s.h + h;
    qa = sh.qr.data() + (bh * s.nq + i0) * sh.qw * 2;
    doa = sh.dor.data() + (bh * s.nq + i0) * sh.dow * 2;
    qb = sh.qp.data() + (bh * sh.pairs + i0 / 2) * sh.dp * 2;
    dob = sh.dop.data() + (bh * sh.pairs + i0 / 2) * sh.dvp * 2;
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
