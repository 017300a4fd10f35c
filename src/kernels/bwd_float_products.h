// The tiled backward's products on float tiles (bwd_fused_driver.h's Products policy), with
// the bf16 rounding of a bf16 call's operands. Included by bwd_fused_driver.h after the tiles
// and packing helpers it uses.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/backward_params.h"
#include "core/half.h"
#include "core/score_modifiers.h"

namespace qkv::kernels::bwd {

// One float rounded to bf16 (nearest even; a NaN stays a quiet NaN) and widened back.
inline float round_float_to_bf16(float x) noexcept {
  return core::bf16_to_float(core::float_to_bf16(x));
}

// round_float_to_bf16 over count floats, src == dst allowed: in SIMD where the build has it
// (attention_bwd_fused_hwy.cc; backward_kernel_list.cc in a portable build). Every P and dS
// tile of the widened bf16 backward passes here; per element through double it took more time
// than the products it fed.
void round_to_bf16_f32(const float* src, std::int64_t count, float* dst) noexcept;

// dst[e] = src[e] rounded to bf16 (nearest even), for e < count; src == dst is fine.
template <class T>
void round_to_bf16(const T* src, std::int64_t count, T* dst) noexcept {
  if constexpr (std::is_same_v<T, float>) {
    round_to_bf16_f32(src, count, dst);
  } else {
    for (std::int64_t e = 0; e < count; ++e) {
      dst[e] = static_cast<T>(core::round_to_storage(static_cast<double>(src[e]), DType::kBF16));
    }
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
  const T* k = nullptr;   // the key tile's K rows (dp a row), Kᵀ and Vᵀ (bcp a row)
  const T* kt = nullptr;
  const T* vt = nullptr;
  std::int64_t ldq = 0, lddo = 0, br = 0, bc = 0;
  // Every key tile of one kv head, packed once (pack_keys) for a driver that visits each tile
  // many times (bwd_row_panel_driver.h): tile kt's K rows, Kᵀ and Vᵀ, laid out as t.k, t.kt
  // and t.vt are.
  std::vector<T> keys;
  std::int64_t k_words = 0, kt_words = 0, vt_words = 0;

  FloatProducts(const Shared&, const core::BackwardParams& params, const TilePlan& tile_plan,
                Tiles<T>& tiles) noexcept
      : bp(params), plan(tile_plan), t(tiles), bf16(params.forward.compute == DType::kBF16) {}

  void key_tile(std::int64_t b, std::int64_t hk, std::int64_t j0, std::int64_t count,
                bool rows) noexcept {
    const core::AttentionParams& p = bp.forward;
    bc = count;
    if (rows) pack_rows(p.k, b, hk, j0, bc, p.shape.d, t.k.data(), t.dp, plan.key_tile, p.compute);
    pack_transposed(p.k, b, hk, j0, bc, p.shape.d, t.kt.data(), t.bcp, t.bcp, p.compute);
    pack_transposed(p.v, b, hk, j0, bc, p.shape.dv, t.vt.data(), t.bcp, t.bcp, p.compute);
    k = t.k.data();
    kt = t.kt.data();
    vt = t.vt.data();
  }

  // Packs every key tile of kv head (b, hk) into `keys` (may throw bad_alloc on first use).
  void pack_keys(std::int64_t b, std::int64_t hk) {
    const core::AttentionParams& p = bp.forward;
    const core::AttentionShape& s = p.shape;
    const std::int64_t tiles = (s.nk + plan.key_tile - 1) / plan.key_tile;
    k_words = plan.key_tile * t.dp;
    kt_words = s.d * t.bcp;
    vt_words = s.dv * t.bcp;
    const std::int64_t per_tile = k_words + kt_words + vt_words;
    if (keys.size() < static_cast<std::size_t>(tiles * per_tile)) {
      keys.resize(static_cast<std::size_t>(tiles * per_tile));
    }
    for (std::int64_t tile = 0; tile < tiles; ++tile) {
      const std::int64_t j0 = tile * plan.key_tile;
      const std::int64_t count = std::min(plan.key_tile, s.nk - j0);
      T* at = keys.data() + tile * per_tile;
      pack_rows(p.k, b, hk, j0, count, s.d, at, t.dp, plan.key_tile, p.compute);
      pack_transposed(p.k, b, hk, j0, count, s.d, at + k_words, t.bcp, t.bcp, p.compute);
      pack_transposed(p.v, b, hk, j0, count, s.dv, at + k_words + kt_words, t.bcp, t.bcp,
                      p.compute);
    }
  }
  // Key tile `tile` (count keys) from what pack_keys packed.
  void packed_key_tile(std::int64_t tile, std::int64_t count) noexcept {
    bc = count;
    const T* at = keys.data() + tile * (k_words + kt_words + vt_words);
    k = at;
    kt = at + k_words;
    vt = at + k_words + kt_words;
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
    Ops::gemm(br, t.bcp, bp.forward.shape.d, q, ldq, 1, kt, t.bcp, x, t.bcp, false);
  }
  void dp(T* x) noexcept {
    Ops::gemm(br, t.bcp, bp.forward.shape.dv, dout, lddo, 1, vt, t.bcp, x, t.bcp, false);
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
    Ops::gemm(br, t.dp, bc, ds, t.bcp, 1, k, t.dp, t.dq.data(), t.dp, false);
  }
};

}  // namespace qkv::kernels::bwd
