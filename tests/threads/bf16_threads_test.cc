// The bf16 paths of fused_hwy (vdpbf16ps, and AMX tiles) give bitwise identical results for 1,
// 2, 3 and 8 threads: grouped-query heads, ragged key tiles, causal with a float mask, float32
// inputs rounded to bf16 while packed, the weights and lse outputs. Each skipped, saying so,
// on a CPU without it.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>

#include "kernels/kernel.h"
#include "qkv/attention.h"
#include "support/test_support.h"

namespace qkv {
namespace {

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         (a.nbytes() == 0 || std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
}

// The bf16 path on inputs of head dim d: the same bits for threads 1, 2, 3 and 8.
void expect_bitwise_for_threads(std::int64_t d) {
  const Tensor q = testing::random_tensor(DType::kF32, {2, 6, 300, d}, 1);
  const Tensor k = testing::random_tensor(DType::kF32, {2, 2, 333, d}, 2);
  const Tensor v = testing::random_tensor(DType::kF32, {2, 2, 333, 40}, 3);
  Tensor mask = testing::random_tensor(DType::kF32, {1, 6, 1, 333}, 4, -1.0, 1.0);
  for (std::int64_t i = 0; i < mask.numel(); i += 7) {
    mask.data_as<float>()[i] = -std::numeric_limits<float>::infinity();
  }
  AttentionOptions options;
  options.kernel = "fused_hwy";
  options.dtype = DType::kBF16;
  options.causal = true;
  options.mask = mask.view();
  options.return_weights = options.return_lse = true;
  options.threads = 1;
  const AttentionResult first = attention(q.view(), k.view(), v.view(), options);
  for (int threads : {2, 3, 8, 1, 8, 3, 2}) {
    options.threads = threads;
    const AttentionResult again = attention(q.view(), k.view(), v.view(), options);
    ASSERT_TRUE(same_bits(again.out, first.out)) << "threads " << threads;
    ASSERT_TRUE(same_bits(again.weights, first.weights)) << "threads " << threads;
    ASSERT_TRUE(same_bits(again.lse, first.lse)) << "threads " << threads;
  }
}

TEST(ThreadsBf16, Bf16PathIsBitwiseIdenticalForOneTwoThreeAndEightThreads) {
  if (!kernels::fused_bf16_dots_available()) {
    GTEST_SKIP() << "no AVX512-BF16 at full rate on this CPU (an AMX CPU takes AMX tiles, "
                    "or QKV_SIMD_MAX caps AVX-512): no vdpbf16ps path";
  }
  expect_bitwise_for_threads(72);  // not a multiple of 32: never the AMX path
}

TEST(ThreadsBf16, AmxPathIsBitwiseIdenticalForOneTwoThreeAndEightThreads) {
  if (!kernels::fused_bf16_amx_available(64)) {
    GTEST_SKIP() << "no AMX bf16 on this CPU (or QKV_BF16_AMX=0, or QKV_SIMD_MAX caps AVX-512)";
  }
  expect_bitwise_for_threads(64);
}

}  // namespace
}  // namespace qkv
