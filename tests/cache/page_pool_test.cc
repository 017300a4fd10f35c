// The KV cache's page pool (src/cache/page_pool.h): how pages are laid out on huge-page slabs,
// and that the pages it hands out are distinct, aligned, disjoint and writable.
#include "cache/page_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

namespace qkv::cache {
namespace {

constexpr std::int64_t kMiB = std::int64_t{1} << 20;

bool slabs_in_this_build() { return slab_plan(kMiB).slab_bytes > 0; }

TEST(SlabPlan, SmallPagesAreAllocatedOneByOne) {
  EXPECT_EQ(slab_plan(64).slab_bytes, 0);
  EXPECT_EQ(slab_plan(kMinSlabPage - 64).slab_bytes, 0);
}

TEST(SlabPlan, LargePagesGetASlabOfTheirOwn) {
  if (!slabs_in_this_build()) GTEST_SKIP() << "this build allocates pages one by one (ASan)";
  const SlabPlan two = slab_plan(2 * kMiB);
  EXPECT_EQ(two.pages_per_slab, 1);
  EXPECT_EQ(two.slab_bytes, 2 * kMiB);
  // Rounded up to whole 4 KiB pages, never to a whole 2 MiB: nothing wasted.
  const SlabPlan odd = slab_plan(2 * kMiB + 64);
  EXPECT_EQ(odd.pages_per_slab, 1);
  EXPECT_EQ(odd.slab_bytes, 2 * kMiB + 4096);
}

TEST(SlabPlan, MidSizedPagesFillWhole2MiBUnitsWithLittleLeftOver) {
  if (!slabs_in_this_build()) GTEST_SKIP() << "this build allocates pages one by one (ASan)";
  // 1 MiB: two per 2 MiB, nothing left over.
  EXPECT_EQ(slab_plan(kMiB).pages_per_slab, 2);
  EXPECT_EQ(slab_plan(kMiB).slab_bytes, 2 * kMiB);
  // 768 KiB: 2 MiB would leave 512 KiB (25 %); 4 MiB holds 5 and leaves 256 KiB (1/16).
  EXPECT_EQ(slab_plan(768 * 1024).pages_per_slab, 5);
  EXPECT_EQ(slab_plan(768 * 1024).slab_bytes, 4 * kMiB);
  for (std::int64_t page = kMinSlabPage; page < 2 * kMiB; page += 64 * 1000 + 64) {
    const SlabPlan plan = slab_plan(page);
    SCOPED_TRACE(page);
    EXPECT_EQ(plan.slab_bytes % (2 * kMiB), 0);
    EXPECT_LE(plan.slab_bytes, 8 * kMiB);
    EXPECT_GE(plan.pages_per_slab, 1);
    EXPECT_LE(plan.pages_per_slab * page, plan.slab_bytes);
    // Less than one page, and at most a quarter of the slab, left over.
    const std::int64_t unused = plan.slab_bytes - plan.pages_per_slab * page;
    EXPECT_LT(unused, page);
    EXPECT_LE(unused * 4, plan.slab_bytes);
  }
}

// Allocates `count` pages of `bytes`, writes a pattern over each whole page, and checks that
// every page is 64-byte aligned, that no two overlap and that each kept its own pattern.
void check_pages(std::int64_t bytes, int count) {
  PagePool pool(bytes);
  std::vector<std::byte*> pages;
  for (int i = 0; i < count; ++i) {
    std::byte* page = pool.allocate();
    ASSERT_NE(page, nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(page) % 64, 0u);
    std::memset(page, i + 1, static_cast<std::size_t>(bytes));
    pages.push_back(page);
  }
  for (int i = 0; i < count; ++i) {
    const auto* p = reinterpret_cast<const unsigned char*>(pages[static_cast<std::size_t>(i)]);
    EXPECT_EQ(p[0], i + 1);
    EXPECT_EQ(p[bytes - 1], i + 1);
  }
  std::sort(pages.begin(), pages.end());
  for (std::size_t i = 1; i < pages.size(); ++i) EXPECT_GE(pages[i] - pages[i - 1], bytes);
}

TEST(PagePool, PagesAreDistinctAlignedAndDisjoint) {
  check_pages(64, 100);
  check_pages(192 * 1024, 23);      // slabs of 10 pages
  check_pages(768 * 1024, 12);      // slabs of 5 (4 MiB)
  check_pages(2 * kMiB + 4160, 3);  // one slab per page
}

TEST(PagePool, LargePagesStartOnAHugePageBoundary) {
  if (!slabs_in_this_build()) GTEST_SKIP() << "this build allocates pages one by one (ASan)";
  PagePool pool(2 * kMiB);
  for (int i = 0; i < 3; ++i) {
    std::byte* page = pool.allocate();
    ASSERT_NE(page, nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(page) % (2 * kMiB), 0u);
  }
}

}  // namespace
}  // namespace qkv::cache
