// The reference attention backward: the formulas of attention_backward.h, one query row at a
// time, in float64.
//
//   for each batch b and kv head hk (one task: it owns dK and dV of hk, dQ of its query heads):
//     for each query head h reading hk, query row i:
//       s_ij  = scale · q_i·k_j                       (every key causal/window/mask allow)
//       r_ij  = softcap(s_ij) + alibi_ij + bias_ij     (the forward's score)
//       P_ij  = exp(r_ij - m) / den, P_sink = exp(sink_h - m) / den    (the forward's softmax)
//       z_ij  = keep_ij / (1 - p) with dropout (core/dropout.h), else 1
//       O_i   = Σ_j P_ij·z_ij · v_j;   D_i = dO_i · O_i
//       dP_ij = dO_i · v_j;       dS_ij = P_ij · (z_ij·dP_ij - D_i) · (1 - tanh²(s_ij / C))
//       dQ_i  = scale · Σ_j dS_ij · k_j
//       dK_j += scale · dS_ij · q_i;   dV_j += P_ij·z_ij · dO_i;   dsink_h -= P_sink · D_i
//
// It recomputes the softmax and O from Q, K and V (out and lse are not read), so that it
// states the gradient of the function itself; the fused kernels, which trust the saved out
// and lse, are tested against it. Every sum runs over j (or h, then i) in order, so the task
// split, and hence the thread count, changes no bit. dsinks sums per (b, h) first, then over b.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <new>
#include <vector>

#include "core/mask_rule.h"
#include "core/parallel_for.h"
#include "core/progress.h"
#include "core/score_modifiers.h"
#include "kernels/backward_kernel.h"

