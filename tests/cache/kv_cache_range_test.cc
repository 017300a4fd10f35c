// The KV cache's range rule: an append whose values a page cannot hold finitely (after rounding
// to bf16 or f16, or after int8's q · scale) is refused in one line naming k or v and the index,
// and changes nothing; what it holds is what the kernels' float32 range checks count.
#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cache/kv_cache_impl.h"
#include "qkv/error.h"
#include "qkv/kv_cache.h"
#include "support/test_support.h"

namespace qkv {
namespace {

KVCache make_cache(CacheStorage storage) {
  KVCacheOptions o;
  o.storage = storage;
  o.kv_heads = 2;
  o.d = 3;
  o.dv = 40;  // two int8 blocks per value row
  o.page_rows = 4;
  return KVCache(o);
}

// [2, n, width] float32 values in [-1, 1); `set` then places chosen elements.
Tensor rows(std::int64_t n, std::int64_t width, std::uint64_t seed) {
  return testing::random_tensor(DType::kF32, {2, n, width}, seed);
}

// The view without its name, so that errors name "k" and "v".
TensorView unnamed(const Tensor& tensor) {
  TensorView view = tensor.view();
  view.name.clear();
  return view;
}

void put(Tensor& t, std::int64_t hk, std::int64_t i, std::int64_t c, float value) {
  t.data_as<float>()[(hk * t.shape()[1] + i) * t.shape()[2] + c] = value;
}

// As the cache prints a value: the shortest text that reads back as the same double.
std::string shortest(float value) {
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, static_cast<double>(value));
  return std::string(buffer, result.ptr);
}

std::string refusal(KVCache& cache, SequenceId seq, const Tensor& k, const Tensor& v) {
  try {
    cache.append(seq, unnamed(k), unnamed(v));
  } catch (const Error& error) {
    return error.what();
  }
  return "(accepted)";
}

std::vector<float> gathered(const KVCache& cache, SequenceId seq, bool values) {
  const Tensor t = cache.gather(seq, values, DType::kF32);
  return {t.data_as<float>(), t.data_as<float>() + t.numel()};
}

// The smallest float32 magnitude bfloat16 rounds to infinity: halfway between its largest
// finite value 0x7f7f and 0x7f80, where the tie goes to the even infinity.
const float kBf16Overflow = std::bit_cast<float>(0x7f7f8000u);

struct Case {
  CacheStorage storage;
  float refused;   // finite in float32, beyond what the storage holds finitely
  float accepted;  // the largest magnitude it holds, or one just below its rounding edge
  const char* range;
};

class CacheRange : public ::testing::TestWithParam<Case> {};

TEST_P(CacheRange, ValuesThePageCannotHoldAreRefusedInOneLineAndChangeNothing) {
  const Case c = GetParam();
  KVCache cache = make_cache(c.storage);
  const SequenceId seq = cache.add_sequence();
  cache.append(seq, rows(3, 3, 1).view(), rows(3, 40, 2).view());
  const std::vector<float> k_before = gathered(cache, seq, false);
  const std::vector<float> v_before = gathered(cache, seq, true);
  const std::int64_t pages_before = cache.pages_in_use();

  Tensor k = rows(2, 3, 3);
  Tensor v = rows(2, 40, 4);
  if (std::isfinite(c.refused)) {
    put(v, 1, 1, 37, -c.refused);
    EXPECT_EQ(refusal(cache, seq, k, v), "v: value " + shortest(-c.refused) +
                                             " at [1, 1, 37] is outside " + c.range + "'s range");
    put(v, 1, 1, 37, 0.5f);
    put(k, 0, 1, 2, c.refused);
    EXPECT_EQ(refusal(cache, seq, k, v), "k: value " + shortest(c.refused) +
                                             " at [0, 1, 2] is outside " + c.range + "'s range");
    put(k, 0, 1, 2, 0.5f);
  }
  // A float64 input beyond float32 is refused by every storage type.
  Tensor k64 = testing::random_tensor(DType::kF64, {2, 2, 3}, 5);
  k64.data_as<double>()[4] = 1e39;
  const std::string beyond = refusal(cache, seq, k64, v);
  EXPECT_EQ(beyond.rfind("k: value 1e+39 at [0, 1, 1] is outside ", 0), 0u) << beyond;

  EXPECT_EQ(cache.length(seq), 3);
  EXPECT_EQ(cache.pages_in_use(), pages_before);
  EXPECT_EQ(gathered(cache, seq, false), k_before);
  EXPECT_EQ(gathered(cache, seq, true), v_before);

  // The edge itself is held, finitely, and the sequence keeps working.
  put(k, 1, 0, 0, c.accepted);
  put(v, 0, 1, 33, -c.accepted);
  cache.append(seq, k.view(), v.view());
  EXPECT_EQ(cache.length(seq), 5);
  for (const bool values : {false, true}) {
    for (const float x : gathered(cache, seq, values)) EXPECT_TRUE(std::isfinite(x)) << x;
  }
  const Tensor q = testing::random_tensor(DType::kF32, {2, 1, 3}, 6);
  const std::vector<SequenceId> ids{seq};
  const AttentionResult out = attention_cached(q.view(), cache, ids, {});
  for (std::int64_t e = 0; e < out.out.numel(); ++e) {
    EXPECT_TRUE(std::isfinite(out.out.data_as<float>()[e])) << e;
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllStorage, CacheRange,
    ::testing::Values(Case{CacheStorage::kF32, INFINITY, FLT_MAX, "float32"},
                      Case{CacheStorage::kBF16, 3.4e38f, std::nextafter(kBf16Overflow, 0.0f),
                           "bfloat16"},
                      Case{CacheStorage::kBF16, kBf16Overflow, 3.3895313e38f, "bfloat16"},
                      Case{CacheStorage::kF16, 65520.0f, 65519.996f, "float16"},
                      // Every finite float32 value has an int8 block scale that holds it.
                      Case{CacheStorage::kInt8, INFINITY, FLT_MAX, "float32"}),
    [](const ::testing::TestParamInfo<Case>& param_info) {
      return std::string(cache_storage_name(param_info.param.storage)) + "_" +
             std::to_string(param_info.index);
    });

// The bounds the kernels' float32 range checks read are the largest magnitudes the pages hold
// (after rounding and q · scale), not those of the inputs: bf16 rounds 1.00390625 up to 1.0078125.
TEST(CacheRange, MagnitudesAreTheStoredValuesLargest) {
  for (const CacheStorage storage :
       {CacheStorage::kF32, CacheStorage::kBF16, CacheStorage::kF16, CacheStorage::kInt8}) {
    KVCache cache = make_cache(storage);
    const SequenceId seq = cache.add_sequence();
    Tensor k = rows(5, 3, 7);
    Tensor v = rows(5, 40, 8);
    put(k, 1, 2, 1, 1.00390625f + 0x1p-20f);
    // Each storage's largest magnitude, which int8 holds as 127 · scale.
    const float extreme = storage == CacheStorage::kBF16  ? 3.3895313e38f
                          : storage == CacheStorage::kF16 ? 65504.0f
                                                          : FLT_MAX;
    put(v, 0, 4, 39, -extreme);
    cache.append(seq, k.view(), v.view());
    double k_bound = 0.0, v_bound = 0.0;
    cache.impl().magnitudes(k_bound, v_bound);
    const Tensor kg = cache.gather(seq, false, DType::kF64);
    const Tensor vg = cache.gather(seq, true, DType::kF64);
    double k_max = 0.0, v_max = 0.0;
    for (std::int64_t e = 0; e < kg.numel(); ++e) {
      k_max = std::max(k_max, std::abs(kg.data_as<double>()[e]));
    }
    for (std::int64_t e = 0; e < vg.numel(); ++e) {
      v_max = std::max(v_max, std::abs(vg.data_as<double>()[e]));
    }
    EXPECT_EQ(k_bound, k_max) << cache_storage_name(storage);
    EXPECT_EQ(v_bound, v_max) << cache_storage_name(storage);
    EXPECT_LE(v_max, static_cast<double>(FLT_MAX)) << cache_storage_name(storage);
  }
}

}  // namespace
}  // namespace qkv
