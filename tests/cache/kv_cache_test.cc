// qkv::KVCache: rows across page edges in every storage type, strided and float64 inputs, forks
// and copy on write, remove, forget_before, capacity, every error, and the pages read in place
// through PageLayout as the decode kernels read them.
#include "qkv/kv_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cache/kv_cache_impl.h"
#include "cache/page_layout.h"
#include "core/half.h"
#include "core/mask_rule.h"
#include "qkv/error.h"
#include "support/test_support.h"

namespace qkv {
namespace {

using Rows = std::vector<std::vector<std::vector<double>>>;  // [head][row][column]

// quantise.h's block scale: amax / 127, one float step lower where 127 · scale passes FLT_MAX.
float int8_rule_scale(float amax) {
  const float scale = amax / 127.0f;
  return 127.0 * scale > 3.4028234663852886e38 ? std::nextafter(scale, 0.0f) : scale;
}

// What the cache should hand back for one row of inputs, recomputed here from the rule in
// quantise.h rather than through the cache's own code.
std::vector<double> stored_row(CacheStorage storage, const std::vector<double>& x) {
  std::vector<double> out(x.size());
  std::vector<float> f(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) f[i] = static_cast<float>(x[i]);
  switch (storage) {
    case CacheStorage::kF32:
      for (std::size_t i = 0; i < x.size(); ++i) out[i] = f[i];
      break;
    case CacheStorage::kBF16:
      for (std::size_t i = 0; i < x.size(); ++i) {
        out[i] = core::bf16_to_float(core::float_to_bf16(f[i]));
      }
      break;
    case CacheStorage::kF16:
      for (std::size_t i = 0; i < x.size(); ++i) {
        out[i] = core::f16_to_float(core::float_to_f16(f[i]));
      }
      break;
    case CacheStorage::kInt8:
      for (std::size_t begin = 0; begin < x.size(); begin += 32) {
        const std::size_t end = std::min(x.size(), begin + 32);
        float amax = 0.0f;
        for (std::size_t i = begin; i < end; ++i) amax = std::max(amax, std::fabs(f[i]));
        const float scale = int8_rule_scale(amax);
        for (std::size_t i = begin; i < end; ++i) {
          double q = 0.0;
          if (scale != 0.0f) {
            const float t = f[i] / scale;
            // Half away from zero, written out rather than with std::round.
            q = std::floor(std::fabs(static_cast<double>(t)) + 0.5);
            q = std::min(q, 127.0);
            if (t < 0) q = -q;
          }
          out[i] = q * static_cast<double>(scale);
        }
      }
      break;
  }
  return out;
}

// The block scales of one row under the int8 rule.
std::vector<double> row_scales(const std::vector<double>& x) {
  std::vector<double> scales;
  for (std::size_t begin = 0; begin < x.size(); begin += 32) {
    float amax = 0.0f;
    for (std::size_t i = begin; i < std::min(x.size(), begin + 32); ++i) {
      amax = std::max(amax, std::fabs(static_cast<float>(x[i])));
    }
    scales.push_back(int8_rule_scale(amax));
  }
  return scales;
}

double at(const TensorView& view, const std::vector<std::int64_t>& index) {
  std::int64_t offset = 0;
  for (std::size_t a = 0; a < index.size(); ++a) offset += index[a] * view.strides[a];
  return core::load_real(view.data, view.dtype, offset);
}

// A sequence's expected contents: every row appended, and where the stored rows start.
struct Expected {
  Rows k, v;
  std::int64_t first = 0;

  explicit Expected(std::int64_t hkv = 1)
      : k(static_cast<std::size_t>(hkv)), v(static_cast<std::size_t>(hkv)) {}
  std::int64_t length() const { return static_cast<std::int64_t>(k[0].size()); }

