// The bf16 building blocks both vdpbf16ps paths share (the fused forward's, fused_bf16-inl.h,
// and the backward's, bwd_bf16-inl.h): rounding float32 to bf16 as core::float_to_bf16 does,
// rows of any operand rounded to bf16, and bf16 pairs as the 32-bit words vdpbf16ps reads.
// Included inside a per-target namespace on the x86 AVX-512 targets, within the includer's
// `#pragma GCC target("avx512bf16")` region (no include guard: once per target and includer).

namespace bf16 {

// 16 floats rounded to bf16 exactly as core::float_to_bf16 (to nearest even, a NaN quiet; a
// subnormal rounds like any value, where vcvtneps2bf16 would flush it to zero).
inline __m256i round16(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i high = _mm512_srli_epi32(bits, 16);
  const __m512i bias =
      _mm512_add_epi32(_mm512_and_si512(high, _mm512_set1_epi32(1)), _mm512_set1_epi32(0x7fff));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, bias), 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(
      _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  const __m512i quiet = _mm512_or_si512(high, _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}

// dst[c] = element base + c·col of the operand rounded to bf16, for c < cols.
inline void round_row(const core::InputOperand& op, std::int64_t base, std::int64_t col,
                      std::int64_t cols, std::uint16_t* dst) {
  switch (op.dtype) {
    case DType::kBF16: {
      const auto* in = static_cast<const std::uint16_t*>(op.data) + base;
      if (col == 1) {
        std::memcpy(dst, in, static_cast<std::size_t>(cols) * 2);
      } else {
        for (std::int64_t c = 0; c < cols; ++c) dst[c] = in[c * col];
      }
      return;
    }
    case DType::kF32: {
      const float* in = static_cast<const float*>(op.data) + base;
      if (col != 1) {
        for (std::int64_t c = 0; c < cols; ++c) dst[c] = core::float_to_bf16(in[c * col]);
        return;
      }
      std::int64_t c = 0;
      for (; c + 16 <= cols; c += 16) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + c), round16(_mm512_loadu_ps(in + c)));
      }
      if (c < cols) {
        const auto live = static_cast<__mmask16>((1u << (cols - c)) - 1u);
        _mm256_mask_storeu_epi16(dst + c, live, round16(_mm512_maskz_loadu_ps(live, in + c)));
      }
      return;
    }
    case DType::kF64: {
      const double* in = static_cast<const double*>(op.data) + base;
      for (std::int64_t c = 0; c < cols; ++c) {
        dst[c] = core::float_to_bf16(core::narrow_to_odd(in[c * col]));
      }
      return;
    }
    case DType::kF16: {
      const auto* in = static_cast<const std::uint16_t*>(op.data) + base;
      for (std::int64_t c = 0; c < cols; ++c) {
        dst[c] = core::float_to_bf16(core::f16_to_float(in[c * col]));
      }
      return;
    }
    case DType::kBool:
    case DType::kI32:
    case DType::kI64:
      return;
  }
}

// The 32-bit word at u16 index `at` (even): a bf16 pair.
inline std::uint32_t pair_at(const std::uint16_t* p, std::int64_t at) {
  std::uint32_t w;
  std::memcpy(&w, p + at, 4);
  return w;
}

inline __m512bh as_bh(__m512i x) { return reinterpret_cast<__m512bh>(x); }

// Columns per chunk of a row rounded on the stack while packing K^T and V (any d or dv).
constexpr std::int64_t kChunk = 512;

}  // namespace bf16
