// The reference kernel's score modifiers and storage rounding (interface.md, version 2) against
// tiny cases worked from the formulas in by_hand.h: softcap, ALiBi (standard and given slopes),
// sinks with fully masked rows, all of them together, and bf16/f16 rounding of f32 and f64
// inputs (rounded once from double, to nearest even). Tolerance 1e-13: both sides are float64
// statements of the same formulas on values near 1; an indexing or sign error is of order 0.1.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "by_hand.h"
#include "qkv/attention.h"
#include "support/test_support.h"

namespace qkv::testing {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kTol = 1e-13;

AttentionOptions reference_options() {
  AttentionOptions o;
  o.kernel = "reference";
  o.out_dtype = DType::kF64;
  o.return_weights = true;
  o.return_lse = true;
  return o;
}

// Inputs [H, N, D] from a HandCall (rank 3 even for one head, so H is explicit).
struct HandTensors {
  Tensor q, k, v;
  explicit HandTensors(const HandCall& c)
      : q(f64_tensor({c.h, c.nq, c.d}, c.q, "Q")),
        k(f64_tensor({c.hkv, c.nk, c.d}, c.k, "K")),
        v(f64_tensor({c.hkv, c.nk, c.dv}, c.v, "V")) {}
};

void expect_matches_by_hand(const AttentionResult& r, const HandResult& want) {
  ASSERT_EQ(r.out.numel(), static_cast<std::int64_t>(want.out.size()));
  ASSERT_EQ(r.weights.numel(), static_cast<std::int64_t>(want.weights.size()));
  ASSERT_EQ(r.lse.numel(), static_cast<std::int64_t>(want.lse.size()));
  for (std::size_t e = 0; e < want.out.size(); ++e) {
    EXPECT_NEAR(r.out.data_as<double>()[e], want.out[e], kTol) << "out " << e;
  }
  for (std::size_t e = 0; e < want.weights.size(); ++e) {
    EXPECT_NEAR(r.weights.data_as<double>()[e], want.weights[e], kTol) << "weights " << e;
  }
  for (std::size_t e = 0; e < want.lse.size(); ++e) {
    const double got = r.lse.data_as<double>()[e];
    if (std::isinf(want.lse[e])) {
      EXPECT_EQ(got, want.lse[e]) << "lse " << e;
    } else {
      EXPECT_NEAR(got, want.lse[e], kTol) << "lse " << e;
    }
  }
}

// Values in [-span, span) from a simple recurrence (deterministic, no library code).
std::vector<double> values(std::size_t n, double span, unsigned seed) {
  std::vector<double> x(n);
  unsigned s = seed * 2654435761u + 12345u;
  for (double& e : x) {
    s = s * 1103515245u + 12345u;
    e = span * (static_cast<double>((s >> 8) % 2001u) / 1000.0 - 1.0);
  }
  return x;
}

HandCall small_call(std::int64_t h, std::int64_t hkv, std::int64_t nq, std::int64_t nk,
                    double span) {
  HandCall c;
  c.h = h;
  c.hkv = hkv;
  c.nq = nq;
  c.nk = nk;
  c.d = 3;
  c.dv = 2;
  c.q = values(static_cast<std::size_t>(h * nq * c.d), span, 1);
  c.k = values(static_cast<std::size_t>(hkv * nk * c.d), span, 2);
  c.v = values(static_cast<std::size_t>(hkv * nk * c.dv), 1.0, 3);
  return c;
}

Tensor per_head(const std::vector<double>& x, DType dtype, const char* name) {
  return f64_tensor({static_cast<std::int64_t>(x.size())}, x, name).to(dtype);
}

TEST(ReferenceSoftcap, OneKeyGivesTheCappedScoreAsLse) {
  // q·k = 6, scale 1, C = 4: the only score is 4·tanh(1.5), and it is the lse.
  const Tensor q = f64_tensor({1, 1}, {3}, "Q"), k = f64_tensor({1, 1}, {2}, "K");
  const Tensor v = f64_tensor({1, 1}, {5}, "V");
  AttentionOptions o = reference_options();
  o.scale = 1.0;
  o.softcap = 4.0;
  const AttentionResult r = attention(q.view(), k.view(), v.view(), o);
  EXPECT_NEAR(r.lse.data_as<double>()[0], 4.0 * std::tanh(1.5), 1e-15);
  EXPECT_EQ(r.out.data_as<double>()[0], 5.0);
}

TEST(ReferenceSoftcap, CapsLargeScoresOfBothSigns) {
  // Scores up to ±3·9·1.5 = ±40 against a cap of 2: capping changes every weight.
  HandCall c = small_call(2, 2, 3, 4, 3.0);
  c.scale = 1.5;
  c.cap = 2.0;
  const HandTensors t(c);
  AttentionOptions o = reference_options();
  o.scale = c.scale;
  o.softcap = c.cap;
  const AttentionResult r = attention(t.q.view(), t.k.view(), t.v.view(), o);
  expect_matches_by_hand(r, by_hand(c));
  HandCall uncapped = c;
  uncapped.cap = 0.0;
  EXPECT_GT(std::abs(r.lse.data_as<double>()[0] - by_hand(uncapped).lse[0]), 0.1);
  // A negative scale is capped the same way.
  c.scale = -0.7;
  o.scale = c.scale;
  expect_matches_by_hand(attention(t.q.view(), t.k.view(), t.v.view(), o), by_hand(c));
}

// ALiBi's get_slopes (Press et al.): for a power of two n the geometric sequence starting at
// 2^(-8/n) with ratio 2^(-8/n); otherwise the slopes of the power of two below H followed by
// the even-indexed slopes (0, 2, 4, ...) of twice that power. Worked out per H below.
TEST(ReferenceAlibi, StandardSlopesAreThoseOfGetSlopes) {
  const double r2 = std::sqrt(0.5);  // 2^(-1/2): get_slopes(16) starts there
  const std::vector<std::pair<std::int64_t, std::vector<double>>> table = {
      {1, {0.00390625}},                                      // 2^-8
      {2, {0.0625, 0.00390625}},                              // 2^-4, 2^-8
      {3, {0.0625, 0.00390625, 0.25}},                        // get_slopes(2) + get_slopes(4)[0]
      {4, {0.25, 0.0625, 0.015625, 0.00390625}},              // 2^-2 .. 2^-8 step 2^-2
      {6, {0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125}},  // + get_slopes(8)[0, 2]
      {8, {0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625}},
      {12, {0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625,  // get_slopes(8)
            r2, r2 / 2, r2 / 4, r2 / 8}},  // get_slopes(16)[0, 2, 4, 6] = 2^-0.5, -1.5, -2.5, -3.5
  };
  for (const auto& [heads, want] : table) {
    SCOPED_TRACE("H = " + std::to_string(heads));
    const std::vector<double> got = alibi_slopes(heads);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t h = 0; h < want.size(); ++h) EXPECT_DOUBLE_EQ(got[h], want[h]) << h;
  }
  EXPECT_TRUE(alibi_slopes(0).empty());
}