  // Takes the rows of a [Hkv, n, width] (or [n, width]) view.
  static void add(Rows& rows, const TensorView& view) {
    const bool rank2 = view.rank() == 2;
    const std::int64_t hkv = rank2 ? 1 : view.shape[0];
    for (std::int64_t h = 0; h < hkv; ++h) {
      for (std::int64_t i = 0; i < view.dim(-2); ++i) {
        std::vector<double> row;
        for (std::int64_t c = 0; c < view.dim(-1); ++c) {
          row.push_back(rank2 ? at(view, {i, c}) : at(view, {h, i, c}));
        }
        rows[static_cast<std::size_t>(h)].push_back(row);
      }
    }
  }
  void add(const TensorView& kv, const TensorView& vv) {
    add(k, kv);
    add(v, vv);
  }
};

// gather() equals the rule applied to the inputs, exactly, in float64 and float32.
void expect_gather(const KVCache& cache, SequenceId seq, const Expected& e) {
  ASSERT_EQ(cache.length(seq), e.length());
  ASSERT_EQ(cache.first_stored_row(seq), e.first);
  const CacheStorage storage = cache.options().storage;
  for (bool values : {false, true}) {
    const Rows& rows = values ? e.v : e.k;
    const std::int64_t width = values ? cache.options().dv : cache.options().d;
    const Tensor g64 = cache.gather(seq, values, DType::kF64);
    const Tensor g32 = cache.gather(seq, values, DType::kF32);
    const std::int64_t n = e.length() - e.first;
    ASSERT_EQ(g64.shape(), (Shape{cache.options().kv_heads, n, width}));
    ASSERT_EQ(g32.shape(), g64.shape());
    for (std::int64_t h = 0; h < cache.options().kv_heads; ++h) {
      for (std::int64_t i = 0; i < n; ++i) {
        const std::vector<double> want = stored_row(
            storage, rows[static_cast<std::size_t>(h)][static_cast<std::size_t>(e.first + i)]);
        for (std::int64_t c = 0; c < width; ++c) {
          const std::int64_t flat = (h * n + i) * width + c;
          ASSERT_EQ(g64.data_as<double>()[flat], want[static_cast<std::size_t>(c)])
              << (values ? "V" : "K") << " head " << h << " row " << e.first + i << " col " << c;
          ASSERT_EQ(g32.data_as<float>()[flat],
                    static_cast<float>(want[static_cast<std::size_t>(c)]));
        }
      }
    }
  }
}

KVCacheOptions options_for(CacheStorage storage, std::int64_t hkv, std::int64_t d, std::int64_t dv,
                           std::int64_t page_rows) {
  KVCacheOptions o;
  o.storage = storage;
  o.kv_heads = hkv;
  o.d = d;
  o.dv = dv;
  o.page_rows = page_rows;
  return o;
}

// Appends n random rows (values in [-scale, scale)) and records them.
void append_random(KVCache& cache, SequenceId seq, Expected& e, std::int64_t n, std::uint64_t seed,
                   double scale = 1.0, DType dtype = DType::kF32) {
  const KVCacheOptions& o = cache.options();
  const Tensor k = testing::random_tensor(dtype, {o.kv_heads, n, o.d}, seed, -scale, scale);
  const Tensor v = testing::random_tensor(dtype, {o.kv_heads, n, o.dv}, seed + 1, -scale, scale);
  cache.append(seq, k.view(), v.view());
  e.add(k.view(), v.view());
}

std::int64_t pages_for(std::int64_t rows, std::int64_t page_rows) {
  return (rows + page_rows - 1) / page_rows;
}

// Runs `f`, which must throw qkv::Error with this subject and a one-line message; returns it.
template <typename F>
std::string error_of(F&& f, const std::string& subject) {
  try {
    f();
  } catch (const Error& error) {
    EXPECT_EQ(error.subject(), subject) << error.what();
    const std::string what = error.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    EXPECT_EQ(what.rfind(subject + ": ", 0), 0u) << what;
    return what;
  }
  ADD_FAILURE() << "no qkv::Error (subject " << subject << ")";
  return "";
}

// The view of a tensor without its name, so that errors fall back to "k" and "v".
TensorView unnamed(const Tensor& tensor) {
  TensorView view = tensor.view();
  view.name.clear();
  return view;
}

const CacheStorage kAllStorage[] = {CacheStorage::kF32, CacheStorage::kBF16, CacheStorage::kF16,
                                    CacheStorage::kInt8};

class Storage : public ::testing::TestWithParam<CacheStorage> {};

INSTANTIATE_TEST_SUITE_P(All, Storage, ::testing::ValuesIn(kAllStorage),
                         [](const auto& param_info) {
                           return cache_storage_name(param_info.param);
                         });

TEST_P(Storage, AppendsAcrossPageEdgesGatherTheRuleExactly) {
  // d = 40: int8 rows of one full block and one short block of 8; dv = 7: one short block.
  KVCache cache(options_for(GetParam(), 2, 40, 7, 4));
  const SequenceId seq = cache.add_sequence();
  Expected e(2);
  std::uint64_t seed = 10;
  for (std::int64_t n : {1, 3, 5, 9, 1, 4}) {
    append_random(cache, seq, e, n, seed += 2, 3.0);
    expect_gather(cache, seq, e);
    EXPECT_EQ(cache.pages_in_use(), pages_for(e.length(), 4));
    EXPECT_EQ(cache.bytes_in_use(),
              static_cast<std::uint64_t>(cache.pages_in_use() * cache.page_bytes()));
  }
  EXPECT_EQ(e.length(), 23);
}

TEST_P(Storage, SnapshotPagesReadThroughPageLayoutAgreeWithGather) {
  const KVCacheOptions o = options_for(GetParam(), 3, 40, 33, 5);
  KVCache cache(o);
  const SequenceId parent = cache.add_sequence();
  Expected ep(3);
  append_random(cache, parent, ep, 12, 100, 2.0);
  const SequenceId child = cache.fork(parent);
  Expected ec = ep;
  append_random(cache, child, ec, 4, 200, 2.0);
  append_random(cache, parent, ep, 9, 300, 2.0);
  cache.forget_before(parent, 7);
  ep.first = 7;

  cache::PageLayout layout;
  layout.storage = o.storage;
  layout.hkv = o.kv_heads;
  layout.d = o.d;
  layout.dv = o.dv;
  layout.page_rows = o.page_rows;
  EXPECT_EQ(layout.page_bytes(), cache.page_bytes());
  const std::int64_t bytes = cache::storage_bytes(o.storage);
  for (SequenceId seq : {parent, child}) {
    const cache::SequenceSnapshot snap = cache.impl().snapshot(seq);
    EXPECT_EQ(snap.length, cache.length(seq));
    EXPECT_EQ(snap.first_row, cache.first_stored_row(seq));
    EXPECT_EQ(snap.first_page_row % o.page_rows, 0);
    EXPECT_LE(snap.first_page_row, snap.first_row);
    EXPECT_EQ(snap.page_count, pages_for(snap.length - snap.first_page_row, o.page_rows));
    for (std::int64_t p = 0; p < snap.page_count; ++p) {
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(snap.pages[p]) % 64, 0u);
    }
    for (bool values : {false, true}) {
      const std::int64_t width = values ? o.dv : o.d;
      const std::int64_t blocks = values ? layout.v_blocks() : layout.k_blocks();
      const Tensor g = cache.gather(seq, values);
      const std::int64_t n = snap.length - snap.first_row;
      for (std::int64_t h = 0; h < o.kv_heads; ++h) {
        const std::int64_t head = values ? layout.v_offset(h) : layout.k_offset(h);
        const std::int64_t scale_head =
            values ? layout.v_scale_offset(h) : layout.k_scale_offset(h);
        for (std::int64_t row = snap.first_row; row < snap.length; ++row) {
          const std::byte* page = snap.pages[(row - snap.first_page_row) / o.page_rows];
          const std::int64_t r = row % o.page_rows;
          const std::byte* data = page + head + r * width * bytes;
          for (std::int64_t c = 0; c < width; ++c) {
            double value = 0.0;
            switch (o.storage) {
              case CacheStorage::kF32: {
                float f;
                std::memcpy(&f, data + c * 4, 4);
                value = f;
                break;
              }
              case CacheStorage::kBF16:
              case CacheStorage::kF16: {
                std::uint16_t bits;
                std::memcpy(&bits, data + c * 2, 2);
                value = o.storage == CacheStorage::kBF16 ? core::bf16_to_float(bits)
                                                         : core::f16_to_float(bits);
                break;
              }
              case CacheStorage::kInt8: {
                float scale;
                std::memcpy(&scale, page + scale_head + (r * blocks + c / 32) * 4, 4);
                value = static_cast<double>(static_cast<std::int8_t>(data[c])) *
                        static_cast<double>(scale);
                break;
              }
            }
            ASSERT_EQ(value, g.data_as<double>()[(h * n + row - snap.first_row) * width + c])
                << "sequence " << seq << (values ? " V" : " K") << " head " << h << " row " << row
                << " col " << c;
          }
        }
      }
    }
  }
  expect_gather(cache, parent, ep);
  expect_gather(cache, child, ec);
}

TEST_P(Storage, ForksShareCopyOnWriteIncludingAPartialPage) {
  KVCache cache(options_for(GetParam(), 2, 6, 5, 4));
  const SequenceId parent = cache.add_sequence();
  Expected ep(2);
  append_random(cache, parent, ep, 6, 1);  // page 1 holds 2 of 4 rows
  const SequenceId child = cache.fork(parent);
  EXPECT_NE(child, parent);
  Expected ec = ep;
  EXPECT_EQ(cache.pages_in_use(), 2);  // shared pages count once
  expect_gather(cache, child, ec);

  append_random(cache, child, ec, 1, 2);  // copies the shared partial page
  EXPECT_EQ(cache.pages_in_use(), 3);
  expect_gather(cache, parent, ep);
  expect_gather(cache, child, ec);

  append_random(cache, parent, ep, 1, 3);  // the parent now holds its page alone: no copy
  EXPECT_EQ(cache.pages_in_use(), 3);
  expect_gather(cache, parent, ep);
  expect_gather(cache, child, ec);

  append_random(cache, parent, ep, 7, 4);
  append_random(cache, child, ec, 2, 5);
  EXPECT_EQ(cache.pages_in_use(),
            1 + pages_for(ep.length(), 4) - 1 + pages_for(ec.length(), 4) - 1);
  expect_gather(cache, parent, ep);
  expect_gather(cache, child, ec);

  // A fork at a page edge shares full pages only: appending copies nothing.
  const SequenceId edge_parent = cache.add_sequence();
  Expected ee(2);
  append_random(cache, edge_parent, ee, 8, 6);
  const SequenceId edge_child = cache.fork(edge_parent);
  Expected eec = ee;
  const std::int64_t before = cache.pages_in_use();
  append_random(cache, edge_child, eec, 1, 7);
  EXPECT_EQ(cache.pages_in_use(), before + 1);
  expect_gather(cache, edge_parent, ee);
  expect_gather(cache, edge_child, eec);
}

TEST(KVCache, RemoveFreesOnlyUnsharedPagesAndIdsAreNeverReused) {
  KVCache cache(options_for(CacheStorage::kF32, 1, 3, 3, 4));
  const SequenceId a = cache.add_sequence();
  EXPECT_EQ(a, 0);
  Expected ea(1);
  append_random(cache, a, ea, 10, 1);
  const SequenceId b = cache.fork(a);
  Expected eb = ea;
  append_random(cache, b, eb, 7, 2);  // copies page 2, adds page 3 and 4
  EXPECT_EQ(cache.pages_in_use(), 3 + 3);
  EXPECT_EQ(cache.sequences(), (std::vector<SequenceId>{a, b}));

  cache.remove(b);
  EXPECT_FALSE(cache.contains(b));
  EXPECT_TRUE(cache.contains(a));
  EXPECT_EQ(cache.pages_in_use(), 3);
  expect_gather(cache, a, ea);

  const SequenceId c = cache.add_sequence();
  EXPECT_EQ(c, 2);  // b's id is not reused
  Expected ec(1);
  append_random(cache, c, ec, 5, 3);  // reuses freed pages
  EXPECT_EQ(cache.pages_in_use(), 5);
  expect_gather(cache, c, ec);
  expect_gather(cache, a, ea);

  cache.remove(a);
  cache.remove(c);
  EXPECT_EQ(cache.pages_in_use(), 0);
  EXPECT_EQ(cache.bytes_in_use(), 0u);
  EXPECT_TRUE(cache.sequences().empty());
  EXPECT_EQ(cache.add_sequence(), 3);
}

TEST(KVCache, ForgetBeforeFreesWholePagesOnly) {
  KVCache cache(options_for(CacheStorage::kF32, 2, 3, 2, 4));
  const SequenceId seq = cache.add_sequence();
  Expected e(2);
  append_random(cache, seq, e, 10, 1);
  EXPECT_EQ(cache.pages_in_use(), 3);

  cache.forget_before(seq, 5);  // page 0 (rows 0-3) goes; page 1 keeps row 4, now forgotten
  e.first = 5;
  EXPECT_EQ(cache.pages_in_use(), 2);
  expect_gather(cache, seq, e);
  cache::SequenceSnapshot snap = cache.impl().snapshot(seq);
  EXPECT_EQ(snap.first_page_row, 4);
  EXPECT_EQ(snap.first_row, 5);
  EXPECT_EQ(snap.page_count, 2);

  cache.forget_before(seq, 3);  // before first_stored_row: nothing changes
  cache.forget_before(seq, 5);
  EXPECT_EQ(cache.first_stored_row(seq), 5);
  EXPECT_EQ(cache.pages_in_use(), 2);

  cache.forget_before(seq, 10);  // page 2 (rows 8-11) still has room for rows 10 and 11
  e.first = 10;
  EXPECT_EQ(cache.pages_in_use(), 1);
  expect_gather(cache, seq, e);  // no rows

  append_random(cache, seq, e, 2, 2);  // rows 10, 11 fill page 2
  EXPECT_EQ(cache.pages_in_use(), 1);
  expect_gather(cache, seq, e);
  cache.forget_before(seq, 12);
  e.first = 12;
  EXPECT_EQ(cache.pages_in_use(), 0);
  snap = cache.impl().snapshot(seq);
  EXPECT_EQ(snap.page_count, 0);
  EXPECT_EQ(snap.first_page_row, 12);
  expect_gather(cache, seq, e);

  append_random(cache, seq, e, 6, 3);
  EXPECT_EQ(cache.pages_in_use(), 2);
  expect_gather(cache, seq, e);

  const std::string low = error_of([&] { cache.forget_before(seq, -1); }, "sequence 0");
  EXPECT_NE(low.find("-1"), std::string::npos) << low;
  const std::string high = error_of([&] { cache.forget_before(seq, 19); }, "sequence 0");
  EXPECT_NE(high.find("18"), std::string::npos) << high;
  expect_gather(cache, seq, e);
}

TEST(KVCache, ForgetBeforeOnAForkKeepsTheSharedPagesOfTheParent) {
  KVCache cache(options_for(CacheStorage::kBF16, 1, 4, 4, 4));
  const SequenceId parent = cache.add_sequence();
  Expected ep(1);
  append_random(cache, parent, ep, 9, 1);
  const SequenceId child = cache.fork(parent);
  Expected ec = ep;
  cache.forget_before(child, 8);
  ec.first = 8;
  EXPECT_EQ(cache.pages_in_use(), 3);
  expect_gather(cache, parent, ep);
  expect_gather(cache, child, ec);
  cache.forget_before(parent, 8);
  ep.first = 8;
  EXPECT_EQ(cache.pages_in_use(), 1);
  append_random(cache, child, ec, 1, 2);  // page 2 is shared and partial: copied
  EXPECT_EQ(cache.pages_in_use(), 2);
  expect_gather(cache, parent, ep);
  expect_gather(cache, child, ec);
}

TEST(KVCache, Float64AndSixteenBitInputsAreRoundedToFloatFirst) {
  KVCache f32(options_for(CacheStorage::kF32, 2, 5, 3, 4));
  KVCache f16(options_for(CacheStorage::kF16, 2, 5, 3, 4));
  KVCache i8(options_for(CacheStorage::kInt8, 2, 5, 3, 4));
  for (KVCache* cache : {&f32, &f16, &i8}) {
    const SequenceId seq = cache->add_sequence();
    Expected e(2);
    append_random(*cache, seq, e, 6, 1, 1.0, DType::kF64);
    expect_gather(*cache, seq, e);
    // bfloat16 and float16 inputs.
    for (DType dtype : {DType::kBF16, DType::kF16}) {
      Tensor k(dtype, {2, 3, 5});
      Tensor v(dtype, {2, 3, 3});
      std::mt19937 rng(7);
      std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
      for (Tensor* t : {&k, &v}) {
        for (std::int64_t i = 0; i < t->numel(); ++i) {
          t->data_as<std::uint16_t>()[i] = dtype == DType::kBF16 ? core::float_to_bf16(dist(rng))
                                                                 : core::float_to_f16(dist(rng));
        }
      }
      cache->append(seq, k.view(), v.view());
      e.add(k.view(), v.view());
      expect_gather(*cache, seq, e);
    }
  }
  // A float64 input that is not a float is rounded once to float, then stored.
  const SequenceId seq = f32.add_sequence();
  const double x = 1.0 + std::ldexp(1.0, -30);
  Tensor k(DType::kF64, {2, 1, 5});
  Tensor v(DType::kF64, {2, 1, 3});
  for (std::int64_t i = 0; i < k.numel(); ++i) k.data_as<double>()[i] = x;
  f32.append(seq, k.view(), v.view());
  EXPECT_EQ(f32.gather(seq, false).data_as<double>()[0], 1.0);
}

TEST(KVCache, StridedViewsAreReadThroughTheirStrides) {
  for (CacheStorage storage : kAllStorage) {
    KVCache cache(options_for(storage, 2, 4, 3, 4));
    const SequenceId seq = cache.add_sequence();
    Expected e(2);
    // K stored [n, Hkv, D] and seen as [Hkv, n, D] (a transpose); V every other column of a
    // [Hkv, n, 2 Dv] tensor, read backwards along the rows.
    const Tensor kb = testing::random_tensor(DType::kF32, {5, 2, 4}, 1, -2, 2);
    const Tensor vb = testing::random_tensor(DType::kF64, {2, 5, 6}, 2, -2, 2);
    TensorView k{kb.data(), DType::kF32, {2, 5, 4}, {4, 8, 1}, "k"};
    TensorView v{vb.data_as<double>() + 4 * 6, DType::kF64, {2, 5, 3}, {30, -6, 2}, "v"};
    cache.append(seq, k, v);
    e.add(k, v);
    expect_gather(cache, seq, e);
    EXPECT_EQ(e.k[1][3][2], kb.data_as<float>()[3 * 8 + 1 * 4 + 2]);
    EXPECT_EQ(e.v[1][0][1], vb.data_as<double>()[1 * 30 + 4 * 6 + 2]);
  }
  // One kv head: rank-2 views, here a column slice of a wider matrix.
  KVCache cache(options_for(CacheStorage::kF32, 1, 3, 2, 4));
  const SequenceId seq = cache.add_sequence();
  Expected e(1);
  const Tensor wide = testing::random_tensor(DType::kF32, {7, 10}, 3);
  TensorView k{wide.data_as<float>() + 1, DType::kF32, {7, 3}, {10, 1}, "k"};
  TensorView v{wide.data_as<float>() + 5, DType::kF32, {7, 2}, {10, 1}, "v"};
  cache.append(seq, k, v);
  e.add(k, v);
  expect_gather(cache, seq, e);
}

TEST(KVCache, AppendingNoRowsChangesNothing) {
  KVCache cache(options_for(CacheStorage::kInt8, 2, 4, 3, 4));
  const SequenceId seq = cache.add_sequence();
  Expected e(2);
  append_random(cache, seq, e, 0, 1);
  EXPECT_EQ(cache.length(seq), 0);
  EXPECT_EQ(cache.pages_in_use(), 0);
  expect_gather(cache, seq, e);
  append_random(cache, seq, e, 4, 2);
  const SequenceId child = cache.fork(seq);
  Expected ec = e;
  append_random(cache, child, ec, 0, 3);
  EXPECT_EQ(cache.pages_in_use(), 1);
  expect_gather(cache, seq, e);
  expect_gather(cache, child, ec);
  const Tensor k(DType::kF32, {2, 0, 4});
  const Tensor v(DType::kF32, {2, 0, 3});
  error_of([&] { cache.append(99, k.view(), v.view()); }, "sequence 99");
}

TEST(KVCache, ZeroWidthKeysOrValues) {
  for (CacheStorage storage : kAllStorage) {
    for (auto [d, dv] : {std::pair{0, 5}, std::pair{5, 0}, std::pair{0, 0}}) {
      KVCache cache(options_for(storage, 2, d, dv, 4));
      EXPECT_GE(cache.page_bytes(), 64);
      const SequenceId seq = cache.add_sequence();
      Expected e(2);
      append_random(cache, seq, e, 3, 1);
      append_random(cache, seq, e, 6, 2);
      EXPECT_EQ(cache.pages_in_use(), 3);
      expect_gather(cache, seq, e);
    }
  }
}

TEST(KVCache, Int8RoundsHalfAwayFromZeroAndStaysWithinHalfAScale) {
  KVCache cache(options_for(CacheStorage::kInt8, 1, 40, 32, 8));
  const SequenceId seq = cache.add_sequence();
  // Row 0: amax 127 gives scale 1, so x / scale is x itself: the ties show the rounding.
  // Its second block (8 values) is all zero: scale 0, values 0.
  Tensor k(DType::kF32, {1, 3, 40});
  Tensor v(DType::kF32, {1, 3, 32});
  float* row0 = k.data_as<float>();
  const float ties[] = {127.0f, 0.5f, -2.5f, 1.5f, -0.5f, 2.5f, -126.5f};
  std::copy(std::begin(ties), std::end(ties), row0);
  // Rows 1 and 2: random magnitudes over several octaves.
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (std::int64_t i = 40; i < 120; ++i) {
    k.data_as<float>()[i] = dist(rng) * std::ldexp(1.0f, static_cast<int>(i % 13) - 6);
  }
  for (std::int64_t i = 0; i < v.numel(); ++i) v.data_as<float>()[i] = dist(rng) * 1e-3f;
  cache.append(seq, k.view(), v.view());

  const Tensor g = cache.gather(seq, false);
  const double want[] = {127, 1, -3, 2, -1, 3, -127};
  for (int i = 0; i < 7; ++i) EXPECT_EQ(g.data_as<double>()[i], want[i]) << i;
  for (int i = 32; i < 40; ++i) EXPECT_EQ(g.data_as<double>()[i], 0.0);

  for (std::int64_t r = 1; r < 3; ++r) {
    std::vector<double> x(k.data_as<float>() + r * 40, k.data_as<float>() + r * 40 + 40);
    const std::vector<double> scales = row_scales(x);
    ASSERT_EQ(scales.size(), 2u);
    for (std::int64_t c = 0; c < 40; ++c) {
      const double scale = scales[static_cast<std::size_t>(c / 32)];
      const double got = g.data_as<double>()[r * 40 + c];
      // q · scale to within half a scale, plus the float rounding of x / scale (127 · 2^-24).
      EXPECT_LE(std::fabs(got - x[static_cast<std::size_t>(c)]), scale * (0.5 + 1e-5))
          << "row " << r << " col " << c;
      // And exactly an integer in [-127, 127] times the scale.
      const double q = got / scale;
      EXPECT_EQ(q, std::round(q));
      EXPECT_LE(std::fabs(q), 127.0);
    }
  }
}

TEST(KVCache, CapacityInPagesRefusesTheAppendThatWouldPassAndChangesNothing) {
  KVCacheOptions o = options_for(CacheStorage::kF32, 2, 4, 4, 4);
  o.max_pages = 3;
  KVCache cache(o);
  const SequenceId seq = cache.add_sequence();
  Expected e(2);
  append_random(cache, seq, e, 6, 1);
  const Tensor k = testing::random_tensor(DType::kF32, {2, 7, 4}, 2);
  const Tensor v = testing::random_tensor(DType::kF32, {2, 7, 4}, 3);
  const std::string what =
      error_of([&] { cache.append(seq, k.view(), v.view()); }, "KVCache capacity");
  EXPECT_NE(what.find("2 pages"), std::string::npos) << what;  // in use
  EXPECT_NE(what.find("at most 3 pages"), std::string::npos) << what;
  EXPECT_EQ(cache.pages_in_use(), 2);
  expect_gather(cache, seq, e);
  append_random(cache, seq, e, 6, 4);  // exactly 3 pages
  EXPECT_EQ(cache.pages_in_use(), 3);
  expect_gather(cache, seq, e);

  // The copy of a shared partial page counts.
  KVCache shared(o);
  const SequenceId parent = shared.add_sequence();
  Expected ep(2);
  append_random(shared, parent, ep, 5, 5);  // 2 pages, the second partial
  const SequenceId a = shared.fork(parent);
  const SequenceId b = shared.fork(parent);
  Expected ea = ep;
  append_random(shared, a, ea, 1, 6);  // the copy: 3 pages
  EXPECT_EQ(shared.pages_in_use(), 3);
  const Tensor k1 = testing::random_tensor(DType::kF32, {2, 1, 4}, 7);
  const Tensor v1 = testing::random_tensor(DType::kF32, {2, 1, 4}, 8);
  error_of([&] { shared.append(b, k1.view(), v1.view()); }, "KVCache capacity");
  EXPECT_EQ(shared.length(b), 5);
  EXPECT_EQ(shared.pages_in_use(), 3);
  expect_gather(shared, b, ep);
  expect_gather(shared, a, ea);
  shared.remove(parent);  // b then shares page 1 with nobody: appending copies nothing
  Expected eb = ep;
  append_random(shared, b, eb, 1, 9);
  EXPECT_EQ(shared.pages_in_use(), 3);
  expect_gather(shared, b, eb);
}

TEST(KVCache, CapacityInBytes) {
  KVCacheOptions o = options_for(CacheStorage::kBF16, 2, 8, 8, 4);
  KVCache probe(o);
  o.max_bytes = static_cast<std::uint64_t>(2 * probe.page_bytes() + 10);
  KVCache cache(o);
  const SequenceId seq = cache.add_sequence();
  Expected e(2);
  append_random(cache, seq, e, 8, 1);
  EXPECT_EQ(cache.bytes_in_use(), static_cast<std::uint64_t>(2 * cache.page_bytes()));
  const Tensor k = testing::random_tensor(DType::kF32, {2, 1, 8}, 2);
  const Tensor v = testing::random_tensor(DType::kF32, {2, 1, 8}, 3);
  const std::string what =
      error_of([&] { cache.append(seq, k.view(), v.view()); }, "KVCache capacity");
  EXPECT_NE(what.find(std::to_string(o.max_bytes) + " bytes"), std::string::npos) << what;
  EXPECT_EQ(cache.length(seq), 8);
  EXPECT_EQ(cache.pages_in_use(), 2);
  expect_gather(cache, seq, e);
  // Freeing a page makes room again.
  cache.forget_before(seq, 4);
  e.first = 4;
  append_random(cache, seq, e, 4, 4);
  expect_gather(cache, seq, e);
}

TEST(KVCache, APageThatCannotBeAllocatedIsOneErrorAndChangesNothing) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizers' allocators abort on a 128 TiB request instead of failing it";
#else
  // 2^43 rows of 4 float32 values: a page of 2^47 bytes (128 TiB), accepted by the constructor
  // but more than a 47-bit user address space can map.
  KVCache cache(options_for(CacheStorage::kF32, 1, 4, 0, std::int64_t{1} << 43));
  EXPECT_EQ(cache.page_bytes(), std::int64_t{1} << 47);
  const SequenceId seq = cache.add_sequence();
  const Tensor k = testing::random_tensor(DType::kF32, {1, 2, 4}, 1);
  const Tensor v(DType::kF32, {1, 2, 0});
  const std::string what = error_of([&] { cache.append(seq, k.view(), v.view()); }, "KVCache");
  EXPECT_NE(what.find("out of memory"), std::string::npos) << what;
  EXPECT_EQ(cache.length(seq), 0);
  EXPECT_EQ(cache.pages_in_use(), 0);
  EXPECT_EQ(cache.impl().snapshot(seq).page_count, 0);
#endif
}

