// qkv.Explanation: what qkv.explain and MultiHeadAttention.explain return (python/qkv/_explain.py
// names their arguments). It holds the library's Explanations and their head scans, and gives
// what `qkv explain` gives: the terminal walk-through, the page, one row's steps.
#include <pybind11/stl.h>

#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "arrays.h"
#include "bindings.h"
#include "options.h"
#include "qkv/explain.h"
#include "qkv/io.h"
#include "qkv/layer.h"

namespace qkv::python {

namespace {

// Far more weights than a notebook can show; recomputing them row by row is for small inputs.
constexpr double kMaxWeights = 16777216.0;  // 2^24

std::string str(std::int64_t value) { return std::to_string(value); }

class PyExplanation {
 public:
  PyExplanation(std::vector<Explanation> parts, bool builtin) : parts_(std::move(parts)),
                                                                builtin_(builtin) {
    for (const Explanation& e : parts_) {
      auto& head_scans = scans_.emplace_back();
      for (std::int64_t h = 0; h < e.heads; ++h) head_scans.push_back(scan_head(e, h));
    }
  }

  // The layer's output projection, for the line `qkv explain` prints under each row.
  void keep_output_projection(const TensorView& wo, const std::optional<TensorView>& bo,
                              int threads) {
    wo_ = contiguous_copy(wo, DType::kF64);
    if (bo) bo_ = contiguous_copy(*bo, DType::kF64);
    threads_ = threads;
  }

  const Explanation& part(std::int64_t index) const {
    if (index < 0 || index >= static_cast<std::int64_t>(parts_.size())) {
      throw Error("part", "part " + str(index) + " is outside the " +
                              str(static_cast<std::int64_t>(parts_.size())) + " parts");
    }
    return parts_[static_cast<std::size_t>(index)];
  }

  std::int64_t parts() const noexcept { return static_cast<std::int64_t>(parts_.size()); }

  RowWalkThrough row_walk_through(std::int64_t head, std::int64_t row, std::int64_t index) const {
    const Explanation& e = part(index);
    check_head(e, head);
    if (row < 0 || row >= e.nq) {
      throw Error("row", "row " + str(row) + " is outside the " + str(e.nq) + " query rows");
    }
    return walk_through(e, head, row);
  }

  // `rows` empty: the interesting rows of each part; `head` -1: every head.
  std::string text(const std::vector<std::int64_t>& rows, std::int64_t head,
                    std::int64_t top, bool brief = false) const {
    if (top < 1) throw Error("top", "must be at least 1, got " + str(top));
    for (const Explanation& e : parts_) {
      if (head >= 0) check_head(e, head);
    }
    std::int64_t longest = 0;
    for (const Explanation& e : parts_) longest = std::max(longest, e.nq);
    for (const std::int64_t row : rows) {
      if (row < 0 || row >= longest) {
        throw Error("rows", "row " + str(row) + " is outside the " + str(longest) + " query rows");
      }
    }
    ExplainText how;
    how.rows = rows;
    how.head = head;
    how.top_keys = top;
    how.brief = brief;
    how.builtin = builtin_;
    if (wo_) how.wo = wo_->view();
    if (bo_) how.bo = bo_->view();
    how.threads = threads_;
    return format_explanation(parts_, scans_, how);
  }

  std::string page() const { return html_page(parts_, scans_); }

  Tensor weights(std::int64_t head, std::int64_t index) const {
    const Explanation& e = part(index);
    check_head(e, head);
    if (static_cast<double>(e.nq) * static_cast<double>(e.nk) > kMaxWeights) {
      throw Error("weights", str(e.nq) + " x " + str(e.nk) +
                                 " weights are more than the 2^24 recomputed here; use "
                                 "qkv.attention(..., return_weights=True)");
    }
    Tensor out(DType::kF64, {e.nq, e.nk}, "weights");
    for (std::int64_t i = 0; i < e.nq; ++i) {
      const RowWalkThrough row = walk_through(e, head, i);
      std::copy(row.weight.begin(), row.weight.end(), out.data_as<double>() + i * e.nk);
    }
    return out;
  }

 private:
  static void check_head(const Explanation& e, std::int64_t head) {
    if (head < 0 || head >= e.heads) {
      throw Error("head", "head " + str(head) + " is outside the " + str(e.heads) +
                              (e.heads == 1 ? " head" : " heads"));
    }
  }

