// attention_bwd_unfused_blas: the backward as most code writes it, the in-process baseline of
// `qkv bench --backward`. Per (b, kv head) and block of 256 query rows of each of its query
// heads, the whole score block is materialised (256 x nk) and each step is one CBLAS call:
//   S = Q_blk·Kᵀ; P = exp(softcap(scale·S) + bias - M)/l (the row's max and sum, computed
//   first from the same S: bwd_row_stats.h); dV += Pᵀ·dO_blk;
//   dP = dO_blk·Vᵀ; dS = scale·P∘(dP - D)∘(1 - tanh²); dK += dSᵀ·Q_blk; dQ_blk = dS·K
// It is bwd_fused_driver.h's loop nest with one key tile covering every key, so what it lacks
// is only what fusion adds: it computes the whole square under causal masking but for whole
// 256-row blocks, and moves 256·nk-element blocks through memory five times per block.
#include <string>

#include "kernels/backward_kernel.h"
#include "kernels/blas_threads.h"
#include "kernels/bwd_fused_driver.h"
#include "kernels/bwd_ops.h"
#include "kernels/kernel.h"

namespace qkv::kernels {
namespace {

constexpr std::int64_t kRowBlock = 256;

bwd::TilePlan unfused_plan(const core::AttentionShape& s) {
  bwd::TilePlan plan;
  plan.query_tile = kRowBlock;
  plan.key_tile = std::max<std::int64_t>(s.nk, 1);
  plan.chunks = 1;
  return plan;
}

}  // namespace

std::string attention_bwd_unfused_blas_declines(const core::BackwardParams& bp) {
  if (std::string reason = tiled_backward_declines(bp); !reason.empty()) return reason;
  const core::AttentionShape& s = bp.forward.shape;
  const double element = bp.forward.compute == DType::kF64 ? 8.0 : 4.0;
  // Three 256 x nk blocks per thread (P, dS and the softcap's factor).
  if (3.0 * element * static_cast<double>(kRowBlock) * static_cast<double>(s.nk) *
          bp.forward.threads >
      kUnfusedWorkspaceCapBytes) {
    return "its 256 x Nk score blocks per thread would pass 2 GiB";
  }
  if (std::max({s.nk, s.d, s.dv, kRowBlock}) > std::numeric_limits<int>::max()) {
    return "a dimension passes CBLAS's int range";
  }
  return blas_address_space_shortfall(bp.forward.threads);
}

core::KernelStatus attention_bwd_unfused_blas(const core::BackwardParams& bp) noexcept {
  const bwd::TilePlan plan = unfused_plan(bp.forward.shape);
  if (bp.forward.compute == DType::kF64) {
    return bwd::run_backward<bwd::FastBlasOps<double>, double>(bp, plan);
  }
  return bwd::run_backward<bwd::FastBlasOps<float>, float>(bp, plan);
}

}  // namespace qkv::kernels
