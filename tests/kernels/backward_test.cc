// The attention backward: the float64 reference against central finite differences of the
// forward (every option), every backward kernel against the reference (float32: within 3x the
// error of a plain float32 backward; float64: 1e-12 relative), zero gradients for rows with no
// allowed key, bitwise determinism for threads 1, 2, 3 and 8, packed batches, and refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "backward_cases.h"
#include "kernel_cases.h"
#include "qkv/attention_backward.h"
#include "qkv/error.h"

namespace qkv::testing {
namespace {

// ---------------------------------------------------------------- finite differences ----------

// L = Σ O∘dO through the float64 reference forward.
double loss(const GradCase& c, const GradInputs& in) {
  AttentionOptions options = in.options(c);
  options.kernel = "reference";
  options.out_dtype = DType::kF64;
  const AttentionResult r = attention(in.q.view(), in.k.view(), in.v.view(), options);
  double sum = 0.0;
  for (std::int64_t e = 0; e < r.out.numel(); ++e) {
    sum += r.out.data_as<double>()[e] * in.dout.data_as<double>()[e];
  }
  return sum;
}

// Central differences of L in every element of `x` against `grad`.
void expect_matches_differences(const GradCase& c, GradInputs& in, Tensor& x, const Tensor& grad,
                                const std::string& what) {
  constexpr double kStep = 1e-6;
  ASSERT_EQ(grad.numel(), x.numel()) << what;
  for (std::int64_t e = 0; e < x.numel(); ++e) {
    double& value = x.data_as<double>()[e];
    const double saved = value;
    value = saved + kStep;
    const double up = loss(c, in);
    value = saved - kStep;
    const double down = loss(c, in);
    value = saved;
    const double numeric = (up - down) / (2 * kStep);
    const double analytic = grad.data_as<double>()[e];
    EXPECT_NEAR(analytic, numeric, 1e-6 + 1e-6 * std::abs(numeric)) << what << "[" << e << "]";
  }
}

class ReferenceFiniteDifferences : public ::testing::TestWithParam<GradCase> {};

TEST_P(ReferenceFiniteDifferences, GradientsMatchCentralDifferences) {
  GradCase c = GetParam();
  c.dtype = DType::kF64;
  GradInputs in = make_grad_inputs(c, 11);
  const AttentionGradients g = backward(c, in, "reference");
  ASSERT_EQ(g.compute, DType::kF64);
  expect_matches_differences(c, in, in.q, g.dq, "dQ");
  expect_matches_differences(c, in, in.k, g.dk, "dK");
  expect_matches_differences(c, in, in.v, g.dv, "dV");
  if (c.sinks) expect_matches_differences(c, in, in.sinks, g.dsinks, "dsinks");
}

INSTANTIATE_TEST_SUITE_P(Options, ReferenceFiniteDifferences, ::testing::ValuesIn(small_cases()),
                         [](const auto& test) { return test.param.name; });

// ---------------------------------------------------------------- kernels vs reference -------

class BackwardKernels : public ::testing::TestWithParam<GradCase> {};

TEST_P(BackwardKernels, Float32WithinThreeTimesThePlainFloat32Backward) {
  const GradCase c = GetParam();
  GradInputs in = make_grad_inputs(c, 23);
  const AttentionGradients ref = backward(c, in, "reference");
  const NaiveGradients naive = naive_backward_f32(c, in);
  const Tensor* ref_grads[] = {&ref.dq, &ref.dk, &ref.dv};
  const Tensor* naive_grads[] = {&naive.dq, &naive.dk, &naive.dv};
  for (const std::string& kernel : attention_backward_kernel_names()) {
    if (kernel == "reference") continue;
    SCOPED_TRACE(kernel);
    const AttentionGradients g = backward(c, in, kernel);
    ASSERT_EQ(g.kernel, kernel);
    ASSERT_EQ(g.compute, DType::kF32);
    const Tensor* grads[] = {&g.dq, &g.dk, &g.dv};
    const char* names[] = {"dQ", "dK", "dV"};
    for (int t = 0; t < 3; ++t) {
      const double scale = max_abs(*ref_grads[t]);
      const double naive_error = max_error(naive_grads[t]->view(), ref_grads[t]->view());
      const double error = max_error(grads[t]->view(), ref_grads[t]->view());
      EXPECT_LE(error, 3.0 * naive_error + 1e-6 * scale)
          << names[t] << ": naive float32 error " << naive_error << ", scale " << scale;
    }
    if (c.sinks) {
      const double naive_error = max_error(naive.dsinks.view(), ref.dsinks.view());
      EXPECT_LE(max_error(g.dsinks.view(), ref.dsinks.view()),
                3.0 * naive_error + 1e-6 * max_abs(ref.dsinks));
    }
  }
}

TEST_P(BackwardKernels, Float64Within1e12OfTheReference) {
  GradCase c = GetParam();
  c.dtype = DType::kF64;
  GradInputs in = make_grad_inputs(c, 29);
  const AttentionGradients ref = backward(c, in, "reference");
  for (const std::string& kernel : attention_backward_kernel_names()) {
    if (kernel == "reference") continue;
    SCOPED_TRACE(kernel);
    const AttentionGradients g = backward(c, in, kernel);
    ASSERT_EQ(g.compute, DType::kF64);
    EXPECT_LE(max_error(g.dq.view(), ref.dq.view()), 1e-12 * std::max(1.0, max_abs(ref.dq)));
    EXPECT_LE(max_error(g.dk.view(), ref.dk.view()), 1e-12 * std::max(1.0, max_abs(ref.dk)));
    EXPECT_LE(max_error(g.dv.view(), ref.dv.view()), 1e-12 * std::max(1.0, max_abs(ref.dv)));
    if (c.sinks) {
      EXPECT_LE(max_error(g.dsinks.view(), ref.dsinks.view()),
                1e-12 * std::max(1.0, max_abs(ref.dsinks)));
    }
  }
}

TEST_P(BackwardKernels, BitwiseIdenticalForThreads1238) {
  const GradCase c = GetParam();
  GradInputs in = make_grad_inputs(c, 31);
  for (const std::string& kernel : attention_backward_kernel_names()) {
    SCOPED_TRACE(kernel);
    const AttentionGradients one = backward(c, in, kernel, 1);
    for (int threads : {2, 3, 8}) {
      SCOPED_TRACE("threads " + std::to_string(threads));
      const AttentionGradients many = backward(c, in, kernel, threads);
      EXPECT_TRUE(testing::same_bytes(one.dq, many.dq));
      EXPECT_TRUE(testing::same_bytes(one.dk, many.dk));
      EXPECT_TRUE(testing::same_bytes(one.dv, many.dv));
      EXPECT_TRUE(testing::same_bytes(one.dsinks, many.dsinks));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Options, BackwardKernels, ::testing::ValuesIn(kernel_cases()),
                         [](const auto& test) { return test.param.name; });

// ---------------------------------------------------------------- edge cases -----------------

TEST(Backward, RowsWithNoAllowedKeyGiveZeroGradientsNeverNaN) {
  GradCase c;
  c.nq = 9;
  c.nk = 12;
  c.dead_rows = true;  // every third query row forbids every key
  for (bool sinks : {false, true}) {
    c.sinks = sinks;
    GradInputs in = make_grad_inputs(c, 3);
    for (const std::string& kernel : attention_backward_kernel_names()) {
      SCOPED_TRACE(kernel + (sinks ? " sinks" : ""));
      const AttentionGradients g = backward(c, in, kernel);
      const float* dq = g.dq.data_as<float>();
      for (std::int64_t e = 0; e < g.dq.numel(); ++e) {
        ASSERT_TRUE(std::isfinite(dq[e]));
        const std::int64_t row = (e / c.d) % c.nq;
        if (row % 3 == 1) {
          EXPECT_EQ(dq[e], 0.0f) << e;
        }
      }
      for (const Tensor* t : {&g.dk, &g.dv}) {
        for (std::int64_t e = 0; e < t->numel(); ++e)
          ASSERT_TRUE(std::isfinite(t->data_as<float>()[e]));
      }
    }
  }
}

// In float32 and float64 (whose validation also takes Q's, K's and V's exact magnitudes: a walk
// over their rows that an empty outer dimension must not divide by).
TEST(Backward, EveryDimensionMayBeZero) {
  for (int zero = 0; zero < 12; ++zero) {
    GradCase c;
    c.dtype = zero < 6 ? DType::kF32 : DType::kF64;
    std::int64_t* dims[] = {&c.b, &c.h, &c.nq, &c.nk, &c.d, &c.dv};
    *dims[zero % 6] = 0;
    if (zero % 6 == 1) c.hkv = 0;
    GradInputs in = make_grad_inputs(c, 5);
    const AttentionGradients ref = backward(c, in, "reference");
    for (const std::string& kernel : attention_backward_kernel_names()) {
      SCOPED_TRACE(kernel + " zero dim " + std::to_string(zero % 6) +
                   (zero < 6 ? " float32" : " float64"));
      const AttentionGradients g = backward(c, in, kernel);
      EXPECT_EQ(g.dq.shape(), in.q.shape());
      EXPECT_EQ(g.dk.shape(), in.k.shape());
      EXPECT_EQ(g.dv.shape(), in.v.shape());
      // With D = 0 every score is 0: P is uniform and dV = Pᵀ·dO is not zero.
      EXPECT_LE(max_error(g.dq.view(), ref.dq.view()), 1e-6);
      EXPECT_LE(max_error(g.dk.view(), ref.dk.view()), 1e-6);
      EXPECT_LE(max_error(g.dv.view(), ref.dv.view()), 1e-6);
    }
  }
}

TEST(Backward, PackedBatchEqualsEachSequenceAlone) { expect_packed_batch_matches_sequences(); }

// Float64 gradients when the scores are huge: weighed from the saved lse, the tiled kernels lost
// one digit per decade of |s| (1e-3 relative at scores of 1e12, garbage at 1e37), so past 2^20
// the reference took the call. Now they compute each row's max and sum themselves and keep the
// call at every magnitude, within 1e-12 of the reference (and so does a call given the rows'
// statistics: the ring's, merged from the kernels' own, tests/dist/ring_precision_test.py).
TEST(Backward, Float64HugeScoresStayWithTheFusedKernel) {
  for (const double magnitude : {1.0, 1e6, 3e18}) {
    SCOPED_TRACE(magnitude);
    const Tensor q = random_tensor(DType::kF64, {1, 2, 8, 16}, 1, -magnitude, magnitude);
    const Tensor k = random_tensor(DType::kF64, {1, 2, 8, 16}, 2, -magnitude, magnitude);
    const Tensor v = random_tensor(DType::kF64, {1, 2, 8, 16}, 3);
    const Tensor dout = random_tensor(DType::kF64, {1, 2, 8, 16}, 4);
    AttentionOptions options;
    options.return_lse = true;
    options.out_dtype = DType::kF64;  // the saved out and lse the float64 kernels read
    const AttentionResult fwd = attention(q.view(), k.view(), v.view(), options);
    const AttentionGradients g = attention_backward(q.view(), k.view(), v.view(), fwd.out.view(),
                                                    fwd.lse.view(), dout.view(), options);
    AttentionOptions reference = options;
    reference.kernel = "reference";
    const AttentionGradients r = attention_backward(q.view(), k.view(), v.view(), fwd.out.view(),
                                                    fwd.lse.view(), dout.view(), reference);
    EXPECT_NE(g.kernel, "reference");
    EXPECT_LE(max_error(g.dq.view(), r.dq.view()), 1e-12);
    EXPECT_LE(max_error(g.dk.view(), r.dk.view()), 1e-12);
    EXPECT_LE(max_error(g.dv.view(), r.dv.view()), 1e-12);
  }
}

TEST(Backward, RefusesWhatItCannotDifferentiate) {
  GradCase c;
  GradInputs in = make_grad_inputs(c, 7);
  const AttentionResult fwd = attention(in.q.view(), in.k.view(), in.v.view(), [&] {
    AttentionOptions o = in.options(c);
    o.return_lse = true;
    return o;
  }());
  AttentionOptions options = in.options(c);
  options.dtype = DType::kF16;
  EXPECT_THROW_MESSAGE(attention_backward(in.q.view(), in.k.view(), in.v.view(), fwd.out.view(),
                                          fwd.lse.view(), in.dout.view(), options),
                       "dtype: gradients are computed in float32, float64 or bfloat16, not "
                       "float16");
  options.dtype.reset();
  Tensor wrong(DType::kF32, {c.b, c.h, c.nq, c.dv + 1}, "DO.npy");
  EXPECT_THROW_MESSAGE(attention_backward(in.q.view(), in.k.view(), in.v.view(), fwd.out.view(),
                                          fwd.lse.view(), wrong.view(), options),
                       "DO.npy: shape");
  Tensor bad = in.dout.to(DType::kF32);
  bad.data_as<float>()[3] = std::numeric_limits<float>::quiet_NaN();
  TensorView bad_view = bad.view();
  bad_view.name = "DO.npy";
  EXPECT_THROW_MESSAGE(attention_backward(in.q.view(), in.k.view(), in.v.view(), fwd.out.view(),
                                          fwd.lse.view(), bad_view, options),
                       "DO.npy: holds NaN");
  options.kernel = "fused_nonesuch";
  EXPECT_THROW_MESSAGE(attention_backward(in.q.view(), in.k.view(), in.v.view(), fwd.out.view(),
                                          fwd.lse.view(), in.dout.view(), options),
                       "no such backward kernel");
}

}  // namespace
}  // namespace qkv::testing