TEST(KVCache, ConstructorRefusesBadOptions) {
  const auto bad = [](auto change, const std::string& word) {
    KVCacheOptions o = options_for(CacheStorage::kF32, 2, 4, 4, 4);
    change(o);
    const std::string what = error_of([&] { KVCache cache(o); }, "KVCache");
    EXPECT_NE(what.find(word), std::string::npos) << what;
  };
  bad([](KVCacheOptions& o) { o.kv_heads = 0; }, "kv_heads");
  bad([](KVCacheOptions& o) { o.page_rows = 0; }, "page_rows");
  bad([](KVCacheOptions& o) { o.page_rows = -3; }, "page_rows");
  bad([](KVCacheOptions& o) { o.d = -1; }, "d must");
  bad([](KVCacheOptions& o) { o.dv = -1; }, "dv");
  bad([](KVCacheOptions& o) { o.max_pages = -1; }, "max_pages");
  bad(
      [](KVCacheOptions& o) {
        o.page_rows = std::int64_t{1} << 40;
        o.d = 1 << 20;
      },
      "2^48");
  bad(
      [](KVCacheOptions& o) {
        o.page_rows = std::int64_t{1} << 62;
        o.d = 1 << 20;
      },
      "2^48");
  bad([](KVCacheOptions& o) { o.kv_heads = std::int64_t{1} << 62; }, "2^48");
}

