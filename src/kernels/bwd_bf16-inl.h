// The bf16 products of the tiled backward on AVX512-BF16 (vdpbf16ps): the Products policy
// (bwd_fused_driver.h, FloatProducts says what each step computes) that attention_bwd_fused_hwy
// runs for bf16 calls on CPUs with AVX512-BF16. Included by attention_bwd_fused_hwy.cc inside
// its per-target namespace on the x86 AVX-512 targets only (no include guard). The loop nest,
// the row statistics, the weights, dropout, dS and every float32 tile are the driver's, shared
// with the float32 path; only the five products and their operands change (FlashAttention-2's
// bf16 backward):
//
//   S  = Q·Kᵀ     A: Q rows in bf16 (word c2 = (q[2c2], q[2c2+1]))  B: Kᵀ pairs over d
//   dP = dO·Vᵀ    A: dO rows in bf16                                B: Vᵀ pairs over dv
//   dV += Pᵀ·dO   A: P rounded to bf16, pairs of query rows          B: dO, pairs of query rows
//   dK += dSᵀ·Q   A: dS rounded to bf16, pairs of query rows         B: Q, pairs of query rows
//   dQ  = dS·K    A: dS rows rounded to bf16 (pairs of keys)         B: K, pairs of keys
//
// vdpbf16ps reduces within a 32-bit lane, so each product's reduction index (head dim, query
// row or key) runs along the pairs of a word, on both sides, and the other index of B across
// the lanes: one micro-kernel (gemm below, the forward's 6-row x 4-vector register block,
// fused_bf16-inl.h) serves all five, with A read through strides in words (so Pᵀ and dSᵀ are
// strides of the pair-of-rows layout, never transposes). Products are exact in float32 and
// accumulate in float32; S, P, dP, dS and the gradients' accumulators are float32; P and dS are
// rounded to bf16 (nearest even, as core::float_to_bf16) only as operands. vdpbf16ps reads
// subnormal operands (below 2^-126) as zero: terms that small change no float32 sum beyond its
// last bits.
//
// Packing: Q and dO once per call, as rows and as pairs of rows (four bf16 copies, together the
// bytes of float32 Q and dO); K and V once per key tile (Kᵀ and Vᵀ pairs over the head dim, K
// pairs of keys), shared by the group's query heads and every query tile; P and dS per tile, in
// 16-lane vectors (round16). Query tiles start at even rows, so a tile's pairs are whole pairs
// of the call's; an odd last row pairs with zero.

#pragma GCC push_options
#pragma GCC target("avx512bf16")

#include "kernels/bf16_pairs-inl.h"

namespace bwd_bf16 {

using u16 = std::uint16_t;

// Rows [0, rows) of a float32 tile (ld floats a row, cols a whole number of 16-float vectors)
// rounded to bf16 and paired: word (r2, c) = (x[2r2][c], x[2r2 + 1][c]) at out + (r2·ldo + c)
// words; an odd last row pairs with zero. With `rounded`, the rows themselves in bf16 too
// (rounded[r·cols + c]), from the same roundings: dS enters dK's product as pairs of rows and
// dQ's as rows.
inline void pair_rows(const float* x, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                      u16* out, std::int64_t ldo, u16* rounded = nullptr) {
  for (std::int64_t r = 0; r < rows; r += 2) {
    const float* lo = x + r * ld;
    const float* hi = x + (r + 1) * ld;
    const bool pair = r + 1 < rows;
    u16* dst = out + r / 2 * ldo * 2;
    for (std::int64_t c = 0; c < cols; c += 16) {
      const __m256i a16 = bf16::round16(_mm512_loadu_ps(lo + c));
      const __m256i b16 = pair ? bf16::round16(_mm512_loadu_ps(hi + c)) : _mm256_setzero_si256();
      if (rounded != nullptr) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(rounded + r * cols + c), a16);
        if (pair) {
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(rounded + (r + 1) * cols + c), b16);
        }
      }
      const __m512i a = _mm512_cvtepu16_epi32(a16);
      const __m512i b = _mm512_cvtepu16_epi32(b16);
      _mm512_storeu_si512(dst + c * 2, _mm512_or_si512(a, _mm512_slli_epi32(b, 16)));
    }
  }
}

