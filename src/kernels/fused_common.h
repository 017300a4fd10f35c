// The ISA-independent half of the fused kernels: tiling plan, task order, which key tiles a
// query tile needs and which of them need per-element mask checks, packing of operand tiles to
// contiguous float32 or float64 (from float32, float64, bfloat16 or float16), the per-element
// mask path and the strided stores, each generic over the compute type E (float or double). The loop nest itself is in fused_driver-inl.h; see the comment there.
#pragma once

#include <algorithm>
#include <atomic>
#include <barrier>
#include <bit>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include <sys/mman.h>

#include "core/mask_rule.h"
#include "core/parallel_for.h"
#include "core/params.h"
#include "core/progress.h"
#include "core/score_modifiers.h"
#include "kernels/online_softmax.h"

namespace qkv::kernels::fused {

// Keys per tile (BK). 64 keys are 4 AVX-512 vectors: the q·K^T micro-kernel keeps a 6-row x
// 4-vector block of scores in 24 registers, and one tile's packed K^T (d x 64) and V (64 x dv)
// stay within L1/L2 for d <= 128. Larger tiles amortise the per-tile softmax bookkeeping
// better but push the score tile out of L1.
constexpr std::int64_t kKeyTile = 64;
// Query rows per task (BQ), counted over all the query heads that share one kv head: the K/V
// tile packed once serves all of them (GQA/MQA), and every K/V tile a task reads from L2/L3 is
// reused by 256 rows, which keeps the K/V stream at large nk (8 MiB per head at nk = 8192,
// d = 128, beyond L2) to a few GB/s; a task's Q and o (256 x (d + dv) floats, 256 KiB at
// d = dv = 128) stay in L2. Measured at n = 8192, d = 128, 1 thread: 103 GFLOP/s with 64-row
// tasks, 141 with 256. Fewer rows when that would leave fewer than 4 tasks per thread.
constexpr std::int64_t kTaskRows = 256;
// Packed K^T and V of every (batch, kv head) at once when they fit in this many floats
// (32 MiB), else of one head at a time in two alternating slots.
constexpr std::int64_t kPackBudgetFloats = std::int64_t{8} << 20;
// A (batch, kv head) whose packed K^T and V fit in this many bytes is packed by the worker that
// computes it, into its own slot, when there are at least 4 heads per worker: the tiles then
// stay in that core's L2 (1 MiB on Zen 4, 2 MiB on recent Xeons) beside the task's Q and o.
constexpr std::int64_t kPrivatePackBytes = std::int64_t{256} << 10;
// The widest vector of floats of any compiled target (AVX-512), for workspace bounds.
constexpr std::int64_t kMaxLanes = 16;

constexpr float kInfF = std::numeric_limits<float>::infinity();

// The storage type whose operands a tile of E holds as they are (read in place, copied).
template <class E>
constexpr DType kDTypeOf = std::is_same_v<E, double> ? DType::kF64 : DType::kF32;

inline std::int64_t round_up(std::int64_t n, std::int64_t m) noexcept {
  return (n + m - 1) / m * m;
}

// A 64-byte aligned buffer of E (float, or double for the float64 path), zeroed unless the
// caller writes every element it reads.
// Huge buffers (kHugeBytes and more, below) go back to a cache of one (huge_buffer_cache.cc)
// instead of the system, so that the next call of the same shape packs into pages already
// mapped: `huge_bytes` is their size, 0 for every other buffer.
// take_huge_buffer returns a 2 MiB aligned block of at least `bytes` (a cached one, or a new
// one asked to be backed by transparent huge pages) and sets `bytes` to its size.
void* take_huge_buffer(std::size_t& bytes) noexcept;
void give_back_huge_buffer(void* p, std::size_t bytes) noexcept;
struct FreeDeleter {
  std::size_t huge_bytes = 0;
  void operator()(void* p) const noexcept {
    if (huge_bytes != 0) {
      give_back_huge_buffer(p, huge_bytes);
    } else {
      std::free(p);
    }
  }
};
template <class E>
using BufferOf = std::unique_ptr<E[], FreeDeleter>;
using Buffer = BufferOf<float>;

// Buffers of at least kHugeBytes (the packed K^T/V slots) are 2 MiB aligned and asked to be
// backed by transparent huge pages: packing into a fresh 8 MiB slot otherwise takes 2048 page
// faults per call, which perf put at ~10 % of an n = 2048, d = 128, H = 8 call on a VM.
constexpr std::size_t kHugeBytes = std::size_t{4} << 20;
constexpr std::size_t kHugePage = std::size_t{2} << 20;

template <class E = float>
inline BufferOf<E> make_buffer(std::int64_t count, bool zeroed = true) noexcept {
  constexpr auto kSize = static_cast<std::int64_t>(sizeof(E));
  std::size_t bytes =
      static_cast<std::size_t>(round_up(std::max<std::int64_t>(count, 1) * kSize, 64));
  const bool huge = bytes >= kHugeBytes;
  if (!huge) {
    auto* p = static_cast<E*>(std::aligned_alloc(64, bytes));
    if (p != nullptr && zeroed) std::memset(p, 0, bytes);
    return BufferOf<E>(p);
  }
  bytes = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  auto* p = static_cast<E*>(take_huge_buffer(bytes));
  if (p != nullptr && zeroed) std::memset(p, 0, bytes);
  return BufferOf<E>(p, FreeDeleter{bytes});
}

// Tasks are (batch, kv head, query tile); a query tile holds bq rows of each of the g query
// heads of its kv head.
struct Plan {
  std::int64_t g = 1;        // query heads per kv head
  std::int64_t bq = 1;       // query rows per head in a task
  std::int64_t q_tiles = 1;  // per (b, kv head)
  std::int64_t tasks = 0;
  std::int64_t max_rows = 1;  // g * bq
};

inline Plan make_plan(const core::AttentionShape& s, int threads) noexcept {
  Plan plan;
  plan.g = s.group();
  // No query rows (nq, b, h or hkv of 0): no tasks, and no tile size to divide by.
  if (s.b <= 0 || s.hkv <= 0 || plan.g <= 0 || s.nq <= 0) {
    plan.q_tiles = 0;
    return plan;
  }
  std::int64_t rows = kTaskRows;
  const auto tasks_for = [&](std::int64_t r) {
    const std::int64_t bq = std::max<std::int64_t>(1, r / plan.g);
    return s.b * s.hkv * ((s.nq + bq - 1) / bq);
  };
  while (rows > 32 && tasks_for(rows) < 4 * std::int64_t{threads}) rows /= 2;
  plan.bq = std::min(std::max<std::int64_t>(1, rows / plan.g), s.nq);
  plan.q_tiles = (s.nq + plan.bq - 1) / plan.bq;
  plan.tasks = s.b * s.hkv * plan.q_tiles;
  plan.max_rows = plan.g * plan.bq;
  return plan;
}

struct Task {
  std::int64_t b = 0, hk = 0, i0 = 0, i1 = 0;
};

// Query tile q of (b, kv head) g, heaviest first: under causal masking later query tiles see
// more keys, so they are handed out first and the dynamic schedule balances. The order never
// changes a result: each task owns its output rows.
inline Task task_at(const Plan& plan, const core::AttentionShape& s, std::int64_t g,
                    std::int64_t q) noexcept {
  const std::int64_t qt = plan.q_tiles - 1 - q;
  Task task;
  task.b = g / s.hkv;
  task.hk = g % s.hkv;
  task.i0 = qt * plan.bq;
  task.i1 = std::min(s.nq, task.i0 + plan.bq);
  return task;
}

// The keys that rows [i0, i1) may need: the union of their causal/window ranges. Both ends of a
// row's range are non-decreasing in i, so the union runs from the first row's start to the last
// row's end.
inline core::KeyRange task_key_range(const core::Masking& m, const core::AttentionShape& s,
                                     std::int64_t i0, std::int64_t i1) noexcept {
  const std::int64_t offset = core::diagonal_offset(s, m);
  const core::KeyRange first = core::allowed_key_range(m, s.nk, i0 + offset);
  const core::KeyRange last = core::allowed_key_range(m, s.nk, i1 - 1 + offset);
  if (last.last <= first.first) return {0, 0};
  return {first.first, last.last};
}

// True when causal/window allow every key of [j0, j1) for every row of [i0, i1): such a tile
// runs without per-element checks.
inline bool tile_fully_allowed(const core::Masking& m, const core::AttentionShape& s,
                               std::int64_t i0, std::int64_t i1, std::int64_t j0,
                               std::int64_t j1) noexcept {
  if (!m.has_structure()) return true;
  const std::int64_t offset = core::diagonal_offset(s, m);
  const core::KeyRange top = core::allowed_key_range(m, s.nk, i0 + offset);
  const core::KeyRange bottom = core::allowed_key_range(m, s.nk, i1 - 1 + offset);
  return bottom.first <= j0 && j1 <= top.last;
}

// One element of an operand as E: float64 rounded to float for E = float, the 16-bit types
// exactly, float32 exactly into double.
template <class E = float>
inline E load_as(const core::InputOperand& op, std::int64_t at) noexcept {
  switch (op.dtype) {
    case DType::kF64:
      return static_cast<E>(static_cast<const double*>(op.data)[at]);
    case DType::kBF16:
      return static_cast<E>(core::bf16_to_float(static_cast<const std::uint16_t*>(op.data)[at]));
    case DType::kF16:
      return static_cast<E>(core::f16_to_float(static_cast<const std::uint16_t*>(op.data)[at]));
    case DType::kF32:
    case DType::kBool:
    case DType::kI32:
    case DType::kI64: break;
  }
  return static_cast<E>(static_cast<const float*>(op.data)[at]);
}

inline float load_float(const core::InputOperand& op, std::int64_t at) noexcept {
  return load_as<float>(op, at);
}

// One element as E, rounded to the call's storage type `round_to` first when that is
// narrower than the operand's (core::operand_rounds): once, from the stored value.
template <class E = float>
inline E load_rounded(const core::InputOperand& op, std::int64_t at, DType round_to) noexcept {
  if (op.dtype == DType::kF64) {
    return static_cast<E>(
        core::round_to_storage(static_cast<const double*>(op.data)[at], round_to));
  }
  return static_cast<E>(core::round_to_storage(load_float(op, at), round_to));
}

// dst[r * dst_stride + c] = operand[b, h, row0 + r, c] for r < rows, c < cols, as E, rounded
// to `round_to` where core::operand_rounds says so.
template <class E>
inline void pack_rows(const core::InputOperand& op, std::int64_t b, std::int64_t h,
                      std::int64_t row0, std::int64_t rows, std::int64_t cols, E* dst,
                      std::int64_t dst_stride, DType round_to = DType::kF32) noexcept {
  const core::Strides4& st = op.strides;
  const bool rounds = core::operand_rounds(op, round_to);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t base = st.at(b, h, row0 + r, 0);
    E* out = dst + r * dst_stride;
    if (rounds) {
      for (std::int64_t c = 0; c < cols; ++c) {
        out[c] = load_rounded<E>(op, base + c * st.col, round_to);
      }
    } else if (op.dtype == kDTypeOf<E>) {
      const E* in = static_cast<const E*>(op.data) + base;
      if (st.col == 1) {
        std::memcpy(out, in, static_cast<std::size_t>(cols) * sizeof(E));
      } else {
        for (std::int64_t c = 0; c < cols; ++c) out[c] = in[c * st.col];
      }
    } else {
      for (std::int64_t c = 0; c < cols; ++c) out[c] = load_as<E>(op, base + c * st.col);
    }
  }
}

