// Fuzz target: KV cache appends of values at and past what each storage type holds (issue 22).
// The input picks the storage (f32, bf16, f16, int8), Hkv, D, Dv and the page size, then a few
// appends to one of two sequences, each of float32 or float64 rows whose magnitudes reach
// float32's limit, with chosen elements set to edge values: bfloat16's and float16's rounding
// edges, FLT_MAX, 1e39 (past float32), infinities, NaN, subnormals. Then attention over the cache.
//
// Checked against a rule written here from the formats, not from the cache's code: an append is
// accepted exactly when every value is finite and rounds to a finite value of the storage type
// (bf16 overflows from 2^128 - 2^119, f16 from 65520, f32 and int8 past FLT_MAX: int8's block
// scale holds every finite float32). A refusal is one line naming k or v and leaves the sequence
// as it was (length, pages, every stored bit); an accepted append holds only values finite in
// float32; and attention over the cache is finite.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/kv_cache.h"

namespace {

using qkv::fuzz::fail;

class Bytes {  // the input front to back; past its end, zeros
 public:
  Bytes(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  unsigned next() { return pos_ < size_ ? data_[pos_++] : 0u; }
  std::int64_t in(std::int64_t lo, std::int64_t hi) {  // [lo, hi]
    return lo + static_cast<std::int64_t>(next() % static_cast<unsigned>(hi - lo + 1));
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

struct Rng {
  std::uint64_t state;
  double uniform() {  // [-1, 1)
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return 2.0 * static_cast<double>(state >> 11) / 9007199254740992.0 - 1.0;
  }
};

constexpr double kFloatMax = std::numeric_limits<float>::max();
constexpr double kBf16Overflow = 0x1p128 - 0x1p119;  // halfway past bf16's largest, to even: inf
constexpr double kF16Overflow = 65520.0;

const double kEdges[] = {0.0,
                         1.0,
                         kFloatMax,
                         kBf16Overflow,
                         std::nextafter(kBf16Overflow, 0.0),
                         3.4e38,
                         kF16Overflow,
                         65504.0,
                         65519.99,
                         1e39,
                         INFINITY,
                         NAN,
                         0x1p-149,
                         0x1p-133,
                         3.3895313892515355e38,
                         std::nextafter(kFloatMax, INFINITY)};

// Whether the storage holds `x` (as the input dtype gives it) finitely.
bool storable(qkv::CacheStorage storage, double x) {
  if (!std::isfinite(x)) return false;
  const double magnitude = std::fabs(x);
  switch (storage) {
    case qkv::CacheStorage::kBF16:
      return magnitude < kBf16Overflow;
    case qkv::CacheStorage::kF16:
      return magnitude < kF16Overflow;
    case qkv::CacheStorage::kF32:
    case qkv::CacheStorage::kInt8:
      // Rounding to float32 overflows from FLT_MAX + half its last step.
      return magnitude < kFloatMax + 0x1p103;
  }
  return false;
}

qkv::Tensor rows(qkv::DType dtype, std::int64_t hkv, std::int64_t n, std::int64_t width, Rng& rng,
                 double range, const char* name) {
  qkv::Tensor t(dtype, {hkv, n, width}, name);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const double x = rng.uniform() * range;
    if (dtype == qkv::DType::kF32) {
      t.data_as<float>()[i] = static_cast<float>(x);
    } else {
      t.data_as<double>()[i] = x;
    }
  }
  return t;
}

double element(const qkv::Tensor& t, std::int64_t i) {
  return t.dtype() == qkv::DType::kF32 ? static_cast<double>(t.data_as<float>()[i])
                                       : t.data_as<double>()[i];
}

void set_element(qkv::Tensor& t, std::int64_t i, double x) {
  if (t.dtype() == qkv::DType::kF32) {
    t.data_as<float>()[i] = static_cast<float>(x);  // 1e39 becomes inf: refused as such
  } else {
    t.data_as<double>()[i] = x;
  }
}

std::vector<std::uint64_t> stored_bits(const qkv::KVCache& cache, qkv::SequenceId id) {
  std::vector<std::uint64_t> bits;
  for (const bool values : {false, true}) {
    const qkv::Tensor t = cache.gather(id, values, qkv::DType::kF64);
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      std::uint64_t b = 0;
      std::memcpy(&b, t.data_as<double>() + i, sizeof b);
      bits.push_back(b);
    }
  }
  return bits;
}

void check_held_finite(const qkv::KVCache& cache, qkv::SequenceId id) {
  for (const bool values : {false, true}) {
    const qkv::Tensor t = cache.gather(id, values, qkv::DType::kF64);
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      if (!(std::fabs(t.data_as<double>()[i]) <= kFloatMax)) {
        fail("the cache holds a value past float32's range after an accepted append");
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Bytes in(data, size);
  qkv::KVCacheOptions o;
  o.storage = static_cast<qkv::CacheStorage>(in.in(0, 3));
  o.kv_heads = in.in(1, 2);
  o.d = in.in(0, 40);
  o.dv = in.in(0, 40);
  o.page_rows = in.in(1, 5);
  Rng rng{in.next() * 0x9E3779B97F4A7C15ULL + 1};
  qkv::KVCache cache(o);
  const qkv::SequenceId ids[2] = {cache.add_sequence(), cache.add_sequence()};

  const double ranges[] = {1.0, 60000.0, 1e30, 3.3e38};
  const std::int64_t appends = in.in(0, 6);
  for (std::int64_t a = 0; a < appends; ++a) {
    const qkv::SequenceId id = ids[in.next() & 1u];
    const std::int64_t n = in.in(0, 4);
    const qkv::DType dtype = (in.next() & 1u) ? qkv::DType::kF64 : qkv::DType::kF32;
    const double range = ranges[in.in(0, 3)];
    qkv::Tensor k = rows(dtype, o.kv_heads, n, o.d, rng, range, "k");
    qkv::Tensor v = rows(dtype, o.kv_heads, n, o.dv, rng, range, "v");
    const std::int64_t edges = in.in(0, 3);
    for (std::int64_t e = 0; e < edges && k.numel() + v.numel() > 0; ++e) {
      const unsigned low = in.next();
      const unsigned high = in.next();
      const auto at = static_cast<std::int64_t>(low | high << 8) % (k.numel() + v.numel());
      const double edge = kEdges[in.in(0, sizeof kEdges / sizeof kEdges[0] - 1)];
      const double x = (in.next() & 1u) ? -edge : edge;
      if (at < k.numel()) {
        set_element(k, at, x);
      } else {
        set_element(v, at - k.numel(), x);
      }
    }
    bool all_storable = true;
    for (const qkv::Tensor* t : {&k, &v}) {
      for (std::int64_t i = 0; i < t->numel(); ++i) {
        all_storable = all_storable && storable(o.storage, element(*t, i));
      }
    }
    const std::int64_t length = cache.length(id);
    const std::int64_t pages = cache.pages_in_use();
    const std::vector<std::uint64_t> before = stored_bits(cache, id);
    try {
      cache.append(id, k.view(), v.view());
    } catch (const qkv::Error& error) {
      qkv::fuzz::check_one_line(error.what());
      const std::string what = error.what();
      if (what.rfind("k: ", 0) != 0 && what.rfind("v: ", 0) != 0) {
        fail("an append refusal that names neither k nor v: " + what);
      }
      if (all_storable) fail("an append of values the storage holds was refused: " + what);
      if (cache.length(id) != length || cache.pages_in_use() != pages ||
          stored_bits(cache, id) != before) {
        fail("a refused append changed the cache: " + what);
      }
      continue;
    }
    if (!all_storable) fail("an append of a value the storage cannot hold was accepted");
    check_held_finite(cache, id);
  }

  // Attention over what the cache holds (|q| < 1) is finite, whatever the magnitudes.
  const std::int64_t nq = in.in(0, 3);
  const std::int64_t heads = o.kv_heads * in.in(1, 2);
  qkv::Tensor q(qkv::DType::kF32, {2, heads, nq, o.d}, "q");
  for (std::int64_t i = 0; i < q.numel(); ++i) {
    q.data_as<float>()[i] = static_cast<float>(rng.uniform());
  }
  qkv::AttentionOptions options;
  options.causal = (in.next() & 1u) != 0;
  try {
    const qkv::AttentionResult result = qkv::attention_cached(q.view(), cache, ids, options);
    for (std::int64_t i = 0; i < result.out.numel(); ++i) {
      if (!std::isfinite(result.out.data_as<float>()[i])) {
        fail("attention over the cache gave a value that is not finite");
      }
    }
  } catch (const qkv::Error& error) {
    qkv::fuzz::check_one_line(error.what());
    fail(std::string("attention over a valid cache was refused: ") + error.what());
  }
  return 0;
}
