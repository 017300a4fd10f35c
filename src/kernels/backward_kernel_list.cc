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

bool backward_bf16_forward_stats(const core::BackwardParams& params) {
#if QKV_HAVE_HWY
  return bwd::forward_stats_suit(params);
#else
  static_cast<void>(params);
  return false;
#endif
}

#if !QKV_HAVE_HWY
bool backward_bf16_dots_available() noexcept { return false; }
bool backward_bf16_amx_available() noexcept { return false; }
namespace bwd {
#define QKV_SCALAR_ROWS(T)                                                                      \
  void simd_scale_rows(T* x, std::int64_t rows, std::int64_t cols, T scale) noexcept {         \
    scale_rows_scalar(x, rows, cols, scale);                                                    \
  }                                                                                             \
  void simd_max_rows(const T* x, std::int64_t rows, std::int64_t cols, T* max) noexcept {      \
    max_rows_scalar(x, rows, cols, max);                                                        \
  }                                                                                             \
  void simd_exp_sum_rows(T* x, T* dp, std::int64_t rows, std::int64_t cols,                    \
                         const T* shift, double* sum, double* dot) noexcept {                   \
    exp_sum_rows_scalar(x, dp, rows, cols, shift, sum, dot);                                    \
  }                                                                                             \
  void simd_weigh_rows(T* x, std::int64_t rows, std::int64_t cols, const T* shift,             \
                       const T* inv) noexcept {                                                 \
    weigh_rows_scalar(x, rows, cols, shift, inv);                                               \
  }
QKV_SCALAR_ROWS(float)
QKV_SCALAR_ROWS(double)
#undef QKV_SCALAR_ROWS
void dropout_keep_bits(const core::Dropout& d, std::uint32_t head_word, std::int64_t i0,
                       std::int64_t rows, std::int64_t j0, std::int64_t cols, std::int64_t ld,
                       std::uint64_t* bits) noexcept {
  dropout_keep_bits_portable(d, head_word, i0, rows, j0, cols, ld, bits);
}
void apply_keep_bits_f32(const float* src, const std::uint64_t* bits, std::int64_t rows,
                         std::int64_t ld, float scale, float* dst) noexcept {
  apply_keep_bits_portable(src, bits, rows, ld, scale, dst);
}
void round_to_bf16_f32(const float* src, std::int64_t count, float* dst) noexcept {
  for (std::int64_t e = 0; e < count; ++e) dst[e] = round_float_to_bf16(src[e]);
}
}  // namespace bwd
#endif

}  // namespace qkv::kernels
