#include "kernels/decode_common.h"
#include "kernels/kernel.h"

namespace qkv::kernels {

// Fastest first. The decode kernels come first but the default choice passes them over unless
// the call has few query rows per kv head (and no weights output), where they read K and V in
// place at memory speed and every other kernel packs or multiplies more than it computes. In a
// SIMD build the fused kernel supports every call that float32 can
// represent, so it is the default; the unfused CBLAS composition comes before the scalar twin
// because where its n x n workspace fits it is far faster than scalar code (in a portable build
// it is the default for all but the largest shapes); the reference supports every call.
std::span<const AttentionKernel> attention_kernels() {
  static const AttentionKernel kKernels[] = {
#if QKV_HAVE_HWY
    {"decode_hwy", "decode kernel for few query rows per kv head: K/V read in place, split-KV, SIMD",
     attention_fwd_decode_hwy_declines, attention_fwd_decode_hwy, attention_fwd_decode_hwy_passes,
     /*checks_kv_as_it_reads=*/true},
    {"fused_hwy", "fused online-softmax kernel, SIMD (Highway, run-time dispatch), O(n) memory",
     attention_fwd_fused_hwy_declines, attention_fwd_fused_hwy, nullptr,
     /*checks_kv_as_it_reads=*/true},
#endif
    {"decode_scalar", "decode kernel, portable scalar twin of decode_hwy",
     attention_fwd_decode_scalar_declines, attention_fwd_decode_scalar,
     attention_fwd_decode_scalar_passes},
    {"unfused_blas", "two CBLAS sgemm calls per head with a softmax between (n x n workspace)",
     attention_fwd_unfused_blas_declines, attention_fwd_unfused_blas},
    {"fused_scalar", "fused online-softmax kernel, portable scalar twin of fused_hwy",
     attention_fwd_fused_scalar_declines, attention_fwd_fused_scalar},
    {"reference", "float64 row-by-row statement of the formulas; supports every call",
     attention_fwd_reference_declines, attention_fwd_reference},
  };
  return kKernels;
}

#if !QKV_HAVE_HWY
// The portable build has no SIMD targets.
namespace decode {
core::KernelStatus decode_run_hwy(const DecodeCall& call) noexcept { return decode_run_scalar(call); }
}  // namespace decode
std::vector<std::int64_t> simd_targets() { return {}; }
void simd_force_target(std::int64_t) {}
void apply_simd_cap() noexcept {}
std::string simd_target_name() { return "none (portable build)"; }
std::string simd_target_name(std::int64_t) { return "none"; }
double measure_fma_peak_gflops(int) { return 0.0; }
double measure_fma_from_l1_gflops(int) { return 0.0; }
double measure_bf16_dot_peak_gflops(int) { return 0.0; }
double measure_amx_bf16_peak_gflops(int) { return 0.0; }
double measure_bf16_from_l1_gflops(int) { return 0.0; }
bool cpu_has_bf16_dots() noexcept { return false; }
bool bf16_dots_supported() noexcept { return false; }
bool fused_bf16_dots_available() noexcept { return false; }
bool fused_bf16_amx_available(std::int64_t) noexcept { return false; }
std::string fused_hwy_path(DType, std::int64_t) { return "none (portable build)"; }
#endif

}  // namespace qkv::kernels
