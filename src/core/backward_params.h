// The struct at the backward kernels' boundary: the forward's params (inputs, shape, options,
// modifiers, threads; its outputs unbound) plus what the backward reads and writes. Validation
// (validate_backward.h) builds it; backward kernels trust it and never throw.
#pragma once

#include "core/params.h"

namespace qkv::core {

struct BackwardParams {
  AttentionParams forward;  // q, k, v, shape, scale, compute (kF32 or kF64), masking, modifiers
  InputOperand out;         // O, [b, h, nq, dv], as the forward returned it
  // [b, h, nq] (col stride 0); -inf for a row with no allowed key. Validated, but the kernels
  // weigh with row statistics of their own (kernels/bwd_row_stats.h): exp(s - lse) loses the
  // weights' precision as scores grow. Except fused_hwy on a bf16 call whose scores are bounded
  // (bwd::forward_stats_suit): it weighs with this lse and takes D = dO·O from `out`.
  InputOperand lse;
  InputOperand grad_out;    // dO, [b, h, nq, dv]
  // D_i of each query row, [b, h, nq] in float64 (col stride 0), when the caller has it for
  // the whole row and the call sees only some keys (the ring's backward, src/dist); data ==
  // nullptr: the tiled kernels compute D_i = Σ_j P_ij·dP_ij themselves (bwd_row_stats.h), the
  // reference as dO_i·O_i with O recomputed in float64.
  InputOperand delta{nullptr, DType::kF64, {}};
  // The whole row's softmax statistics, when this call sees only some of its keys (the ring's
  // backward, one call per key block): row_max M* (a score of the row, as some kernel call
  // computed it) and row_sum l* = Σ_j exp(x_ij - M*) (the sink's share included), [b, h, nq]
  // in float64 (col stride 0). data == nullptr: the call's keys are the whole row.
  InputOperand row_max{nullptr, DType::kF64, {}};
  InputOperand row_sum{nullptr, DType::kF64, {}};
  // When set ([b·h·nq] each), the tiled kernels only write each row's M, l and u = Σ_j
  // exp(x_ij - M)·dP_ij over the call's keys (M = -inf for a row with none) and compute no
  // gradient: the ring merges these.
  double* stats_max = nullptr;
  double* stats_sum = nullptr;
  double* stats_dot = nullptr;
  OutputOperand dq;  // [b, h, nq, d]
  OutputOperand dk;  // [b, hkv, nk, d]
  OutputOperand dv;  // [b, hkv, nk, dv]
  // [h] in float64, or nullptr without sinks: kernels ADD each head's -Σ_i P_sink,i · D_i, so
  // that a packed batch's sequences (run one after another) sum into it.
  double* dsinks = nullptr;
  double grad_out_magnitude = 0.0;  // a bound on |dO| (the finiteness scan's)
};

}  // namespace qkv::core
