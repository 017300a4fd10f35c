// Shared by the modifier sweep and the fused-kernel support test: a KernelCase (kernel_cases.h)
// with the version-2 options on top (softcap, ALiBi, sinks, storage dtype, packed batch), and
// the yardstick of the accuracy criterion for them: a naive composition in the call's precision.
//   f32 and f16 storage: float32 products, sums and softmax on the (rounded) inputs;
//   bf16 storage: the same, with the softmax weights P rounded to bfloat16 before P·V (float32
//   accumulation): the plain bf16 composition of the contract ("Low precision").
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "core/half.h"
#include "core/mask_rule.h"
#include "core/score_modifiers.h"
#include "core/validate.h"
#include "kernel_cases.h"
#include "qkv/attention.h"

namespace qkv::testing {

struct ModCase {
  KernelCase base;
  double softcap = 0.0;          // 0: none
  bool alibi = false;            // standard slopes
  bool given_slopes = false;     // explicit slopes 0.1·(h + 1)
  bool sinks = false;            // sink_h = 0.5·h - 1
  std::optional<DType> dtype;    // options.dtype
  std::vector<std::int64_t> packed_q, packed_k;  // sequence lengths; empty: not packed
};

// Owns a case's inputs and the per-head / offset tensors the options point at.
struct ModInputs {
  CaseInputs in;
  TensorView q, k, v;
  Tensor slopes, sinks, cu_q, cu_k;
  AttentionOptions options;
};

inline Tensor lengths_to_offsets(const std::vector<std::int64_t>& lens, const char* name) {
  Tensor t(DType::kI32, {static_cast<std::int64_t>(lens.size()) + 1}, name);
  std::int32_t total = 0;
  t.data_as<std::int32_t>()[0] = 0;
  for (std::size_t s = 0; s < lens.size(); ++s) {
    total += static_cast<std::int32_t>(lens[s]);
    t.data_as<std::int32_t>()[s + 1] = total;
  }
  return t;
}

// Drops the leading batch dim of a [1, H, N, W] view: the [H, total, W] form of a packed call.
inline TensorView drop_batch(TensorView view) {
  view.shape.erase(view.shape.begin());
  view.strides.erase(view.strides.begin());
  return view;
}

inline ModInputs make_mod_inputs(const ModCase& c, std::uint64_t seed) {
  ModInputs m;
  m.in = make_inputs(c.base, seed);
  m.options = m.in.options(c.base);
  m.q = m.in.q;
  m.k = m.in.k;
  m.v = m.in.v;
  const std::int64_t h = c.base.h;
  if (c.softcap > 0) m.options.softcap = c.softcap;
  m.options.alibi = c.alibi;
  if (c.given_slopes) {
    m.slopes = Tensor(DType::kF32, {h}, "slopes");
    for (std::int64_t x = 0; x < h; ++x) m.slopes.data_as<float>()[x] = 0.1f * static_cast<float>(x + 1);
    m.options.alibi_slopes = m.slopes.view();
  }
  if (c.sinks) {
    m.sinks = Tensor(DType::kF32, {h}, "sinks");
    for (std::int64_t x = 0; x < h; ++x) m.sinks.data_as<float>()[x] = 0.5f * static_cast<float>(x) - 1.0f;
    m.options.sinks = m.sinks.view();
  }
  m.options.dtype = c.dtype;
  if (!c.packed_q.empty()) {
    m.q = drop_batch(m.q);
    m.k = drop_batch(m.k);
    m.v = drop_batch(m.v);
    m.cu_q = lengths_to_offsets(c.packed_q, "cu_seqlens_q");
    m.cu_k = lengths_to_offsets(c.packed_k, "cu_seqlens_k");
    m.options.cu_seqlens_q = m.cu_q.view();
    m.options.cu_seqlens_k = m.cu_k.view();
  }
  return m;
}

// One sequence (or the whole call) of the naive composition; rows land at `row0` + i of each
// (b, h) block of `rows` rows in the outputs, weights with `keys` columns.
inline void naive_modified_rows(const core::AttentionParams& p, std::int64_t row0,
                                std::int64_t rows, std::int64_t keys, NaiveResult& r) {
  const core::AttentionShape& s = p.shape;
  const float inf = std::numeric_limits<float>::infinity();
  const bool bf16 = p.compute == DType::kBF16;
  const auto load = [&](const core::InputOperand& op, std::int64_t at) {
    return static_cast<float>(core::round_to_storage(core::load_real(op.data, op.dtype, at),
                                                     p.compute));
  };
  const float scale = static_cast<float>(p.scale);
  const float cap = static_cast<float>(p.modifiers.softcap);
  std::vector<float> w(static_cast<std::size_t>(s.nk));
  std::vector<float> acc(static_cast<std::size_t>(s.dv));
  for (std::int64_t b = 0; b < s.b; ++b) {
    for (std::int64_t h = 0; h < s.h; ++h) {
      const std::int64_t hk = h / s.group();
      const auto hs = static_cast<std::size_t>(h);
      const float slope =
          p.modifiers.alibi_slopes.empty() ? 0.0f : static_cast<float>(p.modifiers.alibi_slopes[hs]);
      const float sink = p.modifiers.sinks.empty() ? -inf : static_cast<float>(p.modifiers.sinks[hs]);
      for (std::int64_t i = 0; i < s.nq; ++i) {
        const std::int64_t row = (b * s.h + h) * rows + row0 + i;
        const std::int64_t diag = i + s.diagonal_offset();
        float m = -inf;
        for (std::int64_t j = 0; j < s.nk; ++j) {
          float x = -inf;
          const float bias = static_cast<float>(core::mask_bias(p.masking, b, h, i, j));
          if (core::structurally_allowed(p.masking, diag, j) && bias != -inf) {
            float dot = 0.0f;
            for (std::int64_t c = 0; c < s.d; ++c) {
              dot += load(p.q, p.q.strides.at(b, h, i, c)) * load(p.k, p.k.strides.at(b, hk, j, c));
            }
            x = dot * scale;
            if (cap > 0) x = cap * std::tanh(x / cap);
            x += -slope * static_cast<float>(std::abs(diag - j)) + bias;
          }
          w[static_cast<std::size_t>(j)] = x;
          m = std::max(m, x);
        }
        const bool empty = m == -inf;
        m = std::max(m, sink);
        float sum = m == -inf ? 0.0f : std::exp(sink - m);
        for (float& x : w) {
          x = m == -inf ? 0.0f : std::exp(x - m);
          sum += x;
        }
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (std::int64_t j = 0; j < s.nk; ++j) {
          float& x = w[static_cast<std::size_t>(j)];
          x = empty ? 0.0f : x / sum;
          if (bf16) x = core::bf16_to_float(core::float_to_bf16(x));
          for (std::int64_t c = 0; c < s.dv; ++c) {
            acc[static_cast<std::size_t>(c)] += x * load(p.v, p.v.strides.at(b, hk, j, c));
          }
          if (!r.weights.empty()) r.weights.data_as<double>()[row * keys + j] = x;
        }
        for (std::int64_t c = 0; c < s.dv; ++c) {
          r.out.data_as<double>()[row * s.dv + c] = acc[static_cast<std::size_t>(c)];
        }
        r.lse.data_as<double>()[row] =
            m == -inf ? -static_cast<double>(inf) : static_cast<double>(m + std::log(sum));
      }
    }
  }
}

// The naive composition of a whole call, packed batches sequence by sequence. Outputs are
// float64 tensors of the result's shapes (no weights for a packed call).
inline NaiveResult naive_modified(const TensorView& q, const TensorView& k, const TensorView& v,
                                  const AttentionOptions& options) {
  const core::AttentionCall call = core::validate_attention(q, k, v, options);
  NaiveResult r{Tensor(DType::kF64, call.out_shape), Tensor(), Tensor(DType::kF64, call.lse_shape)};
  const std::int64_t rows = call.params.shape.nq;
  if (call.cu_q.empty()) {
    r.weights = Tensor(DType::kF64, call.weights_shape);
    naive_modified_rows(call.params, 0, rows, call.params.shape.nk, r);
    return r;
  }
  for (std::size_t s = 0; s + 1 < call.cu_q.size(); ++s) {
    naive_modified_rows(core::sequence_params(call, s), call.cu_q[s], rows, 0, r);
  }
  return r;
}

}  // namespace qkv::testing
