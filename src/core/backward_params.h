// The struct at the backward kernels' boundary: the forward's params (inputs, shape, options,
// modifiers, threads; its outputs unbound) plus what the backward reads and writes. Validation
// (validate_backward.h) builds it; backward kernels trust it and never throw.
#pragma once

#include "core/params.h"

namespace qkv::core {

struct BackwardParams {
  AttentionParams forward;  // q, k, v, shape, scale, compute (kF32 or kF64), masking, modifiers
  InputOperand out;         // O, [b, h, nq, dv], as the forward returned it
  InputOperand lse;         // [b, h, nq] (col stride 0); -inf for a row with no allowed key
  InputOperand grad_out;    // dO, [b, h, nq, dv]
  // D_i = Σ_c dO_ic·O_ic of each query row, [b, h, nq] in float64 (col stride 0), when the
  // caller has computed it once for many calls (the ring's backward, src/dist); data ==
  // nullptr: the tiled kernels compute it from out and grad_out (the reference always does).
  InputOperand delta{nullptr, DType::kF64, {}};
  OutputOperand dq;  // [b, h, nq, d]
  OutputOperand dk;  // [b, hkv, nk, d]
  OutputOperand dv;  // [b, hkv, nk, dv]
  // [h] in float64, or nullptr without sinks: kernels ADD each head's -Σ_i P_sink,i · D_i, so
  // that a packed batch's sequences (run one after another) sum into it.
  double* dsinks = nullptr;
  double grad_out_magnitude = 0.0;  // a bound on |dO| (the finiteness scan's)
};

}  // namespace qkv::core
