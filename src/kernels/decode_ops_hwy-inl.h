// The inner loops of the SIMD decode kernel (attention_fwd_decode_hwy.cc, whose comment works
// through the algorithm): K and V rows widened to float32 (into L1, or in registers as the loops
// load them), the dot products of a block of keys, P·V, and the check of plain K and V as those
// loops read them. Included once per Highway target
// inside qkv::kernels::HWY_NAMESPACE by that file only; hence the toggling guard.
#if defined(QKV_KERNELS_DECODE_OPS_HWY_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_KERNELS_DECODE_OPS_HWY_INL_H_
#undef QKV_KERNELS_DECODE_OPS_HWY_INL_H_
#else
#define QKV_KERNELS_DECODE_OPS_HWY_INL_H_
#endif

#include <cstring>
#include <limits>
#include <type_traits>

#include "core/half.h"
#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "kernels/decode_common.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace decode_hwy {

using decode::kBlockKeys;
using decode::KVType;
using D = hn::ScalableTag<float>;
using V = hn::Vec<D>;
constexpr std::int64_t kLanes = static_cast<std::int64_t>(hn::MaxLanes(D()));
static_assert(kBlockKeys % kLanes == 0, "a block of scores is a whole number of vectors");
constexpr float kInfF = std::numeric_limits<float>::infinity();

// dst[0, padded) = the stored row widened to float32, zero past `count`; elements `col`
// apart (1 for pages and dense rows, which take the vector paths).
template <KVType T>
HWY_INLINE void widen_row(const void* src, const float* scales, std::int64_t count,
                          std::int64_t col, std::int64_t padded, float* HWY_RESTRICT dst) {
  const D df;
  std::int64_t c = 0;
  if constexpr (T == KVType::kF32) {
    const auto* in = static_cast<const float*>(src);
    if (col == 1) {
      std::memcpy(dst, in, static_cast<std::size_t>(count) * 4);
      c = count;
    }
    for (; c < count; ++c) dst[c] = in[c * col];
  } else if constexpr (T == KVType::kF64) {
    const auto* in = static_cast<const double*>(src);
    for (; c < count; ++c) dst[c] = static_cast<float>(in[c * col]);
  } else if constexpr (T == KVType::kBF16 || T == KVType::kF16) {
    using Half = std::conditional_t<T == KVType::kBF16, hwy::bfloat16_t, hwy::float16_t>;
    const hn::Rebind<Half, D> dh;
    if (col == 1) {
      const auto* in = static_cast<const Half*>(src);
      for (; c + kLanes <= count; c += kLanes) {
        hn::Store(hn::PromoteTo(df, hn::LoadU(dh, in + c)), df, dst + c);
      }
    }
    const auto* bits = static_cast<const std::uint16_t*>(src);
    for (; c < count; ++c) {
      dst[c] = T == KVType::kBF16 ? core::bf16_to_float(bits[c * col])
                                  : core::f16_to_float(bits[c * col]);
    }
  } else {
    const hn::Rebind<std::int8_t, D> d8;
    const hn::Rebind<std::int32_t, D> d32;
    const auto* in = static_cast<const std::int8_t*>(src);
    // Pages only (column stride 1). A vector never straddles two blocks of 32: 32 is a
    // multiple of the lane count.
    for (; c + kLanes <= count; c += kLanes) {
      const V scale = hn::Set(df, scales[c / kCacheInt8Block]);
      const V x = hn::ConvertTo(df, hn::PromoteTo(d32, hn::LoadU(d8, in + c)));
      hn::Store(hn::Mul(x, scale), df, dst + c);
    }
    for (; c < count; ++c) dst[c] = static_cast<float>(in[c]) * scales[c / kCacheInt8Block];
  }
  for (; c < padded; ++c) dst[c] = 0.0f;
}

// Asks for every cache line of a row when the block's rows are first met: float32 K and V rows
// read in place, and a cache's bf16, f16 and int8 rows widened in registers (StoredRows). The
// dot products then find K in L1 or on its way, and V's lines are in flight during them instead
// of being requested only by P·V: many more misses outstanding at once. Measured on an AMD
// Zen 5 (f32 cache, d = 128, nk = 32768, 2 threads): 5.4-5.6 ms without, 4.75-4.77 ms with;
// plain tensors 7.5-8.1 against 5.7-6.1 ms. Exactly the current block's lines, all of them:
// every other line (6.15 against 4.96 ms), or the lines of two blocks at once (5.73 against
// 5.50), or of the next block early (docs/performance.md), each measured slower. Rows widened
// into L1 by widen_row are read whole there already and are not asked for.
HWY_INLINE void touch_row(const std::byte* row, std::int64_t bytes) {
  for (std::int64_t b = 0; b < bytes; b += 64) hwy::Prefetch(row + b);
}

