// The softmax's row statistics the tiled backward weighs with (bwd_fused_driver.h), computed
// by the backward itself from the scores it recomputes, not from the saved lse; the one
// exception is a bf16 call with bounded scores (forward_row_stats below), whose weights are
// rounded to bf16 anyway.
//
// Why: a weight recomputed as exp(x - lse) subtracts two large numbers. The lse of a row whose
// scores are near 4e4 carries a rounding error of about 4e4·2^-24 ≈ 2e-3 in float32 (the
// forward rounded it, the caller may have stored it), and the score the backward recomputes
// differs from the forward's by as much again (another summation order), so a weight near 1
// came out as 1 ± 2e-3: dV was off by 4e-4 to 3e-3 of its size at scores of 4e4, by more than
// its size at 3e7, while the plain float32 composition (S, softmax, Pᵀ·dO) stays near 3e-8.
// The composition is exact where it matters because it subtracts the row's maximum taken from
// the very scores it exponentiates: x_max - M = 0 exactly, and x - M is exact for every x
// within a factor of two of M (Sterbenz).
//
// The same holds for D_i, which dS = P∘(dP - D) subtracts from each dP_ij: the composition's
// D = Σ_j P_ij·dP_ij (autograd's softmax backward) cancels dP exactly where one weight is 1,
// while D = dO·O from the saved O (FlashAttention's) differs from the recomputed dP by
// dP's rounding, which dQ and dK then carry at |K| and |Q| times the size (dQ off by 50x
// its own size at scores of 4e4, where it is nearly 0).
//
// So the backward does what the composition does. Pass "stats", per query tile over every key
// tile of the row, with the same packing, the same products and the same score transform as
// the gradient pass (tile_logits below; dP = dO·Vᵀ by the same call), so each score and each
// dP has the same bits in both passes:
//
//   x    = tile_logits(Q_i, K_j)            scale·S (or softcap, ALiBi, mask); -inf if masked
//   dP   = dO_i·V_jᵀ
//   m'   = max(M_r, rowmax(x))
//   l_r  = l_r·exp(M_r - m') + Σ_c exp(x_rc - m')          (float64 running sums, tile by
//   u_r  = u_r·exp(M_r - m') + Σ_c exp(x_rc - m')·dP_rc     tile)
//   M_r  = m'
//
// starting from M_r = sink_h, l_r = 1 with a sink (its exp(sink - M) is the sink's share), or
// M_r = -inf, l_r = 0; u_r = 0. The gradient pass weighs P = exp(min(x - M_r, 0)) · inv_r with
// inv_r = 1 / l_r and uses D_r = u_r / l_r. A row with no allowed key gets M = +inf and inv =
// 0: P = 0 everywhere, never NaN.
//
// When the call sees only some of the row's keys (the ring's backward, one call per block),
// the caller gives the whole row's statistics (M*, l*) in float64 and the kernel still computes
// its own M over its keys: P = exp(x - M) · exp(M - M*) / l*, where M - M* is a difference of
// two scores of the row, exact when they are close (each block's M reaches the ring as the bits
// its kernel computed, BackwardParams::row_max).
//
// The caller may give D as well (bp.delta, whole-row values, the ring's): then it is used.
//
// Cost: two more products (Q·Kᵀ and dO·Vᵀ) and one more exponential per score than a backward
// that reads the lse and O (which does five products of that size); O(rows) memory.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/backward_params.h"
#include "core/half.h"
#include "core/mask_rule.h"
#include "core/parallel_for.h"

