// qkv::KVCache and qkv::attention_cached: decoding against the keys and values of earlier
// tokens, kept in pages.
//
// A cache holds many sequences (beams, requests). Each sequence's rows live in pages of
// page_rows rows; a page holds those rows for every kv head (K then V, each head's rows
// contiguous), and a sequence's block table lists its pages in order. Appending writes into the
// last page and takes new pages from the pool: stored pages never move. fork() gives a new
// sequence that shares every page of its parent; a shared page is copied only when one of them
// appends into it (copy on write). Pages are stored as float32, bfloat16, float16 or int8 (blocks
// of 32 values of one row with one float scale each: value = q · scale, q in [-127, 127]).
//
// Thread safety: calls on distinct sequences may run concurrently (including attention_cached
// reading some sequences while others are appended to); calls on one sequence may not.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "qkv/attention.h"
#include "qkv/tensor.h"

namespace qkv {

enum class CacheStorage : std::uint8_t { kF32, kBF16, kF16, kInt8 };

const char* cache_storage_name(CacheStorage storage) noexcept;  // "f32", "bf16", "f16", "int8"
// "f32", "bf16", "f16" or "int8"; anything else throws qkv::Error with `subject`.
CacheStorage parse_cache_storage(const std::string& text, const std::string& subject);
// Values per int8 block (one float scale each).
inline constexpr std::int64_t kCacheInt8Block = 32;

struct KVCacheOptions {
  std::int64_t kv_heads = 1;  // Hkv
  std::int64_t d = 0;         // key head dimension
  std::int64_t dv = 0;        // value head dimension
  CacheStorage storage = CacheStorage::kF32;
  std::int64_t page_rows = 256;
  // Capacity, set up front: at most this many pages, and at most this many bytes of pages;
  // 0 leaves that bound off. An append that would pass either throws and changes nothing.
  // Pages of 64 KiB or more are carved from slabs on 2 MiB huge pages (decoding streams them
  // faster), so the memory held can pass the pages in use by the unused rest of the last
  // slab, under 8 MiB.
  std::int64_t max_pages = 0;
  std::uint64_t max_bytes = 0;
};

using SequenceId = std::int64_t;

class KVCache {
 public:
  // Throws qkv::Error (subject "KVCache") on a non-positive kv_heads or page_rows, or a
  // negative d or dv.
  explicit KVCache(const KVCacheOptions& options);
  ~KVCache();
  KVCache(KVCache&&) noexcept;
  KVCache& operator=(KVCache&&) noexcept;
  KVCache(const KVCache&) = delete;
  KVCache& operator=(const KVCache&) = delete;

  const KVCacheOptions& options() const noexcept;

  // A new, empty sequence.
  SequenceId add_sequence();
  // A new sequence with the same rows as `parent`, sharing its pages copy-on-write.
  SequenceId fork(SequenceId parent);
  // Frees the sequence's pages (those no other sequence shares).
  void remove(SequenceId sequence);
  bool contains(SequenceId sequence) const;
  std::vector<SequenceId> sequences() const;  // ascending

  // Appends n rows: k is [Hkv, n, D] and v [Hkv, n, Dv] (or [n, D] and [n, Dv] when Hkv = 1),
  // float32, float64, bfloat16 or float16, any strides, every element finite once rounded to
  // float32 (and within float16's range for an f16 cache). Throws qkv::Error naming k, v, the
  // sequence or "KVCache capacity", and then leaves the cache exactly as it was.
  void append(SequenceId sequence, const TensorView& k, const TensorView& v);
  // Frees the pages that hold only rows before `row` (a sliding window keeps only the window's
  // pages); attention_cached refuses a call that would attend a freed row.
  void forget_before(SequenceId sequence, std::int64_t row);

  std::int64_t length(SequenceId sequence) const;     // rows appended so far
  std::int64_t first_stored_row(SequenceId sequence) const;  // rows before it were forgotten

  std::int64_t pages_in_use() const;
  std::int64_t page_bytes() const noexcept;  // the memory of one page
  std::uint64_t bytes_in_use() const;        // pages_in_use() · page_bytes()

  // The stored rows [first_stored_row, length) of K (values = false) or V, dequantised exactly
  // into float64 (or rounded to float32): [Hkv, rows, D or Dv]. The reference's view.
  Tensor gather(SequenceId sequence, bool values, DType dtype = DType::kF64) const;

  struct Impl;
  // For the kernels (src/cache/kv_cache_impl.h); not part of the stable API.
  const Impl& impl() const noexcept { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// Attention of a block of new queries per sequence against that sequence's cached rows:
// q is [S, H, Nq, D] (S = sequences.size(); [H, Nq, D] when S = 1), H a multiple of the cache's
// Hkv. Query i of sequence s sits at position length(s) - Nq + i, so with options.causal it
// attends keys 0 .. length(s) - Nq + i (bottom-right, as in attention()); the rows of the new
// queries are expected to have been appended already. The result equals attention(q_s, K_s,
// V_s, options) on the gathered, dequantised cache of each sequence. Options: scale, causal,
// window, return_lse, out_dtype, threads, kernel ("decode_hwy", "decode_scalar" or
// "reference"), max_memory. An explicit mask and return_weights are refused (their key
// dimension differs between sequences). Throws qkv::Error on an unknown sequence, a head layout
// that does not match the cache, or a window that would reach a forgotten row.
AttentionResult attention_cached(const TensorView& q, const KVCache& cache,
                                 std::span<const SequenceId> sequences,
                                 const AttentionOptions& options = {});

}  // namespace qkv
