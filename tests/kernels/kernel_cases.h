// Shared by the kernel sweep, determinism, float64 and dropout tests: a case description that
// builds its inputs (any dtype, head column blocks of a wider matrix, every mask form), a naive
// float32 attention, the yardstick of the accuracy criterion, and the thread-count sweep.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "core/mask_rule.h"
#include "core/validate.h"
#include "kernels/kernel.h"
#include "qkv/attention.h"
#include "support/test_support.h"

namespace qkv::testing {

enum class MaskKind { kNone, kBoolFull, kBoolRowBroadcast, kFloatFull, kFloatColumn, kDeadRows };

struct KernelCase {
  std::string name;
  std::int64_t b = 1, h = 2, hkv = 2, nq = 33, nk = 33, d = 16, dv = 16;
  bool causal = false;
  std::optional<Window> window;
  MaskKind mask = MaskKind::kNone;
  double magnitude = 1.0;  // inputs uniform in [-magnitude, magnitude)
  std::optional<double> scale;
  DType in_dtype = DType::kF32;           // Q's dtype, and K's and V's unless given below
  std::optional<DType> k_dtype, v_dtype;  // mixed-dtype calls
  bool strided = false;  // Q, K, V (and the output) as head column blocks of wider matrices
  std::optional<DType> dtype;  // options.dtype (unset: the default rule)
};

// Owns a case's inputs and exposes them as views.
struct CaseInputs {
  Tensor q_store, k_store, v_store, mask_store;
  TensorView q, k, v;
  std::optional<TensorView> mask;

  AttentionOptions options(const KernelCase& c) const {
    AttentionOptions o;
    o.causal = c.causal;
    o.window = c.window;
    o.scale = c.scale;
    o.mask = mask;
    o.dtype = c.dtype;
    return o;
  }
};

// A [B, H, N, D] view over a [B, N, H·D + 3] matrix: each head a column block.
inline TensorView head_blocks(const Tensor& store, std::int64_t b, std::int64_t h, std::int64_t n,
                              std::int64_t d, const std::string& name) {
  const std::int64_t width = h * d + 3;
  return TensorView{store.data(), store.dtype(), {b, h, n, d}, {n * width, d, width, 1}, name};
}

inline CaseInputs make_inputs(const KernelCase& c, std::uint64_t seed) {
  CaseInputs in;
  const double m = c.magnitude;
  const DType kd = c.k_dtype.value_or(c.in_dtype);
  const DType vd = c.v_dtype.value_or(c.in_dtype);
  if (c.strided) {
    in.q_store = random_tensor(c.in_dtype, {c.b, c.nq, c.h * c.d + 3}, seed + 1, -m, m);
    in.k_store = random_tensor(kd, {c.b, c.nk, c.hkv * c.d + 3}, seed + 2, -m, m);
    in.v_store = random_tensor(vd, {c.b, c.nk, c.hkv * c.dv + 3}, seed + 3, -1.0, 1.0);
    in.q = head_blocks(in.q_store, c.b, c.h, c.nq, c.d, "Q");
    in.k = head_blocks(in.k_store, c.b, c.hkv, c.nk, c.d, "K");
    in.v = head_blocks(in.v_store, c.b, c.hkv, c.nk, c.dv, "V");
  } else {
    in.q_store = random_tensor(c.in_dtype, {c.b, c.h, c.nq, c.d}, seed + 1, -m, m);
    in.k_store = random_tensor(kd, {c.b, c.hkv, c.nk, c.d}, seed + 2, -m, m);
    in.v_store = random_tensor(vd, {c.b, c.hkv, c.nk, c.dv}, seed + 3, -1.0, 1.0);
    in.q = in.q_store.view();
    in.k = in.k_store.view();
    in.v = in.v_store.view();
  }
  in.q.name = "Q";
  in.k.name = "K";
  in.v.name = "V";
  const float kNegInf = -std::numeric_limits<float>::infinity();
  switch (c.mask) {
    case MaskKind::kNone:
      break;
    case MaskKind::kBoolFull:
    case MaskKind::kBoolRowBroadcast:
    case MaskKind::kDeadRows: {
      const Shape shape = c.mask == MaskKind::kBoolRowBroadcast ? Shape{1, 1, 1, c.nk}
                                                                : Shape{c.b, c.h, c.nq, c.nk};
      in.mask_store = Tensor(DType::kBool, shape, "M");
      const Tensor u = random_tensor(DType::kF64, shape, seed + 4, 0.0, 1.0);
      bool* bits = static_cast<bool*>(in.mask_store.data());
      for (std::int64_t e = 0; e < u.numel(); ++e) {
        bits[e] = u.data_as<double>()[e] < 0.7;
        // Every third query row forbids every key.
        if (c.mask == MaskKind::kDeadRows && (e / c.nk) % 3 == 1) bits[e] = false;
      }
      break;
    }
    case MaskKind::kFloatFull:
    case MaskKind::kFloatColumn: {
      const Shape shape =
          c.mask == MaskKind::kFloatColumn ? Shape{c.nq, 1} : Shape{c.b, c.h, c.nq, c.nk};
      in.mask_store = random_tensor(DType::kF32, shape, seed + 5, -3.0, 3.0);
      float* x = in.mask_store.data_as<float>();
      for (std::int64_t e = 0; e < in.mask_store.numel(); ++e) {
        if (x[e] < -2.0f) x[e] = kNegInf;
      }
      if (c.mask == MaskKind::kFloatColumn) x[0] = kNegInf;  // query row 0: all -inf
      break;
    }
  }
  if (!in.mask_store.empty()) {
    in.mask = in.mask_store.view();
    in.mask->name = "M";
  }
  return in;
}

// Naive float32 attention, row by row, straight from the formulas: the yardstick that a fast
// kernel may err at most twice as much as. Outputs in float64 tensors of the result's shapes.
struct NaiveResult {
  Tensor out, weights, lse;
};

inline NaiveResult naive_f32(const TensorView& q, const TensorView& k, const TensorView& v,
                             const AttentionOptions& options) {
  core::AttentionCall call = core::validate_attention(q, k, v, options);
  const core::AttentionParams& p = call.params;
  const core::AttentionShape& s = p.shape;
  NaiveResult r{Tensor(DType::kF64, call.out_shape), Tensor(DType::kF64, call.weights_shape),
                Tensor(DType::kF64, call.lse_shape)};
  double* out = r.out.data_as<double>();
  double* weights = r.weights.data_as<double>();
  double* lse = r.lse.data_as<double>();
  const float inf = std::numeric_limits<float>::infinity();
  const float scale = static_cast<float>(p.scale);
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
            for (std::int64_t c = 0; c < s.d; ++c) {
              dot += static_cast<float>(
                         core::load_real(p.q.data, p.q.dtype, p.q.strides.at(b, h, i, c))) *
                     static_cast<float>(
                         core::load_real(p.k.data, p.k.dtype, p.k.strides.at(b, hk, j, c)));
            }
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
          for (std::int64_t c = 0; c < s.dv; ++c) {
            acc[static_cast<std::size_t>(c)] +=
                x * static_cast<float>(
                        core::load_real(p.v.data, p.v.dtype, p.v.strides.at(b, hk, j, c)));
          }
          weights[row * s.nk + j] = x;
        }
        for (std::int64_t c = 0; c < s.dv; ++c)
          out[row * s.dv + c] = acc[static_cast<std::size_t>(c)];
        lse[row] = m == -inf ? -static_cast<double>(inf) : static_cast<double>(m + std::log(sum));
      }
    }
  }
  return r;
}

