// The loop nest every tiled backward kernel shares (attention_bwd_fused_scalar, _fused_hwy and
// _unfused_blas), FlashAttention-2's backward (Dao, 2023, algorithm 2) arranged so that every
// sum runs in an order fixed by the shape, with the softmax's row statistics computed again
// rather than read from the saved lse (bwd_row_stats.h says why):
//
//   pass "stats", parallel over (b, h, query tile): each row's max M_i and sum l_i over every
//                                        key tile, from the scores the gradient pass will
//                                        compute (the same bits): bwd_row_stats.h
//                                        and D_i = Σ_j P_ij·dP_ij (as autograd's softmax
//                                        backward has it; or read from bp.delta)
//   pass 0, parallel over (b, h):        dsink_h -= Σ_i exp(sink_h - M_i)/l_i·D_i per (b, h)
//   pass 1, threads taking tasks (key chunk c, b, kv head hk) from a counter: for each key
//     tile K_j, V_j (Bc keys) of the chunk, dK_j = dV_j = 0; for each query head h of hk,
//     each query tile Q_i, dO_i (Br rows) not wholly masked by causal/window:
//       S    = Q_i·K_jᵀ                                  (Br x Bc)
//       x    = softcap(scale·S) + alibi + mask, -inf where a key is not allowed (tile_logits)
//       P    = exp(min(x - M_i, 0)) / l_i               Ops::weigh_rows (x - M_i is exact
//                                                        near the max: no lse cancellation)
//       with dropout: Z drawn for the tile as bits (dropout_tile), P∘Z in place of P for
//       dV, dP∘Z in place of dP, and D = Σ P∘Z∘dP in the stats pass (core/dropout.h)
//       dV_j += Pᵀ·dO_i
//       dP   = dO_i·V_jᵀ
//       dS   = scale · P∘(dP - D_i) ∘ (1 - tanh²)        element-wise
//       dK_j += dSᵀ·Q_i
//       dQ_i += dS·K_j  through a dQ tile into chunk c's dQ (chunk 0: the output itself)
//     (the products and their operands are a Products policy's: FloatProducts
//     (bwd_float_products.h) makes every product Ops::gemm, C (+)= A·B with A read through
//     strides, so the transposed Pᵀ and dSᵀ are strides, never copies; K and V are packed once
//     per key tile, both as rows and transposed, B operands padded to whole 64-byte vectors
//     with zeros; a bf16 call rounds each operand to bf16. fused_hwy's Bf16Products
//     (bwd_bf16-inl.h) runs them as vdpbf16ps on bf16 pairs. S, P, dP and dS stay float tiles)
//     then dK_j and dV_j are written.
//   pass 2 (only with chunks > 1), parallel over query rows: dQ += partial_1 + ... in order.
//
// Tasks own disjoint outputs (dK and dV rows of their key chunk, dQ of their chunk's buffer),
// so no atomics are needed; each task tells the progress counter (options.progress) its key
// rows once they are written. The number of key chunks per (b, hk) depends on the shape alone
// (enough tasks for 8 threads when b·hkv is small, bounded by the memory their dQ partials
// take), never on the thread count: the bits are the same for any thread count.
//
// Memory: O(rows) for the row statistics and D, the tiles of each thread (K, Kᵀ, Vᵀ, Q, dO,
// S/P, dP/dS, the softcap's factor, dK, dV, a dQ tile: about (5·Bc + 3·Br)·d + 3·Br·Bc
// elements), and chunks - 1 dQ partials.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/backward_params.h"
#include "core/dropout.h"
#include "core/mask_rule.h"
#include "core/parallel_for.h"
#include "core/progress.h"
#include "core/score_modifiers.h"

