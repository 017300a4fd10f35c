// qkv::KVCache: pages, block tables, copy-on-write forks.
//
// The pool: pages of layout.page_bytes() bytes from a cache::PagePool (64-byte aligned, large
// ones on huge-page slabs: see page_pool.h), taken lazily, reference counted by the sequences
// that hold them, and reused through a free list (a freed page is kept for the next append, so
// the memory held never passes the largest number of pages ever in use, which the capacity
// bounds, plus the rest of the pool's last slab). A sequence is a block table: fork()
// copies the table and counts each page once more; an append into a page that another sequence
// also holds copies it first (only the last page can be partly filled, so only it is ever
// copied). The lock covers this bookkeeping; rows are converted and written outside it, into
// pages the appending sequence alone holds.
//
// append() gives the strong guarantee: it checks its inputs, the sequence and the capacity,
// then takes every page it needs (handing them back on failure), then commits the bookkeeping
// with operations that cannot throw, then writes the rows, which cannot fail.
#include "qkv/kv_cache.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <vector>

#include "cache/append_rows.h"
#include "cache/kv_cache_impl.h"
#include "cache/quantise.h"
#include "core/format_bytes.h"
#include "core/out_of_memory.h"
#include "qkv/error.h"

namespace qkv {

const char* cache_storage_name(CacheStorage storage) noexcept {
  switch (storage) {
    case CacheStorage::kF32:
      return "f32";
    case CacheStorage::kBF16:
      return "bf16";
    case CacheStorage::kF16:
      return "f16";
    case CacheStorage::kInt8:
      return "int8";
  }
  return "?";
}

CacheStorage parse_cache_storage(const std::string& text, const std::string& subject) {
  for (CacheStorage storage :
       {CacheStorage::kF32, CacheStorage::kBF16, CacheStorage::kF16, CacheStorage::kInt8}) {
    if (text == cache_storage_name(storage)) return storage;
  }
  throw Error(subject, "must be f32, bf16, f16 or int8, got '" + text + "'");
}

namespace {

using Sequence = KVCache::Impl::Sequence;

std::string str(std::int64_t n) { return std::to_string(n); }

std::string sequence_subject(SequenceId sequence) { return "sequence " + str(sequence); }

// a · b + c for non-negative operands, or -1 when it passes int64.
std::int64_t checked_mul_add(std::int64_t a, std::int64_t b, std::int64_t c) {
  std::int64_t product = 0;
  std::int64_t sum = 0;
  if (__builtin_mul_overflow(a, b, &product) || __builtin_add_overflow(product, c, &sum)) {
    return -1;
  }
  return sum;
}

// page_layout.h's page_bytes(), computed with overflow checks: -1 when a page would pass
// int64 (PageLayout itself computes unchecked, and may once the constructor has accepted it).
std::int64_t checked_page_bytes(const cache::PageLayout& layout) {
  const std::int64_t size = cache::storage_bytes(layout.storage);
  auto head = [&](std::int64_t width, std::int64_t element_bytes) -> std::int64_t {
    const std::int64_t row = checked_mul_add(width, element_bytes, 0);
    if (row < 0) return -1;
    const std::int64_t bytes = checked_mul_add(layout.page_rows, row, 63);
    return bytes < 0 ? -1 : bytes / 64 * 64;
  };
  const std::int64_t parts[] = {head(layout.d, size), head(layout.dv, size),
                                layout.quantised() ? head(layout.k_blocks(), 4) : 0,
                                layout.quantised() ? head(layout.v_blocks(), 4) : 0};
  std::int64_t per_head = 0;
  for (std::int64_t part : parts) {
    if (part < 0 || checked_mul_add(1, per_head, part) < 0) return -1;
    per_head += part;
  }
  return checked_mul_add(layout.hkv, per_head, 0);
}

cache::PageLayout make_layout(const KVCacheOptions& options) {
  auto require = [](bool ok, const std::string& problem) {
    if (!ok) throw Error("KVCache", problem);
  };
  require(options.kv_heads >= 1, "kv_heads must be at least 1, got " + str(options.kv_heads));
  require(options.page_rows >= 1, "page_rows must be at least 1, got " + str(options.page_rows));
  require(options.d >= 0, "d must not be negative, got " + str(options.d));
  require(options.dv >= 0, "dv must not be negative, got " + str(options.dv));
  require(options.max_pages >= 0, "max_pages must not be negative, got " + str(options.max_pages));
  const int storage = static_cast<int>(options.storage);
  require(storage >= 0 && storage <= static_cast<int>(CacheStorage::kInt8),
          "unknown storage " + str(storage));
  cache::PageLayout layout;
  layout.storage = options.storage;
  layout.hkv = options.kv_heads;
  layout.d = options.d;
  layout.dv = options.dv;
  layout.page_rows = options.page_rows;
  // A page is one allocation: keep it well inside what size_t, aligned_alloc and the byte
  // offsets of page_layout.h can hold.
  constexpr std::int64_t kMaxPageBytes = std::int64_t{1} << 48;
  const std::int64_t bytes = checked_page_bytes(layout);
  require(bytes >= 0 && bytes <= kMaxPageBytes,
          "a page of " + str(options.page_rows) + " rows of " + str(options.kv_heads) +
              " kv heads with d = " + str(options.d) + ", dv = " + str(options.dv) +
              " would pass 2^48 bytes; lower page_rows");
  return layout;
}

// "3 pages (12 KiB)"
std::string pages_text(std::int64_t pages, std::int64_t page_bytes) {
  std::uint64_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<std::uint64_t>(pages),
                             static_cast<std::uint64_t>(page_bytes), &bytes)) {
    bytes = std::numeric_limits<std::uint64_t>::max();
  }
  return str(pages) + (pages == 1 ? " page (" : " pages (") +
         (bytes == std::numeric_limits<std::uint64_t>::max() ? std::string("over 2^64 bytes")
                                                             : core::format_bytes(bytes)) +
         ")";
}

}  // namespace

