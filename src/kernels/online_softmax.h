// The running state of an online softmax and the one primitive that merges two such states.
//
// A partial softmax over some keys of one query row is (max, sum): max = the largest score seen,
// sum = sum_j exp(r_j - max). Its accumulator, kept beside it by the caller, is
// acc = sum_j exp(r_j - max) · v_j. Two partial states over disjoint key sets A and B combine
// into the state over A ∪ B:
//
//   max = max(max_A, max_B)
//   sum = sum_A · exp(max_A - max) + sum_B · exp(max_B - max)
//   acc = acc_A · exp(max_A - max) + acc_B · exp(max_B - max)
//
// merge() returns the two factors so the caller rescales whatever accumulators it keeps. Every
// user of partial states goes through it: the fused kernels' key tiles (where the tile's
// exponentials are taken against the merged max already, so its factor is exactly 1), and any
// later split-KV or distributed ring.
//
// Edge cases follow the contract: an all-masked state (max = -inf, sum = 0) contributes factor
// 0, so merging two of them gives zeros and lse = -inf, never NaN. A score that overflowed to
// +inf (finite float inputs, astronomically large products) takes all the weight, shared with
// its equals, as in the float64 reference.
#pragma once

#include <cmath>
#include <limits>

namespace qkv::kernels {

struct SoftmaxState {
  float max = -std::numeric_limits<float>::infinity();
  float sum = 0.0f;  // sum_j exp(r_j - max); 0 for an all-masked state
};

// The factor exp(from - to) that moves a state kept against max `from` to the max `to`
// (to >= from), with the -inf and +inf cases of the contract.
inline float rescale_factor(float from, float to) noexcept {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  if (from == -kInf) return 0.0f;
  if (from == to) return 1.0f;  // the common case once the max has settled: no exp call
  if (to == kInf) return 0.0f;
  return std::exp(from - to);
}

struct MergeFactors {
  float a = 0.0f;  // multiplies the accumulator that went with `a`
  float b = 0.0f;  // multiplies the accumulator that went with `b`
};

// a := a ∪ b. Returns the factors for the two accumulators.
inline MergeFactors merge(SoftmaxState& a, const SoftmaxState& b) noexcept {
  const float max = a.max > b.max ? a.max : b.max;
  const MergeFactors f{rescale_factor(a.max, max), rescale_factor(b.max, max)};
  a.sum = a.sum * f.a + b.sum * f.b;
  a.max = max;
  return f;
}

// The finished row's factor 1/sum for the accumulator: 0 for an all-masked row, whose
// accumulator is zero.
inline float inverse_sum(const SoftmaxState& s) noexcept {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  if (s.max == -kInf || s.sum == 0.0f) return 0.0f;
  return 1.0f / s.sum;
}

// The finished row's log-sum-exp, in double so that max + log(sum) keeps log(sum)'s bits when
// |max| is large; -inf for an all-masked row. Kept apart from inverse_sum because the log is
// worth skipping when nobody asked for the lse.
inline double log_sum_exp(const SoftmaxState& s) noexcept {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  if (s.max == -kInf || s.sum == 0.0f) return -std::numeric_limits<double>::infinity();
  if (s.max == kInf) return static_cast<double>(kInf);
  return static_cast<double>(s.max) + std::log(static_cast<double>(s.sum));
}

}  // namespace qkv::kernels
