// compare_with_reference: the accuracy report behind `qkv attention --check`.
#include <algorithm>
#include <cmath>

#include "qkv/attention.h"

namespace qkv {
namespace {

ErrorStats compare(const Tensor& computed, const Tensor& reference) {
  const Tensor a = contiguous_copy(computed.view(), DType::kF64);
  const Tensor b = contiguous_copy(reference.view(), DType::kF64);
  const double* x = a.data_as<double>();
  const double* y = b.data_as<double>();
  ErrorStats stats;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    if (std::isfinite(y[i]))
      stats.max_abs_reference = std::max(stats.max_abs_reference, std::abs(y[i]));
    if (x[i] == y[i]) continue;  // also equal infinities (lse = -inf for masked rows)
    const double diff = std::abs(x[i] - y[i]);
    stats.max_abs_error = std::isnan(diff) ? INFINITY : std::max(stats.max_abs_error, diff);
  }
  if (stats.max_abs_reference > 0.0) {
    stats.max_rel_error = stats.max_abs_error / stats.max_abs_reference;
  } else if (stats.max_abs_error > 0.0) {
    stats.max_rel_error = INFINITY;
  }
  return stats;
}

}  // namespace

AccuracyReport compare_with_reference(const TensorView& q, const TensorView& k, const TensorView& v,
                                      const AttentionOptions& options,
                                      const AttentionResult& result) {
  AttentionOptions ref_options = options;
  ref_options.kernel = "reference";
  ref_options.out_dtype = DType::kF64;
  ref_options.return_weights = !result.weights.empty();
  ref_options.return_lse = !result.lse.empty();
  const AttentionResult ref = attention(q, k, v, ref_options);
  AccuracyReport report;
  report.kernel = result.kernel;
  report.out = compare(result.out, ref.out);
  if (!result.weights.empty()) report.weights = compare(result.weights, ref.weights);
  if (!result.lse.empty()) report.lse = compare(result.lse, ref.lse);
  return report;
}

}  // namespace qkv
