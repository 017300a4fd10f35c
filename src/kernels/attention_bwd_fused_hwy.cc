// attention_bwd_fused_hwy: the fused backward's loop nest (bwd_fused_driver.h) in SIMD, one
// dynamic dispatch per call (the loop nest is instantiated once per Highway target).
//
// Its five tile products all take one form, C (+)= A·B with A read through strides (so Pᵀ and
// dSᵀ are strides) and B row-major in whole vectors (the driver packs K, Kᵀ, Vᵀ, Q and dO
// zero-padded to 64 bytes). The micro-kernel below keeps an MR x NV block of C in registers
// (6 rows x 4 vectors on AVX-512: 24 accumulators, 4 B vectors and a broadcast of the 32
// registers; 4 x 2 on 16-register targets), streams x over k with one B row load and MR
// broadcasts of A per step, and touches C once per block: the forward's micro-kernel pattern,
// which runs at the FMA peak from L1. Tiles are 128 query rows x 128 keys while rows of Q, K and
// V take at most 256 bytes (float32 d <= 64): S, dP and the softcap's factor (3 x 64 KiB) and
// the K, Kᵀ, Vᵀ, Q, dO, dK, dV and dQ tiles (8 x 32 KiB) stay within a 1 MiB L2; 64 x 64 for
// wider rows (tile_for). P = exp(min(x - M, 0))/l, with the row's max M and sum l computed
// again by the backward (bwd_row_stats.h), uses the forward's ExpNonPositive (exp_hwy-inl.h):
// the argument is never positive.
//
// Why not CBLAS for the products, as attention_bwd_unfused_blas does: a CBLAS call packs both
// operands every time, which 128 x 128 tiles cannot amortise. Measured on a Zen 5 (n = 2048,
// d = 64, H = 8, one thread, OpenBLAS on its AVX-512 Cooperlake kernels), the same loop nest
// with sgemm tile products ran at 116 GFLOP/s, this one at 135-157 (runs minutes apart on a
// shared machine).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/attention_bwd_fused_hwy.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// After foreach_target.h, which re-includes this file once per target.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <new>
#include <string>

#include "hwy/highway.h"
#include "kernels/amx_tiles.h"
#include "kernels/backward_kernel.h"
#include "kernels/blas_threads.h"
#include "kernels/bwd_fused_driver.h"
#include "kernels/bwd_ops.h"
#include "kernels/dropout_hwy-inl.h"
#include "kernels/exp_hwy-inl.h"
#include "kernels/fused_common.h"
#include "kernels/kernel.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The weights' element-wise steps (bwd_row_stats.h); cols is a whole number of vectors (the
// driver's tiles are padded to 64 bytes). x - shift is a rounded subtraction of its own, never
// fused with the scaling, so the max's own weight is exactly exp(0).
template <class T>
void ScaleRows(T* x, std::int64_t rows, std::int64_t cols, T scale) {
  const hn::ScalableTag<T> d;
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
  const auto vscale = hn::Set(d, scale);
  for (std::int64_t e = 0; e < rows * cols; e += lanes) {
    hn::StoreU(hn::Mul(vscale, hn::LoadU(d, x + e)), d, x + e);
  }
}

template <class T>
void MaxRows(const T* x, std::int64_t rows, std::int64_t cols, T* max) {
  const hn::ScalableTag<T> d;
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
  for (std::int64_t r = 0; r < rows; ++r) {
    auto m = hn::Set(d, -std::numeric_limits<T>::infinity());
    for (std::int64_t c = 0; c < cols; c += lanes) m = hn::Max(m, hn::LoadU(d, x + r * cols + c));
    max[r] = hn::GetLane(hn::MaxOfLanes(d, m));
  }
}

