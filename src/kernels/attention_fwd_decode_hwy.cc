// attention_fwd_decode_hwy: attention for few query rows against many keys (decoding, chunked
// prefill), at the speed memory delivers K and V. One source for every Highway target, one
// dynamic dispatch per call.
//
//   shapes   Q [b, h, nq, d]; K [b, hkv, nk, d] and V [b, hkv, nk, dv], plain tensors or a KV
//            cache's pages (decode_common.h: KVRun), stored as float32, bfloat16, float16 or
//            int8 (blocks of 32 with a float scale); query head h reads kv head h / g.
//   tasks    (b, kv head, chunk of keys): the g·nq query rows of every query head of the kv
//            head against one chunk (chunk_keys: >= 1024 keys, at most 64 chunks per head,
//            from the shape alone). So each K/V byte is read from memory once per call, for all
//            g query heads that share it (grouped-query attention costs no extra traffic), and
//            a single query over a long context still has many tasks to spread over threads
//            (split-KV). K is read in place, row by row: nothing is packed per call.
//   per task Q rows converted to float32 once (R = g·nq rows, zero-padded to whole vectors);
//            per row a softmax state (m, l) and an accumulator o [dv]. For each block of 16
//            keys inside the union of the rows' causal/window ranges:
//              ask for every cache line of the block's K and V rows (touch_row); float32
//              rows whose length is a whole number of vectors are read in place, a cache's
//              bf16, f16 and int8 rows of whole vectors are read as stored and widened to
//              float32 in registers where they are used (StoredRows: V in P·V, K in the dot
//              products for few rows), other rows are widened into L1 (bf16 and f16 by a
//              conversion, int8 by q · scale)
//              s_rj = scale · q_r·k_j       4 rows at a time share each K vector load; one
//                                           horizontal sum per score
//              -inf outside row r's causal/window range
//              m' = max(m, max_j s_rj);  alpha = exp(m - m');  p_rj = exp(s_rj - m')
//              l = alpha · l + sum_j p_rj;  o_r = alpha · o_r + sum_j p_rj v_j
//   merge    the driver (decode_driver.cc) merges a row's chunk states in key order with
//            merge_states (online_softmax.h), then O = o / l, lse = m + log l; a row with no
//            allowed key gives zeros and lse = -inf.
//
// Invariant after each block, per row: m is the max of the scores seen, l = sum exp(s_j - m)
// and o = sum exp(s_j - m) v_j over them. The exp is the fused kernel's (exp_hwy-inl.h).
//
// Traffic and work: each K and V element is read once per call from memory; per key and row
// the work is d + dv FMAs and one horizontal sum, so at g·nq <= 16 rows the loop keeps pace
// with memory (about 1 KiB of float32 K/V per key at d = 128) and the time is the bytes read
// over the bandwidth. Memory: per worker the Q rows, one block of widened K/V and the scores;
// per task its partial state (g·nq rows x (dv + 2) floats).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/attention_fwd_decode_hwy.cc"
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "hwy/foreach_target.h"  // IWYU pragma: keep
// After foreach_target.h, which re-includes this file once per target.
#include "core/half.h"
#include "core/mask_rule.h"
#include "hwy/highway.h"
#include "kernels/decode_common.h"
#include "kernels/decode_ops_hwy-inl.h"
#include "kernels/exp_hwy-inl.h"
#include "kernels/fused_common.h"
#include "kernels/kernel.h"
#include "kernels/online_softmax.h"
#include "kernels/score_modifiers_hwy-inl.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

namespace decode_hwy {

template <KVType T>
class Chunk {
 public:
  Chunk(const decode::DecodeCall& call, const decode::Task& task, const decode::Scratch& scratch)
      : call_(call),
        task_(task),
        scratch_(scratch),
        rows_(call.rows()),
        dp_(decode::round_up(call.d, decode::kPadLanes)),
        dvp_(decode::round_up(call.dv, decode::kPadLanes)),
        dl_(decode::round_up(call.d, kLanes)),
        dvl_(decode::round_up(call.dv, kLanes)),
        nk_(call.nk[static_cast<std::size_t>(task.b)]),
        scale_(static_cast<float>(call.scale)),
        modified_(call.modifiers.softcap > 0 || !call.modifiers.alibi_slopes.empty()),
        row_lo_(scratch.ranges),
        row_hi_(scratch.ranges + rows_),
        alpha_(scratch.alpha),
        checking_(call.kv_unchecked != nullptr),
        v_stored_(reads_stored(call) && call.dv % kLanes == 0),
        k_stored_(reads_stored(call) && call.d % kLanes == 0 && kStoredKeyRows > 0 &&
                  rows_ <= kStoredKeyRows) {}

