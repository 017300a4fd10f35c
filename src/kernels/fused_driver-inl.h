// The loop nest of the fused forward kernels, shared by the scalar twin and every SIMD target.
// Included inside the namespace of its includer, after kernels/fused_common.h and <atomic>;
// Highway's per-target re-inclusion is why it has a toggling guard instead of #pragma once.
//
// Fused attention forward, FlashAttention-2 style, for one AttentionParams:
//
//   shapes   Q [b, h, nq, d], K [b, hkv, nk, d], V [b, hkv, nk, dv], O [b, h, nq, dv];
//            query head h reads kv head h / g, g = h / hkv.
//   tasks    (b, kv head, query tile): bq rows of each of the g query heads that share the kv
//            head (g·bq ≈ 256 rows), so every K/V tile is packed once for all of them. Tasks own
//            disjoint output rows, threads take them from an atomic counter (order below):
//            any thread count and any schedule give the same bits.
//   packing  K^T in tiles of [d x 64] (and V as [nk x dvp] unless it is stored as the tile's
//            type with dense rows and dv a whole number of vectors, then read in place), once per
//            kv head and call, shared by all tasks of that head (see run_fused). The element type
//            and layout are the template parameter Tiles (fused_tiles.h): float32, or the bf16
//            pairs of fused_bf16-inl.h that vdpbf16ps reads (K^T as [d/2 x 64] pairs, V as [32 x
//            dvp] pairs of keys), or float64 for a call computing in float64 (F64Tiles); everything
//            after the score tile is in the Micro's type F: float32 for the float32 and bf16 paths,
//            float64 for the float64 one (the same loop nest, templated).
//   per task Q tile packed to F [rows x d]; per row a softmax state (max m, sum l: l in
//            kLanes lanes) and an accumulator o [dv] (padded to the vector width, dvp).
//            for each key tile [j0, j0 + 64) inside the union of the rows' causal/window ranges
//            (tiles outside it are never touched), group by group of 4·kRows rows (24 on
//            AVX-512):
//              skip the tile if it lies outside all the group's rows' ranges; on a tile that
//              the causal/window end crosses, only the keys up to the group's last allowed
//              one are computed
//              S = scale · Q · K^T              micro-kernel, 24 x 64, over any d, with
//                                               each row's max taken in registers
//              per row: S += mask, -inf where forbidden: only on tiles that the causal/window
//                       boundary crosses for this group, with an explicit mask, or the short
//                       last tile
//                       m' = max(m, max_j S_j);  alpha = exp(m - m') (the group's alphas in
//                       one vector exp; rescale_factor() with the Micro's exp per row only
//                       while a row's max is not finite)
//                       P_j = exp(S_j - m');  l = alpha · l + the tile's sum (lane-wise)
//              o := alpha · o + P · V           micro-kernel, 24 x dvp, the rescale fused in
//            (the group's scores stay in L1; the K^T and V tiles, 16 KiB each at d = dv = 64,
//            are reused by 4 register blocks while in L1)
//            with dropout: P_j := P_j·z_ij after l has taken P (core/dropout.h), so that
//            o sums the dropped weights and l stays the softmax's denominator; float32
//            tiles zero the dropped weights only and O takes 1/(1 - p) with 1/l (kFoldsScale)
//            O = o / l, lse = m + log l; a row with no allowed key stays m = -inf, l = 0, o = 0
//            and is written as zeros with lse = -inf.
//   order    without causal/window, head by head (a kv head's K^T and V stay in L2 from one
//            task to the next); with them, the heaviest query tiles of every head first.
//   weights  (when asked for) a second sweep over the same key tiles recomputes S exactly as
//            above and writes exp(S - m) / l tile by tile: no n x n workspace. The final (m, l)
//            pair is the log-sum-exp in split form; exp(S - m) / l is used rather than
//            exp(S - lse) because lse = m + log l rounds away the low bits of log l when |m| is
//            large, which would cost relative accuracy on huge logits.
//
// Invariant after each key tile: for every row, m is the max of the scores seen, l = sum
// exp(S_j - m) over them and o = sum exp(S_j - m) v_j, so the final division is the softmax.
// Each tile's sum is formed over its 64 keys (4 per lane) before it enters l (a long row summed
// one element at a time loses accuracy at nk = 65536).
//
// Memory: per worker the Q (unless read in place), S and o tiles, 256 (d + 64 + dv) elements of F;
// shared, the packed K^T (and V when it cannot be read in place) of all kv heads if that fits
// 32 MiB, else of two.
// No n x n buffer anywhere. Traffic: K and V are converted/transposed once per kv head, then
// each K/V tile is read (from L2/L3) once per query task, nq / bq times per kv head; each Q and
// O element is read or written once.
//
// The policy `Micro` supplies the inner loops (all on 64-key rows of S):
//   F (float or double: the type of S, P, o and the softmax state);
//   kLanes, kRows (the row group the loop nest hands the micro-kernels at a time);
//   scores(q, rows, d, kt, keys, scale, s, row_max) (S = scale · Q·K^T and each row's max, for
//   at least the first `keys` keys of the tile: later scores may be left as they were);
//   row_max(s) -> max;
//   exp1(x) -> exp(x) for x <= 0 or -inf, the scalar exp the vector ones agree with bit for bit;
//   exp_accumulate(s, m, alpha, lsum) (s := exp(s - m); lsum[lane] := alpha · lsum[lane] + the
//   lane's part of sum_j s_j); softmax_rows(s, rows, tile_max, m, alpha, lsum) (for `rows`
//   rows with finite new maxes: m := max(m, tile_max), alpha := exp1(m_old - m), then
//   exp_accumulate per row); exp_scale(s, m, f) (s := exp(s - m) · f);
//   accumulate_pv(p, rows, bk, v, ldv, dvp, alpha, o) (V rows ldv apart, o rows dvp apart);
//   dropout(dropout, head_word, i, j0, count, s) (core/dropout.h's mask on keys j0 + k, k <
//   count, of row i: s_k·1/(1 - p) or 0); optionally zero_dropped_rows(dropout, count,
//   head_words, rows, j0, s, ld) (the mask on `count` rows of 64 keys, the kept weights left
//   as they are: the driver then folds 1/(1 - p) into the output's 1/l).

