// One query row, step by step in the classic explanation's order (the query, its raw relevance
// to each key, the scaled and masked scores, the softmax weights, the values, the weighted sum,
// the entropy), and its terminal text.
#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <numeric>
#include <string>

#include "core/score_modifiers.h"
#include "explain/wording.h"
#include "qkv/explain.h"

namespace qkv {
namespace {

using explain_detail::count;
using explain_detail::fixed;
using explain_detail::say;

std::string printf_string(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string printf_string(const char* format, ...) {
  char buffer[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buffer, sizeof buffer, format, args);
  va_end(args);
  return buffer;
}

std::string num(double value) { return fixed(value, 4); }

// Terminal columns of a UTF-8 string: one per code point (continuation bytes do not count).
std::size_t columns(const std::string& text) {
  return static_cast<std::size_t>(std::count_if(text.begin(), text.end(), [](char c) {
    return (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  }));
}

std::string pad(const std::string& text, std::size_t width) {
  const std::size_t used = columns(text);
  return used >= width ? text : text + std::string(width - used, ' ');
}

// "[ 1.0000  0.5000 ... ]", or with the coordinates' names "[ action 1.0000  sci-fi 0.5000 ]",
// at most `limit` entries and a count of the rest.
std::string vector_text(const std::vector<double>& values,
                        const std::vector<std::string>& labels = {}, std::size_t limit = 8) {
  std::string text = "[";
  for (std::size_t c = 0; c < values.size() && c < limit; ++c) {
    if (c < labels.size()) {
      text += (c ? "  " : " ") + labels[c] + " " + num(values[c]);
    } else {
      text += printf_string(" %8s", num(values[c]).c_str());
    }
  }
  if (values.size() > limit) text += printf_string("  ... %zu more", values.size() - limit);
  return text + " ]";
}

std::string sz(std::int64_t n) { return std::to_string(n); }

// Eighths of a block, so that a bar shows small differences between weights.
std::string bar(double fraction, int width) {
  static const char* const kEighths[] = {"", "▏", "▎", "▍", "▌", "▋", "▊", "▉"};
  const int eighths = static_cast<int>(std::lround(std::clamp(fraction, 0.0, 1.0) * width * 8));
  std::string text;
  for (int i = 0; i < eighths / 8; ++i) text += "█";
  return text + kEighths[eighths % 8];
}

}  // namespace

RowWalkThrough walk_through(const Explanation& e, std::int64_t head, std::int64_t row) {
  RowWalkThrough w;
  w.head = head;
  w.row = row;
  const Matrix& q = e.q[static_cast<std::size_t>(head)];
  const std::size_t kv = static_cast<std::size_t>(e.kv_head_of(head));
  const Matrix& k = e.k[kv];
  const Matrix& v = e.v[kv];
  const double* qi = q.row(row);
  w.q.assign(qi, qi + e.d);
  if (e.projection) {
    const double* xi = e.projection->x.row(row);
    w.x.assign(xi, xi + e.projection->x.cols);
  }
  w.lse = e.lse[static_cast<std::size_t>(head)][static_cast<std::size_t>(row)];
  const auto nk = static_cast<std::size_t>(e.nk);
  w.raw.resize(nk);
  w.capped.resize(nk);
  w.alibi.resize(nk);
  w.score.resize(nk);
  w.weight.resize(nk);
  for (std::int64_t j = 0; j < e.nk; ++j) {
    const auto sj = static_cast<std::size_t>(j);
    const double* kj = k.row(j);
    double dot = 0.0;
    for (std::int64_t c = 0; c < e.d; ++c) dot += qi[c] * kj[c];
    w.raw[sj] = dot;
    w.capped[sj] = core::softcap(e.scale * dot, e.softcap);
    w.alibi[sj] = e.alibi(head, row, j);
    w.score[sj] = e.score(head, row, j, dot);
    // A forbidden key, or a row with no allowed key at all (lse = -inf), has weight 0.
    const bool counts = std::isfinite(w.score[sj]) && std::isfinite(w.lse);
    w.weight[sj] = counts ? std::exp(w.score[sj] - w.lse) : 0.0;
    if (std::isfinite(w.score[sj])) ++w.allowed_keys;
    if (w.weight[sj] > 0.0) w.entropy -= w.weight[sj] * std::log(w.weight[sj]);
  }
  if (!e.sinks.empty() && std::isfinite(w.lse)) {
    w.sink_share = std::exp(e.sinks[static_cast<std::size_t>(head)] - w.lse);
  }
  // The entropy of the keys' weights renormalised to sum to 1: with a sink they sum to less,
  // and -Σ w·ln w alone would count more "effective keys" than there are. For p = w / S,
  // -Σ p·ln p = (-Σ w·ln w) / S + ln S. A weight may exceed 1 by a rounding error of the lse
  // (a one-key row): entropy is >= 0.
  double weight_sum = 0.0;
  for (const double wj : w.weight) weight_sum += wj;
  if (weight_sum > 0.0) w.entropy = w.entropy / weight_sum + std::log(weight_sum);
  w.entropy = std::max(w.entropy, 0.0);
  w.effective_keys = std::isfinite(w.lse) ? std::exp(w.entropy) : 0.0;
  w.by_weight.resize(nk);
  std::iota(w.by_weight.begin(), w.by_weight.end(), std::int64_t{0});
  std::stable_sort(w.by_weight.begin(), w.by_weight.end(), [&](std::int64_t a, std::int64_t b) {
    return w.weight[static_cast<std::size_t>(a)] > w.weight[static_cast<std::size_t>(b)];
  });
  const double* oi = e.out[static_cast<std::size_t>(head)].row(row);
  w.out.assign(oi, oi + e.dv);
  w.weighted_sum.assign(static_cast<std::size_t>(e.dv), 0.0);
  for (std::int64_t j = 0; j < e.nk; ++j) {
    const double wj = w.weight[static_cast<std::size_t>(j)];
    if (wj == 0.0) continue;
    for (std::int64_t c = 0; c < e.dv; ++c)
      w.weighted_sum[static_cast<std::size_t>(c)] += wj * v.at(j, c);
  }
  return w;
}

std::string format_overview(const Explanation& e) {
  std::string text = e.title.empty() ? std::string() : e.title + "\n";
  text += "  " + say("overview.sizes", {{"nq", sz(e.nq)},
                                         {"nk", sz(e.nk)},
                                         {"d", sz(e.d)},
                                         {"dv", sz(e.dv)},
                                         {"heads", sz(e.heads)}});
  if (e.kv_heads != e.heads) text += say("overview.kv_heads", {{"kv_heads", sz(e.kv_heads)}});
  text += printf_string(", scale %.6g", e.scale);
  if (e.batches > 1) {
    text += "\n  " + say("overview.batch", {{"batch", sz(e.batch)}, {"batches", sz(e.batches)}});
  }
  if (e.cross_attention) text += "\n  " + say("overview.cross");
  text += "\n  masking: ";
  std::vector<std::string> rules;
  if (e.causal) rules.push_back("causal");
  if (e.window) rules.push_back("window " + sz(e.window->left) + "," + sz(e.window->right));
  if (!e.mask_name.empty()) rules.push_back("mask " + e.mask_name);
  std::string masking;
  for (const std::string& rule : rules) {
    if (!masking.empty()) masking += " + ";
    masking += rule;
  }
  text += masking.empty() ? say("overview.no_masking") : masking;
  text += "; kernel " + e.kernel + "\n";
  std::vector<std::string> modifiers;
  if (e.softcap > 0) modifiers.push_back(printf_string("softcap %.6g", e.softcap));
  if (!e.alibi_slopes.empty()) {
    std::string slopes;
    for (double slope : e.alibi_slopes) {
      slopes += (slopes.empty() ? "" : ", ") + printf_string("%.6g", slope);
    }
    modifiers.push_back("ALiBi slopes [" + slopes + "]");
  }
  if (!e.sinks.empty()) {
    std::string sinks;
    for (double sink : e.sinks) sinks += (sinks.empty() ? "" : ", ") + num(sink);
    modifiers.push_back("sinks [" + sinks + "]");
  }
  if (e.dtype == DType::kBF16 || e.dtype == DType::kF16) {
    modifiers.push_back(std::string("Q, K, V rounded to ") + dtype_name(e.dtype));
  }
  if (!modifiers.empty()) {
    text += "  score modifiers: ";
    for (std::size_t m = 0; m < modifiers.size(); ++m) text += (m ? "; " : "") + modifiers[m];
    text += "\n";
  }
  return text;
}

std::string format_walk_through(const Explanation& e, const RowWalkThrough& w,
                                std::int64_t top_keys) {
  const auto& qlabel = e.query_labels[static_cast<std::size_t>(w.row)];
  const std::string i = sz(w.row);
  std::string t;
  t += "── query " + i + " \"" + qlabel + "\"";
  if (e.heads > 1) t += ", head " + sz(w.head);
  if (e.batches > 1) t += ", batch element " + sz(e.batch);
  t += " ──\n";

  // 1. q_i, and where it came from.
  if (e.projection) {
    const ExplainProjection& p = *e.projection;
    t += "1. x_" + i + " (row " + i + " of " + p.x_name + ") = " + vector_text(w.x, e.sample_labels) +
         "\n";
    t += "   q_" + i + " = x_" + i + "·W^Q";
    if (e.heads > 1) t += " (columns of head " + sz(w.head) + ")";
    if (!p.bq.empty()) t += " + b^Q";
    t += " = " + vector_text(w.q, e.d_labels) + "\n";
  } else {
    t += "1. q_" + i + " (row " + i + " of Q) = " + vector_text(w.q, e.d_labels) + "\n";
  }

  // Only allowed keys are ranked and counted; a short row lists every key, forbidden ones
  // with s = -inf, so that the mask's effect shows.
  const auto nk = static_cast<std::int64_t>(w.raw.size());
  std::vector<std::int64_t> ranked;  // allowed keys, heaviest first
  for (const std::int64_t j : w.by_weight) {
    if (std::isfinite(w.score[static_cast<std::size_t>(j)])) ranked.push_back(j);
  }
  const auto allowed = static_cast<std::int64_t>(ranked.size());
  const bool all_keys = nk <= top_keys + 4;
  const std::int64_t listed = allowed <= top_keys + 4 ? allowed : top_keys;
  std::vector<std::int64_t> shown;
  if (all_keys) {
    for (std::int64_t j = 0; j < nk; ++j) shown.push_back(j);
  } else {
    shown.assign(ranked.begin(), ranked.begin() + listed);
  }
  std::size_t label_width = 6;
  for (std::int64_t j : shown) {
    label_width = std::max(label_width, columns(e.key_labels[static_cast<std::size_t>(j)]));
  }
  label_width = std::min<std::size_t>(label_width, 24);

  // 2-3. raw relevance and scaled, masked scores.
  t += "2. raw relevance r_" + i + "j = q_" + i + "·k_j (how well each key matches the query)\n";
  const bool capped = e.softcap > 0, alibi = !e.alibi_slopes.empty();
  const std::string scaled = printf_string("%.6g·r_%sj", e.scale, i.c_str());
  t += "3. scores s_" + i + "j = ";
  t += capped ? printf_string("%.6g·tanh(", e.softcap) + scaled +
                    printf_string(" / %.6g)", e.softcap)
              : scaled;
  if (alibi) {
    t += printf_string(" - %.6g·|%lld - j|", e.alibi_slopes[static_cast<std::size_t>(w.head)],
                       static_cast<long long>(w.row + e.nk - e.nq));
  }
  t += e.masked() ? " + mask (-inf: not allowed)\n" : "\n";
  if (capped) {
    t += printf_string("     (soft-capped: the scaled score passes through %.6g·tanh(x / %.6g), "
                       "so no score leaves (-%.6g, %.6g))\n",
                       e.softcap, e.softcap, e.softcap, e.softcap);
  }
  if (alibi) t += "     (ALiBi: a penalty that grows with the distance from the query's position)\n";
  if (!shown.empty()) {
    t += "     " + pad("key", label_width) + "          r";
    if (capped) t += "     capped";
    if (alibi) t += "      ALiBi";
    t += "          s\n";
  }
  for (std::int64_t j : shown) {
    const auto sj = static_cast<std::size_t>(j);
    t += "     " + pad(e.key_labels[sj], label_width) +
         printf_string(" %10s", num(w.raw[sj]).c_str());
    if (capped) t += printf_string(" %10s", num(w.capped[sj]).c_str());
    if (alibi) t += printf_string(" %10s", num(w.alibi[sj]).c_str());
    t += printf_string(" %10s\n", num(w.score[sj]).c_str());
  }
  if (!all_keys && listed < allowed) {
    t += "     " + say("scores.heaviest", {{"shown", sz(listed)},
                                            {"allowed", sz(allowed)},
                                            {"hidden", sz(allowed - listed)}}) +
         "\n";
  }
  if (!all_keys && allowed < nk) {
    t += "     " + say("scores.left_out", {{"masked", sz(nk - allowed)}}) + "\n";
  }

  // 4. weights as a sorted bar chart, allowed keys only.
  const bool has_weights = std::isfinite(w.lse) && allowed > 0;
  t += "4. " + say("weights.heading", {{"row", i}, {"lse", num(w.lse)}}) + "\n";
  if (!e.sinks.empty()) {
    const double sink = e.sinks[static_cast<std::size_t>(w.head)];
    t += "     " +
         say("weights.sink", {{"sink", num(sink)},
                              {"share", num(w.sink_share)},
                              {"sum", num(1.0 - w.sink_share)}}) +
         "\n";
    if (allowed == 0) t += "     " + say("weights.none_sink", {{"row", i}}) + "\n";
  } else if (!has_weights) {
    t += "     " + say("weights.none", {{"row", i}}) + "\n";
  }
  const double top = has_weights ? w.weight[static_cast<std::size_t>(ranked.front())] : 0.0;
  const std::int64_t bars = has_weights ? listed : 0;
  double rest = 1.0 - w.sink_share;
  for (std::int64_t r = 0; r < bars; ++r) {
    const auto sj = static_cast<std::size_t>(ranked[static_cast<std::size_t>(r)]);
    rest -= w.weight[sj];
    t += "     " + pad(e.key_labels[sj], label_width) + " " + num(w.weight[sj]) + " " +
         bar(top > 0 ? w.weight[sj] / top : 0.0, 30) + "\n";
  }
  if (bars < allowed && has_weights) {
    t += "     " + pad(say("weights.more", {{"rest", sz(allowed - bars)}}), label_width) + " " +
         say("weights.more_sum", {{"sum", num(std::max(rest, 0.0))}}) + "\n";
  }

  // 5. the values that contribute most, and 6. the output.
  if (has_weights) {
    const Matrix& v = e.v[static_cast<std::size_t>(e.kv_head_of(w.head))];
    t += "5. " + say("values.heading") + "\n";
    for (std::int64_t r = 0; r < std::min<std::int64_t>(bars, 3); ++r) {
      const std::int64_t j = ranked[static_cast<std::size_t>(r)];
      const std::vector<double> vj(v.row(j), v.row(j) + e.dv);
      t += "     " + pad(e.key_labels[static_cast<std::size_t>(j)], label_width) + " " +
           num(w.weight[static_cast<std::size_t>(j)]) + " × " + vector_text(vj, e.dv_labels) +
           "\n";
    }
  }
  double diff = 0.0;
  for (std::size_t c = 0; c < w.out.size(); ++c) {
    diff = std::max(diff, std::abs(w.out[c] - w.weighted_sum[c]));
  }
  t += "6. " +
       (!has_weights    ? say("output.none", {{"row", i}})
        : allowed == nk ? say("output.sum_all", {{"row", i}, {"nk", sz(nk)}})
                        : say("output.sum", {{"row", i}, {"allowed", sz(allowed)}})) +
       " = " + vector_text(w.out, e.dv_labels) + "\n";
  // The bound, not the difference itself: the text stays the same across kernels that agree.
  double bound = 1e-12;
  while (bound < diff && bound < 1.0) bound *= 1e3;
  t += "     " + say("output.check", {{"row", i}, {"bound", printf_string("%.0e", bound)}}) + "\n";
  t += "7. " +
       (has_weights ? say("entropy", {{"entropy", num(w.entropy)},
                                      {"effective", fixed(w.effective_keys, 2)},
                                      {"allowed", sz(allowed)}})
                    : say("entropy.none")) +
       "\n";
  return t;
}

std::string format_key_value_rows(const Explanation& e, std::int64_t kv_head, std::int64_t limit) {
  if (!e.projection) return {};
  const ExplainProjection& p = *e.projection;
  const Matrix& k = e.k[static_cast<std::size_t>(kv_head)];
  const Matrix& v = e.v[static_cast<std::size_t>(kv_head)];
  std::size_t width = 6;
  for (std::int64_t j = 0; j < std::min(e.nk, limit); ++j) {
    width = std::max(width, columns(e.key_labels[static_cast<std::size_t>(j)]));
  }
  width = std::min<std::size_t>(width, 24);
  std::string t = "Keys and values: two transforms of the same rows of " + p.memory_name +
                  " (k_j = m_j·W^K, v_j = m_j·W^V";
  if (e.kv_heads > 1) t += ", kv head " + sz(kv_head);
  t += ")\n";
  for (std::int64_t j = 0; j < std::min(e.nk, limit); ++j) {
    const std::vector<double> mj(p.memory.row(j), p.memory.row(j) + p.memory.cols);
    const std::vector<double> kj(k.row(j), k.row(j) + e.d), vj(v.row(j), v.row(j) + e.dv);
    t += "  " + pad(e.key_labels[static_cast<std::size_t>(j)], width) + " m " +
         vector_text(mj, e.memory_labels, 6) + "\n  " + std::string(width, ' ') + " k " +
         vector_text(kj, e.d_labels, 6) + "\n  " + std::string(width, ' ') + " v " +
         vector_text(vj, e.dv_labels, 6) + "\n";
  }
  if (e.nk > limit) t += "  (" + count(e.nk - limit, "more row", "more rows") + ")\n";
  return t;
}

}  // namespace qkv
