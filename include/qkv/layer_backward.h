// The gradients of the multi-head layer (layer.h): with Y = multi_head_attention(X, W, options)
// and L = Σ Y∘dY for a given dY (grad_out),
//   dConcat = dY·W^Oᵀ, dW^O = Concatᵀ·dY, db^O = Σ_rows dY       (with W^O)
//   per head: dQ_h, dK_h, dV_h = attention_backward(Q_h, K_h, V_h, O_h, lse_h, dConcat_h)
//   dW^Q = Xᵀ·dQ, db^Q = Σ_rows dQ, dX = dQ·W^Qᵀ (+ dK·W^Kᵀ + dV·W^Vᵀ without a memory)
//   dW^K = Mᵀ·dK, dW^V = Mᵀ·dV, dM = dK·W^Kᵀ + dV·W^Vᵀ            (cross-attention)
// The products run through CBLAS; the heads are strided views, as in the forward.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "qkv/attention_backward.h"
#include "qkv/layer.h"

namespace qkv {

// What the forward computed that the backward needs, so that nothing is computed twice: the
// projections ([.., N, H·dk], [.., Nk, Hkv·dk], [.., Nk, Hkv·dv]), the heads' concatenation
// ([.., N, H·dv], W^O's input) and the lse ([.., H, N]).
struct LayerForwardState {
  Tensor q, k, v, concat, lse;
};

struct LayerGradients {
  Tensor dx;       // X's shape
  Tensor dmemory;  // the memory's shape; empty without cross-attention
  Tensor dwq, dwk, dwv;
  Tensor dwo;                 // empty without W^O
  Tensor dbq, dbk, dbv, dbo;  // each empty where that bias is absent
  Tensor dsinks;              // [H]; empty without sinks
  std::string kernel;         // the attention backward kernel that ran
};

// The forward, also filling `state` for the backward.
LayerResult multi_head_attention(const TensorView& x, const LayerWeights& weights,
                                 const LayerOptions& options,
                                 const std::optional<TensorView>& memory, LayerForwardState& state);

// The forward with its attention step replaced (layer.h's AttentionStep; self-attention), also
// filling `state` for the backward: what qkv layer --ring runs on each rank before its backward.
LayerResult multi_head_attention(const TensorView& x, const LayerWeights& weights,
                                 const LayerOptions& options, const AttentionStep& step,
                                 LayerForwardState& state);

// `state` from the forward on the same inputs, or nullptr to recompute it (that forward does
// not report to options.attention.progress, which counts the attention backward's key rows,
// attention_backward.h). Gradients are float32, or float64 when the layer computes in float64;
// bitwise identical for any thread count. Throws qkv::Error naming the offending tensor or
// option on bad input.
LayerGradients multi_head_attention_backward(const TensorView& x, const LayerWeights& weights,
                                             const LayerOptions& options,
                                             const TensorView& grad_out,
                                             const std::optional<TensorView>& memory = std::nullopt,
                                             const LayerForwardState* state = nullptr);

// The bytes multi_head_attention (filling a state) and multi_head_attention_backward allocate
// together for these inputs and options, from the shapes alone (no value is read): the larger
// of the forward's own estimate (what it counts against options.attention.max_memory) and what
// the forward leaves held (its outputs and the state) plus the backward's allocations
// (attention_backward_memory's share among them), each counted as alive at once. So a budget
// can be checked for both before either runs, as qkv layer --grad-out --max-memory does. Throws
// qkv::Error on shapes multi_head_attention would refuse.
std::uint64_t multi_head_attention_backward_memory(
    const TensorView& x, const LayerWeights& weights, const LayerOptions& options,
    const std::optional<TensorView>& memory = std::nullopt);

// The layer's backward attention step: given the heads as views (Q [.., H, N, dk], K
// [.., Hkv, Nk, dk], V [.., Hkv, Nk, dv], O and dO [.., H, N, dv], the lse [.., H, N]) and
// options.attention, return attention_backward's gradients (dQ, dK, dV in the heads' shapes,
// dsinks, the kernel's name). multi_head_attention_backward's own step is attention_backward;
// qkv layer --ring passes the ring's backward (qkv/dist.h), each rank's X its rows.
using AttentionBackwardStep = std::function<AttentionGradients(
    const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
    const TensorView& lse, const TensorView& grad_out, const AttentionOptions& options)>;

// multi_head_attention_backward with its attention step replaced (self-attention; `state` from
// the forward with the matching step). The step is called once, after the output projection's
// gradients. Every gradient is what these rows contribute: with X one rank's rows, dX is that
// rank's rows of dX, while dW^Q, dW^K, dW^V, dW^O and the biases' gradients are this rank's
// part of sums over every row, for the caller to add up over the ranks; dsinks is the step's,
// as it returned it (the ring's is already summed over the ranks).
LayerGradients multi_head_attention_backward(const TensorView& x, const LayerWeights& weights,
                                             const LayerOptions& options,
                                             const TensorView& grad_out,
                                             const LayerForwardState& state,
                                             const AttentionBackwardStep& step);

}  // namespace qkv
