// The bf16 path of the fused kernel on AMX tiles (amx_tiles.h): Bf16Micro's operands, in the
// same packed layouts (fused_bf16-inl.h, Bf16Tiles), multiplied as tdpbf16ps tile products.
// Included by attention_fwd_fused_hwy.cc after fused_bf16-inl.h, inside its per-target
// namespace on the x86 AVX-512 targets only (no include guard), and run for bf16 calls where
// amx_bf16_supported() and the head dim d is a multiple of 32 (d/2 pairs, whole tiles of 16:
// the reduction of S = Q·K^T must be whole tiles, and the packed Q rows and K^T tiles have no
// padding to read beyond). The layouts already are what tdpbf16ps reads:
//
//   S = Q·K^T   A: the group's Q rows (pairs over d, d/2 words a row)
//               B: the K^T tile (word (c, j): pair c of key j; 64 words a row)
//   o += P·V    A: the group's P rows rounded to bf16 (pairs of keys, 32 words a row)
//               B: the V tile (word (j, c): keys 2j and 2j + 1 of column c; ldv words a row)
//
// A row group is 32 rows (kRows 8: the driver's groups are 4·kRows), two tiles of C high; S is
// scaled and its row max taken in one pass over the group's scores after the product (the
// group's 32 x 64 floats stay in L1), and o is scaled by the softmax's alpha before P·V adds
// into it. P's columns past the tile's allowed keys are zeroed as P is rounded: the product
// runs over whole tiles of 16 key pairs, and those keys' V rows may be real ones (causal). The
// online softmax, masking, score modifiers and dropout are the driver's and HwyMicro's, as on
// the vdpbf16ps path. tdpbf16ps reads subnormal operands as zero and flushes subnormal sums,
// as vdpbf16ps reads its operands; a tile's products do not depend on the thread count.

#pragma GCC push_options
#pragma GCC target("avx512bf16")

struct AmxMicro : Bf16Micro {
  static constexpr int kRows = 8;  // the driver's row group: 4·kRows = 32 rows, two C tiles
  static constexpr std::int64_t kGroupRows = 4 * kRows;
  // Q rows past the last group's that its A tiles may read (amx_gemm_bf16 reads whole tiles
  // of 16 rows and drops what the spare ones give): the worker's packed Q has this many more.
  static constexpr std::int64_t kSpareRows = kAmxTile;
  using Session = AmxTileSession;  // each worker's tiles, configured while it lives

  static const std::uint32_t* words(const std::uint16_t* p) noexcept { return amx_words(p); }

  static void scores(const std::uint16_t* q, std::int64_t rows, std::int64_t d,
                     const std::uint16_t* kt, std::int64_t keys, float scale, float* s,
                     float* row_max) noexcept {
    // The columns Bf16Micro computes: whole vectors of 16 keys.
    const std::int64_t cols = (keys + kLanes - 1) / kLanes * kLanes;
    amx_gemm_bf16(rows, cols, d / 2, words(q), d / 2, words(kt), kTile, s, kTile, false);
    const D df;
    const V vs = hn::Set(df, scale);
    for (std::int64_t r = 0; r < rows; ++r) {
      float* sr = s + r * kTile;
      V m = hn::Set(df, -fused::kInfF);
      for (std::int64_t c = 0; c < cols; c += kLanes) {
        const V x = hn::Mul(hn::Load(df, sr + c), vs);
        hn::Store(x, df, sr + c);
        m = hn::Max(m, x);
      }
      row_max[r] = hn::GetLane(hn::MaxOfLanes(df, m));
    }
  }

  // o = alpha·o + P·V over the first bk keys.
  static void accumulate_pv(const float* p, std::int64_t rows, std::int64_t bk,
                            const std::uint16_t* v, std::int64_t ldv, std::int64_t dvp,
                            const float* alpha, float* o) noexcept {
    alignas(64) std::uint16_t pb[kGroupRows * kTile];
    const std::int64_t k2 = amx_whole_tiles((bk + 1) / 2);
    const auto live = [&](std::int64_t j) -> __mmask16 {
      const std::int64_t left = bk - j;
      return left >= kLanes ? __mmask16{0xffff}
             : left <= 0    ? __mmask16{0}
                            : static_cast<__mmask16>((1u << left) - 1u);
    };
    const D df;
    for (std::int64_t r0 = 0; r0 < rows; r0 += kGroupRows) {
      const std::int64_t nr = std::min(kGroupRows, rows - r0);
      for (std::int64_t r = 0; r < nr; ++r) {
        const float* pr = p + (r0 + r) * kTile;
        for (std::int64_t j = 0; j < kTile; j += kLanes) {
          const __m256i x = bf16::round16(_mm512_maskz_loadu_ps(live(j), pr + j));
          _mm256_store_si256(reinterpret_cast<__m256i*>(pb + r * kTile + j), x);
        }
        float* orow = o + (r0 + r) * dvp;
        const V a = hn::Set(df, alpha[r0 + r]);
        for (std::int64_t c = 0; c < dvp; c += kLanes) {
          hn::Store(hn::Mul(hn::Load(df, orow + c), a), df, orow + c);
        }
      }
      amx_gemm_bf16(nr, dvp, k2, words(pb), kTile / 2, words(v), ldv, o + r0 * dvp, dvp, true);
    }
  }
};

#pragma GCC pop_options
