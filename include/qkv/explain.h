// qkv::explain: the walk-through of query, key and value, for any input.
//
// An Explanation holds one attention problem (one batch element) as the library computed it:
// every head's Q, K, V (float64 copies of what attention() read), the output O and the
// log-sum-exp of each row, both returned by attention(). Everything else is recomputed from
// those on demand, one row or one block of rows at a time, never the whole n x n for all heads:
//   r_ij = q_i·k_j                      the raw relevance of key j to query i
//   s_ij = softcap(scale·r_ij) + alibi_ij + bias_ij
//                                       bias: 0 where allowed, -inf where forbidden, or the
//                                       float mask's value; softcap and ALiBi when asked for
//   w_ij = exp(s_ij - lse_i)            the softmax weights (0 for a row with no allowed key);
//                                       with a sink, exp(sink_h - lse_i) is the sink's share
//   O_i  = Σ_j w_ij·v_j                 the library's output row
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "qkv/attention.h"
#include "qkv/layer.h"
#include "qkv/tensor.h"

namespace qkv {

// A dense row-major float64 matrix: the form in which explain keeps what it shows.
struct Matrix {
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::vector<double> values;

  const double* row(std::int64_t i) const noexcept {
    return values.data() + static_cast<std::size_t>(i * cols);
  }
  double at(std::int64_t i, std::int64_t j) const noexcept {
    return values[static_cast<std::size_t>(i * cols + j)];
  }
};

// How Q, K and V came from samples when the input was X and the W files (the layer form).
struct ExplainProjection {
  Matrix x;       // the query-side samples, [nq, d]
  Matrix memory;  // the key/value-side samples, [nk, d_m] (X itself unless cross)
  std::string x_name, memory_name;
  std::vector<Matrix> wq;      // per query head: its column block of W^Q, [d, dk]
  std::vector<Matrix> wk, wv;  // per kv head: column blocks of W^K [d_m, dk] and W^V [d_m, dv]
  std::vector<std::vector<double>> bq;  // per query head; empty without a bias
};

// Where explain's inputs come from and what to call things; labels are optional (one per row).
struct ExplainSetup {
  std::string title;  // one line saying what is explained
  std::string story;  // optional paragraphs (blank-line separated) the page shows first
  std::vector<std::string> query_labels;
  std::vector<std::string> key_labels;
  // What the coordinates mean: d names for the query/key columns, dv for the value columns,
  // and (layer form) one per column of the samples X and of the memory M.
  std::vector<std::string> d_labels;
  std::vector<std::string> dv_labels;
  std::vector<std::string> sample_labels;
  std::vector<std::string> memory_labels;
  std::string query_labels_source = "query labels";  // the subject of a label-count error
  std::string key_labels_source = "key labels";
  std::string d_labels_source = "d labels";
  std::string dv_labels_source = "dv labels";
  std::int64_t batch = 0;  // which batch element of a batched input
  // Queries and keys are different sequences (layer form: set by a memory): positions i and j
  // are not comparable, so no distance |j - i| is reported. The attention form cannot tell.
  bool cross_attention = false;
};

namespace explain_detail {
struct MaskRule;
}

struct Explanation {
  std::string title;
  std::string story;  // ExplainSetup::story
  std::int64_t nq = 0, nk = 0, d = 0, dv = 0, heads = 1, kv_heads = 1;
  std::int64_t batch = 0, batches = 1;  // which batch element this is, of how many
  bool cross_attention = false;         // ExplainSetup::cross_attention (or a memory was given)
  double scale = 1.0;
  bool causal = false;
  std::optional<Window> window;
  std::string mask_name;  // empty without an explicit mask
  bool mask_varies_by_head = false;
  double softcap = 0.0;               // > 0: scores pass through softcap·tanh(x / softcap)
  std::vector<double> alibi_slopes;  // per query head; empty without ALiBi
  std::vector<double> sinks;         // per query head; empty without sinks
  DType dtype = DType::kF32;         // the storage type Q, K, V were rounded to (q, k, v hold
                                     // the rounded values)
  std::string kernel;  // the kernel attention() ran
  int threads = 0;
  std::vector<std::string> query_labels;  // nq entries (numbers when none were given)
  std::vector<std::string> key_labels;    // nk entries
  std::vector<std::string> d_labels;      // d entries (empty: unnamed coordinates)
  std::vector<std::string> dv_labels;     // dv entries (empty: unnamed)
  std::vector<std::string> sample_labels; // projection->x.cols entries (empty: unnamed)
  std::vector<std::string> memory_labels; // projection->memory.cols entries (empty: unnamed)
  std::vector<Matrix> q;                  // per query head, [nq, d]
  std::vector<Matrix> k, v;               // per kv head, [nk, d] and [nk, dv]
  std::vector<Matrix> out;                // per query head, [nq, dv]: attention()'s output
  std::vector<std::vector<double>> lse;   // per query head, nq entries: attention()'s lse
  std::optional<ExplainProjection> projection;
  std::shared_ptr<const explain_detail::MaskRule> mask_rule;

