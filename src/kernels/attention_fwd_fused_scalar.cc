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
// the baseline ISA; the sums run in a fixed order, so results never depend on threads. A call
// computing in float64 (AttentionParams::compute == kF64) runs the same loops on double
// (ScalarMicro<double>, F64Tiles): std::exp and std::tanh in double, one rounding per operation.
#include <cmath>
#include <cstdio>
#include <limits>

#include "core/score_modifiers.h"
#include "kernels/fused_common.h"
#include "kernels/fused_tiles.h"
#include "kernels/kernel.h"

namespace qkv::kernels {
namespace scalar {

// F is the compute type: float for float32 calls, double for float64 ones.
template <class Real>
struct ScalarMicro {
  using F = Real;
  static constexpr std::int64_t kLanes = 1;
  static constexpr std::int64_t kRows = 4;
  static constexpr std::int64_t kTile = fused::kKeyTile;
  static constexpr F kInf = std::numeric_limits<F>::infinity();
  struct Session {};  // nothing held per worker (fused_driver-inl.h; AmxMicro holds tiles)
  static constexpr std::int64_t kSpareRows = 0;

  static void scores(const F* q, std::int64_t rows, std::int64_t d, const F* kt, std::int64_t keys,
                     F scale, F* s, F* row_max) noexcept {
    for (std::int64_t r = 0; r < rows; ++r) {
      F* row = s + r * kTile;
      for (std::int64_t j = 0; j < keys; ++j) row[j] = F{0};
      for (std::int64_t c = 0; c < d; ++c) {
        const F qc = q[r * d + c];
        const F* k = kt + c * kTile;
        for (std::int64_t j = 0; j < keys; ++j) row[j] += qc * k[j];
      }
      row_max[r] = -kInf;
      for (std::int64_t j = 0; j < keys; ++j) {
        row[j] *= scale;
        row_max[r] = std::max(row_max[r], row[j]);
      }
    }
  }

  static F row_max(const F* s) noexcept {
    F m = -kInf;
    for (std::int64_t j = 0; j < kTile; ++j) m = std::max(m, s[j]);
    return m;
  }

  static void exp_accumulate(F* s, F m, F alpha, F* lsum) noexcept {
    F sum = F{0};
    for (std::int64_t j = 0; j < kTile; ++j) {
      s[j] = std::exp(s[j] - m);
      sum += s[j];
    }
    lsum[0] = lsum[0] * alpha + sum;
  }

  static F exp1(F x) noexcept { return std::exp(x); }

  // s_j := cap·tanh(s_j / cap) (cap > 0) - slope·|offset - j| (slope != 0), offset being the
  // row's diagonal minus the tile's first key.
  // Returns the tile's new max (used when no mask follows).
  static F modify_scores(F* s, F cap, F slope, std::int64_t offset) noexcept {
    for (std::int64_t j = 0; j < kTile; ++j) {
      F x = s[j];
      if (cap > 0) x = cap * std::tanh(x / cap);
      if (slope != 0) {
        const std::int64_t distance = offset >= j ? offset - j : j - offset;
        x -= slope * static_cast<F>(distance);
      }
      s[j] = x;
    }
    return row_max(s);
  }

  static void softmax_rows(F* s, std::int64_t rows, const F* tile_max, F* m, F* alpha,
                           F* lsum) noexcept {
    for (std::int64_t r = 0; r < rows; ++r) {
      const F now = std::max(m[r], tile_max[r]);
      alpha[r] = std::exp(m[r] - now);
      m[r] = now;
      exp_accumulate(s + r * kTile, m[r], alpha[r], lsum + r);
    }
  }

  static void exp_scale(F* s, F m, F factor) noexcept {
    for (std::int64_t j = 0; j < kTile; ++j) s[j] = std::exp(s[j] - m) * factor;
  }

  static void dropout(const core::Dropout& d, std::uint32_t head_word, std::int64_t i,
                      std::int64_t j0, std::int64_t count, F* s) noexcept {
    core::dropout_span_scalar(d, head_word, i, j0, count, s);
  }

