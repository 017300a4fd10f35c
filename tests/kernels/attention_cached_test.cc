// qkv::attention_cached against its reference twin (the gathered, dequantised cache through the
// float64 reference), the naive float32 composition, the plain kernels, and itself on other
// thread counts; and the calls it refuses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/kernel.h"
#include "kernels/kernel_cases.h"
#include "kernels/modifier_cases.h"
#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/kv_cache.h"
#include "support/test_support.h"

namespace qkv::testing {
namespace {

struct CachedCase {
  std::string name;
  CacheStorage storage = CacheStorage::kF32;
  std::int64_t page_rows = 256;
  std::int64_t h = 4, hkv = 2, d = 32, dv = 24, nq = 1;
  std::vector<std::int64_t> lengths{0, 1, 5, 300, 2100};
  bool causal = false;
  std::optional<Window> window;
  std::optional<double> scale;
};

// A cache holding the case's sequences, filled with random rows in uneven appends, and the
// float64 values appended (before rounding to the storage type), per sequence.
struct Filled {
  KVCache cache;
  std::vector<SequenceId> ids;
  std::vector<Tensor> k_exact, v_exact;  // [Hkv, length, D] float64
};

Filled fill(const CachedCase& c, std::uint64_t seed) {
  Filled f{KVCache(KVCacheOptions{c.hkv, c.d, c.dv, c.storage, c.page_rows, 0, 0}), {}, {}, {}};
  for (std::size_t s = 0; s < c.lengths.size(); ++s) {
    const std::int64_t n = c.lengths[s];
    f.ids.push_back(f.cache.add_sequence());
    Tensor k = random_tensor(DType::kF64, {c.hkv, n, c.d}, seed + 2 * s);
    Tensor v = random_tensor(DType::kF64, {c.hkv, n, c.dv}, seed + 2 * s + 1);
    // Appends of 1, 7, 100, 1 ... rows: page edges fall inside appends and between them.
    const std::int64_t steps[] = {1, 7, 100};
    for (std::int64_t at = 0, i = 0; at < n; ++i) {
      const std::int64_t rows = std::min(steps[i % 3], n - at);
      TensorView kv = k.view();
      kv.data = k.data_as<double>() + at * c.d;
      kv.shape[1] = rows;
      TensorView vv = v.view();
      vv.data = v.data_as<double>() + at * c.dv;
      vv.shape[1] = rows;
      f.cache.append(f.ids.back(), kv, vv);
      at += rows;
    }
    f.k_exact.push_back(std::move(k));
    f.v_exact.push_back(std::move(v));
  }
  return f;
}

AttentionOptions options_of(const CachedCase& c) {
  AttentionOptions o;
  o.causal = c.causal;
  o.window = c.window;
  o.scale = c.scale;
  o.return_lse = true;
  o.out_dtype = DType::kF64;
  return o;
}

// Sequence s's rows of a [S, ...] tensor, as a view without the first dim.
TensorView slice(const Tensor& t, std::size_t s) {
  TensorView v = t.view();
  const std::int64_t per = v.strides[0];
  v.data = static_cast<const std::byte*>(v.data) +
           static_cast<std::int64_t>(s) * per * static_cast<std::int64_t>(dtype_size(t.dtype()));
  v.shape.erase(v.shape.begin());
  v.strides.erase(v.strides.begin());
  return v;
}

std::vector<CachedCase> cached_cases() {
  std::vector<CachedCase> cases;
  for (CacheStorage storage : {CacheStorage::kF32, CacheStorage::kBF16, CacheStorage::kF16,
                               CacheStorage::kInt8}) {
    const std::string name = cache_storage_name(storage);
    auto add = [&](const std::string& suffix, auto edit) {
      CachedCase c;
      c.name = name + "_" + suffix;
      c.storage = storage;
      edit(c);
      cases.push_back(c);
    };
    add("plain", [](CachedCase&) {});
    add("causal_3_queries", [](CachedCase& c) {
      c.causal = true;
      c.nq = 3;
    });
    add("window_small_pages", [](CachedCase& c) {
      c.causal = true;
      c.window = Window{40, 0};
      c.page_rows = 7;
      c.nq = 2;
    });
    add("mqa_dv_ne_d", [](CachedCase& c) {
      c.h = 6;
      c.hkv = 1;
      c.d = 72;
      c.dv = 40;
      c.scale = 0.3;
    });
    add("chunked_prefill", [](CachedCase& c) {
      c.causal = true;
      c.nq = 20;
      c.lengths = {20, 1500};
      c.page_rows = 16;
    });
    // Rows of whole vectors, which the SIMD kernel reads as stored and widens in registers (K
    // too at one row per kv head), with pages that end inside a block of 16 keys.
    add("whole_vectors_one_row", [](CachedCase& c) {
      c.h = c.hkv = 2;
      c.d = c.dv = 64;
      c.page_rows = 20;
    });
    // Four rows per kv head (16-bit K widened in registers, int8 K into L1), causal with a window.
    add("whole_vectors_gqa_window", [](CachedCase& c) {
      c.h = 8;
      c.hkv = 2;
      c.dv = 48;
      c.causal = true;
      c.window = Window{40, 0};
      c.page_rows = 7;
    });
  }
  return cases;
}

class CachedAttention : public ::testing::TestWithParam<CachedCase> {};

// Every decode kernel (decode_hwy on every SIMD target) against the reference twin, with the
// float32 criterion: at most twice the error of the naive float32 composition on the same
// stored values, plus a floor of 1e-7 of the values' scale.
TEST_P(CachedAttention, EveryKernelWithinTwiceNaiveFloat32) {
  const CachedCase& c = GetParam();
  Filled f = fill(c, 17);
  const auto count = static_cast<std::int64_t>(f.ids.size());
  const Tensor q = random_tensor(DType::kF32, {count, c.h, c.nq, c.d}, 5);
  AttentionOptions options = options_of(c);
  options.kernel = "reference";
  const AttentionResult ref = attention_cached(q.view(), f.cache, f.ids, options);
  ASSERT_EQ(ref.out.shape(), (Shape{count, c.h, c.nq, c.dv}));

  std::vector<std::pair<std::string, std::int64_t>> runs{{"decode_scalar", 0}};
  for (std::int64_t t : kernels::simd_targets()) runs.push_back({"decode_hwy", t});
  for (const auto& [kernel, target] : runs) {
    SCOPED_TRACE(kernel + " " + kernels::simd_target_name(target));
    kernels::simd_force_target(target);
    options.kernel = kernel;
    const AttentionResult got = attention_cached(q.view(), f.cache, f.ids, options);
    kernels::simd_force_target(0);
    EXPECT_EQ(got.kernel, kernel);
    for (std::size_t s = 0; s < f.ids.size(); ++s) {
      SCOPED_TRACE("sequence " + std::to_string(s) + " of length " +
                   std::to_string(c.lengths[s]));
      const Tensor k = f.cache.gather(f.ids[s], false, DType::kF32);
      const Tensor v = f.cache.gather(f.ids[s], true, DType::kF32);
      AttentionOptions plain = options_of(c);
      const NaiveResult naive = naive_f32(slice(q, s), k.view(), v.view(), plain);
      const double naive_out = max_error(naive.out.view(), slice(ref.out, s));
      const double naive_lse = max_error(naive.lse.view(), slice(ref.lse, s));
      const double scale_v = std::max(max_abs(v.view()), 1e-30);
      EXPECT_LE(max_error(slice(got.out, s), slice(ref.out, s)), 2.0 * naive_out + 1e-7 * scale_v);
      EXPECT_LE(max_error(slice(got.lse, s), slice(ref.lse, s)), 2.0 * naive_lse + 1e-6);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Caches, CachedAttention, ::testing::ValuesIn(cached_cases()),
                         [](const ::testing::TestParamInfo<CachedCase>& param) {
                           return param.param.name;
                         });

// Softcap, ALiBi and sinks in the decode kernels: against the reference twin with the float32
// criterion (twice the naive float32 composition with the same modifiers, on the stored
// values), every kernel and SIMD target, causal with two query rows so that ALiBi's distances
// and the sink's share differ from row to row; the empty sequence gives lse = sink.
TEST(CachedAttentionModifiers, SoftcapAlibiSinksWithinTwiceNaiveFloat32) {
  for (CacheStorage storage : {CacheStorage::kF32, CacheStorage::kBF16, CacheStorage::kInt8}) {
    CachedCase c;
    c.storage = storage;
    c.causal = true;
    c.nq = 2;
    c.page_rows = 16;
    Filled f = fill(c, 29);
    const auto count = static_cast<std::int64_t>(f.ids.size());
    const Tensor q = random_tensor(DType::kF32, {count, c.h, c.nq, c.d}, 6, -3.0, 3.0);
    const Tensor sinks = random_tensor(DType::kF32, {c.h}, 8, -1.0, 2.0);
    AttentionOptions options = options_of(c);
    options.softcap = 0.8;
    options.alibi = true;
    options.sinks = sinks.view();
    options.kernel = "reference";
    const AttentionResult ref = attention_cached(q.view(), f.cache, f.ids, options);
    std::vector<std::pair<std::string, std::int64_t>> runs{{"decode_scalar", 0}};
    for (std::int64_t t : kernels::simd_targets()) runs.push_back({"decode_hwy", t});
    for (const auto& [kernel, target] : runs) {
      SCOPED_TRACE(std::string(cache_storage_name(storage)) + " " + kernel + " " +
                   kernels::simd_target_name(target));
      kernels::simd_force_target(target);
      options.kernel = kernel;
      const AttentionResult got = attention_cached(q.view(), f.cache, f.ids, options);
      kernels::simd_force_target(0);
      EXPECT_EQ(got.kernel, kernel);
      for (std::size_t s = 0; s < f.ids.size(); ++s) {
        SCOPED_TRACE("sequence of length " + std::to_string(c.lengths[s]));
        const Tensor k = f.cache.gather(f.ids[s], false, DType::kF32);
        const Tensor v = f.cache.gather(f.ids[s], true, DType::kF32);
        AttentionOptions plain = options;
        plain.kernel.clear();
        const NaiveResult naive = naive_modified(slice(q, s), k.view(), v.view(), plain);
        const double naive_out = max_error(naive.out.view(), slice(ref.out, s));
        const double naive_lse = max_error(naive.lse.view(), slice(ref.lse, s));
        const double scale_v = std::max(max_abs(v.view()), 1e-30);
        EXPECT_LE(max_error(slice(got.out, s), slice(ref.out, s)),
                  2.0 * naive_out + 1e-7 * scale_v);
        EXPECT_LE(max_error(slice(got.lse, s), slice(ref.lse, s)), 2.0 * naive_lse + 1e-6);
        if (c.lengths[s] == 0) {
          for (std::int64_t h = 0; h < c.h; ++h) {
            const TensorView lse = slice(got.lse, s);
            EXPECT_EQ(element(lse, h * c.nq), static_cast<double>(sinks.data_as<float>()[h]));
          }
        }
      }
    }
  }
}

// The reference twin is the plain reference on the gathered cache, sequence by sequence.
TEST(CachedAttentionReference, EqualsThePlainReferenceOnTheGatheredRows) {
  CachedCase c;
  c.causal = true;
  c.nq = 2;
  Filled f = fill(c, 3);
  const auto count = static_cast<std::int64_t>(f.ids.size());
  const Tensor q = random_tensor(DType::kF64, {count, c.h, c.nq, c.d}, 9);
  AttentionOptions options = options_of(c);
  options.kernel = "reference";
  const AttentionResult cached = attention_cached(q.view(), f.cache, f.ids, options);
  for (std::size_t s = 0; s < f.ids.size(); ++s) {
    const Tensor k = f.cache.gather(f.ids[s], false);
    const Tensor v = f.cache.gather(f.ids[s], true);
    const AttentionResult plain = attention(slice(q, s), k.view(), v.view(), options);
    EXPECT_EQ(max_abs_diff(slice(cached.out, s), plain.out.view()), 0.0);
    EXPECT_EQ(max_abs_diff(slice(cached.lse, s), plain.lse.view()), 0.0);
  }
}

// The cache's bf16, f16 and int8 rows, read as stored and widened in registers, give the same
// bits as the float32 decode kernel on the same values as plain tensors: the same floats summed
// in the same order (pages of a whole number of 16-key blocks, so that both walk the same blocks).
TEST(CachedAttentionStoredRows, SameBitsAsTheFloat32KernelOnTheGatheredRows) {
  const auto names = attention_kernel_names();
  if (std::find(names.begin(), names.end(), "decode_hwy") == names.end()) {
    GTEST_SKIP() << "decode_hwy is not compiled in this build";
  }
  for (CacheStorage storage : {CacheStorage::kBF16, CacheStorage::kF16, CacheStorage::kInt8}) {
    for (std::int64_t h : {2, 8}) {
      SCOPED_TRACE(std::string(cache_storage_name(storage)) + " with " + std::to_string(h) +
                   " heads");
      CachedCase c;
      c.storage = storage;
      c.h = h;
      c.hkv = 2;
      c.d = c.dv = 64;
      c.lengths = {2100, 300};
      c.causal = true;
      Filled f = fill(c, 47);
      const auto count = static_cast<std::int64_t>(f.ids.size());
      const Tensor q = random_tensor(DType::kF32, {count, c.h, 1, c.d}, 53);
      AttentionOptions options = options_of(c);
      options.out_dtype = DType::kF32;
      const AttentionResult cached = attention_cached(q.view(), f.cache, f.ids, options);
      ASSERT_EQ(cached.kernel, "decode_hwy");
      for (std::size_t s = 0; s < f.ids.size(); ++s) {
        const Tensor k = f.cache.gather(f.ids[s], false, DType::kF32);
        const Tensor v = f.cache.gather(f.ids[s], true, DType::kF32);
        const AttentionResult plain = attention(slice(q, s), k.view(), v.view(), options);
        ASSERT_EQ(plain.kernel, "decode_hwy");
        EXPECT_EQ(max_abs_diff(slice(cached.out, s), plain.out.view()), 0.0) << "sequence " << s;
        EXPECT_EQ(max_abs_diff(slice(cached.lse, s), plain.lse.view()), 0.0) << "sequence " << s;
      }
    }
  }
}

// int8: the decode kernel's error against exact attention on the values before quantisation is
// at most twice that of the plain composition (dequantise to float32, naive float32 attention).
TEST(CachedAttentionInt8, WithinTwiceTheDequantiseThenFloat32Error) {
  CachedCase c;
  c.storage = CacheStorage::kInt8;
  c.h = 8;
  c.hkv = 2;
  c.d = c.dv = 64;
  c.lengths = {3000};
  c.causal = true;
  Filled f = fill(c, 23);
  const Tensor q = random_tensor(DType::kF32, {1, c.h, 1, c.d}, 29);
  AttentionOptions options = options_of(c);
  const AttentionResult got = attention_cached(q.view(), f.cache, f.ids, options);
  AttentionOptions exact_options = options;
  exact_options.kernel = "reference";
  const AttentionResult exact =
      attention(slice(q, 0), f.k_exact[0].view(), f.v_exact[0].view(), exact_options);
  const Tensor k = f.cache.gather(f.ids[0], false, DType::kF32);
  const Tensor v = f.cache.gather(f.ids[0], true, DType::kF32);
  const NaiveResult naive = naive_f32(slice(q, 0), k.view(), v.view(), options);
  const double composition = max_error(naive.out.view(), exact.out.view());
  EXPECT_GT(composition, 0.0);
  EXPECT_LE(max_error(slice(got.out, 0), exact.out.view()), 2.0 * composition);
}

// Split-KV (chunks of >= 1024 keys, merged) against the unsplit fused kernel on the same rows.
TEST(CachedAttentionSplit, SplitEqualsUnsplitWithinTheFloat32Criterion) {
  CachedCase c;
  c.lengths = {5000};
  c.h = 8;
  c.hkv = 8;
  c.d = c.dv = 128;
  Filled f = fill(c, 31);
  const Tensor q = random_tensor(DType::kF32, {1, c.h, 1, c.d}, 37);
  const AttentionOptions options = options_of(c);
  const AttentionResult split = attention_cached(q.view(), f.cache, f.ids, options);
  const Tensor k = f.cache.gather(f.ids[0], false, DType::kF32);
  const Tensor v = f.cache.gather(f.ids[0], true, DType::kF32);
  AttentionOptions unsplit_options = options;
  unsplit_options.kernel = kernels::simd_targets().empty() ? "fused_scalar" : "fused_hwy";
  const AttentionResult unsplit = attention(slice(q, 0), k.view(), v.view(), unsplit_options);
  AttentionOptions ref_options = options;
  ref_options.kernel = "reference";
  const AttentionResult ref = attention(slice(q, 0), k.view(), v.view(), ref_options);
  const NaiveResult naive = naive_f32(slice(q, 0), k.view(), v.view(), options);
  const double bound = 2.0 * max_error(naive.out.view(), ref.out.view()) + 1e-7;
  EXPECT_LE(max_error(slice(split.out, 0), ref.out.view()), bound);
  EXPECT_LE(max_error(unsplit.out.view(), ref.out.view()), bound);
  EXPECT_LE(max_error(slice(split.out, 0), unsplit.out.view()), 2.0 * bound);
}

// The chunks depend on the shape only: any thread count gives the same bits.
TEST(CachedAttentionThreads, BitwiseIdenticalForAnyThreadCount) {
  CachedCase c;
  c.lengths = {1, 2500, 4097, 700};
  c.h = 8;
  c.hkv = 2;
  c.causal = true;
  c.storage = CacheStorage::kBF16;
  Filled f = fill(c, 41);
  const Tensor q = random_tensor(DType::kF32, {4, c.h, 1, c.d}, 43);
  AttentionOptions options = options_of(c);
  options.threads = 1;
  const AttentionResult one = attention_cached(q.view(), f.cache, f.ids, options);
  for (int threads : {2, 3, 8}) {
    options.threads = threads;
    const AttentionResult many = attention_cached(q.view(), f.cache, f.ids, options);
    EXPECT_TRUE(bitwise_equal(one.out, many.out)) << threads << " threads";
    EXPECT_TRUE(bitwise_equal(one.lse, many.lse)) << threads << " threads";
  }
}

void expect_error(const std::function<void()>& call, const std::string& subject,
                  const std::string& words) {
  try {
    call();
    ADD_FAILURE() << "no error; expected " << subject;
  } catch (const Error& e) {
    EXPECT_EQ(e.subject(), subject) << e.what();
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
  }
}

TEST(CachedAttentionErrors, BadCallsAreRefusedInOneLine) {
  CachedCase c;
  c.lengths = {10, 20};
  Filled f = fill(c, 47);
  const Tensor q = random_tensor(DType::kF32, {2, c.h, 1, c.d}, 53);
  const std::vector<SequenceId> unknown{f.ids[0], 999};
  expect_error([&] { attention_cached(q.view(), f.cache, unknown); }, "sequence 999",
               "not in this cache");
  const Tensor wrong_d = random_tensor(DType::kF32, {2, c.h, 1, c.d + 1}, 1);
  expect_error([&] { attention_cached(wrong_d.view(), f.cache, f.ids); }, "random",
               "does not match the cache's D");
  const Tensor wrong_h = random_tensor(DType::kF32, {2, 3, 1, c.d}, 1);
  expect_error([&] { attention_cached(wrong_h.view(), f.cache, f.ids); }, "random",
               "not a multiple of the cache's Hkv");
  const std::vector<SequenceId> one{f.ids[0]};
  expect_error([&] { attention_cached(q.view(), f.cache, one); }, "random", "must equal the 1");
  const Tensor mask(DType::kBool, {1, 10});
  AttentionOptions masked;
  masked.mask = mask.view();
  expect_error([&] { attention_cached(q.view(), f.cache, f.ids, masked); }, "mask",
               "not supported with a KV cache");
  AttentionOptions weights;
  weights.return_weights = true;
  expect_error([&] { attention_cached(q.view(), f.cache, f.ids, weights); }, "return_weights",
               "not supported");
  AttentionOptions fused;
  fused.kernel = "fused_hwy";
  expect_error([&] { attention_cached(q.view(), f.cache, f.ids, fused); }, "kernel fused_hwy",
               "cannot run a cached call");
  AttentionOptions budget;
  budget.max_memory = 16;
  expect_error([&] { attention_cached(q.view(), f.cache, f.ids, budget); }, "max_memory", "");
  // The cache is unchanged by all of that.
  EXPECT_EQ(f.cache.length(f.ids[0]), 10);
  EXPECT_EQ(f.cache.length(f.ids[1]), 20);
}

// After forget_before, a window that stays inside the kept rows equals the full computation;
// one that would reach a forgotten row is refused.
TEST(CachedAttentionWindow, ForgottenRowsAreNeverAttended) {
  CachedCase c;
  c.lengths = {1000};
  c.page_rows = 64;
  Filled f = fill(c, 59);
  const Tensor q = random_tensor(DType::kF32, {1, c.h, 1, c.d}, 61);
  AttentionOptions options = options_of(c);
  options.causal = true;
  options.window = Window{199, 0};  // keys 800 .. 999
  const AttentionResult before = attention_cached(q.view(), f.cache, f.ids, options);
  f.cache.forget_before(f.ids[0], 800);
  EXPECT_LE(f.cache.pages_in_use(), 4);  // rows 768 .. 999: pages 12 .. 15
  const AttentionResult after = attention_cached(q.view(), f.cache, f.ids, options);
  EXPECT_EQ(max_abs_diff(before.out.view(), after.out.view()), 0.0);
  options.window = Window{250, 0};
  expect_error([&] { attention_cached(q.view(), f.cache, f.ids, options); }, "sequence 0",
               "were forgotten");
  options.window.reset();
  expect_error([&] { attention_cached(q.view(), f.cache, f.ids, options); }, "sequence 0",
               "were forgotten");
}

}  // namespace
}  // namespace qkv::testing

namespace qkv::testing {
namespace {

// Values whose scores float32 cannot hold send the call to the float64 reference by default;
// a forced decode kernel refuses it by name.
TEST(CachedAttentionRange, BeyondFloat32GoesToTheReference) {
  KVCache cache(KVCacheOptions{1, 4, 4, CacheStorage::kF32, 8, 0, 0});
  const SequenceId id = cache.add_sequence();
  Tensor k = random_tensor(DType::kF64, {1, 5, 4}, 1, 1e19, 2e19);
  const Tensor v = random_tensor(DType::kF64, {1, 5, 4}, 2);
  cache.append(id, k.view(), v.view());
  const Tensor q = random_tensor(DType::kF64, {1, 1, 1, 4}, 3, 1e19, 2e19);
  const std::vector<SequenceId> ids{id};
  AttentionOptions options;
  options.scale = 1.0;
  const AttentionResult got = attention_cached(q.view(), cache, ids, options);
  EXPECT_EQ(got.kernel, "reference");
  for (std::int64_t e = 0; e < got.out.numel(); ++e) {
    EXPECT_TRUE(std::isfinite(got.out.data_as<float>()[e]));
  }
  options.kernel = "decode_scalar";
  try {
    attention_cached(q.view(), cache, ids, options);
    ADD_FAILURE() << "decode_scalar ran scores beyond float32";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("beyond float32's range"), std::string::npos) << e.what();
  }
}

// V at float32's limit in an int8 cache: the block's 127 · scale must not pass FLT_MAX (it did
// for amax = FLT_MAX, whose scale rounded up), so the answer is finite and equals plain
// attention on the dequantised rows, as plain attention on FLT_MAX itself is finite. One key:
// its value row is the output.
TEST(CachedAttentionRange, Int8AtFloat32sLimitIsFiniteAndMatchesPlainAttention) {
  KVCache cache(KVCacheOptions{1, 4, 40, CacheStorage::kInt8, 8, 0, 0});
  const SequenceId id = cache.add_sequence();
  const Tensor k = random_tensor(DType::kF32, {1, 1, 4}, 1);
  Tensor v = random_tensor(DType::kF32, {1, 1, 40}, 2);
  v.data_as<float>()[0] = std::numeric_limits<float>::max();
  v.data_as<float>()[33] = -std::numeric_limits<float>::max();
  cache.append(id, k.view(), v.view());
  const Tensor q = random_tensor(DType::kF32, {2, 1, 4}, 3);
  const std::vector<SequenceId> ids{id};
  const AttentionResult got = attention_cached(q.view(), cache, ids, {});
  const Tensor kg = cache.gather(id, false, DType::kF64);
  const Tensor vg = cache.gather(id, true, DType::kF64);
  const AttentionResult want = attention(q.view(), kg.view(), vg.view(), {});
  ASSERT_EQ(got.out.numel(), want.out.numel());
  for (std::int64_t e = 0; e < got.out.numel(); ++e) {
    const float x = got.out.data_as<float>()[e];
    EXPECT_TRUE(std::isfinite(x)) << e;
    EXPECT_EQ(x, want.out.data_as<float>()[e]) << e;
  }
  EXPECT_NEAR(got.out.data_as<float>()[0], std::numeric_limits<float>::max(), 1e32);
}

}  // namespace
}  // namespace qkv::testing
