// AttentionOptions::progress is called from the kernels' worker threads: under ThreadSanitizer
// (`make test-tsan`) the reports must be race-free in every kernel, and the count still ends at
// B·H·Nq on 2 and 8 threads (B·Hkv·Nk key rows for every backward kernel).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "qkv/attention.h"
#include "qkv/attention_backward.h"
#include "qkv/error.h"
#include "support/test_support.h"

namespace qkv {
namespace {

TEST(ProgressThreads, ReportsFromWorkerThreadsAreRaceFreeInEveryKernel) {
  struct Shapes {
    Shape q, k;
  };
  // A prefill shape and a decode shape (one query row per head), so that every kernel runs.
  for (const Shapes& s : {Shapes{{2, 2, 200, 16}, {2, 2, 200, 16}},
                          Shapes{{2, 4, 1, 16}, {2, 1, 300, 16}}}) {
    const Tensor q = testing::random_tensor(DType::kF32, s.q, 7);
    const Tensor k = testing::random_tensor(DType::kF32, s.k, 8);
    const Tensor v = testing::random_tensor(DType::kF32, s.k, 9);
    const std::int64_t total = s.q[0] * s.q[1] * s.q[2];
    for (const std::string& kernel : attention_kernel_names()) {
      for (const int threads : {2, 8}) {
        std::atomic<std::int64_t> largest{0};
        AttentionOptions options;
        options.kernel = kernel;
        options.threads = threads;
        options.causal = true;
        options.progress = [&largest](std::int64_t done, std::int64_t) {
          std::int64_t seen = largest.load();
          while (done > seen && !largest.compare_exchange_weak(seen, done)) {
          }
        };
        try {
          attention(q.view(), k.view(), v.view(), options);
        } catch (const Error&) {
          continue;  // the kernel declines this shape
        }
        EXPECT_EQ(largest.load(), total) << kernel << ", " << threads << " threads";
      }
    }
  }
}

TEST(ProgressThreads, BackwardReportsAreRaceFreeInEveryKernel) {
  const Tensor q = testing::random_tensor(DType::kF32, {2, 4, 150, 16}, 7);
  const Tensor k = testing::random_tensor(DType::kF32, {2, 2, 170, 16}, 8);
  const Tensor v = testing::random_tensor(DType::kF32, {2, 2, 170, 16}, 9);
  AttentionOptions options;
  options.causal = true;
  options.return_lse = true;
  const AttentionResult forward = attention(q.view(), k.view(), v.view(), options);
  const Tensor grad_out = testing::random_tensor(DType::kF32, forward.out.shape(), 10);
  for (const std::string& kernel : attention_backward_kernel_names()) {
    for (const int threads : {2, 8}) {
      std::atomic<std::int64_t> largest{0};
      options.kernel = kernel;
      options.threads = threads;
      options.progress = [&largest](std::int64_t done, std::int64_t) {
        std::int64_t seen = largest.load();
        while (done > seen && !largest.compare_exchange_weak(seen, done)) {
        }
      };
      attention_backward(q.view(), k.view(), v.view(), forward.out.view(), forward.lse.view(),
                         grad_out.view(), options);
      EXPECT_EQ(largest.load(), 2 * 2 * 170) << kernel << ", " << threads << " threads";
    }
  }
}

}  // namespace
}  // namespace qkv
