// The backward kernel list, fastest first, mirroring the forward's (kernel_list.cc): the fused
// kernel (SIMD build), the unfused CBLAS composition (faster than scalar code wherever its
// 256 x nk blocks fit), the fused kernel's scalar twin, and the float64 reference, which
// supports every call.
#include "kernels/backward_kernel.h"
#include "kernels/bwd_fused_driver.h"
#include "kernels/bwd_ops.h"

namespace qkv::kernels {

std::span<const BackwardKernel> backward_kernels() {
  static const BackwardKernel kKernels[] = {
#if QKV_HAVE_HWY
    {"fused_hwy", "fused backward, tiles through CBLAS and a SIMD exp, O(n·d) memory",
     attention_bwd_fused_hwy_declines, attention_bwd_fused_hwy},
#endif
    {"unfused_blas", "CBLAS calls on materialised 256 x Nk score blocks",
     attention_bwd_unfused_blas_declines, attention_bwd_unfused_blas},
    {"fused_scalar", "fused backward, portable scalar twin of fused_hwy",
     attention_bwd_fused_scalar_declines, attention_bwd_fused_scalar},
    {"reference", "float64 row-by-row statement of the gradient formulas; supports every call",
     attention_bwd_reference_declines, attention_bwd_reference},
  };
  return kKernels;
}

#if !QKV_HAVE_HWY
namespace bwd {
void exp_below_rows_f32(float* x, std::int64_t rows, std::int64_t cols, float scale,
                        const float* shift) noexcept {
  exp_below_scalar(x, rows, cols, scale, shift);
}
void exp_below_rows_f64(double* x, std::int64_t rows, std::int64_t cols, double scale,
                        const double* shift) noexcept {
  exp_below_scalar(x, rows, cols, scale, shift);
}
void dropout_factors_f32(const core::Dropout& d, std::uint32_t head_word, std::int64_t i0,
                         std::int64_t rows, std::int64_t j0, std::int64_t cols, std::int64_t ld,
                         float* z) noexcept {
  dropout_factors_portable(d, head_word, i0, rows, j0, cols, ld, z);
}
}  // namespace bwd
#endif

}  // namespace qkv::kernels
