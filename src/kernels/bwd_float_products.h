// The tiled backward's products on float tiles (bwd_fused_driver.h's Products policy), with
// the bf16 rounding of a bf16 call's operands. Included by bwd_fused_driver.h after the tiles
// and packing helpers it uses.
#pragma once

#include <cstdint>

#include "core/backward_params.h"
#include "core/score_modifiers.h"

namespace qkv::kernels::bwd {

// dst[e] = src[e] rounded to bf16 (nearest even), for e < count; src == dst is fine.
template <class T>
void round_to_bf16(const T* src, std::int64_t count, T* dst) noexcept {
  for (std::int64_t e = 0; e < count; ++e) {
    dst[e] = static_cast<T>(core::round_to_storage(static_cast<double>(src[e]), DType::kBF16));
  }
}

// The products of the tiled backward on float tiles (the Products policy of run_backward, which
// another policy may replace: the bf16 pairs of attention_bwd_fused_hwy.cc). One per worker:
//   key_tile(b, hk, j0, bc, rows)   pack Kᵀ and Vᵀ of keys [j0, j0 + bc) (and K's rows if `rows`)
//   query_tile(b, h, i0, br)        Q and dO rows [i0, i0 + br) (read in place when they can be)
//   scores(x)                       x = Q·Kᵀ                     (br x bcp)
//   dp(x)                           x = dO·Vᵀ                    (br x bcp)
//   add_dv(pv)                      dV_j += pvᵀ·dO               (the worker's dv tile)
//   add_dk_dq(ds)                   dK_j += dSᵀ·Q; dQ tile = dS·K (ds is scratch)
// A bf16 call (the widened path) rounds Q, K, V and dO to bf16 as they are packed and P and dS
// before the products they enter, so each product multiplies the bf16 operands exactly (a
// product of two bf16 values is exact in float32) and sums in float32, as vdpbf16ps does.
template <class Ops, class T>
struct FloatProducts {
  struct Shared {};  // nothing packed per call
  static Shared prepare(const core::BackwardParams&, const TilePlan&) { return {}; }

  const core::BackwardParams& bp;
  const TilePlan& plan;
  Tiles<T>& t;
  const bool bf16;
  const T* q = nullptr;
  const T* dout = nullptr;
  std::int64_t ldq = 0, lddo = 0, br = 0, bc = 0;

  FloatProducts(const Shared&, const core::BackwardParams& params, const TilePlan& tile_plan,
                Tiles<T>& tiles) noexcept
      : bp(params), plan(tile_plan), t(tiles), bf16(params.forward.compute == DType::kBF16) {}

  void key_tile(std::int64_t b, std::int64_t hk, std::int64_t j0, std::int64_t keys,
                bool rows) noexcept {
    const core::AttentionParams& p = bp.forward;
    bc = keys;
    if (rows) pack_rows(p.k, b, hk, j0, bc, p.shape.d, t.k.data(), t.dp, plan.key_tile, p.compute);
    pack_transposed(p.k, b, hk, j0, bc, p.shape.d, t.kt.data(), t.bcp, t.bcp, p.compute);
    pack_transposed(p.v, b, hk, j0, bc, p.shape.dv, t.vt.data(), t.bcp, t.bcp, p.compute);
  }
  void query_tile(std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t rows) noexcept {
    const core::AttentionParams& p = bp.forward;
    br = rows;
    ldq = t.dp;
    lddo = t.dvp;
    q = rows_in_place(p.q, b, h, i0, br, p.shape.d, t.q.data(), ldq, p.compute);
    dout = rows_in_place(bp.grad_out, b, h, i0, br, p.shape.dv, t.dout.data(), lddo, p.compute);
  }
  void scores(T* x) noexcept {
    Ops::gemm(br, t.bcp, bp.forward.shape.d, q, ldq, 1, t.kt.data(), t.bcp, x, t.bcp, false);
  }
  void dp(T* x) noexcept {
    Ops::gemm(br, t.bcp, bp.forward.shape.dv, dout, lddo, 1, t.vt.data(), t.bcp, x, t.bcp, false);
  }
  // dV_j += Pᵀ·dO_i: A(key, query) = P[query][key].
  void add_dv(const T* pv) noexcept {
    if (bf16) {
      round_to_bf16(pv, br * t.bcp, t.pd.data());
      pv = t.pd.data();
    }
    Ops::gemm(bc, t.dvp, br, pv, 1, t.bcp, dout, lddo, t.dv.data(), t.dvp, true);
  }
  // dK_j += dSᵀ·Q_i; the dQ tile = dS·K_j.
  void add_dk_dq(T* ds) noexcept {
    if (bf16) round_to_bf16(ds, br * t.bcp, ds);
    Ops::gemm(bc, t.dp, br, ds, 1, t.bcp, q, ldq, t.dk.data(), t.dp, true);
    Ops::gemm(br, t.dp, bc, ds, t.bcp, 1, t.k.data(), t.dp, t.dq.data(), t.dp, false);
  }
};

}  // namespace qkv::kernels::bwd