#if defined(QKV_KERNELS_FUSED_DRIVER_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_KERNELS_FUSED_DRIVER_INL_H_
#undef QKV_KERNELS_FUSED_DRIVER_INL_H_
#else
#define QKV_KERNELS_FUSED_DRIVER_INL_H_
#endif

// One (b, kv head)'s K^T and V as the micro-kernels read them: K^T in tiles of
// Tiles::kt_tile(d) elements (tile t at kt + t·kt_tile(d), the last one zero-padded), V as rows
// of ldv elements (the caller's own memory when it is float32 with dense rows and dv a whole
// number of vectors, else a padded copy), a tile of 64 keys every 64·ldv elements.
template <class T>
struct HeadPack {
  const T* kt = nullptr;
  const T* v = nullptr;
  std::int64_t ldv = 0;
};

// Tiles (fused_tiles.h) is the packed element type and layout: float32 for every float32
// micro-kernel but the bf16 one, whose Micro reads the bf16 pairs of fused_bf16-inl.h, and
// float64 for the float64 micro-kernels.
template <class Micro, class Tiles>
class FusedWorker {
  using T = typename Tiles::T;
  using F = typename Micro::F;
  static constexpr F kInf = std::numeric_limits<F>::infinity();

 public:
  FusedWorker(const core::AttentionParams& p, const fused::Plan& plan)
      : p_(p),
        plan_(plan),
        dvp_(fused::round_up(p.shape.dv, Micro::kLanes)),
        q_stride_(Tiles::q_row(p.shape.d)),
        q_in_place_(Tiles::kReadsInPlace && plan.g == 1 && p.q.dtype == Tiles::kInPlaceDType &&
                    p.q.strides.col == 1 && p.q.strides.row == p.shape.d &&
                    !core::operand_rounds(p.q, p.compute)),
        modified_(p.modifiers.softcap > 0 || !p.modifiers.alibi_slopes.empty()),
        q_(Tiles::make(q_in_place_ ? 0 : (plan.max_rows + Micro::kSpareRows) * q_stride_)),
        s_(fused::make_buffer<F>(plan.max_rows * fused::kKeyTile)),
        o_(fused::make_buffer<F>(plan.max_rows * dvp_)),
        // One vector of slack: softmax_rows reads these a vector of rows at a time, and
        // targets without masked loads read the whole vector.
        alpha_(fused::make_buffer<F>(plan.max_rows + Micro::kLanes)),
        max_(fused::make_buffer<F>(plan.max_rows + Micro::kLanes)),
        m_(fused::make_buffer<F>(plan.max_rows + Micro::kLanes)),
        sum_(fused::make_buffer<F>(plan.max_rows)),
        lsum_(fused::make_buffer<F>(plan.max_rows * Micro::kLanes)) {}

  bool ok() const noexcept { return q_ && s_ && o_ && alpha_ && max_ && m_ && sum_ && lsum_; }

