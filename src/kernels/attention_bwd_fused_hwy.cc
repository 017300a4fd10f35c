// attention_bwd_fused_hwy: the fused backward's loop nest (bwd_fused_driver.h) at machine
// speed. Its five tile products (S = Q·Kᵀ, dV += Pᵀ·dO, dP = dO·Vᵀ, dK += dSᵀ·Q, dQ += dS·K)
// are single-threaded CBLAS calls on 128 x 128 tiles (OpenBLAS's micro-kernels, one thread:
// blas_threads.h), and P = exp(min(x - lse, 0)) is a Highway loop (one dynamic dispatch per
// tile) below. Tiles: 128 query rows x 128 keys keep S, dP and the softcap factor (3 x 64 KiB
// in float32) and the K, V, Q, dO tiles (d = 64: 4 x 32 KiB) within a 1 MiB L2.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/attention_bwd_fused_hwy.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// After foreach_target.h, which re-includes this file once per target.
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

HWY_BEFORE_NAMESPACE();
namespace qkv::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <class T>
void ExpBelowRows(T* x, std::int64_t rows, std::int64_t cols, const T* shift) {
  const hn::ScalableTag<T> d;
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
  const auto zero = hn::Zero(d);
  for (std::int64_t r = 0; r < rows; ++r) {
    T* row = x + r * cols;
    const auto vs = hn::Set(d, shift[r]);
    std::int64_t c = 0;
    for (; c + lanes <= cols; c += lanes) {
      hn::StoreU(hn::Exp(d, hn::Min(hn::Sub(hn::LoadU(d, row + c), vs), zero)), d, row + c);
    }
    for (; c < cols; ++c) row[c] = std::exp(std::min(row[c] - shift[r], T(0)));
  }
}

void ExpBelowRowsF32(float* x, std::int64_t rows, std::int64_t cols, const float* shift) {
  ExpBelowRows(x, rows, cols, shift);
}
void ExpBelowRowsF64(double* x, std::int64_t rows, std::int64_t cols, const double* shift) {
  ExpBelowRows(x, rows, cols, shift);
}

}  // namespace qkv::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <string>

#include "kernels/backward_kernel.h"
#include "kernels/blas_threads.h"
#include "kernels/bwd_fused_driver.h"
#include "kernels/bwd_ops.h"
#include "kernels/kernel.h"

namespace qkv::kernels {

HWY_EXPORT(ExpBelowRowsF32);
HWY_EXPORT(ExpBelowRowsF64);

namespace bwd {
void exp_below_rows_f32(float* x, std::int64_t rows, std::int64_t cols,
                        const float* shift) noexcept {
  HWY_DYNAMIC_DISPATCH(ExpBelowRowsF32)(x, rows, cols, shift);
}
void exp_below_rows_f64(double* x, std::int64_t rows, std::int64_t cols,
                        const double* shift) noexcept {
  HWY_DYNAMIC_DISPATCH(ExpBelowRowsF64)(x, rows, cols, shift);
}
}  // namespace bwd

namespace {
constexpr std::int64_t kTile = 128;
}  // namespace

std::string attention_bwd_fused_hwy_declines(const core::BackwardParams& bp) {
  if (std::string reason = tiled_backward_declines(bp); !reason.empty()) return reason;
  const core::AttentionShape& s = bp.forward.shape;
  if (std::max({s.d, s.dv}) > std::numeric_limits<int>::max() / kTile) {
    return "a head dimension passes CBLAS's int range";
  }
  return blas_address_space_shortfall(bp.forward.threads);
}

core::KernelStatus attention_bwd_fused_hwy(const core::BackwardParams& bp) noexcept {
  apply_simd_cap();
  bwd::TilePlan plan;
  plan.query_tile = kTile;
  plan.key_tile = kTile;
  if (bp.forward.compute == DType::kF64) {
    plan.chunks = bwd::chunks_for(bp.forward.shape, plan.key_tile, sizeof(double));
    return bwd::run_backward<bwd::FastBlasOps<double>, double>(bp, plan);
  }
  plan.chunks = bwd::chunks_for(bp.forward.shape, plan.key_tile, sizeof(float));
  return bwd::run_backward<bwd::FastBlasOps<float>, float>(bp, plan);
}

}  // namespace qkv::kernels
#endif  // HWY_ONCE
