// explain with the score modifiers (softcap, ALiBi, sinks) and a storage dtype: every step of
// the walk-through against the reference kernel and against the formulas worked here by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/half.h"
#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/explain.h"
#include "support/test_support.h"

namespace qkv {
namespace {

constexpr std::int64_t kHeads = 4, kKvHeads = 2, kNq = 5, kNk = 9, kD = 6, kDv = 3;

struct Inputs {
  Tensor q = testing::random_tensor(DType::kF32, {kHeads, kNq, kD}, 11, -2.0, 2.0);
  Tensor k = testing::random_tensor(DType::kF32, {kKvHeads, kNk, kD}, 12, -2.0, 2.0);
  Tensor v = testing::random_tensor(DType::kF32, {kKvHeads, kNk, kDv}, 13);
  Tensor sinks = testing::random_tensor(DType::kF32, {kHeads}, 14, -1.0, 2.0);

  AttentionOptions options() const {
    AttentionOptions o;
    o.softcap = 1.5;
    o.alibi = true;
    o.sinks = sinks.view();
    o.window = Window{2, 1};
    return o;
  }
};

TEST(ExplainModifiers, EveryStepMatchesTheReferenceAndTheFormulas) {
  const Inputs in;
  const Explanation e = explain_attention(in.q.view(), in.k.view(), in.v.view(), in.options());
  AttentionOptions ref = in.options();
  ref.kernel = "reference";
  ref.return_weights = true;
  ref.return_lse = true;
  ref.out_dtype = DType::kF64;
  const AttentionResult r = attention(in.q.view(), in.k.view(), in.v.view(), ref);
  const std::vector<double> slopes = alibi_slopes(kHeads);
  const double scale = 1.0 / std::sqrt(static_cast<double>(kD));
  for (std::int64_t h = 0; h < kHeads; ++h) {
    const double sink = in.sinks.data_as<float>()[h];
    for (std::int64_t i = 0; i < kNq; ++i) {
      const RowWalkThrough w = walk_through(e, h, i);
      const double lse = r.lse.data_as<double>()[h * kNq + i];
      EXPECT_NEAR(w.sink_share, std::exp(sink - lse), 1e-6) << h << "," << i;
      double total = w.sink_share;
      for (std::int64_t j = 0; j < kNk; ++j) {
        const auto sj = static_cast<std::size_t>(j);
        const double diag = static_cast<double>(i + kNk - kNq);
        const double capped = 1.5 * std::tanh(scale * w.raw[sj] / 1.5);
        EXPECT_NEAR(w.capped[sj], capped, 1e-12);
        EXPECT_NEAR(w.alibi[sj], -slopes[static_cast<std::size_t>(h)] *
                                     std::abs(diag - static_cast<double>(j)), 1e-12);
        const double weight = r.weights.data_as<double>()[(h * kNq + i) * kNk + j];
        EXPECT_NEAR(w.weight[sj], weight, 1e-6) << h << "," << i << "," << j;
        total += w.weight[sj];
      }
      EXPECT_NEAR(total, 1.0, 1e-6);
      for (std::int64_t c = 0; c < kDv; ++c) {
        EXPECT_NEAR(w.weighted_sum[static_cast<std::size_t>(c)],
                    r.out.data_as<double>()[(h * kNq + i) * kDv + c], 1e-6);
      }
    }
  }
  const std::string text = format_walk_through(e, walk_through(e, 1, 3));
  EXPECT_NE(text.find("tanh"), std::string::npos) << text;
  EXPECT_NE(text.find("capped"), std::string::npos) << text;
  EXPECT_NE(text.find("ALiBi"), std::string::npos) << text;
  EXPECT_NE(text.find("the sink"), std::string::npos) << text;
  const std::string overview = format_overview(e);
  EXPECT_NE(overview.find("softcap 1.5"), std::string::npos) << overview;
  EXPECT_NE(overview.find("sinks ["), std::string::npos) << overview;
}

// The entropy is over the keys' weights renormalised to 1 (the sink's share left out), so the
// effective number of keys never exceeds the allowed keys (a one-key row beside a sink: 1).
TEST(ExplainModifiers, EntropyCountsOnlyTheKeysBesideTheSink) {
  const Inputs in;
  const Explanation e = explain_attention(in.q.view(), in.k.view(), in.v.view(), in.options());
  for (std::int64_t h = 0; h < kHeads; ++h) {
    const HeadScan scan = scan_head(e, h);
    for (std::int64_t i = 0; i < kNq; ++i) {
      const RowWalkThrough w = walk_through(e, h, i);
      double keys_share = 0.0;
      for (double x : w.weight) keys_share += x;
      // Both from the lse the float32 kernel returned: they agree to its precision.
      EXPECT_NEAR(keys_share, 1.0 - w.sink_share, 1e-6);
      double entropy = 0.0;
      for (double x : w.weight) {
        const double p = x / keys_share;
        entropy -= p > 0 ? p * std::log(p) : 0.0;
      }
      if (keys_share == 0.0) entropy = 0.0;
      EXPECT_NEAR(scan.entropy[static_cast<std::size_t>(i)], entropy, 1e-9);
      EXPECT_NEAR(w.entropy, entropy, 1e-12);
      EXPECT_LE(w.effective_keys, static_cast<double>(w.allowed_keys) * (1 + 1e-12));
    }
  }
}

TEST(ExplainModifiers, ARowWithNoKeyGoesToTheSink) {
  const Inputs in;
  AttentionOptions o = in.options();
  o.window.reset();
  o.causal = true;
  // Nq > Nk: with causal alignment the first rows have no key.
  const Tensor q = testing::random_tensor(DType::kF32, {kHeads, kNk + 2, kD}, 21);
  const Explanation e = explain_attention(q.view(), in.k.view(), in.v.view(), o);
  const RowWalkThrough w = walk_through(e, 2, 0);
  EXPECT_EQ(w.allowed_keys, 0);
  EXPECT_DOUBLE_EQ(w.lse, static_cast<double>(in.sinks.data_as<float>()[2]));
  EXPECT_DOUBLE_EQ(w.sink_share, 1.0);
  for (double x : w.out) EXPECT_EQ(x, 0.0);
  const std::string text = format_walk_through(e, w);
  EXPECT_NE(text.find("the sink takes everything"), std::string::npos) << text;
  const HeadScan scan = scan_head(e, 2);
  EXPECT_FALSE(scan.has_keys[0]);
}

TEST(ExplainModifiers, ShowsTheValuesRoundedToTheStorageType) {
  const Inputs in;
  AttentionOptions o;
  o.dtype = DType::kBF16;
  const Explanation e = explain_attention(in.q.view(), in.k.view(), in.v.view(), o);
  for (std::int64_t i = 0; i < kNq * kD; ++i) {
    const float x = in.q.data_as<float>()[i];
    EXPECT_EQ(e.q[0].values[static_cast<std::size_t>(i)],
              static_cast<double>(core::bf16_to_float(core::float_to_bf16(x))));
  }
  EXPECT_NE(format_overview(e).find("rounded to bfloat16"), std::string::npos);
}

TEST(ExplainModifiers, RefusesAPackedBatch) {
  const Inputs in;
  Tensor cu(DType::kI64, {2});
  cu.data_as<std::int64_t>()[1] = kNq;
  Tensor cuk(DType::kI64, {2});
  cuk.data_as<std::int64_t>()[1] = kNk;
  AttentionOptions o;
  o.cu_seqlens_q = cu.view();
  o.cu_seqlens_k = cuk.view();
  try {
    explain_attention(in.q.view(), in.k.view(), in.v.view(), o);
    FAIL() << "a packed batch was explained";
  } catch (const Error& err) {
    EXPECT_EQ(err.subject(), "cu_seqlens");
  }
}

}  // namespace
}  // namespace qkv