  void run(const fused::Task& t, const HeadPack<T>& kv) noexcept {
    const core::AttentionShape& sh = p_.shape;
    const std::int64_t per_head = t.i1 - t.i0;
    const std::int64_t rows = plan_.g * per_head;
    // Q's rows are read in place when they already are the tile (the tile's type, dense rows, one
    // query head per kv head), else packed: the copy was 2 % of a causal n = 512, d = 128 call.
    q_rows_ = Tiles::data(q_);
    if (q_in_place_) {
      q_rows_ = static_cast<const T*>(p_.q.data) + p_.q.strides.at(t.b, t.hk, t.i0, 0);
    } else {
      for (std::int64_t gh = 0; gh < plan_.g; ++gh) {
        Tiles::pack_q(p_.q, t.b, t.hk * plan_.g + gh, t.i0, per_head, sh.d,
                      Tiles::data(q_) + gh * per_head * q_stride_, p_.compute);
      }
    }
    std::fill(o_.get(), o_.get() + rows * dvp_, F{0});
    std::fill(m_.get(), m_.get() + rows, -kInf);
    std::fill(lsum_.get(), lsum_.get() + rows * Micro::kLanes, F{0});
    // A sink is a score every row has seen before its first key: the running max starts at it
    // and the running sum at exp(sink - sink) = 1. A row that never meets an allowed key keeps
    // exactly that state: out 0, lse = sink.
    if (!p_.modifiers.sinks.empty()) {
      for (std::int64_t r = 0; r < rows; ++r) {
        const auto h = static_cast<std::size_t>(t.hk * plan_.g + r / per_head);
        m_.get()[r] = static_cast<F>(p_.modifiers.sinks[h]);
        lsum_.get()[r * Micro::kLanes] = F{1};
      }
    }

    const core::KeyRange range = fused::task_key_range(p_.masking, sh, t.i0, t.i1);
    const std::int64_t tile_end = (range.last + fused::kKeyTile - 1) / fused::kKeyTile;
    for (std::int64_t kt = range.first / fused::kKeyTile; kt < tile_end; ++kt) {
      const std::int64_t j0 = kt * fused::kKeyTile;
      const std::int64_t bk = std::min(fused::kKeyTile, sh.nk - j0);
      const T* k_tile = kv.kt + kt * Tiles::kt_tile(sh.d);
      const T* v_tile = kv.v + j0 * kv.ldv;
      // Row group by row group (kGroupRows rows): the group's scores, softmax and P·V run
      // back to back, so its score rows never leave L1, and each micro-kernel reuses its K^T or
      // V tile for 4 register blocks in a row while it is in L1. Causal/window are classified
      // per group: a tile wholly outside a group's rows' ranges is skipped for that group (its
      // scores are all -inf, so the online state would not change), one wholly inside runs
      // without per-element checks.
      for (std::int64_t r0 = 0; r0 < rows; r0 += kGroupRows) {
        const std::int64_t nr = std::min<std::int64_t>(kGroupRows, rows - r0);
        const std::int64_t first_head = r0 / per_head;
        const bool one_head = (r0 + nr - 1) / per_head == first_head;
        const std::int64_t ilo = one_head ? t.i0 + r0 % per_head : t.i0;
        const std::int64_t ihi = one_head ? t.i0 + (r0 + nr - 1) % per_head + 1 : t.i1;
        const core::KeyRange keys = fused::task_key_range(p_.masking, sh, ilo, ihi);
        if (j0 >= keys.last || j0 + bk <= keys.first) continue;
        const bool full = bk == fused::kKeyTile && p_.masking.mask == nullptr &&
                          fused::tile_fully_allowed(p_.masking, sh, ilo, ihi, j0, j0 + bk);
        // A tile that the causal/window end crosses is computed only up to the group's last
        // allowed key: mask_row sets every later score to -inf, so those keys would add
        // exactly 0 to o and l.
        const std::int64_t used = std::min(bk, keys.last - j0);
        Micro::scores(q_rows_ + r0 * q_stride_, nr, sh.d, k_tile, used, scale(),
                      s_.get() + r0 * fused::kKeyTile, max_.get() + r0);
        // A tile that needs masking (or softcap / ALiBi) is finished row by row and its rows'
        // maxes retaken; the softmax step is then the group's, as on an unmasked tile.
        if (!full || modified_) {
          for (std::int64_t r = r0; r < r0 + nr; ++r) {
            max_.get()[r] = finish_scores(t, r, j0, bk, full, s_.get() + r * fused::kKeyTile);
          }
        }
        update_group(r0, nr);
        if (p_.dropout.active()) drop_rows(t, r0, nr, j0);
        Micro::accumulate_pv(s_.get() + r0 * fused::kKeyTile, nr, used, v_tile, kv.ldv, dvp_,
                             alpha_.get() + r0, o_.get() + r0 * dvp_);
      }
    }

    for (std::int64_t r = 0; r < rows; ++r) {
      const F* lsum = lsum_.get() + r * Micro::kLanes;
      // Summed in a local (the same adds in the same order): through the reference into sum_
      // the compiler stored and reloaded it after every add, as lsum might alias it.
      F sum = F{0};
      for (std::int64_t x = 0; x < Micro::kLanes; ++x) sum += lsum[x];
      sum_.get()[r] = sum;
      const BasicSoftmaxState<F> st{m_.get()[r], sum};
      const std::int64_t h = t.hk * plan_.g + r / per_head;
      const std::int64_t i = t.i0 + r % per_head;
      F factor = inverse_sum(st);
      if (kFoldsScale && p_.dropout.active()) factor *= static_cast<F>(p_.dropout.keep_scale);
      fused::store_row(p_.out, t.b, h, i, 0, o_.get() + r * dvp_, sh.dv, factor);
      if (p_.lse.data != nullptr) {
        core::store_real(p_.lse.data, p_.lse.dtype, p_.lse.strides.at(t.b, h, i, 0),
                         log_sum_exp(st));
      }
    }
    if (p_.weights.data != nullptr) write_weights(t, range, kv);
  }

