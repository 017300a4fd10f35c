// The score modifiers of the SIMD kernels (softcap, cap·tanh(x / cap), and ALiBi), shared by the
// fused and the decode kernels so that both give a score the same bits. Included once per Highway target inside
// qkv::kernels::HWY_NAMESPACE with `hn` defined; hence the toggling guard.
#if defined(QKV_KERNELS_SCORE_MODIFIERS_HWY_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_KERNELS_SCORE_MODIFIERS_HWY_INL_H_
#undef QKV_KERNELS_SCORE_MODIFIERS_HWY_INL_H_
#else
#define QKV_KERNELS_SCORE_MODIFIERS_HWY_INL_H_
#endif

#include <cmath>
#include <cstdint>
#include <limits>
#include <algorithm>

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// cap · tanh(x · inv_cap). Caps are chosen well above typical scores (Gemma 2: 50 for attention
// logits), so |x / cap| is usually small: a vector whose |y| are all below 1/2 takes tanh's
// Taylor series to y^15 (within 0.86 ulp there, checked in float32 against float64 over
// [0, 1/2]; 9 vector operations), any other vector Highway's Tanh (an expm1 and a division,
// about 35). Measured: the series cut the softcap's cost at n = 2048, d = 64 by about 3x.
// On double lanes (the fused kernel's float64 path) the series would be short of float64's
// precision: Highway's Tanh always.
template <class D, class V>
HWY_INLINE V Softcap(D df, V x, V cap, V inv_cap) {
  const V y = hn::Mul(x, inv_cap);
  if constexpr (sizeof(hn::TFromD<D>) == 8) {
    return hn::Mul(cap, hn::Tanh(df, y));
  } else if (hn::AllTrue(df, hn::Lt(hn::Abs(y), hn::Set(df, 0.5f)))) {
    const V y2 = hn::Mul(y, y);
    // 1, -1/3, 2/15, -17/315, 62/2835, -1382/155925, 21844/6081075, -929569/638512875
    V p = hn::Set(df, -1.45583438705131833e-3f);
    p = hn::MulAdd(p, y2, hn::Set(df, 3.59212803657248114e-3f));
    p = hn::MulAdd(p, y2, hn::Set(df, -8.86323552990219733e-3f));
    p = hn::MulAdd(p, y2, hn::Set(df, 2.18694885361552030e-2f));
    p = hn::MulAdd(p, y2, hn::Set(df, -5.39682539682539708e-2f));
    p = hn::MulAdd(p, y2, hn::Set(df, 1.33333333333333331e-1f));
    p = hn::MulAdd(p, y2, hn::Set(df, -3.33333333333333315e-1f));
    return hn::Mul(cap, hn::MulAdd(hn::Mul(p, y2), y, y));
  }
  return hn::Mul(cap, hn::Tanh(df, y));
}

// s[x] := cap·tanh(s[x] / cap) (cap > 0) - slope·|offset - x| (slope != 0) for x < count, a
// whole number of vectors; offset is the row's diagonal (i + nk - nq) minus the first key of
// s. Returns the largest new score. Float lanes take distances as int32 lanes, beyond +-2^30
// keys (never in practice) the scalar form; double lanes (the float64 path) form them in
// double, exact below 2^53.
template <class D, class T = hn::TFromD<D>>
HWY_INLINE T ModifyScores(D df, T* s, std::int64_t count, T cap, T slope, std::int64_t offset) {
  using V = hn::Vec<D>;
  constexpr bool kDouble = sizeof(T) == 8;
  const std::int64_t lanes = static_cast<std::int64_t>(hn::Lanes(df));
  constexpr std::int64_t kIntRange = std::int64_t{1} << 30;
  if (!kDouble && slope != 0 && (offset > kIntRange || offset < -kIntRange)) {
    T max = -std::numeric_limits<T>::infinity();
    for (std::int64_t x = 0; x < count; ++x) {
      const T capped = cap > 0 ? cap * std::tanh(s[x] / cap) : s[x];
      const std::int64_t distance = offset >= x ? offset - x : x - offset;
      s[x] = capped - slope * static_cast<T>(distance);
      max = std::max(max, s[x]);
    }
    return max;
  }
  const hn::RebindToSigned<D> di;
  const V vcap = hn::Set(df, cap);
  const V inv_cap = hn::Set(df, cap > 0 ? T{1} / cap : T{0});
  const V neg_slope = hn::Set(df, -slope);
  [[maybe_unused]] const auto iota = hn::Iota(di, 0);
  V max = hn::Set(df, -std::numeric_limits<T>::infinity());
  for (std::int64_t x = 0; x < count; x += lanes) {
    V v = hn::Load(df, s + x);
    if (cap > 0) v = Softcap(df, v, vcap, inv_cap);
    if (slope != 0) {
      if constexpr (kDouble) {
        const V distance =
            hn::Abs(hn::Sub(hn::Set(df, static_cast<T>(offset - x)), hn::Iota(df, T{0})));
        v = hn::MulAdd(neg_slope, distance, v);
      } else {
        const auto distance =
            hn::Abs(hn::Sub(hn::Set(di, static_cast<std::int32_t>(offset - x)), iota));
        v = hn::MulAdd(neg_slope, hn::ConvertTo(df, distance), v);
      }
    }
    max = hn::Max(max, v);
    hn::Store(v, df, s + x);
  }
  return hn::GetLane(hn::MaxOfLanes(df, max));
}

}  // namespace qkv::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // QKV_KERNELS_SCORE_MODIFIERS_HWY_INL_H_
