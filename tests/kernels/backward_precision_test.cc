// Every backward kernel against the plain float32 composition (S = Q·Kᵀ, softmax, dV = Pᵀ·dO,
// dP = dO·Vᵀ, dS = P∘(dP - D), dQ = dS·K, dK = dSᵀ·Q, row by row: naive_backward_f32), both
// measured against a float64 reference on the same float32 inputs (the reference kernel run on
// float64 copies, so its own float32 storage does not enter the yardstick). A kernel may err
// at most twice what the composition errs in dQ, dK and dV, plus one float32 rounding of the
// gradient's largest element (2^-24·max|g|: the kernels store float32 gradients).
//
// Like for like: past scores of about 1e3 both errors are dominated by the rounding of S
// itself (|s|·2^-24 per score), which no float32 method avoids; the composition's S is summed
// with fused multiply-adds, as any float32 matmul on this machine sums it (summed with separate
// rounded products, its S erred more and a kernel at 2.35x of it passed only by luck).
//
// Two sweeps: the scores' magnitude from 1 to 1e7 (|q|, |k| scaled up; the forward is exact
// there, and weights recomputed as exp(s - lse) lost 1e-3 of dV at scores of 4e4), and the
// options grid of FlashAttention's own backward test (softcap 50, ALiBi, local windows, GQA and
// MQA, causal, sinks) at ordinary scales.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backward_cases.h"
#include "kernel_cases.h"
#include "qkv/attention.h"
#include "qkv/attention_backward.h"

