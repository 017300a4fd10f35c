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
#include "qkv/kv_cache.h"
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

namespace qkv {
namespace {

// Split-KV: sequences of several chunks (>= 1024 keys each) merged in key order, from a KV
// cache and from plain tensors, give the same bits on 1 to 8 threads.
TEST(ThreadsDecode, SplitKvIsBitwiseIdenticalForOneToEightThreads) {
  KVCache cache(KVCacheOptions{2, 32, 24, CacheStorage::kInt8, 64, 0, 0});
  std::vector<SequenceId> ids;
  for (std::int64_t length : {2500, 1100}) {
    ids.push_back(cache.add_sequence());
    const Tensor k = testing::random_tensor(DType::kF32, {2, length, 32}, static_cast<std::uint64_t>(10 + length));
    const Tensor v = testing::random_tensor(DType::kF32, {2, length, 24}, static_cast<std::uint64_t>(20 + length));
    cache.append(ids.back(), k.view(), v.view());
  }
  const Tensor q = testing::random_tensor(DType::kF32, {2, 8, 1, 32}, 5);
  const Tensor k = testing::random_tensor(DType::kF32, {2, 2, 3000, 32}, 6);
  const Tensor v = testing::random_tensor(DType::kF32, {2, 2, 3000, 24}, 7);
  AttentionOptions options;
  options.causal = true;
  options.return_lse = true;
  options.threads = 1;
  const AttentionResult cached = attention_cached(q.view(), cache, ids, options);
  const AttentionResult plain = attention(q.view(), k.view(), v.view(), options);
  for (int repeat = 0; repeat < 16; ++repeat) {
    options.threads = 1 + repeat % kMaxThreads;
    const AttentionResult cached_again = attention_cached(q.view(), cache, ids, options);
    ASSERT_TRUE(same_bits(cached_again.out, cached.out)) << "threads " << options.threads;
    ASSERT_TRUE(same_bits(cached_again.lse, cached.lse)) << "threads " << options.threads;
    const AttentionResult plain_again = attention(q.view(), k.view(), v.view(), options);
    EXPECT_EQ(plain_again.kernel, plain.kernel);
    ASSERT_TRUE(same_bits(plain_again.out, plain.out)) << "threads " << options.threads;
  }
}

}  // namespace
}  // namespace qkv
