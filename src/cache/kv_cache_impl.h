// The inside of qkv::KVCache, for the cache's own code and the decode kernels (which read pages
// in place through snapshot()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "cache/page_layout.h"
#include "cache/page_pool.h"
#include "qkv/kv_cache.h"

namespace qkv {

struct KVCache::Impl {
  KVCacheOptions options;
  cache::PageLayout layout;

  // The sequence's pages and rows as they are now. Throws qkv::Error (subject "sequence N")
  // when the cache has no such sequence. The snapshot stays valid until that sequence is next
  // changed (append, forget_before, remove).
  cache::SequenceSnapshot snapshot(SequenceId sequence) const;

  // max_abs_k and max_abs_v (below), read under the lock.
  void magnitudes(double& k, double& v) const;

  // One sequence. Absolute row p lives in pages[(p - first_page_row) / page_rows] at row
  // p % page_rows; first_page_row is a multiple of page_rows, and pages.size() is
  // ceil((length - first_page_row) / page_rows). Rows [first_row, length) are stored.
  // Held through a unique_ptr so that it never moves: a snapshot points into `pages`.
  struct Sequence {
    std::vector<std::byte*> pages;
    std::int64_t first_page_row = 0;
    std::int64_t first_row = 0;
    std::int64_t length = 0;
  };

  // The lock guards the pool and the sequence map, and is held only for bookkeeping: rows are
  // written outside it, into pages that the appending sequence alone holds, and the kernels
  // read a snapshot's pages outside it.
  mutable std::mutex mutex;
  std::map<SequenceId, std::unique_ptr<Sequence>> sequences;
  // Where new pages come from (huge-page slabs for large pages); it owns their memory.
  cache::PagePool pool;
  // Every page allocated, with the number of sequences holding it (0: on the free list).
  std::unordered_map<const std::byte*, std::int64_t> refs;
  // Freed pages, reused before any new allocation. Its capacity is kept >= refs.size(), so that
  // returning a page never allocates (and never throws).
  std::vector<std::byte*> free_pages;
  std::int64_t pages_in_use = 0;  // pages with refs > 0
  // The largest |value| ever held in K's and in V's pages (as stored: after 16-bit rounding or
  // int8's q · scale; never lowered): the float32 range checks of attention_cached bound the
  // decode kernels' scores and sums with them.
  double max_abs_k = 0.0, max_abs_v = 0.0;
  SequenceId next_id = 0;

  Impl(const KVCacheOptions& cache_options, const cache::PageLayout& page_layout);
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  // The rest need the lock held.
  Sequence& find(SequenceId sequence) const;    // throws "sequence N: not in this cache"
  std::byte* take_page();                       // refs 0, not yet in use; throws on no memory
  void hold_page(std::byte* page) noexcept;     // refs + 1
  void release_page(std::byte* page) noexcept;  // refs - 1; to the free list at 0
};

}  // namespace qkv
