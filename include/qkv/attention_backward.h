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

#include <cstdint>
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
  // What the gradients were computed in: kF32, kF64 or kBF16 (bf16 products, float32 sums);
  // their dtype is options.grad_dtype's (dq.dtype()).
  DType compute = DType::kF32;
  int threads = 1;              // the threads the kernel was given
};

// `out` and `lse` are what attention(q, k, v, options) returned for the same inputs and
// options (return_lse = true); `grad_out` (dO) has the output's shape. Every forward option is
// honoured (masks, causal, window, grouped-query heads, Dv != D, scale, softcap, ALiBi, sinks,
// packed batches, strided views, dropout). The backward computes in the forward's storage
// type: float64 (gradients float64), bf16 (options.dtype = kBF16, or Q, K and V all stored in
// it), else float32. bf16 is FlashAttention-2's bf16 backward: Q, K, V and dO rounded to bf16;
// S = Q·Kᵀ and dP = dO·Vᵀ as bf16 dot products with float32 sums (vdpbf16ps on AVX512-BF16,
// elsewhere float32 FMAs, which multiply two bf16 values exactly); the softmax statistics, P,
// D and dS in float32; P and dS rounded to bf16 only as the operands of dV += Pᵀ·dO,
// dK += dSᵀ·Q and dQ += dS·K, whose sums are float32; the gradients bf16 (those sums rounded
// once) unless options.grad_dtype = kF32. An f16 storage type is refused: ask for kF32 or
// kBF16. options.kernel names a backward kernel (attention_backward_kernel_names());
// return_weights, return_lse and out_dtype are ignored. options.progress counts key rows of
// single kv heads whose dK and dV are written (total = B·Hkv·Nk, or Hkv·total_k for a packed
// batch), once per kernel task, under the forward's rules (attention.h); listening changes no
// bit. Gradients are bitwise identical for any thread count. Throws qkv::Error naming the
// offending tensor or option on bad input.
AttentionGradients attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                      const TensorView& out, const TensorView& lse,
                                      const TensorView& grad_out,
                                      const AttentionOptions& options = {});

// The bytes attention_backward allocates for these inputs and options (the gradients and the
// kernels' workspace), from the shapes alone, as it counts them against options.max_memory; with
// the forward's outputs it is what a forward and its backward need together, so a budget can be
// checked for both before either runs. Throws qkv::Error on inputs attention() would refuse.
std::uint64_t attention_backward_memory(const TensorView& q, const TensorView& k,
                                        const TensorView& v, const AttentionOptions& options = {});

// The backward kernels, fastest first, the reference last; any name may go in options.kernel.
std::vector<std::string> attention_backward_kernel_names();

// Which backward kernel attention_backward would choose and why, one line per kernel (as
// explain_kernel_choice does for the forward).
std::string explain_backward_kernel_choice(const TensorView& q, const TensorView& k,
                                           const TensorView& v, const TensorView& out,
                                           const TensorView& lse, const TensorView& grad_out,
                                           const AttentionOptions& options = {});

}  // namespace qkv
