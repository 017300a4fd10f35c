// The KV cache's page pool: see page_pool.h for why pages sit on 2 MiB-aligned slabs.
#include "cache/page_pool.h"

#include <cstdlib>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace qkv::cache {
namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSlabs = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSlabs = false;
#else
constexpr bool kSlabs = true;
#endif
#else
constexpr bool kSlabs = true;
#endif

#if defined(__linux__)
// An anonymous mapping of `bytes` (a multiple of 4 KiB) starting on a 2 MiB boundary, advised
// to use huge pages; nullptr when the system refuses the mapping. The alignment comes from
// mapping 2 MiB more and unmapping what lies before and after the aligned part.
std::byte* map_aligned(std::size_t bytes) noexcept {
  const auto huge = static_cast<std::size_t>(kHugePageBytes);
  if (bytes > SIZE_MAX - huge) return nullptr;
  void* raw =
      ::mmap(nullptr, bytes + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto start = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = (start + huge - 1) / huge * huge;
  if (aligned > start) ::munmap(raw, aligned - start);
  const std::uintptr_t end = start + bytes + huge;
  if (end > aligned + bytes)
    ::munmap(reinterpret_cast<void*>(aligned + bytes), end - aligned - bytes);
#if defined(MADV_HUGEPAGE)
  ::madvise(reinterpret_cast<void*>(aligned), bytes, MADV_HUGEPAGE);  // advice only
#endif
  return reinterpret_cast<std::byte*>(aligned);
}
#endif

std::int64_t round_up(std::int64_t n, std::int64_t m) noexcept { return (n + m - 1) / m * m; }

}  // namespace

SlabPlan slab_plan(std::int64_t page_bytes) noexcept {
#if defined(__linux__)
  if (!kSlabs || page_bytes < kMinSlabPage) return {};
  if (page_bytes >= kHugePageBytes) return {1, round_up(page_bytes, 4096)};
  SlabPlan best{1, 0};
  std::int64_t least_unused = -1;
  for (std::int64_t units = 1; units <= 4; ++units) {
    const std::int64_t bytes = units * kHugePageBytes;
    const std::int64_t pages = bytes / page_bytes;
    const std::int64_t unused = bytes - pages * page_bytes;
    if (least_unused < 0 || unused * best.slab_bytes < least_unused * bytes) {
      best = {pages, bytes};
      least_unused = unused;
    }
    if (unused * 16 <= bytes) return {pages, bytes};
  }
  return best;
#else
  (void)page_bytes;
  return {};
#endif
}

PagePool::PagePool(std::int64_t page_bytes) noexcept
    : page_bytes_(page_bytes), plan_(slab_plan(page_bytes)), carved_(plan_.pages_per_slab) {}

PagePool::~PagePool() {
  for (std::byte* block : blocks_) {
#if defined(__linux__)
    if (plan_.slab_bytes > 0) {
      ::munmap(block, static_cast<std::size_t>(plan_.slab_bytes));
      continue;
    }
#endif
    std::free(block);
  }
}

std::byte* PagePool::allocate() noexcept {
  try {
    blocks_.reserve(blocks_.size() + 1);  // so that no allocation can leak below
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
#if defined(__linux__)
  if (plan_.slab_bytes > 0) {
    if (carved_ == plan_.pages_per_slab) {
      std::byte* slab = map_aligned(static_cast<std::size_t>(plan_.slab_bytes));
      if (slab == nullptr) return nullptr;
      blocks_.push_back(slab);
      carved_ = 0;
    }
    return blocks_.back() + page_bytes_ * carved_++;
  }
#endif
  auto* page =
      static_cast<std::byte*>(std::aligned_alloc(64, static_cast<std::size_t>(page_bytes_)));
  if (page != nullptr) blocks_.push_back(page);
  return page;
}

}  // namespace qkv::cache