namespace qkv::testing {
namespace {

struct Yardstick {
  AttentionGradients exact;  // float64
  NaiveGradients naive;      // plain float32 composition
};

GradInputs widened(const GradInputs& in) {
  GradInputs w;
  w.q = contiguous_copy(in.qv(), DType::kF64);
  w.k = contiguous_copy(in.kv(), DType::kF64);
  w.v = contiguous_copy(in.vv(), DType::kF64);
  w.dout = contiguous_copy(in.dov(), DType::kF64);
  w.mask = in.mask.empty() ? Tensor() : contiguous_copy(in.mask.view(), in.mask.dtype());
  if (!in.sinks.empty()) w.sinks = contiguous_copy(in.sinks.view(), DType::kF64);
  return w;
}

Yardstick yardstick(const GradCase& c, const GradInputs& in) {
  GradCase c64 = c;
  c64.dtype = DType::kF64;
  c64.strided = false;
  const GradInputs in64 = widened(in);
  return {backward(c64, in64, "reference"), naive_backward_f32(c, in)};
}

// The root-mean-square difference of two tensors of the same shape.
double rms_error(const Tensor& a, const Tensor& b) {
  const Tensor x = contiguous_copy(a.view(), DType::kF64);
  const Tensor y = contiguous_copy(b.view(), DType::kF64);
  double sum = 0.0;
  for (std::int64_t e = 0; e < x.numel(); ++e) {
    const double diff = x.data_as<double>()[e] - y.data_as<double>()[e];
    sum += diff * diff;
  }
  return x.numel() == 0 ? 0.0 : std::sqrt(sum / static_cast<double>(x.numel()));
}

// How far a kernel may err beside the composition: `max_factor` times its largest error (FA's
// criterion is 2), and (dQ, dK, dV) twice its root-mean-square error; each plus 2^-24·max|g|.
struct Criterion {
  double max_factor = 2.0;
  double rms_factor = 2.0;
  bool sgemm_scores_loose = false;  // unfused_blas: see the magnitude sweep
};

// Each kernel's dQ, dK, dV (and dsinks) against the composition's errors.
void expect_within_twice_the_composition(const GradCase& c, const GradInputs& in,
                                         const std::string& what, Criterion criterion = {}) {
  const Yardstick y = yardstick(c, in);
  const Tensor* exact[] = {&y.exact.dq, &y.exact.dk, &y.exact.dv, &y.exact.dsinks};
  const Tensor* naive[] = {&y.naive.dq, &y.naive.dk, &y.naive.dv, &y.naive.dsinks};
  const char* names[] = {"dQ", "dK", "dV", "dsinks"};
  for (const std::string& kernel : attention_backward_kernel_names()) {
    SCOPED_TRACE(what + ", kernel " + kernel);
    const AttentionGradients g = backward(c, in, kernel);
    ASSERT_EQ(g.kernel, kernel);
    const Tensor* got[] = {&g.dq, &g.dk, &g.dv, &g.dsinks};
    for (int t = 0; t < (c.sinks ? 4 : 3); ++t) {
      const double size = max_abs(*exact[t]);
      const double naive_error = max_error(naive[t]->view(), exact[t]->view());
      const double error = max_error(got[t]->view(), exact[t]->view());
      const double atol = std::ldexp(size, -24);
      // dsinks = -Σ_i P_sink,i·D_i is held to 4x. Its order and width are not the cause (the
      // kernels sum l, D and dsinks in float64; exp's rounding moves it by nothing measurable).
      // D is: the kernels' D_i = Σ_j P_ij·dP_ij, the form dS = P∘(dP - D) needs (it cancels dP
      // exactly where a weight is 1: dQ and dK at large scores), carries every dP_ij = dO_i·V_j
      // rounded to float32 on its own, of the size |dO||V|, where the composition's dO·O
      // rounds O, which averages V first (|O| << |V|). Replaying the kernels' arithmetic in
      // NumPy on 40 draws of this grid's sinks cases: 3.1x the composition at most, as
      // measured here (3.7x, fused_hwy). With dP exact (a float64 P·V product per tile, only
      // for dsinks) it still reached 2.0x: dsinks is one sum per head whose terms cancel
      // (|dsinks| is 1e-2 of Σ|P_sink·D|), so both errors are a few roundings of S, P_sink
      // and D that land by chance, and their ratio is that of two small random numbers of
      // one size, not a bound 2x can hold. 4x keeps room above the 3.7x measured.
      const bool sgemm = criterion.sgemm_scores_loose && kernel == "unfused_blas";
      const double factor = t == 3 ? 4.0 : sgemm ? 3.0 : criterion.max_factor;
      EXPECT_LE(error, factor * naive_error + atol)
          << names[t] << ": error " << error << " (" << error / size << " of its size), plain "
          << "float32 composition " << naive_error << " (" << naive_error / size << "), size "
          << size;
      if (t == 3) continue;  // dsinks: one number per head, its largest error says it all
      const double naive_rms = rms_error(*naive[t], *exact[t]);
      const double rms = rms_error(*got[t], *exact[t]);
      EXPECT_LE(rms, (sgemm ? 3.0 : criterion.rms_factor) * naive_rms + atol)
          << names[t] << ": root-mean-square error " << rms << ", plain float32 composition "
          << naive_rms;
    }
  }
}

// Q and K multiplied by f (rounded to float32), so the scores grow by f².
void scale_in_place(Tensor& t, double f) {
  float* x = t.data_as<float>();
  for (std::int64_t e = 0; e < t.numel(); ++e) x[e] = static_cast<float>(x[e] * f);
}

double max_score(const GradInputs& in, const GradCase& c) {
  const AttentionOptions o = in.options(c);
  const double scale = o.scale.value_or(1.0 / std::sqrt(static_cast<double>(c.d)));
  double m = 0.0;
  const float* q = in.q.data_as<float>();
  const float* k = in.k.data_as<float>();
  const std::int64_t group = c.h / c.hkv;
  for (std::int64_t b = 0; b < c.b; ++b) {
    for (std::int64_t h = 0; h < c.h; ++h) {
      for (std::int64_t i = 0; i < c.nq; ++i) {
        for (std::int64_t j = 0; j < c.nk; ++j) {
          double dot = 0.0;
          for (std::int64_t x = 0; x < c.d; ++x) {
            dot += static_cast<double>(q[((b * c.h + h) * c.nq + i) * c.d + x]) *
                   k[((b * c.hkv + h / group) * c.nk + j) * c.d + x];
          }
          m = std::max(m, std::abs(scale * dot));
        }
      }
    }
  }
  return m;
}

class BackwardPrecisionMagnitudes : public ::testing::TestWithParam<GradCase> {};

TEST_P(BackwardPrecisionMagnitudes, WithinTwiceThePlainFloat32CompositionFromScores1To1e7) {
  const GradCase c = GetParam();
  for (const double score : {1.0, 1e1, 1e2, 1e3, 3e3, 1e4, 4e4, 3.6e5, 3e6, 1e7}) {
    GradInputs in = make_grad_inputs(c, 101);
    const double f = std::sqrt(score / max_score(in, c));
    scale_in_place(in.q, f);
    scale_in_place(in.k, f);
    char what[64];
    std::snprintf(what, sizeof what, "scores up to %.3g", score);
    // Past scores of about 1e3 both errors are dominated by the rounding of S (|s|·2^-24 per
    // score, in the composition as in every kernel). fused_hwy and fused_scalar sum each score
    // as the composition does (one chain of fused multiply-adds over d, in order), so their S
    // has the composition's bits and they err as it does: at most 1.02x here, so 2x as
    // everywhere (3x was allowed for every kernel; the 2.35x that once asked for it came from a
    // composition that summed S with separate roundings, the header says). unfused_blas takes
    // S from OpenBLAS's sgemm, which sums in another order: its rounding of S is another draw
    // of the same size, and where the largest error sits (a few rows whose top scores nearly
    // tie) the ratio of two such draws is chance: 2.65x in the largest element and in
    // root-mean-square at 4e4 (the composition as PyTorch runs it uses that same sgemm), so 3x
    // for it past 1e3. Before the row statistics the kernels erred 40-100x the composition at
    // 4e4.
    Criterion criterion;
    criterion.sgemm_scores_loose = score > 1e3;
    expect_within_twice_the_composition(c, in, what, criterion);
    if (HasFailure()) return;  // one magnitude's report is enough
  }
}

std::vector<GradCase> magnitude_cases() {
  std::vector<GradCase> cases;
  const auto add = [&](const std::string& name, auto change) {
    GradCase c = magnitude_case(name);
    change(c);
    cases.push_back(c);
  };
  add("plain", [](GradCase&) {});
  add("causal_gqa", [](GradCase& c) {
    c.causal = true;
    c.h = 4;
    c.hkv = 2;
  });
  add("window_alibi", [](GradCase& c) {
    c.window = Window{60, 10};
    c.alibi = true;
  });
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, BackwardPrecisionMagnitudes,
                         ::testing::ValuesIn(magnitude_cases()),
                         [](const auto& test) { return test.param.name; });

// FlashAttention's backward test grid (tests/test_flash_attn.py's options), at the scales of its
// inputs (Q, K, V, dO uniform in ±1.5 and ±1 here), with the criterion 2x the composition.
class BackwardPrecisionFlashGrid : public ::testing::TestWithParam<GradCase> {};

TEST_P(BackwardPrecisionFlashGrid, WithinTwiceThePlainFloat32Composition) {
  const GradCase c = GetParam();
  for (const std::uint64_t seed : {11u, 12u, 13u}) {
    const GradInputs in = make_grad_inputs(c, seed);
    expect_within_twice_the_composition(c, in, "seed " + std::to_string(seed));
  }
}

std::vector<GradCase> flash_grid() {
  std::vector<GradCase> cases;
  struct Heads {
    const char* name;
    std::int64_t h, hkv;
  };
  const Heads heads[] = {{"mha", 4, 4}, {"gqa", 4, 2}, {"mqa", 4, 1}};
  struct Option {
    const char* name;
    void (*apply)(GradCase&);
  };
  const Option options[] = {
      {"plain", [](GradCase&) {}},
      {"causal", [](GradCase& c) { c.causal = true; }},
      {"softcap50", [](GradCase& c) {
         c.softcap = 50.0;
         c.scale = 1.0;  // scores of several tens: the cap matters
       }},
      {"alibi", [](GradCase& c) { c.alibi = true; }},
      {"alibi_causal", [](GradCase& c) {
         c.alibi = true;
         c.causal = true;
       }},
      {"local", [](GradCase& c) { c.window = Window{32, 16}; }},
      {"local_causal_softcap", [](GradCase& c) {
         c.window = Window{48, 0};
         c.softcap = 50.0;
         c.scale = 1.0;
       }},
      {"sinks_causal", [](GradCase& c) {
         c.sinks = true;
         c.causal = true;
       }},
  };
  for (const Heads& hd : heads) {
    for (const Option& o : options) {
      for (const std::int64_t d : {64, 128}) {
        GradCase c;
        c.name = std::string(o.name) + "_" + hd.name + "_d" + std::to_string(d);
        c.h = hd.h;
        c.hkv = hd.hkv;
        c.nq = 113;
        c.nk = 203;
        c.d = d;
        c.dv = d;
        o.apply(c);
        cases.push_back(c);
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Options, BackwardPrecisionFlashGrid, ::testing::ValuesIn(flash_grid()),
                         [](const auto& test) { return test.param.name; });

}  // namespace
}  // namespace qkv::testing