TEST(KVCache, BadInputsAreRefusedWithOneLineNamingTheViewAndChangeNothing) {
  KVCache cache(options_for(CacheStorage::kF16, 2, 4, 6, 4));
  const SequenceId seq = cache.add_sequence();
  Expected e(2);
  append_random(cache, seq, e, 3, 1);
  const Tensor k = testing::random_tensor(DType::kF32, {2, 3, 4}, 2);
  const Tensor v = testing::random_tensor(DType::kF32, {2, 3, 6}, 3);
  const auto refuse = [&](TensorView kv, TensorView vv, const std::string& subject,
                          const std::string& message) {
    const std::string what = error_of([&] { cache.append(seq, kv, vv); }, subject);
    EXPECT_EQ(what, subject + ": " + message);
    EXPECT_EQ(cache.pages_in_use(), 1);
    expect_gather(cache, seq, e);
  };
  const Tensor k8 = testing::random_tensor(DType::kF32, {8, 3, 64}, 4);
  refuse(unnamed(k8), unnamed(v), "k", "expected [Hkv=2, n, D=4], got [8, 3, 64]");
  const Tensor k2 = testing::random_tensor(DType::kF32, {3, 4}, 4);
  refuse(unnamed(k2), unnamed(v), "k", "expected [Hkv=2, n, D=4], got [3, 4]");
  const Tensor v4 = testing::random_tensor(DType::kF32, {2, 4, 6}, 4);
  refuse(unnamed(k), unnamed(v4), "v", "expected [Hkv=2, n=3, Dv=6] like k, got [2, 4, 6]");
  const Tensor v5 = testing::random_tensor(DType::kF32, {2, 3, 5}, 4);
  TensorView named = unnamed(v5);
  named.name = "values.npy";
  refuse(unnamed(k), named, "values.npy", "expected [Hkv=2, n=3, Dv=6] like k, got [2, 3, 5]");

  Tensor kb(DType::kBool, {2, 3, 4});
  const std::string bool_what = error_of([&] { cache.append(seq, unnamed(kb), unnamed(v)); }, "k");
  EXPECT_NE(bool_what.find("bool"), std::string::npos) << bool_what;
  // Integers are not values either: their bits must never be read as floats.
  for (const DType integer : {DType::kI32, DType::kI64}) {
    Tensor ki(integer, {2, 3, 4});
    const std::string int_what =
        error_of([&] { cache.append(seq, unnamed(ki), unnamed(v)); }, "k");
    EXPECT_NE(int_what.find(dtype_name(integer)), std::string::npos) << int_what;
    Tensor vi(integer, {2, 3, 6});
    error_of([&] { cache.append(seq, unnamed(k), unnamed(vi)); }, "v");
  }
  TensorView bad_strides = unnamed(k);
  bad_strides.strides.pop_back();
  error_of([&] { cache.append(seq, bad_strides, unnamed(v)); }, "k");

  Tensor kn = testing::random_tensor(DType::kF32, {2, 3, 4}, 5);
  kn.data_as<float>()[1 * 12 + 2 * 4 + 3] = std::nanf("");
  refuse(unnamed(kn), unnamed(v), "k", "NaN at [1, 2, 3] (cached values must be finite)");
  Tensor vi = testing::random_tensor(DType::kF64, {2, 3, 6}, 5);
  vi.data_as<double>()[5] = -INFINITY;
  refuse(unnamed(k), unnamed(vi), "v", "an infinity at [0, 0, 5] (cached values must be finite)");
  Tensor vr = testing::random_tensor(DType::kF64, {2, 3, 6}, 5);
  vr.data_as<double>()[2 * 6 + 5] = 70000;
  refuse(unnamed(k), unnamed(vr), "v", "value 70000 at [0, 2, 5] is outside float16's range");
  vr.data_as<double>()[2 * 6 + 5] = -65520;
  refuse(unnamed(k), unnamed(vr), "v", "value -65520 at [0, 2, 5] is outside float16's range");
  vr.data_as<double>()[2 * 6 + 5] = 65519.99;  // rounds to float 65519.9883: stored as 65504
  cache.append(seq, unnamed(k), unnamed(vr));
  e.add(unnamed(k), unnamed(vr));
  expect_gather(cache, seq, e);

  // Float32's range for the other storage types; one head takes rank 2 views too.
  KVCache f32(options_for(CacheStorage::kF32, 1, 2, 2, 4));
  const SequenceId s = f32.add_sequence();
  Tensor big = testing::random_tensor(DType::kF64, {2, 2}, 6);
  big.data_as<double>()[3] = 1e300;
  TensorView big_view = unnamed(big);
  big_view.name = "k.npy";
  const std::string what = error_of([&] { f32.append(s, big_view, unnamed(big)); }, "k.npy");
  EXPECT_EQ(what, "k.npy: value 1e+300 at [1, 1] is outside float32's range");
  const Tensor wrong = testing::random_tensor(DType::kF32, {2, 3}, 6);
  EXPECT_EQ(error_of([&] { f32.append(s, unnamed(wrong), unnamed(wrong)); }, "k"),
            "k: expected [Hkv=1, n, D=2] or [n, D=2], got [2, 3]");
  EXPECT_EQ(f32.length(s), 0);
  EXPECT_EQ(f32.pages_in_use(), 0);

  const std::string gather_what =
      error_of([&] { (void)cache.gather(seq, false, DType::kBool); }, "KVCache::gather");
  EXPECT_NE(gather_what.find("bool"), std::string::npos);
}

