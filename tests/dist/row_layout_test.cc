// The row layouts of attention across processes (qkv/dist.h): every row held by exactly one
// rank, in the documented order, for n not divisible by P, n < P and n = 0.
#include <gtest/gtest.h>

#include <vector>

#include "qkv/dist.h"
#include "qkv/error.h"

namespace qkv::dist {
namespace {

using Ranges = std::vector<std::pair<std::int64_t, std::int64_t>>;

Ranges ranges(std::int64_t n, int ranks, int rank, RowLayout layout) {
  Ranges out;
  for (const RowRange& r : rank_rows(n, ranks, rank, layout)) out.emplace_back(r.first, r.last);
  return out;
}

TEST(RowLayout, ContiguousBlocks) {
  EXPECT_EQ(ranges(10, 3, 0, RowLayout::kContiguous), (Ranges{{0, 3}}));
  EXPECT_EQ(ranges(10, 3, 1, RowLayout::kContiguous), (Ranges{{3, 6}}));
  EXPECT_EQ(ranges(10, 3, 2, RowLayout::kContiguous), (Ranges{{6, 10}}));
}

TEST(RowLayout, ZigZagPairsChunkRWithChunk2PMinus1MinusR) {
  EXPECT_EQ(ranges(16, 2, 0, RowLayout::kZigZag), (Ranges{{0, 4}, {12, 16}}));
  EXPECT_EQ(ranges(16, 2, 1, RowLayout::kZigZag), (Ranges{{4, 8}, {8, 12}}));
  EXPECT_EQ(ranges(7, 3, 0, RowLayout::kZigZag), (Ranges{{0, 1}, {5, 7}}));
}

TEST(RowLayout, EveryRowExactlyOnce) {
  for (const RowLayout layout : {RowLayout::kContiguous, RowLayout::kZigZag}) {
    for (int ranks = 1; ranks <= 9; ++ranks) {
      for (std::int64_t n = 0; n <= 40; ++n) {
        std::vector<int> seen(static_cast<std::size_t>(n), 0);
        std::int64_t total = 0, most = 0, least = n;
        for (int rank = 0; rank < ranks; ++rank) {
          std::int64_t previous = -1;
          for (const RowRange& r : rank_rows(n, ranks, rank, layout)) {
            ASSERT_GT(r.size(), 0);
            ASSERT_GT(r.first, previous) << "ranges in increasing order";
            previous = r.first;
            for (std::int64_t i = r.first; i < r.last; ++i) ++seen[static_cast<std::size_t>(i)];
          }
          const std::int64_t count = rank_row_count(n, ranks, rank, layout);
          total += count;
          most = std::max(most, count);
          least = std::min(least, count);
        }
        EXPECT_EQ(total, n);
        for (const int s : seen) ASSERT_EQ(s, 1) << "n " << n << " ranks " << ranks;
        // Balanced: counts differ by at most one row per range a rank holds.
        EXPECT_LE(most - least, layout == RowLayout::kZigZag ? 2 : 1);
      }
    }
  }
}

TEST(RowLayout, NBelowRanksLeavesSomeRanksEmpty) {
  EXPECT_TRUE(rank_rows(2, 4, 0, RowLayout::kContiguous).empty());
  EXPECT_EQ(ranges(2, 4, 1, RowLayout::kContiguous), (Ranges{{0, 1}}));
  EXPECT_TRUE(rank_rows(0, 3, 2, RowLayout::kZigZag).empty());
}

TEST(RowLayout, RefusesBadArguments) {
  EXPECT_THROW(rank_rows(-1, 2, 0, RowLayout::kContiguous), Error);
  EXPECT_THROW(rank_rows(4, 0, 0, RowLayout::kContiguous), Error);
  EXPECT_THROW(rank_rows(4, 2, 2, RowLayout::kZigZag), Error);
}

TEST(RowLayout, DefaultIsZigZagUnderCausalOrWindow) {
  AttentionOptions options;
  EXPECT_EQ(default_layout(options), RowLayout::kContiguous);
  options.causal = true;
  EXPECT_EQ(default_layout(options), RowLayout::kZigZag);
  options.causal = false;
  options.window = Window{4, 0};
  EXPECT_EQ(default_layout(options), RowLayout::kZigZag);
}

TEST(RowLayout, SliceRowsTakesTheRanksRowsInOrder) {
  Tensor full(DType::kF32, {2, 6, 1}, "x");
  for (std::int64_t i = 0; i < full.numel(); ++i) full.data_as<float>()[i] = static_cast<float>(i);
  const Tensor part = slice_rows(full.view(), -2, 2, 1, RowLayout::kZigZag);  // rows 1, 2 of 0..5
  ASSERT_EQ(part.shape(), (Shape{2, 3, 1}));
  // n = 6 in 4 chunks: [0,1) [1,3) [3,4) [4,6); rank 1 holds chunks 1 and 2: rows 1, 2, 3.
  const std::vector<float> want = {1, 2, 3, 7, 8, 9};
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_EQ(part.data_as<float>()[i], want[i]);
}

TEST(RowLayout, MpiAvailabilityMatchesTheBuild) {
  if (!mpi_available()) {
    EXPECT_THROW(Communicator::world(), Error);
  }
}

}  // namespace
}  // namespace qkv::dist