// The sums are float64: summed in float32 lanes, l's and u's rounding tripled dsinks' error
// against the plain composition's. A float32 row is exponentiated in place (the stats pass's
// scratch), then read back as half vectors widened to float64 (e·dP exact in float64).
template <class T>
void ExpSumRows(T* x, const T* dp, std::int64_t rows, std::int64_t cols, const T* shift,
                double* sum, double* dot) {
  const hn::ScalableTag<T> d;
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
  const auto zero = hn::Zero(d);
  const hn::ScalableTag<double> dd;
  const auto wide = static_cast<std::int64_t>(hn::Lanes(dd));
  for (std::int64_t r = 0; r < rows; ++r) {
    T* xr = x + r * cols;
    const T* pr = dp + r * cols;
    const auto vs = hn::Set(d, shift[r]);
    if constexpr (sizeof(T) == 8) {
      auto total = zero, weighted = zero;
      for (std::int64_t c = 0; c < cols; c += lanes) {
        const auto e = ExpNonPositive(d, hn::Min(hn::Sub(hn::LoadU(d, xr + c), vs), zero));
        total = hn::Add(total, e);
        weighted = hn::MulAdd(e, hn::LoadU(d, pr + c), weighted);
      }
      sum[r] = hn::GetLane(hn::SumOfLanes(d, total));
      dot[r] = hn::GetLane(hn::SumOfLanes(d, weighted));
    } else {
      for (std::int64_t c = 0; c < cols; c += lanes) {
        const auto e = ExpNonPositive(d, hn::Min(hn::Sub(hn::LoadU(d, xr + c), vs), zero));
        hn::StoreU(e, d, xr + c);
      }
      const hn::Rebind<float, decltype(dd)> dh;
      auto total = hn::Zero(dd), weighted = hn::Zero(dd);
      for (std::int64_t c = 0; c < cols; c += wide) {
        const auto e = hn::PromoteTo(dd, hn::LoadU(dh, xr + c));
        total = hn::Add(total, e);
        weighted = hn::MulAdd(e, hn::PromoteTo(dd, hn::LoadU(dh, pr + c)), weighted);
      }
      sum[r] = hn::GetLane(hn::SumOfLanes(dd, total));
      dot[r] = hn::GetLane(hn::SumOfLanes(dd, weighted));
    }
  }
}

template <class T>
void WeighRows(T* x, std::int64_t rows, std::int64_t cols, const T* shift, const T* inv) {
  const hn::ScalableTag<T> d;
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
  const auto zero = hn::Zero(d);
  for (std::int64_t r = 0; r < rows; ++r) {
    T* row = x + r * cols;
    const auto vs = hn::Set(d, shift[r]);
    const auto vinv = hn::Set(d, inv[r]);
    for (std::int64_t c = 0; c < cols; c += lanes) {
      const auto arg = hn::Min(hn::Sub(hn::LoadU(d, row + c), vs), zero);
      hn::StoreU(hn::Mul(ExpNonPositive(d, arg), vinv), d, row + c);
    }
  }
}

#define QKV_ROWS_EXPORTS(T, N)                                                                \
  void ScaleRows##N(T* x, std::int64_t rows, std::int64_t cols, T scale) {                    \
    ScaleRows(x, rows, cols, scale);                                                          \
  }                                                                                           \
  void MaxRows##N(const T* x, std::int64_t rows, std::int64_t cols, T* max) {                 \
    MaxRows(x, rows, cols, max);                                                              \
  }                                                                                           \
  void ExpSumRows##N(T* x, T* dp, std::int64_t rows, std::int64_t cols,                       \
                     const T* shift, double* sum, double* dot) {                              \
    ExpSumRows(x, dp, rows, cols, shift, sum, dot);                                           \
  }                                                                                           \
  void WeighRows##N(T* x, std::int64_t rows, std::int64_t cols, const T* shift, const T* inv) { \
    WeighRows(x, rows, cols, shift, inv);                                                     \
  }
QKV_ROWS_EXPORTS(float, F32)
QKV_ROWS_EXPORTS(double, F64)
#undef QKV_ROWS_EXPORTS