TEST(ReferenceAlibi, StandardSlopesAreTheOnesTheReferenceApplies) {
  // alibi = true for H = 6 gives the bits of the explicit get_slopes values.
  HandCall c = small_call(6, 3, 4, 7, 1.0);
  c.slopes = {0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125};
  const HandTensors t(c);
  AttentionOptions standard = reference_options();
  standard.alibi = true;
  const AttentionResult a = attention(t.q.view(), t.k.view(), t.v.view(), standard);
  const Tensor slopes = per_head(c.slopes, DType::kF64, "S");
  AttentionOptions given = reference_options();
  given.alibi_slopes = slopes.view();
  const AttentionResult b = attention(t.q.view(), t.k.view(), t.v.view(), given);
  EXPECT_EQ(max_abs_diff(a.out.view(), b.out.view()), 0.0);
  EXPECT_EQ(max_abs_diff(a.lse.view(), b.lse.view()), 0.0);
  c.scale = 1.0 / std::sqrt(3.0);
  expect_matches_by_hand(a, by_hand(c));
}

TEST(ReferenceAlibi, GivenSlopesCountFromTheBottomRightDiagonal) {
  // Nq < Nk and Nq > Nk: the distance is |i + Nk - Nq - j|. Large slopes so a wrong offset shows.
  for (const auto& [rows, keys] :
       std::vector<std::pair<std::int64_t, std::int64_t>>{{3, 5}, {5, 3}}) {
    const std::int64_t nq = rows, nk = keys;
    SCOPED_TRACE(std::to_string(nq) + "x" + std::to_string(nk));
    HandCall c = small_call(2, 1, nq, nk, 1.0);
    c.slopes = {0.5, 1.25};
    const HandTensors t(c);
    const Tensor slopes = per_head(c.slopes, DType::kF32, "S");  // exact in float32
    AttentionOptions o = reference_options();
    o.scale = 1.0;
    o.alibi_slopes = slopes.view();
    expect_matches_by_hand(attention(t.q.view(), t.k.view(), t.v.view(), o), by_hand(c));
    // With causal too: bottom-right aligned, j <= i + Nk - Nq.
    o.causal = true;
    c.allowed = [&](std::int64_t, std::int64_t i, std::int64_t j) { return j <= i + nk - nq; };
    const AttentionResult r = attention(t.q.view(), t.k.view(), t.v.view(), o);
    expect_matches_by_hand(r, by_hand(c));
  }
}

