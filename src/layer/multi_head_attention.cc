// The multi-head layer: projections through CBLAS, then one attention call over strided views.
//
// With Q = X·W^Q stored as [B·N, H·dk], head h is the column block [h·dk, (h+1)·dk), so the
// view [B, H, N, dk] has strides (N·H·dk, dk, H·dk, 1): heads are strides, never copies. The
// attention output is written the same way into the concatenation [B·N, H·dv], which is then
// exactly the left operand of the output projection.
#include <optional>
#include <string>
#include <vector>

#include "core/floating_point.h"
#include "core/memory_budget.h"
#include "core/parallel_for.h"
#include "core/validate.h"
#include "kernels/kernel.h"
#include "layer/heads.h"
#include "layer/projection.h"
#include "qkv/error.h"
#include "qkv/layer.h"
#include "qkv/layer_backward.h"

namespace qkv {
namespace {

using layer::as_matrix;
using layer::head_view;

std::string str(std::int64_t n) { return std::to_string(n); }

void require_rank(const TensorView& t, int rank, const char* what) {
  if (t.rank() != rank) {
    throw Error(t.name, std::string("expected ") + what + ", got " + str(t.rank()) + " dims " +
                            shape_string(t.shape));
  }
}

// bfloat16 and float16 (as safetensors weights often are) are taken too: every operand is copied
// into the compute dtype before its CBLAS call (as_matrix), which widens them exactly.
void require_real_finite(const TensorView& t) {
  if (t.dtype != DType::kF32 && t.dtype != DType::kF64 && t.dtype != DType::kBF16 &&
      t.dtype != DType::kF16) {
    throw Error(t.name, std::string("dtype ") + dtype_name(t.dtype) +
                            " is not supported (expected float32, float64, bfloat16 or float16)");
  }
  core::require_finite(t);
}

// float32 unless some operand is float64 (16-bit operands widen to float32 exactly).
bool computes_in_f32(const TensorView& t) { return t.dtype != DType::kF64; }

// Checks that W is [rows, cols] with `rows` given and returns cols.
std::int64_t check_matrix(const TensorView& w, std::int64_t rows, const std::string& rows_source) {
  require_rank(w, 2, "a 2-D weight matrix [in, out] (the X·W convention)");
  if (w.dim(0) != rows) {
    throw Error(w.name, "has " + str(w.dim(0)) + " rows but " + rows_source + " has width " +
                            str(rows) + " (weights are [in, out]: an nn.Linear weight transposed)");
  }
  return w.dim(1);
}

void check_bias(const std::optional<TensorView>& bias, std::int64_t width, const TensorView& w) {
  if (!bias) return;
  require_rank(*bias, 1, "a 1-D bias");
  if (bias->dim(0) != width) {
    throw Error(bias->name, "has " + str(bias->dim(0)) + " entries but " + w.name + " has " +
                                str(width) + " columns");
  }
}

Tensor as_bias(const std::optional<TensorView>& bias, DType dtype) {
  return bias ? contiguous_copy(*bias, dtype) : Tensor();
}

}  // namespace

Tensor linear(const TensorView& x, const TensorView& w, const std::optional<TensorView>& bias,
              int threads) {
  if (x.rank() < 1) throw Error(x.name, "expected at least 1 dim, got a scalar");
  const std::int64_t width = check_matrix(w, x.dim(-1), x.name);
  check_bias(bias, width, w);
  bool all_f32 = true;
  for (const TensorView* t : {&x, &w}) {
    require_real_finite(*t);
    all_f32 = all_f32 && computes_in_f32(*t);
  }
  if (bias) {
    require_real_finite(*bias);
    all_f32 = all_f32 && computes_in_f32(*bias);
  }
  const DType compute = all_f32 ? DType::kF32 : DType::kF64;
  Tensor out = layer::project(as_matrix(x, compute), as_matrix(w, compute), as_bias(bias, compute),
                              core::resolve_thread_count(threads), x.name + "·" + w.name);
  Shape shape = x.shape;
  shape.back() = width;
  out.reshape(shape);
  return out;
}

namespace {

// The inputs the layer reads, optional ones included when given.
std::vector<const TensorView*> layer_inputs(const TensorView& x, const LayerWeights& weights,
                                            const std::optional<TensorView>& memory) {
  std::vector<const TensorView*> inputs = {&x, &weights.wq, &weights.wk, &weights.wv};
  if (memory) inputs.push_back(&*memory);
  for (const auto* optional : {&weights.wo, &weights.bq, &weights.bk, &weights.bv, &weights.bo}) {
    if (*optional) inputs.push_back(&**optional);
  }
  return inputs;
}

}  // namespace

namespace layer {

core::LayerShape checked_layer_shape(const TensorView& x, const LayerWeights& weights,
                                     const LayerOptions& options,
                                     const std::optional<TensorView>& memory) {
  // Every shape against the contract.
  if (x.rank() != 2 && x.rank() != 3) {
    throw Error(x.name, "expected [N, d] or [B, N, d] (one sample per row), got " + str(x.rank()) +
                            " dims " + shape_string(x.shape));
  }
  const bool batched = x.rank() == 3;
  const TensorView& source = memory ? *memory : x;
  if (memory) {
    if (memory->rank() != x.rank()) {
      throw Error(memory->name, "expected " + str(x.rank()) + " dims like " + x.name + ", got " +
                                    str(memory->rank()) + " " + shape_string(memory->shape));
    }
    if (batched && memory->dim(0) != x.dim(0)) {
      throw Error(memory->name, "batch size " + str(memory->dim(0)) + " differs from " + x.name +
                                    "'s " + str(x.dim(0)));
    }
  }
  const std::int64_t batch = batched ? x.dim(0) : 1;
  const std::int64_t nq = x.dim(-2);
  const std::int64_t nk = source.dim(-2);
  const std::int64_t d = x.dim(-1);
  const std::int64_t d_m = source.dim(-1);

  // Zero rows are an empty call; zero-width samples have nothing to project (the projections'
  // CBLAS calls need a leading dimension of at least 1), so they are refused.
  if (d < 1) throw Error(x.name, "samples have width 0: there is nothing to project");
  if (d_m < 1) throw Error(source.name, "samples have width 0: there is nothing to project");

  const std::int64_t heads = options.heads;
  const std::int64_t kv_heads = options.kv_heads == 0 ? heads : options.kv_heads;
  if (heads < 1) throw Error("heads", "must be at least 1");
  if (kv_heads < 1) throw Error("kv-heads", "must be at least 1");
  if (heads % kv_heads != 0) {
    throw Error("kv-heads", str(kv_heads) + " kv heads do not divide " + str(heads) +
                                " query heads (H % Hkv must be 0)");
  }

  const std::int64_t q_width = check_matrix(weights.wq, d, x.name);
  if (q_width == 0) {
    throw Error(weights.wq.name, "has 0 columns: each of the " + str(heads) +
                                     " heads needs a query width of at least 1");
  }
  if (q_width % heads != 0) {
    throw Error(weights.wq.name, str(q_width) + " columns do not split into " + str(heads) +
                                     " heads of equal width");
  }
  const std::int64_t dk = q_width / heads;
  const std::int64_t k_width = check_matrix(weights.wk, d_m, source.name);
  if (k_width != kv_heads * dk) {
    throw Error(weights.wk.name, "has " + str(k_width) + " columns, expected " + str(kv_heads) +
                                     " kv heads x dk " + str(dk) + " = " + str(kv_heads * dk) +
                                     " (dk from " + weights.wq.name + ")");
  }
  const std::int64_t v_width = check_matrix(weights.wv, d_m, source.name);
  if (v_width % kv_heads != 0) {
    throw Error(weights.wv.name, str(v_width) + " columns do not split into " + str(kv_heads) +
                                     " kv heads of equal width");
  }
  const std::int64_t dv = v_width / kv_heads;
  std::int64_t d_out = heads * dv;
  if (weights.wo) d_out = check_matrix(*weights.wo, heads * dv, "the concatenated heads");
  if (weights.bo && !weights.wo) {
    throw Error(weights.bo->name, "an output bias needs an output projection (--wo)");
  }
  check_bias(weights.bq, q_width, weights.wq);
  check_bias(weights.bk, k_width, weights.wk);
  check_bias(weights.bv, v_width, weights.wv);
  if (weights.wo) check_bias(weights.bo, d_out, *weights.wo);

  // A float16 output is computed in float32 and rounded once at the end.
  const DType out_dtype = options.attention.out_dtype;
  bool all_f32 = out_dtype == DType::kF16 || out_dtype == DType::kF32;
  for (const TensorView* t : layer_inputs(x, weights, memory)) {
    all_f32 = all_f32 && computes_in_f32(*t);
  }
  return core::LayerShape{batch,
                          nq,
                          nk,
                          d,
                          d_m,
                          heads,
                          kv_heads,
                          dk,
                          dv,
                          d_out,
                          memory.has_value(),
                          weights.wo.has_value(),
                          all_f32 ? DType::kF32 : DType::kF64};
}

}  // namespace layer

namespace {

// The forward; with `state`, it also keeps what the backward reads (layer_backward.h).
LayerResult run_layer(const TensorView& x, const LayerWeights& weights, const LayerOptions& options,
                      const std::optional<TensorView>& memory, LayerForwardState* state,
                      const AttentionStep* step = nullptr) {
  const core::FloatingPointScope floating_point;  // the default environment (floating_point.h)
  // Validation: every shape against the contract, then every value finite.
  const core::LayerShape layer_shape = layer::checked_layer_shape(x, weights, options, memory);
  for (const TensorView* t : layer_inputs(x, weights, memory)) require_real_finite(*t);
  const bool batched = x.rank() == 3;
  const TensorView& source = memory ? *memory : x;
  const std::int64_t batch = layer_shape.b, nq = layer_shape.nq, nk = layer_shape.nk;
  const std::int64_t heads = layer_shape.heads, kv_heads = layer_shape.kv_heads;
  const std::int64_t dk = layer_shape.dk, dv = layer_shape.dv, d_out = layer_shape.d_out;
  const DType out_dtype = options.attention.out_dtype;
  const DType held = out_dtype == DType::kF16 ? DType::kF32 : out_dtype;
  const DType compute = layer_shape.compute;
  const int threads = core::resolve_thread_count(options.attention.threads);

  const core::AttentionShape attention_shape{batch, heads, kv_heads, nq, nk, dk, dv};
  // The attention's own options (softcap, ALiBi, sinks, dropout) checked now, as attention()
  // will check them on the projected heads, so that a bad one is refused before the projections
  // run rather than after (and before the budget: bad input before a limit).
  {
    core::AttentionParams heads_params;
    heads_params.shape = attention_shape;
    core::apply_score_modifiers(options.attention, heads_params);
  }
  // Refused here, before the projections allocate anything, if the whole call cannot fit.
  const std::uint64_t workspace =
      kernels::attention_workspace_bytes(attention_shape, threads, options.attention.kernel,
                                         options.attention.dtype.value_or(compute));
  core::check_memory_budget(core::layer_memory(layer_shape, options.attention, workspace),
                            options.attention.max_memory, "the layer");

  // Projections: [B·N, d] · [d, width] for Q, and from the memory (or X) for K and V.
  const Tensor x_rows = as_matrix(x, compute);
  const Tensor m_rows = memory ? as_matrix(*memory, compute) : Tensor();
  const Tensor& kv_rows = memory ? m_rows : x_rows;
  const std::string q_name = "Q = " + x.name + "·" + weights.wq.name;
  const std::string k_name = "K = " + source.name + "·" + weights.wk.name;
  const std::string v_name = "V = " + source.name + "·" + weights.wv.name;
  const auto project = [&](const Tensor& rows, const TensorView& w,
                           const std::optional<TensorView>& bias, const std::string& name) {
    return layer::project(rows, as_matrix(w, compute), as_bias(bias, compute), threads, name);
  };
  Tensor q = project(x_rows, weights.wq, weights.bq, q_name);
  Tensor k = project(kv_rows, weights.wk, weights.bk, k_name);
  Tensor v = project(kv_rows, weights.wv, weights.bv, v_name);

  // Attention over the heads, written straight into the concatenation.
  LayerResult result;
  Tensor concat(compute, {batch * nq, heads * dv}, "concatenated heads");
  AttentionOutputs outputs;
  outputs.out = head_view<MutableTensorView>(concat.data(), compute, batched, batch, nq, heads, dv,
                                             concat.name());
  Shape score_shape = {heads, nq, nk};
  if (batched) score_shape.insert(score_shape.begin(), batch);
  if (options.attention.return_weights) {
    result.weights = Tensor(held, score_shape, "weights");
    outputs.weights = result.weights.mutable_view();
  }
  const Shape lse_shape(score_shape.begin(), score_shape.end() - 1);
  if (state != nullptr) {  // the backward's lse, in the compute type; --lse gets a copy
    state->lse = Tensor(compute, lse_shape, "lse");
    outputs.lse = state->lse.mutable_view();
  } else if (options.attention.return_lse) {
    result.lse = Tensor(held, lse_shape, "lse");
    outputs.lse = result.lse.mutable_view();
  }
  const TensorView q_heads =
      head_view<TensorView>(q.data(), compute, batched, batch, nq, heads, dk, q_name);
  const TensorView k_heads =
      head_view<TensorView>(k.data(), compute, batched, batch, nk, kv_heads, dk, k_name);
  const TensorView v_heads =
      head_view<TensorView>(v.data(), compute, batched, batch, nk, kv_heads, dv, v_name);
  result.kernel = step != nullptr
                      ? (*step)(q_heads, k_heads, v_heads, options.attention, outputs)
                      : attention_into(q_heads, k_heads, v_heads, options.attention, outputs);

  if (state != nullptr && options.attention.return_lse) result.lse = state->lse.to(held);
  Tensor out = weights.wo ? project(concat, *weights.wo, weights.bo, "output")
                          : (state != nullptr ? concat.to(compute) : std::move(concat));
  if (state != nullptr) {
    state->q = std::move(q);
    state->k = std::move(k);
    state->v = std::move(v);
    state->concat = std::move(concat);
  }
  out.reshape(batched ? Shape{batch, nq, d_out} : Shape{nq, d_out});
  if (out_dtype == DType::kF16) {
    for (const Tensor* t : {&out, &result.weights, &result.lse}) {
      if (!t->empty()) core::require_fits_float16(*t);
    }
  }
  result.out = out.dtype() == out_dtype ? std::move(out) : out.to(out_dtype);
  if (held != out_dtype) {
    if (!result.weights.empty()) result.weights = result.weights.to(out_dtype);
    if (!result.lse.empty()) result.lse = result.lse.to(out_dtype);
  }
  return result;
}

}  // namespace

LayerResult multi_head_attention(const TensorView& x, const LayerWeights& weights,
                                 const LayerOptions& options,
                                 const std::optional<TensorView>& memory) {
  return run_layer(x, weights, options, memory, nullptr);
}

LayerResult multi_head_attention(const TensorView& x, const LayerWeights& weights,
                                 const LayerOptions& options,
                                 const std::optional<TensorView>& memory,
                                 LayerForwardState& state) {
  return run_layer(x, weights, options, memory, &state);
}

LayerResult multi_head_attention(const TensorView& x, const LayerWeights& weights,
                                 const LayerOptions& options, const AttentionStep& step) {
  return run_layer(x, weights, options, std::nullopt, nullptr, &step);
}

LayerResult multi_head_attention(const TensorView& x, const LayerWeights& weights,
                                 const LayerOptions& options, const AttentionStep& step,
                                 LayerForwardState& state) {
  return run_layer(x, weights, options, std::nullopt, &state, &step);
}

}  // namespace qkv
