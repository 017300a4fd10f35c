// qkv::KVCache: pages, block tables, copy-on-write forks.
#include "qkv/kv_cache.h"

#include "cache/kv_cache_impl.h"
#include "qkv/error.h"

namespace qkv {

const char* cache_storage_name(CacheStorage storage) noexcept {
  switch (storage) {
    case CacheStorage::kF32: return "f32";
    case CacheStorage::kBF16: return "bf16";
    case CacheStorage::kF16: return "f16";
    case CacheStorage::kInt8: return "int8";
  }
  return "?";
}

CacheStorage parse_cache_storage(const std::string& text, const std::string& subject) {
  for (CacheStorage storage : {CacheStorage::kF32, CacheStorage::kBF16, CacheStorage::kF16,
                               CacheStorage::kInt8}) {
    if (text == cache_storage_name(storage)) return storage;
  }
  throw Error(subject, "must be f32, bf16, f16 or int8, got '" + text + "'");
}

}  // namespace qkv