  // The keys of this chunk that any row may see, [first, last); empty when none.
  void key_ranges(std::int64_t& first, std::int64_t& last) const noexcept {
    first = task_.j1;
    last = task_.j0;
    for (std::int64_t r = 0; r < rows_; ++r) {
      const core::KeyRange range =
          core::allowed_key_range(call_.masking, nk_, r % call_.nq + nk_ - call_.nq);
      row_lo_[r] = std::max(range.first, task_.j0);
      row_hi_[r] = std::max(row_lo_[r], std::min(range.last, task_.j1));
      if (row_lo_[r] < row_hi_[r]) {
        first = std::min(first, row_lo_[r]);
        last = std::max(last, row_hi_[r]);
      }
    }
  }

  void load_queries() const noexcept {
    for (std::int64_t r = 0; r < rows_; ++r) {
      float* dst = scratch_.q + r * dp_;
      for (std::int64_t c = 0; c < call_.d; ++c) {
        dst[c] = static_cast<float>(core::load_real(
            call_.q.data, call_.q.dtype, call_.q.strides.at(task_.b, head(r), r % call_.nq, c)));
      }
      std::fill(dst + call_.d, dst + dp_, 0.0f);
    }
  }

  // Calls block(jb, bk) for each block of keys in [first, last), with keys_/values_ pointing at
  // its K and V rows as float32 (or k_rows_/v_rows_ at them as stored, for StoredRows) and the
  // scores s_rj in scratch.s (scaled, -inf outside each row's range and where the mask forbids;
  // a row whose range misses the block is left).
  template <class F>
  void for_each_block(std::int64_t first, std::int64_t last, bool need_values, F&& block) noexcept {
    const std::int64_t k_elem = decode::storage_bytes(T);
    const std::int64_t v_elem = decode::storage_bytes(call_.v_type);
    const bool k_in_place = T == KVType::kF32 && call_.d % kLanes == 0;
    const bool v_in_place = call_.v_type == KVType::kF32 && call_.dv % kLanes == 0;
    for (std::int64_t j = first; j < last;) {
      const decode::KVRun run = call_.run_at(task_.b, task_.hk, j);
      const std::int64_t run_end = std::min(last, j + run.rows);
      for (std::int64_t jb = j; jb < run_end; jb += kBlockKeys) {
        const std::int64_t bk = std::min(kBlockKeys, run_end - jb);
        for (std::int64_t x = 0; x < bk; ++x) {
          const std::int64_t at = jb - j + x;
          const auto* k_row = static_cast<const std::byte*>(run.k) + at * run.k_row * k_elem;
          if (k_in_place && run.k_col == 1) {
            keys_[x] = reinterpret_cast<const float*>(k_row);
            touch_row(k_row, call_.d * 4);
          } else if (kWidened && k_stored_) {
            k_rows_[x] = k_row;
            k_scales_[x] = run.k_scales + at * run.k_scale_row;
            touch_row(k_row, call_.d * k_elem);
          } else {
            widen_row<T>(k_row, run.k_scales + at * run.k_scale_row, call_.d, run.k_col, dp_,
                         scratch_.k + x * dp_);
            keys_[x] = scratch_.k + x * dp_;
          }
          if (!need_values) continue;
          const auto* v_row = static_cast<const std::byte*>(run.v) + at * run.v_row * v_elem;
          if (v_in_place && run.v_col == 1) {
            values_[x] = reinterpret_cast<const float*>(v_row);
            touch_row(v_row, call_.dv * 4);
          } else if (kWidened && v_stored_) {
            v_rows_[x] = v_row;
            v_scales_[x] = run.v_scales + at * run.v_scale_row;
            touch_row(v_row, call_.dv * v_elem);
          } else {
            widen_any(call_.v_type, v_row, run.v_scales + at * run.v_scale_row, call_.dv, run.v_col,
                      dvp_, scratch_.v + x * dvp_);
            values_[x] = scratch_.v + x * dvp_;
          }
        }
        std::int64_t r = 0;
#if HWY_TARGET <= HWY_AVX3
        // K is checked as the first row's scores read it, V by accumulate()'s P·V.
        if constexpr (kWidened) {
          if (k_stored_) {
            for (std::int64_t x = bk; x < kBlockKeys; ++x) {
              k_rows_[x] = k_rows_[0];
              k_scales_[x] = k_scales_[0];
            }
            const StoredRows<T> keys{k_rows_, k_scales_};
            for (; r < rows_; ++r) {
              dot_block(scratch_.q + r * dp_, dl_, keys, scale_, scratch_.s + r * kBlockKeys);
            }
          }
        }
        for (std::int64_t x = bk; x < kBlockKeys; ++x) keys_[x] = keys_[0];
        const FloatRows keys{keys_};
        if (need_values && checking_ && rows_ > 0) {
          dot_block<true>(scratch_.q, dl_, keys, scale_, scratch_.s, k_largest_);
          poison_ = hn::MulAdd(hn::Load(D(), scratch_.s), hn::Zero(D()), poison_);
          r = 1;
        }
        for (; r < rows_; ++r) {
          dot_block(scratch_.q + r * dp_, dl_, keys, scale_, scratch_.s + r * kBlockKeys);
        }
#else
        if (need_values && checking_ &&
            (any_large(keys_, bk, dl_) || any_large(values_, bk, dvl_))) {
          call_.kv_unchecked->store(true, std::memory_order_relaxed);
        }
        for (; r + 4 <= rows_; r += 4) {
          dot_rows<4>(scratch_.q + r * dp_, dp_, dl_, keys_, bk, scale_,
                      scratch_.s + r * kBlockKeys);
        }
        for (; r < rows_; ++r) {
          dot_rows<1>(scratch_.q + r * dp_, dp_, dl_, keys_, bk, scale_,
                      scratch_.s + r * kBlockKeys);
        }
#endif
        for (r = 0; r < rows_; ++r) mask_scores(r, jb, bk);
        block(jb, bk);
      }
      j = run_end;
    }
  }