// dS = scale·P∘(dP - D_r) (∘ factor), in place over dP; cols is a whole number of vectors.
template <class T>
void DsRows(T* ds, const T* p, const T* factor, std::int64_t rows, std::int64_t cols, T scale,
            const T* delta) {
  const hn::ScalableTag<T> d;
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
  const auto vscale = hn::Set(d, scale);
  for (std::int64_t r = 0; r < rows; ++r) {
    T* dsr = ds + r * cols;
    const T* pr = p + r * cols;
    const auto vd = hn::Set(d, delta[r]);
    for (std::int64_t c = 0; c < cols; c += lanes) {
      auto v = hn::Mul(hn::Mul(vscale, hn::LoadU(d, pr + c)), hn::Sub(hn::LoadU(d, dsr + c), vd));
      if (factor != nullptr) v = hn::Mul(v, hn::LoadU(d, factor + r * cols + c));
      hn::StoreU(v, d, dsr + c);
    }
  }
}

template <class T>
struct HwyOps {
  using D = hn::ScalableTag<T>;
  using V = hn::Vec<D>;
  static constexpr std::int64_t kLanes = static_cast<std::int64_t>(hn::MaxLanes(D()));
#if HWY_TARGET <= HWY_AVX3
  static constexpr int kRows = 6;
  static constexpr int kVectors = 4;
#else
  static constexpr int kRows = 4;
  static constexpr int kVectors = 2;
#endif

  template <int MR, int NV>
  static HWY_INLINE void block(std::int64_t k, const T* HWY_RESTRICT a, std::int64_t rs,
                               std::int64_t cs, const T* HWY_RESTRICT b, std::int64_t ldb,
                               T* HWY_RESTRICT c, std::int64_t ldc, bool accumulate) {
    const D d;
    V acc[static_cast<std::size_t>(MR)][static_cast<std::size_t>(NV)];
    for (int r = 0; r < MR; ++r) {
      for (int u = 0; u < NV; ++u) {
        acc[r][u] = accumulate ? hn::LoadU(d, c + r * ldc + u * kLanes) : hn::Zero(d);
      }
    }
    for (std::int64_t x = 0; x < k; ++x) {
      V bv[static_cast<std::size_t>(NV)];
      for (int u = 0; u < NV; ++u) bv[u] = hn::LoadU(d, b + x * ldb + u * kLanes);
      for (int r = 0; r < MR; ++r) {
        const V ar = hn::Set(d, a[r * rs + x * cs]);
        for (int u = 0; u < NV; ++u) acc[r][u] = hn::MulAdd(ar, bv[u], acc[r][u]);
      }
    }
    for (int r = 0; r < MR; ++r) {
      for (int u = 0; u < NV; ++u) hn::StoreU(acc[r][u], d, c + r * ldc + u * kLanes);
    }
  }

  // Rows [0, m) of one column block of NV vectors: kRows at a time, then the rest.
  template <int NV, int MR = kRows>
  static HWY_INLINE void rows(std::int64_t m, std::int64_t r, std::int64_t k, const T* a,
                              std::int64_t rs, std::int64_t cs, const T* b, std::int64_t ldb, T* c,
                              std::int64_t ldc, bool accumulate) {
    if constexpr (MR == kRows) {
      for (; r + MR <= m; r += MR)
        block<MR, NV>(k, a + r * rs, rs, cs, b, ldb, c + r * ldc, ldc, accumulate);
    }
    if constexpr (MR > 1) {
      if (m - r == MR - 1) {
        return block<MR - 1, NV>(k, a + r * rs, rs, cs, b, ldb, c + r * ldc, ldc, accumulate);
      }
      rows<NV, MR - 1>(m, r, k, a, rs, cs, b, ldb, c, ldc, accumulate);
    } else if (m - r == 1) {
      block<1, NV>(k, a + r * rs, rs, cs, b, ldb, c + r * ldc, ldc, accumulate);
    }
  }

