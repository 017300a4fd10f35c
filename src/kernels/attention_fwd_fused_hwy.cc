// attention_fwd_fused_hwy: the fused kernel in SIMD, one source for every Highway target
// (AVX-512, AVX2, SSE4, ..., and Highway's portable EMU128), chosen at run time by one dynamic
// dispatch per call. The loop nest is fused_driver-inl.h (see the comment there: tasks, key
// tiles of 64, online softmax, weights recomputation); this file supplies its micro-kernels.
//
// q·K^T (scores): S[rows x 64] = Q[rows x d] · K^T[d x 64]. K^T is packed so that for each
//   head-dimension index c the 64 keys are contiguous: the micro-kernel keeps an MR-row x
//   NK-vector block of S in registers (6 x 4 zmm on AVX-512 = 24 accumulators) and for each c
//   loads NK key vectors once and broadcasts MR query scalars: NK + MR loads per MR·NK FMAs.
//   The reduction runs over c inside each accumulator, so any d runs at the same speed —
//   there is no lane-width constraint on the head dimension and no scalar cliff at d = 72.
// softmax: the scale and the row max are taken in the q·K^T epilogue while the scores are in
//   registers; then one vector pass computes exp(S - m) (ExpNonPositive below) and adds each
//   lane's part of the tile's sum into lane-wise running sums (no horizontal sum per tile).
// P·V (accumulate_pv): o[rows x dvp] = alpha ⊙ o + P[rows x bk] · V[bk x dvp], dv padded to
//   the vector width. An MR x NV block of o (6 x up to 4 zmm) is loaded once per key tile,
//   rescaled by alpha on load (the online-softmax correction costs no extra pass), then for
//   each key NV value vectors are loaded and MR weights broadcast: NV + MR loads per MR·NV FMAs.
//
// Vector-ALU budget per row and 64-key tile at d = dv = 64: 256 + 256 FMAs against about 100
// other vector ops (exp 4 x 15, subtract/store/sum 4 x 3, scale, max and its reduction, the
// alpha rescale): the FMAs can be at most ~84 % of the issued vector ops (~90 % at d = 128),
// which bounds the kernel's fraction of the FMA peak even with every load hitting L1.
//
// Float64 (HwyMicro<double>, for calls whose compute type is kF64: by default those whose Q, K
// and V are all float64): the same micro-kernels and loop nest on double lanes, half as many
// per vector (8 on AVX-512, 4 on AVX2). The key tile stays 64 keys (the driver's unit: masks,
// task ranges and the packed layout are in keys, not vectors), so a tile is 8 AVX-512 vectors
// and the 6 x 4 register block covers 6 rows x 32 keys: the same 24 accumulators and 10 loads
// per 24 FMAs as in float32, each FMA doing half the flops, so the float64 path's ceiling is
// half the float32 one's. The packed K^T tile doubles to 32 KiB at d = 64 (L1 on AVX-512
// machines with 48 KiB, else L2) and a task's Q and o to 256 KiB at d = dv = 64; smaller tiles
// would cut the reuse per load that keeps the float32 path near its ceiling, and the measured
// ratio (docs/performance.md) is about 0.45 of the float32 kernel's GFLOP/s, near the 0.5 the
// lane count allows. exp is ExpNonPositive64 (exp_hwy-inl.h, float64 to within about an ulp),
// softcap Highway's Tanh in double, ALiBi distances in double lanes.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/attention_fwd_fused_hwy.cc"
#include <cstdlib>
#include <cstring>
#include <limits>

