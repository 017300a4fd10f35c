// The layer's backward (layer_backward.h): the chain rule through the output projection, the
// attention (one attention_backward call over the heads as strided views, as the forward runs
// them, or the caller's AttentionBackwardStep: the ring's, one rank's rows) and the three input
// projections, every product one CBLAS call on the calling thread and every bias gradient a
// column sum over rows in order, so the bits do not depend on the thread count
// (attention_backward's do not either).
//
//   dConcat = dY·W^Oᵀ, dW^O = Concatᵀ·dY, db^O = Σ_rows dY        (dConcat = dY without W^O)
//   dQ, dK, dV = attention_backward(Q_h, K_h, V_h, Concat_h, lse, dConcat_h)
//   dW^Q = Xᵀ·dQ, db^Q = Σ_rows dQ, dX = dQ·W^Qᵀ
//   dW^K = Mᵀ·dK, dW^V = Mᵀ·dV, dM = dK·W^Kᵀ + dV·W^Vᵀ            (M = X: added to dX)
#include "qkv/layer_backward.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "core/floating_point.h"
#include "core/memory_budget.h"
#include "core/parallel_for.h"
#include "core/validate.h"
#include "kernels/backward_kernel.h"
#include "kernels/kernel.h"
#include "layer/heads.h"
#include "qkv/attention_backward.h"
#include "qkv/error.h"

namespace qkv {
namespace {

using layer::as_matrix;
using layer::head_view;

// C (+)= op(A)·op(B) for contiguous row-major matrices of one dtype (kF32 or kF64); `rows_a`,
// `cols_a` are A's stored shape.
void gemm(bool trans_a, bool trans_b, const Tensor& a, const Tensor& b, Tensor& c, bool add) {
  const auto dims = [](const Tensor& t) { return std::pair{t.shape()[0], t.shape()[1]}; };
  const auto [ar, ac] = dims(a);
  const auto [br, bc] = dims(b);
  const std::int64_t m = trans_a ? ac : ar, k = trans_a ? ar : ac, n = trans_b ? br : bc;
  if (m == 0 || n == 0) return;
  const auto i = [](std::int64_t x) { return static_cast<int>(std::max<std::int64_t>(x, 1)); };
  const auto ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
  if (c.dtype() == DType::kF64) {
    cblas_dgemm(CblasRowMajor, ta, tb, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), 1.0, a.data_as<double>(), i(ac), b.data_as<double>(), i(bc),
                add ? 1.0 : 0.0, c.data_as<double>(), i(n));
  } else {
    cblas_sgemm(CblasRowMajor, ta, tb, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), 1.0f, a.data_as<float>(), i(ac), b.data_as<float>(), i(bc),
                add ? 1.0f : 0.0f, c.data_as<float>(), i(n));
  }
}

// op(A)·op(B) as a new [m, n] tensor.
Tensor product(bool trans_a, bool trans_b, const Tensor& a, const Tensor& b, std::int64_t m,
               std::int64_t n, const std::string& name) {
  Tensor c(a.dtype(), {m, n}, name);
  gemm(trans_a, trans_b, a, b, c, false);
  return c;
}

// The column sums of a [rows, cols] matrix, rows in order.
template <class T>
void column_sums(const Tensor& m, Tensor& sums) {
  const std::int64_t rows = m.shape()[0], cols = m.shape()[1];
  T* out = sums.data_as<T>();
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) out[c] += m.data_as<T>()[r * cols + c];
  }
}
Tensor bias_gradient(const Tensor& m, const std::string& name) {
  Tensor sums(m.dtype(), {m.shape()[1]}, name);
  if (m.dtype() == DType::kF64) {
    column_sums<double>(m, sums);
  } else {
    column_sums<float>(m, sums);
  }
  return sums;
}

// A [B, heads, N, width] (or [heads, N, width]) gradient as the [B·N, heads·width] rows of the
// projection it belongs to.
Tensor heads_to_rows(const Tensor& g, bool batched, std::int64_t b, std::int64_t n,
                     std::int64_t heads, std::int64_t width, const std::string& name) {
  Tensor rows(g.dtype(), {b * n, heads * width}, name);
  const MutableTensorView view =
      head_view<MutableTensorView>(rows.data(), g.dtype(), batched, b, n, heads, width, name);
  const auto element = static_cast<std::int64_t>(dtype_size(g.dtype()));
  const char* src = static_cast<const char*>(g.data());
  char* dst = static_cast<char*>(view.data);
  // g is contiguous in [b][h][i][c]; view strides place (b, h, i) rows of `width` elements.
  const std::int64_t sb = batched ? view.strides[0] : 0, sh = view.strides[batched ? 1 : 0],
                     si = view.strides[batched ? 2 : 1];
  for (std::int64_t bi = 0; bi < b; ++bi) {
    for (std::int64_t h = 0; h < heads; ++h) {
      for (std::int64_t i = 0; i < n; ++i) {
        std::memcpy(dst + (bi * sb + h * sh + i * si) * element, src,
                    static_cast<std::size_t>(width * element));
        src += width * element;
      }
    }
  }
  return rows;
}