  // The remaining column vectors (fewer than kVectors), NV at most.
  template <int NV>
  static HWY_INLINE void tail(std::int64_t vectors, std::int64_t m, std::int64_t k, const T* a,
                              std::int64_t rs, std::int64_t cs, const T* b, std::int64_t ldb, T* c,
                              std::int64_t ldc, bool accumulate) {
    if constexpr (NV >= 1) {
      if (vectors == NV) return rows<NV>(m, 0, k, a, rs, cs, b, ldb, c, ldc, accumulate);
      tail<NV - 1>(vectors, m, k, a, rs, cs, b, ldb, c, ldc, accumulate);
    }
  }

  static void gemm(std::int64_t m, std::int64_t n, std::int64_t k, const T* a, std::int64_t rs,
                   std::int64_t cs, const T* b, std::int64_t ldb, T* c, std::int64_t ldc,
                   bool accumulate) noexcept {
    if (m == 0 || n == 0) return;
    if (k == 0) {  // an empty sum (D = 0): A and B may be empty buffers, never to be offset
      if (!accumulate) {
        for (std::int64_t r = 0; r < m; ++r) std::fill_n(c + r * ldc, n, T(0));
      }
      return;
    }
    std::int64_t col = 0;
    for (; col + kVectors * kLanes <= n; col += kVectors * kLanes) {
      rows<kVectors>(m, 0, k, a, rs, cs, b + col, ldb, c + col, ldc, accumulate);
    }
    // n is a whole number of 64-byte vectors, so of this target's vectors too.
    tail<kVectors - 1>((n - col) / kLanes, m, k, a, rs, cs, b + col, ldb, c + col, ldc, accumulate);
  }

  static void scale_rows(T* x, std::int64_t rows_, std::int64_t cols, T scale) noexcept {
    ScaleRows(x, rows_, cols, scale);
  }
  static void max_rows(const T* x, std::int64_t rows_, std::int64_t cols, T* max) noexcept {
    MaxRows(x, rows_, cols, max);
  }
  static void exp_sum_rows(T* x, T* dp, std::int64_t rows_, std::int64_t cols,
                           const T* shift, double* sum, double* dot) noexcept {
    ExpSumRows(x, dp, rows_, cols, shift, sum, dot);
  }
  static void weigh_rows(T* x, std::int64_t rows_, std::int64_t cols, const T* shift,
                         const T* inv) noexcept {
    WeighRows(x, rows_, cols, shift, inv);
  }
  static void ds_rows(T* ds, const T* p, const T* factor, std::int64_t rows_, std::int64_t cols,
                      T scale, const T* delta) noexcept {
    DsRows(ds, p, factor, rows_, cols, scale, delta);
  }
};

void DropoutKeepBits(const core::Dropout& d, std::uint32_t head_word, std::int64_t i0,
                     std::int64_t rows, std::int64_t j0, std::int64_t cols, std::int64_t ld,
                     std::uint64_t* bits) {
  // Whole aligned blocks of 64 keys that start a word, for all the rows at once
  // (dropout_hwy::rows64); any other block row by row, the portable way.
  const std::int64_t words = bwd::keep_words(ld);
  std::fill_n(bits, rows * words, std::uint64_t{0});
  constexpr std::int64_t kChunk = 64;  // rows a call of rows64 takes
  std::uint32_t head_words[kChunk];
  std::int64_t row_index[kChunk];
  std::fill_n(head_words, kChunk, head_word);
  std::int64_t c = 0;
  while (c < cols) {
    const std::int64_t j = j0 + c;
    const std::int64_t n = std::min(cols - c, core::kDropoutKeys - j % core::kDropoutKeys);
    if (n == core::kDropoutKeys && c % 64 == 0) {
      for (std::int64_t r0 = 0; r0 < rows; r0 += kChunk) {
        const std::int64_t count = std::min(kChunk, rows - r0);
        for (std::int64_t r = 0; r < count; ++r) row_index[r] = i0 + r0 + r;
        dropout_hwy::rows64(d, count, head_words, row_index, j,
                            dropout_hwy::KeepBits{bits + r0 * words + c / 64, words});
      }
    } else {
      for (std::int64_t r = 0; r < rows; ++r) {
        bwd::keep_bits_portable(d, head_word, i0 + r, j, n, bits + r * words, c);
      }
    }
    c += n;
  }
}