#include "hwy/foreach_target.h"  // IWYU pragma: keep
// After foreach_target.h, which re-includes this file once per target.
#include "hwy/highway.h"
#include "kernels/dropout_hwy-inl.h"
#include "kernels/exp_hwy-inl.h"
#include "kernels/fused_common.h"
#include "kernels/fused_tiles.h"
#include "kernels/amx_tiles.h"
#include "kernels/score_modifiers_hwy-inl.h"
#include "kernels/kernel.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <class Real>
struct HwyMicro {
  using F = Real;
  using D = hn::ScalableTag<F>;
  using V = hn::Vec<D>;
  static constexpr std::int64_t kTile = fused::kKeyTile;
  static constexpr std::int64_t kLanes = static_cast<std::int64_t>(hn::MaxLanes(D()));
  static_assert(kTile % kLanes == 0, "the key tile must be a whole number of vectors");
  static constexpr std::int64_t kTileVectors = kTile / kLanes;
  static constexpr F kInf = std::numeric_limits<F>::infinity();
  // What a worker holds while it computes (AmxMicro's tile configuration; nothing here), and the
  // rows past the last one that scores() may read from the packed Q (none here).
  struct Session {};
  static constexpr std::int64_t kSpareRows = 0;
#if HWY_TARGET <= HWY_AVX3
  // 32 vector registers: 6 x 4 accumulators, 4 operand vectors and a broadcast. Six rows
  // rather than four cut the loads per FMA from 1/2 to 5/12; measured in isolation on L1-resident
  // tiles (d = 64), 6 x 4 blocks ran at 192 GFLOP/s against 186 for 4 x 4.
  static constexpr int kRows = 6;
  static constexpr int kKeyVectors = 4;
#else
  static constexpr int kRows = 4;  // 16 registers: 4 x 2 blocks
  static constexpr int kKeyVectors = 2;
#endif

  // Calls f.template operator()<MR>(r) for r = 0, kRows, 2·kRows, ... with MR = kRows, then
  // once for the remaining rows (MR < kRows), so every block size is a compile-time constant.
  template <int MR = kRows, class F>
  static HWY_INLINE void for_row_blocks(std::int64_t rows, std::int64_t r, F&& f) {
    if constexpr (MR == kRows) {
      for (; r + MR <= rows; r += MR) f.template operator()<MR>(r);
    }
    if constexpr (MR > 1) {
      if (rows - r == MR - 1) return f.template operator()<MR - 1>(r);
      for_row_blocks<MR - 1>(rows, r, f);
    } else if (rows - r == 1) {
      f.template operator()<1>(r);
    }
  }

  template <int MR, int NK>
  static HWY_INLINE void scores_block(const F* HWY_RESTRICT q, std::int64_t d,
                                      const F* HWY_RESTRICT kt, F scale, F* HWY_RESTRICT s,
                                      F* HWY_RESTRICT row_max) {
    const D df;
    V acc[static_cast<std::size_t>(MR)][static_cast<std::size_t>(NK)];
    for (int r = 0; r < MR; ++r) {
      for (int u = 0; u < NK; ++u) acc[r][u] = hn::Zero(df);
    }
    for (std::int64_t c = 0; c < d; ++c) {
      V k[static_cast<std::size_t>(NK)];
      for (int u = 0; u < NK; ++u) k[u] = hn::Load(df, kt + c * kTile + u * kLanes);
      for (int r = 0; r < MR; ++r) {
        const V qr = hn::Set(df, q[r * d + c]);
        for (int u = 0; u < NK; ++u) acc[r][u] = hn::MulAdd(qr, k[u], acc[r][u]);
      }
    }
    // The scale and the row max while the scores are still in registers.
    const V vs = hn::Set(df, scale);
    for (int r = 0; r < MR; ++r) {
      V m = hn::Set(df, -kInf);
      for (int u = 0; u < NK; ++u) {
        const V x = hn::Mul(acc[r][u], vs);
        hn::Store(x, df, s + r * kTile + u * kLanes);
        m = hn::Max(m, x);
      }
      row_max[r] = std::max(row_max[r], hn::GetLane(hn::MaxOfLanes(df, m)));
    }
  }

  // The first `vectors` key vectors of the tile: blocks of kKeyVectors, then one narrower block.
  template <int MR>
  static HWY_INLINE void scores_rows(const F* q, std::int64_t d, const F* kt, std::int64_t vectors,
                                     F scale, F* s, F* row_max) {
    for (int r = 0; r < MR; ++r) row_max[r] = -kInf;
    std::int64_t u = 0;
    for (; u + kKeyVectors <= vectors; u += kKeyVectors) {
      scores_block<MR, kKeyVectors>(q, d, kt + u * kLanes, scale, s + u * kLanes, row_max);
    }
    const std::int64_t off = u * kLanes;
    switch (vectors - u) {
      case 3:
        if constexpr (kKeyVectors > 3) scores_block<MR, 3>(q, d, kt + off, scale, s + off, row_max);
        break;
      case 2:
        if constexpr (kKeyVectors > 2) scores_block<MR, 2>(q, d, kt + off, scale, s + off, row_max);
        break;
      case 1:
        scores_block<MR, 1>(q, d, kt + off, scale, s + off, row_max);
        break;
      default:
        break;
    }
  }