TEST(KVCache, UnknownSequenceInEveryMethod) {
  KVCache cache(options_for(CacheStorage::kF32, 1, 2, 2, 4));
  const SequenceId seq = cache.add_sequence();
  cache.remove(seq);
  const Tensor k = testing::random_tensor(DType::kF32, {1, 1, 2}, 1);
  const std::string subject = "sequence 0";
  const std::string message = "sequence 0: not in this cache";
  EXPECT_EQ(error_of([&] { cache.fork(seq); }, subject), message);
  EXPECT_EQ(error_of([&] { cache.remove(seq); }, subject), message);
  EXPECT_EQ(error_of([&] { cache.append(seq, k.view(), k.view()); }, subject), message);
  EXPECT_EQ(error_of([&] { cache.forget_before(seq, 0); }, subject), message);
  EXPECT_EQ(error_of([&] { (void)cache.length(seq); }, subject), message);
  EXPECT_EQ(error_of([&] { (void)cache.first_stored_row(seq); }, subject), message);
  EXPECT_EQ(error_of([&] { (void)cache.gather(seq, true); }, subject), message);
  EXPECT_EQ(error_of([&] { (void)cache.impl().snapshot(seq); }, subject), message);
  EXPECT_EQ(error_of([&] { (void)cache.length(-5); }, "sequence -5"),
            "sequence -5: not in this cache");
  EXPECT_FALSE(cache.contains(seq));
  EXPECT_EQ(cache.pages_in_use(), 0);
}