  // Partial mode: the online softmax over the chunk into `out`.
  void accumulate(const decode::Partial& out) noexcept {
    const D df;
    for (std::int64_t r = 0; r < rows_; ++r) {
      out.m[r] = -kInfF;
      out.l[r] = 0.0f;
      std::fill(out.o + r * dvp_, out.o + (r + 1) * dvp_, 0.0f);
    }
    std::int64_t first = 0, last = 0;
    key_ranges(first, last);
    if (first >= last) return;
    load_queries();
#if HWY_TARGET <= HWY_AVX3
    for (V& x : k_largest_) x = hn::Zero(df);
    for (V& x : v_largest_) x = hn::Zero(df);
    poison_ = hn::Zero(df);
#endif
    for_each_block(first, last, true, [&](std::int64_t jb, std::int64_t bk) {
      // Softmax row by row (p in place of s, 0 for masked keys), then P·V for 4 rows at a time
      // over the union of their keys in the block.
      std::int64_t xa = bk, xe = 0;
      for (std::int64_t r = 0; r < rows_; ++r) {
        float* s = scratch_.s + r * kBlockKeys;
        const std::int64_t a = std::clamp<std::int64_t>(row_lo_[r] - jb, 0, bk);
        const std::int64_t e = std::clamp<std::int64_t>(row_hi_[r] - jb, a, bk);
        alpha_[r] = 1.0f;
        V block_max = hn::Set(df, -kInfF);
        for (std::int64_t x = 0; x < kBlockKeys; x += kLanes) {
          block_max = hn::Max(block_max, hn::Load(df, s + x));
        }
        const float m_old = out.m[r];
        const float m_new = std::max(m_old, hn::GetLane(hn::MaxOfLanes(df, block_max)));
        if (a == e || m_new == -kInfF) {
          // No allowed key here, or every key so far masked: the row's state stays.
          std::fill(s, s + kBlockKeys, 0.0f);
          continue;
        }
        xa = std::min(xa, a);
        xe = std::max(xe, e);
        alpha_[r] = rescale_factor(
            m_old, m_new, [&](float t) { return hn::GetLane(ExpNonPositive(df, hn::Set(df, t))); });
        const V vm = hn::Set(df, m_new);
        V sum = hn::Zero(df);
        for (std::int64_t x = 0; x < kBlockKeys; x += kLanes) {
          const V p = ExpNonPositive(df, hn::Sub(hn::Load(df, s + x), vm));
          hn::Store(p, df, s + x);
          sum = hn::Add(sum, p);
        }
        out.m[r] = m_new;
        out.l[r] = alpha_[r] * out.l[r] + hn::GetLane(hn::SumOfLanes(df, sum));
      }
#if HWY_TARGET <= HWY_AVX3
      // P·V reads V's rows [xa, xe) of the block; the others (keys no row may see) are checked
      // on their own, as the scan would have checked them.
      if (checking_ && (xa > 0 || xe < bk)) {
        const std::int64_t before = std::min(xa, bk);
        const std::int64_t after = std::max(xe, before);
        if (any_large(values_, before, dvl_) || any_large(values_ + after, bk - after, dvl_)) {
          call_.kv_unchecked->store(true, std::memory_order_relaxed);
        }
      }
#endif
      if (xa >= xe) return;
      std::int64_t r = 0;
#if HWY_TARGET <= HWY_AVX3
      if (checking_) {
        r = std::min<std::int64_t>(rows_, 4);
        accumulate_rows_of<true>(out, 0, r, xa, xe);
      }
#endif
      for (; r < rows_; r += 4) {
        accumulate_rows_of<false>(out, r, std::min<std::int64_t>(rows_ - r, 4), xa, xe);
      }
    });
#if HWY_TARGET <= HWY_AVX3
    if (checking_) {
      // The rows of o that the checked P·V wrote (accumulate_group<G, true>'s).
      for (std::int64_t r = 0; r < std::min<std::int64_t>(rows_, 4); ++r) {
        for (std::int64_t c = 0; c < dvl_; c += kLanes) {
          poison_ = hn::MulAdd(hn::Load(df, out.o + r * dvp_ + c), hn::Zero(df), poison_);
        }
      }
      if (!hn::AllTrue(df, hn::Eq(poison_, hn::Zero(df))) || any_large(k_largest_, kCheckLanes) ||
          any_large(v_largest_, static_cast<int>(kMaxColumnVectors))) {
        call_.kv_unchecked->store(true, std::memory_order_relaxed);
      }
    }
#endif
  }