TEST(ReferenceSinks, SinkJoinsTheDenominatorAndAnEmptyRowGivesLseSink) {
  // Causal with Nq = 4 > Nk = 2: rows 0 and 1 have no allowed key (j <= i - 2).
  HandCall c = small_call(2, 1, 4, 2, 1.0);
  c.sinks = {0.75, -1.5};
  c.allowed = [](std::int64_t, std::int64_t i, std::int64_t j) { return j <= i - 2; };
  const HandTensors t(c);
  const Tensor sinks = per_head(c.sinks, DType::kF32, "sinks");
  AttentionOptions o = reference_options();
  o.scale = c.scale;
  o.causal = true;
  o.sinks = sinks.view();
  const AttentionResult r = attention(t.q.view(), t.k.view(), t.v.view(), o);
  expect_matches_by_hand(r, by_hand(c));
  for (std::int64_t h = 0; h < 2; ++h) {
    for (std::int64_t i = 0; i < 4; ++i) {
      const std::int64_t row = h * 4 + i;
      const double lse = r.lse.data_as<double>()[row];
      double sum = 0.0;
      for (std::int64_t j = 0; j < 2; ++j) sum += r.weights.data_as<double>()[row * 2 + j];
      if (i < 2) {
        EXPECT_EQ(lse, c.sinks[static_cast<std::size_t>(h)]) << "row " << row;  // exactly
        EXPECT_EQ(sum, 0.0);
        EXPECT_EQ(r.out.data_as<double>()[row * 2], 0.0);
        EXPECT_EQ(r.out.data_as<double>()[row * 2 + 1], 0.0);
      } else {
        // The sink takes exp(sink - lse) of the mass, the keys the rest.
        EXPECT_NEAR(sum, 1.0 - std::exp(c.sinks[static_cast<std::size_t>(h)] - lse), 1e-15);
        EXPECT_LT(sum, 1.0);
      }
    }
  }
}

TEST(ReferenceSinks, AllMinusInfinityMaskAndNoKeysGiveLseSink) {
  const Tensor q = f64_tensor({1, 2, 2}, {1, 2, 3, 4}, "Q");
  const Tensor k = f64_tensor({1, 3, 2}, {1, 0, 0, 1, 1, 1}, "K");
  const Tensor v = f64_tensor({1, 3, 1}, {1, 2, 3}, "V");
  const Tensor mask = f64_tensor({2, 3}, {-kInf, -kInf, -kInf, 0, 0, 0}, "M");
  const Tensor sinks = per_head({-0.25}, DType::kF64, "sinks");
  AttentionOptions o = reference_options();
  o.mask = mask.view();
  o.sinks = sinks.view();
  const AttentionResult r = attention(q.view(), k.view(), v.view(), o);
  EXPECT_EQ(r.lse.data_as<double>()[0], -0.25);
  EXPECT_EQ(r.out.data_as<double>()[0], 0.0);
  for (int j = 0; j < 3; ++j) EXPECT_EQ(r.weights.data_as<double>()[j], 0.0);
  EXPECT_GT(r.lse.data_as<double>()[1], -0.25);
  const Tensor k0(DType::kF64, {1, 0, 2}, "K"), v0(DType::kF64, {1, 0, 1}, "V");
  o.mask.reset();
  const AttentionResult none = attention(q.view(), k0.view(), v0.view(), o);
  EXPECT_EQ(none.lse.data_as<double>()[0], -0.25);
  EXPECT_EQ(none.lse.data_as<double>()[1], -0.25);
  EXPECT_EQ(none.out.data_as<double>()[0], 0.0);
}