// The same from bf16 rows (u16, ld a row): no rounding; columns [cols, width) are zeros.
inline void pair_rows(const u16* x, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                      u16* out, std::int64_t width) {
  for (std::int64_t r = 0; r < rows; r += 2) {
    const u16* lo = x + r * ld;
    const u16* hi = x + (r + 1) * ld;
    u16* dst = out + r / 2 * width * 2;
    for (std::int64_t c = 0; c < width; ++c) {
      dst[2 * c] = c < cols ? lo[c] : u16{0};
      dst[2 * c + 1] = c < cols && r + 1 < rows ? hi[c] : u16{0};
    }
  }
}

// C (m x n floats, ldc) (+)= A·B over k2 pairs: A(r, x) is the word at a + (r·ars + x·axs)
// words, B(x, col) the word at b + (x·ldb + col) words; n is a whole number of 16-lane vectors.
struct Gemm {
  static constexpr int kRows = 6;
  static constexpr int kVectors = 4;

  template <int MR, int NV>
  static HWY_INLINE void block(std::int64_t k2, const u16* HWY_RESTRICT a, std::int64_t ars,
                               std::int64_t axs, const u16* HWY_RESTRICT b, std::int64_t ldb,
                               float* HWY_RESTRICT c, std::int64_t ldc, bool accumulate) {
    __m512 acc[MR][NV];
    for (int r = 0; r < MR; ++r) {
      for (int u = 0; u < NV; ++u) {
        acc[r][u] = accumulate ? _mm512_loadu_ps(c + r * ldc + u * 16) : _mm512_setzero_ps();
      }
    }
    for (std::int64_t x = 0; x < k2; ++x) {
      __m512i bv[NV];
      for (int u = 0; u < NV; ++u) bv[u] = _mm512_loadu_si512(b + (x * ldb + u * 16) * 2);
      for (int r = 0; r < MR; ++r) {
        const __m512i ar =
            _mm512_set1_epi32(static_cast<int>(bf16::pair_at(a, (r * ars + x * axs) * 2)));
        for (int u = 0; u < NV; ++u) {
          acc[r][u] = _mm512_dpbf16_ps(acc[r][u], bf16::as_bh(ar), bf16::as_bh(bv[u]));
        }
      }
    }
    for (int r = 0; r < MR; ++r) {
      for (int u = 0; u < NV; ++u) _mm512_storeu_ps(c + r * ldc + u * 16, acc[r][u]);
    }
  }

  template <int NV>
  static HWY_INLINE void rows(std::int64_t m, std::int64_t k2, const u16* a, std::int64_t ars,
                              std::int64_t axs, const u16* b, std::int64_t ldb, float* c,
                              std::int64_t ldc, bool accumulate) {
    std::int64_t r = 0;
    for (; r + kRows <= m; r += kRows) {
      block<kRows, NV>(k2, a + r * ars * 2, ars, axs, b, ldb, c + r * ldc, ldc, accumulate);
    }
    const u16* ar = a + r * ars * 2;
    float* cr = c + r * ldc;
    switch (m - r) {
      case 5: return block<5, NV>(k2, ar, ars, axs, b, ldb, cr, ldc, accumulate);
      case 4: return block<4, NV>(k2, ar, ars, axs, b, ldb, cr, ldc, accumulate);
      case 3: return block<3, NV>(k2, ar, ars, axs, b, ldb, cr, ldc, accumulate);
      case 2: return block<2, NV>(k2, ar, ars, axs, b, ldb, cr, ldc, accumulate);
      case 1: return block<1, NV>(k2, ar, ars, axs, b, ldb, cr, ldc, accumulate);
      default: return;
    }
  }

