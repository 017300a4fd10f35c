// The bf16 path of fused_hwy (vdpbf16ps) gives bitwise identical results for 1, 2, 3 and 8
// threads: grouped-query heads, ragged key tiles, causal with a float mask, float32 inputs
// rounded to bf16 while packed, the weights and lse outputs. Skipped, saying so, on a CPU
// without AVX512-BF16.
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

TEST(ThreadsBf16, Bf16PathIsBitwiseIdenticalForOneTwoThreeAndEightThreads) {
  if (!kernels::fused_bf16_dots_available()) {
    GTEST_SKIP() << "no AVX512-BF16 on this CPU (or QKV_SIMD_MAX caps AVX-512): no bf16 path";
  }
  const Tensor q = testing::random_tensor(DType::kF32, {2, 6, 300, 72}, 1);
  const Tensor k = testing::random_tensor(DType::kF32, {2, 2, 333, 72}, 2);
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

}  // namespace
}  // namespace qkv
