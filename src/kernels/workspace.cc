// The kernels' scratch memory, bounded from the shape alone, for the memory budget. Each term
// follows the allocations of one kernel; change it with the kernel.
#include <algorithm>

#include "core/memory_budget.h"
#include "kernels/decode_common.h"
#include "kernels/fused_common.h"
#include "kernels/kernel.h"

namespace qkv::kernels {
namespace {

std::uint64_t u(std::int64_t n) noexcept { return n < 0 ? 0 : static_cast<std::uint64_t>(n); }

}  // namespace

std::uint64_t attention_workspace_bytes(const core::AttentionShape& shape, int threads,
                                        const std::string& kernel, DType compute) noexcept {
  using core::saturating_add;
  using core::saturating_mul;
  const std::uint64_t d = u(shape.d), dv = u(shape.dv), nq = u(shape.nq), nk = u(shape.nk);
  // Per-worker buffers count the threads each kernel really starts: never more than its tasks
  // (--threads 100000 on a small call runs a few threads, and must not be refused as needing
  // 100000 workspaces).
  const std::int64_t asked = std::max(threads, 1);
  const std::uint64_t fused_workers =
      u(std::clamp<std::int64_t>(fused::make_plan(shape, threads).tasks, 1, asked));
  const std::uint64_t reference_workers =
      u(std::clamp<std::int64_t>(shape.b * shape.h * shape.nq, 1, asked));
  const std::uint64_t lanes = u(fused::kMaxLanes), key_tile = u(fused::kKeyTile);
  const std::uint64_t group = shape.hkv > 0 ? u(shape.h / shape.hkv) : 1;
  // The fused kernel's tiles hold float64 for a float64 call, float32 (or bf16) otherwise.
  const std::uint64_t element = compute == DType::kF64 ? 8 : 4;

  // Fused, per worker: the Q, score, accumulator and row-state tiles of one task.
  const std::uint64_t rows = std::max(u(fused::kTaskRows), group);
  const std::uint64_t dvp = dv + lanes;
  // Per row: Q, o (padded), scores, lane-wise sums and 4 scalars (alpha, tile max, running max,
  // sum); 3 vectors of slack for the per-row scalars.
  const std::uint64_t fused_tiles = saturating_mul(
      saturating_add(saturating_mul(rows, d + dvp + key_tile + lanes + 4), 3 * lanes), element);
  // Fused, shared: packed K^T and V of every kv head when they fit the pack budget (in bytes:
  // kPackBudgetFloats float32 elements), else two.
  const std::uint64_t head_floats =
      saturating_mul((nk + key_tile - 1) / key_tile * key_tile, d + dvp);
  const std::uint64_t all_heads =
      saturating_mul(saturating_mul(u(shape.b), u(shape.hkv)), head_floats);
  std::uint64_t packed =
      saturating_mul(saturating_mul(all_heads, element) <= u(fused::kPackBudgetFloats) * 4
                         ? all_heads
                         : saturating_mul(head_floats, 2),
                     element);
  // Slots of kHugeBytes or more are rounded up to whole huge pages (make_buffer): two at most.
  if (packed >= fused::kHugeBytes) packed = saturating_add(packed, 2 * fused::kHugePage);
  // Reference, per worker: one row of scores and one accumulator in float64.
  const std::uint64_t reference = saturating_mul(nk + dv, 8);
  std::uint64_t bytes = saturating_add(std::max(saturating_mul(fused_tiles, fused_workers),
                                                saturating_mul(reference, reference_workers)),
                                       packed);

  const std::int64_t decode_rows_per_head = shape.hkv > 0 ? shape.h / shape.hkv * shape.nq : 0;
  if ((kernel.empty() && decode_rows_per_head <= decode::kMaxPlainRows) ||
      kernel.starts_with("decode")) {
    // Decode (by default only for the shapes it does not pass over): per task a partial
    // state, per worker its scratch.
    const std::int64_t step = decode::chunk_keys(shape.nk);
    const std::uint64_t tasks = saturating_mul(saturating_mul(u(shape.b), u(shape.hkv)),
                                               (nk + u(step) - 1) / u(step));
    const auto task_count = static_cast<std::int64_t>(
        std::min<std::uint64_t>(tasks, std::uint64_t{1} << 62));
    bytes = std::max(bytes, decode::workspace_bytes(decode_rows_per_head, shape.d, shape.dv, task_count, threads));
  }
  if (kernel.empty() || kernel == "unfused_blas") {
    // Unfused, per worker: a block of scores and outputs, row state, and packed Q, K and V.
    const std::uint64_t block = std::min(nq, u(kUnfusedRowBlock));
    std::uint64_t unfused =
        saturating_mul(saturating_add(saturating_mul(block, nk + dv + 2),
                                      saturating_mul(block + 2 * nk, std::max(d, dv))),
                       4);
    unfused = saturating_mul(unfused, u(unfused_workers(shape, threads)));
    bytes = std::max(bytes, unfused);
  }
  return bytes;
}

}  // namespace qkv::kernels