  static HWY_NOINLINE void run(std::int64_t m, std::int64_t n, std::int64_t k2, const u16* a,
                               std::int64_t ars, std::int64_t axs, const u16* b,
                               std::int64_t ldb, float* c, std::int64_t ldc, bool accumulate) {
    if (m == 0 || n == 0) return;
    if (k2 == 0) {  // an empty sum: A and B may be empty buffers
      if (!accumulate) {
        for (std::int64_t r = 0; r < m; ++r) std::fill_n(c + r * ldc, n, 0.0f);
      }
      return;
    }
    std::int64_t col = 0;
    for (; col + kVectors * 16 <= n; col += kVectors * 16) {
      rows<kVectors>(m, k2, a, ars, axs, b + col * 2, ldb, c + col, ldc, accumulate);
    }
    switch ((n - col) / 16) {
      case 3: return rows<3>(m, k2, a, ars, axs, b + col * 2, ldb, c + col, ldc, accumulate);
      case 2: return rows<2>(m, k2, a, ars, axs, b + col * 2, ldb, c + col, ldc, accumulate);
      case 1: return rows<1>(m, k2, a, ars, axs, b + col * 2, ldb, c + col, ldc, accumulate);
      default: return;
    }
  }
};

}  // namespace bwd_bf16

// The whole call's operands in bf16, packed once (both products policies on bf16 pairs read
// them, Bf16Products and AmxProducts, for every tile): Q and dO as rows (qr, dor: row (b, h, i)
// of `qw` / `dow` words) and as pairs of rows per (b, h) (qp, dop: `pairs` rows per (b, h) of
// `dp` / `dvp` words, c the padded head dim: the float32 tiles' widths, so the products write
// whole vectors); per (b, hk, key tile): Kᵀ and Vᵀ pairs over the head dim (ktp, vtp: word
// (c2, j), qw / dow rows of bcp words) and K as pairs of keys (kp: word (j2, c), dp words a row).
// pack's `tile` pads every reduction to whole tiles of that many pairs (AMX: 16; vdpbf16ps: 1,
// none) with zero words: the words of a Q or dO row, the pairs of query rows per (b, h), the
// pairs of keys per key tile; `spare_rows` more Q and dO rows at the end (zeros) may be read.
struct Bf16Operands {
  using u16 = std::uint16_t;
  std::int64_t qw = 0, dow = 0, dp = 0, dvp = 0, pairs = 0, bcp = 0, key_tile = 1, key_tiles = 0;
  std::int64_t kt_words = 0, vt_words = 0, kp_words = 0;  // per key tile
  // The seven arrays are parts of one zeroed block (fused::make_buffer): a block of 4 MiB or
  // more comes from the huge-buffer cache (huge_buffer_cache.cc), so the next call of the
  // shape packs into pages already mapped. Fresh, its 28 MiB (n = 2048, d = 128, H = 8) cost
  // ~5 % of a 2-thread call in page faults and the kernel's zeroing.
  struct Part {
    u16* p = nullptr;
    u16* data() const noexcept { return p; }
  };
  Part qr, dor, qp, dop, ktp, vtp, kp;
  fused::BufferOf<u16> block;

  // Word (c2, j) of `to` (bcp words a row) = (row_j[2c2], row_j[2c2 + 1]) of `rows` (`words`
  // words each); an odd `dim`'s last pair takes a zero, keys [keys, bcp) are zeros.
  static void transpose_pairs(const u16* rows, std::int64_t keys, std::int64_t words,
                              std::int64_t dim, std::int64_t bcp, u16* to) {
    for (std::int64_t c2 = 0; c2 < words; ++c2) {
      u16* out = to + c2 * bcp * 2;
      for (std::int64_t j = 0; j < bcp; ++j) {
        const bool live = j < keys;
        out[2 * j] = live ? rows[(j * words + c2) * 2] : u16{0};
        out[2 * j + 1] = live && 2 * c2 + 1 < dim ? rows[(j * words + c2) * 2 + 1] : u16{0};
      }
    }
  }