 private:
  static constexpr std::int64_t kGroupRows = 4 * Micro::kRows;
  // Whether the forward sweep's dropout zeroes the dropped weights and leaves the kept ones
  // unscaled (Micro::zero_dropped_rows, float32 tiles), 1/(1 - p) then multiplying 1/l once
  // per row: the scale's load, multiply and select a vector, ~2 % of the forward at d = 64 on
  // a Xeon, become one masked store of zeros. Else the weights take 1/(1 - p) themselves
  // (Micro::dropout).
  static constexpr bool kFoldsScale =
      std::is_same_v<F, float> && requires { &Micro::zero_dropped_rows; };

  F scale() const noexcept { return static_cast<F>(p_.scale); }

  // The online-softmax step for row r of the current key tile, already masked (max_ holds its
  // max over the allowed keys): merge the tile's max into the running max m, P = exp(S - m), the
  // running sum, and the factor alpha for o (with the Micro's exp, which update_group uses too: a
  // row takes the same bits through either path).
  void update_row(std::int64_t r) noexcept {
    F* s = s_.get() + r * fused::kKeyTile;
    const F tile_max = max_.get()[r];
    F& m = m_.get()[r];
    const F now = std::max(m, tile_max);
    const F alpha = rescale_factor(m, now, [](F x) { return Micro::exp1(x); });
    m = now;
    // The tile's exponentials are taken against the merged max, so its factor is 1; the
    // running sum lives in kLanes lanes per row (a horizontal sum per row and tile would cost
    // as much as the exp), each lane adding the tile's partial sum.
    F* lsum = lsum_.get() + r * Micro::kLanes;
    if (m == -kInf) {
      std::fill(s, s + fused::kKeyTile, F{0});
    } else if (m == kInf) {
      for (std::int64_t x = 0; x < Micro::kLanes; ++x) lsum[x] *= alpha;
      for (std::int64_t j = 0; j < fused::kKeyTile; ++j) {
        s[j] = s[j] == kInf ? F{1} : F{0};
        lsum[0] += s[j];
      }
    } else {
      Micro::exp_accumulate(s, m, alpha, lsum);
    }
    alpha_.get()[r] = alpha;
  }

  // update_row for the rows [r0, r0 + nr) of a tile already masked (max_ holds each row's max
  // over its allowed keys), in one Micro::softmax_rows call: the alphas of 16 rows in one
  // vector exp, the exp's constants loaded once per group, no branches per row. A row whose new
  // max is not finite (a score that overflowed, or no allowed key yet) sends the group through
  // update_row, which has those cases.
  void update_group(std::int64_t r0, std::int64_t nr) noexcept {
    const F* m = m_.get();
    const F* tile_max = max_.get();
    for (std::int64_t r = r0; r < r0 + nr; ++r) {
      if (!std::isfinite(std::max(m[r], tile_max[r]))) {
        for (std::int64_t x = r0; x < r0 + nr; ++x) update_row(x);
        return;
      }
    }
    Micro::softmax_rows(s_.get() + r0 * fused::kKeyTile, nr, tile_max + r0, m_.get() + r0,
                        alpha_.get() + r0, lsum_.get() + r0 * Micro::kLanes);
  }

  // The per-row path for row r of a tile of scale·q·k: softcap and ALiBi (when the call has
  // them), then, unless the tile is fully allowed, the mask (a tile that the causal/window
  // boundary crosses, that has an explicit mask, or that is the short last tile); returns the
  // row's max. The forward sweep and the weights sweep both come here, so a score has the same
  // bits in both.
  F finish_scores(const fused::Task& t, std::int64_t r, std::int64_t j0, std::int64_t bk, bool full,
                  F* s) const noexcept {
    const std::int64_t per_head = t.i1 - t.i0;
    const std::int64_t h = t.hk * plan_.g + r / per_head;
    const std::int64_t i = t.i0 + r % per_head;
    if (modified_) {
      const core::ScoreModifiers& mod = p_.modifiers;
      const F slope = mod.alibi_slopes.empty()
                          ? F{0}
                          : static_cast<F>(mod.alibi_slopes[static_cast<std::size_t>(h)]);
      const F max = Micro::modify_scores(s, static_cast<F>(mod.softcap), slope,
                                         i + core::diagonal_offset(p_.shape, p_.masking) - j0);
      if (full) return max;
    }
    fused::mask_row(p_, t.b, h, i, j0, bk, p_.masking.has_structure(), s);
    return Micro::row_max(s);
  }

