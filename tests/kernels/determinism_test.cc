// The fused kernels give bitwise identical output, weights and lse for any thread count: tasks
// own disjoint output tiles and no sum crosses a task.
#include <gtest/gtest.h>

#include <string>

#include "kernel_cases.h"
#include "kernels/kernel.h"

namespace qkv::testing {
namespace {

class Determinism : public ::testing::TestWithParam<std::string> {};

TEST_P(Determinism, BitwiseIdenticalForThreads1238) {
  const std::string kernel = GetParam();
  const auto names = attention_kernel_names();
  if (std::find(names.begin(), names.end(), kernel) == names.end()) {
    GTEST_SKIP() << kernel << " is not compiled in this build";
  }
  for (bool causal : {false, true}) {
    KernelCase c;
    c.b = 2;
    c.h = 4;
    c.hkv = 2;
    c.nq = 200;
    c.nk = 300;
    c.d = 72;
    c.dv = 40;
    c.causal = causal;
    c.mask = MaskKind::kFloatFull;
    const CaseInputs in = make_inputs(c, 99);
    AttentionOptions options = in.options(c);
    options.kernel = kernel;
    options.return_weights = true;
    options.return_lse = true;
    options.threads = 1;
    const AttentionResult one = attention(in.q, in.k, in.v, options);
    for (int threads : {2, 3, 8}) {
      SCOPED_TRACE("threads " + std::to_string(threads) + (causal ? " causal" : ""));
      options.threads = threads;
      const AttentionResult many = attention(in.q, in.k, in.v, options);
      EXPECT_TRUE(bitwise_equal(one.out, many.out));
      EXPECT_TRUE(bitwise_equal(one.weights, many.weights));
      EXPECT_TRUE(bitwise_equal(one.lse, many.lse));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fused, Determinism, ::testing::Values("fused_hwy", "fused_scalar"));

}  // namespace
}  // namespace qkv::testing
