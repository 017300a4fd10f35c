// The tiled backward with each query tile's scores and dP kept between its row statistics and
// its gradients ("row panels"), so that the five products of FlashAttention-2's backward are
// all it computes: run_backward (bwd_fused_driver.h) hands a call here when the panels fit.
//
// Why: the backward weighs with row statistics it computes itself, from the very scores it
// exponentiates (bwd_row_stats.h says why: exp(x - lse) and D = dO·O lose the gradients'
// precision as scores grow). Done as a separate pass, that recomputes S = Q·Kᵀ and dP = dO·Vᵀ
// for every tile: seven products where FlashAttention has five, and the backward fell behind
// torch 2.13's (0.61-0.96x on a Xeon, docs/performance.md). Here a task goes through a query
// tile's keys twice in a row:
//
//   sweep 1, per key tile j:   x_j = tile_logits(Q_i, K_j), dP_j = dO_i·V_jᵀ (∘ Z with
//                              dropout, its mask kept as bits), both kept in the panel;
//                              M, l, u updated exactly as the stats pass does (the same
//                              calls in the same order)
//   then M, 1/l and D = u/l of the tile's rows
//   sweep 2, per key tile j:   P from the kept x_j (weigh_rows), dS from the kept dP_j,
//                              dV_j += Pᵀ·dO_i, dK_j += dSᵀ·Q_i, dQ_i += dS·K_j
//
// so every score, weight and dS has the bits the two-pass driver gives it. Tasks are (query
// chunk c, b, kv head hk): a task owns the dQ rows of its chunk's query tiles (each heads of
// the group) and accumulates dK and dV of all keys of (b, hk) in its own buffer, which it
// writes out when it is the only chunk, else pass 2 adds the chunks' buffers in chunk order.
// With one chunk, dK_j and dV_j take their terms in the two-pass driver's order (heads, then
// query tiles), and dQ_i its key tiles in order: the same bits as run_backward's pass 1 with
// one key chunk. The number of chunks depends on the shape alone, so no bit depends on the
// thread count.
//
// Memory per thread: the panel, (2, plus 1 with a softcap)·Br·Nk' elements (Nk' = Nk
// rounded up to whole key tiles), with dropout Br·Nk'/8 bytes of keep masks (drawn once, in
// sweep 1), every key tile of one kv head packed (FloatProducts: Nk'·(dp + d +
// dv) elements; bf16's products are packed for the call already), and with one chunk a dK/dV
// buffer of Nk'·(dp + dvp) elements; with more chunks, chunks·B·Hkv such buffers in all.
// row_panel_plan keeps these within the caps below, else the two-pass driver runs.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <new>
#include <span>
#include <vector>

#include "core/backward_params.h"
#include "core/parallel_for.h"
#include "core/progress.h"