  // Dropout on the rows [r0, r0 + nr) of the tile at key j0, after their exponentials entered
  // the running sums (l is the softmax's, before dropout) and before P·V: dropped weights 0,
  // kept ones times 1/(1 - p) (or left as they are when kFoldsScale), drawn for (b, h, i, j)
  // whatever the tile plan (core/dropout.h). All 64 columns: those past the tile's keys are
  // never read.
  void drop_rows(const fused::Task& t, std::int64_t r0, std::int64_t nr,
                 std::int64_t j0) noexcept {
    const std::int64_t per_head = t.i1 - t.i0;
    const auto head_word = [&](std::int64_t r) {
      return core::dropout_head_word(p_.dropout, t.b, t.hk * plan_.g + r / per_head);
    };
    // The group's float32 rows in one call where the micro-kernel has it: it sets up the
    // draws once for the group and runs dropout_hwy::kDropRows rows' Philox chains side by
    // side (dropout_hwy::rows64), and leaves the scale to the output (kFoldsScale).
    if constexpr (kFoldsScale) {
      static_assert(fused::kKeyTile == core::kDropoutKeys);
      std::uint32_t words[static_cast<std::size_t>(kGroupRows)];
      std::int64_t rows[static_cast<std::size_t>(kGroupRows)];
      // Row r0 + u's head and row, stepped from r0's: one division a group, not one a row (a
      // profile on a Xeon put ~2 % of the forward's samples after a row's 64-bit idiv; no
      // timing separated that from the host's noise).
      std::int64_t head = r0 / per_head, row = r0 % per_head;
      for (std::int64_t u = 0; u < nr; ++u) {
        words[u] = core::dropout_head_word(p_.dropout, t.b, t.hk * plan_.g + head);
        rows[u] = t.i0 + row;
        if (++row == per_head) {
          row = 0;
          ++head;
        }
      }
      Micro::zero_dropped_rows(p_.dropout, nr, words, rows, j0,
                               s_.get() + r0 * fused::kKeyTile, fused::kKeyTile);
    } else {
      for (std::int64_t r = r0; r < r0 + nr; ++r) {
        Micro::dropout(p_.dropout, head_word(r), t.i0 + r % per_head, j0, fused::kKeyTile,
                       s_.get() + r * fused::kKeyTile);
      }
    }
  }

  // The attention weights, recomputed tile by tile from the final (m, l) of each row, with
  // the same score arithmetic as the forward sweep.
  void write_weights(const fused::Task& t, const core::KeyRange& range,
                     const HeadPack<T>& kv) noexcept {
    const core::AttentionShape& sh = p_.shape;
    const std::int64_t per_head = t.i1 - t.i0;
    const std::int64_t rows = plan_.g * per_head;
    const std::int64_t tile_begin = range.first / fused::kKeyTile;
    const std::int64_t tile_end = (range.last + fused::kKeyTile - 1) / fused::kKeyTile;
    const std::int64_t key_begin = std::min(sh.nk, tile_begin * fused::kKeyTile);
    const std::int64_t key_end = std::min(sh.nk, tile_end * fused::kKeyTile);
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t h = t.hk * plan_.g + r / per_head;
      const std::int64_t i = t.i0 + r % per_head;
      fused::store_zeros(p_.weights, t.b, h, i, 0, key_begin);
      fused::store_zeros(p_.weights, t.b, h, i, key_end, sh.nk - key_end);
    }
    for (std::int64_t kt = tile_begin; kt < tile_end; ++kt) {
      const std::int64_t j0 = kt * fused::kKeyTile;
      const std::int64_t bk = std::min(fused::kKeyTile, sh.nk - j0);
      Micro::scores(q_rows_, rows, sh.d, kv.kt + kt * Tiles::kt_tile(sh.d), bk, scale(), s_.get(),
                    max_.get());
      const bool full = bk == fused::kKeyTile && p_.masking.mask == nullptr &&
                        fused::tile_fully_allowed(p_.masking, sh, t.i0, t.i1, j0, j0 + bk);
      for (std::int64_t r = 0; r < rows; ++r) {
        F* s = s_.get() + r * fused::kKeyTile;
        if (!full || modified_) finish_scores(t, r, j0, bk, full, s);
        const BasicSoftmaxState<F> st{m_.get()[r], sum_.get()[r]};
        const F inv_sum = inverse_sum(st);
        if (st.max == -kInf) {
          std::fill(s, s + fused::kKeyTile, F{0});
        } else if (st.max == kInf) {
          for (std::int64_t j = 0; j < fused::kKeyTile; ++j) {
            s[j] = s[j] == kInf ? inv_sum : F{0};
          }
        } else {
          Micro::exp_scale(s, st.max, inv_sum);
        }
        const std::int64_t h = t.hk * plan_.g + r / per_head;
        const std::int64_t i = t.i0 + r % per_head;
        if (p_.dropout.active()) {
          Micro::dropout(p_.dropout, core::dropout_head_word(p_.dropout, t.b, h), i, j0,
                         fused::kKeyTile, s);
        }
        fused::store_row(p_.weights, t.b, h, i, j0, s, bk, F{1});
      }
    }
  }

  const core::AttentionParams& p_;
  const fused::Plan& plan_;
  std::int64_t dvp_;
  std::int64_t q_stride_;  // elements from one Q row to the next in q_
  bool q_in_place_;
  bool modified_;              // softcap or ALiBi: every tile takes the per-row path
  const T* q_rows_ = nullptr;  // the task's Q rows, q_stride_ apart: in place or q_
  // Per row: the tile's max (max_), the running max (m_), the factor for o (alpha_), the
  // running sum in kLanes lanes (lsum_) and its final total (sum_).
  decltype(Tiles::make(0)) q_;
  fused::BufferOf<F> s_, o_, alpha_, max_, m_, sum_, lsum_;
  // Held while the worker lives, on its thread (AmxMicro: the tile configuration).
  typename Micro::Session session_;
};

