// The reference attention kernel: the contract's formulas (docs/interface.md), one query row at
// a time, in float64.
//
//   for each batch b, query head h (reading kv head h / (H/Hkv)), query row i:
//     q, k, v      read as stored, or rounded to the call's storage type (bf16/f16) first
//     r_ij = softcap(scale · (q_i · k_j)) + alibi_ij + bias_ij
//                  for every key j that causal/window allow, where
//                  softcap(x) = C·tanh(x/C) (without a softcap, x),
//                  alibi_ij = -slope_h · |i + nk - nq - j| (0 without ALiBi),
//                  bias is the float mask's value, or 0 / -inf for a bool mask
//     m    = max(max_j r_ij, sink_h)            (subtracted so exp never overflows; without
//                                              sinks, sink_h = -inf)
//     den  = exp(sink_h - m) + sum_j exp(r_ij - m)
//     w_ij = exp(r_ij - m) / den
//     z_ij = keep_ij / (1 - p)                 with dropout (core/dropout.h), else 1
//     O_i  = sum_j w_ij · z_ij · v_j           (the weights output is w_ij · z_ij)
//     lse_i = m + log(den)
//   A row with no allowed key (every r_ij = -inf) gives O_i = 0, w_i = 0 and lse_i = -inf, or
//   with a sink, lse_i = sink_h (the sink alone is the denominator).
//
// Every later kernel is tested against this one, so it stays simple: no tiling, no SIMD,
// float64 accumulation, one pass per row over an Nk-long scratch of scores. Rows are
// independent, so threads split them without changing a bit of the result.
#include <atomic>
#include <cmath>
#include <limits>
#include <new>
#include <vector>

#include "core/mask_rule.h"
#include "core/score_modifiers.h"
#include "core/parallel_for.h"
#include "core/progress.h"
#include "kernels/kernel.h"

namespace qkv::kernels {
namespace {

using core::AttentionParams;

constexpr double kInf = std::numeric_limits<double>::infinity();

void reference_row(const AttentionParams& p, std::int64_t b, std::int64_t h, std::int64_t i,
                   std::vector<double>& scores, std::vector<double>& acc) {
  const core::AttentionShape& s = p.shape;
  const core::ScoreModifiers& mod = p.modifiers;
  const std::int64_t hk = h / s.group();
  const std::int64_t diag = i + core::diagonal_offset(s, p.masking);
  const auto load = [&](const core::InputOperand& op, std::int64_t at) {
    return core::round_to_storage(core::load_real(op.data, op.dtype, at), p.compute);
  };
  const auto hs = static_cast<std::size_t>(h);
  const double slope = mod.alibi_slopes.empty() ? 0.0 : mod.alibi_slopes[hs];

  double max_score = -kInf;
  for (std::int64_t j = 0; j < s.nk; ++j) {
    double r = -kInf;
    if (core::structurally_allowed(p.masking, diag, j)) {
      const double bias = core::mask_bias(p.masking, b, h, i, j);
      if (bias != -kInf) {
        double dot = 0.0;
        for (std::int64_t c = 0; c < s.d; ++c) {
          dot += load(p.q, p.q.strides.at(b, h, i, c)) * load(p.k, p.k.strides.at(b, hk, j, c));
        }
        r = core::softcap(p.scale * dot, mod.softcap) + core::alibi_bias(slope, diag, j) + bias;
      }
    }
    scores[static_cast<std::size_t>(j)] = r;
    max_score = std::max(max_score, r);
  }
  // A sink is one more logit in the denominator, with no value.
  const double sink = mod.sinks.empty() ? -kInf : mod.sinks[hs];
  const double m = std::max(max_score, sink);

  // Turn scores into unnormalised weights exp(r - m). A score that overflowed to +inf (finite
  // inputs, astronomically large products) takes all the weight, shared with its equals.
  double sum = m == -kInf || m == kInf ? 0.0 : std::exp(sink - m);
  for (double& r : scores) {
    if (m == -kInf) {
      r = 0.0;
    } else if (m == kInf) {
      r = r == kInf ? 1.0 : 0.0;
    } else {
      r = std::exp(r - m);
    }
    sum += r;
  }
  const bool empty = max_score == -kInf;
  const double lse = m == -kInf ? -kInf : (m == kInf ? kInf : m + std::log(sum));

  std::fill(acc.begin(), acc.end(), 0.0);
  const core::Dropout& drop = p.dropout;
  for (std::int64_t j = 0; j < s.nk; ++j) {
    double w = empty ? 0.0 : scores[static_cast<std::size_t>(j)] / sum;
    // Dropout: w_ij·z_ij, one draw per weight straight from core/dropout.h's definition.
    if (drop.active() && w != 0.0) {
      w = core::dropout_keeps(drop, b, h, i, j) ? w * drop.keep_scale : 0.0;
    }
    scores[static_cast<std::size_t>(j)] = w;
    if (w == 0.0) continue;
    for (std::int64_t c = 0; c < s.dv; ++c) {
      acc[static_cast<std::size_t>(c)] +=
          w * load(p.v, p.v.strides.at(b, hk, j, c));
    }
  }

  for (std::int64_t c = 0; c < s.dv; ++c) {
    core::store_real(p.out.data, p.out.dtype, p.out.strides.at(b, h, i, c),
                     acc[static_cast<std::size_t>(c)]);
  }
  if (p.weights.data != nullptr) {
    for (std::int64_t j = 0; j < s.nk; ++j) {
      core::store_real(p.weights.data, p.weights.dtype, p.weights.strides.at(b, h, i, j),
                       scores[static_cast<std::size_t>(j)]);
    }
  }
  if (p.lse.data != nullptr) {
    core::store_real(p.lse.data, p.lse.dtype, p.lse.strides.at(b, h, i, 0), lse);
  }
}

}  // namespace

std::string attention_fwd_reference_declines(const AttentionParams&) { return {}; }

core::KernelStatus attention_fwd_reference(const AttentionParams& p) noexcept {
  const core::AttentionShape& s = p.shape;
  const std::int64_t rows = s.b * s.h * s.nq;
  std::atomic<bool> out_of_memory{false};
  try {
    core::parallel_for(rows, p.threads, [&](std::int64_t begin, std::int64_t end) {
      try {
        std::vector<double> scores(static_cast<std::size_t>(s.nk));
        std::vector<double> acc(static_cast<std::size_t>(s.dv));
        for (std::int64_t row = begin; row < end; ++row) {
          const std::int64_t i = row % s.nq;
          const std::int64_t h = (row / s.nq) % s.h;
          const std::int64_t b = row / (s.nq * s.h);
          reference_row(p, b, h, i, scores, acc);
          core::report_rows(p, 1);
        }
      } catch (const std::bad_alloc&) {
        out_of_memory.store(true, std::memory_order_relaxed);
      }
    });
  } catch (const std::bad_alloc&) {
    return core::KernelStatus::kOutOfMemory;
  }
  return out_of_memory ? core::KernelStatus::kOutOfMemory : core::KernelStatus::kOk;
}

}  // namespace qkv::kernels
