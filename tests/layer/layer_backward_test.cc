// The layer's gradients: every one against central finite differences of the float64 forward
// (self- and cross-attention, with and without W^O and biases, grouped-query heads, causal,
// sinks, attention dropout with its mask fixed by the seed), float32 against float64, the same
// bits for 1, 2 and 3 threads and with or without the forward's state, and a dY of the wrong
// shape refused naming it.
#include "qkv/layer_backward.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "qkv/error.h"
#include "support/test_support.h"

namespace qkv {
namespace {

struct LayerCase {
  std::string name;
  bool cross = false, wo = true, biases = true, causal = false, sinks = false, batched = true;
  std::int64_t heads = 2, kv_heads = 0;
  double dropout = 0.0;  // attention dropout's P (seed and offset fixed in options_of)
};

void PrintTo(const LayerCase& c, std::ostream* os) { *os << c.name; }

struct LayerInputs {
  Tensor x, m, wq, wk, wv, wo, bq, bk, bv, bo, sinks, dy;
  LayerWeights weights() const {
    LayerWeights w{wq.view(), wk.view(), wv.view()};
    if (!wo.empty()) w.wo = wo.view();
    if (!bq.empty()) w.bq = bq.view(), w.bk = bk.view(), w.bv = bv.view();
    if (!bo.empty()) w.bo = bo.view();
    return w;
  }
  std::optional<TensorView> memory() const {
    return m.empty() ? std::nullopt : std::optional<TensorView>(m.view());
  }
};

constexpr std::int64_t kB = 2, kN = 5, kNm = 4, kD = 6, kDm = 3, kDk = 3, kDout = 4;

LayerInputs make(const LayerCase& c, DType dtype) {
  LayerInputs in;
  const std::int64_t kv = c.kv_heads == 0 ? c.heads : c.kv_heads;
  const std::int64_t dm = c.cross ? kDm : kD;
  const auto r = [&](Shape s, std::uint64_t seed) {
    return testing::random_tensor(dtype, s, seed);
  };
  in.x = c.batched ? r({kB, kN, kD}, 1) : r({kN, kD}, 1);
  if (c.cross) in.m = c.batched ? r({kB, kNm, dm}, 2) : r({kNm, dm}, 2);
  in.wq = r({kD, c.heads * kDk}, 3);
  in.wk = r({dm, kv * kDk}, 4);
  in.wv = r({dm, kv * kDk}, 5);
  if (c.wo) in.wo = r({c.heads * kDk, kDout}, 6);
  if (c.biases) {
    in.bq = r({c.heads * kDk}, 7);
    in.bk = r({kv * kDk}, 8);
    in.bv = r({kv * kDk}, 9);
    if (c.wo) in.bo = r({kDout}, 10);
  }
  if (c.sinks) in.sinks = r({c.heads}, 11);
  Shape out = in.x.shape();
  out.back() = c.wo ? kDout : c.heads * kDk;
  in.dy = r(out, 12);
  return in;
}

LayerOptions options_of(const LayerCase& c, const LayerInputs& in, int threads = 2) {
  LayerOptions o;
  o.heads = c.heads;
  o.kv_heads = c.kv_heads;
  o.attention.causal = c.causal;
  o.attention.threads = threads;
  if (!in.sinks.empty()) o.attention.sinks = in.sinks.view();
  // With dropout the mask is fixed by the seed and offset: the layer stays a differentiable
  // function of its inputs, and the backward draws the forward's mask again.
  o.attention.dropout_p = c.dropout;
  o.attention.seed = 0x0123456789abcdefull;
  o.attention.dropout_offset = 9;
  return o;
}

double loss(const LayerCase& c, const LayerInputs& in) {
  LayerOptions o = options_of(c, in);
  o.attention.out_dtype = DType::kF64;
  const LayerResult r = multi_head_attention(in.x.view(), in.weights(), o, in.memory());
  double sum = 0.0;
  for (std::int64_t e = 0; e < r.out.numel(); ++e) {
    sum += r.out.data_as<double>()[e] * in.dy.data_as<double>()[e];
  }
  return sum;
}

class LayerBackward : public ::testing::TestWithParam<LayerCase> {};

TEST_P(LayerBackward, EveryGradientMatchesCentralDifferences) {
  const LayerCase c = GetParam();
  LayerInputs in = make(c, DType::kF64);
  const LayerGradients g = multi_head_attention_backward(
      in.x.view(), in.weights(), options_of(c, in), in.dy.view(), in.memory());
  const auto check = [&](Tensor& t, const Tensor& grad, const char* what) {
    if (t.empty()) {
      EXPECT_TRUE(grad.empty()) << what;
      return;
    }
    ASSERT_EQ(grad.shape(), t.shape()) << what;
    for (std::int64_t e = 0; e < t.numel(); ++e) {
      double& value = t.data_as<double>()[e];
      const double saved = value;
      value = saved + 1e-6;
      const double up = loss(c, in);
      value = saved - 1e-6;
      const double down = loss(c, in);
      value = saved;
      const double numeric = (up - down) / 2e-6;
      EXPECT_NEAR(grad.data_as<double>()[e], numeric, 1e-6 + 1e-6 * std::abs(numeric))
          << what << "[" << e << "]";
    }
  };
  check(in.x, g.dx, "dx");
  check(in.m, g.dmemory, "dmemory");
  check(in.wq, g.dwq, "dwq");
  check(in.wk, g.dwk, "dwk");
  check(in.wv, g.dwv, "dwv");
  check(in.wo, g.dwo, "dwo");
  check(in.bq, g.dbq, "dbq");
  check(in.bk, g.dbk, "dbk");
  check(in.bv, g.dbv, "dbv");
  check(in.bo, g.dbo, "dbo");
  check(in.sinks, g.dsinks, "dsinks");
  if (c.dropout > 0.0) {  // the mask dropped something: this case is not the one without it
    LayerCase without = c;
    without.dropout = 0.0;
    EXPECT_GT(std::abs(loss(without, in) - loss(c, in)), 1e-3);
  }
}

TEST_P(LayerBackward, Float32AgreesAndTheBitsDoNotDependOnThreadsOrState) {
  const LayerCase c = GetParam();
  const LayerInputs in64 = make(c, DType::kF64), in = make(c, DType::kF32);
  const LayerGradients g64 = multi_head_attention_backward(
      in64.x.view(), in64.weights(), options_of(c, in64), in64.dy.view(), in64.memory());
  const LayerGradients one = multi_head_attention_backward(
      in.x.view(), in.weights(), options_of(c, in, 1), in.dy.view(), in.memory());
  LayerForwardState state;
  multi_head_attention(in.x.view(), in.weights(), options_of(c, in, 3), in.memory(), state);
  for (int threads : {2, 3}) {
    const LayerGradients many =
        multi_head_attention_backward(in.x.view(), in.weights(), options_of(c, in, threads),
                                      in.dy.view(), in.memory(), threads == 3 ? &state : nullptr);
    EXPECT_TRUE(testing::same_bytes(one.dx, many.dx));
    EXPECT_TRUE(testing::same_bytes(one.dwq, many.dwq));
    EXPECT_TRUE(testing::same_bytes(one.dwk, many.dwk));
    EXPECT_TRUE(testing::same_bytes(one.dwv, many.dwv));
    EXPECT_TRUE(testing::same_bytes(one.dwo, many.dwo));
    EXPECT_TRUE(testing::same_bytes(one.dmemory, many.dmemory));
  }
  EXPECT_EQ(one.dx.dtype(), DType::kF32);
  EXPECT_LE(testing::max_abs_diff(one.dwq.view(), g64.dwq.view()),
            1e-4 * std::max(1.0, testing::max_abs(g64.dwq.view())));
  EXPECT_LE(testing::max_abs_diff(one.dx.view(), g64.dx.view()),
            1e-4 * std::max(1.0, testing::max_abs(g64.dx.view())));
}

INSTANTIATE_TEST_SUITE_P(
    Layers, LayerBackward,
    ::testing::Values(LayerCase{"self_wo_biases"}, LayerCase{"self_plain", false, false, false},
                      LayerCase{"cross_causal", true, true, true, true},
                      LayerCase{"gqa_sinks_2d", false, true, false, true, true, false, 4, 2},
                      LayerCase{"dropout_gqa_causal", false, true, true, true, false, true, 4, 2,
                                0.3},
                      LayerCase{"dropout_cross_sinks_2d", true, true, true, false, true, false, 2,
                                0, 0.5}),
    [](const auto& test) { return test.param.name; });

TEST(LayerBackwardErrors, AGradientOfTheWrongShapeIsRefusedNamingIt) {
  const LayerCase c{"x"};
  const LayerInputs in = make(c, DType::kF32);
  Tensor wrong = testing::random_tensor(DType::kF32, {kB, kN, kDout + 1}, 3);
  TensorView view = wrong.view();
  view.name = "DY.npy";
  try {
    multi_head_attention_backward(in.x.view(), in.weights(), options_of(c, in), view, in.memory());
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("DY.npy: shape [2, 5, 5] should be [2, 5, 4]"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace qkv
