// Deterministic parallelism, run under ThreadSanitizer by `make test-tsan` (label `threads`):
// every kernel and the whole layer give bitwise identical results for 1 to 8 threads, over 50
// repeats, with no data race reported.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/layer.h"
#include "support/test_support.h"

namespace qkv {
namespace {

constexpr int kRepeats = 50;
constexpr int kMaxThreads = 8;

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         (a.nbytes() == 0 || std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
}

class Threads : public ::testing::TestWithParam<std::string> {};

TEST_P(Threads, AttentionIsBitwiseIdenticalForOneToEightThreadsOverFiftyRepeats) {
  // Grouped-query heads, ragged tiles, a broadcast float mask with forbidden keys, causal.
  const Tensor q = testing::random_tensor(DType::kF32, {2, 4, 37, 16}, 1);
  const Tensor k = testing::random_tensor(DType::kF32, {2, 2, 45, 16}, 2);
  const Tensor v = testing::random_tensor(DType::kF32, {2, 2, 45, 12}, 3);
  Tensor mask = testing::random_tensor(DType::kF32, {1, 4, 1, 45}, 4, -1.0, 1.0);
  for (std::int64_t i = 0; i < mask.numel(); i += 5) {
    mask.data_as<float>()[i] = -std::numeric_limits<float>::infinity();
  }
  AttentionOptions options;
  options.kernel = GetParam();
  options.causal = true;
  options.mask = mask.view();
  options.return_weights = options.return_lse = true;
  options.threads = 1;
  AttentionResult first;
  try {
    first = attention(q.view(), k.view(), v.view(), options);
  } catch (const Error& e) {
    GTEST_SKIP() << e.what();
  }
  for (int repeat = 0; repeat < kRepeats; ++repeat) {
    options.threads = 1 + repeat % kMaxThreads;
    const AttentionResult again = attention(q.view(), k.view(), v.view(), options);
    ASSERT_TRUE(same_bits(again.out, first.out)) << "threads " << options.threads;
    ASSERT_TRUE(same_bits(again.weights, first.weights)) << "threads " << options.threads;
    ASSERT_TRUE(same_bits(again.lse, first.lse)) << "threads " << options.threads;
  }
}

INSTANTIATE_TEST_SUITE_P(EveryKernel, Threads, ::testing::ValuesIn(attention_kernel_names()),
                         [](const auto& param_info) { return param_info.param; });

TEST(ThreadsLayer, LayerIsBitwiseIdenticalForOneToEightThreadsOverFiftyRepeats) {
  const Tensor x = testing::random_tensor(DType::kF32, {2, 19, 24}, 5);
  const Tensor wq = testing::random_tensor(DType::kF32, {24, 32}, 6);
  const Tensor wk = testing::random_tensor(DType::kF32, {24, 16}, 7);
  const Tensor wv = testing::random_tensor(DType::kF32, {24, 16}, 8);
  const Tensor wo = testing::random_tensor(DType::kF32, {32, 24}, 9);
  LayerWeights weights{wq.view(), wk.view(), wv.view()};
  weights.wo = wo.view();
  LayerOptions options;
  options.heads = 4;
  options.kv_heads = 2;
  options.attention.causal = true;
  options.attention.return_weights = true;
  options.attention.threads = 1;
  const LayerResult first = multi_head_attention(x.view(), weights, options);
  for (int repeat = 0; repeat < kRepeats; ++repeat) {
    options.attention.threads = 1 + repeat % kMaxThreads;
    const LayerResult again = multi_head_attention(x.view(), weights, options);
    ASSERT_TRUE(same_bits(again.out, first.out)) << "threads " << options.attention.threads;
    ASSERT_TRUE(same_bits(again.weights, first.weights)) << "threads " << options.attention.threads;
  }
}

}  // namespace
}  // namespace qkv
