// attention_fwd_fused_scalar: the fused kernel's portable twin. The loop nest (tasks, key tiles,
// online softmax, weights recomputation) is fused_driver-inl.h, shared with every SIMD target of
// attention_fwd_fused_hwy; this file states its inner loops as plain C++, the readable
// definition of what the vector micro-kernels compute:
//
//   scores        S[r][j] = scale · sum_c Q[r][c] · K^T[c][j]  (r < rows, j < 64, c < d),
//                 and each row's max over its 64 scores
//   exp_accumulate S[r][j] = exp(S[r][j] - m); l = alpha · l + sum_j S[r][j] (the tile's sum
//                 formed first)
//   accumulate_pv o[r][c] = alpha[r] · o[r][c] + sum_{j < bk} P[r][j] · V[j][c]
//
// Every loop order keeps the innermost index contiguous, so the compiler may vectorise it for
// the baseline ISA; the sums run in a fixed order, so results never depend on threads.
#include <cmath>
#include <limits>

#include "kernels/fused_common.h"
#include "kernels/kernel.h"

namespace qkv::kernels {
namespace scalar {

struct ScalarMicro {
  static constexpr std::int64_t kLanes = 1;
  static constexpr std::int64_t kRows = 4;
  static constexpr std::int64_t kTile = fused::kKeyTile;

  static void scores(const float* q, std::int64_t rows, std::int64_t d, const float* kt,
                     std::int64_t keys, float scale, float* s, float* row_max) noexcept {
    for (std::int64_t r = 0; r < rows; ++r) {
      float* row = s + r * kTile;
      for (std::int64_t j = 0; j < keys; ++j) row[j] = 0.0f;
      for (std::int64_t c = 0; c < d; ++c) {
        const float qc = q[r * d + c];
        const float* k = kt + c * kTile;
        for (std::int64_t j = 0; j < keys; ++j) row[j] += qc * k[j];
      }
      row_max[r] = -fused::kInfF;
      for (std::int64_t j = 0; j < keys; ++j) {
        row[j] *= scale;
        row_max[r] = std::max(row_max[r], row[j]);
      }
    }
  }

  static float row_max(const float* s) noexcept {
    float m = -fused::kInfF;
    for (std::int64_t j = 0; j < kTile; ++j) m = std::max(m, s[j]);
    return m;
  }

  static void exp_accumulate(float* s, float m, float alpha, float* lsum) noexcept {
    float sum = 0.0f;
    for (std::int64_t j = 0; j < kTile; ++j) {
      s[j] = std::exp(s[j] - m);
      sum += s[j];
    }
    lsum[0] = lsum[0] * alpha + sum;
  }

  static float exp1(float x) noexcept { return std::exp(x); }

  static void softmax_rows(float* s, std::int64_t rows, const float* tile_max, float* m,
                           float* alpha, float* lsum) noexcept {
    for (std::int64_t r = 0; r < rows; ++r) {
      const float now = std::max(m[r], tile_max[r]);
      alpha[r] = std::exp(m[r] - now);
      m[r] = now;
      exp_accumulate(s + r * kTile, m[r], alpha[r], lsum + r);
    }
  }

  static void exp_scale(float* s, float m, float factor) noexcept {
    for (std::int64_t j = 0; j < kTile; ++j) s[j] = std::exp(s[j] - m) * factor;
  }

  static void accumulate_pv(const float* p, std::int64_t rows, std::int64_t bk, const float* v,
                            std::int64_t ldv, std::int64_t dvp, const float* alpha,
                            float* o) noexcept {
    for (std::int64_t r = 0; r < rows; ++r) {
      float* acc = o + r * dvp;
      for (std::int64_t c = 0; c < dvp; ++c) acc[c] *= alpha[r];
      for (std::int64_t j = 0; j < bk; ++j) {
        const float w = p[r * kTile + j];
        const float* vj = v + j * ldv;
        for (std::int64_t c = 0; c < dvp; ++c) acc[c] += w * vj[c];
      }
    }
  }
};

#include "kernels/fused_driver-inl.h"

}  // namespace scalar

namespace {

// Largest |x| over the distinct elements of a 4-D strided f64 operand (broadcast dims once).
double max_abs_finite(const double* data, const core::Strides4& st, std::int64_t nb,
                      std::int64_t nh, std::int64_t nr, std::int64_t nc) noexcept {
  double m = 0.0;
  for (std::int64_t b = 0; b < (st.b == 0 ? 1 : nb); ++b) {
    for (std::int64_t h = 0; h < (st.h == 0 ? 1 : nh); ++h) {
      for (std::int64_t r = 0; r < (st.row == 0 ? 1 : nr); ++r) {
        for (std::int64_t c = 0; c < (st.col == 0 ? 1 : nc); ++c) {
          const double x = data[st.at(b, h, r, c)];
          if (std::isfinite(x)) m = std::max(m, std::abs(x));
        }
      }
    }
  }
  return m;
}

}  // namespace

std::string float32_declines(const core::AttentionParams& p) {
  constexpr double kFloatMax = std::numeric_limits<float>::max();
  const core::AttentionShape& s = p.shape;
  struct Operand {
    const core::InputOperand* op;
    std::int64_t heads, rows, cols;
    const char* name;
  };
  const Operand operands[] = {
      {&p.q, s.h, s.nq, s.d, "Q"}, {&p.k, s.hkv, s.nk, s.d, "K"}, {&p.v, s.hkv, s.nk, s.dv, "V"}};
  for (const Operand& o : operands) {
    if (o.op->dtype != DType::kF64) continue;
    if (max_abs_finite(static_cast<const double*>(o.op->data), o.op->strides, s.b, o.heads, o.rows,
                       o.cols) > kFloatMax) {
      return std::string("float64 ") + o.name + " holds values beyond the float32 range";
    }
  }
  const core::Masking& m = p.masking;
  if (m.mask != nullptr && m.mask_dtype == DType::kF64 &&
      max_abs_finite(static_cast<const double*>(m.mask), m.mask_strides, s.b, s.h, s.nq, s.nk) >
          kFloatMax) {
    return "the float64 mask holds finite values beyond the float32 range";
  }
  return {};
}

std::string attention_fwd_fused_scalar_declines(const core::AttentionParams& p) {
  return float32_declines(p);
}

void attention_fwd_fused_scalar(const core::AttentionParams& p) noexcept {
  scalar::run_fused<scalar::ScalarMicro>(p);
}

}  // namespace qkv::kernels
