// The reference kernel against cases worked by hand from the contract's formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "qkv/attention.h"
#include "qkv/error.h"
#include "support/test_support.h"

namespace qkv {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

Tensor matrix(Shape shape, std::vector<double> values, const char* name) {
  Tensor t(DType::kF64, std::move(shape), name);
  for (std::size_t i = 0; i < values.size(); ++i) t.data_as<double>()[i] = values[i];
  return t;
}

AttentionOptions reference_options() {
  AttentionOptions o;
  o.kernel = "reference";
  o.out_dtype = DType::kF64;
  o.return_weights = true;
  o.return_lse = true;
  return o;
}

double at(const Tensor& t, std::int64_t i) { return t.data_as<double>()[i]; }

TEST(Reference, OneQueryTwoKeysByHand) {
  // q = [1, 0]; k_0 = [1, 0], k_1 = [0, 1]; scale 1: r = [1, 0]; w = [e, 1] / (e + 1).
  const Tensor q = matrix({1, 2}, {1, 0}, "q");
  const Tensor k = matrix({2, 2}, {1, 0, 0, 1}, "k");
  const Tensor v = matrix({2, 3}, {1, 2, 3, 10, 20, 30}, "v");
  AttentionOptions o = reference_options();
  o.scale = 1.0;
  const AttentionResult r = attention(q.view(), k.view(), v.view(), o);
  const double e = std::exp(1.0);
  const double w0 = e / (e + 1), w1 = 1 / (e + 1);
  EXPECT_EQ(r.kernel, "reference");
  EXPECT_EQ(r.out.shape(), (Shape{1, 3}));
  EXPECT_NEAR(at(r.weights, 0), w0, 1e-15);
  EXPECT_NEAR(at(r.weights, 1), w1, 1e-15);
  for (int c = 0; c < 3; ++c) EXPECT_NEAR(at(r.out, c), w0 * (c + 1) + w1 * 10 * (c + 1), 1e-13);
  EXPECT_NEAR(at(r.lse, 0), std::log(e + 1), 1e-15);
}

TEST(Reference, DefaultScaleIsOneOverSqrtD) {
  // D = 4: scale 1/2. q·k_0 = 4, q·k_1 = 0 -> scores 2 and 0.
  const Tensor q = matrix({1, 4}, {1, 1, 1, 1}, "q");
  const Tensor k = matrix({2, 4}, {1, 1, 1, 1, 0, 0, 0, 0}, "k");
  const Tensor v = matrix({2, 1}, {1, 0}, "v");
  const AttentionResult r = attention(q.view(), k.view(), v.view(), reference_options());
  const double w0 = std::exp(2.0) / (std::exp(2.0) + 1);
  EXPECT_NEAR(at(r.out, 0), w0, 1e-15);
  EXPECT_NEAR(at(r.lse, 0), std::log(std::exp(2.0) + 1), 1e-14);
}

TEST(Reference, HugeLogitsDoNotOverflow) {
  // Scores 1e4 and 1e4 - 1: exp(1e4) overflows a double, the max-subtracted form does not.
  const Tensor q = matrix({1, 1}, {100}, "q");
  const Tensor k = matrix({2, 1}, {100, 99.99}, "k");
  const Tensor v = matrix({2, 1}, {1, 3}, "v");
  AttentionOptions o = reference_options();
  o.scale = 1.0;
  const AttentionResult r = attention(q.view(), k.view(), v.view(), o);
  const double w1 = 1 / (1 + std::exp(1.0));  // scores differ by 100 * 0.01 = 1
  EXPECT_NEAR(at(r.weights, 1), w1, 1e-12);
  EXPECT_NEAR(at(r.out, 0), (1 - w1) * 1 + w1 * 3, 1e-12);
  EXPECT_NEAR(at(r.lse, 0), 1e4 + std::log(1 + std::exp(-1.0)), 1e-9);
  EXPECT_TRUE(std::isfinite(at(r.lse, 0)));
}

TEST(Reference, FullyMaskedRowGivesZerosAndMinusInfinity) {
  // Row 0 may attend to nothing; row 1 to key 1 only.
  const Tensor q = matrix({2, 1}, {1, 2}, "q");
  const Tensor k = matrix({2, 1}, {1, 1}, "k");
  const Tensor v = matrix({2, 2}, {5, 6, 7, 8}, "v");
  Tensor mask(DType::kBool, {2, 2}, "mask");
  mask.data_as<bool>()[3] = true;
  AttentionOptions o = reference_options();
  o.mask = mask.view();
  const AttentionResult r = attention(q.view(), k.view(), v.view(), o);
  EXPECT_EQ(at(r.out, 0), 0.0);
  EXPECT_EQ(at(r.out, 1), 0.0);
  EXPECT_EQ(at(r.weights, 0), 0.0);
  EXPECT_EQ(at(r.weights, 1), 0.0);
  EXPECT_EQ(at(r.lse, 0), -kInf);
  EXPECT_EQ(at(r.out, 2), 7.0);
  EXPECT_EQ(at(r.out, 3), 8.0);
  EXPECT_EQ(at(r.weights, 3), 1.0);
  EXPECT_DOUBLE_EQ(at(r.lse, 1), 2.0);  // one key, score 2·1·1/sqrt(1)
}

TEST(Reference, FloatMaskOfMinusInfinityEverywhereIsAFullyMaskedRow) {
  const Tensor q = matrix({1, 1}, {1}, "q");
  const Tensor k = matrix({3, 1}, {1, 2, 3}, "k");
  const Tensor v = matrix({3, 1}, {1, 2, 3}, "v");
  const Tensor mask = matrix({3}, {-kInf, -kInf, -kInf}, "mask");
  AttentionOptions o = reference_options();
  o.mask = mask.view();
  const AttentionResult r = attention(q.view(), k.view(), v.view(), o);
  EXPECT_EQ(at(r.out, 0), 0.0);
  EXPECT_EQ(at(r.lse, 0), -kInf);
  for (int j = 0; j < 3; ++j) EXPECT_EQ(at(r.weights, j), 0.0);
}

TEST(Reference, AdditiveMaskShiftsScores) {
  // Adding c to every score of a row leaves the weights and shifts the lse by c; adding
  // log(2) to one key doubles its unnormalised weight.
  const Tensor q = testing::random_tensor(DType::kF64, {3, 4}, 1);
  const Tensor k = testing::random_tensor(DType::kF64, {5, 4}, 2);
  const Tensor v = testing::random_tensor(DType::kF64, {5, 2}, 3);
  const AttentionResult plain = attention(q.view(), k.view(), v.view(), reference_options());
  const Tensor shift = matrix({3, 1}, {0.5, -2.0, 7.0}, "mask");
  AttentionOptions o = reference_options();
  o.mask = shift.view();
  const AttentionResult shifted = attention(q.view(), k.view(), v.view(), o);
  EXPECT_LT(testing::max_abs_diff(plain.weights.view(), shifted.weights.view()), 1e-15);
  EXPECT_NEAR(at(shifted.lse, 0), at(plain.lse, 0) + 0.5, 1e-14);
  EXPECT_NEAR(at(shifted.lse, 2), at(plain.lse, 2) + 7.0, 1e-14);

  const Tensor favour = matrix({5}, {0, std::log(2.0), 0, 0, 0}, "mask");
  o.mask = favour.view();
  const AttentionResult favoured = attention(q.view(), k.view(), v.view(), o);
  for (int i = 0; i < 3; ++i) {
    const double ratio_plain = at(plain.weights, i * 5 + 1) / at(plain.weights, i * 5);
    const double ratio = at(favoured.weights, i * 5 + 1) / at(favoured.weights, i * 5);
    EXPECT_NEAR(ratio, 2 * ratio_plain, 1e-12);
  }
}

// Which keys each query row may see, from the weights (nonzero = allowed).
std::vector<std::vector<int>> allowed_pattern(std::int64_t nq, std::int64_t nk,
                                              const AttentionOptions& base) {
  const Tensor q(DType::kF64, {nq, 2}, "q");  // zero queries: equal scores for allowed keys
  const Tensor k = testing::random_tensor(DType::kF64, {nk, 2}, 4);
  const Tensor v = testing::random_tensor(DType::kF64, {nk, 2}, 5);
  AttentionOptions o = base;
  o.kernel = "reference";
  o.return_weights = true;
  o.out_dtype = DType::kF64;
  const AttentionResult r = attention(q.view(), k.view(), v.view(), o);
  std::vector<std::vector<int>> pattern(static_cast<std::size_t>(nq));
  for (std::int64_t i = 0; i < nq; ++i) {
    for (std::int64_t j = 0; j < nk; ++j) {
      pattern[static_cast<std::size_t>(i)].push_back(at(r.weights, i * nk + j) > 0 ? 1 : 0);
    }
  }
  return pattern;
}

TEST(Reference, CausalIsBottomRightAligned) {
  AttentionOptions o;
  o.causal = true;
  // Nq < Nk: the last query sees every key.
  EXPECT_EQ(allowed_pattern(2, 4, o),
            (std::vector<std::vector<int>>{{1, 1, 1, 0}, {1, 1, 1, 1}}));
  // Square: the lower triangle.
  EXPECT_EQ(allowed_pattern(3, 3, o),
            (std::vector<std::vector<int>>{{1, 0, 0}, {1, 1, 0}, {1, 1, 1}}));
  // Nq > Nk: the first Nq - Nk rows see nothing.
  EXPECT_EQ(allowed_pattern(4, 2, o),
            (std::vector<std::vector<int>>{{0, 0}, {0, 0}, {1, 0}, {1, 1}}));
}

TEST(Reference, WindowAndItsCombinationWithCausal) {
  AttentionOptions o;
  o.window = Window{1, 0};
  EXPECT_EQ(allowed_pattern(4, 4, o), (std::vector<std::vector<int>>{
                                          {1, 0, 0, 0}, {1, 1, 0, 0}, {0, 1, 1, 0}, {0, 0, 1, 1}}));
  o.window = Window{-1, 1};
  EXPECT_EQ(allowed_pattern(3, 3, o),
            (std::vector<std::vector<int>>{{1, 1, 0}, {1, 1, 1}, {1, 1, 1}}));
  o.window = Window{0, 2};
  o.causal = true;  // AND: only the diagonal survives
  EXPECT_EQ(allowed_pattern(3, 3, o),
            (std::vector<std::vector<int>>{{1, 0, 0}, {0, 1, 0}, {0, 0, 1}}));
  o.causal = false;
  o.window = Window{1, 1};  // Nq < Nk: the band runs along the bottom-right diagonal
  EXPECT_EQ(allowed_pattern(2, 4, o),
            (std::vector<std::vector<int>>{{0, 1, 1, 1}, {0, 0, 1, 1}}));
}

TEST(Reference, GroupedQueryHeadsReadTheirSharedKvHead) {
  // H = 4, Hkv = 2: heads 0,1 read kv head 0; heads 2,3 read kv head 1.
  const Tensor q = testing::random_tensor(DType::kF64, {2, 4, 3, 5}, 6);
  const Tensor k = testing::random_tensor(DType::kF64, {2, 2, 6, 5}, 7);
  const Tensor v = testing::random_tensor(DType::kF64, {2, 2, 6, 3}, 8);
  const AttentionResult grouped = attention(q.view(), k.view(), v.view(), reference_options());
  for (std::int64_t b = 0; b < 2; ++b) {
    for (std::int64_t h = 0; h < 4; ++h) {
      const std::int64_t hk = h / 2;
      TensorView qh = q.view(), kh = k.view(), vh = v.view();
      qh.data = q.data_as<double>() + (b * 4 + h) * 15;
      kh.data = k.data_as<double>() + (b * 2 + hk) * 30;
      vh.data = v.data_as<double>() + (b * 2 + hk) * 18;
      qh.shape = {3, 5};
      kh.shape = {6, 5};
      vh.shape = {6, 3};
      qh.strides = kh.strides = {5, 1};
      vh.strides = {3, 1};
      const AttentionResult single = attention(qh, kh, vh, reference_options());
      for (std::int64_t e = 0; e < 9; ++e) {
        EXPECT_EQ(at(grouped.out, (b * 4 + h) * 9 + e), at(single.out, e)) << b << "," << h;
      }
    }
  }
}

TEST(Reference, BroadcastMaskEqualsItsExpansion) {
  const Tensor q = testing::random_tensor(DType::kF64, {2, 3, 4, 8}, 9);
  const Tensor k = testing::random_tensor(DType::kF64, {2, 3, 6, 8}, 10);
  const Tensor v = testing::random_tensor(DType::kF64, {2, 3, 6, 8}, 11);
  const Tensor padding = testing::random_tensor(DType::kBool, {2, 1, 1, 6}, 12);
  Tensor full(DType::kBool, {2, 3, 4, 6}, "full");
  for (std::int64_t e = 0; e < full.numel(); ++e) {
    full.data_as<bool>()[e] = padding.data_as<bool>()[(e / 72) * 6 + e % 6];
  }
  AttentionOptions o = reference_options();
  o.mask = padding.view();
  const AttentionResult a = attention(q.view(), k.view(), v.view(), o);
  o.mask = full.view();
  const AttentionResult b = attention(q.view(), k.view(), v.view(), o);
  EXPECT_EQ(testing::max_abs_diff(a.out.view(), b.out.view()), 0.0);
  EXPECT_EQ(testing::max_abs_diff(a.weights.view(), b.weights.view()), 0.0);
}

TEST(Reference, SingleSampleAndUnitWidth) {
  const Tensor q = matrix({1, 1}, {3}, "q");
  const Tensor k = matrix({1, 1}, {-2}, "k");
  const Tensor v = matrix({1, 1}, {4}, "v");
  AttentionOptions o = reference_options();
  o.causal = true;
  const AttentionResult r = attention(q.view(), k.view(), v.view(), o);
  EXPECT_EQ(at(r.out, 0), 4.0);
  EXPECT_EQ(at(r.weights, 0), 1.0);
  EXPECT_DOUBLE_EQ(at(r.lse, 0), -6.0);
}

TEST(Reference, ValueWidthMayDifferFromKeyWidth) {
  const Tensor q = testing::random_tensor(DType::kF64, {3, 2, 8}, 13);
  const Tensor k = testing::random_tensor(DType::kF64, {3, 5, 8}, 14);
  const Tensor v = testing::random_tensor(DType::kF64, {3, 5, 3}, 15);
  const AttentionResult r = attention(q.view(), k.view(), v.view(), reference_options());
  EXPECT_EQ(r.out.shape(), (Shape{3, 2, 3}));
  EXPECT_EQ(r.weights.shape(), (Shape{3, 2, 5}));
  EXPECT_EQ(r.lse.shape(), (Shape{3, 2}));
  // Each output row is the weighted sum of the value rows.
  for (std::int64_t h = 0; h < 3; ++h) {
    for (std::int64_t i = 0; i < 2; ++i) {
      for (std::int64_t c = 0; c < 3; ++c) {
        double sum = 0;
        for (std::int64_t j = 0; j < 5; ++j) {
          sum += at(r.weights, (h * 2 + i) * 5 + j) * at(v, (h * 5 + j) * 3 + c);
        }
        EXPECT_NEAR(at(r.out, (h * 2 + i) * 3 + c), sum, 1e-15);
      }
    }
  }
}

TEST(Reference, ResultsAreBitwiseIdenticalForAnyThreadCount) {
  const Tensor q = testing::random_tensor(DType::kF32, {2, 4, 17, 16}, 16);
  const Tensor k = testing::random_tensor(DType::kF32, {2, 2, 23, 16}, 17);
  const Tensor v = testing::random_tensor(DType::kF32, {2, 2, 23, 8}, 18);
  AttentionOptions o = reference_options();
  o.causal = true;
  o.threads = 1;
  const AttentionResult one = attention(q.view(), k.view(), v.view(), o);
  for (int threads : {2, 3, 8}) {
    o.threads = threads;
    const AttentionResult many = attention(q.view(), k.view(), v.view(), o);
    EXPECT_EQ(std::memcmp(one.out.data(), many.out.data(), one.out.nbytes()), 0) << threads;
    EXPECT_EQ(std::memcmp(one.weights.data(), many.weights.data(), one.weights.nbytes()), 0);
  }
}

}  // namespace
}  // namespace qkv