  std::vector<Explanation> parts_;
  std::vector<std::vector<HeadScan>> scans_;
  bool builtin_ = false;
  std::optional<Tensor> wo_, bo_;
  int threads_ = 0;
};

// The page inside an iframe: its own CSS and script cannot clash with the notebook's.
std::string iframe_of(const std::string& page) {
  std::string escaped;
  escaped.reserve(page.size() + page.size() / 8);
  for (const char c : page) {
    switch (c) {
      case '&': escaped += "&amp;"; break;
      case '"': escaped += "&quot;"; break;
      case '<': escaped += "&lt;"; break;
      case '>': escaped += "&gt;"; break;
      default: escaped += c;
    }
  }
  return "<iframe srcdoc=\"" + escaped +
         "\" style=\"width: 100%; height: 640px; border: 1px solid #ccc\"></iframe>";
}

py::array numbers(const std::vector<double>& values) {
  Tensor t(DType::kF64, {static_cast<std::int64_t>(values.size())}, "values");
  std::copy(values.begin(), values.end(), t.data_as<double>());
  return to_numpy(std::move(t));
}

py::array indices(const std::vector<std::int64_t>& values) {
  Tensor t(DType::kI64, {static_cast<std::int64_t>(values.size())}, "indices");
  std::copy(values.begin(), values.end(), t.data_as<std::int64_t>());
  return to_numpy(std::move(t));
}

py::dict row_dict(const RowWalkThrough& row) {
  py::dict d;
  d["head"] = row.head;
  d["row"] = row.row;
  d["x"] = numbers(row.x);
  d["q"] = numbers(row.q);
  d["raw"] = numbers(row.raw);
  d["capped"] = numbers(row.capped);
  d["alibi"] = numbers(row.alibi);
  d["score"] = numbers(row.score);
  d["weight"] = numbers(row.weight);
  d["by_weight"] = indices(row.by_weight);
  d["out"] = numbers(row.out);
  d["weighted_sum"] = numbers(row.weighted_sum);
  d["lse"] = row.lse;
  d["sink_share"] = row.sink_share;
  d["allowed_keys"] = row.allowed_keys;
  d["entropy"] = row.entropy;
  d["effective_keys"] = row.effective_keys;
  return d;
}

ExplainSetup setup_of(const std::optional<std::vector<std::string>>& query_labels,
                      const std::optional<std::vector<std::string>>& key_labels,
                      const std::optional<std::string>& title, std::int64_t batch) {
  if (batch < 0) throw Error("batch", "must be 0 or more, got " + str(batch));
  ExplainSetup setup;
  setup.title = title.value_or("qkv.explain");
  if (query_labels) setup.query_labels = *query_labels;
  if (key_labels) setup.key_labels = *key_labels;
  setup.query_labels_source = "query_labels";
  setup.key_labels_source = "key_labels";
  setup.batch = batch;
  return setup;
}

PyExplanation explain_attention_call(const py::handle& q_in, const py::handle& k_in,
                                     const py::handle& v_in, const py::dict& option_items,
                                     std::optional<std::vector<std::string>> query_labels,
                                     std::optional<std::vector<std::string>> key_labels,
                                     std::optional<std::string> title, std::int64_t batch) {
  ArrayKeeper keeper;
  const AttentionCallInputs call = attention_call_inputs(q_in, k_in, v_in, option_items, keeper);
  const ExplainSetup setup = setup_of(query_labels, key_labels, title, batch);
  py::gil_scoped_release computing;
  return PyExplanation({explain_attention(call.q, call.k, call.v, call.options, setup)}, false);
}

PyExplanation explain_layer_call(const py::handle& x_in, const py::handle& memory_in,
                                 const py::tuple& weight_arrays, std::int64_t heads,
                                 std::int64_t kv_heads, const py::dict& option_items,
                                 std::optional<std::vector<std::string>> query_labels,
                                 std::optional<std::vector<std::string>> key_labels,
                                 std::optional<std::string> title, std::int64_t batch) {
  ArrayKeeper keeper;
  const TensorView x = view_of(x_in, "x", keeper);
  const std::optional<TensorView> memory = optional_view_of(memory_in, "memory", keeper);
  const LayerWeights weights = layer_weights(weight_arrays, keeper);
  const LayerOptions options = layer_options(heads, kv_heads, option_items, keeper);
  ExplainSetup setup = setup_of(query_labels, key_labels, title, batch);
  setup.cross_attention = memory.has_value();
  py::gil_scoped_release computing;
  PyExplanation result({explain_layer(x, weights, options, memory, setup)}, false);
  if (weights.wo) result.keep_output_projection(*weights.wo, weights.bo, options.attention.threads);
  return result;
}

PyExplanation builtin_call() {
  py::gil_scoped_release computing;
  return PyExplanation(builtin_examples(), true);
}

}  // namespace

void register_explain(py::module_& m) {
  py::class_<PyExplanation>(m, "Explanation",
                            "What qkv.explain returns: one attention problem (the built-in "
                            "example: two parts) as qkv computed it, with its walk-through.")
      .def_property_readonly("parts", &PyExplanation::parts,
                             "How many attention problems (the built-in example has two).")
      .def_property_readonly(
          "heads", [](const PyExplanation& e) { return e.part(0).heads; }, "Query heads.")
      .def_property_readonly(
          "nq", [](const PyExplanation& e) { return e.part(0).nq; }, "Query rows (part 0).")
      .def_property_readonly(
          "nk", [](const PyExplanation& e) { return e.part(0).nk; }, "Key rows (part 0).")
      .def_property_readonly(
          "title", [](const PyExplanation& e) { return e.part(0).title; }, "Its title.")
      .def(
          "text",
          [](const PyExplanation& e, std::optional<std::vector<std::int64_t>> rows,
             std::optional<std::int64_t> head, std::int64_t top, bool brief) {
            if (head && *head < 0) {
              throw Error("head", "must be 0 or more (None: every head), got " + str(*head));
            }
            if (brief && rows) {
              throw Error("brief", "leaves out the walk-through that rows asks for");
            }
            py::gil_scoped_release computing;
            return e.text(rows.value_or(std::vector<std::int64_t>{}), head.value_or(-1), top,
                          brief);
          },
          py::arg("rows") = py::none(), py::arg("head") = py::none(), py::arg("top") = 8,
          py::kw_only(), py::arg("brief") = false,
          "What `qkv explain` prints: the overview, then the walk-through of `rows` (default: "
          "the most and the least focused) for every head (or `head`), listing at most `top` "
          "keys of a long row. brief=True: the overview alone.")
      .def(
          "html",
          [](const PyExplanation& e) {
            py::gil_scoped_release computing;
            return e.page();
          },
          "The self-contained attention page (what `qkv explain --html` writes).")
      .def(
          "save_html",
          [](const PyExplanation& e, const py::handle& path_in) {
            const std::filesystem::path path = path_argument(path_in, "path");
            py::gil_scoped_release computing;
            const std::string page = e.page();
            as_file_work([&] {
              OutputFiles files;
              files.stage(path, std::vector<char>(page.begin(), page.end()));
              files.commit();
            });
          },
          py::arg("path"),
          "Writes the page to `path` (str or os.PathLike) atomically (never a partial file).")
      .def(
          "_repr_html_",
          [](const PyExplanation& e) {
            py::gil_scoped_release computing;
            return iframe_of(e.page());
          })
      .def(
          "walk_through",
          [](const PyExplanation& e, std::int64_t head, std::int64_t row, std::int64_t part) {
            RowWalkThrough walk;
            {
              py::gil_scoped_release computing;
              walk = e.row_walk_through(head, row, part);
            }
            return row_dict(walk);
          },
          py::arg("head"), py::arg("row"), py::arg("part") = 0,
          "One query row of one head, every step: a dict of NumPy float64 arrays (x, q, raw, "
          "capped, alibi, score, weight, out, weighted_sum; by_weight int64) and numbers (lse, "
          "sink_share, allowed_keys, entropy, effective_keys, head, row).")
      .def(
          "weights",
          [](const PyExplanation& e, std::int64_t head, std::int64_t part) {
            Tensor weights;
            {
              py::gil_scoped_release computing;
              weights = e.weights(head, part);
            }
            return to_numpy(std::move(weights));
          },
          py::arg("head"), py::arg("part") = 0,
          "The [nq, nk] softmax weights of one head, recomputed as exp(score - lse) (float64; "
          "refused above 2^24 weights).")
      .def("__repr__", [](const PyExplanation& e) {
        const Explanation& first = e.part(0);
        return "<qkv.Explanation '" + first.title + "': " + str(e.parts()) +
               (e.parts() == 1 ? " part, " : " parts, ") + str(first.heads) + " heads, nq " +
               str(first.nq) + ", nk " + str(first.nk) + ">";
      });
  m.def("explain_attention", &explain_attention_call, "See qkv.explain.");
  m.def("explain_layer", &explain_layer_call, "See qkv.MultiHeadAttention.explain.");
  m.def("builtin_examples", &builtin_call, "See qkv.explain.");
}

}  // namespace qkv::python