Tensor shaped(Tensor t, const Shape& shape) {
  t.reshape(shape);
  return t;
}

void require_forward(const LayerForwardState& state) {
  if (state.q.empty() || state.concat.empty() || state.lse.empty()) {
    throw Error("state", "holds no forward: fill it with multi_head_attention(..., state)");
  }
}

// The backward from a filled state; `step` null runs attention_backward.
LayerGradients run_backward(const TensorView& x, const LayerWeights& weights,
                            const LayerOptions& options, const TensorView& grad_out,
                            const std::optional<TensorView>& memory, const LayerForwardState* state,
                            const AttentionBackwardStep* step) {
  const core::FloatingPointScope floating_point;  // the default environment (floating_point.h)
  const std::int64_t heads = options.heads;
  const std::int64_t kv_heads = options.kv_heads == 0 ? heads : options.kv_heads;
  Shape out_shape = x.shape;
  out_shape.back() = weights.wo ? weights.wo->dim(1) : heads * (weights.wv.dim(1) / kv_heads);
  if (grad_out.shape != out_shape) {
    throw Error(grad_out.name, "shape " + shape_string(grad_out.shape) + " should be " +
                                   shape_string(out_shape) + " (the layer's output)");
  }
  core::require_view_consistent(grad_out);
  // As attention_backward refuses it: a bool DY would be read as 0/1 gradients.
  if (grad_out.dtype != DType::kF32 && grad_out.dtype != DType::kF64 &&
      grad_out.dtype != DType::kBF16 && grad_out.dtype != DType::kF16) {
    throw Error(grad_out.name, std::string("dtype ") + dtype_name(grad_out.dtype) +
                                   " is not supported (expected float32, float64, bfloat16 or "
                                   "float16)");
  }
  core::require_finite(grad_out);
  const DType compute = state->q.dtype();
  const bool batched = x.rank() == 3;
  const TensorView& source = memory ? *memory : x;
  const std::int64_t batch = batched ? x.dim(0) : 1, nq = x.dim(-2), nk = source.dim(-2);
  const std::int64_t dk = weights.wq.dim(1) / heads, dv = weights.wv.dim(1) / kv_heads;

  LayerGradients g;
  const Tensor dy = as_matrix(grad_out, compute);
  Tensor dconcat;
  if (weights.wo) {
    const Tensor wo = as_matrix(*weights.wo, compute);
    dconcat = product(false, true, dy, wo, batch * nq, heads * dv, "dConcat");
    g.dwo = product(true, false, state->concat, dy, heads * dv, dy.shape()[1], "dwo");
    if (weights.bo) g.dbo = bias_gradient(dy, "dbo");
  } else {
    dconcat = dy.to(compute);
  }

  const TensorView q_heads =
      head_view<TensorView>(state->q.data(), compute, batched, batch, nq, heads, dk, "Q");
  const TensorView k_heads =
      head_view<TensorView>(state->k.data(), compute, batched, batch, nk, kv_heads, dk, "K");
  const TensorView v_heads =
      head_view<TensorView>(state->v.data(), compute, batched, batch, nk, kv_heads, dv, "V");
  const TensorView o_heads = head_view<TensorView>(state->concat.data(), compute, batched, batch,
                                                   nq, heads, dv, "concatenated heads");
  const TensorView do_heads =
      head_view<TensorView>(dconcat.data(), compute, batched, batch, nq, heads, dv, "dConcat");
  // The layer's products run in its compute type: a bf16 attention (options.attention.dtype)
  // hands back its float32 gradients.
  AttentionOptions attention = options.attention;
  attention.grad_dtype.reset();
  if (attention.dtype == DType::kBF16) attention.grad_dtype = DType::kF32;
  AttentionGradients a = step != nullptr
                             ? (*step)(q_heads, k_heads, v_heads, o_heads, state->lse.view(),
                                       do_heads, attention)
                             : attention_backward(q_heads, k_heads, v_heads, o_heads,
                                                  state->lse.view(), do_heads, attention);
  for (Tensor* t : {&a.dq, &a.dk, &a.dv}) {
    if (t->dtype() != compute) *t = t->to(compute);
  }
  g.kernel = a.kernel;
  g.dsinks = std::move(a.dsinks);
  const Tensor dq = heads_to_rows(a.dq, batched, batch, nq, heads, dk, "dQ");
  const Tensor dk_rows = heads_to_rows(a.dk, batched, batch, nk, kv_heads, dk, "dK");
  const Tensor dv_rows = heads_to_rows(a.dv, batched, batch, nk, kv_heads, dv, "dV");

  const Tensor x_rows = as_matrix(x, compute);
  const Tensor m_rows = memory ? as_matrix(*memory, compute) : Tensor();
  const Tensor& kv_rows = memory ? m_rows : x_rows;
  const Tensor wq = as_matrix(weights.wq, compute), wk = as_matrix(weights.wk, compute),
               wv = as_matrix(weights.wv, compute);
  g.dwq = product(true, false, x_rows, dq, x_rows.shape()[1], heads * dk, "dwq");
  g.dwk = product(true, false, kv_rows, dk_rows, kv_rows.shape()[1], kv_heads * dk, "dwk");
  g.dwv = product(true, false, kv_rows, dv_rows, kv_rows.shape()[1], kv_heads * dv, "dwv");
  if (weights.bq) g.dbq = bias_gradient(dq, "dbq");
  if (weights.bk) g.dbk = bias_gradient(dk_rows, "dbk");
  if (weights.bv) g.dbv = bias_gradient(dv_rows, "dbv");

  Tensor dx = product(false, true, dq, wq, batch * nq, x_rows.shape()[1], "dx");
  Tensor dm = memory ? Tensor(compute, {batch * nk, kv_rows.shape()[1]}, "dmemory") : Tensor();
  Tensor& dkv = memory ? dm : dx;  // where K's and V's inputs' gradients go
  gemm(false, true, dk_rows, wk, dkv, true);
  gemm(false, true, dv_rows, wv, dkv, true);
  g.dx = shaped(std::move(dx), x.shape);
  if (memory) g.dmemory = shaped(std::move(dm), memory->shape);
  return g;
}

}  // namespace

