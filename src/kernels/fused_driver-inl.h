// The loop nest of the fused forward kernels, shared by the scalar twin and every SIMD target.
// Included inside the namespace of its includer, after kernels/fused_common.h and <atomic>;
// Highway's per-target re-inclusion is why it has a toggling guard instead of #pragma once.
//
// Fused attention forward, FlashAttention-2 style, for one AttentionParams:
//
//   shapes   Q [b, h, nq, d], K [b, hkv, nk, d], V [b, hkv, nk, dv], O [b, h, nq, dv];
//            query head h reads kv head h / g, g = h / hkv.
//   tasks    (b, kv head, query tile): bq rows of each of the g query heads that share the kv
//            head (g·bq ≈ 64 rows), so every K/V tile is packed once for all of them. Tasks own
//            disjoint output rows, threads take them from an atomic counter, heaviest first:
//            any thread count and any schedule give the same bits.
//   per task Q tile packed to float32 [rows x d]; per row a softmax state (max m, sum l) and
//            an accumulator o [dv] (padded to the vector width, dvp), all zero / -inf.
//            for each key tile [j0, j0 + 64) inside the union of the rows' causal/window ranges
//            (tiles outside it are never touched):
//              pack K^T [d x 64] and V [64 x dvp] as float32         (read once per task)
//              S = Q · K^T                      micro-kernel, rows x 64, over any d
//              per row: S *= scale (+ mask, -inf where forbidden: only on tiles that the
//                       causal/window boundary crosses, or with an explicit mask)
//                       m' = max(m, max_j S_j);  P_j = exp(S_j - m');  l_t = sum_j P_j
//                       (m, l) := merge((m, l), (m', l_t)) -> alpha = exp(m - m')
//              o := alpha · o + P · V           micro-kernel, rows x dvp, the rescale fused in
//            O = o / l, lse = m + log l; a row with no allowed key stays m = -inf, l = 0, o = 0
//            and is written as zeros with lse = -inf.
//   weights  (when asked for) a second sweep over the same key tiles recomputes S exactly as
//            above and writes exp(S - m) / l tile by tile: no n x n workspace. The final (m, l)
//            pair is the log-sum-exp in split form; exp(S - m) / l is used rather than
//            exp(S - lse) because lse = m + log l rounds away the low bits of log l when |m| is
//            large, which would cost relative accuracy on huge logits.
//
// Invariant after each key tile: for every row, m is the max of the scores seen, l = sum
// exp(S_j - m) over them and o = sum exp(S_j - m) v_j, so the final division is the softmax.
// Each tile's sum l_t is formed over its 64 keys before it enters l (a long row summed one
// element at a time loses accuracy at nk = 65536).
//
// Memory: per worker the Q, S and o tiles and one K/V tile, about 64 (d + dv + 64) + 64 (d + dv)
// floats; nothing grows with nk. Traffic: each K/V element is read once per query task
// (nq / bq times per kv head), each Q and O element once.
//
// The policy `Micro` supplies the inner loops (all on 64-key rows of S):
//   kLanes; scores(q, rows, d, kt, s); scale_max(s, scale) -> max; row_max(s) -> max;
//   exp_sum(s, m) -> sum (s := exp(s - m)); exp_scale(s, m, f) (s := exp(s - m) · f);
//   accumulate_pv(p, rows, bk, v, dvp, alpha, o).

#if defined(QKV_KERNELS_FUSED_DRIVER_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_KERNELS_FUSED_DRIVER_INL_H_
#undef QKV_KERNELS_FUSED_DRIVER_INL_H_
#else
#define QKV_KERNELS_FUSED_DRIVER_INL_H_
#endif

