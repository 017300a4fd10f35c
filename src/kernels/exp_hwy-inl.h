// exp for the softmax of the SIMD kernels, shared by the fused and the decode kernels so that
// both give a score the same weight. Included once per Highway target inside
// qkv::kernels::HWY_NAMESPACE with `hn` defined; hence the toggling guard.
#if defined(QKV_KERNELS_EXP_HWY_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_KERNELS_EXP_HWY_INL_H_
#undef QKV_KERNELS_EXP_HWY_INL_H_
#else
#define QKV_KERNELS_EXP_HWY_INL_H_
#endif

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// exp(x) for the softmax, where x = score - max <= 0 (or -inf), as 2^t with t = x·log2(e):
// t = n + r with n = round(t) and |r| <= 1/2, 2^r from a degree-6 polynomial, 2^n put into the
// exponent. Rounding t costs relative accuracy only in proportion to |t|, that is, only in
// weights far below the row's largest (the error of a weight w is below w·|t|·2^-24, at most
// 0.3 ulp of the largest weight); the polynomial is within 0.94 ulp on [-1/2, 1/2] evaluated
// in float32 FMAs (a Lawson-weighted least-squares fit of the relative error). 14 vector
// operations on AVX-512 (vscalefps builds 2^n and the underflow mask rides on it), 16 on other
// targets, against about 35 for Highway's Exp: the exp is the largest cost beside the FMAs (one
// per score against 2·d/16 + 2·dv/16 FMAs). t < -125.5 (x below about -87, e^x near the
// smallest normal float) gives 0, which is also how -inf (a masked key) becomes weight 0, and
// no weight is ever subnormal.
//
// On double lanes (the fused kernel's float64 path) the same scheme at float64 precision:
// ExpNonPositive64 below.
template <class D, class V>
HWY_INLINE V ExpNonPositive64(D df, V x);

template <class D, class V>
HWY_INLINE V ExpNonPositive(D df, V x) {
  if constexpr (sizeof(hn::TFromD<D>) == 8) {
    return ExpNonPositive64(df, x);
  } else {
    const V t = hn::Mul(x, hn::Set(df, 1.44269504088896341f));
    // Adding 1.5·2^23 + 127 rounds t to an integer held in the low mantissa bits, already biased
    // by 127 for the exponent field: n = round(t) costs two adds and no float->int conversion.
    const V shifter = hn::Set(df, 12583039.0f);
    const V biased = hn::Add(t, shifter);
    const V n = hn::Sub(biased, shifter);
    const V r = hn::Sub(t, n);
    V p = hn::Set(df, 1.534581242594868e-4f);
    p = hn::MulAdd(p, r, hn::Set(df, 1.3399930903688073e-3f));
    p = hn::MulAdd(p, r, hn::Set(df, 9.618489071726799e-3f));
    p = hn::MulAdd(p, r, hn::Set(df, 5.550328642129898e-2f));
    p = hn::MulAdd(p, r, hn::Set(df, 2.4022646248340607e-1f));
    p = hn::MulAdd(p, r, hn::Set(df, 6.931471824645996e-1f));
    p = hn::MulAdd(p, r, hn::Set(df, 1.0f));
    const auto normal = hn::Ge(t, hn::Set(df, -125.5f));
#if HWY_TARGET <= HWY_AVX3
    return V{_mm512_maskz_scalef_ps(normal.raw, p.raw, n.raw)};
#else
    const hn::RebindToSigned<D> di;
    const V two_n = hn::BitCast(df, hn::ShiftLeft<23>(hn::BitCast(di, biased)));
    return hn::IfThenElseZero(normal, hn::Mul(p, two_n));
#endif
  }
}

// exp(x) for x <= 0 (or -inf) on double lanes: t = x·log2(e) = n + r as above with the shifter
// 1.5·2^52 + 1023, 2^r from its Taylor polynomial of degree 13 (the remainder is below 5e-18
// relative on [-1/2, 1/2], far under float64's half ulp of 1.1e-16; Horner in float64 FMAs),
// 2^n from vscalefpd on AVX-512, else the exponent bits. Rounding t costs a weight w at most
// w·|t|·2^-53 (at most 0.3 ulp of the row's largest weight, as in float32). t < -1021.5 gives 0:
// -inf (a masked key) included; 19 vector operations on AVX-512, 21 elsewhere.
template <class D, class V>
HWY_INLINE V ExpNonPositive64(D df, V x) {
  const V t = hn::Mul(x, hn::Set(df, 1.4426950408889634));
  const V shifter = hn::Set(df, 6755399441056767.0);  // 1.5·2^52 + 1023
  const V biased = hn::Add(t, shifter);
  const V n = hn::Sub(biased, shifter);
  const V r = hn::Sub(t, n);
  // ln(2)^k / k!, k = 13 down to 0.
  V p = hn::Set(df, 1.3691488853904124e-12);
  p = hn::MulAdd(p, r, hn::Set(df, 2.5678435993488196e-11));
  p = hn::MulAdd(p, r, hn::Set(df, 4.44553827187081e-10));
  p = hn::MulAdd(p, r, hn::Set(df, 7.054911620801121e-09));
  p = hn::MulAdd(p, r, hn::Set(df, 1.0178086009239696e-07));
  p = hn::MulAdd(p, r, hn::Set(df, 1.3215486790144305e-06));
  p = hn::MulAdd(p, r, hn::Set(df, 1.5252733804059838e-05));
  p = hn::MulAdd(p, r, hn::Set(df, 0.00015403530393381606));
  p = hn::MulAdd(p, r, hn::Set(df, 0.0013333558146428441));
  p = hn::MulAdd(p, r, hn::Set(df, 0.009618129107628477));
  p = hn::MulAdd(p, r, hn::Set(df, 0.055504108664821576));
  p = hn::MulAdd(p, r, hn::Set(df, 0.2402265069591007));
  p = hn::MulAdd(p, r, hn::Set(df, 0.6931471805599453));
  p = hn::MulAdd(p, r, hn::Set(df, 1.0));
  const auto normal = hn::Ge(t, hn::Set(df, -1021.5));
#if HWY_TARGET <= HWY_AVX3
  return V{_mm512_maskz_scalef_pd(normal.raw, p.raw, n.raw)};
#else
  const hn::RebindToSigned<D> di;
  const V two_n = hn::BitCast(df, hn::ShiftLeft<52>(hn::BitCast(di, biased)));
  return hn::IfThenElseZero(normal, hn::Mul(p, two_n));
#endif
}

}  // namespace qkv::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // QKV_KERNELS_EXP_HWY_INL_H_