namespace qkv::kernels::bwd {

// Dropout's keep mask of a tile of rows x ld weights (query rows [i0, i0 + rows) of one head,
// keys [j0, j0 + cols)), the backward's Z = 1/(1 - p) where kept, 0 where dropped: bit c % 64
// of word r·keep_words(ld) + c / 64 is set when column c of row r is kept; the padding's
// columns [cols, ld) are clear. Bits rather than a float tile of factors: the row-panel driver
// keeps a tile's mask from its first sweep to its second, and at n = 2048 a 128-row panel of
// float factors was another 1 MiB beside the scores and dP (in L2's way; 32 KiB as bits).
inline std::int64_t keep_words(std::int64_t ld) noexcept { return (ld + 63) / 64; }

// Row i's bits for keys [j0, j0 + count) into row_words from bit `at` on (or'd in): the
// portable draws (core/dropout.h), any j0, count and at.
inline void keep_bits_portable(const core::Dropout& d, std::uint32_t head_word, std::int64_t i,
                               std::int64_t j0, std::int64_t count, std::uint64_t* row_words,
                               std::int64_t at) noexcept {
  std::uint32_t draws[core::kDropoutKeys];
  std::int64_t k = 0;
  while (k < count) {
    const std::int64_t j = j0 + k;
    const std::int64_t block0 = j - j % core::kDropoutKeys;
    const std::int64_t n = std::min(count - k, block0 + core::kDropoutKeys - j);
    core::dropout_draws_row(d, head_word, i, block0, draws);
    for (std::int64_t x = 0; x < n; ++x) {
      if (draws[j - block0 + x] < d.threshold) continue;
      const std::int64_t bit = at + k + x;
      row_words[bit / 64] |= std::uint64_t{1} << (bit % 64);
    }
    k += n;
  }
}

inline void dropout_keep_bits_portable(const core::Dropout& d, std::uint32_t head_word,
                                       std::int64_t i0, std::int64_t rows, std::int64_t j0,
                                       std::int64_t cols, std::int64_t ld,
                                       std::uint64_t* bits) noexcept {
  const std::int64_t words = keep_words(ld);
  std::fill_n(bits, rows * words, std::uint64_t{0});
  for (std::int64_t r = 0; r < rows; ++r) {
    keep_bits_portable(d, head_word, i0 + r, j0, cols, bits + r * words, 0);
  }
}
// The same in SIMD where the build has it, one dispatch per tile (attention_bwd_fused_hwy.cc;
// backward_kernel_list.cc in a portable build).
void dropout_keep_bits(const core::Dropout& d, std::uint32_t head_word, std::int64_t i0,
                       std::int64_t rows, std::int64_t j0, std::int64_t cols, std::int64_t ld,
                       std::uint64_t* bits) noexcept;

// dst := src∘Z over rows x ld (dst may be src): src·scale where the mask keeps, src·0 where
// not (the product with the factor, not a select, so that the bits are those of P∘Z and dP∘Z
// with Z as a float tile: an infinite or NaN dP stays NaN).
template <class T>
void apply_keep_bits_portable(const T* src, const std::uint64_t* bits, std::int64_t rows,
                              std::int64_t ld, T scale, T* dst) noexcept {
  const std::int64_t words = keep_words(ld);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::uint64_t* w = bits + r * words;
    for (std::int64_t c = 0; c < ld; ++c) {
      const bool kept = ((w[c / 64] >> (c % 64)) & 1u) != 0;
      dst[r * ld + c] = src[r * ld + c] * (kept ? scale : T(0));
    }
  }
}
// In SIMD where the build has it: this header's own loops are compiled for the baseline ISA.
void apply_keep_bits_f32(const float* src, const std::uint64_t* bits, std::int64_t rows,
                         std::int64_t ld, float scale, float* dst) noexcept;
template <class T>
void apply_keep_bits(const core::Dropout& d, const T* src, const std::uint64_t* bits,
                     std::int64_t rows, std::int64_t ld, T* dst) noexcept {
  const auto scale = static_cast<T>(d.keep_scale);
  if constexpr (std::is_same_v<T, float>) {
    apply_keep_bits_f32(src, bits, rows, ld, scale, dst);
  } else {
    apply_keep_bits_portable(src, bits, rows, ld, scale, dst);
  }
}

struct TilePlan {
  std::int64_t query_tile = 64;  // Br
  std::int64_t key_tile = 64;    // Bc
  std::int64_t chunks = 1;       // key chunks per (b, hk)
  // Whether a call whose panels fit runs bwd_row_panel_driver.h's five-product loop (the fused
  // kernels) rather than the stats pass and pass 1 below (the unfused kernel, whose one key
  // tile is the whole row).
  bool row_panels = false;
  // Whether the rows' statistics come from the forward (forward_row_stats: the lse and D =
  // dO·O, FlashAttention's backward) rather than from the stats pass, for the calls
  // forward_stats_suit admits; run_backward then takes no row panels.
  bool forward_stats = false;
};

// Tasks the plan aims for, whatever the thread count (it must not depend on it), and the
// memory the extra dQ partials may take.
inline constexpr std::int64_t kTargetTasks = 8;
inline constexpr double kPartialBytesCap = 64.0 * 1024 * 1024;

inline std::int64_t chunks_for(const core::AttentionShape& s, std::int64_t key_tile,
                               std::size_t element_bytes) noexcept {
  const std::int64_t groups = s.b * s.hkv;
  if (groups == 0 || s.nk == 0) return 1;
  const std::int64_t key_tiles = (s.nk + key_tile - 1) / key_tile;
  std::int64_t chunks = std::min((kTargetTasks + groups - 1) / groups, key_tiles);
  const double partial = static_cast<double>(s.b * s.h) * static_cast<double>(s.nq) *
                         static_cast<double>(s.d) * static_cast<double>(element_bytes);
  while (chunks > 1 && static_cast<double>(chunks - 1) * partial > kPartialBytesCap) --chunks;
  return std::max<std::int64_t>(chunks, 1);
}