// dst[c * dst_stride + r] = operand[b, h, row0 + r, c]: K transposed, so that the q·K^T
// micro-kernel reads a contiguous vector of keys for each head-dimension index c. Float32 rows
// with unit column stride go 16 rows at a time, column by column: each column's 16 values are
// one cache line of dst (row by row, every value landed on another line of dst).
template <class E>
inline void pack_transposed(const core::InputOperand& op, std::int64_t b, std::int64_t h,
                            std::int64_t row0, std::int64_t rows, std::int64_t cols, E* dst,
                            std::int64_t dst_stride, DType round_to = DType::kF32) noexcept {
  const core::Strides4& st = op.strides;
  std::int64_t r = 0;
  if (core::operand_rounds(op, round_to)) {
    for (; r < rows; ++r) {
      const std::int64_t base = st.at(b, h, row0 + r, 0);
      for (std::int64_t c = 0; c < cols; ++c) {
        dst[c * dst_stride + r] = load_rounded<E>(op, base + c * st.col, round_to);
      }
    }
    return;
  }
  // 16 rows: a 64-byte line of float32 (two of float64) per column.
  if (op.dtype == kDTypeOf<E> && st.col == 1) {
    constexpr std::int64_t kBlock = 16;
    const E* in[kBlock];
    for (; r + kBlock <= rows; r += kBlock) {
      for (std::int64_t x = 0; x < kBlock; ++x) {
        in[x] = static_cast<const E*>(op.data) + st.at(b, h, row0 + r + x, 0);
      }
      for (std::int64_t c = 0; c < cols; ++c) {
        E* out = dst + c * dst_stride + r;
        for (std::int64_t x = 0; x < kBlock; ++x) out[x] = in[x][c];
      }
    }
  }
  for (; r < rows; ++r) {
    const std::int64_t base = st.at(b, h, row0 + r, 0);
    if (op.dtype == kDTypeOf<E>) {
      const E* in = static_cast<const E*>(op.data) + base;
      for (std::int64_t c = 0; c < cols; ++c) dst[c * dst_stride + r] = in[c * st.col];
    } else {
      for (std::int64_t c = 0; c < cols; ++c) {
        dst[c * dst_stride + r] = load_as<E>(op, base + c * st.col);
      }
    }
  }
}

