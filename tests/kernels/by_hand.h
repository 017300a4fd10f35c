// The version-2 formulas written out with plain double loops, for the hand-worked reference
// tests: no library helper is called, so these tests check the reference's statement of the
// contract (interface.md, "Score modifiers") rather than restate it.
//   s_ij  = softcap(scale · q_i·k_j) + alibi_ij + bias_ij,  softcap(x) = C·tanh(x / C),
//   alibi_ij = -slope_h · |i + nk - nq - j|,
//   den_i = exp(sink_h) + Σ_j exp(s_ij)  (sink term absent without sinks),
//   w_ij = exp(s_ij) / den_i,  o_i = Σ_j w_ij v_j,  lse_i = log(den_i).
// The values the tests use are small, so the direct exponentials need no max subtraction.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "qkv/tensor.h"

namespace qkv::testing {

struct HandCall {
  std::int64_t h = 1, hkv = 1, nq = 0, nk = 0, d = 0, dv = 0;
  std::vector<double> q, k, v;  // [h, nq, d], [hkv, nk, d], [hkv, nk, dv], C order
  double scale = 1.0;
  double cap = 0.0;             // 0: no softcap
  std::vector<double> slopes;   // empty: no ALiBi
  std::vector<double> sinks;    // empty: no sinks
  // Whether key j is allowed for query i of head h (bool mask, causal, window); default all.
  std::function<bool(std::int64_t, std::int64_t, std::int64_t)> allowed;
  // The float mask's value for (h, i, j); default 0.
  std::function<double(std::int64_t, std::int64_t, std::int64_t)> bias;
};

struct HandResult {
  std::vector<double> out, weights, lse;  // [h, nq, dv], [h, nq, nk], [h, nq]
};

inline HandResult by_hand(const HandCall& c) {
  HandResult r;
  r.out.assign(static_cast<std::size_t>(c.h * c.nq * c.dv), 0.0);
  r.weights.assign(static_cast<std::size_t>(c.h * c.nq * c.nk), 0.0);
  r.lse.assign(static_cast<std::size_t>(c.h * c.nq), 0.0);
  const auto at = [](const std::vector<double>& x, std::int64_t i) {
    return x[static_cast<std::size_t>(i)];
  };
  for (std::int64_t h = 0; h < c.h; ++h) {
    const std::int64_t hk = h / (c.h / c.hkv);
    for (std::int64_t i = 0; i < c.nq; ++i) {
      std::vector<double> e(static_cast<std::size_t>(c.nk), 0.0);
      double den = c.sinks.empty() ? 0.0 : std::exp(at(c.sinks, h));
      for (std::int64_t j = 0; j < c.nk; ++j) {
        if (c.allowed && !c.allowed(h, i, j)) continue;
        const double bias = c.bias ? c.bias(h, i, j) : 0.0;
        if (bias == -std::numeric_limits<double>::infinity()) continue;
        double dot = 0.0;
        for (std::int64_t x = 0; x < c.d; ++x) {
          dot += at(c.q, (h * c.nq + i) * c.d + x) * at(c.k, (hk * c.nk + j) * c.d + x);
        }
        double s = c.scale * dot;
        if (c.cap > 0) s = c.cap * std::tanh(s / c.cap);
        if (!c.slopes.empty()) {
          s -= at(c.slopes, h) * static_cast<double>(std::llabs(i + c.nk - c.nq - j));
        }
        s += bias;
        e[static_cast<std::size_t>(j)] = std::exp(s);
        den += std::exp(s);
      }
      const std::int64_t row = h * c.nq + i;
      r.lse[static_cast<std::size_t>(row)] = std::log(den);  // log(0) = -inf: no key, no sink
      if (den == 0.0) continue;
      for (std::int64_t j = 0; j < c.nk; ++j) {
        const double w = e[static_cast<std::size_t>(j)] / den;
        r.weights[static_cast<std::size_t>(row * c.nk + j)] = w;
        for (std::int64_t x = 0; x < c.dv; ++x) {
          r.out[static_cast<std::size_t>(row * c.dv + x)] += w * at(c.v, (hk * c.nk + j) * c.dv + x);
        }
      }
    }
  }
  return r;
}

// A float64 tensor of `shape` holding `values` (C order).
inline Tensor f64_tensor(const Shape& shape, const std::vector<double>& values,
                         const std::string& name) {
  Tensor t(DType::kF64, shape, name);
  for (std::size_t i = 0; i < values.size(); ++i) t.data_as<double>()[i] = values[i];
  return t;
}

// `x` rounded to nearest even with `bits` significant bits and smallest normal exponent `emin`
// (bfloat16: 8 and -126; float16: 11 and -14), straight from the definition: the quantum at
// x's binade is 2^(e - bits + 1); x / quantum is exact in double and nearbyint rounds it to
// the nearest integer, ties to even. Values must lie inside the type's finite range.
inline double round_nearest_even(double x, int bits, int emin) {
  if (x == 0.0) return x;
  int e = 0;
  std::frexp(x, &e);  // x = f · 2^e, f in [0.5, 1): the leading bit weighs 2^(e - 1)
  const int lead = std::max(e - 1, emin);
  const double quantum = std::ldexp(1.0, lead - (bits - 1));
  return std::nearbyint(x / quantum) * quantum;
}
inline double round_bf16(double x) { return round_nearest_even(x, 8, -126); }
inline double round_f16(double x) { return round_nearest_even(x, 11, -14); }

}  // namespace qkv::testing