// Widths of the packed tiles: whole 64-byte vectors (16 floats, 8 doubles), zero-padded, so a
// SIMD product never needs a partial vector; the padding's products are zeros.
template <class T>
constexpr std::int64_t padded(std::int64_t n) noexcept {
  constexpr std::int64_t kLanes = 64 / static_cast<std::int64_t>(sizeof(T));
  return (n + kLanes - 1) / kLanes * kLanes;
}

// A worker's tile memory up to this size is kept by its thread between calls. Why: freed at the
// end of every call, the worker threads' malloc arenas gave it back to the system and faulted
// it in again on the next: at n = 256, H = 2, d = 64 a 2-thread backward took 1.2-1.6x the
// time of one thread, with 27 % of its samples in the kernel's page-fault path and 11 % in
// zeroing (a Zen 5; kept, 2 threads run 1.1-1.4x faster than one).
inline constexpr std::size_t kKeptTileBytes = std::size_t{4} << 20;

// `elements` zeroed elements of T for one worker's tiles: the calling thread's kept memory, or
// `own` (allocated now) past kKeptTileBytes.
template <class T>
T* zeroed_tile_memory(std::size_t elements, std::vector<T>& own) {
  if (elements * sizeof(T) > kKeptTileBytes) {
    own.assign(elements, T(0));
    return own.data();
  }
  thread_local std::vector<T> kept;
  if (kept.size() < elements) kept.resize(elements);
  std::fill_n(kept.data(), elements, T(0));
  return kept.data();
}

template <class T>
struct Tiles {
  std::int64_t dp = 0, dvp = 0, bcp = 0;  // padded widths of d, dv and the key tile
  std::span<T> k, kt, vt, q, dout, p, ds, factor, dk, dv, dq;
  std::span<T> pd;                 // P∘Z (dropout), P rounded to bf16 (bf16 calls)
  std::vector<std::uint64_t> keep;  // dropout's keep mask of a tile (keep_words)
  std::vector<T> own;  // the tiles' memory when too large to keep (zeroed_tile_memory)
  void allocate(const core::AttentionShape& s, const TilePlan& plan, bool dropout = false) {
    dp = padded<T>(s.d);
    dvp = padded<T>(s.dv);
    bcp = padded<T>(plan.key_tile);
    const auto z = [](std::int64_t a, std::int64_t b) { return static_cast<std::size_t>(a * b); };
    const std::pair<std::span<T>*, std::size_t> layout[] = {{&k, z(plan.key_tile, dp)},
                                                            {&kt, z(s.d, bcp)},
                                                            {&vt, z(s.dv, bcp)},
                                                            {&q, z(plan.query_tile, dp)},
                                                            {&dout, z(plan.query_tile, dvp)},
                                                            {&p, z(plan.query_tile, bcp)},
                                                            {&ds, z(plan.query_tile, bcp)},
                                                            {&factor, z(plan.query_tile, bcp)},
                                                            {&dk, z(plan.key_tile, dp)},
                                                            {&dv, z(plan.key_tile, dvp)},
                                                            {&dq, z(plan.query_tile, dp)},
                                                            {&pd, z(dropout ? plan.query_tile : 0, bcp)}};
    keep.assign(dropout ? z(plan.query_tile, keep_words(bcp)) : 0, 0);
    std::size_t total = 0;
    for (const auto& entry : layout) total += entry.second;
    T* at = zeroed_tile_memory<T>(total, own);
    for (const auto& [tile, size] : layout) {
      *tile = std::span<T>(at, size);
      at += size;
    }
  }
};

// An operand's element as the kernels compute with it: as stored, or rounded to bf16 (nearest
// even, once) when the call computes in bf16 (`round` = rounds_to_bf16(op, compute)).
inline bool rounds_to_bf16(const core::InputOperand& op, DType compute) noexcept {
  return compute == DType::kBF16 && op.dtype != DType::kBF16;
}
inline double operand_value(const core::InputOperand& op, std::int64_t at, bool round) noexcept {
  const double x = core::load_real(op.data, op.dtype, at);
  return round ? core::round_to_storage(x, DType::kBF16) : x;
}