  static void scores(const F* q, std::int64_t rows, std::int64_t d, const F* kt, std::int64_t keys,
                     F scale, F* s, F* row_max) noexcept {
    const std::int64_t vectors = (keys + kLanes - 1) / kLanes;
    for_row_blocks(rows, 0, [&]<int MR>(std::int64_t r) {
      scores_rows<MR>(q + r * d, d, kt, vectors, scale, s + r * kTile, row_max + r);
    });
  }

  static F row_max(const F* s) noexcept {
    const D df;
    V m = hn::Set(df, -kInf);
    for (std::int64_t j = 0; j < kTile; j += kLanes) m = hn::Max(m, hn::Load(df, s + j));
    return hn::GetLane(hn::MaxOfLanes(df, m));
  }

  static HWY_INLINE void exp_accumulate(F* s, F max, F alpha, F* lsum) noexcept {
    const D df;
    const V vm = hn::Set(df, max);
    V sum = hn::Zero(df);
    for (std::int64_t j = 0; j < kTile; j += kLanes) {
      const V e = ExpNonPositive(df, hn::Sub(hn::Load(df, s + j), vm));
      hn::Store(e, df, s + j);
      sum = hn::Add(sum, e);
    }
    hn::Store(hn::MulAdd(hn::Load(df, lsum), hn::Set(df, alpha), sum), df, lsum);
  }

  static F exp1(F x) noexcept {
    const D df;
    return hn::GetLane(ExpNonPositive(df, hn::Set(df, x)));
  }

  static void softmax_rows(F* s, std::int64_t rows, const F* tile_max, F* m, F* alpha,
                           F* lsum) noexcept {
    const D df;
    for (std::int64_t r = 0; r < rows; r += kLanes) {
      const auto live = hn::FirstN(df, static_cast<std::size_t>(std::min(kLanes, rows - r)));
      const V old = hn::MaskedLoad(live, df, m + r);
      const V now = hn::Max(old, hn::MaskedLoad(live, df, tile_max + r));
      hn::BlendedStore(ExpNonPositive(df, hn::Sub(old, now)), live, df, alpha + r);
      hn::BlendedStore(now, live, df, m + r);
    }
    for (std::int64_t r = 0; r < rows; ++r) {
      exp_accumulate(s + r * kTile, m[r], alpha[r], lsum + r * kLanes);
    }
  }

  // Softcap and ALiBi on a row of the tile (ModifyScores, shared with the decode kernel); returns
  // the row's new max (used when no mask follows).
  static F modify_scores(F* s, F cap, F slope, std::int64_t offset) noexcept {
    return ModifyScores(D(), s, kTile, cap, slope, offset);
  }

  static void exp_scale(F* s, F max, F factor) noexcept {
    const D df;
    const V vm = hn::Set(df, max);
    const V vf = hn::Set(df, factor);
    for (std::int64_t j = 0; j < kTile; j += kLanes) {
      hn::Store(hn::Mul(ExpNonPositive(df, hn::Sub(hn::Load(df, s + j), vm)), vf), df, s + j);
    }
  }

  template <int MR, int NV>
  static HWY_INLINE void pv_block(const F* HWY_RESTRICT p, std::int64_t bk, const F* HWY_RESTRICT v,
                                  std::int64_t ldv, std::int64_t dvp, const F* HWY_RESTRICT alpha,
                                  F* HWY_RESTRICT o) {
    const D df;
    V acc[static_cast<std::size_t>(MR)][static_cast<std::size_t>(NV)];
    for (int r = 0; r < MR; ++r) {
      const V a = hn::Set(df, alpha[r]);
      for (int u = 0; u < NV; ++u) acc[r][u] = hn::Mul(hn::Load(df, o + r * dvp + u * kLanes), a);
    }
    for (std::int64_t j = 0; j < bk; ++j) {
      V vj[static_cast<std::size_t>(NV)];
      for (int u = 0; u < NV; ++u) vj[u] = hn::LoadU(df, v + j * ldv + u * kLanes);
      for (int r = 0; r < MR; ++r) {
        const V w = hn::Set(df, p[r * kTile + j]);
        for (int u = 0; u < NV; ++u) acc[r][u] = hn::MulAdd(w, vj[u], acc[r][u]);
      }
    }
    for (int r = 0; r < MR; ++r) {
      for (int u = 0; u < NV; ++u) hn::Store(acc[r][u], df, o + r * dvp + u * kLanes);
    }
  }

