// The plain bf16 composition, the yardstick of the bf16 path's accuracy criterion
// (interface.md, "Low precision"): Q, K and V rounded to bf16 (to nearest even, once, from
// whatever they are stored in), each score a float32 sum of the exact bf16 products, the softmax
// in float32, the weights rounded to bf16 and P·V summed in float32. A kernel computing in bf16
// may err at most twice as much as this against float64 attention on the same rounded inputs.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/half.h"
#include "core/mask_rule.h"
#include "core/validate.h"
#include "kernel_cases.h"

namespace qkv::testing {

// x (any stored dtype, read exactly as a double) rounded to bf16, as a float.
inline float round_bf16(double x) {
  return core::bf16_to_float(core::float_to_bf16(core::narrow_to_odd(x)));
}

inline NaiveResult naive_bf16(const TensorView& q, const TensorView& k, const TensorView& v,
                              const AttentionOptions& options) {
  core::AttentionCall call = core::validate_attention(q, k, v, options);
  const core::AttentionParams& p = call.params;
  const core::AttentionShape& s = p.shape;
  NaiveResult r{Tensor(DType::kF64, call.out_shape), Tensor(DType::kF64, call.weights_shape),
                Tensor(DType::kF64, call.lse_shape)};
  const float inf = std::numeric_limits<float>::infinity();
  const float scale = static_cast<float>(p.scale);
  const auto at = [](const core::InputOperand& op, std::int64_t b, std::int64_t h, std::int64_t i,
                     std::int64_t c) {
    return round_bf16(core::load_real(op.data, op.dtype, op.strides.at(b, h, i, c)));
  };
  std::vector<float> w(static_cast<std::size_t>(s.nk));
  std::vector<float> acc(static_cast<std::size_t>(s.dv));
  for (std::int64_t b = 0; b < s.b; ++b) {
    for (std::int64_t h = 0; h < s.h; ++h) {
      const std::int64_t hk = h / s.group();
      for (std::int64_t i = 0; i < s.nq; ++i) {
        const std::int64_t row = (b * s.h + h) * s.nq + i;
        float m = -inf;
        for (std::int64_t j = 0; j < s.nk; ++j) {
          float x = -inf;
          const float bias = static_cast<float>(core::mask_bias(p.masking, b, h, i, j));
          if (core::structurally_allowed(p.masking, i + s.diagonal_offset(), j) && bias != -inf) {
            float dot = 0.0f;
            for (std::int64_t c = 0; c < s.d; ++c)
              dot += at(p.q, b, h, i, c) * at(p.k, b, hk, j, c);
            x = dot * scale + bias;
          }
          w[static_cast<std::size_t>(j)] = x;
          m = std::max(m, x);
        }
        float sum = 0.0f;
        for (float& x : w) {
          x = m == -inf ? 0.0f : std::exp(x - m);
          sum += x;
        }
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (std::int64_t j = 0; j < s.nk; ++j) {
          float& x = w[static_cast<std::size_t>(j)];
          x = sum > 0.0f ? x / sum : 0.0f;
          r.weights.data_as<double>()[row * s.nk + j] = x;
          const float pj = round_bf16(x);
          for (std::int64_t c = 0; c < s.dv; ++c) {
            acc[static_cast<std::size_t>(c)] += pj * at(p.v, b, hk, j, c);
          }
        }
        for (std::int64_t c = 0; c < s.dv; ++c) {
          r.out.data_as<double>()[row * s.dv + c] = acc[static_cast<std::size_t>(c)];
        }
        r.lse.data_as<double>()[row] =
            m == -inf ? -static_cast<double>(inf) : static_cast<double>(m + std::log(sum));
      }
    }
  }
  return r;
}

// True when `kernel` computes this call with bf16 dot products on the SIMD target dispatch
// picks now: the bf16 criterion applies to it, the float32 one to every other run.
inline bool runs_bf16_dots(const std::string& kernel, const TensorView& q, const TensorView& k,
                           const TensorView& v, const AttentionOptions& options) {
  if (kernel != "fused_hwy") return false;
  const core::AttentionParams params = core::validate_attention(q, k, v, options).params;
  if (params.compute != DType::kBF16) return false;
  return kernels::fused_bf16_amx_available(params.shape.d) || kernels::fused_bf16_dots_available();
}

}  // namespace qkv::testing