// Rows [row0, row0 + rows) of operand `op` at (b, h), columns [0, cols), into `dst` (row-major,
// leading dimension ld >= cols), converted to T (rounded to bf16 first when `compute` is bf16);
// rows [rows, pad_rows) are zeroed.
template <class T>
void pack_rows(const core::InputOperand& op, std::int64_t b, std::int64_t h, std::int64_t row0,
               std::int64_t rows, std::int64_t cols, T* dst, std::int64_t ld,
               std::int64_t pad_rows, DType compute = DType::kF32) noexcept {
  const core::Strides4& st = op.strides;
  const bool round = rounds_to_bf16(op, compute);
  const bool direct = !round && st.col == 1 &&
                      ((std::is_same_v<T, float> && op.dtype == DType::kF32) ||
                       (std::is_same_v<T, double> && op.dtype == DType::kF64));
  if (cols == 0) return;  // no columns: nothing to copy (and memcpy must not see a null pointer)
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t at = st.at(b, h, row0 + r, 0);
    T* out = dst + r * ld;
    if (direct) {
      std::memcpy(out, static_cast<const T*>(op.data) + at,
                  static_cast<std::size_t>(cols) * sizeof(T));
    } else {
      for (std::int64_t c = 0; c < cols; ++c) {
        out[c] = static_cast<T>(operand_value(op, at + c * st.col, round));
      }
    }
  }
  for (std::int64_t r = rows; r < pad_rows; ++r) std::fill_n(dst + r * ld, cols, T(0));
}

// Rows [row0, row0 + rows) of `op` as a row-major T matrix of leading dimension `ld`: the
// operand's own memory when it already is one whose rows are whole 64-byte vectors (cols ==
// padded(cols)), else packed into `tile` (ld as given).
template <class T>
const T* rows_in_place(const core::InputOperand& op, std::int64_t b, std::int64_t h,
                       std::int64_t row0, std::int64_t rows, std::int64_t cols, T* tile,
                       std::int64_t& ld, DType compute = DType::kF32) noexcept {
  const bool same_type = (std::is_same_v<T, float> && op.dtype == DType::kF32) ||
                         (std::is_same_v<T, double> && op.dtype == DType::kF64);
  if (same_type && !rounds_to_bf16(op, compute) && op.strides.col == 1 &&
      cols == padded<T>(cols) && op.strides.row >= cols) {
    ld = op.strides.row;
    return static_cast<const T*>(op.data) + op.strides.at(b, h, row0, 0);
  }
  pack_rows(op, b, h, row0, rows, cols, tile, ld, rows, compute);
  return tile;
}

// The same rows transposed: dst[c * ld + r] for c < cols, r < rows; columns [rows, pad_rows)
// zeroed.
template <class T>
void pack_transposed(const core::InputOperand& op, std::int64_t b, std::int64_t h,
                     std::int64_t row0, std::int64_t rows, std::int64_t cols, T* dst,
                     std::int64_t ld, std::int64_t pad_rows,
                     DType compute = DType::kF32) noexcept {
  const core::Strides4& st = op.strides;
  const bool round = rounds_to_bf16(op, compute);
  const bool same_type = (std::is_same_v<T, float> && op.dtype == DType::kF32) ||
                         (std::is_same_v<T, double> && op.dtype == DType::kF64);
  if (same_type && !round && st.col == 1) {
    // Eight source rows at a time, so that each destination row gets eight adjacent elements
    // per visit (one element per visit, converted through load_real, took 4 % of a d = 128
    // backward).
    constexpr std::int64_t kBlock = 8;
    const T* src = static_cast<const T*>(op.data);
    std::int64_t r = 0;
    for (; r + kBlock <= rows; r += kBlock) {
      const T* from[kBlock];
      for (std::int64_t u = 0; u < kBlock; ++u) from[u] = src + st.at(b, h, row0 + r + u, 0);
      for (std::int64_t c = 0; c < cols; ++c) {
        T* to = dst + c * ld + r;
        for (std::int64_t u = 0; u < kBlock; ++u) to[u] = from[u][c];
      }
    }
    for (; r < rows; ++r) {
      const T* from = src + st.at(b, h, row0 + r, 0);
      for (std::int64_t c = 0; c < cols; ++c) dst[c * ld + r] = from[c];
    }
  } else {
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t at = st.at(b, h, row0 + r, 0);
      for (std::int64_t c = 0; c < cols; ++c) {
        dst[c * ld + r] = static_cast<T>(operand_value(op, at + c * st.col, round));
      }
    }
  }
  for (std::int64_t c = 0; c < cols; ++c)
    std::fill(dst + c * ld + rows, dst + c * ld + pad_rows, T(0));
}

// Where gradient rows go: `data` of the compute type with unit column stride (the kernels
// decline anything else), rows `row` apart.
template <class T>
T* grad_row(const core::OutputOperand& op, std::int64_t b, std::int64_t h,
            std::int64_t row) noexcept {
  return static_cast<T*>(op.data) + op.strides.at(b, h, row, 0);
}