// One vector of a stored row from column c (a whole vector inside the row), widened to float32
// in registers: bf16 and f16 by a conversion, int8 as q · scale of its block of 32 (a vector
// never straddles two blocks: 32 is a multiple of the lane count). The same floats widen_row
// stores.
template <KVType T>
HWY_INLINE V load_widened(const void* row, const float* scales, std::int64_t c) {
  const D df;
  if constexpr (T == KVType::kBF16 || T == KVType::kF16) {
    using Half = std::conditional_t<T == KVType::kBF16, hwy::bfloat16_t, hwy::float16_t>;
    return hn::PromoteTo(df, hn::LoadU(hn::Rebind<Half, D>(), static_cast<const Half*>(row) + c));
  } else {
    static_assert(T == KVType::kInt8, "float32 rows are read with FloatRows");
    const hn::Rebind<std::int8_t, D> d8;
    const hn::Rebind<std::int32_t, D> d32;
    const V x = hn::ConvertTo(
        df, hn::PromoteTo(d32, hn::LoadU(d8, static_cast<const std::int8_t*>(row) + c)));
    return hn::Mul(x, hn::Set(df, scales[c / kCacheInt8Block]));
  }
}

// The rows of a block as the dot products and P·V read them, rows(x, c) being one vector of row
// x from column c: float32 rows (read in place, or widened into L1 by widen_row), or a cache's
// bf16, f16 or int8 rows as stored, widened in registers as they are loaded.
struct FloatRows {
  const float* const* rows;
  HWY_INLINE V operator()(std::int64_t x, std::int64_t c) const {
    return hn::LoadU(D(), rows[x] + c);
  }
};

template <KVType T>
struct StoredRows {
  const void* const* rows;
  const float* const* scales;  // int8: each row's block scales
  HWY_INLINE V operator()(std::int64_t x, std::int64_t c) const {
    return load_widened<T>(rows[x], scales[x], c);
  }
};

// widen_row for a type known at run time (plain V may be stored unlike K).
HWY_INLINE void widen_any(KVType type, const void* src, const float* scales, std::int64_t count,
                          std::int64_t col, std::int64_t padded, float* HWY_RESTRICT dst) {
  switch (type) {
    case KVType::kF32:
      return widen_row<KVType::kF32>(src, scales, count, col, padded, dst);
    case KVType::kBF16:
      return widen_row<KVType::kBF16>(src, scales, count, col, padded, dst);
    case KVType::kF16:
      return widen_row<KVType::kF16>(src, scales, count, col, padded, dst);
    case KVType::kInt8:
      return widen_row<KVType::kInt8>(src, scales, count, col, padded, dst);
    case KVType::kF64:
      return widen_row<KVType::kF64>(src, scales, count, col, padded, dst);
  }
}

// Whether any of rows[0, count), each `width` floats (a whole number of vectors), holds a NaN,
// an infinity or a magnitude of 2^32 or more: the largest |x| as bits (sign cleared), where
// NaN > infinity > every finite value, against 2^32's bits. What validation's scan asks of
// plain K and V, asked here of the rows the kernel has just read.
HWY_INLINE bool any_large(const float* const* rows, std::int64_t count, std::int64_t width) {
  const D df;
  const hn::RebindToSigned<D> di;
  const auto magnitude = hn::Set(di, 0x7fffffff);
  auto largest = hn::Zero(di);
  for (std::int64_t x = 0; x < count; ++x) {
    for (std::int64_t c = 0; c < width; c += kLanes) {
      largest = hn::Max(largest, hn::And(hn::BitCast(di, hn::LoadU(df, rows[x] + c)), magnitude));
    }
  }
  return hn::GetLane(hn::MaxOfLanes(di, largest)) >= 0x4f800000;  // 2^32
}

#if HWY_TARGET <= HWY_AVX3
// The same question asked inside the passes that read K and V (dot_block and accumulate_block,
// on AVX-512): each K and V vector, already in a register for its FMAs, goes into a running
// largest magnitude with one vrangeps (the larger |x| of two, sign cleared), which catches
// infinities and magnitudes of 2^32 or more. vrangeps does not keep a NaN, so NaNs are caught
// from what the kernel computed: a NaN (or infinity) in K makes its scores NaN or infinite
// whatever Q is (NaN · 0 and ∞ · 0 are NaN), and one in V the rows of o that P·V adds it to, so
// adding s · 0 and o · 0 into a running sum (`poison`, which stays 0 until then) catches them.
// A separate any_large pass loaded every element again and cost about as much as the kernel's
// own work on one query row: plain tensors took 1.2-1.5x the cached call on the same bytes.
constexpr int kCheckLanes = 8;  // independent running maxima, so that no chain of vrangeps waits