  // o's columns in blocks of kKeyVectors vectors (the register budget of an MR x NV block is
  // that of the scores block), the last block narrower.
  template <int MR>
  static HWY_INLINE void pv_rows(const F* p, std::int64_t bk, const F* v, std::int64_t ldv,
                                 std::int64_t dvp, const F* alpha, F* o) {
    const std::int64_t vectors = dvp / kLanes;
    std::int64_t u = 0;
    for (; u + kKeyVectors <= vectors; u += kKeyVectors) {
      pv_block<MR, kKeyVectors>(p, bk, v + u * kLanes, ldv, dvp, alpha, o + u * kLanes);
    }
    const std::int64_t off = u * kLanes;
    switch (vectors - u) {
      case 3:
        if constexpr (kKeyVectors > 3) pv_block<MR, 3>(p, bk, v + off, ldv, dvp, alpha, o + off);
        break;
      case 2:
        if constexpr (kKeyVectors > 2) pv_block<MR, 2>(p, bk, v + off, ldv, dvp, alpha, o + off);
        break;
      case 1:
        pv_block<MR, 1>(p, bk, v + off, ldv, dvp, alpha, o + off);
        break;
      default:
        break;
    }
  }

  // core/dropout.h's mask on keys j0 + k (k < count) of row i: a vectorised Philox per row of
  // 64 float32 weights (dropout_hwy-inl.h), the portable draws for float64.
  static void dropout(const core::Dropout& d, std::uint32_t head_word, std::int64_t i,
                      std::int64_t j0, std::int64_t count, F* s) noexcept {
    dropout_hwy::span<F>(d, head_word, i, j0, count, s);
  }
  // The same mask on count rows of 64 float32 keys at once, the kept weights left unscaled
  // (the driver folds 1/(1 - p) into the output's 1/l): dropout_hwy::rows64 sets up once and
  // runs kDropRows rows' Philox chains side by side; row k at s + k·ld. The driver calls it
  // for float32 tiles only.
  static void zero_dropped_rows(const core::Dropout& d, std::int64_t count,
                                const std::uint32_t* head_word, const std::int64_t* i,
                                std::int64_t j0, float* s, std::int64_t ld) noexcept {
    dropout_hwy::rows64(d, count, head_word, i, j0, dropout_hwy::ZeroDropped{s, ld});
  }

  static void accumulate_pv(const F* p, std::int64_t rows, std::int64_t bk, const F* v,
                            std::int64_t ldv, std::int64_t dvp, const F* alpha, F* o) noexcept {
    for_row_blocks(rows, 0, [&]<int MR>(std::int64_t r) {
      pv_rows<MR>(p + r * kTile, bk, v, ldv, dvp, alpha + r, o + r * dvp);
    });
  }
};

#include "kernels/fused_driver-inl.h"

// The bf16 path (fused_bf16-inl.h) on the x86 AVX-512 targets, for bf16 calls on CPUs with
// AVX512-BF16; every other call, and a bf16 call elsewhere, runs the float32 micro-kernels.
// GCC builds it (its `#pragma GCC target` adds AVX512-BF16 to the inline intrinsics); clang,
// which the fuzz build uses, needs the feature on every function that inlines them, so it
// leaves the path out and bf16 calls take the float32 kernel on rounded tiles.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3 && !defined(__clang__)
#include "kernels/fused_bf16-inl.h"
#include "kernels/fused_amx-inl.h"

bool AmxForward(const core::AttentionParams& p) {
  return p.compute == DType::kBF16 && amx_forward_head_dim(p.shape.d) && amx_bf16_supported();
}

core::KernelStatus FusedForward(const core::AttentionParams& p) {
  if (p.compute == DType::kF64) return run_fused<HwyMicro<double>, fused::F64Tiles>(p);
  if (AmxForward(p)) return run_fused<AmxMicro, Bf16Tiles>(p);
  if (p.compute == DType::kBF16 && bf16_dots_supported()) {
    return run_fused<Bf16Micro, Bf16Tiles>(p);
  }
  return run_fused<HwyMicro<float>>(p);
}
bool FusedBf16Amx() { return amx_bf16_supported(); }
#else
core::KernelStatus FusedForward(const core::AttentionParams& p) {
  if (p.compute == DType::kF64) return run_fused<HwyMicro<double>, fused::F64Tiles>(p);
  return run_fused<HwyMicro<float>>(p);
}
bool FusedBf16Amx() { return false; }
#endif

}  // namespace qkv::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace qkv::kernels {