// Whether `count` elements of `op` from `at`, `step` apart, hold a NaN, an infinity or (but
// for float16, whose finite values are all smaller) a magnitude of 2^32 or more: the question
// validation's scan asks of K and V (core/validate.cc), asked of the rows the kernel has just
// packed, while they are in cache. With the sign bit cleared IEEE values order as their bits
// do, so one compare per element answers it (and the unit-stride loops vectorise).
template <class Bits, class Stored>
inline bool any_large_bits(const Stored* x, std::int64_t count, std::int64_t step,
                           Bits large) noexcept {
  static_assert(sizeof(Bits) == sizeof(Stored));
  constexpr Bits kMagnitude = std::numeric_limits<Bits>::max();
  Bits found = 0;
  if (step == 1) {
    for (std::int64_t i = 0; i < count; ++i) {
      found |= static_cast<Bits>((std::bit_cast<Bits>(x[i]) & kMagnitude) >= large);
    }
  } else {
    for (std::int64_t i = 0; i < count; ++i) {
      found |= static_cast<Bits>((std::bit_cast<Bits>(x[i * step]) & kMagnitude) >= large);
    }
  }
  return found != 0;
}

inline bool any_large_input(const core::InputOperand& op, std::int64_t at, std::int64_t count,
                            std::int64_t step) noexcept {
  switch (op.dtype) {
    case DType::kF32:
      return any_large_bits<std::int32_t>(static_cast<const float*>(op.data) + at, count, step,
                                          std::int32_t{0x4f800000});
    case DType::kF64:
      return any_large_bits<std::int64_t>(static_cast<const double*>(op.data) + at, count, step,
                                          std::int64_t{0x41f0000000000000});
    case DType::kBF16:
      return any_large_bits<std::int16_t>(static_cast<const std::int16_t*>(op.data) + at, count,
                                          step, std::int16_t{0x4f80});
    case DType::kF16:
      return any_large_bits<std::int16_t>(static_cast<const std::int16_t*>(op.data) + at, count,
                                          step, std::int16_t{0x7c00});
    default:
      return true;  // not a type K or V can have: let validation's scan say so
  }
}

// Rows [row0, row0 + rows) of head h of batch b of `op`, `cols` wide: any_large_input.
inline bool any_large_rows(const core::InputOperand& op, std::int64_t b, std::int64_t h,
                           std::int64_t row0, std::int64_t rows, std::int64_t cols) noexcept {
  const core::Strides4& st = op.strides;
  if (st.col == 1 && st.row == cols) {
    return any_large_input(op, st.at(b, h, row0, 0), rows * cols, 1);
  }
  bool large = false;
  for (std::int64_t r = row0; r < row0 + rows; ++r) {
    large |= any_large_input(op, st.at(b, h, r, 0), cols, st.col);
  }
  return large;
}