  // Weights mode: w_rj = exp(s_rj - max_r) / sum_r over the chunk's keys, zeros elsewhere in it.
  void write_weights(const float* finals) noexcept {
    const D df;
    std::int64_t first = 0, last = 0;
    key_ranges(first, last);
    for (std::int64_t r = 0; r < rows_; ++r) {
      const float max = finals[2 * r];
      const std::int64_t a = max == -kInfF ? task_.j1 : row_lo_[r];
      const std::int64_t e = max == -kInfF ? task_.j1 : row_hi_[r];
      fused::store_zeros(call_.weights, task_.b, head(r), r % call_.nq, task_.j0, a - task_.j0);
      fused::store_zeros(call_.weights, task_.b, head(r), r % call_.nq, e, task_.j1 - e);
    }
    if (first >= last) return;
    load_queries();
    for_each_block(first, last, false, [&](std::int64_t jb, std::int64_t bk) {
      for (std::int64_t r = 0; r < rows_; ++r) {
        const float max = finals[2 * r];
        const std::int64_t a = std::clamp<std::int64_t>(row_lo_[r] - jb, 0, bk);
        const std::int64_t e = std::clamp<std::int64_t>(row_hi_[r] - jb, a, bk);
        if (a == e || max == -kInfF) continue;
        float* s = scratch_.s + r * kBlockKeys;
        const V vm = hn::Set(df, max);
        for (std::int64_t x = 0; x < kBlockKeys; x += kLanes) {
          hn::Store(ExpNonPositive(df, hn::Sub(hn::Load(df, s + x), vm)), df, s + x);
        }
        fused::store_row(call_.weights, task_.b, head(r), r % call_.nq, jb + a, s + a, e - a,
                         finals[2 * r + 1]);
      }
    });
  }