// The masked path for one row of a tile of scaled scores: -inf outside the row's causal/window
// interval and past `count` (two fills: the interval is contiguous), then the explicit mask's
// bias inside it, element by element only when there is a mask.
template <class E>
inline void mask_row(const core::AttentionParams& p, std::int64_t b, std::int64_t h, std::int64_t i,
                     std::int64_t j0, std::int64_t count, bool check_structure, E* s) noexcept {
  constexpr E kInf = std::numeric_limits<E>::infinity();
  const core::Masking& m = p.masking;
  std::int64_t lo = 0;
  std::int64_t hi = count;
  if (check_structure) {
    const core::KeyRange r =
        core::allowed_key_range(m, p.shape.nk, i + core::diagonal_offset(p.shape, m));
    lo = std::clamp<std::int64_t>(r.first - j0, 0, count);
    hi = std::clamp<std::int64_t>(r.last - j0, lo, count);
  }
  std::fill(s, s + lo, -kInf);
  std::fill(s + hi, s + kKeyTile, -kInf);
  if (m.mask == nullptr) return;
  for (std::int64_t j = lo; j < hi; ++j) {
    const E bias = static_cast<E>(core::mask_bias(m, b, h, i, j0 + j));
    s[j] = bias == -kInf ? -kInf : s[j] + bias;
  }
}

