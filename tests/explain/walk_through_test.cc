// The built-in example's walk-through: every number against the reference kernel and against
// values worked out by hand from the example's data, and the example's two conclusions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "qkv/attention.h"
#include "qkv/explain.h"
#include "qkv/layer.h"
#include "support/test_support.h"

namespace qkv {
namespace {

TensorView view_of(const Matrix& m, const char* name) {
  return TensorView{m.values.data(), DType::kF64, {m.rows, m.cols}, {m.cols, 1}, name};
}

// A·B by the textbook loop, independent of the library's GEMM.
Matrix multiply(const Matrix& a, const Matrix& b) {
  Matrix c{a.rows, b.cols, std::vector<double>(static_cast<std::size_t>(a.rows * b.cols), 0.0)};
  for (std::int64_t i = 0; i < a.rows; ++i) {
    for (std::int64_t j = 0; j < b.cols; ++j) {
      double sum = 0.0;
      for (std::int64_t k = 0; k < a.cols; ++k) sum += a.at(i, k) * b.at(k, j);
      c.values[static_cast<std::size_t>(i * b.cols + j)] = sum;
    }
  }
  return c;
}

double max_diff(const Matrix& a, const Matrix& b) {
  EXPECT_EQ(a.rows, b.rows);
  EXPECT_EQ(a.cols, b.cols);
  double d = 0.0;
  for (std::size_t n = 0; n < a.values.size(); ++n)
    d = std::max(d, std::abs(a.values[n] - b.values[n]));
  return d;
}

class BuiltinExample : public ::testing::Test {
 protected:
  std::vector<Explanation> parts_ = builtin_examples();
};

TEST_F(BuiltinExample, HasTwoLabelledParts) {
  ASSERT_EQ(parts_.size(), 2u);
  const Explanation& users = parts_[0];
  EXPECT_EQ(users.nq, 4);
  EXPECT_EQ(users.nk, 6);
  EXPECT_EQ(users.query_labels, (std::vector<std::string>{"Ana", "Ben", "Chloe", "Dev"}));
  EXPECT_EQ(users.key_labels[4], "The Matrix");
  const Explanation& films = parts_[1];
  EXPECT_EQ(films.nq, 6);
  EXPECT_EQ(films.query_labels, films.key_labels);
  for (const Explanation& e : parts_) {
    ASSERT_TRUE(e.projection.has_value());
    EXPECT_EQ(e.kernel, "reference");
    EXPECT_DOUBLE_EQ(e.scale, 0.5);  // 1/sqrt(d_k), d_k = 4 genres
  }
}

// Q, K and V are the projections of the example's rows (checked by the textbook product), and
// the walk-through of every row equals the reference kernel's weights and output.
TEST_F(BuiltinExample, EveryRowMatchesTheReferenceKernel) {
  for (const Explanation& e : parts_) {
    const ExplainProjection& p = *e.projection;
    EXPECT_LT(max_diff(e.q[0], multiply(p.x, p.wq[0])), 1e-15);
    EXPECT_LT(max_diff(e.k[0], multiply(p.memory, p.wk[0])), 1e-15);
    EXPECT_LT(max_diff(e.v[0], multiply(p.memory, p.wv[0])), 1e-15);

    AttentionOptions options;
    options.kernel = "reference";
    options.return_weights = true;
    options.return_lse = true;
    options.out_dtype = DType::kF64;
    const AttentionResult ref =
        attention(view_of(e.q[0], "Q"), view_of(e.k[0], "K"), view_of(e.v[0], "V"), options);
    for (std::int64_t i = 0; i < e.nq; ++i) {
      const RowWalkThrough w = walk_through(e, 0, i);
      EXPECT_NEAR(w.lse, ref.lse.data_as<double>()[i], 1e-14);
      for (std::int64_t j = 0; j < e.nk; ++j) {
        EXPECT_NEAR(w.weight[static_cast<std::size_t>(j)],
                    ref.weights.data_as<double>()[i * e.nk + j], 1e-14)
            << e.query_labels[static_cast<std::size_t>(i)] << " -> " << j;
        EXPECT_NEAR(w.raw[static_cast<std::size_t>(j)] * e.scale,
                    w.score[static_cast<std::size_t>(j)], 1e-15);
      }
      for (std::int64_t c = 0; c < e.dv; ++c) {
        EXPECT_NEAR(w.out[static_cast<std::size_t>(c)], ref.out.data_as<double>()[i * e.dv + c],
                    1e-14);
      }
    }
  }
}

// Ana likes science fiction (3) and action (2): her raw relevance to each film is her taste
// times the film's genres, worked out by hand from the example's numbers.
TEST_F(BuiltinExample, AnasRowByHand) {
  const RowWalkThrough ana = walk_through(parts_[0], 0, 0);
  const std::vector<double> raw = {4.0, 2.0, 0.0, 0.2, 4.12, 0.0};
  double sum = 0.0;
  for (double r : raw) sum += std::exp(0.5 * r);
  for (std::size_t j = 0; j < raw.size(); ++j) {
    EXPECT_NEAR(ana.raw[j], raw[j], 1e-12);
    EXPECT_NEAR(ana.weight[j], std::exp(0.5 * raw[j]) / sum, 1e-12);
  }
  EXPECT_NEAR(ana.lse, std::log(sum), 1e-12);
  EXPECT_EQ(ana.by_weight[0], 4);  // The Matrix
  EXPECT_EQ(ana.by_weight[1], 0);  // Alien
  EXPECT_EQ(ana.allowed_keys, 6);
}

TEST_F(BuiltinExample, TheRowsTellTheStory) {
  const Explanation& users = parts_[0];
  EXPECT_EQ(walk_through(users, 0, 2).by_weight[0], 3);  // Chloe (comedy): Groundhog Day
  const RowWalkThrough ben = walk_through(users, 0, 1);  // romance: Notting Hill and Titanic
  EXPECT_EQ(std::min(ben.by_weight[0], ben.by_weight[1]), 2);
  EXPECT_EQ(std::max(ben.by_weight[0], ben.by_weight[1]), 5);
  // Dev likes a bit of everything: the least focused user, close to all six films.
  const HeadScan scan = scan_head(users, 0);
  EXPECT_EQ(scan.least_focused, 3);
  EXPECT_GT(walk_through(users, 0, 3).effective_keys, 5.5);
  // Self-attention with W^Q = W^K: every film attends most to itself.
  const Explanation& films = parts_[1];
  for (std::int64_t i = 0; i < films.nq; ++i) EXPECT_EQ(walk_through(films, 0, i).by_weight[0], i);
}

// Conclusion 1: the output is a weighted sum of *all* the values.
TEST_F(BuiltinExample, OutputIsAWeightedSumOfAllValues) {
  for (const Explanation& e : parts_) {
    for (std::int64_t i = 0; i < e.nq; ++i) {
      const RowWalkThrough w = walk_through(e, 0, i);
      EXPECT_NEAR(std::accumulate(w.weight.begin(), w.weight.end(), 0.0), 1.0, 1e-14);
      for (double wj : w.weight) EXPECT_GT(wj, 0.0);  // every film contributes something
      for (std::size_t c = 0; c < w.out.size(); ++c)
        EXPECT_NEAR(w.out[c], w.weighted_sum[c], 1e-14);
    }
  }
}

// Conclusion 2: K and V are two transforms of the same rows (the films), by W^K and W^V.
TEST_F(BuiltinExample, KeysAndValuesComeFromTheSameRows) {
  const ExplainProjection& p = *parts_[0].projection;
  EXPECT_EQ(p.memory_name, "films");
  EXPECT_EQ(p.memory.rows, parts_[0].nk);
  EXPECT_NE(p.wk[0].cols, p.wv[0].cols);  // different transforms: genres vs. what a film gives
  const std::string text = format_key_value_rows(parts_[0]);
  EXPECT_NE(text.find("two transforms of the same rows of films"), std::string::npos);
  EXPECT_NE(text.find("The Matrix"), std::string::npos);
}

TEST_F(BuiltinExample, TextShowsEveryStepInTheSeedsOrder) {
  const std::string text = format_walk_through(parts_[0], walk_through(parts_[0], 0, 0));
  std::size_t at = 0;
  for (const char* step :
       {"\"Ana\"", "1. x_0", "q_0 = x_0·W^Q", "2. raw relevance r_0j", "3. scores s_0j = 0.5·r_0j",
        "4. weights", "The Matrix    0.3726", "5. values v_j", "6. O_0 = Σ_j w_0j·v_j",
        "7. entropy", "effective number of keys"}) {
    const std::size_t found = text.find(step, at);
    ASSERT_NE(found, std::string::npos) << step << "\n" << text;
    at = found;
  }
}

// Long rows are summarised: the heaviest keys and one line for the rest, never a dump.
TEST(WalkThroughText, LongRowsAreSummarised) {
  const Tensor q = testing::random_tensor(DType::kF64, {3, 8}, 11);
  const Tensor k = testing::random_tensor(DType::kF64, {500, 8}, 12);
  const Tensor v = testing::random_tensor(DType::kF64, {500, 4}, 13);
  const Explanation e = explain_attention(q.view(), k.view(), v.view(), {});
  const std::string text = format_walk_through(e, walk_through(e, 0, 1), 8);
  EXPECT_NE(text.find("(492 more allowed keys)"), std::string::npos) << text;
  EXPECT_LT(std::count(text.begin(), text.end(), '\n'), 40);
}

}  // namespace
}  // namespace qkv