// --- Impl -------------------------------------------------------------------------------------

KVCache::Impl::Impl(const KVCacheOptions& cache_options, const cache::PageLayout& page_layout)
    : options(cache_options), layout(page_layout), pool(page_layout.page_bytes()) {}

KVCache::Impl::Sequence& KVCache::Impl::find(SequenceId sequence) const {
  const auto it = sequences.find(sequence);
  if (it == sequences.end()) throw Error(sequence_subject(sequence), "not in this cache");
  return *it->second;
}

std::byte* KVCache::Impl::take_page() {
  if (!free_pages.empty()) {
    std::byte* page = free_pages.back();
    free_pages.pop_back();
    return page;
  }
  const auto bytes = static_cast<std::uint64_t>(layout.page_bytes());
  auto out_of_memory = [&] {
    return core::OutOfMemory("KVCache", "a page of " + core::format_bytes_exact(bytes), bytes);
  };
  try {
    free_pages.reserve(refs.size() + 1);
  } catch (const std::bad_alloc&) {
    throw out_of_memory();
  }
  std::byte* page = pool.allocate();
  if (page == nullptr) throw out_of_memory();
  try {
    refs.emplace(page, 0);
  } catch (const std::bad_alloc&) {
    // The page stays the pool's (freed with it); its address is never handed out again.
    throw out_of_memory();
  }
  return page;
}

void KVCache::Impl::hold_page(std::byte* page) noexcept {
  if (refs.find(page)->second++ == 0) ++pages_in_use;
}

void KVCache::Impl::release_page(std::byte* page) noexcept {
  if (--refs.find(page)->second == 0) {
    --pages_in_use;
    free_pages.push_back(page);  // capacity >= refs.size(): no allocation
  }
}

cache::SequenceSnapshot KVCache::Impl::snapshot(SequenceId sequence) const {
  const std::lock_guard lock(mutex);
  const Sequence& s = find(sequence);
  cache::SequenceSnapshot snap;
  snap.pages = s.pages.data();
  snap.page_count = static_cast<std::int64_t>(s.pages.size());
  snap.first_page_row = s.first_page_row;
  snap.first_row = s.first_row;
  snap.length = s.length;
  return snap;
}

// --- KVCache ----------------------------------------------------------------------------------

KVCache::KVCache(const KVCacheOptions& options)
    : impl_(std::make_unique<Impl>(options, make_layout(options))) {}
KVCache::~KVCache() = default;
KVCache::KVCache(KVCache&&) noexcept = default;
KVCache& KVCache::operator=(KVCache&&) noexcept = default;

const KVCacheOptions& KVCache::options() const noexcept { return impl_->options; }

SequenceId KVCache::add_sequence() {
  const std::lock_guard lock(impl_->mutex);
  const SequenceId id = impl_->next_id;
  impl_->sequences.emplace(id, std::make_unique<Impl::Sequence>());
  ++impl_->next_id;
  return id;
}

SequenceId KVCache::fork(SequenceId parent) {
  const std::lock_guard lock(impl_->mutex);
  const Sequence& from = impl_->find(parent);
  const SequenceId id = impl_->next_id;
  impl_->sequences.emplace(id, std::make_unique<Impl::Sequence>(from));
  ++impl_->next_id;
  for (std::byte* page : from.pages) impl_->hold_page(page);
  return id;
}