// out[b, h, i, c0 + c] = src[c] · factor for c < count, formed in E and rounded once to the
// output's dtype (a float64 call keeps its bits in a float64 output).
template <class E>
inline void store_row(const core::OutputOperand& out, std::int64_t b, std::int64_t h,
                      std::int64_t i, std::int64_t c0, const E* src, std::int64_t count,
                      E factor) noexcept {
  const core::Strides4& st = out.strides;
  const std::int64_t base = st.at(b, h, i, c0);
  if (out.dtype == DType::kF32) {
    float* dst = static_cast<float*>(out.data) + base;
    for (std::int64_t c = 0; c < count; ++c) dst[c * st.col] = static_cast<float>(src[c] * factor);
  } else {
    double* dst = static_cast<double*>(out.data) + base;
    for (std::int64_t c = 0; c < count; ++c) {
      dst[c * st.col] = static_cast<double>(src[c] * factor);
    }
  }
}

inline void store_zeros(const core::OutputOperand& out, std::int64_t b, std::int64_t h,
                        std::int64_t i, std::int64_t c0, std::int64_t count) noexcept {
  const core::Strides4& st = out.strides;
  const std::int64_t base = st.at(b, h, i, c0);
  if (out.dtype == DType::kF32) {
    float* dst = static_cast<float*>(out.data) + base;
    for (std::int64_t c = 0; c < count; ++c) dst[c * st.col] = 0.0f;
  } else {
    double* dst = static_cast<double*>(out.data) + base;
    for (std::int64_t c = 0; c < count; ++c) dst[c * st.col] = 0.0;
  }
}

}  // namespace qkv::kernels::fused
