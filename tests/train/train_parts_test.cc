#include "train/train_parts.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>

namespace qkv::train {
namespace {

TEST(TrainRng, SameSeedSameStreamAndRanges) {
  Rng a(7), b(7);
  for (int i = 0; i < 1000; ++i) {
    const float u = a.uniform();
    EXPECT_EQ(u, b.uniform());
    EXPECT_GE(u, 0.0f);
    EXPECT_LT(u, 1.0f);
    const auto k = a.below(13);
    EXPECT_EQ(k, b.below(13));
    EXPECT_LT(k, 13u);
  }
  Rng c(1);
  double sum = 0, sq = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const double x = c.normal();
    sum += x;
    sq += x * x;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.03);
  EXPECT_NEAR(sq / n, 1.0, 0.05);
}

TEST(TrainTask, RecallQueriesAskKeysThatAppeared) {
  TaskConfig c;
  c.vocab = 16;
  c.pairs = 8;
  c.queries = 8;
  Rng rng(3);
  const Sequence s = make_sequence(c, rng);
  ASSERT_EQ(s.length(), 16);
  std::set<int> keys;
  for (int t = 0; t < 8; ++t) {
    EXPECT_GE(s.value[static_cast<std::size_t>(t)], 0);
    EXPECT_EQ(s.target[static_cast<std::size_t>(t)], -1);
    keys.insert(s.key[static_cast<std::size_t>(t)]);
  }
  EXPECT_EQ(keys.size(), 8u);  // distinct keys
  for (int t = 8; t < 16; ++t) {
    const auto ut = static_cast<std::size_t>(t);
    EXPECT_EQ(s.value[ut], -1);
    int found = -1;
    for (int i = 0; i < 8; ++i)
      if (s.key[static_cast<std::size_t>(i)] == s.key[ut])
        found = s.value[static_cast<std::size_t>(i)];
    EXPECT_EQ(s.target[ut], found);
  }
}

TEST(TrainTask, MqarValueFollowsItsKey) {
  TaskConfig c;
  c.task = Task::kMqar;
  c.vocab = 32;
  c.pairs = 6;
  c.seq_len = 24;
  Rng rng(5);
  const Sequence s = make_sequence(c, rng);
  ASSERT_EQ(s.length(), 24);
  for (int t = 12; t < 24; ++t) {
    const auto ut = static_cast<std::size_t>(t);
    ASSERT_LT(s.key[ut], 32);
    int found = -1;
    for (int i = 0; i < 12; i += 2)
      if (s.key[static_cast<std::size_t>(i)] == s.key[ut])
        found = s.key[static_cast<std::size_t>(i + 1)] - 32;
    EXPECT_EQ(s.target[ut], found);
  }
}

// The readout's gradients against central differences in the loss.
TEST(TrainReadout, GradientsMatchFiniteDifferences) {
  TaskConfig c;
  c.vocab = 5;
  c.pairs = 3;
  c.queries = 2;
  Rng rng(11);
  const Sequence s = make_sequence(c, rng);
  const int d = 4, n = s.length();
  std::vector<float> y = init_normal(static_cast<std::size_t>(n * d), 1.0f, rng);
  std::vector<float> w = init_normal(static_cast<std::size_t>(d * c.vocab), 0.5f, rng);
  std::vector<float> b = init_normal(static_cast<std::size_t>(c.vocab), 0.5f, rng);
  std::vector<float> dy(y.size()), dw(w.size(), 0.0f), db(b.size(), 0.0f);
  int count = 0, correct = 0;
  readout_loss(s, y.data(), d, c.vocab, w, b, 1.0f, dy.data(), &dw, &db, &count, &correct);
  EXPECT_EQ(count, 2);
  auto loss = [&] {
    int n1 = 0, n2 = 0;
    return readout_loss(s, y.data(), d, c.vocab, w, b, 1.0f, nullptr, nullptr, nullptr, &n1, &n2);
  };
  auto check = [&](std::vector<float>& p, const std::vector<float>& g) {
    for (std::size_t i = 0; i < p.size(); ++i) {
      const float keep = p[i], h = 1e-2f;
      p[i] = keep + h;
      const double up = loss();
      p[i] = keep - h;
      const double down = loss();
      p[i] = keep;
      EXPECT_NEAR((up - down) / (2.0 * h), g[i], 2e-3) << i;
    }
  };
  check(y, dy);
  check(w, dw);
  check(b, db);
}

TEST(TrainEmbed, ScatterAddIsTheGatherTransposed) {
  TaskConfig c;
  c.vocab = 6;
  c.pairs = 3;
  c.queries = 3;
  Rng rng(2);
  const Sequence s = make_sequence(c, rng);
  const int d = 3, n = s.length();
  const auto a = init_normal(static_cast<std::size_t>(c.vocab * d), 1.0f, rng);
  const auto b2 = init_normal(static_cast<std::size_t>(c.vocab * d), 1.0f, rng);
  const auto dx = init_normal(static_cast<std::size_t>(n * d), 1.0f, rng);
  std::vector<float> x(static_cast<std::size_t>(n * d));
  embed(s, Task::kRecall, a, b2, d, x.data());
  std::vector<float> ga(a.size(), 0.0f), gb(b2.size(), 0.0f);
  embed_backward(s, Task::kRecall, dx.data(), d, ga, gb);
  // <dx, embed(a, b)> = <ga, a> + <gb, b> since embed is linear in the tables.
  double lhs = 0, rhs = 0;
  for (std::size_t i = 0; i < x.size(); ++i) lhs += double{dx[i]} * x[i];
  for (std::size_t i = 0; i < a.size(); ++i) rhs += double{ga[i]} * a[i] + double{gb[i]} * b2[i];
  EXPECT_NEAR(lhs, rhs, 1e-4);
}

TEST(TrainAdam, FirstStepMovesByLrTimesSign) {
  std::vector<float> p = {1.0f, -2.0f, 0.5f};
  const std::vector<float> g = {0.3f, -4.0f, 0.0f};
  AdamState st(3);
  AdamConfig cfg;
  cfg.lr = 0.01f;
  st.update(p, g, cfg, 1);
  // Bias-corrected first step: m̂ = g, v̂ = g², so the step is lr·g/(|g| + eps).
  EXPECT_NEAR(p[0], 0.99f, 1e-6);
  EXPECT_NEAR(p[1], -1.99f, 1e-6);
  EXPECT_EQ(p[2], 0.5f);
}

}  // namespace
}  // namespace qkv::train