// Why a tiled kernel computing in T cannot write these gradients (the entry point always
// passes contiguous gradients of the compute type), or empty.
template <class T>
bool gradients_writable(const core::BackwardParams& bp) noexcept {
  const DType want = std::is_same_v<T, double> ? DType::kF64 : DType::kF32;
  for (const core::OutputOperand* op : {&bp.dq, &bp.dk, &bp.dv}) {
    if (op->data != nullptr && (op->dtype != want || op->strides.col != 1)) return false;
  }
  return bp.dq.data != nullptr && bp.dk.data != nullptr && bp.dv.data != nullptr;
}

// The scores of one tile, x = softcap(scale·S) + alibi + mask (-inf where not allowed, and in
// the padding columns [cols, ld)), in place in `s` (rows x ld); `factor` gets 1 - tanh² with a
// softcap.
template <class T>
void tile_scores(const core::AttentionParams& p, std::int64_t b, std::int64_t h, std::int64_t i0,
                 std::int64_t rows, std::int64_t j0, std::int64_t cols, std::int64_t ld, T* s,
                 T* factor) noexcept {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  const core::ScoreModifiers& mod = p.modifiers;
  const auto scale = static_cast<T>(p.scale);
  const double cap = mod.softcap;
  const double slope =
      mod.alibi_slopes.empty() ? 0.0 : mod.alibi_slopes[static_cast<std::size_t>(h)];
  const std::int64_t offset = core::diagonal_offset(p.shape, p.masking);
  for (std::int64_t r = 0; r < rows; ++r) {
    T* x = s + r * ld;
    const std::int64_t i = i0 + r;
    const std::int64_t diag = i + offset;
    const core::KeyRange range = core::allowed_key_range(p.masking, p.shape.nk, diag);
    const std::int64_t lo = std::clamp<std::int64_t>(range.first - j0, 0, cols);
    const std::int64_t hi = std::clamp<std::int64_t>(range.last - j0, lo, cols);
    for (std::int64_t c = 0; c < lo; ++c) x[c] = kNegInf;
    for (std::int64_t c = hi; c < ld; ++c) x[c] = kNegInf;
    if (cap > 0.0) {
      T* f = factor + r * ld;
      const auto capt = static_cast<T>(cap);
      for (std::int64_t c = lo; c < hi; ++c) {
        const T t = std::tanh(scale * x[c] / capt);
        x[c] = capt * t;
        f[c] = T(1) - t * t;
      }
    } else {
      for (std::int64_t c = lo; c < hi; ++c) x[c] *= scale;
    }
    if (slope != 0.0) {
      for (std::int64_t c = lo; c < hi; ++c) {
        x[c] += static_cast<T>(core::alibi_bias(slope, diag, j0 + c));
      }
    }
    if (p.masking.mask != nullptr) {
      for (std::int64_t c = lo; c < hi; ++c) {
        x[c] += static_cast<T>(core::mask_bias(p.masking, b, h, i, j0 + c));
      }
    }
  }
}

// x = fill where causal/window forbid key j0 + c for query row i0 + r, and in the padding
// columns [cols, ld).
template <class T>
void fill_forbidden(const core::AttentionParams& p, std::int64_t i0, std::int64_t rows,
                    std::int64_t j0, std::int64_t cols, std::int64_t ld, T* x, T fill) noexcept {
  const std::int64_t offset = core::diagonal_offset(p.shape, p.masking);
  for (std::int64_t r = 0; r < rows; ++r) {
    const core::KeyRange range = core::allowed_key_range(p.masking, p.shape.nk, i0 + r + offset);
    const std::int64_t lo = std::clamp<std::int64_t>(range.first - j0, 0, cols);
    const std::int64_t hi = std::clamp<std::int64_t>(range.last - j0, lo, cols);
    std::fill(x + r * ld, x + r * ld + lo, fill);
    std::fill(x + r * ld + hi, x + (r + 1) * ld, fill);
  }
}

// Whether causal/window forbid every pair of query rows [i0, i1) and keys [j0, j1): the
// allowed keys of a row form a range whose ends never decrease with the row.
inline bool tile_masked(const core::AttentionParams& p, std::int64_t i0, std::int64_t i1,
                        std::int64_t j0, std::int64_t j1) noexcept {
  if (!p.masking.has_structure()) return false;
  const std::int64_t offset = core::diagonal_offset(p.shape, p.masking);
  const core::KeyRange first = core::allowed_key_range(p.masking, p.shape.nk, i0 + offset);
  const core::KeyRange last = core::allowed_key_range(p.masking, p.shape.nk, i1 - 1 + offset);
  return last.last <= j0 || first.first >= j1;
}