TEST(ReferenceModifiers, SoftcapAlibiSinksWindowAndFloatMaskTogether) {
  // GQA (4 query heads on 2 kv heads), Nq != Nk, window (2, 1), a float mask with one -inf.
  HandCall c = small_call(4, 2, 4, 6, 2.0);
  c.scale = 0.8;
  c.cap = 3.0;
  c.sinks = {0.5, -0.5, 1.0, 0.0};
  const std::vector<double> m = values(static_cast<std::size_t>(c.nq * c.nk), 1.0, 4);
  c.bias = [&](std::int64_t, std::int64_t i, std::int64_t j) {
    return i == 1 && j == 3 ? -kInf : m[static_cast<std::size_t>(i * 6 + j)];
  };
  c.allowed = [](std::int64_t, std::int64_t i, std::int64_t j) {
    const std::int64_t diag = i + 6 - 4;
    return diag - 2 <= j && j <= diag + 1;
  };
  const HandTensors t(c);
  Tensor mask = f64_tensor({4, 6}, m, "M");
  mask.data_as<double>()[1 * 6 + 3] = -kInf;
  const Tensor sinks = per_head(c.sinks, DType::kF32, "sinks");
  AttentionOptions o = reference_options();
  o.scale = c.scale;
  o.softcap = c.cap;
  o.alibi = true;  // H = 4: 2^-2, 2^-4, 2^-6, 2^-8
  o.sinks = sinks.view();
  o.mask = mask.view();
  o.window = Window{2, 1};
  c.slopes = {0.25, 0.0625, 0.015625, 0.00390625};
  expect_matches_by_hand(attention(t.q.view(), t.k.view(), t.v.view(), o), by_hand(c));
}

// Rounding to the storage type: nq = nk = 1, so out = round(v) exactly and lse = round(q)·
// round(k) (d = 1, scale 1). The test values include ties (to even) and doubles just above a
// tie that float32 rounds onto the tie: rounding double -> float -> 16 bits would go to even
// there, rounding once from double goes up.
struct RoundCase {
  DType dtype;
  double (*round)(double);
  std::vector<double> v;
};

std::vector<RoundCase> round_cases() {
  const double b = std::ldexp(1.0, -8), h = std::ldexp(1.0, -11), tiny = std::ldexp(1.0, -30);
  return {
      {DType::kBF16, round_bf16,
       {1 + b, 1 + 3 * b, 1 + b + tiny, -(1 + b + tiny), 1 + b - tiny, 3.0e38, -1e-40, 0.1,
        std::ldexp(1.0 + b + tiny, -130)}},
      {DType::kF16, round_f16,
       {1 + h, 1 + 3 * h, 1 + h + tiny, -(1 + h + tiny), 65504.0, 3 * std::ldexp(1.0, -26),
        std::ldexp(1.0, -25) + std::ldexp(1.0, -40), 0.1, 1e-3}},
  };
}

TEST(ReferenceRounding, Float64InputsAreRoundedOnceToNearestEven) {
  for (const RoundCase& rc : round_cases()) {
    SCOPED_TRACE(dtype_name(rc.dtype));
    const auto n = static_cast<std::int64_t>(rc.v.size());
    const Tensor v = f64_tensor({1, n}, rc.v, "V");
    const Tensor q = f64_tensor({1, 1}, {rc.v[2]}, "Q"), k = f64_tensor({1, 1}, {rc.v[3]}, "K");
    AttentionOptions o = reference_options();
    o.scale = 1.0;
    o.dtype = rc.dtype;
    const AttentionResult r = attention(q.view(), k.view(), v.view(), o);
    for (std::int64_t c = 0; c < n; ++c) {
      const double x = rc.v[static_cast<std::size_t>(c)];
      EXPECT_EQ(r.out.data_as<double>()[c], rc.round(x)) << "value " << x;
    }
    EXPECT_EQ(r.lse.data_as<double>()[0], rc.round(rc.v[2]) * rc.round(rc.v[3]));
    // The above-tie values go up (once from double), not to even (double -> float -> 16 bits).
    EXPECT_GT(r.out.data_as<double>()[2], 1.0 + (rc.dtype == DType::kBF16 ? 0x1p-8 : 0x1p-11));
    // Without a dtype, float64 inputs are not rounded.
    o.dtype.reset();
    EXPECT_EQ(attention(q.view(), k.view(), v.view(), o).out.data_as<double>()[2], rc.v[2]);
  }
}