  static void accumulate_pv(const F* p, std::int64_t rows, std::int64_t bk, const F* v,
                            std::int64_t ldv, std::int64_t dvp, const F* alpha, F* o) noexcept {
    for (std::int64_t r = 0; r < rows; ++r) {
      F* acc = o + r * dvp;
      for (std::int64_t c = 0; c < dvp; ++c) acc[c] *= alpha[r];
      for (std::int64_t j = 0; j < bk; ++j) {
        const F w = p[r * kTile + j];
        const F* vj = v + j * ldv;
        for (std::int64_t c = 0; c < dvp; ++c) acc[c] += w * vj[c];
      }
    }
  }
};

#include "kernels/fused_driver-inl.h"

}  // namespace scalar

// The float32 kernels compute S = scale·q·k (+ a float mask's bias), and the fused ones
// accumulate o = sum_j exp(S_j - m)·v_j before dividing by l, which can reach (allowed keys) ·
// max|v|. Each bound below is taken from the inputs' magnitudes (validation's scan); a call
// whose bound is beyond float32's range could overflow to inf (or make inf - inf = NaN) where
// the true answer is finite, so these kernels decline it and the float64 reference runs.
// kFloatLimit leaves a factor of 2 so that a score plus a mask's bias cannot overflow either.
std::string float32_declines(const core::AttentionParams& p) {
  constexpr double kFloatMax = std::numeric_limits<float>::max();
  constexpr double kFloatLimit = kFloatMax / 2;
  const core::AttentionShape& s = p.shape;
  const core::Magnitudes& mag = p.magnitudes;
  const auto sci = [](double x) {
    char text[32];
    std::snprintf(text, sizeof text, "%.3g", x);
    return std::string(text);
  };
  const struct {
    const core::InputOperand* op;
    double magnitude;
    const char* name;
  } operands[] = {{&p.q, mag.q, "Q"}, {&p.k, mag.k, "K"}, {&p.v, mag.v, "V"}};
  for (const auto& o : operands) {
    if (o.op->dtype == DType::kF64 && o.magnitude > kFloatMax) {
      return std::string("float64 ") + o.name + " holds values beyond the float32 range";
    }
  }
  if (p.masking.mask != nullptr && p.masking.mask_dtype == DType::kF64 && mag.mask > kFloatMax) {
    return "the float64 mask holds finite values beyond the float32 range";
  }
  if (p.compute == DType::kF64) return "it computes in float32; the call asks for float64 (dtype)";
  if (std::abs(p.scale) > kFloatMax) return "the scale " + sci(p.scale) + " is beyond float32";
  // ALiBi's term reaches max|slope| · nk; a sink is one more score.
  double slope = 0.0;
  for (const double x : p.modifiers.alibi_slopes) slope = std::max(slope, std::abs(x));
  const double alibi = slope * static_cast<double>(std::max(s.nk, s.nq));
  if (alibi > kFloatLimit / 4 || mag.sink > kFloatLimit / 4) {
    return "the ALiBi term (max|slope|·N up to " + sci(alibi) + ") or a sink (up to " +
           sci(mag.sink) + ") is beyond float32's range";
  }
  // q·k may be summed before it is scaled: bound both.
  const double dot = static_cast<double>(s.d) * mag.q * mag.k;
  const double score = std::max(1.0, std::abs(p.scale)) * dot;
  if (score > kFloatLimit || mag.mask > kFloatLimit) {
    return "scores may reach " + sci(score) + " (|scale|·D·max|Q|·max|K|)" +
           (mag.mask > 0 ? " with mask values up to " + sci(mag.mask) : std::string()) +
           ", beyond float32's range";
  }
  // Dropout scales the kept weights by up to 2^16.
  const double accumulator = static_cast<double>(s.nk) * mag.v * p.dropout.keep_scale;
  if (accumulator > kFloatLimit) {
    return "the P·V accumulator may reach " + sci(accumulator) +
           " (Nk·max|V|), beyond float32's range";
  }
  return {};
}

std::string plain_only_declines(const core::AttentionParams& p) {
  const core::ScoreModifiers& mod = p.modifiers;
  if (mod.softcap > 0) return "it has no softcap";
  if (!mod.alibi_slopes.empty()) return "it has no ALiBi";
  if (!mod.sinks.empty()) return "it has no attention sinks";
  if (core::inputs_round(p)) {
    return std::string("it reads Q, K and V as stored and cannot round them to ") +
           dtype_name(p.compute) + " (dtype)";
  }
  return {};
}

// The float64 path has the same overflow hazards as the float32 one, at float64's range: its
// scores and P·V sums are bounded from the same magnitudes, and a call that could pass
// DBL_MAX / 2 is left to the reference (which never forms the unnormalised sum).
std::string float64_declines(const core::AttentionParams& p) {
  constexpr double kLimit = std::numeric_limits<double>::max() / 2;
  const core::AttentionShape& s = p.shape;
  const core::Magnitudes& mag = p.magnitudes;
  double slope = 0.0;
  for (const double x : p.modifiers.alibi_slopes) slope = std::max(slope, std::abs(x));
  const double alibi = slope * static_cast<double>(std::max(s.nk, s.nq));
  const double dot = static_cast<double>(s.d) * mag.q * mag.k;
  const double score = std::max(1.0, std::abs(p.scale)) * dot;
  const double accumulator = static_cast<double>(s.nk) * mag.v * p.dropout.keep_scale;
  if (!(score <= kLimit / 4) || !(alibi <= kLimit / 4) || !(mag.sink <= kLimit / 4) ||
      !(mag.mask <= kLimit / 4) || !(accumulator <= kLimit)) {
    return "its scores or P·V sums may pass float64's range";
  }
  return {};
}

std::string fused_declines(const core::AttentionParams& p) {
  return p.compute == DType::kF64 ? float64_declines(p) : float32_declines(p);
}

std::string attention_fwd_fused_scalar_declines(const core::AttentionParams& p) {
  return fused_declines(p);
}

core::KernelStatus attention_fwd_fused_scalar(const core::AttentionParams& p) noexcept {
  if (p.compute == DType::kF64) {
    return scalar::run_fused<scalar::ScalarMicro<double>, fused::F64Tiles>(p);
  }
  return scalar::run_fused<scalar::ScalarMicro<float>>(p);
}

}  // namespace qkv::kernels
