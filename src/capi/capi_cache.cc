// The C API's KV cache: an opaque handle around qkv::KVCache, and attention against it.
#include <cstdint>
#include <span>
#include <string>

#include "capi/capi_internal.h"
#include "qkv/kv_cache.h"
#include "qkv/qkv_c.h"

struct qkv_kv_cache {
  qkv::KVCache cache;
};

using qkv::capi::guarded;
using qkv::capi::require;

namespace {

qkv::CacheStorage to_storage(std::int64_t storage) {
  switch (storage) {
    case QKV_CACHE_F32:
      return qkv::CacheStorage::kF32;
    case QKV_CACHE_BF16:
      return qkv::CacheStorage::kBF16;
    case QKV_CACHE_F16:
      return qkv::CacheStorage::kF16;
    case QKV_CACHE_INT8:
      return qkv::CacheStorage::kInt8;
    default:
      break;
  }
  throw qkv::Error("storage", std::to_string(storage) +
                                  " is not a qkv_cache_storage (QKV_CACHE_F32 .. QKV_CACHE_INT8)");
}

}  // namespace

extern "C" {

qkv_status qkv_kv_cache_create(const qkv_kv_cache_options* options, qkv_kv_cache** cache) {
  return guarded([&] {
    require(cache, "cache");
    qkv_kv_cache_options defaults;
    qkv_kv_cache_options_init(&defaults);
    const qkv_kv_cache_options o = qkv::capi::read_struct(options, defaults, "options");
    qkv::KVCacheOptions cache_options;
    cache_options.kv_heads = o.kv_heads;
    cache_options.d = o.d;
    cache_options.dv = o.dv;
    cache_options.storage = to_storage(qkv::capi::enum_value(o.storage));
    cache_options.page_rows = o.page_rows;
    cache_options.max_pages = o.max_pages;
    cache_options.max_bytes = o.max_bytes;
    *cache = new qkv_kv_cache{qkv::KVCache(cache_options)};
  });
}

void qkv_kv_cache_destroy(qkv_kv_cache* cache) { delete cache; }

qkv_status qkv_kv_cache_add_sequence(qkv_kv_cache* cache, int64_t* sequence) {
  return guarded([&] {
    require(cache, "cache");
    require(sequence, "sequence");
    *sequence = cache->cache.add_sequence();
  });
}

qkv_status qkv_kv_cache_fork(qkv_kv_cache* cache, int64_t parent, int64_t* sequence) {
  return guarded([&] {
    require(cache, "cache");
    require(sequence, "sequence");
    *sequence = cache->cache.fork(parent);
  });
}

qkv_status qkv_kv_cache_remove(qkv_kv_cache* cache, int64_t sequence) {
  return guarded([&] {
    require(cache, "cache");
    cache->cache.remove(sequence);
  });
}

qkv_status qkv_kv_cache_append(qkv_kv_cache* cache, int64_t sequence, const qkv_tensor* k,
                               const qkv_tensor* v) {
  return guarded([&] {
    require(cache, "cache");
    cache->cache.append(sequence, qkv::capi::to_view(k, "k"), qkv::capi::to_view(v, "v"));
  });
}

qkv_status qkv_kv_cache_forget_before(qkv_kv_cache* cache, int64_t sequence, int64_t row) {
  return guarded([&] {
    require(cache, "cache");
    cache->cache.forget_before(sequence, row);
  });
}

qkv_status qkv_kv_cache_length(const qkv_kv_cache* cache, int64_t sequence, int64_t* length) {
  return guarded([&] {
    require(cache, "cache");
    require(length, "length");
    *length = cache->cache.length(sequence);
  });
}

qkv_status qkv_kv_cache_pages_in_use(const qkv_kv_cache* cache, int64_t* pages) {
  return guarded([&] {
    require(cache, "cache");
    require(pages, "pages");
    *pages = cache->cache.pages_in_use();
  });
}

qkv_status qkv_attention_cached(const qkv_kv_cache* cache, const qkv_tensor* q,
                                const int64_t* sequences, size_t count,
                                const qkv_attention_options* options, qkv_result** result) {
  return guarded([&] {
    require(cache, "cache");
    require(result, "result");
    if (count > 0) require(sequences, "sequences");
    const std::span<const qkv::SequenceId> ids(sequences, count);
    qkv::capi::hand_over(
        qkv::capi::make_result(qkv::attention_cached(qkv::capi::to_view(q, "q"), cache->cache, ids,
                                                     qkv::capi::to_options(options))),
        result);
  });
}

}  // extern "C"
