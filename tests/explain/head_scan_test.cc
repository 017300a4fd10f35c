// The block-wise scan and the explanation's inputs against full weights from the reference
// kernel: masks, causal and window rules, grouped heads, batches, empty rows and the layer form.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/explain.h"
#include "qkv/layer.h"
#include "support/test_support.h"

namespace qkv {
namespace {

AttentionResult reference(const TensorView& q, const TensorView& k, const TensorView& v,
                          AttentionOptions options) {
  options.kernel = "reference";
  options.return_weights = true;
  options.return_lse = true;
  options.out_dtype = DType::kF64;
  return attention(q, k, v, options);
}

// Weights [B, H, nq, nk] of batch b, head h, as a row-major nq x nk vector.
std::vector<double> head_weights(const Tensor& weights, std::int64_t b, std::int64_t heads,
                                 std::int64_t h, std::int64_t nq, std::int64_t nk) {
  const double* first = weights.data_as<double>() + (b * heads + h) * nq * nk;
  return std::vector<double>(first, first + nq * nk);
}

// Every statistic of scan_head, recomputed from full weights.
void expect_scan_matches(const Explanation& e, std::int64_t head, const std::vector<double>& w,
                         std::int64_t max_side) {
  const HeadScan s = scan_head(e, head, max_side);
  ASSERT_EQ(s.map_rows, std::min(e.nq, max_side));
  ASSERT_EQ(s.map_cols, std::min(e.nk, max_side));
  std::vector<float> pooled(static_cast<std::size_t>(s.map_rows * s.map_cols), 0.0f);
  struct CellTotal {
    double sum = 0.0, allowed = 0.0;
  };
  std::vector<CellTotal> cells(pooled.size());
  for (std::int64_t i = 0; i < e.nq; ++i) {
    double entropy = 0.0, distance = 0.0, top = 0.0, sum = 0.0;
    std::int64_t allowed = 0;
    for (std::int64_t j = 0; j < e.nk; ++j) {
      const double wij = w[static_cast<std::size_t>(i * e.nk + j)];
      sum += wij;
      if (std::isfinite(e.bias(head, i, j))) ++allowed;
      if (wij > 0) entropy -= wij * std::log(wij);
      distance += wij * std::abs(static_cast<double>(j - (i + e.nk - e.nq)));
      top = std::max(top, wij);
      const auto c = static_cast<std::size_t>((i * s.map_rows / e.nq) * s.map_cols +
                                              j * s.map_cols / e.nk);
      pooled[c] = std::max(pooled[c], static_cast<float>(wij));
      if (std::isfinite(e.bias(head, i, j))) {
        cells[c].sum += wij;
        cells[c].allowed += 1.0;
      }
    }
    const auto si = static_cast<std::size_t>(i);
    EXPECT_EQ(s.has_keys[si], sum > 0.5) << "row " << i;
    EXPECT_EQ(s.allowed_keys[si], allowed) << "row " << i;
    EXPECT_NEAR(s.entropy[si], entropy, 1e-10) << "row " << i;
    // Cross-attention: positions of two sequences are not comparable, so no distance.
    EXPECT_NEAR(s.distance[si], e.cross_attention ? 0.0 : distance, 1e-10) << "row " << i;
    EXPECT_NEAR(s.first_key[si], w[si * static_cast<std::size_t>(e.nk)], 1e-12);
    EXPECT_NEAR(s.max_row_weight[si], top, 1e-12);
    // walk_through agrees with the full weights too.
    const RowWalkThrough row = walk_through(e, head, i);
    for (std::int64_t j = 0; j < e.nk; ++j) {
      EXPECT_NEAR(row.weight[static_cast<std::size_t>(j)],
                  w[static_cast<std::size_t>(i * e.nk + j)], 1e-12);
    }
  }
  for (std::size_t c = 0; c < pooled.size(); ++c) {
    EXPECT_NEAR(s.max_weight[c], pooled[c], 1e-7);
    // Mean pooling: the mean over the cell's allowed (i, j), 0 where none is.
    EXPECT_NEAR(s.mean_weight[c], cells[c].allowed > 0 ? cells[c].sum / cells[c].allowed : 0.0,
                1e-7);
  }
}

TEST(HeadScan, MaskedGroupedBatchedHeadsMatchFullWeights) {
  const std::int64_t b = 2, h = 4, hkv = 2, nq = 37, nk = 53, d = 8, dv = 5;
  const Tensor q = testing::random_tensor(DType::kF64, {b, h, nq, d}, 1, -2, 2);
  const Tensor k = testing::random_tensor(DType::kF64, {b, hkv, nk, d}, 2, -2, 2);
  const Tensor v = testing::random_tensor(DType::kF64, {b, hkv, nk, dv}, 3);
  // A float mask that varies by head and forbids a few keys (-inf); broadcast over the batch.
  Tensor mask = testing::random_tensor(DType::kF64, {h, nq, nk}, 4, -1, 1);
  for (std::int64_t n = 0; n < mask.numel(); n += 7) {
    mask.data_as<double>()[n] = -std::numeric_limits<double>::infinity();
  }
  // Row 3 of head 1 allows nothing: zero weights, lse = -inf.
  for (std::int64_t j = 0; j < nk; ++j) {
    mask.data_as<double>()[(1 * nq + 3) * nk + j] = -std::numeric_limits<double>::infinity();
  }
  AttentionOptions options;
  options.mask = mask.view();
  options.causal = true;
  options.window = Window{20, -1};
  options.kernel = "reference";  // exact lse: what is tested here is the scan, not a kernel
  const AttentionResult ref = reference(q.view(), k.view(), v.view(), options);
  for (std::int64_t batch = 0; batch < b; ++batch) {
    ExplainSetup setup;
    setup.batch = batch;
    const Explanation e = explain_attention(q.view(), k.view(), v.view(), options, setup);
    EXPECT_TRUE(e.mask_varies_by_head);
    for (std::int64_t head = 0; head < h; ++head) {
      SCOPED_TRACE(::testing::Message() << "batch " << batch << " head " << head);
      expect_scan_matches(e, head, head_weights(ref.weights, batch, h, head, nq, nk), 16);
      const double* out = ref.out.data_as<double>() + (batch * h + head) * nq * dv;
      for (std::int64_t n = 0; n < nq * dv; ++n) {
        EXPECT_NEAR(e.out[static_cast<std::size_t>(head)].values[static_cast<std::size_t>(n)],
                    out[n], 1e-14);
      }
    }
    EXPECT_FALSE(scan_head(e, 1).has_keys[3]);
    EXPECT_EQ(walk_through(e, 1, 3).effective_keys, 0.0);
  }
}

TEST(HeadScan, UnpooledMapHoldsEveryWeight) {
  const Tensor q = testing::random_tensor(DType::kF32, {12, 4}, 5);
  const Tensor k = testing::random_tensor(DType::kF32, {9, 4}, 6);
  const Tensor v = testing::random_tensor(DType::kF32, {9, 3}, 7);
  AttentionOptions options;
  options.kernel = "reference";
  const Explanation e = explain_attention(q.view(), k.view(), v.view(), options);
  const AttentionResult ref = reference(q.view(), k.view(), v.view(), {});
  expect_scan_matches(e, 0, head_weights(ref.weights, 0, 1, 0, 12, 9), 512);
  EXPECT_EQ(interesting_rows(e, {scan_head(e, 0)}).size(), 2u);
}

// The layer form: the same projections and heads as multi_head_attention().
TEST(ExplainLayer, MatchesTheLayer) {
  const Tensor x = testing::random_tensor(DType::kF64, {2, 10, 6}, 8);
  const Tensor memory = testing::random_tensor(DType::kF64, {2, 14, 5}, 9);
  const Tensor wq = testing::random_tensor(DType::kF64, {6, 4 * 3}, 10);
  const Tensor wk = testing::random_tensor(DType::kF64, {5, 2 * 3}, 11);
  const Tensor wv = testing::random_tensor(DType::kF64, {5, 2 * 2}, 12);
  const Tensor bq = testing::random_tensor(DType::kF64, {12}, 13);
  LayerWeights weights{wq.view(), wk.view(), wv.view()};
  weights.bq = bq.view();
  LayerOptions options;
  options.heads = 4;
  options.kv_heads = 2;
  options.attention.causal = true;
  options.attention.kernel = "reference";
  options.attention.return_weights = true;
  options.attention.out_dtype = DType::kF64;
  const LayerResult layer = multi_head_attention(x.view(), weights, options, memory.view());
  ExplainSetup setup;
  setup.batch = 1;
  const Explanation e = explain_layer(x.view(), weights, options, memory.view(), setup);
  ASSERT_EQ(e.heads, 4);
  ASSERT_EQ(e.kv_heads, 2);
  EXPECT_EQ(e.d, 3);
  EXPECT_EQ(e.dv, 2);
  for (std::int64_t h = 0; h < 4; ++h) {
    expect_scan_matches(e, h, head_weights(layer.weights, 1, 4, h, 10, 14), 512);
    // The layer's output without W^O is the concatenation of the heads.
    for (std::int64_t i = 0; i < 10; ++i) {
      for (std::int64_t c = 0; c < 2; ++c) {
        EXPECT_NEAR(e.out[static_cast<std::size_t>(h)].at(i, c),
                    layer.out.data_as<double>()[(1 * 10 + i) * 8 + h * 2 + c], 1e-12);
      }
    }
  }
  const RowWalkThrough row = walk_through(e, 2, 4);
  EXPECT_EQ(row.x.size(), 6u);
  EXPECT_EQ(e.projection->bq.size(), 4u);
}

// Under a causal rule the first row has one key and is trivially focused: the rows chosen by
// default are the most and least focused of the rows that have a choice.
TEST(InterestingRows, SkipRowsWithOneKey) {
  const Tensor q = testing::random_tensor(DType::kF64, {12, 4}, 31, -3, 3);
  const Tensor k = testing::random_tensor(DType::kF64, {12, 4}, 32, -3, 3);
  const Tensor v = testing::random_tensor(DType::kF64, {12, 2}, 33);
  AttentionOptions options;
  options.causal = true;
  const Explanation e = explain_attention(q.view(), k.view(), v.view(), options);
  const HeadScan scan = scan_head(e, 0);
  const std::vector<std::int64_t> rows = interesting_rows(e, {scan});
  ASSERT_EQ(rows.size(), 2u);
  double least = 1e9, most = -1;
  for (std::int64_t i = 1; i < 12; ++i) {
    least = std::min(least, scan.entropy[static_cast<std::size_t>(i)]);
    most = std::max(most, scan.entropy[static_cast<std::size_t>(i)]);
  }
  for (const std::int64_t row : rows) {
    EXPECT_GT(row, 0);
    const double h = scan.entropy[static_cast<std::size_t>(row)];
    EXPECT_TRUE(h == least || h == most) << row;
  }
}

// With the fastest kernel (whatever this machine has), the weights stay within 1e-6.
TEST(HeadScan, DefaultKernelIsWithinOneMillionth) {
  const Tensor q = testing::random_tensor(DType::kF32, {2, 70, 16}, 21, -2, 2);
  const Tensor k = testing::random_tensor(DType::kF32, {2, 90, 16}, 22, -2, 2);
  const Tensor v = testing::random_tensor(DType::kF32, {2, 90, 8}, 23);
  AttentionOptions options;
  options.causal = true;
  const Explanation e = explain_attention(q.view(), k.view(), v.view(), options);
  const AttentionResult ref = reference(q.view(), k.view(), v.view(), options);
  for (std::int64_t h = 0; h < 2; ++h) {
    const std::vector<double> w = head_weights(ref.weights, 0, 2, h, 70, 90);
    for (std::int64_t i = 0; i < 70; ++i) {
      const RowWalkThrough row = walk_through(e, h, i);
      for (std::int64_t j = 0; j < 90; ++j) {
        EXPECT_NEAR(row.weight[static_cast<std::size_t>(j)],
                    w[static_cast<std::size_t>(i * 90 + j)], 1e-6);
      }
    }
  }
}

TEST(ExplainErrors, NameTheirSubject) {
  const Tensor q = testing::random_tensor(DType::kF64, {3, 4}, 1);
  const Tensor k = testing::random_tensor(DType::kF64, {5, 4}, 2);
  const Tensor v = testing::random_tensor(DType::kF64, {5, 2}, 3);
  ExplainSetup setup;
  setup.key_labels = {"a", "b"};
  setup.key_labels_source = "words.txt";
  try {
    explain_attention(q.view(), k.view(), v.view(), {}, setup);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.subject(), "words.txt");
  }
  setup = {};
  setup.batch = 1;
  EXPECT_THROW(explain_attention(q.view(), k.view(), v.view(), {}, setup), Error);
}

}  // namespace
}  // namespace qkv
