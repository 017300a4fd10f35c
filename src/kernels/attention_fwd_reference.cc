// The reference attention kernel: the seed's formulas, one query row at a time, in float64.
//
//   for each batch b, query head h (reading kv head h / (H/Hkv)), query row i:
//     r_ij = scale · (q_i · k_j) + bias_ij     for every key j that causal/window allow,
//            where bias is the float mask's value, or 0 / -inf for a bool mask
//     m    = max_j r_ij                         (subtracted so exp never overflows)
//     w_ij = exp(r_ij - m) / sum_j exp(r_ij - m)
//     O_i  = sum_j w_ij · v_j
//     lse_i = m + log(sum_j exp(r_ij - m))
//   A row with no allowed key (every r_ij = -inf) gives O_i = 0, w_i = 0, lse_i = -inf.
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
#include "core/parallel_for.h"
#include "kernels/kernel.h"

namespace qkv::kernels {
namespace {

using core::AttentionParams;

constexpr double kInf = std::numeric_limits<double>::infinity();

void reference_row(const AttentionParams& p, std::int64_t b, std::int64_t h, std::int64_t i,
                   std::vector<double>& scores, std::vector<double>& acc) {
  const core::AttentionShape& s = p.shape;
  const std::int64_t hk = h / s.group();
  const std::int64_t diag = i + s.diagonal_offset();

  double max_score = -kInf;
  for (std::int64_t j = 0; j < s.nk; ++j) {
    double r = -kInf;
    if (core::structurally_allowed(p.masking, diag, j)) {
      const double bias = core::mask_bias(p.masking, b, h, i, j);
      if (bias != -kInf) {
        double dot = 0.0;
        for (std::int64_t c = 0; c < s.d; ++c) {
          dot += core::load_real(p.q.data, p.q.dtype, p.q.strides.at(b, h, i, c)) *
                 core::load_real(p.k.data, p.k.dtype, p.k.strides.at(b, hk, j, c));
        }
        r = p.scale * dot + bias;
      }
    }
    scores[static_cast<std::size_t>(j)] = r;
    max_score = std::max(max_score, r);
  }

  // Turn scores into unnormalised weights exp(r - m). A score that overflowed to +inf (finite
  // inputs, astronomically large products) takes all the weight, shared with its equals.
  double sum = 0.0;
  for (double& r : scores) {
    if (max_score == -kInf) {
      r = 0.0;
    } else if (max_score == kInf) {
      r = r == kInf ? 1.0 : 0.0;
    } else {
      r = std::exp(r - max_score);
    }
    sum += r;
  }
  const bool empty = max_score == -kInf;
  const double lse = empty ? -kInf : (max_score == kInf ? kInf : max_score + std::log(sum));

  std::fill(acc.begin(), acc.end(), 0.0);
  for (std::int64_t j = 0; j < s.nk; ++j) {
    const double w = empty ? 0.0 : scores[static_cast<std::size_t>(j)] / sum;
    scores[static_cast<std::size_t>(j)] = w;
    if (w == 0.0) continue;
    for (std::int64_t c = 0; c < s.dv; ++c) {
      acc[static_cast<std::size_t>(c)] +=
          w * core::load_real(p.v.data, p.v.dtype, p.v.strides.at(b, hk, j, c));
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