// Runs the fused forward pass on min(p.threads, tasks) threads (fewer only when the system
// refuses to create them; the bits are the same). The (b, kv head) pairs
// are packed in chunks: all of them at once when their K^T (and V, when it cannot be read in
// place) fit in kPackBudgetFloats, else one per chunk in two alternating slots. For each chunk,
// every worker packs its share of the tiles, all meet at a barrier, then they take the chunk's
// (query tile, head) tasks from a shared counter in the order below. With one chunk there is one
// barrier per call; with two slots a worker that ran out of tasks packs the next chunk while
// the others finish, and the slot it overwrites belonged to the chunk before, all of whose
// tasks were finished before the previous barrier opened. Memory: at most kPackBudgetFloats of
// packed operands (32 MiB), plus a few tiles per worker; nothing n x n.
template <class Micro, class Tiles = fused::F32Tiles>
core::KernelStatus run_fused(const core::AttentionParams& p) noexcept {
  using T = typename Tiles::T;
  const core::AttentionShape& sh = p.shape;
  const fused::Plan plan = fused::make_plan(sh, p.threads);
  if (plan.tasks == 0) return core::KernelStatus::kOk;
  const std::int64_t heads = sh.b * sh.hkv;
  const std::int64_t key_tiles = (sh.nk + fused::kKeyTile - 1) / fused::kKeyTile;
  const std::int64_t dvp = fused::round_up(sh.dv, Micro::kLanes);
  // V is read in place only when its rows are dense: rows a wider matrix apart (heads as
  // column blocks, ldv = H·dv) fall into a few L1 sets (at 2 KiB apart, 64 rows share 8 of the
  // 64 sets) and measured 18 % slower at n = 2048, H = 8, d = 64 than a packed copy.
  const bool v_in_place = Tiles::kReadsInPlace && p.v.dtype == Tiles::kInPlaceDType &&
                          p.v.strides.col == 1 && p.v.strides.row == sh.dv &&
                          sh.dv % Micro::kLanes == 0 && !core::operand_rounds(p.v, p.compute);
  const std::int64_t kt_elements = key_tiles * Tiles::kt_tile(sh.d);
  const std::int64_t v_elements = v_in_place ? 0 : key_tiles * fused::kKeyTile * dvp;
  const std::int64_t head_elements = kt_elements + v_elements;
  const bool all_at_once =
      heads * head_elements * static_cast<std::int64_t>(sizeof(T)) <= fused::kPackBudgetFloats * 4;
  const std::int64_t chunk = all_at_once ? heads : 1;
  const std::int64_t chunks = heads / chunk;
  decltype(Tiles::make(0)) slots[2];
  // Packing writes every element of the K^T tiles (the short last one zero-filled first);
  // a packed V leaves its padding columns and rows unwritten (unless Tiles::kWritesPadding),
  // and they must read as zeros. A V without padding (dv a whole number of vectors, nk a whole
  // number of key tiles) is written whole: no zeroing. Zeroing the K^T alone was 2 % of a
  // causal n = 512, d = 128, H = 8 call (perf); zeroing K^T and a strided V (transformers'
  // heads, B 32, N 128, H 12, d 32: 12 MB) was a memset of every call.
  const bool v_has_padding = dvp != sh.dv || sh.nk % fused::kKeyTile != 0;
  const bool zeroed = !v_in_place && !Tiles::kWritesPadding && v_has_padding;
  // Many small heads (BERT-sized: n <= 512, every head's K^T and V within a private L2 share)
  // are packed by the worker that computes them, into its own slot, and all their query tiles
  // follow at once: no barrier, and the packed tiles are read back from L2 instead of from
  // memory (transformers' MiniLM, B 32, N 128, H 12: the shared packing was 12 MB per call).
  // The packed layout and every task's arithmetic are the same as the shared path's: same bits.
  const bool head_by_worker =
      heads >= 4 * std::min<std::int64_t>(p.threads, plan.tasks) &&
      head_elements * static_cast<std::int64_t>(sizeof(T)) <= fused::kPrivatePackBytes;
  if (!head_by_worker) {
    for (std::int64_t slot = 0; slot < std::min<std::int64_t>(2, chunks); ++slot) {
      slots[slot] = Tiles::make(chunk * head_elements, zeroed);
      if (!slots[slot]) return core::KernelStatus::kOutOfMemory;
    }
  }
  // Task order. Without causal/window every task costs the same: head by head, so that a kv
  // head's K^T and V stay in L2 from one query tile to the next (measured in isolation: 12 %
  // faster than rotating heads at nk = 2048, d = 64). With them, later query tiles see more
  // keys: the heaviest query tiles of every head first, so that the dynamic schedule ends on
  // light tasks (n = 512, causal, 2 threads: 5 % faster than head by head).
  const bool by_query_tile = p.masking.has_structure();
  // The team may be smaller than asked for (threads the system would not create): packing is
  // shared out by the team's real size and the barrier counts its real members.
  const std::int64_t wanted = std::min<std::int64_t>(p.threads, plan.tasks);
  std::atomic<bool> out_of_memory{false};
  try {
    std::vector<std::atomic<std::int64_t>> next(static_cast<std::size_t>(chunks));
    core::run_team(static_cast<int>(wanted), [&](int member, core::Team& team) {
      const std::int64_t w = member;
      const std::int64_t workers = team.size();
      FusedWorker<Micro, Tiles> worker(p, plan);
      decltype(Tiles::make(0)) own_slot;
      if (head_by_worker) own_slot = Tiles::make(head_elements, zeroed);
      if (!worker.ok() || (head_by_worker && !own_slot)) {
        out_of_memory.store(true, std::memory_order_relaxed);
      }
      // Sharing packed tiles, every member learns of a failed allocation at the same barrier,
      // so all leave together. Heads packed by their own worker need no barrier: a member that
      // could not allocate takes no head, the others take them all, and the call reports out of
      // memory. Nor should they wait: inside torch, the first member (torch's thread) would wait
      // here for the second while torch's own OpenMP workers, spinning for their next region,
      // hold the other core (a transformers model's attention took 1.5x its time alone).
      if (!head_by_worker) team.sync();
      if (out_of_memory.load(std::memory_order_relaxed)) return;
      // Key tile t of (b, kv head) g into `head` (the head's packed K^T, then its V).
      const auto pack_tile = [&](T* head, std::int64_t g, std::int64_t t) {
        const std::int64_t j0 = t * fused::kKeyTile;
        const std::int64_t bk = std::min(fused::kKeyTile, sh.nk - j0);
        T* tile = head + t * Tiles::kt_tile(sh.d);
        if (bk < fused::kKeyTile) std::fill(tile, tile + Tiles::kt_tile(sh.d), T{0});
        Tiles::pack_kt(p.k, g / sh.hkv, g % sh.hkv, j0, bk, sh.d, tile, p.compute);
        if (!v_in_place) {
          Tiles::pack_v(p.v, g / sh.hkv, g % sh.hkv, j0, bk, sh.dv, head + kt_elements + j0 * dvp,
                        dvp, p.compute);
        }
        // Validation left K and V to the kernel (AttentionParams::kv_unchecked): every key tile
        // of every kv head is packed exactly once, so asking each tile's rows here, just read,
        // covers all of K and V; a second pass over them cost as much as 8 % of a call
        // (B = 32, H = 12, N = 128, D = 32, perf).
        if (p.kv_unchecked != nullptr &&
            (any_large_rows(p.k, g / sh.hkv, g % sh.hkv, j0, bk, sh.d) ||
             any_large_rows(p.v, g / sh.hkv, g % sh.hkv, j0, bk, sh.dv))) {
          p.kv_unchecked->store(true, std::memory_order_relaxed);
        }
      };
      const auto run_task = [&](const T* head, std::int64_t g, std::int64_t q_tile) {
        HeadPack<T> kv{head, head + kt_elements, dvp};
        if (v_in_place) {
          kv.v = static_cast<const T*>(p.v.data) + p.v.strides.at(g / sh.hkv, g % sh.hkv, 0, 0);
          kv.ldv = p.v.strides.row;
        }
        const fused::Task task = fused::task_at(plan, sh, g, q_tile);
        worker.run(task, kv);
        core::report_rows(p, (task.i1 - task.i0) * sh.group());
      };
      if (head_by_worker) {
        T* head = Tiles::data(own_slot);
        std::atomic<std::int64_t>& counter = next[0];
        for (std::int64_t g = counter.fetch_add(1); g < heads; g = counter.fetch_add(1)) {
          for (std::int64_t t = 0; t < key_tiles; ++t) pack_tile(head, g, t);
          for (std::int64_t q_tile = 0; q_tile < plan.q_tiles; ++q_tile) run_task(head, g, q_tile);
        }
        return;
      }
      for (std::int64_t c = 0; c < chunks; ++c) {
        T* base = Tiles::data(slots[c % 2]);
        for (std::int64_t item = w; item < chunk * key_tiles; item += workers) {
          const std::int64_t g = c * chunk + item / key_tiles;
          pack_tile(base + (g - c * chunk) * head_elements, g, item % key_tiles);
        }
        team.sync();
        std::atomic<std::int64_t>& counter = next[static_cast<std::size_t>(c)];
        const std::int64_t tasks = chunk * plan.q_tiles;
        for (std::int64_t t = counter.fetch_add(1); t < tasks; t = counter.fetch_add(1)) {
          const std::int64_t in_chunk = by_query_tile ? t % chunk : t / plan.q_tiles;
          const std::int64_t q_tile = by_query_tile ? t / chunk : t % plan.q_tiles;
          run_task(base + in_chunk * head_elements, c * chunk + in_chunk, q_tile);
        }
      }
    });
  } catch (const std::bad_alloc&) {
    return core::KernelStatus::kOutOfMemory;
  }
  return out_of_memory ? core::KernelStatus::kOutOfMemory : core::KernelStatus::kOk;
}

#endif  // QKV_KERNELS_FUSED_DRIVER_INL_H_
