// The inside of qkv::KVCache, for the cache's own code and the decode kernels (which read pages
// in place through snapshot()).
#pragma once

#include "cache/page_layout.h"
#include "qkv/kv_cache.h"

namespace qkv {

struct KVCache::Impl {
  KVCacheOptions options;
  cache::PageLayout layout;

  // The sequence's pages and rows as they are now. Throws qkv::Error (subject "sequence N")
  // when the cache has no such sequence. The snapshot stays valid until that sequence is next
  // changed (append, forget_before, remove).
  cache::SequenceSnapshot snapshot(SequenceId sequence) const;

  // The pool, the sequences and their lock: see kv_cache.cc.
};

}  // namespace qkv