// Dropout (core/dropout.h) on a tile of weights P (rows x ld, keys [j0, j0 + cols) of query
// rows [i0, i0 + rows) of head h): keep := the tile's keep mask (keep_words), pd := P∘Z, the
// weights dV takes and O was made of. The same draws as the forward's, made again rather than
// stored. dP∘Z then gives dS = P∘(dP∘Z - D), D = Σ P∘Z∘dP (= dO·O, O made of the dropped
// weights) from the stats pass, which draws the mask too (dropout_mask).
inline void dropout_mask(const core::AttentionParams& p, std::int64_t b, std::int64_t h,
                         std::int64_t i0, std::int64_t rows, std::int64_t j0, std::int64_t cols,
                         std::int64_t ld, std::uint64_t* keep) noexcept {
  dropout_keep_bits(p.dropout, core::dropout_head_word(p.dropout, b, h), i0, rows, j0, cols, ld,
                    keep);
}

template <class T>
void dropout_tile(const core::AttentionParams& p, std::int64_t b, std::int64_t h,
                  std::int64_t i0, std::int64_t rows, std::int64_t j0, std::int64_t cols,
                  std::int64_t ld, const T* pt, std::uint64_t* keep, T* pd) noexcept {
  dropout_mask(p, b, h, i0, rows, j0, cols, ld, keep);
  apply_keep_bits(p.dropout, pt, keep, rows, ld, pd);
}

}  // namespace qkv::kernels::bwd

// The products (FloatProducts: float tiles, bf16 rounding for bf16 calls) and the row
// statistics pass build on the tiles, packing and score helpers above.
#include "kernels/bwd_float_products.h"
#include "kernels/bwd_row_stats.h"
#include "kernels/bwd_row_panel_driver.h"  // after bwd_row_stats.h: it calls tile_logits

namespace qkv::kernels::bwd {

// Ops supplies the product and the element-wise steps (bwd_ops.h):
//   gemm(m, n, k, A, rs, cs, B, ldb, C, ldc, accumulate)
//       C (+)= A·B: A(r, x) = A[r·rs + x·cs] (m x k), B row-major (k x n), C row-major (m x n);
//       n is a whole number of 64-byte vectors
//   scale_rows(x, rows, ld, scale)                 x_rc = scale·x_rc (rounded, stored)
//   max_rows(x, rows, ld, max)                     max_r = max_c x_rc
//   exp_sum_rows(x, dp, rows, ld, shift, sum, dot) with e = exp(min(x - shift_r, 0)):
//                                                  sum_r = Σ_c e_rc, dot_r = Σ_c e_rc·dp_rc
//                                                  (float64 sums; x and dp are scratch)
//   weigh_rows(x, rows, ld, shift, inv)            x_rc = exp(min(x_rc - shift_r, 0))·inv_r
//   ds_rows(ds, p, factor, rows, ld, scale, D)     dS = scale·P∘(dP - D_r)(∘ factor)
template <class Ops, class T, class Products = FloatProducts<Ops, T>>
core::KernelStatus run_backward(const core::BackwardParams& bp, const TilePlan& plan) noexcept {
  if (const RowPanelPlan panels = row_panel_plan(bp, plan, sizeof(T));
      panels.use && !plan.forward_stats) {
    return run_backward_by_query_rows<Ops, T, Products>(bp, plan, panels);
  }
  const core::AttentionParams& p = bp.forward;
  const core::AttentionShape& s = p.shape;
  const std::int64_t rows = s.b * s.h * s.nq;
  const std::int64_t group = s.group();
  const std::int64_t key_tiles = (s.nk + plan.key_tile - 1) / plan.key_tile;
  const std::int64_t tiles_per_chunk =
      (key_tiles + plan.chunks - 1) / std::max<std::int64_t>(plan.chunks, 1);
  // Scores that are scale·q·k alone (no softcap, ALiBi or mask): scaled in one vector pass.
  const bool plain_scores =
      p.modifiers.softcap <= 0.0 && p.modifiers.alibi_slopes.empty() && p.masking.mask == nullptr;
  // A bf16 call keeps P∘Z's rounded copy in the dropout tile (FloatProducts::add_dv).
  const bool bf16 = p.compute == DType::kBF16;
  std::atomic<bool> out_of_memory{false};
  try {
    const typename Products::Shared shared = Products::prepare(bp, plan);
    // Pass "stats": each row's max and sum over the call's keys (bwd_row_stats.h).
    RowStats<T> stats;
    if (!plan.forward_stats || !forward_row_stats(bp, stats)) {
      compute_row_stats<Ops, T, Products>(bp, plan, plain_scores, shared, stats);
    }
    if (bp.stats_max != nullptr) {
      std::copy(stats.max.begin(), stats.max.end(), bp.stats_max);
      std::copy(stats.sum.begin(), stats.sum.end(), bp.stats_sum);
      std::copy(stats.dot.begin(), stats.dot.end(), bp.stats_dot);
      return core::KernelStatus::kOk;
    }
    std::vector<T> delta(static_cast<std::size_t>(rows));
    std::vector<double> dsink_bh(static_cast<std::size_t>(s.b * s.h), 0.0);
    // Partials of dQ for chunks 1.. (chunk 0 accumulates in the output), [c-1][b][h][i][d].
    std::vector<T> partial(
        static_cast<std::size_t>(std::max<std::int64_t>(plan.chunks - 1, 0) * rows * s.d));

    // Pass 0: the rows' D (the stats pass's Σ P∘dP, or the caller's), the sinks' gradients per
    // (b, h): P_sink = exp(sink - M)/l.
    core::parallel_for(s.b * s.h, p.threads, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t bh = begin; bh < end; ++bh) {
        const std::int64_t b = bh / s.h;
        const std::int64_t h = bh % s.h;
        constexpr double kInfinity = std::numeric_limits<double>::infinity();
        const double sink = p.modifiers.sinks.empty()
                                ? -kInfinity
                                : static_cast<double>(static_cast<T>(
                                      p.modifiers.sinks[static_cast<std::size_t>(h)]));
        double dsink = 0.0;
        for (std::int64_t i = 0; i < s.nq; ++i) {
          const std::size_t row = static_cast<std::size_t>(bh * s.nq + i);
          // dsinks takes D in float64: the caller's, or u/l unrounded (rounded to T, D's rounding
          // alone tripled dsinks' error). dO·O from the saved O erred more: it carries the
          // forward's rounding of O.
          double dot = 0.0;
          if (bp.delta.data != nullptr) {
            dot = core::load_real(bp.delta.data, bp.delta.dtype, bp.delta.strides.at(b, h, i, 0));
            delta[row] = static_cast<T>(dot);
          } else {
            delta[row] = stats.delta[row];
            if (stats.inv[row] != T(0)) dot = stats.dot[row] / stats.sum[row];
          }
          if (sink != -kInfinity && stats.inv[row] != T(0)) {
            dsink -= std::exp(std::min(sink - stats.max[row], 0.0)) / stats.sum[row] * dot;
          }
        }
        dsink_bh[static_cast<std::size_t>(bh)] = dsink;
      }
    });

