// The driver of the decode kernels: chunks every (batch, kv head)'s keys, runs the chunks on a
// thread team (a dynamic schedule: tasks own their partial state, so the schedule never changes
// a bit), then merges each row's chunk states in key order with the merge primitive of
// online_softmax.h and writes out and lse.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "core/mask_rule.h"
#include "core/memory_budget.h"
#include "core/parallel_for.h"
#include "core/progress.h"
#include "core/score_modifiers.h"
#include "kernels/decode_common.h"
#include "kernels/fused_common.h"
#include "kernels/kernel.h"
#include "kernels/online_softmax.h"

namespace qkv::kernels::decode {
namespace {

struct FreeFloats {
  void operator()(float* p) const noexcept { std::free(p); }
};
using Floats = std::unique_ptr<float[], FreeFloats>;

Floats allocate(std::int64_t count) noexcept {
  const std::size_t bytes =
      static_cast<std::size_t>(round_up(std::max<std::int64_t>(count, 1) * 4, 64));
  auto* p = static_cast<float*>(std::aligned_alloc(64, bytes));
  if (p != nullptr) std::memset(p, 0, bytes);
  return Floats(p);
}

// Tasks in (batch, kv head, chunk) order: a row's chunks are consecutive tasks, and
// first[x] .. first[x + 1] are those of (b, kv head) x = b · hkv + hk.
std::vector<Task> make_tasks(const DecodeCall& call, std::vector<std::int64_t>& first) {
  std::vector<Task> tasks;
  first.assign(1, 0);
  if (call.rows() == 0) return tasks;
  for (std::int64_t ib = 0; ib < call.b; ++ib) {
    const std::int64_t nk = call.nk[static_cast<std::size_t>(ib)];
    const std::int64_t step = chunk_keys(nk);
    for (std::int64_t hk = 0; hk < call.hkv; ++hk) {
      for (std::int64_t j0 = 0; j0 < nk; j0 += step) {
        tasks.push_back({ib, hk, j0, std::min(nk, j0 + step)});
      }
      first.push_back(static_cast<std::int64_t>(tasks.size()));
    }
  }
  return tasks;
}

std::int64_t partial_floats(const DecodeCall& call) noexcept {
  // Whole vectors, so that every task's o rows are aligned.
  return round_up(call.rows() * (round_up(call.dv, kPadLanes) + 2), kPadLanes);
}

std::int64_t scratch_floats(const DecodeCall& call) noexcept {
  const std::int64_t dp = round_up(call.d, kPadLanes);
  const std::int64_t dvp = round_up(call.dv, kPadLanes);
  // The key ranges (2 x rows int64, 4 floats per row) first, padded to whole vectors.
  return round_up(4 * call.rows(), kPadLanes) + call.rows() * dp + kBlockKeys * (dp + dvp) +
         call.rows() * kBlockKeys + 3 * call.rows() + dvp;
}

std::int64_t task_count(const DecodeCall& call) noexcept {
  if (call.rows() == 0) return 0;
  std::int64_t count = 0;
  for (std::int64_t nk : call.nk) count += call.hkv * ((nk + chunk_keys(nk) - 1) / chunk_keys(nk));
  return count;
}

// A worker's scratch in one buffer: the key ranges, Q rows, the block's K and V rows, the
// scores, alpha, then (for finish_head) 2 x rows of finals and dvp of accumulator at the end.
Scratch scratch_at(const DecodeCall& call, float* buffer) noexcept {
  const std::int64_t dp = round_up(call.d, kPadLanes);
  const std::int64_t dvp = round_up(call.dv, kPadLanes);
  float* base = buffer + round_up(4 * call.rows(), kPadLanes);
  float* s = base + call.rows() * dp + kBlockKeys * (dp + dvp);
  return {reinterpret_cast<std::int64_t*>(buffer), base, base + call.rows() * dp,
          base + call.rows() * dp + kBlockKeys * dp, s, s + call.rows() * kBlockKeys};
}

Partial partial_at(float* base, const DecodeCall& call, std::int64_t task) noexcept {
  const std::int64_t dvp = round_up(call.dv, kPadLanes);
  float* p = base + task * partial_floats(call);
  return {p, p + call.rows() * dvp, p + call.rows() * dvp + call.rows()};
}

float exp_float(float x) noexcept { return std::exp(x); }

// Merges the chunks [first, first + chunks) of (b, hk) row by row and writes the rows.
void finish_head(const DecodeCall& call, float* partials, std::int64_t first, std::int64_t chunks,
                 std::int64_t ib, std::int64_t hk, float* acc, float* finals) noexcept {
  const std::int64_t dvp = round_up(call.dv, kPadLanes);
  for (std::int64_t r = 0; r < call.rows(); ++r) {
    const std::int64_t h = hk * call.group() + r / call.nq;
    const std::int64_t i = r % call.nq;
    SoftmaxState state;
    // A sink is a partial state of its own: max = sink, sum = 1, no value.
    if (!call.modifiers.sinks.empty()) {
      state = {static_cast<float>(call.modifiers.sinks[static_cast<std::size_t>(h)]), 1.0f};
    }
    std::fill(acc, acc + dvp, 0.0f);
    for (std::int64_t c = 0; c < chunks; ++c) {
      const Partial part = partial_at(partials, call, first + c);
      const MergeFactors f = merge_states(state, SoftmaxState{part.m[r], part.l[r]}, exp_float);
      const float* o = part.o + r * dvp;
      for (std::int64_t x = 0; x < call.dv; ++x) acc[x] = f.into * acc[x] + f.part * o[x];
    }
    if (call.out.data != nullptr) {
      fused::store_row(call.out, ib, h, i, 0, acc, call.dv, inverse_sum(state));
    }
    if (call.lse.data != nullptr) {
      core::store_real(call.lse.data, call.lse.dtype, call.lse.strides.at(ib, h, i, 0),
                       log_sum_exp(state));
    }
    finals[2 * r] = state.max;
    finals[2 * r + 1] = inverse_sum(state);
  }
}

}  // namespace

KVRun DecodeCall::run_at(std::int64_t ib, std::int64_t hk, std::int64_t j) const noexcept {
  KVRun run;
  const std::int64_t left = nk[static_cast<std::size_t>(ib)] - j;
  const std::int64_t elem = storage_bytes(k_type);
  if (layout == nullptr) {
    run.k = static_cast<const std::byte*>(k.data) + k.strides.at(ib, hk, j, 0) * elem;
    run.v = static_cast<const std::byte*>(v.data) +
            v.strides.at(ib, hk, j, 0) * storage_bytes(v_type);
    run.k_row = k.strides.row;
    run.v_row = v.strides.row;
    run.k_col = k.strides.col;
    run.v_col = v.strides.col;
    run.rows = left;
    return run;
  }
  const cache::SequenceSnapshot& seq = sequences[static_cast<std::size_t>(ib)];
  const std::int64_t at = seq.first_row + j - seq.first_page_row;
  const std::byte* page = seq.pages[at / layout->page_rows];
  const std::int64_t r = at % layout->page_rows;
  run.k = page + layout->k_offset(hk) + r * d * elem;
  run.v = page + layout->v_offset(hk) + r * dv * elem;
  run.k_row = d;
  run.v_row = dv;
  if (layout->quantised()) {
    run.k_scales = reinterpret_cast<const float*>(page + layout->k_scale_offset(hk)) +
                   r * layout->k_blocks();
    run.v_scales = reinterpret_cast<const float*>(page + layout->v_scale_offset(hk)) +
                   r * layout->v_blocks();
    run.k_scale_row = layout->k_blocks();
    run.v_scale_row = layout->v_blocks();
  }
  run.rows = std::min(layout->page_rows - r, left);
  return run;
}

std::uint64_t decode_workspace_bytes(const DecodeCall& call, int threads) noexcept {
  return workspace_bytes(call.rows(), call.d, call.dv, task_count(call), threads);
}

std::uint64_t workspace_bytes(std::int64_t rows, std::int64_t d, std::int64_t dv,
                              std::int64_t tasks, int threads) noexcept {
  using core::saturating_add;
  using core::saturating_mul;
  const auto u = [](std::int64_t n) { return n < 0 ? std::uint64_t{0} : static_cast<std::uint64_t>(n); };
  const std::int64_t workers = std::clamp<std::int64_t>(tasks, 1, std::max(threads, 1));
  const std::uint64_t dp = u(round_up(d, kPadLanes)), dvp = u(round_up(dv, kPadLanes));
  const std::uint64_t partial = saturating_add(saturating_mul(u(rows), dvp + 2), u(kPadLanes));
  const std::uint64_t scratch = saturating_add(
      saturating_mul(u(rows), 7 + dp + u(kBlockKeys)),
      saturating_add(saturating_mul(u(kBlockKeys), dp + dvp), dvp + 2 * u(kPadLanes)));
  // With weights, each row's final (max, 1 / sum) too: 2 floats a row, under the partials'.
  const std::uint64_t floats = saturating_add(saturating_mul(u(tasks), partial + 2 * u(rows)),
                                              saturating_mul(u(workers), scratch));
  // Plus the task list (32 bytes a task) and the per-head index.
  return saturating_add(saturating_mul(floats, 4), saturating_mul(u(tasks), 48));
}

core::KernelStatus run_decode(const DecodeCall& call, ChunkFn chunk) noexcept {
  std::vector<Task> tasks;
  std::vector<std::int64_t> first;
  try {
    tasks = make_tasks(call, first);
  } catch (...) {
    return core::KernelStatus::kOutOfMemory;
  }
  const auto count = static_cast<std::int64_t>(tasks.size());
  Floats partials = allocate(count * partial_floats(call));
  if (!partials) return core::KernelStatus::kOutOfMemory;
  const bool weights = call.weights.data != nullptr;
  const auto heads = static_cast<std::int64_t>(first.size()) - 1;  // (b, kv head) pairs
  // Each row's merged (max, 1 / sum), kept for the weights sweep.
  Floats finals = allocate(weights ? heads * 2 * call.rows() : 1);
  if (!finals) return core::KernelStatus::kOutOfMemory;

  const std::int64_t dvp = round_up(call.dv, kPadLanes);
  const int wanted = static_cast<int>(std::clamp<std::int64_t>(
      std::max(count, heads), 1, std::max(1, call.threads)));
  std::atomic<std::int64_t> next_task{0};
  std::atomic<std::int64_t> next_head{0};
  std::atomic<std::int64_t> next_weights{0};
  std::atomic<bool> failed{false};

  core::run_team(wanted, [&](int, core::Team& team) {
    Floats mine = allocate(scratch_floats(call));
    if (!mine) failed.store(true);
    if (mine) {
      const Scratch scratch = scratch_at(call, mine.get());
      for (std::int64_t t; (t = next_task.fetch_add(1)) < count && !failed.load();) {
        chunk(call, tasks[static_cast<std::size_t>(t)], scratch,
              partial_at(partials.get(), call, t), nullptr);
      }
    }
    team.sync();
    if (failed.load()) return;
    float* acc = mine.get() + scratch_floats(call) - dvp;
    float* head_finals = acc - 2 * call.rows();  // below acc; alpha is below them
    for (std::int64_t x; (x = next_head.fetch_add(1)) < heads;) {
      const std::int64_t f = first[static_cast<std::size_t>(x)];
      finish_head(call, partials.get(), f, first[static_cast<std::size_t>(x) + 1] - f,
                  x / call.hkv, x % call.hkv, acc,
                  weights ? finals.get() + x * 2 * call.rows() : head_finals);
      if (call.progress != nullptr && call.rows() > 0) call.progress->add(call.rows());
    }
    if (!weights) return;
    team.sync();
    const Scratch scratch = scratch_at(call, mine.get());
    for (std::int64_t t; (t = next_weights.fetch_add(1)) < count;) {
      const Task& task = tasks[static_cast<std::size_t>(t)];
      chunk(call, task, scratch, partial_at(partials.get(), call, t),
            finals.get() + (task.b * call.hkv + task.hk) * 2 * call.rows());
    }
  });
  return failed.load() ? core::KernelStatus::kOutOfMemory : core::KernelStatus::kOk;
}

std::string plain_declines(const core::AttentionParams& p) {
  if (p.dropout.active()) return "it draws no dropout (the fused kernels do)";
  if (std::string why = float32_declines(p); !why.empty()) return why;
  if (core::inputs_round(p)) {
    return std::string("it reads K and V in place and cannot round them to ") +
           dtype_name(p.compute) + " (dtype)";
  }
  return {};
}

std::string plain_passes(const core::AttentionParams& p) {
  const std::int64_t rows = p.shape.group() * p.shape.nq;
  if (rows > kMaxPlainRows) {
    return std::to_string(rows) + " query rows per kv head (more than " +
           std::to_string(kMaxPlainRows) + "): the fused kernel's tiles reuse K and V better";
  }
  if (p.weights.data != nullptr) return "the weights output: the fused kernel writes it in one sweep fewer";
  return "";
}

DecodeCall plain_call(const core::AttentionParams& p) noexcept {
  DecodeCall call;
  const core::AttentionShape& s = p.shape;
  call.b = s.b;
  call.h = s.h;
  call.hkv = s.hkv;
  call.nq = s.nq;
  call.d = s.d;
  call.dv = s.dv;
  const auto type_of = [](DType t) {
    return t == DType::kBF16  ? KVType::kBF16
           : t == DType::kF16 ? KVType::kF16
           : t == DType::kF64 ? KVType::kF64
                              : KVType::kF32;
  };
  call.k_type = type_of(p.k.dtype);
  call.v_type = type_of(p.v.dtype);
  call.q = p.q;
  call.k = p.k;
  call.v = p.v;
  call.nk.assign(static_cast<std::size_t>(std::max<std::int64_t>(s.b, 0)), s.nk);
  call.scale = p.scale;
  call.modifiers = p.modifiers;
  call.masking = p.masking;
  call.out = p.out;
  call.lse = p.lse;
  call.weights = p.weights;
  call.threads = p.threads;
  call.progress = p.progress;
  call.kv_unchecked = p.kv_unchecked;
  return call;
}

}  // namespace qkv::kernels::decode