 private:
  std::int64_t head(std::int64_t r) const noexcept {
    return task_.hk * call_.group() + r / call_.nq;
  }

  // accumulate_group for the `count` (1 to 4) rows from r.
  template <bool kCheck>
  void accumulate_rows_of(const decode::Partial& out, std::int64_t r, std::int64_t count,
                          std::int64_t xa, std::int64_t xe) noexcept {
    switch (count) {
      case 1:
        return accumulate_group<1, kCheck>(out, r, xa, xe);
      case 2:
        return accumulate_group<2, kCheck>(out, r, xa, xe);
      case 3:
        return accumulate_group<3, kCheck>(out, r, xa, xe);
      default:
        return accumulate_group<4, kCheck>(out, r, xa, xe);
    }
  }

  template <std::size_t G, bool kCheck = false>
  void accumulate_group(const decode::Partial& out, std::int64_t r, std::int64_t xa,
                        std::int64_t xe) noexcept {
    float* o[G];
    const float* p[G];
    for (std::size_t g = 0; g < G; ++g) {
      o[g] = out.o + (r + static_cast<std::int64_t>(g)) * dvp_;
      p[g] = scratch_.s + (r + static_cast<std::int64_t>(g)) * kBlockKeys;
    }
    if constexpr (kWidened) {
      if (v_stored_) {
        return accumulate_rows<G>(o, p, alpha_ + r, StoredRows<T>{v_rows_, v_scales_}, xa, xe,
                                  dvl_);
      }
    }
#if HWY_TARGET <= HWY_AVX3
    accumulate_rows<G, kCheck>(o, p, alpha_ + r, FloatRows{values_}, xa, xe, dvl_, v_largest_);
#else
    accumulate_rows<G>(o, p, alpha_ + r, FloatRows{values_}, xa, xe, dvl_);
#endif
  }

  // The score modifiers on row r's block of scores (before the mask, as the contract orders
  // them): s := cap·tanh(s / cap) - slope·|diag - j|, a vector at a time.
  void modify_scores(std::int64_t r, std::int64_t jb) const noexcept {
    const core::ScoreModifiers& mod = call_.modifiers;
    const float cap = static_cast<float>(mod.softcap);
    const float slope =
        mod.alibi_slopes.empty()
            ? 0.0f
            : static_cast<float>(mod.alibi_slopes[static_cast<std::size_t>(head(r))]);
    const std::int64_t offset = r % call_.nq + nk_ - call_.nq - jb;
    ModifyScores(D(), scratch_.s + r * kBlockKeys, kBlockKeys, cap, slope, offset);
  }

  void mask_scores(std::int64_t r, std::int64_t jb, std::int64_t bk) const noexcept {
    const std::int64_t a = std::clamp<std::int64_t>(row_lo_[r] - jb, 0, bk);
    const std::int64_t e = std::clamp<std::int64_t>(row_hi_[r] - jb, a, bk);
    if (modified_ && a < e) modify_scores(r, jb);
    float* s = scratch_.s + r * kBlockKeys;
    std::fill(s, s + a, -kInfF);
    std::fill(s + e, s + kBlockKeys, -kInfF);
    const core::Masking& m = call_.masking;
    if (m.mask == nullptr) return;
    for (std::int64_t x = a; x < e; ++x) {
      const auto bias =
          static_cast<float>(core::mask_bias(m, task_.b, head(r), r % call_.nq, jb + x));
      s[x] = bias == -kInfF ? -kInfF : s[x] + bias;
    }
  }