template <class Micro>
class FusedWorker {
 public:
  FusedWorker(const core::AttentionParams& p, const fused::Plan& plan)
      : p_(p),
        plan_(plan),
        dvp_(fused::round_up(p.shape.dv, Micro::kLanes)),
        q_(fused::make_buffer(plan.max_rows * p.shape.d)),
        kt_(fused::make_buffer(p.shape.d * fused::kKeyTile)),
        v_(fused::make_buffer(fused::kKeyTile * dvp_)),
        s_(fused::make_buffer(plan.max_rows * fused::kKeyTile)),
        o_(fused::make_buffer(plan.max_rows * dvp_)),
        alpha_(fused::make_buffer(plan.max_rows)),
        state_(static_cast<std::size_t>(plan.max_rows)) {}

  bool ok() const noexcept { return q_ && kt_ && v_ && s_ && o_ && alpha_; }

  void run(const fused::Task& t) noexcept {
    const core::AttentionShape& sh = p_.shape;
    const std::int64_t per_head = t.i1 - t.i0;
    const std::int64_t rows = plan_.g * per_head;
    for (std::int64_t gh = 0; gh < plan_.g; ++gh) {
      fused::pack_rows(p_.q, t.b, t.hk * plan_.g + gh, t.i0, per_head, sh.d,
                       q_.get() + gh * per_head * sh.d, sh.d);
    }
    std::fill(o_.get(), o_.get() + rows * dvp_, 0.0f);
    std::fill(state_.begin(), state_.end(), SoftmaxState{});

    const core::KeyRange range = fused::task_key_range(p_.masking, sh, t.i0, t.i1);
    for (std::int64_t j0 = range.first; j0 < range.last; j0 += fused::kKeyTile) {
      const std::int64_t bk = std::min(fused::kKeyTile, range.last - j0);
      load_key_tile(t, j0, bk);
      fused::pack_rows(p_.v, t.b, t.hk, j0, bk, sh.dv, v_.get(), dvp_);
      for (std::int64_t r = 0; r < rows; ++r) {
        float* s = s_.get() + r * fused::kKeyTile;
        const float tile_max = prepared_max(t, r, per_head, j0, bk, s);
        const float m = std::max(state_[static_cast<std::size_t>(r)].max, tile_max);
        float tile_sum = 0.0f;
        if (m == -fused::kInfF) {
          std::fill(s, s + fused::kKeyTile, 0.0f);
        } else if (m == fused::kInfF) {
          for (std::int64_t j = 0; j < fused::kKeyTile; ++j) {
            s[j] = s[j] == fused::kInfF ? 1.0f : 0.0f;
            tile_sum += s[j];
          }
        } else {
          tile_sum = Micro::exp_sum(s, m);
        }
        alpha_.get()[r] = merge(state_[static_cast<std::size_t>(r)], SoftmaxState{m, tile_sum}).a;
      }
      Micro::accumulate_pv(s_.get(), rows, bk, v_.get(), dvp_, alpha_.get(), o_.get());
    }

    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t h = t.hk * plan_.g + r / per_head;
      const std::int64_t i = t.i0 + r % per_head;
      const Finished f = finish(state_[static_cast<std::size_t>(r)]);
      fused::store_row(p_.out, t.b, h, i, 0, o_.get() + r * dvp_, sh.dv, f.inv_sum);
      if (p_.lse.data != nullptr) {
        core::store_real(p_.lse.data, p_.lse.dtype, p_.lse.strides.at(t.b, h, i, 0), f.lse);
      }
    }
    if (p_.weights.data != nullptr) write_weights(t, range);
  }

 private:
  // Packs K^T for keys [j0, j0 + bk) and computes the raw score tile S = Q · K^T.
  void load_key_tile(const fused::Task& t, std::int64_t j0, std::int64_t bk) noexcept {
    const core::AttentionShape& sh = p_.shape;
    if (bk < fused::kKeyTile) {
      std::fill(kt_.get(), kt_.get() + sh.d * fused::kKeyTile, 0.0f);
    }
    fused::pack_transposed(p_.k, t.b, t.hk, j0, bk, sh.d, kt_.get(), fused::kKeyTile);
    Micro::scores(q_.get(), plan_.g * (t.i1 - t.i0), sh.d, kt_.get(), s_.get());
  }

  // Turns row r of the raw score tile into scaled, masked scores and returns their max. Tiles
  // wholly inside every row's causal/window range and without an explicit mask take the
  // vector path with no per-element checks.
  float prepared_max(const fused::Task& t, std::int64_t r, std::int64_t per_head,
                     std::int64_t j0, std::int64_t bk, float* s) const noexcept {
    const float scale = static_cast<float>(p_.scale);
    const bool full = bk == fused::kKeyTile &&
                      fused::tile_fully_allowed(p_.masking, p_.shape, t.i0, t.i1, j0, j0 + bk);
    if (full && p_.masking.mask == nullptr) return Micro::scale_max(s, scale);
    const std::int64_t h = t.hk * plan_.g + r / per_head;
    const std::int64_t i = t.i0 + r % per_head;
    fused::scale_and_mask_row(p_, t.b, h, i, j0, bk, scale, !full, s);
    return Micro::row_max(s);
  }

  // The attention weights, recomputed tile by tile from the final (m, l) of each row.
  void write_weights(const fused::Task& t, const core::KeyRange& range) noexcept {
    const core::AttentionShape& sh = p_.shape;
    const std::int64_t per_head = t.i1 - t.i0;
    const std::int64_t rows = plan_.g * per_head;
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t h = t.hk * plan_.g + r / per_head;
      const std::int64_t i = t.i0 + r % per_head;
      fused::store_zeros(p_.weights, t.b, h, i, 0, range.first);
      fused::store_zeros(p_.weights, t.b, h, i, range.last, sh.nk - range.last);
    }
    for (std::int64_t j0 = range.first; j0 < range.last; j0 += fused::kKeyTile) {
      const std::int64_t bk = std::min(fused::kKeyTile, range.last - j0);
      load_key_tile(t, j0, bk);
      for (std::int64_t r = 0; r < rows; ++r) {
        float* s = s_.get() + r * fused::kKeyTile;
        prepared_max(t, r, per_head, j0, bk, s);
        const SoftmaxState& st = state_[static_cast<std::size_t>(r)];
        const Finished f = finish(st);
        if (st.max == -fused::kInfF) {
          std::fill(s, s + fused::kKeyTile, 0.0f);
        } else if (st.max == fused::kInfF) {
          for (std::int64_t j = 0; j < fused::kKeyTile; ++j) {
            s[j] = s[j] == fused::kInfF ? f.inv_sum : 0.0f;
          }
        } else {
          Micro::exp_scale(s, st.max, f.inv_sum);
        }
        const std::int64_t h = t.hk * plan_.g + r / per_head;
        const std::int64_t i = t.i0 + r % per_head;
        fused::store_row(p_.weights, t.b, h, i, j0, s, bk, 1.0f);
      }
    }
  }

  const core::AttentionParams& p_;
  const fused::Plan& plan_;
  std::int64_t dvp_;
  fused::Buffer q_, kt_, v_, s_, o_, alpha_;
  std::vector<SoftmaxState> state_;
};

// Runs the fused forward pass for all tasks on exactly p.threads threads.
template <class Micro>
void run_fused(const core::AttentionParams& p) noexcept {
  const fused::Plan plan = fused::make_plan(p.shape);
  if (plan.tasks == 0) return;
  const std::int64_t workers = std::min<std::int64_t>(p.threads, plan.tasks);
  std::atomic<std::int64_t> next{0};
  core::parallel_for(workers, static_cast<int>(workers), [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t w = begin; w < end; ++w) {
      FusedWorker<Micro> worker(p, plan);
      if (!worker.ok()) std::abort();  // out of memory for a few tiles: nothing sane to do
      for (std::int64_t t = next.fetch_add(1); t < plan.tasks; t = next.fetch_add(1)) {
        worker.run(fused::task_at(plan, p.shape, t));
      }
    }
  });
}

#endif  // QKV_KERNELS_FUSED_DRIVER_INL_H_
