// attention_bwd_fused_scalar: the fused backward's loop nest (bwd_fused_driver.h) with plain
// loops for its products, the portable twin of attention_bwd_fused_hwy; 64 x 64 tiles. Also
// the backward kernels' shared precision checks.
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "kernels/backward_kernel.h"
#include "kernels/bwd_fused_driver.h"
#include "kernels/bwd_ops.h"
#include "kernels/kernel.h"

namespace qkv::kernels {
namespace {

// Bounds on what the backward computes, from the inputs' magnitudes: dP_ij and D_i are dot
// products of dO with V (O is a convex combination of V's rows), dS is at most twice dP times
// the scale, and each gradient sums at most nk (dQ) or group·nq (dK, dV) such terms.
std::string gradient_bounds_declines(const core::BackwardParams& bp, double limit,
                                     const char* type) {
  const core::AttentionParams& p = bp.forward;
  const core::AttentionShape& s = p.shape;
  const core::Magnitudes& mag = p.magnitudes;
  // Dropout's scale multiplies dP and the weights dV sums.
  const double dout = bp.grad_out_magnitude * p.dropout.keep_scale;
  const double dp = static_cast<double>(s.dv) * dout * mag.v;
  const double ds = 2.0 * std::abs(p.scale) * dp;
  const double rows = static_cast<double>(s.group()) * static_cast<double>(s.nq);
  const double bounds[] = {dp,
                           ds,
                           static_cast<double>(s.nk) * ds * mag.k,
                           rows * ds * mag.q,
                           rows * dout,
                           dp * static_cast<double>(s.nq)};
  for (const double bound : bounds) {
    if (!(bound <= limit)) {
      char text[160];
      std::snprintf(text, sizeof text,
                    "its gradient sums may reach %.3g (from max|dO| %.3g, max|V| %.3g), beyond "
                    "%s's range",
                    bound, dout, mag.v, type);
      return text;
    }
  }
  return {};
}

}  // namespace

std::string backward_float32_declines(const core::BackwardParams& bp) {
  if (std::string reason = float32_declines(bp.forward); !reason.empty()) return reason;
  if (bp.grad_out.dtype == DType::kF64 &&
      bp.grad_out_magnitude > std::numeric_limits<float>::max()) {
    return "float64 dO holds values beyond the float32 range";
  }
  return gradient_bounds_declines(bp, std::numeric_limits<float>::max() / 2, "float32");
}

// Weights computed relative to the saved lse lose precision with the scores: s and the lse each
// carry a rounding error of about |s|·2^-53 in float64, which the exp turns into a relative
// error of the weight of the same size (1e-3 against the reference at scores of 1e12, wrong
// gradients at 1e37). In one process the tiled kernels no longer do that (they compute each
// row's max and sum themselves, bwd_row_stats.h) and this check passes; a call given the whole
// rows' statistics (BackwardParams::row_max: the ring's, which are still the saved lse,
// exp(M - lse), ring_backward.cc) is declined past a bound of 2^20 (the weights' error then
// stays below about 1e-9), and the ring refuses it. A softcap bounds the capped score's error
// by about softcap·2^-53, whatever s is.
std::string lse_recompute_declines(const core::BackwardParams& bp) {
  constexpr double kLimit = 1048576.0;
  if (bp.row_max.data == nullptr) return {};  // the kernel's own statistics: no lse involved
  const core::AttentionParams& p = bp.forward;
  const double dot = static_cast<double>(p.shape.d) * p.magnitudes.q * p.magnitudes.k;
  const double score = p.modifiers.softcap > 0 ? p.modifiers.softcap : std::abs(p.scale) * dot;
  if (score <= kLimit) return {};
  char text[200];
  std::snprintf(text, sizeof text,
                "scores may reach %.3g (|scale|·D·max|Q|·max|K|): recomputed from the saved lse, "
                "the weights would lose precision past %.0f",
                score, kLimit);
  return text;
}

std::string backward_float64_declines(const core::BackwardParams& bp) {
  if (std::string reason = float64_declines(bp.forward); !reason.empty()) return reason;
  return gradient_bounds_declines(bp, std::numeric_limits<double>::max() / 2, "float64");
}

std::string backward_precision_declines(const core::BackwardParams& bp) {
  if (bp.forward.compute != DType::kF64) return backward_float32_declines(bp);
  if (std::string reason = backward_float64_declines(bp); !reason.empty()) return reason;
  return lse_recompute_declines(bp);
}

std::string tiled_backward_declines(const core::BackwardParams& bp) {
  if (std::string reason = backward_precision_declines(bp); !reason.empty()) return reason;
  const bool writable = bp.forward.compute == DType::kF64 ? bwd::gradients_writable<double>(bp)
                                                          : bwd::gradients_writable<float>(bp);
  if (!writable) return "it writes dQ, dK and dV as rows of the compute type (all three wanted)";
  return {};
}

std::string attention_bwd_fused_scalar_declines(const core::BackwardParams& bp) {
  return tiled_backward_declines(bp);
}

core::KernelStatus attention_bwd_fused_scalar(const core::BackwardParams& bp) noexcept {
  bwd::TilePlan plan;
  plan.query_tile = 64;
  plan.key_tile = 64;
  if (bp.forward.compute == DType::kF64) {
    plan.chunks = bwd::chunks_for(bp.forward.shape, plan.key_tile, sizeof(double));
    return bwd::run_backward<bwd::ScalarOps<double>, double>(bp, plan);
  }
  plan.chunks = bwd::chunks_for(bp.forward.shape, plan.key_tile, sizeof(float));
  return bwd::run_backward<bwd::ScalarOps<float>, float>(bp, plan);
}

}  // namespace qkv::kernels
