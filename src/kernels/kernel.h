// The kernel boundary: every attention kernel takes the same AttentionParams, can say why it
// declines a call, and never throws. The list runs fastest first, the reference last; the
// reference supports every call, so the default choice always finds one.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/params.h"

namespace qkv::kernels {

struct AttentionKernel {
  std::string_view name;
  std::string_view description;
  // Empty when the kernel supports these params, else the reason it declines.
  std::string (*declines)(const core::AttentionParams& params);
  core::KernelStatus (*run)(const core::AttentionParams& params) noexcept;
  // The default choice passes over a kernel that supports the call but suits its shape worse
  // than a later one: the reason, or empty. nullptr: suits every call it supports. A forced
  // kernel (options.kernel) runs regardless.
  std::string (*passes)(const core::AttentionParams& params) = nullptr;
  // Whether the kernel checks plain K and V as it reads them (finite, within float32's range,
  // reported through AttentionParams::kv_unchecked), so that validation can skip its own scan:
  // a second pass over all of K and V when the kernel reads them once (decode_hwy).
  bool checks_kv_as_it_reads = false;
};

std::span<const AttentionKernel> attention_kernels();

// The kernels, each declared beside its twin; all share AttentionKernel's signature.
std::string attention_fwd_reference_declines(const core::AttentionParams& params);
core::KernelStatus attention_fwd_reference(const core::AttentionParams& params) noexcept;

// The fused kernel (online softmax over key tiles, O(n) memory): the SIMD version (absent from
// the list in a portable build) and its portable scalar twin, sharing one loop nest.
std::string attention_fwd_fused_hwy_declines(const core::AttentionParams& params);
core::KernelStatus attention_fwd_fused_hwy(const core::AttentionParams& params) noexcept;
std::string attention_fwd_fused_scalar_declines(const core::AttentionParams& params);
core::KernelStatus attention_fwd_fused_scalar(const core::AttentionParams& params) noexcept;

// The decode kernel (few query rows per kv head against many keys, K/V read in place, split-KV;
// decode_common.h) in SIMD and its portable scalar twin. They also serve attention_cached.
std::string attention_fwd_decode_hwy_declines(const core::AttentionParams& params);
std::string attention_fwd_decode_hwy_passes(const core::AttentionParams& params);
core::KernelStatus attention_fwd_decode_hwy(const core::AttentionParams& params) noexcept;
std::string attention_fwd_decode_scalar_declines(const core::AttentionParams& params);
std::string attention_fwd_decode_scalar_passes(const core::AttentionParams& params);
core::KernelStatus attention_fwd_decode_scalar(const core::AttentionParams& params) noexcept;

// Two CBLAS sgemm calls per head with a softmax between them: n x n workspace.
std::string attention_fwd_unfused_blas_declines(const core::AttentionParams& params);
core::KernelStatus attention_fwd_unfused_blas(const core::AttentionParams& params) noexcept;

// The unfused kernel's query rows per task: fixed, so that the sgemm calls and hence the bits
// do not depend on the thread count; and the size of its per-thread score blocks above which it
// declines.
inline constexpr std::int64_t kUnfusedRowBlock = 256;
inline constexpr double kUnfusedWorkspaceCapBytes = 2.0 * 1024 * 1024 * 1024;
// The threads the unfused kernel starts for this shape: one per task at most.
std::int64_t unfused_workers(const core::AttentionShape& shape, int threads) noexcept;

// An upper bound on the scratch memory any kernel the call may run allocates for an attention
// call of this shape on `threads` threads; `kernel` is options.kernel (empty: any), `compute`
// the call's compute type (AttentionParams::compute: the fused kernel's tiles are float64 for
// kF64). Kept beside the kernels (workspace.cc) so that a kernel that grows its workspace grows
// this too. Used by the memory budget, which refuses a call before anything is allocated.
std::uint64_t attention_workspace_bytes(const core::AttentionShape& shape, int threads,
                                        const std::string& kernel,
                                        DType compute = DType::kF32) noexcept;

// Shared by the float32 kernels: why float32 cannot represent these inputs, or empty.
std::string float32_declines(const core::AttentionParams& params);
// The fused kernels' float64 path (compute == kF64): why its scores or sums could overflow
// float64, or empty. fused_declines picks float32_declines or float64_declines by the call's
// compute type.
std::string float64_declines(const core::AttentionParams& params);
std::string fused_declines(const core::AttentionParams& params);
// Shared by the kernels that read operands as they are stored and compute plain softmax
// attention: why they decline a call with score modifiers (softcap, ALiBi, sinks) or operands
// to round to a narrower storage type, or empty.
std::string plain_only_declines(const core::AttentionParams& params);

// The bf16 path of fused_hwy (vdpbf16ps, fused_bf16-inl.h): whether this CPU has AVX512-BF16,
// and whether a bf16 call would take the path now (the CPU has it and dispatch picks an
// AVX-512 target: QKV_SIMD_MAX may cap it away); false in a portable build. fused_hwy_path
// names the path fused_hwy takes for a call computing in `compute` (QKV_VERBOSE, bench).
// bf16_dots_supported is the kernels' choice: the CPU has the instruction, and it is not an
// AMX CPU, where vdpbf16ps runs at half the FMA's flops (QKV_BF16_DOTS=1 or 0 overrides that
// choice for the process); cpu_has_bf16_dots is the instruction alone (qkv bench --peak).
bool cpu_has_bf16_dots() noexcept;
bool bf16_dots_supported() noexcept;
bool fused_bf16_dots_available() noexcept;
// Whether a bf16 call of head dim d runs on AMX tiles instead (fused_amx-inl.h: an AVX-512
// target of a CPU with AMX bf16, amx_bf16_supported(), and d a multiple of 32); that path
// comes before vdpbf16ps. fused_hwy_path's d is the call's head dim (-1: not known, and the
// AMX path is not named).
bool fused_bf16_amx_available(std::int64_t d) noexcept;
std::string fused_hwy_path(DType compute, std::int64_t d = -1);

// The SIMD targets compiled into the fused kernel that this CPU supports, best first (empty in
// a portable build); forcing one (0 restores the CPU's best) is for tests, which run every
// target on one machine. simd_target_name() names the target that dispatch picks now.
std::vector<std::int64_t> simd_targets();
// Applies QKV_SIMD_MAX (a Highway target name capping what dispatch may pick), once; every SIMD
// entry point calls it before dispatching.
void apply_simd_cap() noexcept;
void simd_force_target(std::int64_t target);
std::string simd_target_name();
std::string simd_target_name(std::int64_t target);

// The machine's fp32 FMA peak in GFLOP/s on `threads` threads, measured by a short probe
// (about 0.5 s) on the best SIMD target; 0 in a portable build.
double measure_fma_peak_gflops(int threads);
// The same FMAs fed from L1 as the fused kernel's micro-kernels feed them (vector and
// broadcast loads, a 6 x 4 accumulator block on AVX-512): the ceiling of those kernels.
double measure_fma_from_l1_gflops(int threads);
// The bf16 dot-product peak in GFLOP/s on `threads` threads: chains of 512-bit vdpbf16ps, 64
// flops each (32 pairs, a multiply and an add per element), as the FMA probe runs FMAs; 0
// where the CPU has no AVX512-BF16 and in a portable build (dot_peak_bf16.cc).
double measure_bf16_dot_peak_gflops(int threads);
// The same vdpbf16ps fed from L1 as the bf16 q·K^T micro-kernel feeds them (6 x 4 block, 4
// vector loads and 6 pair broadcasts per 24 instructions, 32 steps): that path's ceiling.
double measure_bf16_from_l1_gflops(int threads);
// The AMX bf16 peak in GFLOP/s on `threads` threads: chains of tdpbf16ps on tiles held in
// registers, 16384 flops each (16 x 16 x 32 products, a multiply and an add each); 0 where
// amx_bf16_supported() is false (no AMX, QKV_BF16_AMX=0, a clang or portable build).
double measure_amx_bf16_peak_gflops(int threads);
// The memory bandwidth in GB/s on `threads` threads: STREAM's triad over 3 x 128 MiB
// (bandwidth_probe.cc), 12 bytes per element, best of 5; 0 when the arrays cannot be allocated.
// Compiled in every build.
double measure_triad_gbs(int threads);

}  // namespace qkv::kernels
