// The plain bf16 backward composition, the yardstick of the bf16 backward's accuracy criterion
// (FlashAttention-2's bf16 backward written row by row): Q, K, V and dO rounded to bf16 (nearest
// even, once, from whatever they are stored in); each score and each dP a float32 sum of the
// exact bf16 products; the softmax, D = Σ_j P·dP (dropout's factors in both) and dS in float32;
// P (P∘Z with dropout) rounded to bf16 as dV's operand and dS rounded to bf16 as dK's and dQ's;
// every gradient a float32 sum. A kernel computing the backward in bf16 may err at most twice
// as much as this against the float64 reference on the same rounded inputs.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "backward_cases.h"
#include "core/dropout.h"
#include "core/half.h"
#include "core/mask_rule.h"
#include "core/score_modifiers.h"
#include "core/validate.h"

namespace qkv::testing {

inline float to_bf16(double x) {
  return core::bf16_to_float(core::float_to_bf16(core::narrow_to_odd(x)));
}

// `options` as the kernels are called with (dtype bf16, dropout and all).
inline NaiveGradients naive_backward_bf16(const GradInputs& in, const AttentionOptions& options) {
  const core::AttentionCall call =
      core::validate_attention(in.qv(), in.kv(), in.vv(), options);
  const core::AttentionParams& p = call.params;
  const core::AttentionShape& s = p.shape;
  NaiveGradients g{Tensor(DType::kF64, in.q.shape()), Tensor(DType::kF64, in.k.shape()),
                   Tensor(DType::kF64, in.v.shape()), Tensor(DType::kF64, {s.h})};
  std::vector<float> dq(static_cast<std::size_t>(g.dq.numel())),
      dk(static_cast<std::size_t>(g.dk.numel())), dv(static_cast<std::size_t>(g.dv.numel())),
      dsinks(static_cast<std::size_t>(s.h));
  const float inf = std::numeric_limits<float>::infinity();
  const auto at = [](const core::InputOperand& op, std::int64_t b, std::int64_t h,
                     std::int64_t i, std::int64_t c) {
    return to_bf16(core::load_real(op.data, op.dtype, op.strides.at(b, h, i, c)));
  };
  const TensorView dov = in.dov();
  const auto dout = [&](std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t c) {
    const std::int64_t e = b * dov.strides[0] + h * dov.strides[1] + i * dov.strides[2] +
                           c * dov.strides[3];
    return to_bf16(core::load_real(dov.data, dov.dtype, e));
  };
  const auto nk = static_cast<std::size_t>(s.nk);
  std::vector<float> pre(nk), w(nk), z(nk, 1.0f);
  for (std::int64_t b = 0; b < s.b; ++b) {
    for (std::int64_t h = 0; h < s.h; ++h) {
      const std::int64_t hk = h / s.group();
      const double slope = p.modifiers.alibi_slopes.empty()
                               ? 0.0
                               : p.modifiers.alibi_slopes[static_cast<std::size_t>(h)];
      const float sink = p.modifiers.sinks.empty()
                             ? -inf
                             : static_cast<float>(p.modifiers.sinks[static_cast<std::size_t>(h)]);
      const std::uint32_t head_word = core::dropout_head_word(p.dropout, b, h);
      for (std::int64_t i = 0; i < s.nq; ++i) {
        const auto q_at = [&](std::int64_t c) { return at(p.q, b, h, i, c); };
        const auto k_at = [&](std::int64_t j, std::int64_t c) { return at(p.k, b, hk, j, c); };
        const std::optional<float> row_sink =
            naive_softmax_row(p, b, h, i, slope, sink, q_at, k_at, pre, w);
        if (!row_sink) continue;
        if (p.dropout.active()) {
          std::fill(z.begin(), z.end(), 1.0f);
          core::dropout_span_scalar(p.dropout, head_word, i, 0, s.nk, z.data());
        }
        const float p_sink = *row_sink;
        std::vector<float> dp(nk, 0.0f);
        float d_i = 0.0f;
        for (std::int64_t j = 0; j < s.nk; ++j) {
          const auto js = static_cast<std::size_t>(j);
          if (w[js] == 0.0f) continue;
          float acc = 0.0f;
          for (std::int64_t c = 0; c < s.dv; ++c) acc = std::fma(dout(b, h, i, c), at(p.v, b, hk, j, c), acc);
          dp[js] = acc * z[js];
          d_i += w[js] * dp[js];
        }
        dsinks[static_cast<std::size_t>(h)] -= p_sink * d_i;
        for (std::int64_t j = 0; j < s.nk; ++j) {
          const auto js = static_cast<std::size_t>(j);
          if (w[js] == 0.0f) continue;
          float ds = w[js] * (dp[js] - d_i);
          if (p.modifiers.softcap > 0) {
            const float t = std::tanh(pre[js] / static_cast<float>(p.modifiers.softcap));
            ds *= 1.0f - t * t;
          }
          const float dsb = to_bf16(ds * static_cast<float>(p.scale));
          const float pb = to_bf16(w[js] * z[js]);
          for (std::int64_t c = 0; c < s.d; ++c) {
            dq[static_cast<std::size_t>(((b * s.h + h) * s.nq + i) * s.d + c)] +=
                dsb * at(p.k, b, hk, j, c);
            dk[static_cast<std::size_t>(((b * s.hkv + hk) * s.nk + j) * s.d + c)] +=
                dsb * at(p.q, b, h, i, c);
          }
          for (std::int64_t c = 0; c < s.dv; ++c) {
            dv[static_cast<std::size_t>(((b * s.hkv + hk) * s.nk + j) * s.dv + c)] +=
                pb * dout(b, h, i, c);
          }
        }
      }
    }
  }
  const auto fill = [](Tensor& t, const std::vector<float>& x) {
    for (std::size_t e = 0; e < x.size(); ++e) t.data_as<double>()[e] = x[e];
  };
  fill(g.dq, dq);
  fill(g.dk, dk);
  fill(g.dv, dv);
  fill(g.dsinks, dsinks);
  return g;
}

}  // namespace qkv::testing