namespace qkv::kernels {
namespace {

using core::BackwardParams;

constexpr double kInf = std::numeric_limits<double>::infinity();

struct RowScratch {
  std::vector<double> pre;          // [nk] scale · q·k before the softcap
  std::vector<double> prob;         // [nk] P_ij (0 where not allowed)
  std::vector<double> keep;         // [nk] dropout's z_ij (1 without dropout)
  std::vector<double> q, dout, dq;  // [d], [dv], [d]
};

// One query row's contribution: dQ_i written, dK/dV (float64, [nk, d] / [nk, dv] of this kv
// head) accumulated; returns -P_sink · D_i.
double reference_row(const BackwardParams& bp, std::int64_t b, std::int64_t h, std::int64_t i,
                     RowScratch& r, std::vector<double>& dk, std::vector<double>& dv) {
  const core::AttentionParams& p = bp.forward;
  const core::AttentionShape& s = p.shape;
  const core::ScoreModifiers& mod = p.modifiers;
  const std::int64_t hk = h / s.group();
  const std::int64_t diag = i + core::diagonal_offset(s, p.masking);
  const auto hs = static_cast<std::size_t>(h);
  // A bf16 call reads Q, K, V and dO rounded to bf16 (the same rounded inputs the kernels see).
  const auto load = [&](const core::InputOperand& op, std::int64_t at) {
    return core::round_to_storage(core::load_real(op.data, op.dtype, at), p.compute);
  };
  const auto k_at = [&](std::int64_t j, std::int64_t c) {
    return load(p.k, p.k.strides.at(b, hk, j, c));
  };
  const auto v_at = [&](std::int64_t j, std::int64_t c) {
    return load(p.v, p.v.strides.at(b, hk, j, c));
  };
  for (std::int64_t c = 0; c < s.d; ++c)
    r.q[static_cast<std::size_t>(c)] = load(p.q, p.q.strides.at(b, h, i, c));
  for (std::int64_t c = 0; c < s.dv; ++c) {
    r.dout[static_cast<std::size_t>(c)] = load(bp.grad_out, bp.grad_out.strides.at(b, h, i, c));
  }
  const double slope = mod.alibi_slopes.empty() ? 0.0 : mod.alibi_slopes[hs];

  // The forward's scores and softmax.
  double max_score = -kInf;
  for (std::int64_t j = 0; j < s.nk; ++j) {
    const auto js = static_cast<std::size_t>(j);
    r.prob[js] = -kInf;
    r.pre[js] = 0.0;
    if (!core::structurally_allowed(p.masking, diag, j)) continue;
    const double bias = core::mask_bias(p.masking, b, h, i, j);
    if (bias == -kInf) continue;
    double dot = 0.0;
    for (std::int64_t c = 0; c < s.d; ++c) dot += r.q[static_cast<std::size_t>(c)] * k_at(j, c);
    r.pre[js] = p.scale * dot;
    r.prob[js] = core::softcap(r.pre[js], mod.softcap) + core::alibi_bias(slope, diag, j) + bias;
    max_score = std::max(max_score, r.prob[js]);
  }
  const double sink = mod.sinks.empty() ? -kInf : mod.sinks[hs];
  const double m = std::max(max_score, sink);
  std::fill(r.dq.begin(), r.dq.end(), 0.0);
  const auto store_dq = [&] {
    if (bp.dq.data == nullptr) return;
    for (std::int64_t c = 0; c < s.d; ++c) {
      core::store_real(bp.dq.data, bp.dq.dtype, bp.dq.strides.at(b, h, i, c),
                       r.dq[static_cast<std::size_t>(c)]);
    }
  };
  if (max_score == -kInf) {  // no allowed key: P = 0, nothing flows (a sink alone has D = 0)
    store_dq();
    return 0.0;
  }
  double den = sink == -kInf ? 0.0 : std::exp(sink - m);
  for (double& x : r.prob) {
    x = x == -kInf ? 0.0 : std::exp(x - m);
    den += x;
  }
  for (double& x : r.prob) x /= den;
  const double p_sink = sink == -kInf ? 0.0 : std::exp(sink - m) / den;

  // Dropout's factors z_ij = keep_ij / (1 - p) (1 without dropout).
  const core::Dropout& drop = p.dropout;
  for (std::int64_t j = 0; j < s.nk; ++j) {
    const auto js = static_cast<std::size_t>(j);
    r.keep[js] = 1.0;
    if (drop.active()) r.keep[js] = core::dropout_keeps(drop, b, h, i, j) ? drop.keep_scale : 0.0;
  }

  // D_i = dO_i · O_i with O_i = Σ_j P_ij z_ij v_j.
  double d_i = 0.0;
  for (std::int64_t c = 0; c < s.dv; ++c) {
    double o = 0.0;
    for (std::int64_t j = 0; j < s.nk; ++j) {
      const double w = r.prob[static_cast<std::size_t>(j)] * r.keep[static_cast<std::size_t>(j)];
      if (w != 0.0) o += w * v_at(j, c);
    }
    d_i += r.dout[static_cast<std::size_t>(c)] * o;
  }

  for (std::int64_t j = 0; j < s.nk; ++j) {
    const auto js = static_cast<std::size_t>(j);
    const double w = r.prob[js];
    if (w == 0.0) continue;
    double dp = 0.0;
    for (std::int64_t c = 0; c < s.dv; ++c) dp += r.dout[static_cast<std::size_t>(c)] * v_at(j, c);
    const double z = r.keep[js];
    double ds = w * (z * dp - d_i);
    if (mod.softcap > 0.0) {
      const double t = std::tanh(r.pre[js] / mod.softcap);
      ds *= 1.0 - t * t;
    }
    for (std::int64_t c = 0; c < s.d; ++c) {
      const auto cs = static_cast<std::size_t>(c);
      r.dq[cs] += p.scale * ds * k_at(j, c);
      dk[js * static_cast<std::size_t>(s.d) + cs] += p.scale * ds * r.q[cs];
    }
    for (std::int64_t c = 0; c < s.dv; ++c) {
      const auto cs = static_cast<std::size_t>(c);
      dv[js * static_cast<std::size_t>(s.dv) + cs] += w * z * r.dout[cs];
    }
  }
  store_dq();
  return -p_sink * d_i;
}

}  // namespace

std::string attention_bwd_reference_declines(const BackwardParams&) { return {}; }

core::KernelStatus attention_bwd_reference(const BackwardParams& bp) noexcept {
  const core::AttentionShape& s = bp.forward.shape;
  const std::int64_t tasks = s.b * s.hkv;
  std::atomic<bool> out_of_memory{false};
  try {
    std::vector<double> dsink_bh(static_cast<std::size_t>(s.b * s.h), 0.0);
    core::parallel_for(tasks, bp.forward.threads, [&](std::int64_t begin, std::int64_t end) {
      try {
        RowScratch r;
        r.pre.resize(static_cast<std::size_t>(s.nk));
        r.prob.resize(static_cast<std::size_t>(s.nk));
        r.keep.resize(static_cast<std::size_t>(s.nk));
        r.q.resize(static_cast<std::size_t>(s.d));
        r.dout.resize(static_cast<std::size_t>(s.dv));
        r.dq.resize(static_cast<std::size_t>(s.d));
        std::vector<double> dk(static_cast<std::size_t>(s.nk * s.d));
        std::vector<double> dv(static_cast<std::size_t>(s.nk * s.dv));
        for (std::int64_t task = begin; task < end; ++task) {
          const std::int64_t b = task / s.hkv;
          const std::int64_t hk = task % s.hkv;
          std::fill(dk.begin(), dk.end(), 0.0);
          std::fill(dv.begin(), dv.end(), 0.0);
          for (std::int64_t h = hk * s.group(); h < (hk + 1) * s.group(); ++h) {
            double dsink = 0.0;
            for (std::int64_t i = 0; i < s.nq; ++i) dsink += reference_row(bp, b, h, i, r, dk, dv);
            dsink_bh[static_cast<std::size_t>(b * s.h + h)] = dsink;
          }
          for (std::int64_t j = 0; j < s.nk; ++j) {
            const auto js = static_cast<std::size_t>(j);
            if (bp.dk.data != nullptr) {
              for (std::int64_t c = 0; c < s.d; ++c) {
                core::store_real(
                    bp.dk.data, bp.dk.dtype, bp.dk.strides.at(b, hk, j, c),
                    dk[js * static_cast<std::size_t>(s.d) + static_cast<std::size_t>(c)]);
              }
            }
            if (bp.dv.data != nullptr) {
              for (std::int64_t c = 0; c < s.dv; ++c) {
                core::store_real(
                    bp.dv.data, bp.dv.dtype, bp.dv.strides.at(b, hk, j, c),
                    dv[js * static_cast<std::size_t>(s.dv) + static_cast<std::size_t>(c)]);
              }
            }
          }
          core::report_rows(bp.forward, s.nk);  // this (b, kv head)'s key rows are written
        }
      } catch (const std::bad_alloc&) {
        out_of_memory.store(true, std::memory_order_relaxed);
      }
    });
    if (bp.dsinks != nullptr) {
      for (std::int64_t h = 0; h < s.h; ++h) {
        for (std::int64_t b = 0; b < s.b; ++b) {
          bp.dsinks[h] += dsink_bh[static_cast<std::size_t>(b * s.h + h)];
        }
      }
    }
  } catch (const std::bad_alloc&) {
    return core::KernelStatus::kOutOfMemory;
  }
  return out_of_memory ? core::KernelStatus::kOutOfMemory : core::KernelStatus::kOk;
}

}  // namespace qkv::kernels