std::uint64_t multi_head_attention_backward_memory(const TensorView& x,
                                                   const LayerWeights& weights,
                                                   const LayerOptions& options,
                                                   const std::optional<TensorView>& memory) {
  const core::LayerShape s = layer::checked_layer_shape(x, weights, options, memory);
  const int threads = core::resolve_thread_count(options.attention.threads);
  const core::AttentionShape a{s.b, s.heads, s.kv_heads, s.nq, s.nk, s.dk, s.dv};
  const core::MemoryEstimate forward = core::layer_memory(
      s, options.attention,
      kernels::attention_workspace_bytes(a, threads, options.attention.kernel,
                                         options.attention.dtype.value_or(s.compute)));
  const std::uint64_t attention =
      kernels::backward_memory(a, threads, s.compute, options.attention.sinks.has_value())
          .total();
  const bool biases = weights.bq || weights.bk || weights.bv || weights.bo;
  const std::uint64_t held = core::saturating_add(forward.outputs, core::layer_state_memory(s));
  const std::uint64_t backward =
      core::saturating_add(held, core::layer_backward_memory(s, attention, biases).total());
  return std::max(forward.total(), backward);
}

LayerGradients multi_head_attention_backward(const TensorView& x, const LayerWeights& weights,
                                             const LayerOptions& options,
                                             const TensorView& grad_out,
                                             const std::optional<TensorView>& memory,
                                             const LayerForwardState* state) {
  // Without a state the forward runs here (and validates every input); with one, the inputs
  // are those its forward validated.
  LayerForwardState computed;
  if (state == nullptr) {
    // options.progress hears the backward's key rows only, not a forward's query rows too.
    LayerOptions forward = options;
    forward.attention.progress = nullptr;
    multi_head_attention(x, weights, forward, memory, computed);
    state = &computed;
  } else {
    require_forward(*state);
  }
  return run_backward(x, weights, options, grad_out, memory, state, nullptr);
}

LayerGradients multi_head_attention_backward(const TensorView& x, const LayerWeights& weights,
                                             const LayerOptions& options,
                                             const TensorView& grad_out,
                                             const LayerForwardState& state,
                                             const AttentionBackwardStep& step) {
  require_forward(state);
  return run_backward(x, weights, options, grad_out, std::nullopt, &state, &step);
}

}  // namespace qkv