// dst := src·(kept ? scale : 0), the factor built in a register from the mask's bits: vector v
// of a row tests its lanes' bits (1, 2, 4, ...) against the row's word shifted to it.
void ApplyKeepBitsF32(const float* src, const std::uint64_t* bits, std::int64_t rows,
                      std::int64_t ld, float scale, float* dst) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(df));
  const std::int64_t words = bwd::keep_words(ld);
  alignas(64) static constexpr std::uint32_t kLaneBits[32] = {
      1u << 0,  1u << 1,  1u << 2,  1u << 3,  1u << 4,  1u << 5,  1u << 6,  1u << 7,
      1u << 8,  1u << 9,  1u << 10, 1u << 11, 1u << 12, 1u << 13, 1u << 14, 1u << 15,
      1u << 16, 1u << 17, 1u << 18, 1u << 19, 1u << 20, 1u << 21, 1u << 22, 1u << 23,
      1u << 24, 1u << 25, 1u << 26, 1u << 27, 1u << 28, 1u << 29, 1u << 30, 1u << 31};
  if (lanes > 32 || 64 % lanes != 0) {
    bwd::apply_keep_bits_portable(src, bits, rows, ld, scale, dst);
    return;
  }
  const auto lane_bits = hn::Load(du, kLaneBits);
  const auto factor = hn::Set(df, scale);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::uint64_t* w = bits + r * words;
    const float* a = src + r * ld;
    float* out = dst + r * ld;
    std::int64_t c = 0;
    for (; c + lanes <= ld; c += lanes) {
      const auto part = static_cast<std::uint32_t>(w[c / 64] >> (c % 64));
      const auto kept = hn::RebindMask(df, hn::TestBit(hn::Set(du, part), lane_bits));
      hn::StoreU(hn::Mul(hn::LoadU(df, a + c), hn::IfThenElseZero(kept, factor)), df, out + c);
    }
    for (; c < ld; ++c) {
      const bool kept = ((w[c / 64] >> (c % 64)) & 1u) != 0;
      out[c] = a[c] * (kept ? scale : 0.0f);
    }
  }
}

void RoundToBf16F32(const float* src, std::int64_t count, float* dst) {
  const hn::ScalableTag<float> d;
  const hn::RebindToSigned<decltype(d)> di;
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
  const auto half = hn::Set(di, static_cast<std::int32_t>(0xffff0000u));
  const auto infinity = hn::Set(di, 0x7f800000);
  std::int64_t e = 0;
  for (; e + lanes <= count; e += lanes) {
    const auto bits = hn::BitCast(di, hn::LoadU(d, src + e));
    const auto odd = hn::And(hn::ShiftRight<16>(bits), hn::Set(di, 1));
    const auto rounded = hn::And(hn::Add(bits, hn::Add(hn::Set(di, 0x7fff), odd)), half);
    const auto quiet_nan = hn::And(hn::Or(bits, hn::Set(di, 0x00400000)), half);
    const auto nan = hn::Gt(hn::And(bits, hn::Set(di, 0x7fffffff)), infinity);
    hn::StoreU(hn::BitCast(d, hn::IfThenElse(nan, quiet_nan, rounded)), d, dst + e);
  }
  for (; e < count; ++e) dst[e] = bwd::round_float_to_bf16(src[e]);
}