TEST(KVCache, ManySequencesOfDifferentLengthsInterleaved) {
  for (CacheStorage storage : {CacheStorage::kF32, CacheStorage::kInt8}) {
    KVCache cache(options_for(storage, 2, 8, 5, 16));
    std::mt19937_64 rng(42);
    std::vector<SequenceId> ids;
    std::vector<Expected> expected;
    std::vector<std::int64_t> target;
    for (int s = 0; s < 20; ++s) {
      ids.push_back(cache.add_sequence());
      expected.emplace_back(2);
      target.push_back(static_cast<std::int64_t>(rng() % 1001));
    }
    target[0] = 0;
    target[1] = 1000;
    std::uint64_t seed = 1000;
    for (bool busy = true; busy;) {
      busy = false;
      for (std::size_t s = 0; s < ids.size(); ++s) {
        const std::int64_t left = target[s] - expected[s].length();
        if (left <= 0 || rng() % 3 == 0) {
          busy = busy || left > 0;
          continue;
        }
        busy = true;
        const auto n = std::min<std::int64_t>(left, static_cast<std::int64_t>(rng() % 40));
        append_random(cache, ids[s], expected[s], n, seed += 2, 4.0);
      }
    }
    std::int64_t pages = 0;
    for (std::size_t s = 0; s < ids.size(); ++s) {
      EXPECT_EQ(cache.length(ids[s]), target[s]);
      pages += pages_for(target[s], 16);
      expect_gather(cache, ids[s], expected[s]);
    }
    EXPECT_EQ(cache.pages_in_use(), pages);
    for (std::size_t s = 0; s < ids.size(); s += 2) cache.remove(ids[s]);
    pages = 0;
    for (std::size_t s = 1; s < ids.size(); s += 2) {
      pages += pages_for(target[s], 16);
      expect_gather(cache, ids[s], expected[s]);
    }
    EXPECT_EQ(cache.pages_in_use(), pages);
  }
}

TEST(KVCache, MovesKeepTheSequences) {
  KVCache a(options_for(CacheStorage::kBF16, 1, 3, 3, 2));
  const SequenceId seq = a.add_sequence();
  Expected e(1);
  append_random(a, seq, e, 5, 1);
  KVCache b(std::move(a));
  expect_gather(b, seq, e);
  KVCache c(options_for(CacheStorage::kF32, 1, 1, 1, 1));
  c = std::move(b);
  expect_gather(c, seq, e);
  EXPECT_EQ(c.pages_in_use(), 3);
  EXPECT_EQ(c.options().storage, CacheStorage::kBF16);
}

}  // namespace
}  // namespace qkv