  std::int64_t kv_head_of(std::int64_t head) const noexcept { return head / (heads / kv_heads); }
  // 0 where key j is allowed for query i, -inf where it is not, or the float mask's value.
  double bias(std::int64_t head, std::int64_t i, std::int64_t j) const noexcept;
  // The ALiBi term of (i, j): -slope_h·|i + nk - nq - j|; 0 without ALiBi.
  double alibi(std::int64_t head, std::int64_t i, std::int64_t j) const noexcept;
  // s_ij from r_ij = q_i·k_j: softcap(scale·r_ij) + alibi_ij + bias_ij (-inf where forbidden).
  double score(std::int64_t head, std::int64_t i, std::int64_t j, double raw) const noexcept;
  // Whether any explicit mask, causal or window rule applies.
  bool masked() const noexcept { return causal || window.has_value() || !mask_name.empty(); }
};

// Explains attention(q, k, v, options): the same shapes, options and checks as qkv attention.
// options.return_* and out_dtype are ignored (explain asks for the lse in float64).
Explanation explain_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                              const AttentionOptions& options, const ExplainSetup& setup = {});

// Explains the layer's attention from X and the W files: Q, K, V come from linear(), exactly the
// projections multi_head_attention() makes, and each head from attention() on their views.
Explanation explain_layer(const TensorView& x, const LayerWeights& weights,
                          const LayerOptions& options,
                          const std::optional<TensorView>& memory = std::nullopt,
                          const ExplainSetup& setup = {});

// The same for several batch elements at once (one attention() call): one Explanation per
// index in `batches` (setup.batch is ignored); every index must be in range.
std::vector<Explanation> explain_attention_batches(const TensorView& q, const TensorView& k,
                                                   const TensorView& v,
                                                   const AttentionOptions& options,
                                                   const std::vector<std::int64_t>& batches,
                                                   const ExplainSetup& setup = {});
std::vector<Explanation> explain_layer_batches(const TensorView& x, const LayerWeights& weights,
                                               const LayerOptions& options,
                                               const std::optional<TensorView>& memory,
                                               const std::vector<std::int64_t>& batches,
                                               const ExplainSetup& setup = {});

// The built-in example: users' tastes as queries, films' genres as keys and what the films give
// as values (cross-attention), then self-attention over the films themselves.
std::vector<Explanation> builtin_examples();

// One query row of one head, every step of the walk-through.
struct RowWalkThrough {
  std::int64_t head = 0;
  std::int64_t row = 0;
  std::vector<double> x;                // x_i (layer form only)
  std::vector<double> q;                // q_i
  std::vector<double> raw;              // r_ij = q_i·k_j, nk entries
  std::vector<double> capped;           // softcap(scale·r_ij) (scale·r_ij without a softcap)
  std::vector<double> alibi;            // alibi_ij (zeros without ALiBi)
  std::vector<double> score;            // s_ij = capped + alibi + bias (-inf where forbidden)
  std::vector<double> weight;           // w_ij = exp(s_ij - lse_i)
  std::vector<std::int64_t> by_weight;  // keys, heaviest first
  std::vector<double> out;              // O_i from attention()
  std::vector<double> weighted_sum;     // Σ_j w_ij·v_j recomputed here: equals O_i
  double lse = 0.0;
  double sink_share = 0.0;  // exp(sink_h - lse_i): the sink's part of the denominator (0 without)
  std::int64_t allowed_keys = 0;
  double entropy = 0.0;         // -Σ_j p_ij·ln p_ij, in nats, for p_ij = w_ij / Σ_j w_ij (the
                                // keys' weights renormalised: a sink's share left out)
  double effective_keys = 0.0;  // exp(entropy): how many keys the row really uses
};

RowWalkThrough walk_through(const Explanation& e, std::int64_t head, std::int64_t row);

// The terminal text of one row's walk-through; rows with many keys show the heaviest
// `top_keys` and a line for the rest.
std::string format_walk_through(const Explanation& e, const RowWalkThrough& row,
                                std::int64_t top_keys = 8);