    // Pass 1: tasks (chunk, b, hk), taken from a counter: under causal masking the first key
    // chunks carry the most query rows, so they go first. Which thread runs a task changes no
    // bit: each owns its outputs.
    const std::int64_t tasks = s.b * s.hkv * plan.chunks;
    std::atomic<std::int64_t> next{0};
    const auto workers = static_cast<int>(std::clamp<std::int64_t>(tasks, 1, p.threads));
    core::run_team(workers, [&](int, core::Team&) {
      try {
        Tiles<T> t;
        t.allocate(s, plan, p.dropout.active() || bf16);
        Products products(shared, bp, plan, t);
        for (std::int64_t task = next.fetch_add(1); task < tasks; task = next.fetch_add(1)) {
          const std::int64_t c = task / (s.b * s.hkv);
          const std::int64_t hk = task % s.hkv;
          const std::int64_t b = (task / s.hkv) % s.b;
          // This chunk's dQ rows of query head h, row i.
          const auto dq_row = [&](std::int64_t h, std::int64_t i) -> T* {
            if (c == 0) return grad_row<T>(bp.dq, b, h, i);
            return partial.data() +
                   static_cast<std::ptrdiff_t>((((c - 1) * s.b + b) * s.h + h) * s.nq + i) * s.d;
          };
          for (std::int64_t h = hk * group; h < (hk + 1) * group; ++h) {
            for (std::int64_t i = 0; i < s.nq; ++i) std::fill_n(dq_row(h, i), s.d, T(0));
          }
          const std::int64_t kt0 = c * tiles_per_chunk;
          const std::int64_t kt1 = std::min(key_tiles, kt0 + tiles_per_chunk);
          for (std::int64_t kt = kt0; kt < kt1; ++kt) {
            const std::int64_t j0 = kt * plan.key_tile;
            const std::int64_t bc = std::min(plan.key_tile, s.nk - j0);
            products.key_tile(b, hk, j0, bc, true);
            std::fill(t.dk.begin(), t.dk.end(), T(0));
            std::fill(t.dv.begin(), t.dv.end(), T(0));
            for (std::int64_t h = hk * group; h < (hk + 1) * group; ++h) {
              for (std::int64_t i0 = 0; i0 < s.nq; i0 += plan.query_tile) {
                const std::int64_t br = std::min(plan.query_tile, s.nq - i0);
                if (tile_masked(p, i0, i0 + br, j0, j0 + bc)) continue;
                products.query_tile(b, h, i0, br);
                T* const pt = t.p.data();
                T* const ds = t.ds.data();
                const std::size_t row0 = static_cast<std::size_t>((b * s.h + h) * s.nq + i0);
                const auto scale = static_cast<T>(p.scale);
                // P = exp(min(x - M, 0))·inv from the scores as the stats pass computed them
                // (the same bits): 0 where a key is not allowed and in the padding columns.
                tile_logits<Ops, T>(p, plain_scores, b, h, i0, br, j0, bc, products, t.bcp, pt,
                                    t.factor.data());
                Ops::weigh_rows(pt, br, t.bcp, stats.shift.data() + row0, stats.inv.data() + row0);
                // With dropout, dV takes P∘Z and dP becomes dP∘Z (dropout_tile).
                const T* pv = pt;
                if (p.dropout.active()) {
                  dropout_tile(p, b, h, i0, br, j0, bc, t.bcp, pt, t.keep.data(), t.pd.data());
                  pv = t.pd.data();
                }
                products.add_dv(pv);  // dV_j += Pᵀ·dO_i
                products.dp(ds);      // dP = dO_i·V_jᵀ
                if (p.dropout.active()) {
                  apply_keep_bits(p.dropout, ds, t.keep.data(), br, t.bcp, ds);
                }
                // The softcap's factor is finite everywhere (1 - tanh², or the zeros it was
                // allocated with), so P = 0 gives dS = 0 without a test.
                Ops::ds_rows(ds, pt, p.modifiers.softcap > 0.0 ? t.factor.data() : nullptr, br,
                             t.bcp, scale, delta.data() + row0);

                // dK_j += dSᵀ·Q_i; dQ_i += dS·K_j through the dQ tile, then added to the rows:
                // the product's C stays in L1/L2 (accumulating into the rows themselves, which
                // are far from cache by the next key tile, made the backward 10 % slower at
                // d = 128 on a Zen 5).
                products.add_dk_dq(ds);
                for (std::int64_t r = 0; r < br; ++r) {
                  T* dst = dq_row(h, i0 + r);
                  const T* src = t.dq.data() + r * t.dp;
                  for (std::int64_t col = 0; col < s.d; ++col) dst[col] += src[col];
                }
              }
            }
            for (std::int64_t j = 0; j < bc; ++j) {
              std::copy_n(t.dk.data() + j * t.dp, s.d, grad_row<T>(bp.dk, b, hk, j0 + j));
              std::copy_n(t.dv.data() + j * t.dvp, s.dv, grad_row<T>(bp.dv, b, hk, j0 + j));
            }
          }
          // The task's key rows, whose dK and dV are written: counted once, per task.
          core::report_rows(p, std::min(s.nk, kt1 * plan.key_tile) -
                                   std::min(s.nk, kt0 * plan.key_tile));
        }
      } catch (const std::bad_alloc&) {
        out_of_memory.store(true, std::memory_order_relaxed);
      }
    });
    if (out_of_memory) return core::KernelStatus::kOutOfMemory;

