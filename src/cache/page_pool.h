// Where a KV cache's pages come from: memory the decode kernels can stream at the memory's speed.
//
// A decode step reads every page of a sequence once, front to back. On 4 KiB pages that stream
// crosses a page boundary every 4 KiB: a TLB miss each time, and the hardware prefetchers
// restart at each boundary. The plain-tensor path already ran on transparent huge pages
// (core/tensor.cc) and read the same bytes faster than the cache did. Measured on an AMD Zen 5
// (decode, f32 cache, d = 128, nk = 32768, 2 threads): 6.2-6.6 ms on 4 KiB pages against
// 5.2-5.4 ms on 2 MiB ones (docs/performance.md).
//
// So pages of 64 KiB or more are carved from slabs: anonymous mappings aligned to 2 MiB, given
// the MADV_HUGEPAGE advice (the system may refuse it; the pages then stay small and nothing
// else changes), each holding as many pages as fit a small number of 2 MiB huge pages with
// little left over (slab_plan). A page of 2 MiB or more gets a slab of its own, exactly its
// size. Slabs are never returned before the pool is destroyed (the cache reuses freed pages
// through its free list), so the memory held stays within the largest number of pages ever in
// use plus the unused rest of the last slab (under 8 MiB).
//
// Smaller pages, and every page under AddressSanitizer (whose checks need one heap block per
// page, to catch a read past a page's end), come from std::aligned_alloc one by one, as before.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace qkv::cache {

// How pages of page_bytes are laid out in slabs: pages_per_slab pages in slab_bytes.
struct SlabPlan {
  std::int64_t pages_per_slab = 1;
  std::int64_t slab_bytes = 0;  // 0: no slabs, one aligned_alloc per page
};

// The slab layout for pages of `page_bytes` (a multiple of 64): none below kMinSlabPage;
// pages of 2 MiB or more one per slab of their own size; else the fewest 2 MiB units (at most
// 4) that leave at most 1/16 of the slab unused, or the least unused of those four.
SlabPlan slab_plan(std::int64_t page_bytes) noexcept;

inline constexpr std::int64_t kHugePageBytes = std::int64_t{2} << 20;
inline constexpr std::int64_t kMinSlabPage = std::int64_t{64} << 10;

class PagePool {
 public:
  explicit PagePool(std::int64_t page_bytes) noexcept;
  ~PagePool();  // unmaps every slab (or frees every page)
  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;

  // A new page of page_bytes, 64-byte aligned, its contents unspecified; nullptr when the
  // system has no memory for it. Each address is returned once over the pool's life.
  std::byte* allocate() noexcept;

 private:
  std::int64_t page_bytes_;
  SlabPlan plan_;
  std::vector<std::byte*> blocks_;  // the slabs, or the pages themselves without slabs
  std::int64_t carved_ = 0;         // pages handed out of the last slab
};

}  // namespace qkv::cache
