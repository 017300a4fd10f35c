// The fused kernels give bitwise identical output, weights and lse for any thread count: tasks
// own disjoint output tiles and no sum crosses a task.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "kernel_cases.h"
#include "core/parallel_for.h"
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
    SCOPED_TRACE(causal ? "causal" : "not causal");
    KernelCase c = thread_sweep_case(causal);
    c.mask = MaskKind::kFloatFull;
    const CaseInputs in = make_inputs(c, 99);
    AttentionOptions options = in.options(c);
    options.kernel = kernel;
    options.return_weights = true;
    options.return_lse = true;
    expect_same_bits_for_threads(in, options, {2, 3, 8});
  }
}

// threads = 0 gives a call too small to share one thread (core::kMultiplyAddsPerThread) and a
// large one a thread per core, says so in the result, and the bits do not change.
TEST(AutomaticThreads, SmallCallsRunOnOneThreadLargeOnesOnEveryCore) {
  KernelCase c;
  c.h = 2;
  c.nq = c.nk = 16;
  c.d = c.dv = 32;
  const CaseInputs small = make_inputs(c, 5);
  AttentionOptions options = small.options(c);
  options.threads = 0;
  const AttentionResult automatic = attention(small.q, small.k, small.v, options);
  EXPECT_EQ(automatic.threads, 1);
  options.threads = 2;
  const AttentionResult two = attention(small.q, small.k, small.v, options);
  EXPECT_EQ(two.threads, 2);
  EXPECT_TRUE(bitwise_equal(automatic.out, two.out));

  c.h = 8;
  c.nq = c.nk = 256;  // 8·256·256·64 = 2^25 multiply-adds: 8 threads' worth
  const CaseInputs large = make_inputs(c, 6);
  options = large.options(c);
  options.threads = 0;
  EXPECT_EQ(attention(large.q, large.k, large.v, options).threads,
            std::min(8, core::resolve_thread_count(0)));
}

INSTANTIATE_TEST_SUITE_P(Fused, Determinism, ::testing::Values("fused_hwy", "fused_scalar"));

}  // namespace
}  // namespace qkv::testing
