// The edges of the contract, for every kernel and every compiled SIMD target:
// - every dimension may be 0 (B, H with Hkv, Nq, Nk, D, Dv): the defined result, or for a kernel
//   that cannot take the shape a one-line qkv::Error when it is forced (never a crash);
// - inputs whose scores or P·V sums do not fit float32 (|q·k| near 1e38, a scale of 1e39, V
//   near FLT_MAX, huge mask values): the answer of the float64 reference, never inf or NaN where
//   the true answer is finite.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernel_cases.h"
#include "kernels/kernel.h"
#include "qkv/error.h"

namespace qkv::testing {
namespace {

double value(const Tensor& t, std::int64_t i) {
  return t.dtype() == DType::kF32 ? static_cast<double>(t.data_as<float>()[i])
                                  : t.data_as<double>()[i];
}

struct ZeroCase {
  std::string name;
  std::int64_t b = 2, h = 4, hkv = 2, nq = 5, nk = 7, d = 6, dv = 3;
};

// Runs one call; forced kernels may only decline with a one-line error.
std::optional<AttentionResult> run(const KernelRun& r, const Tensor& q, const Tensor& k,
                                   const Tensor& v, AttentionOptions options) {
  kernels::simd_force_target(r.target);
  options.kernel = r.kernel;
  options.threads = 3;
  options.return_weights = options.return_lse = true;
  try {
    AttentionResult result = attention(q.view(), k.view(), v.view(), options);
    kernels::simd_force_target(0);
    return result;
  } catch (const Error& e) {
    kernels::simd_force_target(0);
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cannot run this call"), std::string::npos) << e.what();
    return std::nullopt;
  }
}

class ZeroSizes : public ::testing::TestWithParam<ZeroCase> {};

// The defined results, written out: no rows or heads give empty outputs; no keys give zero
// outputs with lse = -inf; D = 0 makes every score 0 (an empty dot product), so the weights are
// uniform over the allowed keys and lse = log(allowed keys); Dv = 0 leaves weights and lse as
// they are. Every kernel that runs gives them; the default choice always runs.
TEST_P(ZeroSizes, EveryKernelGivesTheDefinedResult) {
  const ZeroCase& c = GetParam();
  const Tensor q = random_tensor(DType::kF32, {c.b, c.h, c.nq, c.d}, 1);
  const Tensor k = random_tensor(DType::kF32, {c.b, c.hkv, c.nk, c.d}, 2);
  const Tensor v = random_tensor(DType::kF32, {c.b, c.hkv, c.nk, c.dv}, 3);
  for (const bool causal : {false, true}) {
    AttentionOptions options;
    options.causal = causal;
    for (const KernelRun& r : kernel_runs()) {
      SCOPED_TRACE(r.label + (causal ? " causal" : ""));
      const std::optional<AttentionResult> got = run(r, q, k, v, options);
      if (!got) {
        EXPECT_EQ(r.kernel, "unfused_blas") << "only the CBLAS kernel may decline";
        continue;
      }
      EXPECT_EQ(got->out.shape(), (Shape{c.b, c.h, c.nq, c.dv}));
      EXPECT_EQ(got->weights.shape(), (Shape{c.b, c.h, c.nq, c.nk}));
      EXPECT_EQ(got->lse.shape(), (Shape{c.b, c.h, c.nq}));
      for (std::int64_t row = 0; row < c.b * c.h * c.nq; ++row) {
        const std::int64_t i = row % c.nq;
        // Keys allowed to row i: all, or under bottom-right causal j <= i + nk - nq.
        const std::int64_t allowed =
            causal ? std::clamp<std::int64_t>(i + c.nk - c.nq + 1, 0, c.nk) : c.nk;
        const double lse = value(got->lse, row);
        if (allowed == 0) {
          EXPECT_EQ(lse, -std::numeric_limits<double>::infinity());
          for (std::int64_t x = 0; x < c.dv; ++x) EXPECT_EQ(value(got->out, row * c.dv + x), 0.0);
        } else if (c.d == 0) {
          EXPECT_NEAR(lse, std::log(static_cast<double>(allowed)), 1e-6);
          for (std::int64_t j = 0; j < c.nk; ++j) {
            EXPECT_NEAR(value(got->weights, row * c.nk + j),
                        j < allowed ? 1.0 / static_cast<double>(allowed) : 0.0, 1e-7);
          }
        } else {
          EXPECT_TRUE(std::isfinite(lse));
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    EveryDimension, ZeroSizes,
    ::testing::Values(ZeroCase{"b0", 0}, ZeroCase{"h0", 2, 0, 2}, ZeroCase{"h0_hkv0", 2, 0, 0},
                      ZeroCase{"nq0", 2, 4, 2, 0}, ZeroCase{"nk0", 2, 4, 2, 5, 0},
                      ZeroCase{"d0", 2, 4, 2, 5, 7, 0}, ZeroCase{"dv0", 2, 4, 2, 5, 7, 6, 0},
                      ZeroCase{"nq0_nk0", 2, 4, 2, 0, 0}, ZeroCase{"all0", 0, 0, 0, 0, 0, 0, 0}),
    [](const ::testing::TestParamInfo<ZeroCase>& param) { return param.param.name; });

// Query heads with no kv head to read are not an empty call: one line naming K.
TEST(ZeroKvHeads, QueryHeadsWithoutKvHeadsAreRefused) {
  const Tensor q = random_tensor(DType::kF32, {2, 3, 4}, 1);
  const Tensor k(DType::kF32, {0, 3, 4}, "K");
  const Tensor v(DType::kF32, {0, 3, 4}, "V");
  try {
    attention(q.view(), k.view(), v.view());
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.subject(), "K");
    EXPECT_NE(e.problem().find("no heads"), std::string::npos) << e.what();
  }
}

// A call beyond float32's range: the default choice gives the reference's answer, and every
// kernel either matches it or declines with a reason that names float32's range.
void expect_reference_answer(const Tensor& q, const Tensor& k, const Tensor& v,
                             AttentionOptions options) {
  options.return_weights = options.return_lse = true;
  AttentionOptions ref_options = options;
  ref_options.kernel = "reference";
  ref_options.out_dtype = DType::kF64;
  const AttentionResult ref = attention(q.view(), k.view(), v.view(), ref_options);
  for (std::int64_t e = 0; e < ref.out.numel(); ++e) ASSERT_TRUE(std::isfinite(value(ref.out, e)));

  std::vector<KernelRun> runs = kernel_runs();
  runs.push_back({"default", "", 0});
  for (const KernelRun& r : runs) {
    SCOPED_TRACE(r.label);
    kernels::simd_force_target(r.target);
    options.kernel = r.kernel;
    AttentionResult got;
    try {
      got = attention(q.view(), k.view(), v.view(), options);
    } catch (const Error& e) {
      kernels::simd_force_target(0);
      EXPECT_NE(r.kernel, "") << "the default choice must run: " << e.what();
      EXPECT_NE(e.problem().find("float32"), std::string::npos) << e.what();
      continue;
    }
    kernels::simd_force_target(0);
    // The outputs are weighted means of V's rows: within float32's rounding of the reference.
    const double max_v = max_abs(v.view());
    for (std::int64_t e = 0; e < ref.out.numel(); ++e) {
      ASSERT_TRUE(std::isfinite(value(got.out, e))) << "out[" << e << "]";
      EXPECT_NEAR(value(got.out, e), value(ref.out, e), 1e-6 * max_v) << "out[" << e << "]";
    }
    for (std::int64_t e = 0; e < ref.weights.numel(); ++e) {
      EXPECT_NEAR(value(got.weights, e), value(ref.weights, e), 1e-6) << "weights[" << e << "]";
    }
    for (std::int64_t e = 0; e < ref.lse.numel(); ++e) {
      const double want = value(ref.lse, e);
      const double have = value(got.lse, e);
      if (std::abs(want) > FLT_MAX) {
        EXPECT_EQ(have, std::copysign(std::numeric_limits<double>::infinity(), want));
      } else {
        EXPECT_NEAR(have, want, 1e-6 * std::max(1.0, std::abs(want))) << "lse[" << e << "]";
      }
    }
  }
}

Tensor scaled(DType dtype, const Shape& shape, std::uint64_t seed, double magnitude) {
  return random_tensor(dtype, shape, seed, -magnitude, magnitude);
}

// Rows of `t` ([.., n, d]) set to a_j · magnitude in every column, a_j rising from 0.5 to 1
// with j: scores q·k_j then rise with j, and many of them sit within a factor 2 of each other.
void rising_rows(Tensor& t, double magnitude) {
  const std::int64_t n = t.shape()[t.shape().size() - 2], d = t.shape().back();
  for (std::int64_t e = 0; e < t.numel(); ++e) {
    const std::int64_t j = (e / d) % n;
    t.data_as<float>()[e] = static_cast<float>(
        magnitude * (0.5 + 0.5 * static_cast<double>(j) / static_cast<double>(n)));
  }
}

TEST(BeyondFloat32, ScoresNear1e38) {
  // q·k_j = 4 · 1e19 · a_j · 1e19 runs from 2e38 to 4e38: past FLT_MAX for the last keys,
  // though every input is an ordinary float. The true weights are one-hot on the last key; a
  // kernel whose scores overflow to inf spreads them over every overflowing key.
  Tensor q(DType::kF32, {2, 9, 4}, "Q");
  for (std::int64_t e = 0; e < q.numel(); ++e) q.data_as<float>()[e] = 1e19f;
  Tensor k(DType::kF32, {2, 70, 4}, "K");
  rising_rows(k, 1e19);
  const Tensor v = scaled(DType::kF32, {2, 70, 5}, 3, 1.0);
  AttentionOptions options;
  options.scale = 1.0;
  expect_reference_answer(q, k, v, options);
  options.causal = true;
  expect_reference_answer(q, k, v, options);
}

TEST(BeyondFloat32, ScaleOf1e39) {
  const Tensor q = scaled(DType::kF32, {2, 9, 8}, 4, 1.0);
  const Tensor k = scaled(DType::kF32, {2, 70, 8}, 5, 1.0);
  const Tensor v = scaled(DType::kF32, {2, 70, 5}, 6, 1.0);
  AttentionOptions options;
  options.scale = 1e39;
  expect_reference_answer(q, k, v, options);
  options.scale = -1e39;
  expect_reference_answer(q, k, v, options);
}

TEST(BeyondFloat32, ValuesNearFloatMax) {
  // exp(s - m)·v summed over 70 keys before dividing by l overflows float32; the mean does not.
  const Tensor q = scaled(DType::kF32, {2, 9, 8}, 7, 0.01);
  const Tensor k = scaled(DType::kF32, {2, 70, 8}, 8, 0.01);
  Tensor v = scaled(DType::kF32, {2, 70, 5}, 9, 1.0);
  for (std::int64_t e = 0; e < v.numel(); ++e) {
    v.data_as<float>()[e] = v.data_as<float>()[e] > 0 ? 3.0e38f : 2.9e38f;
  }
  expect_reference_answer(q, k, v, AttentionOptions{});
}

TEST(BeyondFloat32, MaskValuesNearFloatMax) {
  // Scores up to 8 · 5e18 · 5e17 = 2e37 plus a bias of 3.3e38 pass FLT_MAX for the later keys.
  Tensor q(DType::kF32, {2, 9, 8}, "Q");
  for (std::int64_t e = 0; e < q.numel(); ++e) q.data_as<float>()[e] = 5e18f;
  Tensor k(DType::kF32, {2, 70, 8}, "K");
  rising_rows(k, 5e17);
  const Tensor v = scaled(DType::kF32, {2, 70, 5}, 12, 1.0);
  Tensor mask(DType::kF32, {9, 70}, "mask");
  for (std::int64_t e = 0; e < mask.numel(); ++e) mask.data_as<float>()[e] = 3.3e38f;
  AttentionOptions options;
  options.scale = 1.0;
  options.mask = mask.view();
  expect_reference_answer(q, k, v, options);
}

// Just inside the bounds the float32 kernels still run (the check is not a blanket refusal).
TEST(BeyondFloat32, OrdinaryLargeInputsStayOnTheFastKernels) {
  const Tensor q = scaled(DType::kF32, {2, 9, 8}, 14, 1e3);
  const Tensor k = scaled(DType::kF32, {2, 70, 8}, 15, 1e3);
  const Tensor v = scaled(DType::kF32, {2, 70, 5}, 16, 1e30);
  const AttentionResult r = attention(q.view(), k.view(), v.view());
  // The default choice for 9 rows per kv head: decode_hwy, or unfused_blas in a portable build.
  EXPECT_EQ(r.kernel, kernels::simd_targets().empty() ? "unfused_blas" : "decode_hwy");
}

// The workspace estimate counts the threads a call really starts, never more than its tasks:
// --threads 100000 on a small call was refused as needing 86 GiB.
TEST(WorkspaceEstimate, CountsTheThreadsThatRunNotTheThreadsAskedFor) {
  core::AttentionShape shape;
  shape.b = 1;
  shape.h = shape.hkv = 2;
  shape.nq = shape.nk = 64;
  shape.d = shape.dv = 32;
  const std::uint64_t few = kernels::attention_workspace_bytes(shape, 8, "");
  EXPECT_EQ(kernels::attention_workspace_bytes(shape, 100000, ""), few);
  EXPECT_LT(few, std::uint64_t{64} << 20);

  const Tensor q = random_tensor(DType::kF32, {2, 64, 32}, 1);
  const Tensor k = random_tensor(DType::kF32, {2, 64, 32}, 2);
  const Tensor v = random_tensor(DType::kF32, {2, 64, 32}, 3);
  AttentionOptions options;
  options.threads = 100000;
  options.max_memory = std::uint64_t{256} << 20;
  for (const std::string& kernel : attention_kernel_names()) {
    SCOPED_TRACE(kernel);
    options.kernel = kernel;
    EXPECT_NO_THROW(attention(q.view(), k.view(), v.view(), options));
  }
}

}  // namespace
}  // namespace qkv::testing
