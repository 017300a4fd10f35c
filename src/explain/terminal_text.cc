// What `qkv explain` prints in the terminal, and qkv.Explanation.text() returns: one place for
// the built-in example's framing, the order of the parts and the layer's output line.
#include <cstdio>
#include <string>

#include "qkv/error.h"
#include "qkv/explain.h"
#include "qkv/layer.h"

namespace qkv {
namespace {

constexpr const char* kBuiltinIntro =
    "qkv explain: the built-in example (no input files given). Q, K and V as in the\n"
    "classic explanation: a query asks, keys say what they match, values are what they\n"
    "give; O_i = Σ_j softmax(scale·q_i·K^T)_j·v_j.\n\n";

constexpr const char* kBuiltinConclusions =
    "What the example shows\n"
    "  1. O_i is a weighted sum of *all* the values: every film contributes to every user's\n"
    "     output, in proportion to its weight (step 6); a bad match only gets a small weight.\n"
    "  2. K and V are two transforms of the same rows: a film's key (its genres: what a taste\n"
    "     can match) and its value (what it gives you) both come from the film's one row, through\n"
    "     W^K and W^V. The key decides how much a film counts; the value is what it brings.\n";

}  // namespace

std::string format_layer_output(const Explanation& e, std::int64_t row, const TensorView& wo,
                                const std::optional<TensorView>& bo, int threads) {
  Tensor concat(DType::kF64, {1, e.heads * e.dv}, "concatenated heads");
  for (std::int64_t h = 0; h < e.heads; ++h) {
    for (std::int64_t c = 0; c < e.dv; ++c) {
      concat.data_as<double>()[h * e.dv + c] = e.out[static_cast<std::size_t>(h)].at(row, c);
    }
  }
  const Tensor out = linear(concat.view(), wo, bo, threads).to(DType::kF64);
  std::string text = "layer output for query " + std::to_string(row) + " = concat_h O_i·W^O" +
                     (bo ? " + b^O" : "") + " = [";
  for (std::int64_t c = 0; c < out.numel() && c < 8; ++c) {
    char value[32];
    std::snprintf(value, sizeof value, " %8.4f", out.data_as<double>()[c]);
    text += value;
  }
  if (out.numel() > 8) text += "  ... " + std::to_string(out.numel() - 8) + " more";
  return text + " ]\n";
}

std::string format_explanation(const std::vector<Explanation>& parts,
                               const std::vector<std::vector<HeadScan>>& scans,
                               const ExplainText& how) {
  if (scans.size() != parts.size()) {
    throw Error("scans", "one list of head scans per part is needed");
  }
  std::string text = how.builtin ? kBuiltinIntro : "";
  for (std::size_t n = 0; n < parts.size(); ++n) {
    const Explanation& e = parts[n];
    if (how.batch >= 0 && e.batch != how.batch && !how.builtin) continue;
    std::vector<std::int64_t> rows = how.rows;
    if (how.brief) {
      rows.clear();
    } else if (rows.empty()) {
      rows = interesting_rows(e, scans[n]);
    } else {
      // The built-in example's parts differ in length: a row applies to the parts that have it.
      std::erase_if(rows, [&](std::int64_t row) { return row < 0 || row >= e.nq; });
    }
    text += (how.builtin ? "Part " + std::to_string(n + 1) + ". " : std::string()) +
            format_overview(e) + "\n";
    if (e.projection && (how.builtin || e.nk <= 12)) text += format_key_value_rows(e) + "\n";
    for (const std::int64_t row : rows) {
      for (std::int64_t h = 0; h < e.heads; ++h) {
        if (how.head >= 0 && h != how.head) continue;
        text += format_walk_through(e, walk_through(e, h, row), how.top_keys) + "\n";
      }
      if (how.wo) text += format_layer_output(e, row, *how.wo, how.bo, how.threads);
    }
  }
  if (how.builtin) text += kBuiltinConclusions;
  return text;
}

}  // namespace qkv
