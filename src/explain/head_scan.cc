// One head's weights, block of rows by block of rows: per-row statistics and a max-pooled map.
//
// The n x n weights are never held: a block of `block` query rows gets its raw scores
// R = Q_block·K^T from linear() (the layer's GEMM), then each w_ij = exp(scale·r_ij + bias_ij
// - lse_i) with the lse that attention() returned, folded at once into the row's statistics and
// into the pooled cell (max) that (i, j) falls in. Memory: block·nk doubles of scores (about
// 16 MiB) plus the pooled map, whatever n is.
#include <algorithm>
#include <cmath>
#include <limits>

#include "qkv/explain.h"
#include "qkv/layer.h"

namespace qkv {
namespace {

constexpr std::int64_t kScoreBlockElements = std::int64_t{1} << 21;

// bin[j]: the pooled cell that index j of `n` falls in when n is pooled to `cells`.
std::vector<std::int64_t> bins(std::int64_t n, std::int64_t cells) {
  std::vector<std::int64_t> bin(static_cast<std::size_t>(n));
  for (std::int64_t j = 0; j < n; ++j) bin[static_cast<std::size_t>(j)] = j * cells / n;
  return bin;
}

}  // namespace

HeadScan scan_head(const Explanation& e, std::int64_t head, std::int64_t max_side) {
  HeadScan s;
  s.head = head;
  s.map_rows = std::min(e.nq, max_side);
  s.map_cols = std::min(e.nk, max_side);
  const auto cells = static_cast<std::size_t>(s.map_rows * s.map_cols);
  s.max_weight.assign(cells, 0.0f);
  s.mean_weight.assign(cells, 0.0f);
  std::vector<double> allowed(cells, 0.0), total(cells, 0.0), cell_weight(cells, 0.0);
  const auto nq = static_cast<std::size_t>(e.nq);
  s.entropy.assign(nq, 0.0);
  s.distance.assign(nq, 0.0);
  s.first_key.assign(nq, 0.0);
  s.max_row_weight.assign(nq, 0.0);
  s.has_keys.assign(nq, false);
  s.allowed_keys.assign(nq, 0);
  if (e.nq == 0 || e.nk == 0) return s;

  const std::vector<std::int64_t> row_bin = bins(e.nq, s.map_rows);
  const std::vector<std::int64_t> col_bin = bins(e.nk, s.map_cols);
  const Matrix& q = e.q[static_cast<std::size_t>(head)];
  const Matrix& k = e.k[static_cast<std::size_t>(e.kv_head_of(head))];
  const std::vector<double>& lse = e.lse[static_cast<std::size_t>(head)];
  // K^T as a view of K with its strides swapped: linear() copies it into the GEMM's layout.
  const TensorView kt{k.values.data(), DType::kF64, {e.d, e.nk}, {1, e.d}, "K^T"};
  const std::int64_t block = std::clamp<std::int64_t>(kScoreBlockElements / e.nk, 1, e.nq);
  const bool masked = e.masked();
  const bool modified = e.softcap > 0 || !e.alibi_slopes.empty();

  for (std::int64_t i0 = 0; i0 < e.nq; i0 += block) {
    const std::int64_t rows = std::min(block, e.nq - i0);
    const TensorView qb{q.row(i0), DType::kF64, {rows, e.d}, {e.d, 1}, "Q"};
    const Tensor raw = linear(qb, kt, std::nullopt, e.threads);
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t i = i0 + r;
      const auto si = static_cast<std::size_t>(i);
      const double* ri = raw.data_as<double>() + r * e.nk;
      const double lse_i = lse[si];
      const std::size_t cell_row = static_cast<std::size_t>(row_bin[si] * s.map_cols);
      const double diag = static_cast<double>(i + e.nk - e.nq);
      // Entropy without a log per key: -Σ w·ln w = -Σ w·(s - lse) = lse·Σ w - Σ w·s, where
      // Σ w = 1 but for a sink's share.
      double weighted_score = 0.0, weight_sum = 0.0, distance = 0.0, top = 0.0;
      std::int64_t allowed_in_row = 0;
      for (std::int64_t j = 0; j < e.nk; ++j) {
        const auto sj = static_cast<std::size_t>(j);
        const std::size_t cell = cell_row + static_cast<std::size_t>(col_bin[sj]);
        const double score = modified ? e.score(head, i, j, ri[j])
                                       : e.scale * ri[j] + (masked ? e.bias(head, i, j) : 0.0);
        total[cell] += 1.0;
        if (!std::isfinite(score)) continue;
        allowed[cell] += 1.0;
        ++allowed_in_row;
        if (!std::isfinite(lse_i)) continue;
        const double w = std::exp(score - lse_i);
        if (w > 0.0) weighted_score += w * score;
        weight_sum += w;
        distance += w * std::abs(static_cast<double>(j) - diag);
        top = std::max(top, w);
        cell_weight[cell] += w;
        s.max_weight[cell] = std::max(s.max_weight[cell], static_cast<float>(w));
        if (j == 0) s.first_key[si] = w;
      }
      s.has_keys[si] = std::isfinite(lse_i) && allowed_in_row > 0;
      s.allowed_keys[si] = allowed_in_row;
      // Renormalised to the keys' share (less than 1 with a sink), as walk_through() does:
      // -Σ p·ln p = (-Σ w·ln w) / S + ln S for p = w / S.
      const double raw_entropy = lse_i * weight_sum - weighted_score;
      s.entropy[si] = s.has_keys[si] && weight_sum > 0.0
                          ? std::max(0.0, raw_entropy / weight_sum + std::log(weight_sum))
                          : 0.0;
      // Positions of two different sequences are not comparable: no distance to report.
      s.distance[si] = e.cross_attention ? 0.0 : distance;
      s.max_row_weight[si] = top;
    }
  }
  s.allowed_share.resize(cells);
  s.mean_weight.resize(cells);
  for (std::size_t c = 0; c < cells; ++c) {
    s.allowed_share[c] = total[c] > 0 ? static_cast<float>(allowed[c] / total[c]) : 0.0f;
    s.mean_weight[c] = allowed[c] > 0 ? static_cast<float>(cell_weight[c] / allowed[c]) : 0.0f;
  }