  const decode::DecodeCall& call_;
  const decode::Task& task_;
  const decode::Scratch& scratch_;
  const std::int64_t rows_, dp_, dvp_, dl_, dvl_, nk_;
  const float scale_;
  const bool modified_;  // softcap or ALiBi
  std::int64_t* row_lo_;
  std::int64_t* row_hi_;
  float* alpha_;
  const float* keys_[kBlockKeys] = {};
  const float* values_[kBlockKeys] = {};
  // Plain K and V are checked as they are read (kv_unchecked set on a NaN, an infinity or a
  // magnitude of 2^32 or more); on AVX-512 into these running maxima, else block by block.
  const bool checking_;
#if HWY_TARGET <= HWY_AVX3
  V k_largest_[kCheckLanes];
  V v_largest_[kMaxColumnVectors];
  V poison_;
#endif
  // A cache's bf16, f16 and int8 rows are read as stored, their lines asked for when the block is
  // first met (touch_row), and widened in registers by the loops that use them (StoredRows): V by
  // P·V, which widens each V vector once per group of up to 4 rows; K by the dot products when
  // the task has few rows, as each row's dot products widen K again. Widening the block's rows
  // into L1 first (widen_row, as before) measured slower on an AMD Zen 5 (d = 128, nk = 32768,
  // 2 threads, 4 interleaved rounds, ms): 8/8 heads bf16 2.80 → 2.24, f16 2.99 → 2.25, int8
  // 2.76 → 2.17; 32/8 bf16 4.85 → 3.93 (K in registers for 4 rows; 4.15 with K widened into
  // L1), int8 4.45 → 3.93 (K into L1; 4.27 in registers for 4 rows). The same floats either
  // way, summed in the same order: the bits do not change.
  static constexpr bool kWidened = T == KVType::kBF16 || T == KVType::kF16 || T == KVType::kInt8;
#if HWY_TARGET <= HWY_AVX3
  // Rows up to which the dot products widen K in registers (dot_block on AVX-512 only): a 16-bit
  // widening is one or two operations a vector, int8's three.
  static constexpr std::int64_t kStoredKeyRows = !kWidened ? 0 : T == KVType::kInt8 ? 1 : 4;
#else
  static constexpr std::int64_t kStoredKeyRows = 0;
#endif
  // Pages only (their rows dense, K and V of one type).
  static bool reads_stored(const decode::DecodeCall& call) noexcept {
    return kWidened && call.layout != nullptr && call.v_type == T;
  }
  const bool v_stored_;
  const bool k_stored_;
  const void* k_rows_[kBlockKeys] = {};
  const void* v_rows_[kBlockKeys] = {};
  const float* k_scales_[kBlockKeys] = {};
  const float* v_scales_[kBlockKeys] = {};
};

template <KVType T>
void chunk(const decode::DecodeCall& call, const decode::Task& task, const decode::Scratch& scratch,
           const decode::Partial& out, const float* finals) noexcept {
  Chunk<T> c(call, task, scratch);
  if (finals == nullptr) {
    c.accumulate(out);
  } else {
    c.write_weights(finals);
  }
}

void DecodeChunk(const decode::DecodeCall& call, const decode::Task& task,
                 const decode::Scratch& scratch, const decode::Partial& out,
                 const float* finals) noexcept {
  switch (call.k_type) {
    case KVType::kF32:
      return chunk<KVType::kF32>(call, task, scratch, out, finals);
    case KVType::kBF16:
      return chunk<KVType::kBF16>(call, task, scratch, out, finals);
    case KVType::kF16:
      return chunk<KVType::kF16>(call, task, scratch, out, finals);
    case KVType::kInt8:
      return chunk<KVType::kInt8>(call, task, scratch, out, finals);
    case KVType::kF64:
      return chunk<KVType::kF64>(call, task, scratch, out, finals);
  }
}

}  // namespace decode_hwy

core::KernelStatus DecodeRun(const decode::DecodeCall& call) {
  return decode::run_decode(call, &decode_hwy::DecodeChunk);
}

}  // namespace qkv::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace qkv::kernels {

HWY_EXPORT(DecodeRun);

core::KernelStatus decode::decode_run_hwy(const DecodeCall& call) noexcept {
  apply_simd_cap();
  return HWY_DYNAMIC_DISPATCH(DecodeRun)(call);
}

std::string attention_fwd_decode_hwy_declines(const core::AttentionParams& p) {
  return decode::plain_declines(p);
}

std::string attention_fwd_decode_hwy_passes(const core::AttentionParams& p) {
  return decode::plain_passes(p);
}

core::KernelStatus attention_fwd_decode_hwy(const core::AttentionParams& p) noexcept {
  return decode::decode_run_hwy(decode::plain_call(p));
}

}  // namespace qkv::kernels
#endif  // HWY_ONCE