// Layer form only: the key/value-side samples m_j beside k_j = m_j·W^K and v_j = m_j·W^V, the
// first `limit` rows (empty for the attention form).
std::string format_key_value_rows(const Explanation& e, std::int64_t kv_head = 0,
                                  std::int64_t limit = 12);

// The header that says what an explanation holds (shapes, scale, masking, kernel).
std::string format_overview(const Explanation& e);

// Per-row statistics and a max-pooled overview of one head's weights, computed in blocks of
// rows from the lse (never the whole n x n at once).
struct HeadScan {
  std::int64_t head = 0;
  std::int64_t map_rows = 0, map_cols = 0;  // the pooled map: min(nq, max_side) x min(nk, ..)
  std::vector<float> max_weight;            // [map_rows, map_cols]: max w_ij in each cell
  std::vector<float> mean_weight;           // [map_rows, map_cols]: mean w_ij over the cell's
                                            // allowed (i, j) (0 where none is allowed)
  std::vector<float> allowed_share;         // [map_rows, map_cols]: share of (i, j) allowed
  std::vector<double> entropy;              // per row, nats, as RowWalkThrough::entropy (0 for a
                                            // row with no allowed key)
  std::vector<double> distance;             // per row: Σ_j w_ij·|j - (i + nk - nq)| (0 for
                                            // cross-attention, where it means nothing)
  std::vector<double> first_key;            // per row: w_i0
  std::vector<double> max_row_weight;       // per row: max_j w_ij
  std::vector<bool> has_keys;               // per row: at least one allowed key
  std::vector<std::int64_t> allowed_keys;   // per row: how many keys are allowed
  // Means over the rows that have a key.
  double mean_entropy = 0.0, mean_distance = 0.0, mean_first_key = 0.0, mean_max_weight = 0.0;
  std::int64_t most_focused = 0, least_focused = 0;  // rows of least and most entropy
};

HeadScan scan_head(const Explanation& e, std::int64_t head, std::int64_t max_side = 512);

// Rows worth walking through when the user names none: every row of a short input, otherwise
// the most and the least focused rows over all heads (among rows with more than one allowed
// key, where there are such: a row with one key is trivially focused).
std::vector<std::int64_t> interesting_rows(const Explanation& e,
                                           const std::vector<HeadScan>& scans);

// What the terminal says of one or more explanations (qkv explain, qkv.Explanation.text()):
// each part's overview, its key/value rows (layer form, few keys), the walk-through of `rows`
// for each head, and with W^O each row's layer output; the built-in example's framing around it.
struct ExplainText {
  std::vector<std::int64_t> rows;  // empty: interesting_rows() of each part; rows past a part's
                                   // end are left out of it
  std::int64_t head = -1;          // -1: every head
  std::int64_t top_keys = 8;       // as format_walk_through
  std::int64_t batch = -1;         // only the part of this batch element; -1: every part
  bool builtin = false;            // the built-in example: its introduction, "Part N.", and
                                   // what it shows
  std::optional<TensorView> wo = std::nullopt;  // the layer's W^O and b^O, for its output line
  std::optional<TensorView> bo = std::nullopt;
  int threads = 0;
  bool brief = false;  // the overview alone, no walk-through (rows is then ignored)
};

// `scans` holds scan_head() of every head of every part.
std::string format_explanation(const std::vector<Explanation>& parts,
                               const std::vector<std::vector<HeadScan>>& scans,
                               const ExplainText& how);

// The layer's final output for one row: concat_h O_i,h · W^O + b^O, its first 8 values.
std::string format_layer_output(const Explanation& e, std::int64_t row, const TensorView& wo,
                                const std::optional<TensorView>& bo, int threads = 0);

// One self-contained HTML page (inline CSS, JS and data; no network) for one or more
// explanations: heatmaps per head, mask pattern, head summaries, row walk-throughs.
// What the page shows when it opens: a part, a head, and a row (-1: that head's most focused row).
struct PageView {
  std::int64_t part = 0;
  std::int64_t head = 0;
  std::int64_t row = -1;
};

std::string html_page(const std::vector<Explanation>& parts,
                      const std::vector<std::vector<HeadScan>>& scans, const PageView& open = {});

// One head's heatmap as a standalone SVG (cells pooled to at most max_side per side).
std::string heatmap_svg(const Explanation& e, std::int64_t head, std::int64_t max_side = 128);

}  // namespace qkv
