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

std::string backward_float64_declines(const core::BackwardParams& bp) {
  if (std::string reason = float64_declines(bp.forward); !reason.empty()) return reason;
  return gradient_bounds_declines(bp, std::numeric_limits<double>::max() / 2, "float64");
}

std::string backward_precision_declines(const core::BackwardParams& bp) {
  if (bp.forward.compute != DType::kF64) return backward_float32_declines(bp);
  return backward_float64_declines(bp);
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
  plan.row_panels = true;
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