core::KernelStatus RunBackwardF32(const core::BackwardParams& bp, const bwd::TilePlan& plan) {
  return bwd::run_backward<HwyOps<float>, float>(bp, plan);
}
core::KernelStatus RunBackwardF64(const core::BackwardParams& bp, const bwd::TilePlan& plan) {
  return bwd::run_backward<HwyOps<double>, double>(bp, plan);
}

// bf16 calls: AMX tiles (bwd_amx-inl.h) where amx_bf16_supported(), else vdpbf16ps products
// (bwd_bf16-inl.h), both on the x86 AVX-512 targets (of a CPU with AVX512-BF16 for the
// latter: bf16_dots_supported()); elsewhere the float32 loop nest on bf16-rounded operands (FloatProducts, the
// widened path: the same products, each exact in float32, summed in float32). GCC only, as
// the forward's bf16 path (attention_fwd_fused_hwy.cc says why).
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3 && !defined(__clang__)
#include "kernels/bwd_bf16-inl.h"
#include "kernels/bwd_amx-inl.h"

core::KernelStatus RunBackwardBf16(const core::BackwardParams& bp, const bwd::TilePlan& plan) {
  if (amx_bf16_supported()) {
    return bwd::run_backward<HwyOps<float>, float, AmxProducts>(bp, plan);
  }
  if (bf16_dots_supported()) {
    return bwd::run_backward<HwyOps<float>, float, Bf16Products>(bp, plan);
  }
  return bwd::run_backward<HwyOps<float>, float>(bp, plan);
}
bool BackwardBf16Dots() { return !amx_bf16_supported() && bf16_dots_supported(); }
bool BackwardBf16Amx() { return amx_bf16_supported(); }
#else
core::KernelStatus RunBackwardBf16(const core::BackwardParams& bp, const bwd::TilePlan& plan) {
  return bwd::run_backward<HwyOps<float>, float>(bp, plan);
}
bool BackwardBf16Dots() { return false; }
bool BackwardBf16Amx() { return false; }
#endif

}  // namespace qkv::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace qkv::kernels {

HWY_EXPORT(ScaleRowsF32);
HWY_EXPORT(ScaleRowsF64);
HWY_EXPORT(MaxRowsF32);
HWY_EXPORT(MaxRowsF64);
HWY_EXPORT(ExpSumRowsF32);
HWY_EXPORT(ExpSumRowsF64);
HWY_EXPORT(WeighRowsF32);
HWY_EXPORT(WeighRowsF64);
HWY_EXPORT(RunBackwardF32);
HWY_EXPORT(DropoutKeepBits);
HWY_EXPORT(ApplyKeepBitsF32);
HWY_EXPORT(RoundToBf16F32);
HWY_EXPORT(RunBackwardF64);
HWY_EXPORT(RunBackwardBf16);
HWY_EXPORT(BackwardBf16Dots);
HWY_EXPORT(BackwardBf16Amx);