namespace qkv::kernels::bwd {

// A worker's panel and packed keys up to this size: past it (Nk above ~8k at Br = 128 in
// float32) the two-pass driver runs, whose memory does not grow with Nk.
inline constexpr double kRowPanelBytesCap = 12.0 * 1024 * 1024;

struct RowPanelPlan {
  bool use = false;
  std::int64_t chunks = 1;  // query chunks per (b, hk)
};

// Whether the row-panel driver takes this call and with how many query chunks: the call sees
// all of its rows' keys and has nothing given for them (not one of the ring's block calls),
// and the panel fits. Chunks: enough tasks for kTargetTasks when B·Hkv is small, their dK/dV
// buffers within kPartialBytesCap.
inline RowPanelPlan row_panel_plan(const core::BackwardParams& bp, const TilePlan& plan,
                                   std::size_t element) noexcept {
  RowPanelPlan r;
  const core::AttentionShape& s = bp.forward.shape;
  if (!plan.row_panels || bp.row_max.data != nullptr || bp.stats_max != nullptr ||
      bp.delta.data != nullptr) {
    return r;
  }
  const std::int64_t key_tiles = (s.nk + plan.key_tile - 1) / plan.key_tile;
  const double keys = static_cast<double>(key_tiles * plan.key_tile);
  const double lanes = 64.0 / static_cast<double>(element);
  const auto padded_width = [&](std::int64_t n) {
    return std::ceil(static_cast<double>(n) / lanes) * lanes;
  };
  const double bcp = padded_width(plan.key_tile);
  const double panels = 2.0 + (bp.forward.modifiers.softcap > 0.0 ? 1.0 : 0.0);
  // Dropout's masks: 8-byte words of 64 keys, counted in elements.
  const double masks = bp.forward.dropout.active()
                           ? std::ceil(bcp / 64.0) * 8.0 / static_cast<double>(element)
                           : 0.0;
  const double panel = (panels * bcp + masks) * static_cast<double>(plan.query_tile) *
                       static_cast<double>(key_tiles);
  const double packed_keys =
      keys * padded_width(s.d) + static_cast<double>(key_tiles) * bcp *
                                     static_cast<double>(s.d + s.dv);
  if ((panel + packed_keys) * static_cast<double>(element) > kRowPanelBytesCap) return r;
  r.use = true;
  const std::int64_t groups = s.b * s.hkv;
  const std::int64_t query_tiles = (s.nq + plan.query_tile - 1) / plan.query_tile;
  if (groups == 0 || query_tiles == 0) return r;
  const double buffer =
      keys * (padded_width(s.d) + padded_width(s.dv)) * static_cast<double>(element);
  std::int64_t chunks = std::min((kTargetTasks + groups - 1) / groups, query_tiles);
  while (chunks > 1 && static_cast<double>(chunks * groups) * buffer > kPartialBytesCap) --chunks;
  r.chunks = std::max<std::int64_t>(chunks, 1);
  return r;
}

// An upper bound on the chunks' dK/dV buffers (when B·Hkv < kTargetTasks) for any tile up to
// 256 keys, from the shape alone: the backward's memory estimate (attention_backward.cc).
inline double row_panel_chunk_bytes_bound(const core::AttentionShape& s,
                                          std::size_t element) noexcept {
  const std::int64_t groups = s.b * s.hkv;
  if (groups <= 0 || groups >= kTargetTasks) return 0.0;
  const double chunks = static_cast<double>((kTargetTasks + groups - 1) / groups);
  const double keys = static_cast<double>(s.nk + 255);
  const double widths = static_cast<double>(s.d + s.dv + 32);
  return std::min(kPartialBytesCap, chunks * static_cast<double>(groups) * keys * widths *
                                        static_cast<double>(element));
}

template <class Ops, class T, class Products>
core::KernelStatus run_backward_by_query_rows(const core::BackwardParams& bp,
                                              const TilePlan& plan,
                                              const RowPanelPlan& panel_plan) noexcept {
  const core::AttentionParams& p = bp.forward;
  const core::AttentionShape& s = p.shape;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  const std::int64_t rows = s.b * s.h * s.nq;
  const std::int64_t group = s.group();
  const std::int64_t chunks = panel_plan.chunks;
  const std::int64_t key_tiles = (s.nk + plan.key_tile - 1) / plan.key_tile;
  const std::int64_t query_tiles = (s.nq + plan.query_tile - 1) / plan.query_tile;
  const std::int64_t tiles_per_chunk = (query_tiles + chunks - 1) / chunks;
  const bool plain_scores =
      p.modifiers.softcap <= 0.0 && p.modifiers.alibi_slopes.empty() && p.masking.mask == nullptr;
  const bool softcap = p.modifiers.softcap > 0.0;
  const bool bf16 = p.compute == DType::kBF16;
  const auto scale = static_cast<T>(p.scale);
  const std::int64_t dp_width = padded<T>(s.d), dvp_width = padded<T>(s.dv);
  const std::int64_t bcp = padded<T>(plan.key_tile);
  const std::int64_t key_rows = key_tiles * plan.key_tile;
  const std::int64_t buffer = key_rows * (dp_width + dvp_width);  // one task's dK and dV
  std::atomic<bool> out_of_memory{false};
  try {
    const typename Products::Shared shared = Products::prepare(bp, plan);
    // Each row's M, l and u as the stats pass has them (the sinks' gradients read them).
    std::vector<double> row_max(static_cast<std::size_t>(rows), -kInf);
    std::vector<double> row_sum(static_cast<std::size_t>(rows), 0.0);
    std::vector<double> row_dot(static_cast<std::size_t>(rows), 0.0);
    // Never empty (at least one element), so that no pointer below is null + 0 when Nk = 0.
    const std::int64_t chunk_elements = chunks > 1 ? std::max<std::int64_t>(
                                                         chunks * s.b * s.hkv * buffer, 1)
                                                   : 0;
    std::vector<T> chunk_buffers(static_cast<std::size_t>(chunk_elements));

    const std::int64_t tasks = s.b * s.hkv * chunks;
    std::atomic<std::int64_t> next{0};
    const auto workers = static_cast<int>(std::clamp<std::int64_t>(tasks, 1, p.threads));
    core::run_team(workers, [&](int, core::Team&) {
      try {
        Tiles<T> t;
        t.allocate(s, plan, p.dropout.active() || bf16);
        Products products(shared, bp, plan, t);
        const std::int64_t slot = plan.query_tile * bcp;  // one tile of the panel
        const bool dropout = p.dropout.active();
        std::vector<T> panel(static_cast<std::size_t>(
            std::max<std::int64_t>(key_tiles * slot * (2 + (softcap ? 1 : 0)), 1)));
        T* const xs = panel.data();
        T* const dps = xs + key_tiles * slot;
        T* const factors = softcap ? dps + key_tiles * slot : t.factor.data();
        // Dropout's keep masks (keep_words), drawn once in sweep 1 and kept for sweep 2's P∘Z.
        const std::int64_t keep_slot = plan.query_tile * keep_words(bcp);
        std::vector<std::uint64_t> keeps(
            static_cast<std::size_t>(dropout ? key_tiles * keep_slot : 0));
        std::vector<T> own_buffer(
            chunks == 1 ? static_cast<std::size_t>(std::max<std::int64_t>(buffer, 1)) : 0);
        const auto tile_rows = static_cast<std::size_t>(plan.query_tile);
        TileStats<T> tile_stats(plan.query_tile);
        std::vector<T> shift(tile_rows), inv(tile_rows), delta(tile_rows);
        for (std::int64_t task = next.fetch_add(1); task < tasks; task = next.fetch_add(1)) {
          const std::int64_t c = task / (s.b * s.hkv);
          const std::int64_t hk = task % s.hkv;
          const std::int64_t b = (task / s.hkv) % s.b;
          T* const dk_all =
              chunks == 1 ? own_buffer.data()
                          : chunk_buffers.data() + ((c * s.b + b) * s.hkv + hk) * buffer;
          T* const dv_all = dk_all + key_rows * dp_width;
          std::fill_n(dk_all, buffer, T(0));
          products.pack_keys(b, hk);
          const std::int64_t qt0 = c * tiles_per_chunk;
          const std::int64_t qt1 = std::min(query_tiles, qt0 + tiles_per_chunk);
          for (std::int64_t h = hk * group; h < (hk + 1) * group; ++h) {
            for (std::int64_t qt = qt0; qt < qt1; ++qt) {
              const std::int64_t i0 = qt * plan.query_tile;
              const std::int64_t br = std::min(plan.query_tile, s.nq - i0);
              const std::size_t row0 = static_cast<std::size_t>((b * s.h + h) * s.nq + i0);
              double* const m = row_max.data() + row0;
              double* const l = row_sum.data() + row0;
              double* const u = row_dot.data() + row0;
              start_row_stats<T>(p, h, br, m, l);
              products.query_tile(b, h, i0, br);

              // Sweep 1: the scores and dP of every key tile, kept; the row statistics.
              for (std::int64_t kt = 0; kt < key_tiles; ++kt) {
                const std::int64_t j0 = kt * plan.key_tile;
                const std::int64_t bc = std::min(plan.key_tile, s.nk - j0);
                if (tile_masked(p, i0, i0 + br, j0, j0 + bc)) continue;
                products.packed_key_tile(kt, bc);
                T* const x = xs + kt * slot;
                T* const dpt = dps + kt * slot;
                T* const factor = softcap ? factors + kt * slot : factors;
                tile_logits<Ops, T>(p, plain_scores, b, h, i0, br, j0, bc, products, bcp, x,
                                    factor);
                products.dp(dpt);
                if (dropout) {
                  std::uint64_t* const keep = keeps.data() + kt * keep_slot;
                  dropout_mask(p, b, h, i0, br, j0, bc, bcp, keep);
                  apply_keep_bits(p.dropout, dpt, keep, br, bcp, dpt);
                }
                // The panel keeps x: exp(x - M) goes into the worker's P tile.
                add_tile_to_row_stats<Ops, T>(x, t.p.data(), dpt, br, bcp, m, l, u, tile_stats);
              }
              // The tile's rows' M, 1/l and D, as compute_row_stats finishes them.
              for (std::size_t r = 0; r < static_cast<std::size_t>(br); ++r) {
                finish_row_stats(m[r], l[r], u[r], shift[r], inv[r], delta[r]);
              }

              // Sweep 2: the gradients from the kept tiles.
              for (std::int64_t r = 0; r < br; ++r) {
                std::fill_n(grad_row<T>(bp.dq, b, h, i0 + r), s.d, T(0));
              }
              for (std::int64_t kt = 0; kt < key_tiles; ++kt) {
                const std::int64_t j0 = kt * plan.key_tile;
                const std::int64_t bc = std::min(plan.key_tile, s.nk - j0);
                if (tile_masked(p, i0, i0 + br, j0, j0 + bc)) continue;
                products.packed_key_tile(kt, bc);
                T* const pt = xs + kt * slot;
                T* const ds = dps + kt * slot;
                Ops::weigh_rows(pt, br, bcp, shift.data(), inv.data());
                const T* pv = pt;
                if (dropout) {  // dV takes P∘Z (dropout_tile's product, the mask as kept)
                  T* const pd = t.pd.data();
                  apply_keep_bits(p.dropout, pt, keeps.data() + kt * keep_slot, br, bcp, pd);
                  pv = pd;
                }
                // The products accumulate into t.dk and t.dv: this key tile's rows of the
                // task's buffers.
                t.dk = std::span<T>(dk_all + j0 * dp_width,
                                    static_cast<std::size_t>(plan.key_tile * dp_width));
                t.dv = std::span<T>(dv_all + j0 * dvp_width,
                                    static_cast<std::size_t>(plan.key_tile * dvp_width));
                products.add_dv(pv);
                Ops::ds_rows(ds, pt, softcap ? factors + kt * slot : nullptr, br, bcp, scale,
                             delta.data());
                products.add_dk_dq(ds);
                for (std::int64_t r = 0; r < br; ++r) {
                  T* dst = grad_row<T>(bp.dq, b, h, i0 + r);
                  const T* src = t.dq.data() + r * dp_width;
                  for (std::int64_t col = 0; col < s.d; ++col) dst[col] += src[col];
                }
              }
            }
          }
          if (chunks == 1) {
            for (std::int64_t j = 0; j < s.nk; ++j) {
              std::copy_n(dk_all + j * dp_width, s.d, grad_row<T>(bp.dk, b, hk, j));
              std::copy_n(dv_all + j * dvp_width, s.dv, grad_row<T>(bp.dv, b, hk, j));
            }
            core::report_rows(p, s.nk);
          }
        }
      } catch (const std::bad_alloc&) {
        out_of_memory.store(true, std::memory_order_relaxed);
      }
    });
    if (out_of_memory) return core::KernelStatus::kOutOfMemory;

    // Pass 2 (more than one chunk): dK and dV of each (b, hk) as its chunks' sums, in chunk
    // order.
    if (chunks > 1) {
      core::parallel_for(s.b * s.hkv, p.threads, [&](std::int64_t begin, std::int64_t end) {
        for (std::int64_t g = begin; g < end; ++g) {
          const std::int64_t b = g / s.hkv, hk = g % s.hkv;
          for (std::int64_t j = 0; j < s.nk; ++j) {
            T* dk = grad_row<T>(bp.dk, b, hk, j);
            T* dv = grad_row<T>(bp.dv, b, hk, j);
            const T* first = chunk_buffers.data() + g * buffer;
            std::copy_n(first + j * dp_width, s.d, dk);
            std::copy_n(first + key_rows * dp_width + j * dvp_width, s.dv, dv);
            for (std::int64_t c = 1; c < chunks; ++c) {
              const T* from = chunk_buffers.data() + (c * s.b * s.hkv + g) * buffer;
              for (std::int64_t col = 0; col < s.d; ++col) dk[col] += from[j * dp_width + col];
              const T* from_v = from + key_rows * dp_width + j * dvp_width;
              for (std::int64_t col = 0; col < s.dv; ++col) dv[col] += from_v[col];
            }
          }
          core::report_rows(p, s.nk);
        }
      });
    }

    // The sinks' gradients per (b, h), as run_backward's pass 0: -Σ_i P_sink,i·D_i.
    if (bp.dsinks != nullptr) {
      for (std::int64_t h = 0; h < s.h; ++h) {
        const auto sink = static_cast<double>(
            static_cast<T>(p.modifiers.sinks[static_cast<std::size_t>(h)]));
        for (std::int64_t b = 0; b < s.b; ++b) {
          double dsink = 0.0;
          for (std::int64_t i = 0; i < s.nq; ++i) {
            const auto row = static_cast<std::size_t>((b * s.h + h) * s.nq + i);
            if (row_max[row] == -kInf) continue;
            const double dot = row_dot[row] / row_sum[row];
            dsink -= std::exp(std::min(sink - row_max[row], 0.0)) / row_sum[row] * dot;
          }
          bp.dsinks[h] += dsink;
        }
      }
    }
  } catch (const std::bad_alloc&) {
    return core::KernelStatus::kOutOfMemory;
  }
  return core::KernelStatus::kOk;
}

}  // namespace qkv::kernels::bwd