    // Pass 2: the chunks' partials into dQ, chunk by chunk, the same order for any threads.
    if (plan.chunks > 1) {
      core::parallel_for(rows, p.threads, [&](std::int64_t begin, std::int64_t end) {
        for (std::int64_t row = begin; row < end; ++row) {
          const std::int64_t i = row % s.nq;
          const std::int64_t h = (row / s.nq) % s.h;
          const std::int64_t b = row / (s.nq * s.h);
          T* dst = grad_row<T>(bp.dq, b, h, i);
          for (std::int64_t c = 1; c < plan.chunks; ++c) {
            const T* src =
                partial.data() + static_cast<std::ptrdiff_t>(((c - 1) * rows + row) * s.d);
            for (std::int64_t col = 0; col < s.d; ++col) dst[col] += src[col];
          }
        }
      });
    }
    if (bp.dsinks != nullptr) {
      for (std::int64_t h = 0; h < s.h; ++h) {
        for (std::int64_t b = 0; b < s.b; ++b)
          bp.dsinks[h] += dsink_bh[static_cast<std::size_t>(b * s.h + h)];
      }
    }
  } catch (const std::bad_alloc&) {
    return core::KernelStatus::kOutOfMemory;
  }
  return core::KernelStatus::kOk;
}

}  // namespace qkv::kernels::bwd