HWY_INLINE V max_abs(V largest, V x) { return V{_mm512_range_ps(largest.raw, x.raw, 0x0B)}; }

// Whether the running maxima met a NaN, an infinity or a magnitude of 2^32 or more.
HWY_INLINE bool any_large(const V* largest, int count) {
  const D df;
  V all = largest[0];
  for (int i = 1; i < count; ++i) all = max_abs(all, largest[i]);
  return !hn::AllTrue(df, hn::Lt(all, hn::Set(df, 4294967296.0f)));
}
#endif

// s[x · kBlockKeys + j] = scale · q_x·k_j for G rows, one K vector load shared by all G.
template <int G>
HWY_INLINE void dot_rows(const float* HWY_RESTRICT q, std::int64_t dp, std::int64_t dl,
                         const float* const* keys, std::int64_t bk, float scale,
                         float* HWY_RESTRICT s) {
  const D df;
  for (std::int64_t j = 0; j < bk; ++j) {
    const float* HWY_RESTRICT k = keys[j];
    V acc[static_cast<std::size_t>(G)];
    for (auto& a : acc) a = hn::Zero(df);
    for (std::int64_t c = 0; c < dl; c += kLanes) {
      const V kv = hn::LoadU(df, k + c);
      for (int x = 0; x < G; ++x) {
        acc[x] = hn::MulAdd(hn::Load(df, q + std::int64_t{x} * dp + c), kv, acc[x]);
      }
    }
    for (int x = 0; x < G; ++x) {
      s[std::int64_t{x} * kBlockKeys + j] = hn::GetLane(hn::SumOfLanes(df, acc[x])) * scale;
    }
  }
}

#if HWY_TARGET <= HWY_AVX3
// The sums of 16 vectors, a[i] summed into lane kSumLane[i]... arranged so that lane j of the
// result is the sum of a[kSlotOf[j]]: four rounds of shuffles and adds (15 adds, 30 shuffles
// for 16 sums) instead of 16 horizontal sums of about 8 operations each.
constexpr int kSlotOf[16] = {0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15};

HWY_INLINE __m512 sum_16_vectors(const __m512* a) {
  __m512 b[8], c[4], d[2];
  for (int i = 0; i < 8; ++i) {
    b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[i], a[i + 8], 0x44),
                         _mm512_shuffle_f32x4(a[i], a[i + 8], 0xEE));
  }
  for (int i = 0; i < 4; ++i) {
    c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[i], b[i + 4], 0x88),
                         _mm512_shuffle_f32x4(b[i], b[i + 4], 0xDD));
  }
  for (int i = 0; i < 2; ++i) {
    d[i] = _mm512_add_ps(_mm512_shuffle_ps(c[i], c[i + 2], 0x44),
                         _mm512_shuffle_ps(c[i], c[i + 2], 0xEE));
  }
  return _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], 0x88), _mm512_shuffle_ps(d[0], d[1], 0xDD));
}

// s[j] = scale · q·k_j for the 16 keys of a block (keys past the block's end repeat a valid
// row; their scores are masked afterwards): 16 independent accumulators, one Q load per 16
// FMAs, then one transposing reduction. `keys` is FloatRows or StoredRows.
// With kCheck, every K element read also goes into `largest` (kCheckLanes vectors).
template <bool kCheck = false, class Rows>
HWY_INLINE void dot_block(const float* HWY_RESTRICT q, std::int64_t dl, const Rows& keys,
                          float scale, float* HWY_RESTRICT s, V* largest = nullptr) {
  __m512 acc[16];
  for (auto& a : acc) a = _mm512_setzero_ps();
  // The running maxima stay in registers for the loop (updated through `largest`, each went
  // through memory on every vector, a store-to-load chain per lane).
  V most[kCheckLanes];
  if constexpr (kCheck) {
    for (int i = 0; i < kCheckLanes; ++i) most[i] = largest[i];
  }
  for (std::int64_t c = 0; c < dl; c += 16) {
    const __m512 qv = _mm512_load_ps(q + c);
    for (int i = 0; i < 16; ++i) {
      __m512 kv = keys(kSlotOf[i], c).raw;
      if constexpr (kCheck) {
        // One load for both uses. Otherwise the compiler folds the load into the FMA and into
        // vrangeps alike: two loads per vector, and the loads become the limit. Both changes
        // together, on an AMD Zen 5 (plain f32 K/V, d = 128; nk = 4096 on one thread, nk = 32768
        // with 8/8 and 32/8 heads on two; 4 interleaved rounds): attention() took 0.96-1.12x the
        // cached call on the same bytes (median 1.05) against 1.05-1.24x (median 1.16) before.
        // Forcing V's loads the same way in accumulate_block measured worse (median 1.11).
        asm("" : "+v"(kv));
        most[i % kCheckLanes] = max_abs(most[i % kCheckLanes], V{kv});
      }
      acc[i] = _mm512_fmadd_ps(qv, kv, acc[i]);
    }
  }
  if constexpr (kCheck) {
    for (int i = 0; i < kCheckLanes; ++i) largest[i] = most[i];
  }
  _mm512_store_ps(s, _mm512_mul_ps(sum_16_vectors(acc), _mm512_set1_ps(scale)));
}
#endif

