// softmax_rows in SIMD: the softmax between the two sgemm calls of attention_fwd_unfused_blas,
// vectorised so that the in-process baseline is the honest "two sgemm + a fast softmax" it is
// meant to be (a scalar std::exp would dominate its time). One dynamic dispatch per call.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/softmax_rows_hwy.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// After foreach_target.h, which re-includes this file once per target.
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "kernels/kernel.h"
#include "kernels/softmax_rows.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void SoftmaxRows(float* s, std::int64_t n, std::int64_t ld, std::int64_t rows, float* row_max,
                 float* row_sum) {
  const hn::ScalableTag<float> df;
  const std::int64_t lanes = static_cast<std::int64_t>(hn::Lanes(df));
  const std::int64_t body = n / lanes * lanes;
  for (std::int64_t r = 0; r < rows; ++r) {
    float* x = s + r * ld;
    auto vmax = hn::Set(df, -kSoftmaxInf);
    for (std::int64_t j = 0; j < body; j += lanes) vmax = hn::Max(vmax, hn::LoadU(df, x + j));
    float m = hn::GetLane(hn::MaxOfLanes(df, vmax));
    for (std::int64_t j = body; j < n; ++j) m = m > x[j] ? m : x[j];
    if (m == -kSoftmaxInf || m == kSoftmaxInf) {
      softmax_row_special(x, n, m, row_max[r], row_sum[r]);
      continue;
    }
    const auto vm = hn::Set(df, m);
    auto vsum = hn::Zero(df);
    for (std::int64_t j = 0; j < body; j += lanes) {
      const auto e = hn::Exp(df, hn::Sub(hn::LoadU(df, x + j), vm));
      hn::StoreU(e, df, x + j);
      vsum = hn::Add(vsum, e);
    }
    float sum = hn::GetLane(hn::SumOfLanes(df, vsum));
    for (std::int64_t j = body; j < n; ++j) {
      x[j] = std::exp(x[j] - m);
      sum += x[j];
    }
    const auto inv = hn::Set(df, 1.0f / sum);
    for (std::int64_t j = 0; j < body; j += lanes) {
      hn::StoreU(hn::Mul(hn::LoadU(df, x + j), inv), df, x + j);
    }
    for (std::int64_t j = body; j < n; ++j) x[j] *= 1.0f / sum;
    row_max[r] = m;
    row_sum[r] = sum;
  }
}

}  // namespace qkv::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace qkv::kernels {

HWY_EXPORT(SoftmaxRows);

void softmax_rows(float* s, std::int64_t n, std::int64_t ld, std::int64_t rows, float* row_max,
                  float* row_sum) noexcept {
  HWY_DYNAMIC_DISPATCH(SoftmaxRows)(s, n, ld, rows, row_max, row_sum);
}

}  // namespace qkv::kernels
#endif  // HWY_ONCE
