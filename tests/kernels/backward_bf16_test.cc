// The bf16 backward: every backward kernel against the float64 reference on the same
// bf16-rounded Q, K, V and dO, within twice the error of the plain bf16 composition
// (naive_bf16_backward.h) plus a tiny floor, over the float32 backward's cases (causal, window,
// masks, rows with no allowed key, GQA, softcap, ALiBi, sinks, strided views) and dropout;
// fused_hwy on every compiled SIMD target (AMX tiles where the CPU has AMX bf16, else vdpbf16ps
// where it has AVX512-BF16, the float32 loop nest on rounded operands elsewhere); bf16-stored inputs; bf16 gradients by default and
// float32 on request; bitwise identical gradients for threads 1, 2 and 3; refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "backward_cases.h"
#include "kernel_cases.h"
#include "kernels/backward_kernel.h"
#include "kernels/kernel.h"
#include "naive_bf16_backward.h"
#include "qkv/attention_backward.h"
#include "qkv/error.h"

namespace qkv::testing {
namespace {

struct Bf16Run {
  AttentionOptions options;  // dtype bf16 and the case's options
  AttentionResult forward;
};

Bf16Run forward_bf16(const GradCase& c, const GradInputs& in, double dropout = 0.0) {
  Bf16Run run;
  run.options = in.options(c);
  run.options.dtype = DType::kBF16;
  run.options.dropout_p = dropout;
  run.options.seed = 77;
  run.options.return_lse = true;
  run.forward = attention(in.qv(), in.kv(), in.vv(), run.options);
  run.options.return_lse = false;
  return run;
}

AttentionGradients backward_bf16(const GradInputs& in, const Bf16Run& run,
                                 const std::string& kernel, int threads,
                                 std::optional<DType> grad_dtype = DType::kF32) {
  AttentionOptions options = run.options;
  options.kernel = kernel;
  options.threads = threads;
  options.grad_dtype = grad_dtype;
  return attention_backward(in.qv(), in.kv(), in.vv(), run.forward.out.view(),
                            run.forward.lse.view(), in.dov(), options);
}

void expect_within_twice_naive(const AttentionGradients& g, const AttentionGradients& ref,
                               const NaiveGradients& naive, bool sinks) {
  const Tensor* got[] = {&g.dq, &g.dk, &g.dv};
  const Tensor* want[] = {&ref.dq, &ref.dk, &ref.dv};
  const Tensor* plain[] = {&naive.dq, &naive.dk, &naive.dv};
  const char* names[] = {"dQ", "dK", "dV"};
  for (int t = 0; t < 3; ++t) {
    const double scale = max_abs(*want[t]);
    const double naive_error = max_error(plain[t]->view(), want[t]->view());
    const double error = max_error(got[t]->view(), want[t]->view());
    EXPECT_LE(error, 2.0 * naive_error + 1e-6 * scale)
        << names[t] << ": plain bf16 composition's error " << naive_error << ", scale " << scale;
  }
  if (sinks) {
    const double naive_error = max_error(naive.dsinks.view(), ref.dsinks.view());
    EXPECT_LE(max_error(g.dsinks.view(), ref.dsinks.view()),
              2.0 * naive_error + 1e-6 * max_abs(ref.dsinks));
  }
}

class Bf16Backward : public ::testing::TestWithParam<GradCase> {};

TEST_P(Bf16Backward, WithinTwiceThePlainBf16Composition) {
  const GradCase c = GetParam();
  const GradInputs in = make_grad_inputs(c, 53);
  for (const double dropout : {0.0, 0.25}) {
    SCOPED_TRACE("dropout " + std::to_string(dropout));
    const Bf16Run run = forward_bf16(c, in, dropout);
    const AttentionGradients ref = backward_bf16(in, run, "reference", 2);
    ASSERT_EQ(ref.compute, DType::kBF16);
    const NaiveGradients naive = naive_backward_bf16(in, run.options);
    for (const std::string& kernel : attention_backward_kernel_names()) {
      if (kernel == "reference") continue;
      SCOPED_TRACE(kernel);
      if (kernel != "fused_hwy") {
        const AttentionGradients g = backward_bf16(in, run, kernel, 2);
        ASSERT_EQ(g.kernel, kernel);
        expect_within_twice_naive(g, ref, naive, c.sinks);
        continue;
      }
      for (std::int64_t target : kernels::simd_targets()) {
        SCOPED_TRACE(kernels::simd_target_name(target));
        kernels::simd_force_target(target);
        const bool dots = kernels::backward_bf16_dots_available();
        const bool amx = kernels::backward_bf16_amx_available();
        const AttentionGradients g = backward_bf16(in, run, kernel, 2);
        kernels::simd_force_target(0);
        if (!dots && !amx && target == kernels::simd_targets().front()) {
          std::cout << "[  NOTE    ] " << kernels::simd_target_name(target)
                    << ": neither AMX tiles nor vdpbf16ps taken (QKV_BF16_AMX, QKV_BF16_DOTS);"
                       " the float32 loop nest on bf16-rounded operands\n";
        }
        expect_within_twice_naive(g, ref, naive, c.sinks);
      }
    }
  }
}

TEST_P(Bf16Backward, BitwiseIdenticalForThreads123) {
  const GradCase c = GetParam();
  const GradInputs in = make_grad_inputs(c, 59);
  const Bf16Run run = forward_bf16(c, in, 0.1);
  for (const std::string& kernel : attention_backward_kernel_names()) {
    SCOPED_TRACE(kernel);
    const AttentionGradients one = backward_bf16(in, run, kernel, 1, std::nullopt);
    for (int threads : {2, 3}) {
      const AttentionGradients many = backward_bf16(in, run, kernel, threads, std::nullopt);
      EXPECT_TRUE(same_bytes(one.dq, many.dq)) << threads;
      EXPECT_TRUE(same_bytes(one.dk, many.dk)) << threads;
      EXPECT_TRUE(same_bytes(one.dv, many.dv)) << threads;
      EXPECT_TRUE(same_bytes(one.dsinks, many.dsinks)) << threads;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, Bf16Backward, ::testing::ValuesIn(kernel_cases()),
                         [](const auto& test) { return test.param.name; });

// Head dims around the pairs and the 16-lane vectors, odd row counts (a last pair with zero),
// query tiles past 128 rows.
TEST(Bf16BackwardShapes, OddAndWideDims) {
  for (const auto& [d, dv, nq, nk] : std::vector<std::array<std::int64_t, 4>>{
           {1, 1, 3, 5}, {7, 9, 131, 67}, {17, 33, 129, 257}, {64, 64, 257, 130},
           {128, 128, 70, 200}, {130, 72, 33, 45}}) {
    GradCase c;
    c.name = "d" + std::to_string(d);
    c.d = d;
    c.dv = dv;
    c.nq = nq;
    c.nk = nk;
    c.causal = d % 2 == 1;
    SCOPED_TRACE(c.name);
    const GradInputs in = make_grad_inputs(c, 61);
    const Bf16Run run = forward_bf16(c, in);
    const AttentionGradients ref = backward_bf16(in, run, "reference", 2);
    const NaiveGradients naive = naive_backward_bf16(in, run.options);
    for (const std::string& kernel : attention_backward_kernel_names()) {
      if (kernel == "reference") continue;
      SCOPED_TRACE(kernel);
      expect_within_twice_naive(backward_bf16(in, run, kernel, 3), ref, naive, false);
    }
  }
}

// Q and K scaled so that |q|·|k|·scale, the bound on every score, is `largest`.
void scale_scores_to(GradInputs& in, const GradCase& c, double largest) {
  const auto max_row_norm = [](const Tensor& t, std::int64_t width) {
    double m = 0.0;
    const float* x = t.data_as<float>();
    for (std::int64_t r = 0; r < t.numel() / width; ++r) {
      double sum = 0.0;
      for (std::int64_t e = 0; e < width; ++e) sum += double(x[r * width + e]) * x[r * width + e];
      m = std::max(m, std::sqrt(sum));
    }
    return m;
  };
  const double now =
      max_row_norm(in.q, c.d) * max_row_norm(in.k, c.d) / std::sqrt(static_cast<double>(c.d));
  const double f = std::sqrt(largest / now);
  for (Tensor* t : {&in.q, &in.k}) {
    float* x = t->data_as<float>();
    for (std::int64_t e = 0; e < t->numel(); ++e) x[e] = static_cast<float>(x[e] * f);
  }
}

// Whether this build has fused_hwy (a portable build has no SIMD kernels).
bool has_fused_hwy() {
  const std::vector<std::string> names = attention_backward_kernel_names();
  return std::find(names.begin(), names.end(), "fused_hwy") != names.end();
}

void expect_fused_within_twice_naive(const GradCase& c, const GradInputs& in) {
  const Bf16Run run = forward_bf16(c, in);
  const AttentionGradients ref = backward_bf16(in, run, "reference", 2);
  const NaiveGradients naive = naive_backward_bf16(in, run.options);
  expect_within_twice_naive(backward_bf16(in, run, "fused_hwy", 2), ref, naive, c.sinks);
}

// Scores from 1 to 1e4 (Q and K scaled up): below a bound of 256 fused_hwy weighs a bf16 call
// with the forward's lse and D = dO·O (bwd::forward_stats_suit), above it with row statistics
// of its own; either way within twice the plain bf16 composition. Then the two calls it keeps
// to its own statistics at any score because D = dO·O would err past that: sinks (dsinks
// cancels) and a window of one key per row (every weight is 1, the composition's dS exactly 0).
TEST(Bf16BackwardScores, WithinTwiceThePlainBf16CompositionFromScores1To1e4) {
  if (!has_fused_hwy()) GTEST_SKIP() << "no fused_hwy in this build";
  GradCase causal = magnitude_case("causal_gqa");
  causal.causal = true;
  causal.h = 4;
  causal.hkv = 2;
  for (const GradCase& c : {magnitude_case("plain"), causal}) {
    for (const double score : {1.0, 30.0, 200.0, 300.0, 1e3, 1e4}) {
      GradInputs in = make_grad_inputs(c, 97);
      scale_scores_to(in, c, score);
      SCOPED_TRACE(c.name + ", scores up to " + std::to_string(score));
      expect_fused_within_twice_naive(c, in);
    }
  }
  GradCase sinks = causal;
  sinks.name = "causal_gqa_sinks";
  sinks.sinks = true;
  GradCase one = magnitude_case("one_key_per_row");
  one.window = Window{0, 0};
  for (const GradCase& c : {sinks, one}) {
    GradInputs in = make_grad_inputs(c, 98);
    scale_scores_to(in, c, 30.0);
    SCOPED_TRACE(c.name);
    expect_fused_within_twice_naive(c, in);
  }
}

// An O that no forward of these Q, K and V can give (its rows 1000 times as long as V's
// longest): the bf16 backward does not take D = dO·O from it but computes the rows' statistics
// itself, so the gradients stay within twice the composition (with D from this O they are
// off by about their own size).
TEST(Bf16BackwardScores, AnOutputNoForwardGivesIsNotTrusted) {
  if (!has_fused_hwy()) GTEST_SKIP() << "no fused_hwy in this build";
  const GradCase c = magnitude_case("plain");
  const GradInputs in = make_grad_inputs(c, 99);
  Bf16Run run = forward_bf16(c, in);
  Tensor out = contiguous_copy(run.forward.out.view(), DType::kF32);
  float* o = out.data_as<float>();
  for (std::int64_t e = 0; e < out.numel(); ++e) o[e] *= 1000.0f;
  run.forward.out = std::move(out);
  const AttentionGradients ref = backward_bf16(in, run, "reference", 2);
  const NaiveGradients naive = naive_backward_bf16(in, run.options);
  expect_within_twice_naive(backward_bf16(in, run, "fused_hwy", 2), ref, naive, false);
}

// QKV_VERBOSE's backward line says where the weights' row statistics came from: the forward's
// lse while the scores are bounded, the call's own above the bound.
TEST(Bf16BackwardScores, TheChoiceSaysWhereTheRowStatisticsCameFrom) {
  if (!has_fused_hwy()) GTEST_SKIP() << "no fused_hwy in this build";
  const GradCase c = magnitude_case("plain");
  for (const double score : {30.0, 1e3}) {
    GradInputs in = make_grad_inputs(c, 101);
    scale_scores_to(in, c, score);
    const Bf16Run run = forward_bf16(c, in);
    const std::string choice =
        explain_backward_kernel_choice(in.qv(), in.kv(), in.vv(), run.forward.out.view(),
                                       run.forward.lse.view(), in.dov(), run.options);
    SCOPED_TRACE("scores up to " + std::to_string(score));
    EXPECT_NE(choice.find(score < 256.0 ? "; weighs with the forward's lse and D = dO·O"
                                        : "; computes the rows' max, sum and D again"),
              std::string::npos)
        << choice;
  }
}

// Q, K, V and dO stored in bf16: the default compute type is bf16, the gradients bf16 (the
// float32 ones rounded once), or float32 on request.
TEST(Bf16BackwardApi, Bf16StorageAndGradientDtypes) {
  GradCase c;
  c.nq = 40;
  c.nk = 50;
  c.d = 16;
  c.dv = 8;
  c.sinks = true;
  GradInputs in = make_grad_inputs(c, 67);
  for (Tensor* t : {&in.q, &in.k, &in.v, &in.dout}) *t = t->to(DType::kBF16);
  AttentionOptions options = in.options(c);
  options.return_lse = true;
  const AttentionResult fwd = attention(in.qv(), in.kv(), in.vv(), options);
  ASSERT_EQ(fwd.compute, DType::kBF16);
  options.return_lse = false;
  const AttentionGradients g = attention_backward(in.qv(), in.kv(), in.vv(), fwd.out.view(),
                                                  fwd.lse.view(), in.dov(), options);
  EXPECT_EQ(g.compute, DType::kBF16);
  EXPECT_EQ(g.dq.dtype(), DType::kBF16);
  EXPECT_EQ(g.dk.dtype(), DType::kBF16);
  EXPECT_EQ(g.dv.dtype(), DType::kBF16);
  EXPECT_EQ(g.dsinks.dtype(), DType::kBF16);
  options.grad_dtype = DType::kF32;
  const AttentionGradients f = attention_backward(in.qv(), in.kv(), in.vv(), fwd.out.view(),
                                                  fwd.lse.view(), in.dov(), options);
  EXPECT_EQ(f.compute, DType::kBF16);
  EXPECT_EQ(f.dq.dtype(), DType::kF32);
  EXPECT_EQ(f.kernel, g.kernel);
  // The bf16 gradients are the float32 ones rounded once.
  EXPECT_TRUE(same_bytes(g.dq, f.dq.to(DType::kBF16)));
  EXPECT_TRUE(same_bytes(g.dk, f.dk.to(DType::kBF16)));
  EXPECT_TRUE(same_bytes(g.dv, f.dv.to(DType::kBF16)));
  EXPECT_TRUE(same_bytes(g.dsinks, f.dsinks.to(DType::kBF16)));
  // QKV_VERBOSE's line says how the products ran.
  const std::string choice = explain_backward_kernel_choice(
      in.qv(), in.kv(), in.vv(), fwd.out.view(), fwd.lse.view(), in.dov(), options);
  const bool hwy = g.kernel == "fused_hwy";
  EXPECT_NE(choice.find(g.kernel + ": chosen, " +
                        (hwy && kernels::backward_bf16_amx_available() ? "bf16 products on AMX tiles"
                         : hwy && kernels::backward_bf16_dots_available()
                             ? "bf16 dot products (vdpbf16ps)"
                             : "bf16 operands in float32 products")),
            std::string::npos)
      << choice;
  // ... and where the rows' statistics came from: this case has sinks, so from the call itself.
  const std::string stats = hwy ? "; computes the rows' max, sum and D again" : ": chosen, ";
  EXPECT_NE(choice.find(stats), std::string::npos)
      << choice;
  // The memory estimate counts both sets.
  options.grad_dtype.reset();
  const std::uint64_t bf16_bytes = attention_backward_memory(in.qv(), in.kv(), in.vv(), options);
  options.grad_dtype = DType::kF32;
  EXPECT_GT(bf16_bytes, attention_backward_memory(in.qv(), in.kv(), in.vv(), options));
}

TEST(Bf16BackwardApi, RefusesGradientDtypesTheCallCannotGive) {
  GradCase c;
  const GradInputs in = make_grad_inputs(c, 71);
  AttentionOptions options = in.options(c);
  options.return_lse = true;
  const AttentionResult fwd = attention(in.qv(), in.kv(), in.vv(), options);
  options.return_lse = false;
  const auto call = [&](const AttentionOptions& o) {
    return attention_backward(in.qv(), in.kv(), in.vv(), fwd.out.view(), fwd.lse.view(),
                              in.dov(), o);
  };
  options.grad_dtype = DType::kBF16;  // a float32 call
  EXPECT_THROW_MESSAGE(call(options), "grad_dtype: bfloat16 gradients come from a bfloat16 call");
  options.grad_dtype = DType::kF16;
  EXPECT_THROW_MESSAGE(call(options), "grad_dtype: must be float32");
  options.grad_dtype.reset();
  options.dtype = DType::kF16;
  EXPECT_THROW_MESSAGE(call(options), "not float16");
  options.dtype = DType::kBF16;
  options.grad_dtype = DType::kF64;
  EXPECT_THROW_MESSAGE(call(options), "must be bfloat16 or float32");
}

}  // namespace
}  // namespace qkv::testing