TEST(ReferenceRounding, Float32InputsAreRoundedToNearestEven) {
  for (const RoundCase& rc : round_cases()) {
    SCOPED_TRACE(dtype_name(rc.dtype));
    std::vector<double> v32;  // the float32 values of the cases (rounded by the compiler)
    for (const double x : rc.v) v32.push_back(static_cast<double>(static_cast<float>(x)));
    const auto n = static_cast<std::int64_t>(v32.size());
    const Tensor v = f64_tensor({1, n}, v32, "V").to(DType::kF32);
    const Tensor q = f64_tensor({1, 1}, {v32[1]}, "Q").to(DType::kF32);
    const Tensor k = f64_tensor({1, 1}, {v32[0]}, "K").to(DType::kF32);
    AttentionOptions o = reference_options();
    o.scale = 1.0;
    o.dtype = rc.dtype;
    const AttentionResult r = attention(q.view(), k.view(), v.view(), o);
    for (std::int64_t c = 0; c < n; ++c) {
      const double x = v32[static_cast<std::size_t>(c)];
      EXPECT_EQ(r.out.data_as<double>()[c], rc.round(x)) << "value " << x;
    }
    EXPECT_EQ(r.lse.data_as<double>()[0], rc.round(v32[1]) * rc.round(v32[0]));
  }
}

TEST(ReferenceRounding, OneSixteenBitTypeIsRoundedToTheOtherAndTheDefaultFollowsStorage) {
  // 1 + 2^-10 is a float16 but not a bfloat16 (which rounds it to 1); 1 + 2^-7 is both.
  const double f16_only = 1 + std::ldexp(1.0, -10), both = 1 + std::ldexp(1.0, -7);
  const Tensor q16 = f64_tensor({1, 1}, {f16_only}, "Q").to(DType::kF16);
  const Tensor k16 = f64_tensor({1, 1}, {both}, "K").to(DType::kF16);
  const Tensor v16 = f64_tensor({1, 2}, {f16_only, both}, "V").to(DType::kF16);
  const Tensor kb = f64_tensor({1, 1}, {both}, "K").to(DType::kBF16);
  AttentionOptions o = reference_options();
  o.scale = 1.0;
  // All float16, no dtype: computed in float16, nothing to round.
  AttentionResult r = attention(q16.view(), k16.view(), v16.view(), o);
  EXPECT_EQ(r.out.data_as<double>()[0], f16_only);
  EXPECT_EQ(r.lse.data_as<double>()[0], f16_only * both);
  // Mixed float16 and bfloat16, no dtype: float32, nothing rounded.
  r = attention(q16.view(), kb.view(), v16.view(), o);
  EXPECT_EQ(r.lse.data_as<double>()[0], f16_only * both);
  // dtype bf16: the float16 operands are rounded to bfloat16.
  o.dtype = DType::kBF16;
  r = attention(q16.view(), kb.view(), v16.view(), o);
  EXPECT_EQ(r.out.data_as<double>()[0], 1.0);
  EXPECT_EQ(r.out.data_as<double>()[1], both);
  EXPECT_EQ(r.lse.data_as<double>()[0], both);
}

TEST(ReferenceRounding, Float16OutputsAreTheFloat32ResultRoundedOnce) {
  HandCall c = small_call(2, 2, 3, 5, 1.0);
  const HandTensors t(c);
  AttentionOptions o;
  o.return_weights = o.return_lse = true;
  o.kernel = "reference";
  const AttentionResult f32 = attention(t.q.view(), t.k.view(), t.v.view(), o);
  o.out_dtype = DType::kF16;
  const AttentionResult f16 = attention(t.q.view(), t.k.view(), t.v.view(), o);
  const std::pair<const Tensor*, const Tensor*> pairs[] = {
      {&f32.out, &f16.out}, {&f32.weights, &f16.weights}, {&f32.lse, &f16.lse}};
  for (const auto& [wide, narrow] : pairs) {
    ASSERT_EQ(narrow->dtype(), DType::kF16);
    ASSERT_EQ(narrow->shape(), wide->shape());
    for (std::int64_t e = 0; e < wide->numel(); ++e) {
      EXPECT_EQ(element(narrow->view(), e), round_f16(element(wide->view(), e))) << e;
    }
  }
}

}  // namespace
}  // namespace qkv::testing