void KVCache::remove(SequenceId sequence) {
  const std::lock_guard lock(impl_->mutex);
  Sequence& s = impl_->find(sequence);
  for (std::byte* page : s.pages) impl_->release_page(page);
  impl_->sequences.erase(sequence);
}

bool KVCache::contains(SequenceId sequence) const {
  const std::lock_guard lock(impl_->mutex);
  return impl_->sequences.count(sequence) != 0;
}

std::vector<SequenceId> KVCache::sequences() const {
  const std::lock_guard lock(impl_->mutex);
  std::vector<SequenceId> ids;
  ids.reserve(impl_->sequences.size());
  for (const auto& entry : impl_->sequences) ids.push_back(entry.first);
  return ids;
}

void KVCache::append(SequenceId sequence, const TensorView& k, const TensorView& v) {
  Impl& impl = *impl_;
  const cache::PageLayout& layout = impl.layout;
  const cache::Operand ko =
      cache::check_operand(k, "k", "D", layout.d, -1, layout.hkv, layout.storage);
  const cache::Operand vo =
      cache::check_operand(v, "v", "Dv", layout.dv, ko.n, layout.hkv, layout.storage);
  const std::int64_t n = ko.n;
  std::vector<float> scratch(static_cast<std::size_t>(std::max(layout.d, layout.dv)));

  std::int64_t row0 = 0;
  std::int64_t first_page_row = 0;
  const std::vector<std::byte*>* pages = nullptr;
  {
    const std::lock_guard lock(impl.mutex);
    Sequence& s = impl.find(sequence);
    if (n == 0) return;
    const std::int64_t pr = layout.page_rows;
    if (n > std::numeric_limits<std::int64_t>::max() - s.length - pr) {
      throw Error(sequence_subject(sequence), "length would pass int64");
    }
    const std::int64_t new_length = s.length + n;
    const auto held = static_cast<std::int64_t>(s.pages.size());
    const std::int64_t after = (new_length - s.first_page_row + pr - 1) / pr;
    // Only the last page can be partly filled; appending into it while another sequence holds
    // it copies it first.
    const bool partial = (s.length - s.first_page_row) % pr != 0;
    const bool copy = partial && impl.refs.find(s.pages.back())->second > 1;
    const std::int64_t fresh_count = after - held + (copy ? 1 : 0);

    const KVCacheOptions& o = impl.options;
    const std::int64_t page_bytes = layout.page_bytes();
    const std::int64_t total = impl.pages_in_use + fresh_count;
    const bool too_many = o.max_pages > 0 && total > o.max_pages;
    const bool too_big =
        o.max_bytes > 0 &&
        static_cast<std::uint64_t>(total) > o.max_bytes / static_cast<std::uint64_t>(page_bytes);
    if (too_many || too_big) {
      std::string allowed;
      if (o.max_pages > 0) allowed = "at most " + pages_text(o.max_pages, page_bytes);
      if (o.max_bytes > 0) {
        allowed +=
            (allowed.empty() ? "at most " : ", at most ") + core::format_bytes_exact(o.max_bytes);
      }
      throw Error("KVCache capacity", "appending " + str(n) + " rows to " +
                                          sequence_subject(sequence) + " needs " +
                                          pages_text(fresh_count, page_bytes) + " more with " +
                                          pages_text(impl.pages_in_use, page_bytes) + " in use; " +
                                          allowed + " allowed");
    }

    // Take every page first; on failure hand them back and leave everything as it was.
    std::vector<std::byte*> fresh;
    try {
      fresh.reserve(static_cast<std::size_t>(fresh_count));
      s.pages.reserve(static_cast<std::size_t>(after));
      for (std::int64_t i = 0; i < fresh_count; ++i) fresh.push_back(impl.take_page());
    } catch (const std::bad_alloc&) {
      for (std::byte* page : fresh) impl.free_pages.push_back(page);
      throw core::OutOfMemory("KVCache", "the block table of " + sequence_subject(sequence), 0);
    } catch (...) {
      for (std::byte* page : fresh) impl.free_pages.push_back(page);
      throw;
    }

    // Commit: nothing below throws.
    std::size_t next = 0;
    if (copy) {
      std::byte* page = fresh[next++];
      // Under the lock: the page is shared, and a sharer that later holds it alone may write
      // rows into it once the lock is released.
      std::memcpy(page, s.pages.back(), static_cast<std::size_t>(page_bytes));
      impl.hold_page(page);
      impl.release_page(s.pages.back());
      s.pages.back() = page;
    }
    for (; next < fresh.size(); ++next) {
      impl.hold_page(fresh[next]);
      s.pages.push_back(fresh[next]);
    }
    row0 = s.length;
    first_page_row = s.first_page_row;
    s.length = new_length;
    impl.max_abs_k = std::max(impl.max_abs_k, ko.max_abs);
    impl.max_abs_v = std::max(impl.max_abs_v, vo.max_abs);
    pages = &s.pages;
  }
  // The pages from row0's on are this sequence's alone, and calls on one sequence do not run
  // concurrently: the rows are written without the lock.
  cache::write_rows(layout, *pages, first_page_row, row0, ko, false, scratch);
  cache::write_rows(layout, *pages, first_page_row, row0, vo, true, scratch);
}

