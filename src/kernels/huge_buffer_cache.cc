// The fused kernel's packed K^T/V slots (and the bf16 backward's packed operands,
// bwd_bf16-inl.h, and its float32 gradient sums, attention_backward.cc) outlive their call in
// a small cache, so that the next call of the same shape packs into memory already mapped.
// Freed, a slot of several MiB goes back to the system (glibc serves it with mmap), and the
// next call's first touch of each page is a page fault the kernel must zero: with many small
// calls of one shape (a transformers model's layers, batch 32 by 128 rows) that was 5-7 % of
// the time.
//
// At most kSlots blocks are kept (a forward takes one slot, or two alternating slots when all
// heads do not fit the pack budget; a bf16 backward two: three slots keep a training step's
// forward and backward), each at most the budget's size (larger ones go back to the system):
// the cache holds some tens of MiB (at most ~110), from the first call that packs that much
// until the process ends. A block a call gives back replaces the smallest cached one when it
// is larger.
#include <array>
#include <cstdlib>
#include <mutex>

#include <sys/mman.h>

#include "kernels/fused_common.h"

namespace qkv::kernels::fused {
namespace {

constexpr std::size_t kSlots = 3;

struct Block {
  void* p = nullptr;
  std::size_t bytes = 0;
};

std::mutex cache_mutex;
std::array<Block, kSlots> cache;

}  // namespace

void* take_huge_buffer(std::size_t& bytes) noexcept {
  {
    std::lock_guard<std::mutex> lock(cache_mutex);
    // The smallest cached block that is large enough, so a large one stays for a large call.
    Block* best = nullptr;
    for (Block& b : cache) {
      if (b.p != nullptr && b.bytes >= bytes && (best == nullptr || b.bytes < best->bytes)) {
        best = &b;
      }
    }
    if (best != nullptr) {
      void* p = best->p;
      bytes = best->bytes;
      *best = Block{};
      return p;
    }
  }
  void* p = std::aligned_alloc(kHugePage, bytes);
  if (p != nullptr) madvise(p, bytes, MADV_HUGEPAGE);  // advice only: errors are harmless
  return p;
}

void give_back_huge_buffer(void* p, std::size_t bytes) noexcept {
  if (p == nullptr) return;
  // The pack budget's slot (and its rounding to huge pages) at most: a larger block, from a
  // call packing one head of a very long sequence at a time, goes back to the system.
  constexpr std::size_t kLargest =
      static_cast<std::size_t>(kPackBudgetFloats) * 4 + 2 * kHugePage;
  if (bytes <= kLargest) {
    std::lock_guard<std::mutex> lock(cache_mutex);
    Block* slot = nullptr;  // an empty slot, else the smallest block
    for (Block& b : cache) {
      if (b.p == nullptr) {
        slot = &b;
        break;
      }
      if (slot == nullptr || b.bytes < slot->bytes) slot = &b;
    }
    if (slot->p == nullptr || slot->bytes < bytes) {
      void* evicted = slot->p;
      *slot = Block{p, bytes};
      p = evicted;
    }
  }
  std::free(p);
}

}  // namespace qkv::kernels::fused