namespace bwd {
#define QKV_ROWS_DISPATCH(T, N)                                                                \
  void simd_scale_rows(T* x, std::int64_t rows, std::int64_t cols, T scale) noexcept {         \
    HWY_DYNAMIC_DISPATCH(ScaleRows##N)(x, rows, cols, scale);                                  \
  }                                                                                            \
  void simd_max_rows(const T* x, std::int64_t rows, std::int64_t cols, T* max) noexcept {      \
    HWY_DYNAMIC_DISPATCH(MaxRows##N)(x, rows, cols, max);                                      \
  }                                                                                            \
  void simd_exp_sum_rows(T* x, T* dp, std::int64_t rows, std::int64_t cols,                    \
                         const T* shift, double* sum, double* dot) noexcept {                  \
    HWY_DYNAMIC_DISPATCH(ExpSumRows##N)(x, dp, rows, cols, shift, sum, dot);                   \
  }                                                                                            \
  void simd_weigh_rows(T* x, std::int64_t rows, std::int64_t cols, const T* shift,             \
                       const T* inv) noexcept {                                                \
    HWY_DYNAMIC_DISPATCH(WeighRows##N)(x, rows, cols, shift, inv);                             \
  }
QKV_ROWS_DISPATCH(float, F32)
QKV_ROWS_DISPATCH(double, F64)
#undef QKV_ROWS_DISPATCH
void dropout_keep_bits(const core::Dropout& d, std::uint32_t head_word, std::int64_t i0,
                       std::int64_t rows, std::int64_t j0, std::int64_t cols, std::int64_t ld,
                       std::uint64_t* bits) noexcept {
  HWY_DYNAMIC_DISPATCH(DropoutKeepBits)(d, head_word, i0, rows, j0, cols, ld, bits);
}
void apply_keep_bits_f32(const float* src, const std::uint64_t* bits, std::int64_t rows,
                         std::int64_t ld, float scale, float* dst) noexcept {
  HWY_DYNAMIC_DISPATCH(ApplyKeepBitsF32)(src, bits, rows, ld, scale, dst);
}
void round_to_bf16_f32(const float* src, std::int64_t count, float* dst) noexcept {
  HWY_DYNAMIC_DISPATCH(RoundToBf16F32)(src, count, dst);
}
}  // namespace bwd

namespace {

// Query rows and keys per tile: 128 while a row of Q, K or V takes at most 256 bytes (float32
// d <= 64), 64 beyond. Why: at float32 d = 128 the 128-tile set (about 0.7 MiB per worker) and
// the Q and dO rows read in place crowd a 1 MiB L2, and 64 x 64 tiles ran 6-8 % faster (n =
// 2048, and n = 4096 causal; float64 at d = 64 too), while at float32 d = 64 128 x 128 stays
// ahead (docs/performance.md). The choice depends on the shape and the type alone, as the
// bits must.
std::int64_t tile_for(const core::AttentionShape& s, std::size_t element) {
  const auto row_bytes = static_cast<std::size_t>(std::max(s.d, s.dv)) * element;
  return row_bytes > 256 ? 64 : 128;
}

}  // namespace

std::string attention_bwd_fused_hwy_declines(const core::BackwardParams& bp) {
  return tiled_backward_declines(bp);
}

bool backward_bf16_dots_available() noexcept {
  apply_simd_cap();
  return HWY_DYNAMIC_DISPATCH(BackwardBf16Dots)();
}

bool backward_bf16_amx_available() noexcept {
  apply_simd_cap();
  return HWY_DYNAMIC_DISPATCH(BackwardBf16Amx)();
}

core::KernelStatus attention_bwd_fused_hwy(const core::BackwardParams& bp) noexcept {
  apply_simd_cap();
  const bool f64 = bp.forward.compute == DType::kF64;
  const std::size_t element = f64 ? sizeof(double) : sizeof(float);
  bwd::TilePlan plan;
  plan.row_panels = true;
  // A bf16 call with bounded scores weighs with its lse (bwd::forward_stats_suit): no stats
  // pass, no row panels, and tiles sized for bf16 rows (128 x 128 up to d = 128 ran 1.1-1.2x
  // faster than 64 x 64 at d = 128 on a Xeon with AMX).
  plan.forward_stats = bwd::forward_stats_suit(bp);
  plan.query_tile = tile_for(bp.forward.shape, plan.forward_stats ? 2 : element);
  plan.key_tile = plan.query_tile;
  plan.chunks = bwd::chunks_for(bp.forward.shape, plan.key_tile, element);
  if (f64) return HWY_DYNAMIC_DISPATCH(RunBackwardF64)(bp, plan);
  if (bp.forward.compute == DType::kBF16) return HWY_DYNAMIC_DISPATCH(RunBackwardBf16)(bp, plan);
  return HWY_DYNAMIC_DISPATCH(RunBackwardF32)(bp, plan);
}

}  // namespace qkv::kernels
#endif  // HWY_ONCE