  static Bf16Operands pack(const core::BackwardParams& bp, const bwd::TilePlan& plan,
                           std::int64_t tile, std::int64_t spare_rows) {
    const core::AttentionParams& p = bp.forward;
    const core::AttentionShape& s = p.shape;
    const auto whole = [tile](std::int64_t n) { return (n + tile - 1) / tile * tile; };
    Bf16Operands sh;
    sh.qw = whole((s.d + 1) / 2);
    sh.dow = whole((s.dv + 1) / 2);
    sh.dp = bwd::padded<float>(s.d);
    sh.dvp = bwd::padded<float>(s.dv);
    sh.pairs = whole((s.nq + 1) / 2);
    sh.bcp = bwd::padded<float>(plan.key_tile);
    sh.key_tile = plan.key_tile;
    sh.key_tiles = (s.nk + plan.key_tile - 1) / plan.key_tile;
    sh.kt_words = sh.qw * sh.bcp;
    sh.vt_words = sh.dow * sh.bcp;
    sh.kp_words = whole((plan.key_tile + 1) / 2) * sh.dp;
    const auto z = [](std::int64_t n) { return static_cast<std::size_t>(n); };
    const std::int64_t kv_tiles = s.b * s.hkv * sh.key_tiles;
    const std::int64_t heads = s.b * s.h;
    // The parts' sizes in u16, each rounded to whole 64-byte lines.
    const auto line = [](std::int64_t n) { return (n + 31) / 32 * 32; };
    const std::int64_t sizes[] = {line(kv_tiles * sh.kt_words * 2),
                                  line(kv_tiles * sh.vt_words * 2),
                                  line(kv_tiles * sh.kp_words * 2),
                                  line((heads * s.nq + spare_rows) * sh.qw * 2),
                                  line((heads * s.nq + spare_rows) * sh.dow * 2),
                                  line(heads * sh.pairs * sh.dp * 2),
                                  line(heads * sh.pairs * sh.dvp * 2)};
    std::int64_t total = 0;
    for (const std::int64_t n : sizes) total += n;
    sh.block = fused::make_buffer<u16>(total, false);
    if (sh.block == nullptr) throw std::bad_alloc();
    // Zeroed in parallel: the padding the packing below leaves is the reductions' zeros.
    constexpr std::int64_t kZeroChunk = std::int64_t{1} << 19;  // u16: 1 MiB
    core::parallel_for((total + kZeroChunk - 1) / kZeroChunk, p.threads,
                       [&](std::int64_t begin, std::int64_t end) {
                         const std::int64_t first = begin * kZeroChunk;
                         const std::int64_t last = std::min(total, end * kZeroChunk);
                         std::memset(sh.block.get() + first, 0, z(last - first) * sizeof(u16));
                       });
    u16* at = sh.block.get();
    Part* const parts[] = {&sh.ktp, &sh.vtp, &sh.kp, &sh.qr, &sh.dor, &sh.qp, &sh.dop};
    for (std::size_t i = 0; i < std::size(parts); ++i) {
      parts[i]->p = at;
      at += sizes[i];
    }
    core::parallel_for(kv_tiles, p.threads, [&](std::int64_t begin, std::int64_t end) {
      // Zeros past d and dv stay: the reductions' padding.
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
        transpose_pairs(krow.data(), bc, sh.qw, s.d, sh.bcp, sh.ktp.data() + task * sh.kt_words * 2);
        transpose_pairs(vrow.data(), bc, sh.dow, s.dv, sh.bcp,
                        sh.vtp.data() + task * sh.vt_words * 2);
        bwd_bf16::pair_rows(krow.data(), bc, s.d, sh.qw * 2, sh.kp.data() + task * sh.kp_words * 2,
                            sh.dp);
      }
    });
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
};

