// The backward kernel boundary, mirroring the forward's (kernel.h): every backward kernel
// takes the same BackwardParams, can say why it declines a call, and never throws. The list
// runs fastest first, the reference last; the reference supports every call.
//
// Every backward kernel writes dQ, dK and dV whole (every element, zeros where no key or query
// contributes) and adds to dsinks; results are bitwise identical for any thread count: tasks
// own disjoint outputs and every sum runs in an order fixed by the shape alone.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "core/backward_params.h"

#include "core/memory_budget.h"

namespace qkv::kernels {

struct BackwardKernel {
  std::string_view name;
  std::string_view description;
  std::string (*declines)(const core::BackwardParams& params);
  core::KernelStatus (*run)(const core::BackwardParams& params) noexcept;
};

std::span<const BackwardKernel> backward_kernels();

// The float64 statement of the formulas (attention_backward.h), one query row at a time: it
// recomputes the softmax and the output itself (out and lse are not read).
std::string attention_bwd_reference_declines(const core::BackwardParams& params);
core::KernelStatus attention_bwd_reference(const core::BackwardParams& params) noexcept;

// The fused FlashAttention-2-style backward (P recomputed tile by tile from the row's max and
// sum, which it computes first from the same scores, bwd_row_stats.h; O(n·d) memory): the SIMD
// version and its portable scalar twin, sharing one loop nest.
std::string attention_bwd_fused_hwy_declines(const core::BackwardParams& params);
// Whether fused_hwy computes a bf16 call's products with vdpbf16ps on the SIMD target dispatch
// picks now (an x86 AVX-512 target of a CPU with AVX512-BF16, GCC build); false: the float32
// loop nest on bf16-rounded operands (the same products, exact in float32). False in a
// portable build.
bool backward_bf16_dots_available() noexcept;
// Whether it computes them on AMX tiles instead (amx_tiles.h, bwd_amx-inl.h: an x86 AVX-512
// target of a CPU with AMX bf16, amx_bf16_supported()); when true, dots above are false.
bool backward_bf16_amx_available() noexcept;
// Whether fused_hwy weighs this bf16 call with the forward's lse and D = dO·O rather than the
// rows' statistics computed again (bwd::forward_stats_suit, bwd_row_stats.h: scores bounded,
// no sinks, explicit mask or one-key window). Such a call still computes its own statistics
// when its O fails forward_row_stats's check. False in a portable build.
bool backward_bf16_forward_stats(const core::BackwardParams& params);
core::KernelStatus attention_bwd_fused_hwy(const core::BackwardParams& params) noexcept;
std::string attention_bwd_fused_scalar_declines(const core::BackwardParams& params);
core::KernelStatus attention_bwd_fused_scalar(const core::BackwardParams& params) noexcept;

// The unfused composition through CBLAS: P materialised per head (n x n workspace), then
// dV = Pᵀ·dO, dP = dO·Vᵀ, dS, dQ = scale·dS·K, dK = scale·dSᵀ·Q as sgemm/dgemm calls.
std::string attention_bwd_unfused_blas_declines(const core::BackwardParams& params);
core::KernelStatus attention_bwd_unfused_blas(const core::BackwardParams& params) noexcept;

// Why a float32 backward kernel cannot represent this call (the forward's float32_declines
// plus bounds on dP, dS and the gradient sums), or empty; float64 kernels use
// backward_float64_declines.
std::string backward_float32_declines(const core::BackwardParams& params);
std::string backward_float64_declines(const core::BackwardParams& params);
std::string backward_precision_declines(const core::BackwardParams& params);
// The tiled kernels' (bwd_fused_driver.h): precision, and gradients they can write in place.
std::string tiled_backward_declines(const core::BackwardParams& params);

// What attention_backward allocates for this shape on `threads` threads with gradients of type
// `grad`: the gradients (dsinks too when `sinks`) and the kernels' workspace, an upper bound
// counted before anything is allocated (its memory budget; qkv train's).
core::MemoryEstimate backward_memory(const core::AttentionShape& shape, int threads, DType grad,
                                     bool sinks) noexcept;

}  // namespace qkv::kernels
