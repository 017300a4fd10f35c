#include "core/parallel_for.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <vector>

namespace qkv::core {
namespace {

TEST(ParallelFor, CoversEveryTaskExactlyOnceForAnyThreadCount) {
  for (int threads : {1, 2, 3, 8, 100}) {
    for (std::int64_t count : {0, 1, 2, 7, 64}) {
      std::vector<int> hits(static_cast<std::size_t>(count), 0);
      parallel_for(count, threads, [&](std::int64_t begin, std::int64_t end) {
        for (std::int64_t i = begin; i < end; ++i) ++hits[static_cast<std::size_t>(i)];
      });
      for (int h : hits) EXPECT_EQ(h, 1) << "threads " << threads << " count " << count;
    }
  }
}

TEST(ParallelFor, ResolvesZeroToTheHardware) {
  EXPECT_EQ(resolve_thread_count(3), 3);
  EXPECT_GE(resolve_thread_count(0), 1);
}

TEST(ParallelFor, LeavesSmallAutomaticCallsOnOneThread) {
  const int hardware = resolve_thread_count(0);
  const double per_thread = kMultiplyAddsPerThread;
  // An explicit count is honoured whatever the work.
  EXPECT_EQ(threads_for_work(3, 1.0), 3);
  EXPECT_EQ(threads_for_work(8, 0.0), 8);
  // Automatic: one thread per kMultiplyAddsPerThread, at least one, at most the hardware's.
  EXPECT_EQ(threads_for_work(0, 0.0), 1);
  EXPECT_EQ(threads_for_work(0, per_thread - 1.0), 1);
  EXPECT_EQ(threads_for_work(0, 2.5 * per_thread), std::min(2, hardware));
  EXPECT_EQ(threads_for_work(0, 1e15), hardware);
  EXPECT_EQ(threads_for_work(0, std::numeric_limits<double>::infinity()), hardware);
}

}  // namespace
}  // namespace qkv::core
