// Shared by the backward tests: a case (shape and every forward option), its inputs (float32 or
// float64, with a dO), the backward call through the public API, and a plain float32 backward
// row by row, the yardstick of the float32 accuracy criterion.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "core/dropout.h"
#include "core/mask_rule.h"
#include "core/score_modifiers.h"
#include "core/validate.h"
#include "qkv/attention.h"
#include "qkv/attention_backward.h"
#include "qkv/error.h"
#include "support/test_support.h"

namespace qkv::testing {

#define EXPECT_THROW_MESSAGE(statement, text)                                     \
  do {                                                                            \
    try {                                                                         \
      statement;                                                                  \
      ADD_FAILURE() << "no qkv::Error thrown";                                    \
    } catch (const qkv::Error& e) {                                               \
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what(); \
    }                                                                             \
  } while (0)

struct GradCase {
  std::string name = "plain";
  std::int64_t b = 1, h = 2, hkv = 2, nq = 5, nk = 7, d = 4, dv = 4;
  bool causal = false;
  std::optional<Window> window;
  bool bool_mask = false, float_mask = false, dead_rows = false;
  std::optional<double> scale, softcap;
  bool alibi = false, sinks = false;
  DType dtype = DType::kF32;  // of the inputs (and so the compute type)
  // Q, K, V and dO as head column blocks of wider [B, N, heads·width + 3] matrices.
  bool strided = false;
  double dropout_p = 0.0;  // attention dropout, drawn from kDropoutSeed
};

// The seed of every GradCase's dropout mask (the forward's, which the backward draws again).
inline constexpr std::uint64_t kDropoutSeed = 0x0DD5EED5u;

inline void PrintTo(const GradCase& c, std::ostream* os) { *os << c.name; }

struct GradInputs {
  Tensor q, k, v, dout, mask, sinks;
  Tensor q_store, k_store, v_store, dout_store;  // the wider matrices of a strided case
  TensorView qv() const { return q_store.empty() ? q.view() : blocks(q_store, q.shape()); }
  TensorView kv() const { return k_store.empty() ? k.view() : blocks(k_store, k.shape()); }
  TensorView vv() const { return v_store.empty() ? v.view() : blocks(v_store, v.shape()); }
  TensorView dov() const {
    return dout_store.empty() ? dout.view() : blocks(dout_store, dout.shape());
  }
  // The [B, H, N, W] view of a [B, N, H·W + 3] matrix whose column block h is head h.
  static TensorView blocks(const Tensor& store, const Shape& shape) {
    const std::int64_t width = store.shape()[2];
    return TensorView{
        store.data(), store.dtype(), shape, {shape[2] * width, shape[3], width, 1}, "strided"};
  }
  AttentionOptions options(const GradCase& c) const {
    AttentionOptions o;
    o.causal = c.causal;
    o.window = c.window;
    o.scale = c.scale;
    o.softcap = c.softcap;
    o.alibi = c.alibi;
    if (!mask.empty()) o.mask = mask.view();
    if (!sinks.empty()) o.sinks = sinks.view();
    o.dropout_p = c.dropout_p;
    o.seed = kDropoutSeed;
    return o;
  }
};

inline GradInputs make_grad_inputs(const GradCase& c, std::uint64_t seed) {
  GradInputs in;
  in.q = random_tensor(c.dtype, {c.b, c.h, c.nq, c.d}, seed + 1, -1.5, 1.5);
  in.k = random_tensor(c.dtype, {c.b, c.hkv, c.nk, c.d}, seed + 2, -1.5, 1.5);
  in.v = random_tensor(c.dtype, {c.b, c.hkv, c.nk, c.dv}, seed + 3);
  in.dout = random_tensor(c.dtype, {c.b, c.h, c.nq, c.dv}, seed + 4);
  if (c.bool_mask || c.dead_rows) {
    in.mask = Tensor(DType::kBool, {c.b, c.h, c.nq, c.nk}, "M");
    const Tensor u = random_tensor(DType::kF64, in.mask.shape(), seed + 5, 0.0, 1.0);
    for (std::int64_t e = 0; e < u.numel(); ++e) {
      in.mask.data_as<bool>()[e] = u.data_as<double>()[e] < 0.7;
      if (c.dead_rows && (e / std::max<std::int64_t>(c.nk, 1)) % c.nq % 3 == 1) {
        in.mask.data_as<bool>()[e] = false;
      }
    }
  } else if (c.float_mask) {
    in.mask = random_tensor(DType::kF32, {c.nq, c.nk}, seed + 6, -3.0, 3.0);
    float* x = in.mask.data_as<float>();
    for (std::int64_t e = 0; e < in.mask.numel(); ++e) {
      if (x[e] < -2.0f) x[e] = -std::numeric_limits<float>::infinity();
    }
  }
  if (c.sinks) in.sinks = random_tensor(c.dtype, {c.h}, seed + 7, -1.0, 2.0);
  if (c.strided) {
    // The same values, copied into column blocks of wider matrices.
    const auto widen = [](const Tensor& t, std::uint64_t fill_seed) {
      const Shape& s = t.shape();
      Tensor store = random_tensor(t.dtype(), {s[0], s[2], s[1] * s[3] + 3}, fill_seed);
      const TensorView view = GradInputs::blocks(store, s);
      for (std::int64_t e = 0; e < t.numel(); ++e) {
        const std::int64_t col = e % s[3], row = e / s[3] % s[2], h = e / (s[3] * s[2]) % s[1],
                           b = e / (s[3] * s[2] * s[1]);
        const std::int64_t at =
            b * view.strides[0] + h * view.strides[1] + row * view.strides[2] + col;
        if (t.dtype() == DType::kF64) {
          store.data_as<double>()[at] = t.data_as<double>()[e];
        } else {
          store.data_as<float>()[at] = t.data_as<float>()[e];
        }
      }
      return store;
    };
    in.q_store = widen(in.q, seed + 8);
    in.k_store = widen(in.k, seed + 9);
    in.v_store = widen(in.v, seed + 10);
    in.dout_store = widen(in.dout, seed + 11);
  }
  return in;
}

// Forward (return_lse) then backward, both through the public API.
inline AttentionGradients backward(const GradCase& c, const GradInputs& in,
                                   const std::string& kernel, int threads = 2) {
  AttentionOptions forward = in.options(c);
  forward.return_lse = true;
  forward.out_dtype = c.dtype == DType::kF64 ? DType::kF64 : DType::kF32;
  const AttentionResult fwd = attention(in.qv(), in.kv(), in.vv(), forward);
  AttentionOptions options = in.options(c);
  options.kernel = kernel;
  options.threads = threads;
  return attention_backward(in.qv(), in.kv(), in.vv(), fwd.out.view(), fwd.lse.view(), in.dov(),
                            options);
}

// Small shapes for finite differences: one case per option, and some combined.
inline std::vector<GradCase> small_cases() {
  std::vector<GradCase> cases;
  const auto add = [&](const std::string& name, auto change) {
    GradCase c;
    c.name = name;
    change(c);
    cases.push_back(c);
  };
  add("plain", [](GradCase&) {});
  add("causal_rect", [](GradCase& c) {
    c.causal = true;
    c.nq = 4;
  });
  add("window", [](GradCase& c) { c.window = Window{2, 1}; });
  add("bool_mask", [](GradCase& c) { c.bool_mask = true; });
  add("float_mask", [](GradCase& c) { c.float_mask = true; });
  add("gqa_dv", [](GradCase& c) {
    c.h = 4;
    c.hkv = 1;
    c.dv = 3;
  });
  add("scale", [](GradCase& c) { c.scale = 0.9; });
  add("softcap", [](GradCase& c) {
    c.softcap = 1.5;
    c.scale = 1.3;
  });
  add("alibi", [](GradCase& c) {
    c.alibi = true;
    c.causal = true;
  });
  add("sinks", [](GradCase& c) { c.sinks = true; });
  add("sinks_dead_rows", [](GradCase& c) {
    c.sinks = true;
    c.dead_rows = true;
  });
  add("batch_everything", [](GradCase& c) {
    c.b = 2;
    c.h = 4;
    c.hkv = 2;
    c.dv = 3;
    c.causal = true;
    c.softcap = 2.0;
    c.alibi = true;
    c.sinks = true;
    c.float_mask = true;
  });
  // The mask fixed by the seed: the forward is differentiable, and the backward draws it again
  // (70 keys: two blocks of 64 draws).
  add("dropout_gqa_causal", [](GradCase& c) {
    c.h = 4;
    c.hkv = 2;
    c.nq = 9;
    c.nk = 70;
    c.causal = true;
    c.dropout_p = 0.4;
  });
  return cases;
}

// The shape the score-magnitude tests start from (float32's and bf16's): 150 query rows, 290
// keys, d = 64, dv = 48.
inline GradCase magnitude_case(const std::string& name) {
  GradCase c;
  c.name = name;
  c.nq = 150;
  c.nk = 290;
  c.d = 64;
  c.dv = 48;
  return c;
}

// Larger shapes for the kernels: several tiles each way, ragged edges, every option.
inline std::vector<GradCase> kernel_cases() {
  std::vector<GradCase> cases;
  const auto add = [&](const std::string& name, auto change) {
    GradCase c;
    c.name = name;
    c.nq = 150;
    c.nk = 290;
    c.d = 24;
    c.dv = 20;
    change(c);
    cases.push_back(c);
  };
  add("plain", [](GradCase&) {});
  add("causal", [](GradCase& c) { c.causal = true; });
  add("causal_square_gqa", [](GradCase& c) {
    c.causal = true;
    c.nk = 150;
    c.h = 4;
    c.hkv = 1;
  });
  add("window", [](GradCase& c) { c.window = Window{40, 3}; });
  add("bool_mask_dead_rows", [](GradCase& c) { c.dead_rows = true; });
  add("float_mask", [](GradCase& c) { c.float_mask = true; });
  add("softcap_alibi_sinks", [](GradCase& c) {
    c.softcap = 3.0;
    c.alibi = true;
    c.sinks = true;
    c.scale = 0.4;
  });
  add("batch_mqa_d64", [](GradCase& c) {
    c.b = 2;
    c.h = 3;
    c.hkv = 1;
    c.d = 64;
    c.dv = 64;
  });
  add("strided_gqa_d64", [](GradCase& c) {
    c.strided = true;
    c.b = 2;
    c.h = 4;
    c.hkv = 2;
    c.d = 64;
    c.dv = 48;
    c.causal = true;
  });
  add("strided_d24", [](GradCase& c) {
    c.strided = true;
    c.softcap = 5.0;
  });
  add("dropout_gqa_causal", [](GradCase& c) {
    c.b = 2;
    c.h = 4;
    c.hkv = 2;
    c.causal = true;
    c.dropout_p = 0.3;
  });
  add("dropout_dead_rows_strided_sinks", [](GradCase& c) {
    c.strided = true;
    c.dead_rows = true;
    c.sinks = true;
    c.dropout_p = 0.1;
  });
  add("dropout_p_0_9", [](GradCase& c) {
    c.nk = 64;
    c.dropout_p = 0.9;
  });
  return cases;
}

// ---------------------------------------------------------------- plain float32 backward ----

struct NaiveGradients {
  Tensor dq, dk, dv, dsinks;
};

// One query row's softmax in float32 as the naive backwards compute it: pre[j] the scaled score
// before any softcap, w[j] the weight (0 where key j is not allowed). q_at(c) reads Q[b, h, i, c]
// and k_at(j, c) K[b, kv head, j, c], each as its composition stores them. Returns the sink's
// weight (0 without one), or nullopt when the row allows no key.
template <class LoadQ, class LoadK>
std::optional<float> naive_softmax_row(const core::AttentionParams& p, std::int64_t b,
                                       std::int64_t h, std::int64_t i, double slope, float sink,
                                       const LoadQ& q_at, const LoadK& k_at,
                                       std::vector<float>& pre, std::vector<float>& w) {
  const core::AttentionShape& s = p.shape;
  const float inf = std::numeric_limits<float>::infinity();
  const std::int64_t diag = i + s.diagonal_offset();
  float m = sink;
  bool any = false;
  for (std::int64_t j = 0; j < s.nk; ++j) {
    const auto js = static_cast<std::size_t>(j);
    const float bias = static_cast<float>(core::mask_bias(p.masking, b, h, i, j));
    w[js] = -inf;
    if (!core::structurally_allowed(p.masking, diag, j) || bias == -inf) continue;
    float dot = 0.0f;
    // Fused multiply-adds, as a float32 matmul (BLAS, or the kernels) sums Q·Kᵀ.
    for (std::int64_t col = 0; col < s.d; ++col) dot = std::fma(q_at(col), k_at(j, col), dot);
    pre[js] = dot * static_cast<float>(p.scale);
    float x = pre[js];
    if (p.modifiers.softcap > 0) {
      const auto cap = static_cast<float>(p.modifiers.softcap);
      x = cap * std::tanh(x / cap);
    }
    w[js] = x + static_cast<float>(core::alibi_bias(slope, diag, j)) + bias;
    m = std::max(m, w[js]);
    any = true;
  }
  if (!any) return std::nullopt;
  float sum = sink == -inf ? 0.0f : std::exp(sink - m);
  for (float& x : w) {
    x = x == -inf ? 0.0f : std::exp(x - m);
    sum += x;
  }
  for (float& x : w) x /= sum;
  return sink == -inf ? 0.0f : std::exp(sink - m) / sum;
}

// The backward row by row in float32, from the formulas, as plain code would write it.
inline NaiveGradients naive_backward_f32(const GradCase& c, const GradInputs& in) {
  const core::AttentionCall call =
      core::validate_attention(in.q.view(), in.k.view(), in.v.view(), in.options(c));
  const core::AttentionParams& p = call.params;
  const core::AttentionShape& s = p.shape;
  NaiveGradients g{Tensor(DType::kF64, in.q.shape()), Tensor(DType::kF64, in.k.shape()),
                   Tensor(DType::kF64, in.v.shape()), Tensor(DType::kF64, {s.h})};
  std::vector<float> dq(static_cast<std::size_t>(g.dq.numel())),
      dk(static_cast<std::size_t>(g.dk.numel())), dv(static_cast<std::size_t>(g.dv.numel())),
      dsinks(static_cast<std::size_t>(s.h));
  const float inf = std::numeric_limits<float>::infinity();
  const auto ld = [](const core::InputOperand& op, std::int64_t at) {
    return static_cast<float>(core::load_real(op.data, op.dtype, at));
  };
  const auto dout = [&](std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t col) {
    return static_cast<float>(in.dout.data_as<float>()[((b * s.h + h) * s.nq + i) * s.dv + col]);
  };
  const auto nk = static_cast<std::size_t>(s.nk);
  std::vector<float> pre(nk), w(nk), z(nk);
  for (std::int64_t b = 0; b < s.b; ++b) {
    for (std::int64_t h = 0; h < s.h; ++h) {
      const std::int64_t hk = h / s.group();
      const double slope = p.modifiers.alibi_slopes.empty()
                               ? 0.0
                               : p.modifiers.alibi_slopes[static_cast<std::size_t>(h)];
      const float sink = p.modifiers.sinks.empty()
                             ? -inf
                             : static_cast<float>(p.modifiers.sinks[static_cast<std::size_t>(h)]);
      for (std::int64_t i = 0; i < s.nq; ++i) {
        const auto q_at = [&](std::int64_t col) { return ld(p.q, p.q.strides.at(b, h, i, col)); };
        const auto k_at = [&](std::int64_t j, std::int64_t col) {
          return ld(p.k, p.k.strides.at(b, hk, j, col));
        };
        const std::optional<float> row_sink =
            naive_softmax_row(p, b, h, i, slope, sink, q_at, k_at, pre, w);
        if (!row_sink) continue;
        const float p_sink = *row_sink;
        // Dropout's factors z_j (1 without it): the weights after dropout are w_j·z_j.
        for (std::int64_t j = 0; j < s.nk; ++j) {
          z[static_cast<std::size_t>(j)] =
              !p.dropout.active() ? 1.0f
              : core::dropout_keeps(p.dropout, b, h, i, j)
                  ? static_cast<float>(p.dropout.keep_scale)
                  : 0.0f;
        }
        float d_i = 0.0f;
        for (std::int64_t col = 0; col < s.dv; ++col) {
          float o = 0.0f;
          for (std::int64_t j = 0; j < s.nk; ++j) {
            const auto js = static_cast<std::size_t>(j);
            o += w[js] * z[js] * ld(p.v, p.v.strides.at(b, hk, j, col));
          }
          d_i += dout(b, h, i, col) * o;
        }
        dsinks[static_cast<std::size_t>(h)] -= p_sink * d_i;
        for (std::int64_t j = 0; j < s.nk; ++j) {
          const auto js = static_cast<std::size_t>(j);
          if (w[js] == 0.0f) continue;
          float dp = 0.0f;
          for (std::int64_t col = 0; col < s.dv; ++col)
            dp += dout(b, h, i, col) * ld(p.v, p.v.strides.at(b, hk, j, col));
          float ds = w[js] * (z[js] * dp - d_i);
          if (p.modifiers.softcap > 0) {
            const float t = std::tanh(pre[js] / static_cast<float>(p.modifiers.softcap));
            ds *= 1.0f - t * t;
          }
          ds *= static_cast<float>(p.scale);
          for (std::int64_t col = 0; col < s.d; ++col) {
            dq[static_cast<std::size_t>(((b * s.h + h) * s.nq + i) * s.d + col)] +=
                ds * ld(p.k, p.k.strides.at(b, hk, j, col));
            dk[static_cast<std::size_t>(((b * s.hkv + hk) * s.nk + j) * s.d + col)] +=
                ds * ld(p.q, p.q.strides.at(b, h, i, col));
          }
          for (std::int64_t col = 0; col < s.dv; ++col) {
            dv[static_cast<std::size_t>(((b * s.hkv + hk) * s.nk + j) * s.dv + col)] +=
                w[js] * z[js] * dout(b, h, i, col);
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

inline double max_abs(const Tensor& t) { return max_abs(t.view()); }

// A packed batch of three sequences (one empty on the query side) against each alone.
inline void expect_packed_batch_matches_sequences() {
  const std::int64_t h = 2, hkv = 1, d = 8, dv = 6;
  const std::vector<std::int64_t> cq{0, 5, 5, 17}, ck{0, 9, 12, 25};
  const Tensor q = random_tensor(DType::kF32, {h, cq.back(), d}, 41);
  const Tensor k = random_tensor(DType::kF32, {hkv, ck.back(), d}, 42);
  const Tensor v = random_tensor(DType::kF32, {hkv, ck.back(), dv}, 43);
  const Tensor dout = random_tensor(DType::kF32, {h, cq.back(), dv}, 44);
  Tensor cu_q(DType::kI64, {4}, "CQ"), cu_k(DType::kI64, {4}, "CK");
  for (int s = 0; s < 4; ++s) {
    cu_q.data_as<std::int64_t>()[s] = cq[static_cast<std::size_t>(s)];
    cu_k.data_as<std::int64_t>()[s] = ck[static_cast<std::size_t>(s)];
  }
  const Tensor sinks = random_tensor(DType::kF32, {h}, 45);
  for (const std::string& kernel : attention_backward_kernel_names()) {
    SCOPED_TRACE(kernel);
    AttentionOptions o;
    o.causal = true;
    o.sinks = sinks.view();
    o.cu_seqlens_q = cu_q.view();
    o.cu_seqlens_k = cu_k.view();
    o.return_lse = true;
    const AttentionResult fwd = attention(q.view(), k.view(), v.view(), o);
    o.kernel = kernel;
    const AttentionGradients packed = attention_backward(
        q.view(), k.view(), v.view(), fwd.out.view(), fwd.lse.view(), dout.view(), o);
    std::vector<double> dsinks(static_cast<std::size_t>(h), 0.0);
    for (std::size_t s = 0; s + 1 < cq.size(); ++s) {
      const auto rows = [](const Tensor& t, std::int64_t r0, std::int64_t r1) {
        TensorView view = t.view();
        view.data = static_cast<const char*>(view.data) +
                    r0 * view.strides[1] * static_cast<std::int64_t>(dtype_size(view.dtype));
        view.shape[1] = r1 - r0;
        return view;
      };
      AttentionOptions one;
      one.causal = true;
      one.sinks = sinks.view();
      one.return_lse = true;
      const TensorView qs = rows(q, cq[s], cq[s + 1]), ks = rows(k, ck[s], ck[s + 1]),
                       vs = rows(v, ck[s], ck[s + 1]), dos = rows(dout, cq[s], cq[s + 1]);
      const AttentionResult f = attention(qs, ks, vs, one);
      one.kernel = kernel;
      const AttentionGradients g =
          attention_backward(qs, ks, vs, f.out.view(), f.lse.view(), dos, one);
      // The forward's kernel choice may differ between the packed call and one sequence alone
      // (it sees other sizes), so the saved out and lse may differ in their last bits.
      EXPECT_LE(max_abs_diff(g.dq.view(), rows(packed.dq, cq[s], cq[s + 1])), 1e-6);
      EXPECT_LE(max_abs_diff(g.dk.view(), rows(packed.dk, ck[s], ck[s + 1])), 1e-6);
      EXPECT_LE(max_abs_diff(g.dv.view(), rows(packed.dv, ck[s], ck[s + 1])), 1e-6);
      for (std::int64_t x = 0; x < h; ++x)
        dsinks[static_cast<std::size_t>(x)] += element(g.dsinks.view(), x);
    }
    for (std::int64_t x = 0; x < h; ++x) {
      EXPECT_NEAR(element(packed.dsinks.view(), x), dsinks[static_cast<std::size_t>(x)], 1e-5);
    }
  }
}

}  // namespace qkv::testing
