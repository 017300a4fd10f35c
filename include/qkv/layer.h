// The whole multi-head layer: from samples X (one per row) and projection matrices to the output.
//   Q = X·W^Q + b^Q,  K = M·W^K + b^K,  V = M·W^V + b^V   (M = X unless cross-attention)
//   head h = attention(Q_h, K_{h/(H/Hkv)}, V_{h/(H/Hkv)}),  Q_h = the h-th block of dk columns
//   out = concat_h(head h)·W^O + b^O   (or the concatenation itself without W^O)
// Heads are strided views of the projections, never copied.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "qkv/attention.h"
#include "qkv/tensor.h"

namespace qkv {

// The X·W convention: W^Q is [d, H·dk], W^K [d_m, Hkv·dk], W^V [d_m, Hkv·dv], W^O [H·dv, d_out];
// biases are 1-D of the matching width. (A PyTorch nn.Linear weight is the transpose.)
struct LayerWeights {
  TensorView wq, wk, wv;
  std::optional<TensorView> wo = std::nullopt;
  std::optional<TensorView> bq = std::nullopt;
  std::optional<TensorView> bk = std::nullopt;
  std::optional<TensorView> bv = std::nullopt;
  std::optional<TensorView> bo = std::nullopt;
};

struct LayerOptions {
  std::int64_t heads = 1;
  std::int64_t kv_heads = 0;  // 0: as many as heads
  // Mask, causal, window, scale, threads, kernel, out_dtype, the extra outputs and dropout. The
  // mask broadcasts to [B,H,Nq,Nk] ([H,Nq,Nk] for a 2-D X); weights come out in that shape.
  // Dropout (dropout_p, seed, dropout_offset) draws, for head h of batch b, the mask attention()
  // draws for (b, h) on the projected heads [B,H,N,dk] with the same seed and offset (a packed
  // batch: b is the sequence); multi_head_attention_backward given the same options draws it
  // again, so the gradients are those of the forward that ran.
  AttentionOptions attention;
};

struct LayerResult {
  Tensor out;      // [.., N, d_out], or [.., N, H·dv] without W^O
  Tensor weights;  // empty unless options.attention.return_weights
  Tensor lse;      // empty unless options.attention.return_lse
  std::string kernel;
};

// X·W (+ b): [.., N, d] · [d, n_out] -> [.., N, n_out], float32 when every input is, float64
// otherwise; what the layer does for each projection. Throws qkv::Error on a shape mismatch.
Tensor linear(const TensorView& x, const TensorView& w,
              const std::optional<TensorView>& bias = std::nullopt, int threads = 0);

// X is [B,N,d] or [N,d]. `memory`, when given, is cross-attention's source of K and V: same rank
// and batch as X, any length, width d_m. Float32 arithmetic when every input and the output are
// float32, float64 otherwise. Throws qkv::Error naming the offending tensor on bad input.
LayerResult multi_head_attention(const TensorView& x, const LayerWeights& weights,
                                 const LayerOptions& options,
                                 const std::optional<TensorView>& memory = std::nullopt);

// The layer's attention step: given the heads as views (Q [.., H, N, dk], K [.., Hkv, Nk, dk],
// V [.., Hkv, Nk, dv]) and options.attention, write O (and the lse when outputs.lse is given)
// into `outputs` and return the name of the kernel that ran. multi_head_attention's own step is
// attention_into; qkv layer --ring passes ring attention (qkv/dist.h), each rank's X its rows.
using AttentionStep =
    std::function<std::string(const TensorView& q, const TensorView& k, const TensorView& v,
                              const AttentionOptions& options, const AttentionOutputs& outputs)>;

// multi_head_attention with its attention step replaced (self-attention: K and V from X). The
// step is called once, after the projections, unless they throw.
LayerResult multi_head_attention(const TensorView& x, const LayerWeights& weights,
                                 const LayerOptions& options, const AttentionStep& step);

}  // namespace qkv
