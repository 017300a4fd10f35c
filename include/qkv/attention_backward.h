// qkv::attention_backward: the gradients of attention with respect to Q, K, V (and the sinks).
//
// With O = attention(Q, K, V, options) and L = Σ O∘dO for a given dO (grad_out), the
// gradients are, per query head h and row i, with P the softmax weights (the sink's weight
// P_sink,i = exp(sink_h - lse_i)) and s the scores before the softcap's tanh:
//   D_i   = Σ_c dO_ic · O_ic                     (= Σ_j P_ij · dP_ij)
//   dV_j  = Σ_i P_ij · dO_i                      dP_ij = dO_i · v_j
//   dS_ij = P_ij · (dP_ij - D_i)                 through softcap C: dS_ij · (1 - tanh²(s_ij/C))
//   dQ_i  = scale · Σ_j dS_ij · k_j              dK_j  = scale · Σ_i dS_ij · q_i
//   dsink_h = -Σ_i P_sink,i · D_i
// A kv head's dK and dV sum over the query heads that read it (grouped-query). ALiBi and float
// masks add constants to the scores: they pass gradients through unchanged and get none.
// A row with no allowed key has P = 0 and contributes nothing: zero gradients, never NaN.
#pragma once

#include <string>
#include <vector>

#include "qkv/attention.h"
#include "qkv/tensor.h"

namespace qkv {

struct AttentionGradients {
  Tensor dq;                    // Q's shape
  Tensor dk;                    // K's shape
  Tensor dv;                    // V's shape
  Tensor dsinks;                // [H]; empty unless options.sinks
  std::string kernel;           // the backward kernel that ran
  DType compute = DType::kF32;  // kF32 or kF64: the gradients' dtype and what they were computed in
  int threads = 1;              // the threads the kernel was given
};

// `out` and `lse` are what attention(q, k, v, options) returned for the same inputs and
// options (return_lse = true); `grad_out` (dO) has the output's shape. Every forward option is
// honoured (masks, causal, window, grouped-query heads, Dv != D, scale, softcap, ALiBi, sinks,
// packed batches, strided views). Float64 inputs compute in float64 (the gradients are then
// float64), anything else in float32; a bf16 or f16 storage type (options.dtype, or Q, K and V
// all stored in one) is refused: ask for options.dtype = kF32 to differentiate 16-bit inputs
// in float32. options.kernel names a backward kernel (attention_backward_kernel_names());
// return_weights, return_lse and out_dtype are ignored. options.progress counts key rows of
// single kv heads whose dK and dV are written (total = B·Hkv·Nk, or Hkv·total_k for a packed
// batch), once per kernel task, under the forward's rules (attention.h); listening changes no
// bit. Gradients are bitwise identical for any thread count. Throws qkv::Error naming the
// offending tensor or option on bad input.
AttentionGradients attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                      const TensorView& out, const TensorView& lse,
                                      const TensorView& grad_out,
                                      const AttentionOptions& options = {});

// The backward kernels, fastest first, the reference last; any name may go in options.kernel.
std::vector<std::string> attention_backward_kernel_names();

// Which backward kernel attention_backward would choose and why, one line per kernel (as
// explain_kernel_choice does for the forward).
std::string explain_backward_kernel_choice(const TensorView& q, const TensorView& k,
                                           const TensorView& v, const TensorView& out,
                                           const TensorView& lse, const TensorView& grad_out,
                                           const AttentionOptions& options = {});

}  // namespace qkv
