// Where a KV cache page keeps its rows: the one description shared by the cache (which writes
// pages) and the decode kernels (which read them in place).
//
// A page holds page_rows rows of every kv head:
//   K of head 0, K of head 1, ..., V of head 0, ..., [int8: K scales of head 0, ..., V scales]
// each block 64-byte aligned. Within a head's block, row r starts at r · row_elements (d or dv)
// elements of the storage type, so a head's rows in one page are one contiguous run. An int8
// row of d values is ceil(d / 32) blocks, block c scaled by scales[r · blocks + c].
#pragma once

#include <cstddef>
#include <cstdint>

#include "qkv/kv_cache.h"

namespace qkv::cache {

inline std::int64_t round_up_64(std::int64_t bytes) noexcept { return (bytes + 63) / 64 * 64; }

inline std::int64_t storage_bytes(CacheStorage storage) noexcept {
  switch (storage) {
    case CacheStorage::kF32: return 4;
    case CacheStorage::kBF16:
    case CacheStorage::kF16: return 2;
    case CacheStorage::kInt8: return 1;
  }
  return 4;
}

struct PageLayout {
  CacheStorage storage = CacheStorage::kF32;
  std::int64_t hkv = 1, d = 0, dv = 0, page_rows = 256;

  std::int64_t k_blocks() const noexcept { return (d + kCacheInt8Block - 1) / kCacheInt8Block; }
  std::int64_t v_blocks() const noexcept { return (dv + kCacheInt8Block - 1) / kCacheInt8Block; }
  bool quantised() const noexcept { return storage == CacheStorage::kInt8; }

  std::int64_t k_head_bytes() const noexcept {
    return round_up_64(page_rows * d * storage_bytes(storage));
  }
  std::int64_t v_head_bytes() const noexcept {
    return round_up_64(page_rows * dv * storage_bytes(storage));
  }
  std::int64_t k_scale_head_bytes() const noexcept {
    return quantised() ? round_up_64(page_rows * k_blocks() * 4) : 0;
  }
  std::int64_t v_scale_head_bytes() const noexcept {
    return quantised() ? round_up_64(page_rows * v_blocks() * 4) : 0;
  }

  // Byte offsets inside a page of kv head hk's blocks.
  std::int64_t k_offset(std::int64_t hk) const noexcept { return hk * k_head_bytes(); }
  std::int64_t v_offset(std::int64_t hk) const noexcept {
    return hkv * k_head_bytes() + hk * v_head_bytes();
  }
  std::int64_t k_scale_offset(std::int64_t hk) const noexcept {
    return hkv * (k_head_bytes() + v_head_bytes()) + hk * k_scale_head_bytes();
  }
  std::int64_t v_scale_offset(std::int64_t hk) const noexcept {
    return hkv * (k_head_bytes() + v_head_bytes() + k_scale_head_bytes()) +
           hk * v_scale_head_bytes();
  }
  // At least 64 bytes, so that an empty-headed page still has an address of its own.
  std::int64_t page_bytes() const noexcept {
    const std::int64_t total =
        hkv * (k_head_bytes() + v_head_bytes() + k_scale_head_bytes() + v_scale_head_bytes());
    return total > 64 ? total : 64;
  }
};

// What a kernel reads of one sequence, taken under the cache's lock: its pages in order and the
// rows they hold. pages[0] holds absolute rows first_page_row .. first_page_row + page_rows - 1;
// rows [first_row, length) are stored (first_row >= first_page_row).
struct SequenceSnapshot {
  const std::byte* const* pages = nullptr;
  std::int64_t page_count = 0;
  std::int64_t first_page_row = 0;
  std::int64_t first_row = 0;
  std::int64_t length = 0;
};

}  // namespace qkv::cache
