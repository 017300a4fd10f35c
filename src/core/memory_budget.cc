#include "core/memory_budget.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <limits>
#include <string>

#include "qkv/error.h"

namespace qkv::core {
namespace {

constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
// The fused kernels (kernels/fused_common.h, fused_driver-inl.h): tasks of up to 256 query
// rows (or one per head of a large group), 64-key tiles, vectors of up to 16 lanes, and packed
// K^T and V of every (batch, kv head) at once when they fit in 8 Mi floats, else two heads.
constexpr std::uint64_t kTaskRows = 256;
constexpr std::uint64_t kKeyTile = 64;
constexpr std::uint64_t kLanes = 16;
constexpr std::uint64_t kPackBudgetFloats = std::uint64_t{8} << 20;
// The unfused kernel declines calls whose n x n float32 matrix exceeds this.
constexpr std::uint64_t kUnfusedCap = std::uint64_t{2} << 30;

std::uint64_t u(std::int64_t n) noexcept { return n < 0 ? 0 : static_cast<std::uint64_t>(n); }

std::string human(std::uint64_t bytes) {
  constexpr std::array<const char*, 6> kUnits = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double value = static_cast<double>(bytes) / 1024.0;
  std::size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < kUnits.size()) {
    value /= 1024.0;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, value < 10.0 ? "%.3g %s" : "%.0f %s", value, kUnits[unit]);
  return text;
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

std::uint64_t attention_workspace_bytes(const AttentionShape& shape, int threads,
                                        const std::string& kernel) noexcept {
  const std::uint64_t d = u(shape.d), dv = u(shape.dv);
  const std::uint64_t group = shape.hkv > 0 ? u(shape.h / shape.hkv) : 1;
  const std::uint64_t rows = std::max(kTaskRows, group);
  const std::uint64_t dvp = dv + kLanes;
  // Fused, per thread: Q, scores, accumulator and row-state tiles for `rows` rows.
  const std::uint64_t fused =
      saturating_mul(saturating_mul(rows, d + dvp + kKeyTile + kLanes + 2), 4);
  // Fused, shared: the packed K^T and V.
  const std::uint64_t head_floats =
      saturating_mul((u(shape.nk) + kKeyTile - 1) / kKeyTile * kKeyTile, d + dvp);
  const std::uint64_t heads = saturating_mul(u(shape.b), u(shape.hkv));
  const std::uint64_t all_heads = saturating_mul(heads, head_floats);
  const std::uint64_t packed = saturating_mul(
      all_heads <= kPackBudgetFloats ? all_heads : saturating_mul(head_floats, 2), 4);
  // Reference: one row of scores and one accumulator in float64.
  const std::uint64_t reference = saturating_mul(saturating_add(u(shape.nk), dv), 8);
  const std::uint64_t per_thread = std::max(fused, reference);
  std::uint64_t bytes = saturating_add(saturating_mul(per_thread, u(std::max(threads, 1))), packed);
  if (kernel.empty() || kernel == "unfused_blas") {
    const std::uint64_t scores = saturating_mul(saturating_mul(u(shape.nq), u(shape.nk)), 4);
    if (scores <= kUnfusedCap) {
      // Scores, the output block, packed Q, K and V of one head.
      std::uint64_t unfused = saturating_add(scores, saturating_mul(u(shape.nq), dv * 4));
      unfused = saturating_add(unfused, saturating_mul(saturating_add(u(shape.nq), 2 * u(shape.nk)),
                                                       std::max(d, dv) * 4));
      bytes = std::max(bytes, unfused);
    }
  }
  return bytes;
}

std::uint64_t tensor_bytes(const Shape& shape, DType dtype) noexcept {
  std::uint64_t bytes = dtype_size(dtype);
  for (const std::int64_t dim : shape) bytes = saturating_mul(bytes, u(dim));
  return bytes;
}

MemoryEstimate attention_memory(const AttentionCall& call, const AttentionOptions& options,
                                bool allocates_outputs) noexcept {
  MemoryEstimate estimate;
  if (allocates_outputs) {
    estimate.outputs = tensor_bytes(call.out_shape, options.out_dtype);
    if (options.return_weights) {
      estimate.outputs =
          saturating_add(estimate.outputs, tensor_bytes(call.weights_shape, options.out_dtype));
    }
    if (options.return_lse) {
      estimate.outputs =
          saturating_add(estimate.outputs, tensor_bytes(call.lse_shape, options.out_dtype));
    }
  }
  estimate.workspace =
      attention_workspace_bytes(call.params.shape, call.params.threads, options.kernel);
  return estimate;
}

MemoryEstimate layer_memory(const LayerShape& s, const AttentionOptions& options,
                            int threads) noexcept {
  const std::uint64_t cs = dtype_size(s.compute);
  const std::uint64_t os = dtype_size(options.out_dtype);
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
  AttentionShape shape;
  shape.b = s.b;
  shape.h = s.heads;
  shape.hkv = s.kv_heads;
  shape.nq = s.nq;
  shape.nk = s.nk;
  shape.d = s.dk;
  shape.dv = s.dv;
  e.workspace = attention_workspace_bytes(shape, threads, options.kernel);
  return e;
}

std::string format_bytes_exact(std::uint64_t bytes) {
  if (bytes == kMax) return "more than 2^64 bytes";
  return std::to_string(bytes) + " bytes (" + human(bytes) + ")";
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
