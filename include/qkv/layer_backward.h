// The gradients of the multi-head layer (layer.h): with Y = multi_head_attention(X, W, options)
// and L = Σ Y∘dY for a given dY (grad_out),
//   dConcat = dY·W^Oᵀ, dW^O = Concatᵀ·dY, db^O = Σ_rows dY       (with W^O)
//   per head: dQ_h, dK_h, dV_h = attention_backward(Q_h, K_h, V_h, O_h, lse_h, dConcat_h)
//   dW^Q = Xᵀ·dQ, db^Q = Σ_rows dQ, dX = dQ·W^Qᵀ (+ dK·W^Kᵀ + dV·W^Vᵀ without a memory)
//   dW^K = Mᵀ·dK, dW^V = Mᵀ·dV, dM = dK·W^Kᵀ + dV·W^Vᵀ            (cross-attention)
// The products run through CBLAS; the heads are strided views, as in the forward.
#pragma once

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

// `state` from the forward on the same inputs, or nullptr to recompute it. Gradients are
// float32, or float64 when the layer computes in float64; bitwise identical for any thread
// count. Throws qkv::Error naming the offending tensor or option on bad input.
LayerGradients multi_head_attention_backward(const TensorView& x, const LayerWeights& weights,
                                             const LayerOptions& options,
                                             const TensorView& grad_out,
                                             const std::optional<TensorView>& memory = std::nullopt,
                                             const LayerForwardState* state = nullptr);

}  // namespace qkv
