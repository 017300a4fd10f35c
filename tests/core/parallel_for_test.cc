#include "core/parallel_for.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace qkv::core