  double counted = 0.0;
  double least = std::numeric_limits<double>::infinity(), most = -least;
  for (std::size_t i = 0; i < nq; ++i) {
    if (!s.has_keys[i]) continue;
    counted += 1.0;
    s.mean_entropy += s.entropy[i];
    s.mean_distance += s.distance[i];
    s.mean_first_key += s.first_key[i];
    s.mean_max_weight += s.max_row_weight[i];
    if (s.entropy[i] < least) {
      least = s.entropy[i];
      s.most_focused = static_cast<std::int64_t>(i);
    }
    if (s.entropy[i] > most) {
      most = s.entropy[i];
      s.least_focused = static_cast<std::int64_t>(i);
    }
  }
  if (counted > 0) {
    s.mean_entropy /= counted;
    s.mean_distance /= counted;
    s.mean_first_key /= counted;
    s.mean_max_weight /= counted;
  }
  return s;
}

std::vector<std::int64_t> interesting_rows(const Explanation& e,
                                           const std::vector<HeadScan>& scans) {
  std::vector<std::int64_t> rows;
  if (e.nq <= 4) {
    for (std::int64_t i = 0; i < e.nq; ++i) rows.push_back(i);
    return rows;
  }
  // The rows of least and most entropy averaged over the heads.
  std::vector<double> entropy(static_cast<std::size_t>(e.nq), 0.0);
  std::vector<std::int64_t> keys(static_cast<std::size_t>(e.nq), 0);
  for (const HeadScan& s : scans) {
    for (std::size_t i = 0; i < entropy.size(); ++i) {
      entropy[i] += s.entropy[i];
      keys[i] = std::max(keys[i], s.has_keys[i] ? s.allowed_keys[i] : 0);
    }
  }
  const bool some_have_several =
      std::any_of(keys.begin(), keys.end(), [](std::int64_t n) { return n > 1; });
  std::vector<bool> any(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) any[i] = keys[i] > (some_have_several ? 1 : 0);
  std::int64_t most = -1, least = -1;
  for (std::size_t i = 0; i < entropy.size(); ++i) {
    if (!any[i]) continue;
    const auto si = static_cast<std::int64_t>(i);
    if (most < 0 || entropy[i] < entropy[static_cast<std::size_t>(most)]) most = si;
    if (least < 0 || entropy[i] > entropy[static_cast<std::size_t>(least)]) least = si;
  }
  if (most < 0) return {0};
  rows.push_back(most);
  if (least != most) rows.push_back(least);
  std::sort(rows.begin(), rows.end());
  return rows;
}

}  // namespace qkv
