// attention_fwd_decode_scalar: the portable twin of attention_fwd_decode_hwy, with the same
// tasks, chunks and merge (decode_driver.cc) and a plain per-key loop inside a chunk:
//
//   for each key j of the chunk that row r may see:
//     s = scale · q_r·k_j                  (k_j widened from its storage type)
//     m' = max(m, s);  l = exp(m - m') · l + exp(s - m');  o = exp(m - m') · o + exp(s - m') · v_j
//
// It is the decode kernel of a portable build and the readable statement of what the SIMD
// version computes in blocks of 16 keys.
#include <algorithm>
#include <cmath>

#include "core/half.h"
#include "core/mask_rule.h"
#include "kernels/decode_common.h"
#include "kernels/fused_common.h"
#include "kernels/kernel.h"
#include "kernels/online_softmax.h"

namespace qkv::kernels {
namespace {

using decode::KVType;

constexpr float kInfF = std::numeric_limits<float>::infinity();

float stored(KVType type, const void* row, const float* scales, std::int64_t c,
             std::int64_t col) noexcept {
  switch (type) {
    case KVType::kF32: return static_cast<const float*>(row)[c * col];
    case KVType::kF64: return static_cast<float>(static_cast<const double*>(row)[c * col]);
    case KVType::kBF16:
      return core::bf16_to_float(static_cast<const std::uint16_t*>(row)[c * col]);
    case KVType::kF16: return core::f16_to_float(static_cast<const std::uint16_t*>(row)[c * col]);
    case KVType::kInt8:
      return static_cast<float>(static_cast<const std::int8_t*>(row)[c]) *
             scales[c / kCacheInt8Block];
  }
  return 0.0f;
}

// Calls key(j, s, v_row, v_scales, v_col) for each key j of [first, last), s its masked score
// (-inf where the explicit mask forbids it).
template <class F>
void for_each_key(const decode::DecodeCall& call, const decode::Task& task, std::int64_t h,
                  std::int64_t i, const float* q, std::int64_t first, std::int64_t last,
                  F&& key) noexcept {
  const std::int64_t k_elem = decode::storage_bytes(call.k_type);
  const std::int64_t v_elem = decode::storage_bytes(call.v_type);
  const float scale = static_cast<float>(call.scale);
  for (std::int64_t j = first; j < last;) {
    const decode::KVRun run = call.run_at(task.b, task.hk, j);
    const std::int64_t run_end = std::min(last, j + run.rows);
    for (std::int64_t at = 0; at < run_end - j; ++at) {
      const auto* k_row = static_cast<const std::byte*>(run.k) + at * run.k_row * k_elem;
      const auto* v_row = static_cast<const std::byte*>(run.v) + at * run.v_row * v_elem;
      const float* k_scales = run.k_scales + at * run.k_scale_row;
      float dot = 0.0f;
      for (std::int64_t c = 0; c < call.d; ++c) {
        dot += q[c] * stored(call.k_type, k_row, k_scales, c, run.k_col);
      }
      float s = scale * dot;
      const core::ScoreModifiers& mod = call.modifiers;
      if (mod.softcap > 0) {
        const auto cap = static_cast<float>(mod.softcap);
        s = cap * std::tanh(s / cap);
      }
      if (!mod.alibi_slopes.empty()) {
        const std::int64_t diag = i + call.nk[static_cast<std::size_t>(task.b)] - call.nq;
        const std::int64_t jk = j + at;
        const std::int64_t distance = diag >= jk ? diag - jk : jk - diag;
        s -= static_cast<float>(mod.alibi_slopes[static_cast<std::size_t>(h)]) *
             static_cast<float>(distance);
      }
      if (call.masking.mask != nullptr) {
        const auto bias = static_cast<float>(core::mask_bias(call.masking, task.b, h, i, j + at));
        s = bias == -kInfF ? -kInfF : s + bias;
      }
      key(j + at, s, v_row, run.v_scales + at * run.v_scale_row, run.v_col);
    }
    j = run_end;
  }
}

void scalar_chunk(const decode::DecodeCall& call, const decode::Task& task,
                  const decode::Scratch& scratch, const decode::Partial& out,
                  const float* finals) noexcept {
  const std::int64_t dvp = decode::round_up(call.dv, decode::kPadLanes);
  const std::int64_t nk = call.nk[static_cast<std::size_t>(task.b)];
  const auto exp_float = [](float x) { return std::exp(x); };
  for (std::int64_t r = 0; r < call.rows(); ++r) {
    const std::int64_t h = task.hk * call.group() + r / call.nq;
    const std::int64_t i = r % call.nq;
    float* q = scratch.q;
    for (std::int64_t c = 0; c < call.d; ++c) {
      q[c] = static_cast<float>(
          core::load_real(call.q.data, call.q.dtype, call.q.strides.at(task.b, h, i, c)));
    }
    const core::KeyRange range = core::allowed_key_range(call.masking, nk, i + nk - call.nq);
    const std::int64_t first = std::clamp(range.first, task.j0, task.j1);
    const std::int64_t last = std::clamp(range.last, first, task.j1);
    if (finals != nullptr) {
      // Weights mode: exp(s - max) / sum from the merged state, zeros outside the range.
      const float max = finals[2 * r];
      const float inv = finals[2 * r + 1];
      fused::store_zeros(call.weights, task.b, h, i, task.j0, first - task.j0);
      fused::store_zeros(call.weights, task.b, h, i, last, task.j1 - last);
      for_each_key(call, task, h, i, q, first, last,
                   [&](std::int64_t j, float s, const void*, const float*, std::int64_t) {
                     const float w = max == -kInfF ? 0.0f : std::exp(s - max);
                     fused::store_row(call.weights, task.b, h, i, j, &w, 1, inv);
                   });
      continue;
    }
    float m = -kInfF;
    float l = 0.0f;
    float* o = out.o + r * dvp;
    std::fill(o, o + dvp, 0.0f);
    for_each_key(call, task, h, i, q, first, last,
                 [&](std::int64_t, float s, const void* v_row, const float* v_scales,
                     std::int64_t v_col) {
                   if (s == -kInfF) return;  // masked: changes nothing
                   const float m_new = std::max(m, s);
                   const float alpha = rescale_factor(m, m_new, exp_float);
                   const float p = std::exp(s - m_new);
                   l = alpha * l + p;
                   for (std::int64_t c = 0; c < call.dv; ++c) {
                     o[c] = alpha * o[c] + p * stored(call.v_type, v_row, v_scales, c, v_col);
                   }
                   m = m_new;
                 });
    out.m[r] = m;
    out.l[r] = l;
  }
}

}  // namespace

namespace decode {
core::KernelStatus decode_run_scalar(const DecodeCall& call) noexcept {
  return run_decode(call, &scalar_chunk);
}
}  // namespace decode

std::string attention_fwd_decode_scalar_declines(const core::AttentionParams& p) {
  return decode::plain_declines(p);
}

// The scalar twin serves attention_cached in a portable build and runs when forced; for plain
// tensors unfused_blas's CBLAS calls and the fused kernels are faster at every shape (4.5x at
// one query row, nk = 32768, in a portable build).
std::string attention_fwd_decode_scalar_passes(const core::AttentionParams&) {
  return "the portable twin: unfused_blas and the fused kernels are faster";
}

core::KernelStatus attention_fwd_decode_scalar(const core::AttentionParams& p) noexcept {
  return decode::decode_run_scalar(decode::plain_call(p));
}

}  // namespace qkv::kernels
