#include "core/memory_budget.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <limits>
#include <string>

#include "core/format_bytes.h"
#include "qkv/error.h"

namespace qkv::core {
namespace {

constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
std::uint64_t u(std::int64_t n) noexcept { return n < 0 ? 0 : static_cast<std::uint64_t>(n); }

// Sizes in the refusal message: "512 B", else as format_bytes.
std::string human(std::uint64_t bytes) {
  return bytes < 1024 ? std::to_string(bytes) + " B" : format_bytes(bytes);
}

}  // namespace

std::uint64_t saturating_mul(std::uint64_t a, std::uint64_t b) noexcept {
  if (a != 0 && b > kMax / a) return kMax;
  return a * b;
}

std::uint64_t saturating_add(std::uint64_t a, std::uint64_t b) noexcept {
  return b > kMax - a ? kMax : a + b;
}

std::uint64_t MemoryEstimate::total() const noexcept {
  return saturating_add(saturating_add(outputs, intermediates), workspace);
}

std::uint64_t tensor_bytes(const Shape& shape, DType dtype) noexcept {
  std::uint64_t bytes = dtype_size(dtype);
  for (const std::int64_t dim : shape) bytes = saturating_mul(bytes, u(dim));
  return bytes;
}

MemoryEstimate attention_memory(const AttentionCall& call, const AttentionOptions& options,
                                bool allocates_outputs, std::uint64_t workspace) noexcept {
  MemoryEstimate estimate;
  if (allocates_outputs) {
    // float16 outputs are computed in float32 and converted: both are held at the end.
    const auto held = [&](const Shape& shape) {
      const std::uint64_t bytes = tensor_bytes(shape, options.out_dtype);
      if (options.out_dtype != DType::kF16) return bytes;
      return saturating_add(bytes, tensor_bytes(shape, DType::kF32));
    };
    estimate.outputs = held(call.out_shape);
    if (options.return_weights) {
      estimate.outputs = saturating_add(estimate.outputs, held(call.weights_shape));
    }
    if (options.return_lse) estimate.outputs = saturating_add(estimate.outputs, held(call.lse_shape));
  }
  estimate.workspace = workspace;
  return estimate;
}

MemoryEstimate layer_memory(const LayerShape& s, const AttentionOptions& options,
                            std::uint64_t workspace) noexcept {
  const std::uint64_t cs = dtype_size(s.compute);
  // A float16 output is held in float32 too until it is rounded.
  const std::uint64_t os = dtype_size(options.out_dtype) +
                           (options.out_dtype == DType::kF16 ? dtype_size(DType::kF32) : 0);
  const std::uint64_t q_width = saturating_mul(u(s.heads), u(s.dk));
  const std::uint64_t k_width = saturating_mul(u(s.kv_heads), u(s.dk));
  const std::uint64_t v_width = saturating_mul(u(s.kv_heads), u(s.dv));
  const std::uint64_t x_rows = saturating_mul(u(s.b), u(s.nq));
  const std::uint64_t m_rows = saturating_mul(u(s.b), u(s.nk));
  const auto matrix = [](std::uint64_t rows, std::uint64_t cols, std::uint64_t size) {
    return saturating_mul(saturating_mul(rows, cols), size);
  };
  MemoryEstimate e;
  // X (and M) as row matrices of the compute dtype, the weights likewise, Q, K, V, the
  // concatenated heads.
  std::uint64_t m = matrix(x_rows, u(s.d), cs);
  if (s.cross) m = saturating_add(m, matrix(m_rows, u(s.d_m), cs));
  m = saturating_add(m, matrix(u(s.d), q_width, cs));
  m = saturating_add(m, matrix(u(s.d_m), saturating_add(k_width, v_width), cs));
  if (s.has_wo) m = saturating_add(m, matrix(saturating_mul(u(s.heads), u(s.dv)), u(s.d_out), cs));
  m = saturating_add(m, matrix(x_rows, q_width, cs));
  m = saturating_add(m, matrix(m_rows, saturating_add(k_width, v_width), cs));
  m = saturating_add(m, matrix(x_rows, saturating_mul(u(s.heads), u(s.dv)), cs));
  e.intermediates = m;
  // The output in the compute dtype, and its conversion when the output dtype differs.
  e.outputs = matrix(x_rows, u(s.d_out), cs);
  if (options.out_dtype != s.compute)
    e.outputs = saturating_add(e.outputs, matrix(x_rows, u(s.d_out), os));
  const std::uint64_t score_rows = saturating_mul(x_rows, u(s.heads));
  if (options.return_weights)
    e.outputs = saturating_add(e.outputs, matrix(score_rows, u(s.nk), os));
  if (options.return_lse) e.outputs = saturating_add(e.outputs, saturating_mul(score_rows, os));
  e.workspace = workspace;
  return e;
}

namespace {

// The rows and widths of a layer's projected matrices, which its state and backward hold.
struct LayerWidths {
  std::uint64_t cs, x_rows, m_rows, q_width, kv_width, concat_width;