// Where the current query tile's and key tile's operands are in a Bf16Operands: the part of
// the Products interface (FloatProducts says what each call means) that only moves pointers.
struct Bf16Cursor {
  using u16 = std::uint16_t;
  const Bf16Operands& sh;
  const core::BackwardParams& bp;
  const u16 *qa = nullptr, *doa = nullptr, *qb = nullptr, *dob = nullptr;
  const u16 *ktp = nullptr, *vtp = nullptr, *kp = nullptr;
  std::int64_t br = 0, bc = 0;
  std::int64_t panel_b = 0, panel_hk = 0;

  Bf16Cursor(const Bf16Operands& shared, const core::BackwardParams& params) noexcept
      : sh(shared), bp(params) {}

  void key_tile(std::int64_t b, std::int64_t hk, std::int64_t j0, std::int64_t keys,
                bool /*rows*/) noexcept {
    const core::AttentionShape& s = bp.forward.shape;
    bc = keys;
    const std::int64_t tile = (b * s.hkv + hk) * sh.key_tiles + j0 / sh.key_tile;
    ktp = sh.ktp.data() + tile * sh.kt_words * 2;
    vtp = sh.vtp.data() + tile * sh.vt_words * 2;
    kp = sh.kp.data() + tile * sh.kp_words * 2;
  }

  // The key tiles are packed once per call: these only choose kv head (b, hk) and point at its
  // tile (bwd_row_panel_driver.h).
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
};

struct Bf16Products : Bf16Cursor {
  using Shared = Bf16Operands;
  static Shared prepare(const core::BackwardParams& bp, const bwd::TilePlan& plan) {
    return Bf16Operands::pack(bp, plan, 1, 0);
  }

  bwd::Tiles<float>& t;
  // Per query tile: P and dS as pairs of query rows (word (i2, j), t.bcp words a row), dS
  // rows (t.bcp / 2 words).
  std::vector<u16> pp, dsp, dsr;

  Bf16Products(const Shared& shared, const core::BackwardParams& params,
               const bwd::TilePlan& plan, bwd::Tiles<float>& tiles)
      : Bf16Cursor(shared, params), t(tiles) {
    const auto z = [](std::int64_t n) { return static_cast<std::size_t>(n); };
    const std::int64_t queries = plan.query_tile;
    pp.assign(z((queries + 1) / 2 * t.bcp * 2), 0);
    dsp.assign(z((queries + 1) / 2 * t.bcp * 2), 0);
    dsr.assign(z(queries * t.bcp), 0);
  }

  void scores(float* x) {
    bwd_bf16::Gemm::run(br, t.bcp, sh.qw, qa, sh.qw, 1, ktp, t.bcp, x, t.bcp, false);
  }
  void dp(float* x) {
    bwd_bf16::Gemm::run(br, t.bcp, sh.dow, doa, sh.dow, 1, vtp, t.bcp, x, t.bcp, false);
  }
  // dV_j += Pᵀ·dO_i: A(key j, pair i2) = word (i2, j) of pp.
  HWY_NOINLINE void add_dv(const float* pv) {
    bwd_bf16::pair_rows(pv, br, t.bcp, t.bcp, pp.data(), t.bcp);
    bwd_bf16::Gemm::run(bc, t.dvp, (br + 1) / 2, pp.data(), 1, t.bcp, dob, sh.dvp, t.dv.data(),
                        t.dvp, true);
  }
  // dK_j += dSᵀ·Q_i (A(key j, pair i2) = word (i2, j) of dsp); the dQ tile = dS·K_j (A(row i,
  // pair j2) = word j2 of dS's row i in dsr).
  HWY_NOINLINE void add_dk_dq(float* ds) {
    bwd_bf16::pair_rows(ds, br, t.bcp, t.bcp, dsp.data(), t.bcp, dsr.data());
    bwd_bf16::Gemm::run(bc, t.dp, (br + 1) / 2, dsp.data(), 1, t.bcp, qb, sh.dp, t.dk.data(),
                        t.dp, true);
    bwd_bf16::Gemm::run(br, t.dp, (bc + 1) / 2, dsr.data(), t.bcp / 2, 1, kp, sh.dp,
                        t.dq.data(), t.dp, false);
  }
};

#pragma GCC pop_options