void KVCache::Impl::magnitudes(double& k, double& v) const {
  const std::lock_guard lock(mutex);
  k = max_abs_k;
  v = max_abs_v;
}

void KVCache::forget_before(SequenceId sequence, std::int64_t row) {
  const std::lock_guard lock(impl_->mutex);
  Sequence& s = impl_->find(sequence);
  if (row < 0 || row > s.length) {
    throw Error(
        sequence_subject(sequence),
        "forget_before(" + str(row) + "): row must be in [0, length = " + str(s.length) + "]");
  }
  if (row <= s.first_row) return;
  const std::int64_t pr = impl_->layout.page_rows;
  const std::int64_t first_page_row = row / pr * pr;
  const auto drop = static_cast<std::ptrdiff_t>((first_page_row - s.first_page_row) / pr);
  for (std::ptrdiff_t i = 0; i < drop; ++i)
    impl_->release_page(s.pages[static_cast<std::size_t>(i)]);
  s.pages.erase(s.pages.begin(), s.pages.begin() + drop);
  s.first_page_row = first_page_row;
  s.first_row = row;
}

std::int64_t KVCache::length(SequenceId sequence) const {
  const std::lock_guard lock(impl_->mutex);
  return impl_->find(sequence).length;
}

std::int64_t KVCache::first_stored_row(SequenceId sequence) const {
  const std::lock_guard lock(impl_->mutex);
  return impl_->find(sequence).first_row;
}

std::int64_t KVCache::pages_in_use() const {
  const std::lock_guard lock(impl_->mutex);
  return impl_->pages_in_use;
}

std::int64_t KVCache::page_bytes() const noexcept { return impl_->layout.page_bytes(); }

std::uint64_t KVCache::bytes_in_use() const {
  return static_cast<std::uint64_t>(pages_in_use()) * static_cast<std::uint64_t>(page_bytes());
}

Tensor KVCache::gather(SequenceId sequence, bool values, DType dtype) const {
  if (dtype != DType::kF64 && dtype != DType::kF32) {
    throw Error("KVCache::gather",
                std::string("dtype must be float64 or float32, got ") + dtype_name(dtype));
  }
  const cache::PageLayout& layout = impl_->layout;
  // The pages are read without the lock, as the kernels do: a call on this sequence does not
  // run concurrently with one that changes it.
  const cache::SequenceSnapshot snap = impl_->snapshot(sequence);
  const std::int64_t width = values ? layout.dv : layout.d;
  const std::int64_t rows = snap.length - snap.first_row;
  Tensor out(dtype, {layout.hkv, rows, width}, sequence_subject(sequence) + (values ? " V" : " K"));
  std::vector<double> row(static_cast<std::size_t>(width));
  const std::int64_t element_bytes = cache::storage_bytes(layout.storage);
  const std::int64_t blocks = values ? layout.v_blocks() : layout.k_blocks();
  for (std::int64_t hk = 0; hk < layout.hkv; ++hk) {
    const std::int64_t head_offset = values ? layout.v_offset(hk) : layout.k_offset(hk);
    const std::int64_t scale_offset =
        values ? layout.v_scale_offset(hk) : layout.k_scale_offset(hk);
    for (std::int64_t i = 0; i < rows; ++i) {
      const std::int64_t p = snap.first_row + i;
      const std::byte* page = snap.pages[(p - snap.first_page_row) / layout.page_rows];
      const std::int64_t r = p % layout.page_rows;
      cache::load_row(layout.storage, page + head_offset + r * width * element_bytes,
                      reinterpret_cast<const float*>(page + scale_offset) + r * blocks, width,
                      row.data());
      const std::int64_t at = (hk * rows + i) * width;
      for (std::int64_t c = 0; c < width; ++c) {
        const double value = row[static_cast<std::size_t>(c)];
        if (dtype == DType::kF64) {
          out.data_as<double>()[at + c] = value;
        } else {
          out.data_as<float>()[at + c] = static_cast<float>(value);
        }
      }
    }
  }
  return out;
}

}  // namespace qkv