// max |a - b| where equal infinities count as equal.
inline double max_error(const TensorView& a, const TensorView& b) {
  const Tensor x = contiguous_copy(a, DType::kF64);
  const Tensor y = contiguous_copy(b, DType::kF64);
  double e = 0.0;
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const double u = x.data_as<double>()[i];
    const double v = y.data_as<double>()[i];
    if (u == v) continue;
    const double d = std::abs(u - v);
    e = std::isnan(d) ? std::numeric_limits<double>::infinity() : std::max(e, d);
  }
  return e;
}

inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// A case of shape (b, h, hkv, nq, nk, d, dv), its other fields the defaults.
inline KernelCase case_of_shape(std::int64_t b, std::int64_t h, std::int64_t hkv, std::int64_t nq,
                                std::int64_t nk, std::int64_t d, std::int64_t dv) {
  KernelCase c;
  c.b = b;
  c.h = h;
  c.hkv = hkv;
  c.nq = nq;
  c.nk = nk;
  c.d = d;
  c.dv = dv;
  return c;
}

// The shape of the thread-count sweeps: 4 (batch, kv head) pairs of grouped-query heads (one
// thread packs each head into its own slot, more threads share the packing), rows and keys that
// fill no tile evenly, d and dv off the SIMD widths.
inline KernelCase thread_sweep_case(bool causal, DType in_dtype = DType::kF32) {
  KernelCase c = case_of_shape(2, 4, 2, 200, 300, 72, 40);
  c.causal = causal;
  c.in_dtype = in_dtype;
  return c;
}

// `options` on one thread, then on each of `threads`: out, weights and lse (those `options`
// asks for) are the same bits every time.
inline void expect_same_bits_for_threads(const CaseInputs& in, AttentionOptions options,
                                         std::initializer_list<int> threads) {
  options.threads = 1;
  const AttentionResult one = attention(in.q, in.k, in.v, options);
  for (const int n : threads) {
    SCOPED_TRACE("threads " + std::to_string(n));
    options.threads = n;
    const AttentionResult many = attention(in.q, in.k, in.v, options);
    EXPECT_TRUE(bitwise_equal(one.out, many.out));
    EXPECT_TRUE(bitwise_equal(one.weights, many.weights));
    EXPECT_TRUE(bitwise_equal(one.lse, many.lse));
  }
}

// Every kernel of the list, and fused_hwy and decode_hwy once per SIMD target this CPU supports, so that the
// tests hold every compiled path to the same criterion on one machine.
struct KernelRun {
  std::string label;
  std::string kernel;
  std::int64_t target = 0;  // SIMD target for fused_hwy and decode_hwy, else 0
};

inline std::vector<KernelRun> kernel_runs() {
  std::vector<KernelRun> list;
  for (const std::string& name : attention_kernel_names()) {
    if (name == "fused_hwy" || name == "decode_hwy") {
      for (std::int64_t t : kernels::simd_targets()) {
        list.push_back({name + "/" + kernels::simd_target_name(t), name, t});
      }
    } else {
      list.push_back({name, name, 0});
    }
  }
  return list;
}

}  // namespace qkv::testing
