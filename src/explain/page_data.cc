// The explain page's data block, chosen by a byte budget so that any input makes a page a browser
// opens at once (the n = 8192, H = 4, d = 64 layer page must stay under 12 MB).
//
// Rows are embedded in one of three forms, the most exact that fits what is left of the budget:
//   exact, float64   Q, K, V, O, the lse (and the mask, the samples x): the page recomputes any
//                    row or zoomed block, and a clicked row equals the reference kernel's weights
//   exact, float32   the same arrays rounded to 7 digits (the lse stays float64)
//   sampled          walk-throughs made here with walk_through() for a set of rows per head (the
//                    most and least focused, the opened row, an even spread): each row's counts,
//                    entropy, lse, heaviest allowed keys with their weights and values (what the
//                    stacked sum O_i = Σ w_ij·v_j needs); `qkv explain --row i` gives any other row
// The pooled overview maps go as float32 unless that would cost some part its exact float64 rows,
// else as 8-bit log-quantised weights (1e-6..1 in 254 steps, each a factor of 10^(6/254) ≈ 1.056;
// 0 stays 0).
#include "explain/page_data.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "explain/page_json.h"

namespace qkv::explain_detail {
namespace {

// Everything the data block may take; the markup, style and script add about 80 kB (12 MB in all).
constexpr std::int64_t kDataBudget = 11'700'000;
// A sampled walk-through keeps this many of the row's heaviest allowed keys.
constexpr std::int64_t kSampledKeys = 16;
// Rows spread evenly over each head in sampled mode (besides the named ones), unless many batch
// elements share the budget: then fewer, down to kLeastSpreadRows.
constexpr std::int64_t kSpreadRows = 48;
constexpr std::int64_t kLeastSpreadRows = 6;
// The key/value table shows at most this many rows and this many columns of each vector.
constexpr std::int64_t kTableRows = 64;
constexpr std::int64_t kTableCols = 16;

enum class Rows { kExactF64, kExactF32, kSampled };

// A head whose mask pattern equals head 0's (the usual case: only a per-head mask differs)
// borrows head 0's allowed-share map instead of carrying its own.
bool shares_allowed(const std::vector<HeadScan>& scans, std::size_t h) {
  return h > 0 && scans[h].allowed_share == scans[0].allowed_share;
}

// Bytes of one part's pooled maps: max and mean (4 bytes a cell, or 1 quantised) and the allowed
// shares (1 byte, unless borrowed).
std::int64_t map_bytes(const std::vector<HeadScan>& scans, bool quantised) {
  std::int64_t bytes = 0;
  for (std::size_t h = 0; h < scans.size(); ++h) {
    const std::int64_t cells = scans[h].map_rows * scans[h].map_cols;
    bytes += base64_size(cells * (quantised ? 1 : 4)) * 2;
    if (!shares_allowed(scans, h)) bytes += base64_size(cells);
  }
  return bytes;
}

// Mask values the page needs to recompute rows (only an explicit mask: the causal and window
// rules are recomputed from their parameters).
std::int64_t mask_values(const Explanation& e) {
  if (e.mask_name.empty()) return 0;
  return (e.mask_varies_by_head ? e.heads : 1) * e.nq * e.nk;
}

std::int64_t exact_bytes(const Explanation& e, std::int64_t bytes_per_value) {
  std::int64_t values =
      e.heads * e.nq * (e.d + e.dv) + e.kv_heads * e.nk * (e.d + e.dv) + mask_values(e);
  if (e.projection) values += e.projection->x.rows * e.projection->x.cols;
  return base64_size(values * bytes_per_value) + base64_size(e.heads * e.nq * 8);
}

std::int64_t sampled_bytes(const Explanation& e, std::int64_t spread) {
  const std::int64_t dx = e.projection ? e.projection->x.cols : 0;
  const std::int64_t per_row =
      base64_size((e.d + dx + 2 * e.dv + kSampledKeys * e.dv) * 4) + kSampledKeys * 70 + 200;
  return e.heads * (spread + 3) * per_row;  // + the most, least and opening rows
}

// What a part carries whatever its rows' form: its labels (each quoted, with a comma) and the
// key/value table.
std::int64_t fixed_bytes(const Explanation& e) {
  std::int64_t bytes = 4096;  // the facts, the story's first lines, the scans' statistics
  for (const auto* labels : {&e.query_labels, &e.key_labels, &e.d_labels, &e.dv_labels,
                             &e.sample_labels, &e.memory_labels}) {
    for (const std::string& label : *labels) bytes += static_cast<std::int64_t>(label.size()) + 3;
  }
  bytes += static_cast<std::int64_t>(e.story.size());
  if (e.projection) {
    const std::int64_t rows = std::min(e.nk, kTableRows);
    bytes += base64_size(rows * kTableCols * 8) * (1 + 2 * e.kv_heads);
  }
  return bytes;
}

std::string masking_text(const Explanation& e) {
  std::string text;
  const auto add = [&](const std::string& rule) { text += (text.empty() ? "" : " + ") + rule; };
  if (e.causal) add("causal");
  if (e.window)
    add("window " + std::to_string(e.window->left) + "," + std::to_string(e.window->right));
  if (!e.mask_name.empty()) add("mask " + e.mask_name);
  return text;
}

// 0 for 0, else 1..255 over log10(w) in [-6, 0].
unsigned char log8(float w) {
  if (!(w > 0.0f)) return 0;
  const double t = (std::log10(static_cast<double>(w)) + 6.0) / 6.0;
  return static_cast<unsigned char>(1 + std::lround(std::clamp(t, 0.0, 1.0) * 254.0));
}

std::string map_b64(const std::vector<float>& map, bool quantised) {
  if (!quantised) return base64(map.data(), map.size() * sizeof(float));
  std::vector<unsigned char> bytes(map.size());
  for (std::size_t c = 0; c < map.size(); ++c) bytes[c] = log8(map[c]);
  return base64(bytes.data(), bytes.size());
}

// The row a head opens on: the most focused among rows with more than one allowed key (a row
// with one key is trivially focused: causal row 0), else scan_head()'s most focused.
std::int64_t opening_row(const HeadScan& s) {
  std::int64_t best = -1;
  for (std::size_t i = 0; i < s.entropy.size(); ++i) {
    if (s.allowed_keys.size() > i && s.allowed_keys[i] > 1 &&
        (best < 0 || s.entropy[i] < s.entropy[static_cast<std::size_t>(best)])) {
      best = static_cast<std::int64_t>(i);
    }
  }
  return best < 0 ? s.most_focused : best;
}

std::string scan_json(const HeadScan& s, bool quantised, bool borrow_allowed) {
  std::vector<unsigned char> allowed(s.allowed_share.size());
  for (std::size_t c = 0; c < allowed.size(); ++c) {
    allowed[c] = static_cast<unsigned char>(std::lround(s.allowed_share[c] * 255.0f));
  }
  const std::string allowed_json =
      borrow_allowed ? std::string("\"allowedFrom\":0")
                     : "\"allowed\":\"" + base64(allowed.data(), allowed.size()) + "\"";
  // Until mean pooling is computed, the mean map is the max map (the page says which it shows).
  const bool has_mean = s.mean_weight.size() == s.max_weight.size() && !s.mean_weight.empty();
  return "{\"mapRows\":" + json_int(s.map_rows) + ",\"mapCols\":" + json_int(s.map_cols) +
         ",\"max\":\"" + map_b64(s.max_weight, quantised) + "\",\"mean\":" +
         (has_mean ? "\"" + map_b64(s.mean_weight, quantised) + "\"" : std::string("null")) + "," +
         allowed_json + ",\"meanEntropy\":" + json_number(s.mean_entropy) +
         ",\"meanDistance\":" + json_number(s.mean_distance) +
         ",\"meanFirstKey\":" + json_number(s.mean_first_key) +
         ",\"meanMaxWeight\":" + json_number(s.mean_max_weight) +
         ",\"mostFocused\":" + json_int(s.most_focused) +
         ",\"leastFocused\":" + json_int(s.least_focused) +
         ",\"openRow\":" + json_int(opening_row(s)) + ",\"noKeyRows\":" +
         json_int(std::count(s.has_keys.begin(), s.has_keys.end(), false)) + "}";
}

template <typename Each>
std::string json_list(std::size_t count, Each each) {
  std::string out = "[";
  for (std::size_t i = 0; i < count; ++i) out += (i ? "," : "") + each(i);
  return out + "]";
}

std::string quoted(const std::string& text) { return "\"" + text + "\""; }

// The first `rows` x `cols` block of a matrix, row-major, as float64 base64.
std::string block_b64(const Matrix& m, std::int64_t rows, std::int64_t cols) {
  std::vector<double> block;
  for (std::int64_t i = 0; i < rows; ++i) {
    for (std::int64_t c = 0; c < cols; ++c) block.push_back(m.at(i, c));
  }
  return quoted(b64_f64(block));
}

// Layer form: the key/value-side rows m_j beside k_j = m_j·W^K and v_j = m_j·W^V.
std::string kv_rows_json(const Explanation& e) {
  const ExplainProjection& p = *e.projection;
  const std::int64_t rows = std::min(e.nk, kTableRows);
  const std::int64_t dm = std::min(p.memory.cols, kTableCols), d = std::min(e.d, kTableCols),
                     dv = std::min(e.dv, kTableCols);
  const auto kv = static_cast<std::size_t>(e.kv_heads);
  return "{\"rows\":" + json_int(rows) + ",\"dm\":" + json_int(dm) +
         ",\"dmAll\":" + json_int(p.memory.cols) + ",\"d\":" + json_int(d) +
         ",\"dv\":" + json_int(dv) + ",\"memoryName\":" + json_string(p.memory_name) +
         ",\"m\":" + block_b64(p.memory, rows, dm) +
         ",\"k\":" + json_list(kv, [&](std::size_t h) { return block_b64(e.k[h], rows, d); }) +
         ",\"v\":" + json_list(kv, [&](std::size_t h) { return block_b64(e.v[h], rows, dv); }) +
         "}";
}

// The rows a sampled head carries: the named ones and an even spread.
std::vector<std::int64_t> sampled_rows(const Explanation& e, const HeadScan& s,
                                       std::int64_t open_row, std::int64_t spread_rows) {
  if (e.nq == 0) return {};
  std::set<std::int64_t> rows = {s.most_focused, s.least_focused, opening_row(s)};
  if (open_row >= 0 && open_row < e.nq) rows.insert(open_row);
  const std::int64_t spread = std::min(e.nq, spread_rows);
  for (std::int64_t k = 0; k < spread; ++k) {
    rows.insert(spread > 1 ? (k * (e.nq - 1) + (spread - 1) / 2) / (spread - 1) : 0);
  }
  return {rows.begin(), rows.end()};
}

std::string sampled_row_json(const Explanation& e, std::int64_t head, std::int64_t row) {
  const RowWalkThrough w = walk_through(e, head, row);
  std::vector<std::int64_t> keys;
  for (const std::int64_t j : w.by_weight) {
    if (std::isfinite(w.score[static_cast<std::size_t>(j)])) keys.push_back(j);
    if (static_cast<std::int64_t>(keys.size()) == kSampledKeys) break;
  }
  std::vector<double> weight, raw, score, values;
  double rest = std::isfinite(w.lse) && w.allowed_keys > 0 ? 1.0 - w.sink_share : 0.0;
  const Matrix& v = e.v[static_cast<std::size_t>(e.kv_head_of(head))];
  for (const std::int64_t j : keys) {
    const auto sj = static_cast<std::size_t>(j);
    weight.push_back(w.weight[sj]);
    raw.push_back(w.raw[sj]);
    score.push_back(w.score[sj]);
    rest -= w.weight[sj];
    values.insert(values.end(), v.row(j), v.row(j) + e.dv);
  }
  double diff = 0.0;
  for (std::size_t c = 0; c < w.out.size(); ++c) {
    diff = std::max(diff, std::abs(w.out[c] - w.weighted_sum[c]));
  }
  std::string j = "{\"row\":" + json_int(row) + ",\"allowed\":" + json_int(w.allowed_keys) +
                  ",\"entropy\":" + json_number(w.entropy) +
                  ",\"effective\":" + json_number(w.effective_keys) +
                  ",\"lse\":" + json_number(w.lse) + ",\"sink\":" + json_number(w.sink_share) +
                  ",\"rest\":" + json_number(std::max(rest, 0.0)) +
                  ",\"diff\":" + json_number(diff) + ",\"keys\":[";
  for (std::size_t n = 0; n < keys.size(); ++n) j += (n ? "," : "") + json_int(keys[n]);
  j += "],\"w\":" + json_numbers(weight) + ",\"r\":" + json_numbers(raw) +
       ",\"s\":" + json_numbers(score) + ",\"q\":" + quoted(b64_f32(w.q)) +
       ",\"out\":" + quoted(b64_f32(w.out)) + ",\"v\":" + quoted(b64_f32(values));
  if (!w.x.empty()) j += ",\"x\":" + quoted(b64_f32(w.x));
  return j + "}";
}

std::string rows_json(const Explanation& e, Rows rows, const std::vector<HeadScan>& scans,
                      std::int64_t open_row, std::int64_t spread) {
  const auto heads = static_cast<std::size_t>(e.heads);
  const auto kv = static_cast<std::size_t>(e.kv_heads);
  if (rows == Rows::kSampled) {
    return ",\"rowsMode\":\"sampled\",\"samples\":" + json_list(heads, [&](std::size_t h) {
             const auto head = static_cast<std::int64_t>(h);
             const std::vector<std::int64_t> list = sampled_rows(e, scans[h], open_row, spread);
             return json_list(list.size(),
                              [&](std::size_t n) { return sampled_row_json(e, head, list[n]); });
           });
  }
  const bool f64 = rows == Rows::kExactF64;
  const auto encode = [&](const std::vector<double>& values) {
    return quoted(f64 ? b64_f64(values) : b64_f32(values));
  };
  std::string j =
      ",\"rowsMode\":\"exact\",\"precision\":\"" + std::string(f64 ? "f64" : "f32") + "\"";
  j += ",\"q\":" + json_list(heads, [&](std::size_t h) { return encode(e.q[h].values); });
  j += ",\"k\":" + json_list(kv, [&](std::size_t h) { return encode(e.k[h].values); });
  j += ",\"v\":" + json_list(kv, [&](std::size_t h) { return encode(e.v[h].values); });
  j += ",\"out\":" + json_list(heads, [&](std::size_t h) { return encode(e.out[h].values); });
  j += ",\"lse\":" + json_list(heads, [&](std::size_t h) { return quoted(b64_f64(e.lse[h])); });
  if (!e.mask_name.empty()) {
    const std::int64_t copies = e.mask_varies_by_head ? e.heads : 1;
    j += std::string(",\"maskPerHead\":") + (e.mask_varies_by_head ? "true" : "false");
    j += ",\"maskBias\":" + json_list(static_cast<std::size_t>(copies), [&](std::size_t h) {
           std::vector<double> bias(static_cast<std::size_t>(e.nq * e.nk));
           for (std::int64_t i = 0; i < e.nq; ++i) {
             for (std::int64_t k = 0; k < e.nk; ++k) {
               bias[static_cast<std::size_t>(i * e.nk + k)] =
                   e.bias(static_cast<std::int64_t>(h), i, k);
             }
           }
           return encode(bias);
         });
  }
  if (e.projection) j += ",\"x\":" + encode(e.projection->x.values);
  return j;
}

std::string part_json(const Explanation& e, const std::vector<HeadScan>& scans, Rows rows,
                      bool quantised, std::int64_t open_row, std::int64_t spread) {
  std::string facts = format_overview(e);
  if (!e.title.empty() && facts.rfind(e.title, 0) == 0) facts = facts.substr(e.title.size() + 1);
  std::string j = "{";
  j += "\"title\":" + json_string(e.title.empty() ? "qkv explain" : e.title);
  j += ",\"short\":" + json_string(e.title.substr(0, e.title.find(':')));
  j += ",\"facts\":" + json_string(facts);
  j += ",\"story\":" + json_string(e.story);
  j += ",\"batch\":" + json_int(e.batch) + ",\"batches\":" + json_int(e.batches);
  j += std::string(",\"cross\":") + (e.cross_attention ? "true" : "false");
  j += ",\"nq\":" + json_int(e.nq) + ",\"nk\":" + json_int(e.nk) + ",\"d\":" + json_int(e.d) +
       ",\"dv\":" + json_int(e.dv) + ",\"heads\":" + json_int(e.heads) +
       ",\"kvHeads\":" + json_int(e.kv_heads) + ",\"scale\":" + json_number(e.scale);
  j += std::string(",\"causal\":") + (e.causal ? "true" : "false");
  j += ",\"window\":" +
       (e.window ? "[" + json_int(e.window->left) + "," + json_int(e.window->right) + "]"
                 : std::string("null"));
  j += ",\"softcap\":" + json_number(e.softcap);
  j += ",\"alibi\":" + (e.alibi_slopes.empty() ? "null" : json_numbers(e.alibi_slopes));
  j += ",\"sinks\":" + (e.sinks.empty() ? "null" : json_numbers(e.sinks));
  j += std::string(",\"masked\":") + (e.masked() ? "true" : "false");
  j += ",\"maskText\":" + json_string(masking_text(e));
  // Row numbers are the default labels: lists of them are not embedded.
  const auto labels = [](const std::vector<std::string>& names) {
    for (std::size_t i = 0; i < names.size(); ++i) {
      if (names[i] != std::to_string(i)) return json_strings(names);
    }
    return std::string("null");
  };
  j += ",\"queryLabels\":" + labels(e.query_labels);
  j += ",\"keyLabels\":" + labels(e.key_labels);
  j += ",\"dLabels\":" + json_optional_strings(e.d_labels);
  j += ",\"dvLabels\":" + json_optional_strings(e.dv_labels);
  j += ",\"sampleLabels\":" + json_optional_strings(e.sample_labels);
  j += ",\"memoryLabels\":" + json_optional_strings(e.memory_labels);
  if (e.projection) {
    const ExplainProjection& p = *e.projection;
    j += ",\"projection\":{\"xName\":" + json_string(p.x_name) +
         ",\"memoryName\":" + json_string(p.memory_name) + ",\"dx\":" + json_int(p.x.cols) +
         ",\"dm\":" + json_int(p.memory.cols) + ",\"bias\":" + (p.bq.empty() ? "false" : "true") +
         "}";
    j += ",\"kvRows\":" + kv_rows_json(e);
  }
  j += rows_json(e, rows, scans, open_row, spread);
  j += std::string(",\"mapEncoding\":\"") + (quantised ? "log8" : "f32") + "\"";
  j += ",\"scans\":" + json_list(scans.size(), [&](std::size_t h) {
         return scan_json(scans[h], quantised, shares_allowed(scans, h));
       });
  return j + "}";
}

// The map pooled once more, 2 x 2 cells into one (only along a side of even length, so that
// head_scan.cc's bins still hold: index j is in cell floor(j·cells / n)). Max of maxima; the
// mean weighted by each cell's allowed share (cells differ by at most one index in size, so
// this is the mean over the allowed (i, j) to within that); the mean allowed share.
HeadScan halved(const HeadScan& s) {
  const std::int64_t fr = s.map_rows % 2 == 0 ? 2 : 1, fc = s.map_cols % 2 == 0 ? 2 : 1;
  HeadScan h = s;
  h.map_rows = s.map_rows / fr;
  h.map_cols = s.map_cols / fc;
  const auto cells = static_cast<std::size_t>(h.map_rows * h.map_cols);
  h.max_weight.assign(cells, 0.0f);
  h.allowed_share.assign(cells, 0.0f);
  const bool has_mean = s.mean_weight.size() == s.max_weight.size();
  h.mean_weight.assign(has_mean ? cells : 0, 0.0f);
  for (std::int64_t a = 0; a < h.map_rows; ++a) {
    for (std::int64_t b = 0; b < h.map_cols; ++b) {
      const auto to = static_cast<std::size_t>(a * h.map_cols + b);
      double share = 0.0, mean = 0.0;
      for (std::int64_t y = a * fr; y < (a + 1) * fr; ++y) {
        for (std::int64_t x = b * fc; x < (b + 1) * fc; ++x) {
          const auto from = static_cast<std::size_t>(y * s.map_cols + x);
          h.max_weight[to] = std::max(h.max_weight[to], s.max_weight[from]);
          share += s.allowed_share[from];
          if (has_mean) mean += static_cast<double>(s.mean_weight[from]) * s.allowed_share[from];
        }
      }
      h.allowed_share[to] = static_cast<float>(share / static_cast<double>(fr * fc));
      if (has_mean) h.mean_weight[to] = share > 0 ? static_cast<float>(mean / share) : 0.0f;
    }
  }
  return h;
}

// Which form each part's rows take for a given map encoding: the opened part chooses first
// (several batch elements share the budget), then the others in order; each part's exact form
// replaces its sampled one, so it may use what that would have taken.
std::vector<Rows> plan_rows(const std::vector<Explanation>& parts, const PageView& open,
                            std::int64_t left, std::int64_t spread) {
  for (const Explanation& e : parts) left -= sampled_bytes(e, spread) + fixed_bytes(e);
  std::vector<std::size_t> order;
  if (open.part >= 0 && static_cast<std::size_t>(open.part) < parts.size()) {
    order.push_back(static_cast<std::size_t>(open.part));
  }
  for (std::size_t n = 0; n < parts.size(); ++n) {
    if (order.empty() || n != order.front()) order.push_back(n);
  }
  std::vector<Rows> rows(parts.size(), Rows::kSampled);
  for (const std::size_t n : order) {
    const Explanation& e = parts[n];
    left += sampled_bytes(e, spread);
    if (exact_bytes(e, 8) <= left) {
      rows[n] = Rows::kExactF64;
      left -= exact_bytes(e, 8);
    } else if (exact_bytes(e, 4) <= left) {
      rows[n] = Rows::kExactF32;
      left -= exact_bytes(e, 4);
    } else {
      left -= sampled_bytes(e, spread);
    }
  }
  return rows;
}

}  // namespace

std::string page_data_json(const std::vector<Explanation>& parts,
                           const std::vector<std::vector<HeadScan>>& scans, const PageView& open) {
  // Many batch elements' maps may not fit even quantised beside their sampled rows: then the
  // maps are pooled further and fewer rows are sampled.
  std::vector<std::vector<HeadScan>> pooled;
  const std::vector<std::vector<HeadScan>>* maps_of = &scans;
  const auto maps = [&](bool quantised) {
    std::int64_t bytes = 0;
    for (const auto& heads : *maps_of) bytes += map_bytes(heads, quantised);
    return bytes;
  };
  std::int64_t spread = kSpreadRows;
  const auto least = [&] {
    std::int64_t bytes = maps(true);
    for (const Explanation& e : parts) bytes += sampled_bytes(e, spread) + fixed_bytes(e);
    return bytes;
  };
  // Halves every map with a side longer than `side`; false when none has one.
  const auto pool_further = [&](std::int64_t side) {
    if (pooled.empty()) pooled = scans;
    maps_of = &pooled;
    bool smaller = false;
    for (auto& heads : pooled) {
      for (HeadScan& h : heads) {
        if (h.map_rows <= side && h.map_cols <= side) continue;
        const std::int64_t before = h.map_rows * h.map_cols;
        h = halved(h);
        smaller = smaller || h.map_rows * h.map_cols < before;
      }
    }
    return smaller;
  };
  // In turn, so that neither the overview nor the walk-throughs take all the loss: maps to 256
  // a side, rows to 12 a head, maps to 128, rows to kLeastSpreadRows.
  while (least() > kDataBudget) {
    if (pool_further(256)) continue;
    if (spread > 12) {
      spread /= 2;
      continue;
    }
    if (pool_further(128)) continue;
    if (spread <= kLeastSpreadRows) break;  // as small as the page gets
    spread /= 2;
  }
  // Float32 maps (exact tooltips) unless they would cost some part its exact float64 rows.
  bool quantised = false;
  std::vector<Rows> rows = plan_rows(parts, open, kDataBudget - maps(false), spread);
  if (std::any_of(rows.begin(), rows.end(), [](Rows r) { return r != Rows::kExactF64; })) {
    quantised = true;
    rows = plan_rows(parts, open, kDataBudget - maps(true), spread);
  }
  std::string j = "{\"parts\":[";
  for (std::size_t n = 0; n < parts.size(); ++n) {
    const std::int64_t open_row = static_cast<std::int64_t>(n) == open.part ? open.row : -1;
    j += (n ? "," : "") + part_json(parts[n], (*maps_of)[n], rows[n], quantised, open_row, spread);
  }
  j += "],\"open\":{\"part\":" + json_int(open.part) + ",\"head\":" + json_int(open.head) +
       ",\"row\":" + json_int(open.row) + "},\"budget\":" + json_int(kDataBudget) + "}";
  return j;
}

}  // namespace qkv::explain_detail