  explicit LayerWidths(const LayerShape& s) noexcept
      : cs(dtype_size(s.compute)),
        x_rows(saturating_mul(u(s.b), u(s.nq))),
        m_rows(saturating_mul(u(s.b), u(s.nk))),
        q_width(saturating_mul(u(s.heads), u(s.dk))),
        kv_width(saturating_mul(u(s.kv_heads), saturating_add(u(s.dk), u(s.dv)))),
        concat_width(saturating_mul(u(s.heads), u(s.dv))) {}
};

}  // namespace

std::uint64_t layer_state_memory(const LayerShape& s) noexcept {
  const auto [cs, x_rows, m_rows, q_width, kv_width, concat_width] = LayerWidths(s);
  std::uint64_t elements = saturating_mul(x_rows, saturating_add(q_width, concat_width));
  elements = saturating_add(elements, saturating_mul(m_rows, kv_width));
  elements = saturating_add(elements, saturating_mul(x_rows, u(s.heads)));  // the lse
  return saturating_mul(elements, cs);
}

MemoryEstimate layer_backward_memory(const LayerShape& s, std::uint64_t attention_backward,
                                     bool has_biases) noexcept {
  // Named locals, not a structured binding: the lambda below captures cs, which clang before 16
  // (the fuzz build's) refuses for a binding.
  const LayerWidths w(s);
  const std::uint64_t cs = w.cs, x_rows = w.x_rows, m_rows = w.m_rows, q_width = w.q_width,
                      kv_width = w.kv_width, concat_width = w.concat_width;
  const auto matrix = [&](std::uint64_t rows, std::uint64_t cols) {
    return saturating_mul(saturating_mul(rows, cols), cs);
  };
  // The weights (W^Q, W^K, W^V, and W^O) as matrices, and their gradients: the same sizes.
  std::uint64_t weights = saturating_add(matrix(u(s.d), q_width), matrix(u(s.d_m), kv_width));
  if (s.has_wo) weights = saturating_add(weights, matrix(concat_width, u(s.d_out)));
  MemoryEstimate e;
  // The gradients returned: the weights', the biases' (at most one row each), dX (and dM).
  e.outputs = weights;
  if (has_biases) {
    e.outputs = saturating_add(
        e.outputs, matrix(1, saturating_add(saturating_add(q_width, kv_width), u(s.d_out))));
  }
  e.outputs = saturating_add(e.outputs, matrix(x_rows, u(s.d)));
  if (s.cross) e.outputs = saturating_add(e.outputs, matrix(m_rows, u(s.d_m)));
  // dY, dConcat, the heads' gradients as rows, X (and M) as matrices, the weights as matrices.
  std::uint64_t m = saturating_add(matrix(x_rows, u(s.d_out)), matrix(x_rows, concat_width));
  m = saturating_add(m, matrix(x_rows, q_width));
  m = saturating_add(m, matrix(m_rows, kv_width));
  m = saturating_add(m, matrix(x_rows, u(s.d)));
  if (s.cross) m = saturating_add(m, matrix(m_rows, u(s.d_m)));
  e.intermediates = saturating_add(m, weights);
  e.workspace = attention_backward;
  return e;
}

void check_memory_budget(const MemoryEstimate& estimate, std::uint64_t budget,
                         const std::string& what) {
  if (budget == 0 || estimate.total() <= budget) return;
  std::string parts = "outputs " + human(estimate.outputs);
  if (estimate.intermediates > 0) parts += ", intermediates " + human(estimate.intermediates);
  parts += ", workspace " + human(estimate.workspace);
  throw Error("max_memory", what + " needs " + format_bytes_exact(estimate.total()) + ": " + parts +
                                "; the memory budget is " + format_bytes_exact(budget));
}

}  // namespace qkv::core