// o_g = alpha_g · o_g + sum_x p_gx v_x for G rows and U vectors of columns at c0: the G x U
// accumulators stay in registers over the block's keys; each V vector is loaded (and, for
// StoredRows, widened) once for all G rows. `values` is FloatRows or StoredRows.
// With kCheck (AVX-512 only), every V element read also goes into `largest` (U vectors).
template <std::size_t G, std::size_t U, bool kCheck = false, class Rows>
HWY_INLINE void accumulate_block(float* const* o, const float* const* p, const float* alpha,
                                 const Rows& values, std::int64_t xa, std::int64_t xe,
                                 std::int64_t c0, V* largest = nullptr) {
  const D df;
  V acc[G][U];
  for (std::size_t g = 0; g < G; ++g) {
    const V va = hn::Set(df, alpha[g]);
    for (std::size_t u = 0; u < U; ++u)
      acc[g][u] = hn::Mul(hn::Load(df, o[g] + c0 + static_cast<std::int64_t>(u) * kLanes), va);
  }
#if HWY_TARGET <= HWY_AVX3
  V most[U];  // the running maxima in registers (see dot_block)
  if constexpr (kCheck) {
    for (std::size_t u = 0; u < U; ++u) most[u] = largest[u];
  }
#else
  (void)largest;  // the check is the caller's on these targets
#endif
  for (std::int64_t x = xa; x < xe; ++x) {
    V v[U];
    for (std::size_t u = 0; u < U; ++u)
      v[u] = values(x, c0 + static_cast<std::int64_t>(u) * kLanes);
#if HWY_TARGET <= HWY_AVX3
    if constexpr (kCheck) {
      for (std::size_t u = 0; u < U; ++u) most[u] = max_abs(most[u], v[u]);
    }
#endif
    for (std::size_t g = 0; g < G; ++g) {
      const V pg = hn::Set(df, p[g][x]);
      for (std::size_t u = 0; u < U; ++u) acc[g][u] = hn::MulAdd(pg, v[u], acc[g][u]);
    }
  }
  for (std::size_t g = 0; g < G; ++g) {
    for (std::size_t u = 0; u < U; ++u)
      hn::Store(acc[g][u], df, o[g] + c0 + static_cast<std::int64_t>(u) * kLanes);
  }
#if HWY_TARGET <= HWY_AVX3
  if constexpr (kCheck) {
    for (std::size_t u = 0; u < U; ++u) largest[u] = most[u];
  }
#endif
}

// Vectors of columns per accumulate_block call: G x U accumulators, U values and a broadcast
// fit the register file (32 vectors on AVX-512, 16 elsewhere).
#if HWY_TARGET <= HWY_AVX3
constexpr std::size_t kMaxColumnVectors = 4;
#else
constexpr std::size_t kMaxColumnVectors = 2;
#endif

template <std::size_t G, bool kCheck = false, class Rows>
HWY_INLINE void accumulate_rows(float* const* o, const float* const* p, const float* alpha,
                                const Rows& values, std::int64_t xa, std::int64_t xe,
                                std::int64_t dvl, V* largest = nullptr) {
  constexpr auto kColumns = static_cast<std::int64_t>(kMaxColumnVectors) * kLanes;
  std::int64_t c0 = 0;
  for (; c0 + kColumns <= dvl; c0 += kColumns) {
    accumulate_block<G, kMaxColumnVectors, kCheck>(o, p, alpha, values, xa, xe, c0, largest);
  }
  for (; c0 < dvl; c0 += kLanes) {
    accumulate_block<G, 1, kCheck>(o, p, alpha, values, xa, xe, c0, largest);
  }
}

}  // namespace decode_hwy
}  // namespace qkv::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // QKV_KERNELS_DECODE_OPS_HWY_INL_H_