namespace qkv::kernels::bwd {

// Row statistics of one call's rows, [b][h][i]: `shift` is M (+inf for an empty row) and `inv`
// the factor each exp(x - M) is multiplied by; `max` and `sum` are M and l as computed (M =
// -inf for an empty row), float64 for the caller who asked for them (the ring).
template <class T>
struct RowStats {
  std::vector<T> shift, inv, delta;
  std::vector<double> max, sum, dot;  // M, l and u as computed
};

// One tile's scores into `x` (rows x ld): the product with the packed Kᵀ, then either
// scale·S stored (plain scores) with -inf where causal/window forbid a key and in the padding
// columns, or tile_scores' full transform. Both passes call this, so a score has the same bits
// in both; the scaled score is stored before any subtraction so no fused multiply-add can
// round scale·S - M differently from the max it is compared against.
template <class Ops, class T, class Products>
void tile_logits(const core::AttentionParams& p, bool plain, std::int64_t b, std::int64_t h,
                 std::int64_t i0, std::int64_t rows, std::int64_t j0, std::int64_t cols,
                 Products& products, std::int64_t ld, T* x, T* factor) noexcept {
  products.scores(x);
  if (plain) {
    Ops::scale_rows(x, rows, ld, static_cast<T>(p.scale));
    fill_forbidden(p, i0, rows, j0, cols, ld, x, -std::numeric_limits<T>::infinity());
  } else {
    tile_scores(p, b, h, i0, rows, j0, cols, ld, x, factor);
  }
}

// Rows of head h starting their statistics (M = -inf, l = 0, u = 0 already): with a sink, M is
// its score (a float64 parameter, as T weighs it) and l = 1 (its share).
template <class T>
void start_row_stats(const core::AttentionParams& p, std::int64_t h, std::int64_t rows,
                     double* m, double* l) noexcept {
  if (p.modifiers.sinks.empty()) return;
  const auto sink =
      static_cast<double>(static_cast<T>(p.modifiers.sinks[static_cast<std::size_t>(h)]));
  std::fill_n(m, rows, sink);
  std::fill_n(l, rows, 1.0);
}

// A worker's per-tile scratch for add_tile_to_row_stats.
template <class T>
struct TileStats {
  explicit TileStats(std::int64_t rows)
      : max(static_cast<std::size_t>(rows)), shift(static_cast<std::size_t>(rows)),
        sum(static_cast<std::size_t>(rows)), dot(static_cast<std::size_t>(rows)) {}
  std::vector<T> max, shift;
  std::vector<double> sum, dot;
};

// One key tile into its rows' M, l and u (the recurrence above): x the tile's scores (rows x
// ld), dp its dP. exp(x - M) is written into `scratch`, which may be x itself (the stats pass)
// or a copy's place (the row panels, which keep x).
template <class Ops, class T>
void add_tile_to_row_stats(const T* x, T* scratch, T* dp, std::int64_t rows, std::int64_t ld,
                           double* m, double* l, double* u, TileStats<T>& ts) noexcept {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  Ops::max_rows(x, rows, ld, ts.max.data());
  for (std::size_t r = 0; r < static_cast<std::size_t>(rows); ++r) {
    const double next = std::max(m[r], static_cast<double>(ts.max[r]));
    if (next == -kInf) {
      ts.shift[r] = std::numeric_limits<T>::infinity();  // nothing allowed yet: skip
      continue;
    }
    if (m[r] != next) {  // exp(-inf) = 0 for the first key
      const double rescale = std::exp(m[r] - next);
      l[r] *= rescale;
      u[r] *= rescale;
    }
    m[r] = next;
    ts.shift[r] = static_cast<T>(next);
  }
  if (scratch != x) std::copy_n(x, rows * ld, scratch);
  Ops::exp_sum_rows(scratch, dp, rows, ld, ts.shift.data(), ts.sum.data(), ts.dot.data());
  for (std::size_t r = 0; r < static_cast<std::size_t>(rows); ++r) {
    l[r] += ts.sum[r];
    u[r] += ts.dot[r];
  }
}

// A row's weighing from its statistics M, l and u: shift = M, inv = 1/l and D = u/l in T; a row
// with no allowed key (M = -inf) gets shift +inf and inv 0 (P = 0 everywhere) and D 0. Both
// drivers finish their rows with it: compute_row_stats and the row panels.
template <class T>
void finish_row_stats(double m, double l, double u, T& shift, T& inv, T& delta) noexcept {
  if (m == -std::numeric_limits<double>::infinity()) {
    shift = std::numeric_limits<T>::infinity();
    inv = T(0);
    delta = T(0);
    return;
  }
  shift = static_cast<T>(m);
  delta = static_cast<T>(u / l);
  inv = static_cast<T>(1.0 / l);
}

// Row `at` of `op` (cols values, the operand's column stride) widened to double: one switch
// on the storage type per row rather than per element.
inline void read_row(const core::InputOperand& op, std::int64_t at, std::int64_t cols,
                     double* to) noexcept {
  const std::int64_t step = op.strides.col;
  switch (op.dtype) {
    case DType::kF32: {
      const float* x = static_cast<const float*>(op.data) + at;
      for (std::int64_t c = 0; c < cols; ++c) to[c] = static_cast<double>(x[c * step]);
      return;
    }
    case DType::kBF16: {
      const auto* x = static_cast<const std::uint16_t*>(op.data) + at;
      for (std::int64_t c = 0; c < cols; ++c) to[c] = core::bf16_to_float(x[c * step]);
      return;
    }
    default:
      for (std::int64_t c = 0; c < cols; ++c) to[c] = core::load_real(op.data, op.dtype, at + c * step);
  }
}

// Scores bounded by this (|scale·q·k| + |ALiBi|) let a bf16 call weigh with the forward's lse
// (forward_row_stats).
inline constexpr double kForwardStatsScoreBound = 256.0;

// The largest Euclidean norm of a row of `op` ([b, heads, rows, cols]), from the values as
// stored.
inline double max_row_norm(const core::InputOperand& op, std::int64_t b, std::int64_t heads,
                           std::int64_t rows, std::int64_t cols, int threads) {
  const std::int64_t count = b * heads * rows;
  std::vector<double> squares(static_cast<std::size_t>(count), 0.0);
  core::parallel_for(count, threads, [&](std::int64_t begin, std::int64_t end) {
    std::vector<double> x(static_cast<std::size_t>(cols));
    for (std::int64_t r = begin; r < end; ++r) {
      read_row(op, op.strides.at(r / (heads * rows), (r / rows) % heads, r % rows, 0), cols,
               x.data());
      // Eight partial sums (a vector of them): one sum is a chain of dependent float64 adds,
      // which made this scan ~2 % of a bf16 backward. The order is the row's alone.
      constexpr std::int64_t kLanes = 8;
      double part[kLanes] = {};
      std::int64_t c = 0;
      for (; c + kLanes <= cols; c += kLanes) {
        for (std::int64_t l = 0; l < kLanes; ++l) {
          const double e = x[static_cast<std::size_t>(c + l)];
          part[l] += e * e;
        }
      }
      for (; c < cols; ++c) {
        const double e = x[static_cast<std::size_t>(c)];
        part[0] += e * e;
      }
      double sum = 0.0;
      for (const double e : part) sum += e;
      squares[static_cast<std::size_t>(r)] = sum;
    }
  });
  return count == 0 ? 0.0 : std::sqrt(*std::max_element(squares.begin(), squares.end()));
}

// Whether a bf16 call's rows may be weighed with its lse (forward_row_stats): it sees all of
// its rows' keys and is given none of their statistics, its lse is stored in float32 or
// float64, a bound on every score (Cauchy-Schwarz for scale·q·k, plus the largest ALiBi bias)
// is at most kForwardStatsScoreBound, and none of these hold:
//   - sinks: dsinks = -Σ_i P_sink·D_i cancels, and D from the bf16-stored O erred 1e3x the
//     composition's there;
//   - an explicit mask (a float mask's values are not bounded here; a bool mask may leave
//     rows a single key) or a window of one key (left = right = 0): where every weight is 1
//     the composition's dS is exactly 0, while dP - dO·O is dP's float32 rounding (dQ and dK
//     erred 9e-8 against an exact 0).
inline bool forward_stats_suit(const core::BackwardParams& bp) {
  const core::AttentionParams& p = bp.forward;
  const core::AttentionShape& s = p.shape;
  if (p.compute != DType::kBF16 || bp.row_max.data != nullptr || bp.stats_max != nullptr ||
      (bp.lse.dtype != DType::kF32 && bp.lse.dtype != DType::kF64) ||
      !p.modifiers.sinks.empty() || p.masking.mask != nullptr ||
      (p.masking.window_left == 0 && p.masking.window_right == 0)) {
    return false;
  }
  double alibi = 0.0;
  for (const double slope : p.modifiers.alibi_slopes) alibi = std::max(alibi, std::abs(slope));
  const double bound = alibi * static_cast<double>(s.nq + s.nk);
  if (bound > kForwardStatsScoreBound) return false;
  double scores = std::abs(p.scale) * max_row_norm(p.q, s.b, s.h, s.nq, s.d, p.threads) *
                  max_row_norm(p.k, s.b, s.hkv, s.nk, s.d, p.threads);
  if (p.modifiers.softcap > 0.0) scores = std::min(scores, p.modifiers.softcap);
  return bound + scores * (1.0 + 1e-2) <= kForwardStatsScoreBound;  // bf16 rounding's margin
}

// The rows' statistics from the forward instead (TilePlan::forward_stats, FlashAttention's
// backward): M = the call's lse, l = 1, and D = dO·O from the saved O, with dO as the products
// read it (rounded to bf16 in a bf16 call), summed in float64. No stats pass: the two products
// and the exponential it spends per score are saved. Only for bf16 calls whose scores are
// bounded (forward_stats_suit): the header's precision argument is about x - lse when scores
// are large; below kForwardStatsScoreBound, x - lse errs by at most about 2^-24·2^8 per weight
// (the lse's rounding and the other summation order of the forward's score), some 2^-7 of the
// bf16 rounding every weight then takes. D = dO·O differs from Σ P·dP by dP's float32
// rounding, far below the bf16 rounding of dS. Parallel over rows.
//
// Returns false, and the caller computes the statistics itself, when the saved O cannot be
// the forward's: a row of O is a weighted mean of V's rows (times dropout's 1/(1 - p) at
// most), so its norm is at most the largest of theirs; a larger one (beyond bf16 rounding)
// would make D, and every gradient with it, as wrong as O is, or overflow.
template <class T>
bool forward_row_stats(const core::BackwardParams& bp, RowStats<T>& st) {
  const core::AttentionParams& p = bp.forward;
  const core::AttentionShape& s = p.shape;
  const auto rows = static_cast<std::size_t>(s.b * s.h * s.nq);
  st.shift.assign(rows, T(0));
  st.inv.assign(rows, T(0));
  st.max.assign(rows, 0.0);
  st.sum.assign(rows, 1.0);
  st.dot.assign(rows, 0.0);
  st.delta.assign(rows, T(0));
  const bool round = rounds_to_bf16(bp.grad_out, p.compute);
  const double v_norm =
      max_row_norm(p.v, s.b, s.hkv, s.nk, s.dv, p.threads) * p.dropout.keep_scale;
  const double o_limit = v_norm * v_norm * (1.0 + 1e-2);  // of |O|², bf16's rounding of O
  std::vector<char> consistent(static_cast<std::size_t>(s.b * s.h), 1);
  core::parallel_for(s.b * s.h, p.threads, [&](std::int64_t begin, std::int64_t end) {
    std::vector<double> o(static_cast<std::size_t>(s.dv)), g(static_cast<std::size_t>(s.dv));
    for (std::int64_t bh = begin; bh < end; ++bh) {
      const std::int64_t b = bh / s.h, h = bh % s.h;
      for (std::int64_t i = 0; i < s.nq; ++i) {
        const auto row = static_cast<std::size_t>(bh * s.nq + i);
        const double lse = core::load_real(bp.lse.data, bp.lse.dtype, bp.lse.strides.at(b, h, i, 0));
        read_row(bp.out, bp.out.strides.at(b, h, i, 0), s.dv, o.data());
        read_row(bp.grad_out, bp.grad_out.strides.at(b, h, i, 0), s.dv, g.data());
        double dot = 0.0, squares = 0.0;
        for (std::int64_t c = 0; c < s.dv; ++c) {
          const auto at = static_cast<std::size_t>(c);
          dot += o[at] * (round ? core::round_to_storage(g[at], DType::kBF16) : g[at]);
          squares += o[at] * o[at];
        }
        if (!(squares <= o_limit)) consistent[static_cast<std::size_t>(bh)] = 0;
        st.max[row] = lse;
        st.dot[row] = dot;
        finish_row_stats(lse, 1.0, dot, st.shift[row], st.inv[row], st.delta[row]);
      }
    }
  });
  return std::all_of(consistent.begin(), consistent.end(), [](char c) { return c != 0; });
}

// The statistics of every row of the call (the pass described above), then `shift` and `inv`
// from them, or from the caller's whole-row statistics when bp.row_max is bound. Parallel over
// (b, h, query tile); each row's sums run over its key tiles in order, so no bit depends on the
// thread count.
template <class Ops, class T, class Products>
void compute_row_stats(const core::BackwardParams& bp, const TilePlan& plan, bool plain,
                       const typename Products::Shared& shared, RowStats<T>& st) {
  const core::AttentionParams& p = bp.forward;
  const core::AttentionShape& s = p.shape;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  const auto rows = static_cast<std::size_t>(s.b * s.h * s.nq);
  st.shift.assign(rows, T(0));
  st.inv.assign(rows, T(0));
  st.max.assign(rows, -kInf);
  st.sum.assign(rows, 0.0);
  st.dot.assign(rows, 0.0);
  st.delta.assign(rows, T(0));
  const std::int64_t query_tiles = (s.nq + plan.query_tile - 1) / plan.query_tile;
  const std::int64_t key_tiles = (s.nk + plan.key_tile - 1) / plan.key_tile;
  const std::int64_t group = s.group();
  core::parallel_for(s.b * s.h * query_tiles, p.threads, [&](std::int64_t begin,
                                                             std::int64_t end) {
    Tiles<T> t;
    t.allocate(s, plan, p.dropout.active());
    Products products(shared, bp, plan, t);
    TileStats<T> tile_stats(plan.query_tile);
    for (std::int64_t task = begin; task < end; ++task) {
      const std::int64_t qt = task % query_tiles;
      const std::int64_t h = (task / query_tiles) % s.h;
      const std::int64_t b = task / (query_tiles * s.h);
      const std::int64_t hk = h / group;
      const std::int64_t i0 = qt * plan.query_tile;
      const std::int64_t br = std::min(plan.query_tile, s.nq - i0);
      const std::size_t row0 = static_cast<std::size_t>((b * s.h + h) * s.nq + i0);
      double* const m = st.max.data() + row0;
      double* const l = st.sum.data() + row0;
      double* const u = st.dot.data() + row0;
      start_row_stats<T>(p, h, br, m, l);
      products.query_tile(b, h, i0, br);
      for (std::int64_t kt = 0; kt < key_tiles; ++kt) {
        const std::int64_t j0 = kt * plan.key_tile;
        const std::int64_t bc = std::min(plan.key_tile, s.nk - j0);
        if (tile_masked(p, i0, i0 + br, j0, j0 + bc)) continue;
        products.key_tile(b, hk, j0, bc, false);
        T* const x = t.p.data();
        T* const dp = t.ds.data();
        tile_logits<Ops, T>(p, plain, b, h, i0, br, j0, bc, products, t.bcp, x, t.factor.data());
        products.dp(dp);
        if (p.dropout.active()) {
          // D = dO·O, and O is made of the dropped weights: D = Σ P∘Z∘dP (dropout_mask
          // draws the gradient pass's Z).
          dropout_mask(p, b, h, i0, br, j0, bc, t.bcp, t.keep.data());
          apply_keep_bits(p.dropout, dp, t.keep.data(), br, t.bcp, dp);
        }
        add_tile_to_row_stats<Ops, T>(x, x, dp, br, t.bcp, m, l, u, tile_stats);
      }
    }
  });
  const bool given = bp.row_max.data != nullptr;
  for (std::int64_t b = 0; b < s.b; ++b) {
    for (std::int64_t h = 0; h < s.h; ++h) {
      for (std::int64_t i = 0; i < s.nq; ++i) {
        const auto row = static_cast<std::size_t>((b * s.h + h) * s.nq + i);
        const double own = st.max[row];
        finish_row_stats(own, st.sum[row], st.dot[row], st.shift[row], st.inv[row],
                         st.delta[row]);
        if (given && own != -kInf) {  // weighed by the caller's whole-row M and l instead
          const double whole_max =
              core::load_real(bp.row_max.data, bp.row_max.dtype, bp.row_max.strides.at(b, h, i, 0));
          const double whole_sum =
              core::load_real(bp.row_sum.data, bp.row_sum.dtype, bp.row_sum.strides.at(b, h, i, 0));
          st.inv[row] = static_cast<T>(std::exp(std::min(own - whole_max, 0.0)) / whole_sum);
        }
      }
    }
  }
}

}  // namespace qkv::kernels::bwd
