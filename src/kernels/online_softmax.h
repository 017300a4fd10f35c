// The running state of an online softmax and its rules.
//
// A partial softmax over some keys of one query row is (max, sum): max = the largest score seen,
// sum = sum_j exp(r_j - max). Its accumulator, kept beside it by the caller, is
// acc = sum_j exp(r_j - max) · v_j. When a new max arrives (max' >= max), sum and acc move to it
// by the factor exp(max - max') (rescale_factor), after which the new keys' exp(r_j - max') add
// in directly; at the end O = acc / sum (inverse_sum) and lse = max + log(sum) (log_sum_exp).
// The fused kernels apply this tile by tile; a later split-KV or distributed ring would merge
// two partial states with the same factor on each side.
//
// Edge cases follow the contract: an all-masked state (max = -inf, sum = 0) contributes factor
// 0, so a row that stays all-masked gives zeros and lse = -inf, never NaN. A score that
// overflowed to +inf (finite float inputs, astronomically large products) takes all the weight,
// shared with its equals, as in the float64 reference.
//
// The element type F is float for every float32 kernel and double for the fused kernel's
// float64 path; SoftmaxState is the float32 state.
#pragma once

#include <cmath>
#include <limits>

namespace qkv::kernels {

template <class F>
struct BasicSoftmaxState {
  F max = -std::numeric_limits<F>::infinity();
  F sum = F{0};  // sum_j exp(r_j - max); 0 for an all-masked state
};
using SoftmaxState = BasicSoftmaxState<float>;

// The factor exp(from - to) that moves a state kept against max `from` to the max `to`
// (to >= from), with the -inf and +inf cases of the contract. `exp` is the caller's: the fused
// kernels pass the exp of their vector code, so that a row takes the same bits on every path.
template <class F, class Exp>
inline F rescale_factor(F from, F to, Exp exp) noexcept {
  constexpr F kInf = std::numeric_limits<F>::infinity();
  if (from == -kInf) return F{0};
  if (from == to) return F{1};  // the common case once the max has settled: no exp call
  if (to == kInf) return F{0};
  return exp(from - to);
}

// The merge primitive: two partial states of one row over disjoint sets of keys (two key tiles,
// two split-KV chunks, two ranks of a ring) become one. `into` takes the merged state; the
// caller multiplies into's accumulator by `into` and part's by `part` and adds them. Both
// all-masked: factors 0 and the state stays all-masked.
struct MergeFactors {
  float into = 0.0f;
  float part = 0.0f;
};

template <class Exp>
inline MergeFactors merge_states(SoftmaxState& into, const SoftmaxState& part, Exp exp) noexcept {
  const float max = into.max > part.max ? into.max : part.max;
  const MergeFactors f{rescale_factor(into.max, max, exp), rescale_factor(part.max, max, exp)};
  into.sum = f.into * into.sum + f.part * part.sum;
  into.max = max;
  return f;
}

// The finished row's factor 1/sum for the accumulator: 0 for an all-masked row, whose
// accumulator is zero.
template <class F>
inline F inverse_sum(const BasicSoftmaxState<F>& s) noexcept {
  constexpr F kInf = std::numeric_limits<F>::infinity();
  if (s.max == -kInf || s.sum == F{0}) return F{0};
  return F{1} / s.sum;
}

// The finished row's log-sum-exp, in double so that max + log(sum) keeps log(sum)'s bits when
// |max| is large; -inf for an all-masked row. Kept apart from inverse_sum because the log is
// worth skipping when nobody asked for the lse.
template <class F>
inline double log_sum_exp(const BasicSoftmaxState<F>& s) noexcept {
  constexpr F kInf = std::numeric_limits<F>::infinity();
  if (s.max == -kInf || s.sum == F{0}) return -std::numeric_limits<double>::infinity();
  if (s.max == kInf) return static_cast<double>(kInf);
  return static_cast<double>(s.max) + std::log(static_cast<double>(s.sum));
}

}  // namespace qkv::kernels