HWY_EXPORT(FusedForward);
HWY_EXPORT(FusedBf16Amx);

bool cpu_has_bf16_dots() noexcept {
#if HWY_ARCH_X86 && !defined(__clang__)
  static const bool has = __builtin_cpu_supports("avx512bf16") != 0;
  return has;
#else
  return false;
#endif
}

bool bf16_dots_supported() noexcept {
#if HWY_ARCH_X86 && !defined(__clang__)
  static const bool chosen = [] {
    if (!cpu_has_bf16_dots()) return false;
    if (const char* choice = std::getenv("QKV_BF16_DOTS");
        choice != nullptr && (std::strcmp(choice, "0") == 0 || std::strcmp(choice, "1") == 0)) {
      return choice[0] == '1';
    }
    // On the CPUs with AMX (Intel Sapphire Rapids and later) vdpbf16ps measured at half the
    // FMA's flops (qkv bench --peak on a Xeon: 173.5 against 365.0 GFLOP/s), and the bf16
    // kernels built on it ran at 0.58-0.70x their float32 twins; float32 FMAs on bf16-rounded
    // tiles (the widened path) are the faster bf16 there. A property of the CPU, read once:
    // every call of the process takes the same path, so the bits do not change between calls.
    return __builtin_cpu_supports("amx-bf16") == 0;
  }();
  return chosen;
#else
  return false;
#endif
}

bool fused_bf16_dots_available() noexcept {
  if (!bf16_dots_supported()) return false;
  apply_simd_cap();
  const std::int64_t targets = hwy::SupportedTargets() & HWY_TARGETS;
  const std::int64_t best = targets & -targets;
#if HWY_ARCH_X86
  return best == HWY_AVX3 || best == HWY_AVX3_DL;
#else
  (void)best;
  return false;
#endif
}

bool fused_bf16_amx_available(std::int64_t d) noexcept {
  if (!amx_forward_head_dim(d)) return false;
  apply_simd_cap();
  return HWY_DYNAMIC_DISPATCH(FusedBf16Amx)();
}

std::string fused_hwy_path(DType compute, std::int64_t d) {
  switch (compute) {
    case DType::kBF16:
      return fused_bf16_amx_available(d) ? "bf16 products on AMX tiles"
             : fused_bf16_dots_available() ? "bf16 dot products (vdpbf16ps)"
                                           : "float32 on bf16-rounded tiles";
    case DType::kF16:
      return "float32 on f16-rounded tiles";
    case DType::kF64:
      return "float64";
    default:
      return "float32";
  }
}

std::string attention_fwd_fused_hwy_declines(const core::AttentionParams& p) {
  return fused_declines(p);
}

// QKV_SIMD_MAX=AVX2 (or SSE4, SSSE3, ...: a Highway target name) caps the targets dispatch may
// pick, to reproduce another machine's path; results stay within the accuracy criterion on
// every target (the sweep test runs them all). Read once, at the first call.
void apply_simd_cap() noexcept {
  static const bool applied = [] {
    const char* cap = std::getenv("QKV_SIMD_MAX");
    if (cap == nullptr) return true;
    for (std::int64_t t = HWY_TARGETS; t != 0; t &= t - 1) {
      const std::int64_t target = t & -t;
      if (std::strcmp(hwy::TargetName(target), cap) == 0) hwy::DisableTargets(target - 1);
    }
    return true;
  }();
  (void)applied;
}

core::KernelStatus attention_fwd_fused_hwy(const core::AttentionParams& p) noexcept {
  apply_simd_cap();
  return HWY_DYNAMIC_DISPATCH(FusedForward)(p);
}

std::vector<std::int64_t> simd_targets() { return hwy::SupportedAndGeneratedTargets(); }

void simd_force_target(std::int64_t target) { hwy::SetSupportedTargetsForTest(target); }

std::string simd_target_name(std::int64_t target) { return hwy::TargetName(target); }

std::string simd_target_name() {
  apply_simd_cap();
  const std::int64_t targets = hwy::SupportedTargets() & HWY_TARGETS;
  return targets == 0 ? std::string("none") : hwy::TargetName(targets & -targets);
}

}  // namespace qkv::kernels
#endif  // HWY_ONCE
