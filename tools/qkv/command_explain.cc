// qkv explain: the walk-through of query, key and value, in the terminal and as a page.
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <deque>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli_common.h"
#include "commands.h"
#include "layer_weights.h"
#include "qkv/error.h"
#include "qkv/explain.h"
#include "qkv/io.h"
#include "qkv/layer.h"

namespace qkv::cli {
namespace {

struct ExplainCommand {
  std::string q_path, k_path, v_path;
  std::string x_path, memory_path;
  WeightFlags weights;
  std::string rows, labels_q, labels_k, labels_d, labels_dv, html_path, svg_path;
  std::string layout;
  std::int64_t head = -1;
  std::int64_t batch = 0;
  std::int64_t top = 8;
  bool quiet = false;
  bool brief = false;
  AttentionFlags flags;
  CLI::App* app = nullptr;
};

// Above this many query rows the terminal gives the overview alone unless --row names rows:
// the walk-throughs of the most and least focused rows of every head ran to hundreds of lines.
constexpr std::int64_t kBriefAboveRows = 256;

// The page holds every batch element of a batched input when there are at most this many and
// their weights are few enough to scan (B·H·nq·nk); otherwise only the one --batch names.
constexpr std::int64_t kMaxPageBatches = 8;
constexpr double kMaxPageBatchScores = 268435456.0;  // 2^28 weights

// Far above the labels of any rows qkv explain can show, and bounded: a labels file is read
// whole, and /dev/zero (refused anyway, as every non-regular file is) must not be the only
// thing that stops an unbounded read.
constexpr std::uint64_t kMaxLabelsBytes = std::uint64_t{64} << 20;

std::vector<std::string> read_labels(const std::string& path) {
  if (path.empty()) return {};
  const std::string text = read_text_file(path, kMaxLabelsBytes, "a labels file");
  std::vector<std::string> labels;
  for (std::size_t start = 0; start < text.size();) {
    const std::size_t end = std::min(text.find('\n', start), text.size());
    std::string line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    labels.push_back(std::move(line));
    start = end + 1;
  }
  return labels;
}

std::vector<std::int64_t> parse_rows(const std::string& text, std::int64_t nq) {
  std::vector<std::int64_t> rows;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    std::int64_t row = 0;
    const auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), row);
    if (item.empty() || ec != std::errc() || ptr != item.data() + item.size()) {
      throw Error("--row", "expected query rows like 0,5,9, got '" + text + "'");
    }
    if (row < 0 || row >= nq) {
      throw Error("--row", "row " + item + " is outside the " + std::to_string(nq) + " query rows");
    }
    rows.push_back(row);
    start = comma + 1;
  }
  return rows;
}

// Options that only make sense with input files.
void reject_for_builtin(const ExplainCommand& c) {
  const char* const needs_inputs[] = {
      "--mask",     "--causal",    "--window",   "--scale",   "--labels-q",     "--labels-k",
      "--labels-d", "--labels-dv", "--batch",    "--heads",   "--kv-heads",     "--dtype",
      "--softcap",  "--alibi",     "--alibi-slopes", "--sinks", "--linear-layout", "--layout"};
  for (const char* name : needs_inputs) {
    if (c.app->count(name) > 0) {
      throw Error(name,
                  "applies to given inputs (--q/--k/--v or --x and the W files); the "
                  "built-in example has its own");
    }
  }
}

struct PathFlag {
  const std::string* path;
  const char* flag;
};

// Input files that only work as a set: name the first one missing.
void require_together(std::initializer_list<PathFlag> set) {
  std::string names;
  for (const PathFlag& p : set) {
    if (!names.empty()) names += ", ";
    names += p.flag;
  }
  for (const PathFlag& p : set) {
    if (p.path->empty()) throw Error(p.flag, "is needed: " + names + " go together");
  }
}

struct Inputs {
  bool builtin = false;
  std::deque<Tensor> owned;  // a deque: references to earlier inputs stay valid
  AttentionTensors tensors;  // --mask, --alibi-slopes, --sinks
  LoadedWeights weights;     // the layer form's, read as qkv layer reads them
};

// The batch elements to explain: all of a few small ones (the page offers them all), else the
// one --batch names. `batches` is the input's batch size (1 when unbatched).
std::vector<std::int64_t> batches_to_explain(const ExplainCommand& c, std::int64_t batches,
                                             double scores_per_batch) {
  if (c.batch >= batches) {
    throw Error("--batch", "batch element " + std::to_string(c.batch) + " is outside the " +
                               std::to_string(batches) +
                               (batches == 1 ? " batch element of the input"
                                             : " batch elements of the input"));
  }
  std::vector<std::int64_t> chosen;
  const bool all = !c.html_path.empty() && batches <= kMaxPageBatches &&
                   static_cast<double>(batches) * scores_per_batch <= kMaxPageBatchScores;
  for (std::int64_t b = 0; b < batches; ++b) {
    if (all || b == c.batch) chosen.push_back(b);
  }
  return chosen;
}

std::vector<Explanation> explain_inputs(const ExplainCommand& c, Inputs& in) {
  const bool attention_form = !c.q_path.empty() || !c.k_path.empty() || !c.v_path.empty();
  const bool layer_form = !c.x_path.empty() || any_weight(c.weights);
  if (!attention_form && !layer_form) {
    reject_for_builtin(c);
    in.builtin = true;
    return builtin_examples();
  }
  if (attention_form && layer_form) {
    throw Error("--q",
                "give either Q, K, V (--q --k --v) or X and the W files (--x --wq --wk "
                "--wv, or --wqkv), not both");
  }
  ExplainSetup setup;
  setup.title = "qkv explain";
  setup.query_labels = read_labels(c.labels_q);
  setup.key_labels = read_labels(c.labels_k);
  setup.d_labels = read_labels(c.labels_d);
  setup.dv_labels = read_labels(c.labels_dv);
  setup.query_labels_source = c.labels_q;
  setup.key_labels_source = c.labels_k;
  setup.d_labels_source = c.labels_d;
  setup.dv_labels_source = c.labels_dv;
  if (attention_form) {
    require_together({{&c.q_path, "--q"}, {&c.k_path, "--k"}, {&c.v_path, "--v"}});
    for (const char* layer_only : {"--heads", "--kv-heads", "--linear-layout", "--memory"}) {
      if (c.app->count(layer_only) > 0) {
        throw Error(layer_only,
                    "applies to X and the W files (--x ...); Q, K and V files carry their heads "
                    "in their shapes");
      }
    }
  } else {
    if (c.x_path.empty()) throw Error("--x", "is needed: the weights project the samples X");
    if (c.app->count("--layout") > 0) {
      throw Error("--layout", "applies to Q, K and V files; X holds one sample per row");
    }
    check_weight_flags(c.weights);
    if (c.weights.heads_option->count() == 0) {
      throw Error("--heads",
                  "is required with X and the W files: how many heads W^Q's columns hold "
                  "(as for qkv layer)");
    }
  }
  // Every input either form reads (the other form's paths are empty), counted before any is.
  std::vector<std::string> specs = weight_specs(c.weights);
  for (const std::string* path : {&c.q_path, &c.k_path, &c.v_path, &c.x_path, &c.memory_path}) {
    specs.push_back(*path);
  }
  const std::uint64_t input_bytes = check_input_sizes(c.flags, specs);
  in.tensors = load_attention_tensors(c.flags);
  AttentionOptions options = attention_options(c.flags, in.tensors);
  if (attention_form) {
    const Tensor& q_read = in.owned.emplace_back(read_input(c.q_path));
    const Tensor& k_read = in.owned.emplace_back(read_input(c.k_path));
    const Tensor& v_read = in.owned.emplace_back(read_input(c.v_path));
    const HeadLayout layout =
        resolve_layout(c.layout, q_read.shape(), k_read.shape(), v_read.shape(), false);
    const TensorView q = in_layout(q_read.view(), layout);
    const TensorView k = in_layout(k_read.view(), layout);
    const TensorView v = in_layout(v_read.view(), layout);
    setup.title = "qkv explain: attention on " + c.q_path + ", " + c.k_path + ", " + c.v_path;
    apply_memory_budget(c.flags, input_bytes, options);
    const Shape& qs = q.shape;
    const Shape& ks = k.shape;
    const std::int64_t batches = qs.size() == 4 ? std::max<std::int64_t>(qs[0], 1) : 1;
    const std::int64_t nk = ks.size() >= 2 ? ks[ks.size() - 2] : 0;
    const double query_rows = static_cast<double>(q.numel()) /
                              static_cast<double>(std::max<std::int64_t>(qs.back(), 1)) /
                              static_cast<double>(batches);  // H·nq
    const std::vector<std::int64_t> chosen =
        batches_to_explain(c, batches, query_rows * static_cast<double>(nk));
    return within_memory_budget("explain", [&] {
      return explain_attention_batches(q, k, v, options, chosen, setup);
    });
  }
  const Tensor& x = in.owned.emplace_back(read_input(c.x_path));
  load_weights(c.weights, in.weights);
  const std::optional<Tensor> memory = read_optional(c.memory_path);
  LayerOptions layer;
  layer.heads = c.weights.heads;
  layer.kv_heads = c.weights.kv_heads;
  layer.attention = options;
  setup.title = "qkv explain: the layer on " + c.x_path +
                (c.memory_path.empty() ? "" : " with memory " + c.memory_path);
  apply_memory_budget(c.flags, input_bytes, layer.attention);
  const Shape& xs = x.shape();
  const std::int64_t batches = xs.size() == 3 ? xs[0] : 1;
  const std::int64_t n = xs.size() >= 2 ? xs[xs.size() - 2] : 0;
  const Shape ms = memory ? memory->shape() : xs;
  const std::int64_t nk = ms.size() >= 2 ? ms[ms.size() - 2] : 0;
  const std::vector<std::int64_t> chosen = batches_to_explain(
      c, batches, static_cast<double>(c.weights.heads) * static_cast<double>(n) *
                      static_cast<double>(nk));
  return within_memory_budget("explain", [&] {
    return explain_layer_batches(x.view(), in.weights.weights, layer, view_of(memory), chosen,
                                 setup);
  });
}

void run_explain(const ExplainCommand& c) {
  if (c.quiet && c.html_path.empty() && c.svg_path.empty()) {
    throw Error("--quiet", "leaves nothing to do without --html or --svg");
  }
  Inputs inputs;
  const std::vector<Explanation> parts = explain_inputs(c, inputs);
  const bool builtin = inputs.builtin;
  std::vector<std::vector<HeadScan>> scans;
  ExplainText how;
  how.head = c.head;
  how.top_keys = c.top;
  how.batch = c.batch;
  how.builtin = builtin;
  if (inputs.weights.wo) how.wo = inputs.weights.wo->view();
  if (inputs.weights.bo) how.bo = inputs.weights.bo->view();
  how.threads = c.flags.threads;
  PageView open;
  open.head = std::max<std::int64_t>(c.head, 0);
  std::int64_t longest = 0;
  for (const Explanation& part : parts) longest = std::max(longest, part.nq);
  if (!c.rows.empty()) how.rows = parse_rows(c.rows, longest);
  if (c.brief && !c.rows.empty()) {
    throw Error("--brief", "leaves out the walk-through that --row asks for");
  }
  how.brief = c.brief || (c.rows.empty() && !builtin && longest > kBriefAboveRows);
  for (std::size_t n = 0; n < parts.size(); ++n) {
    const Explanation& e = parts[n];
    if (c.head >= e.heads) {
      throw Error("--head", "head " + std::to_string(c.head) + " is outside the " +
                                std::to_string(e.heads) + (e.heads == 1 ? " head" : " heads"));
    }
    auto& head_scans = scans.emplace_back();
    for (std::int64_t h = 0; h < e.heads; ++h) head_scans.push_back(scan_head(e, h));
    // The terminal walks through the batch element --batch names; the page has them all and
    // opens on it, at the first row asked for that the part has.
    if (e.batch != c.batch && !builtin) continue;
    if (!builtin) open.part = static_cast<std::int64_t>(n);
    if (static_cast<std::int64_t>(n) == open.part) {
      for (const std::int64_t row : how.rows) {
        if (row < e.nq) {
          open.row = row;
          break;
        }
      }
    }
  }
  const std::string text = c.quiet ? std::string() : format_explanation(parts, scans, how);

  // Every output is made before any is written, and they appear together or not at all.
  OutputFiles files;
  if (!c.html_path.empty()) {
    const std::string page = html_page(parts, scans, open);
    files.stage(c.html_path, std::vector<char>(page.begin(), page.end()));
  }
  if (!c.svg_path.empty()) {
    const std::string svg =
        heatmap_svg(parts[static_cast<std::size_t>(open.part)], c.head < 0 ? 0 : c.head);
    files.stage(c.svg_path, std::vector<char>(svg.begin(), svg.end()));
  }
  files.commit();
  if (c.quiet) return;
  std::fwrite(text.data(), 1, text.size(), stdout);
  if (how.brief) {
    const std::string page = c.html_path.empty() ? "--html page.html writes a page that shows "
                                                 : "the page " + c.html_path + " shows ";
    std::printf("The walk-through is left out (%lld query rows%s): --row 3,7 walks through "
                "chosen rows;\n%severy row.\n",
                static_cast<long long>(longest), c.brief ? ", --brief" : "", page.c_str());
  }
  if (!c.html_path.empty()) std::printf("wrote %s\n", c.html_path.c_str());
  if (!c.svg_path.empty()) std::printf("wrote %s\n", c.svg_path.c_str());
}

}  // namespace

void register_explain_command(CLI::App& app) {
  auto command = std::make_shared<ExplainCommand>();
  CLI::App* sub = app.add_subcommand(
      "explain",
      "walk through query, key and value for chosen rows (terminal), and write an attention "
      "page (--html) or a heatmap (--svg); with no inputs, a built-in example");
  command->app = sub;
  sub->add_option("--q", command->q_path, "queries, as for qkv attention");
  sub->add_option("--k", command->k_path, "keys, as for qkv attention");
  sub->add_option("--v", command->v_path, "values, as for qkv attention");
  add_layout_option(*sub, command->layout, /*writes_tensors=*/false);
  sub->add_option("--x", command->x_path, "samples, one per row, as for qkv layer");
  add_weight_flags(*sub, command->weights, /*heads_required=*/false);
  sub->add_option("--memory", command->memory_path, "cross-attention: K and V from M");
  // A packed batch is refused: explain walks through one sequence.
  add_attention_flags(*sub, command->flags, FlagGroups{.precision = true, .score_modifiers = true});
  // explain writes no tensors: the outputs of qkv attention do not apply.
  for (const char* name : {"--weights", "--lse", "--out-dtype"}) {
    sub->remove_option(sub->get_option(name));
  }
  sub->add_option("--row,--rows", command->rows,
                  "query rows to walk through, e.g. 0,5 (default: the most and least focused; "
                  "none above 256 query rows); the page opens the first");
  sub->add_flag("--brief", command->brief,
                "print the overview alone, without the walk-through (the default above 256 "
                "query rows)");
  sub->add_option("--head", command->head, "only this head in the walk-through; the head the page opens and --svg draws (default 0)")
      ->check(at_least(0));
  sub->add_option("--batch", command->batch, "batch element of a batched input the walk-through shows and the page opens (default 0)")
      ->check(at_least(0));
  sub->add_option("--top", command->top, "keys listed for a long row (default 8)")
      ->check(at_least(1));
  sub->add_option("--labels-q", command->labels_q, "query labels, one per line");
  sub->add_option("--labels-k", command->labels_k, "key labels, one per line");
  sub->add_option("--labels-d", command->labels_d,
                  "names of the d_k query/key coordinates, one per line");
  sub->add_option("--labels-dv", command->labels_dv,
                  "names of the d_v value coordinates, one per line");
  sub->add_option("--html", command->html_path, "write a self-contained attention page");
  sub->add_option("--svg", command->svg_path, "write one head's heatmap as SVG");
  sub->add_flag("--quiet", command->quiet,
                "write the page (--html) or heatmap (--svg) without printing the walk-through");
  sub->footer(
      "Examples:\n"
      "  qkv explain                                  the built-in example\n"
      "  qkv explain --html qkv-explain.html          ... and its page\n"
      "  qkv explain --q q.npy --k k.npy --v v.npy --causal --row 3 --labels-k words.txt\n"
      "  qkv explain --x x.npy --wq wq.npy --wk wk.npy --wv wv.npy --heads 4 --html page.html\n"
      "  qkv explain --x h.npy --wqkv gpt2.safetensors:h.0.attn.c_attn.weight \\\n"
      "              --bqkv gpt2.safetensors:h.0.attn.c_attn.bias --heads 12 --causal --quiet \\\n"
      "              --html gpt2-layer0.html\n"
      "Any tensor may be FILE.safetensors:NAME or FILE.npz:NAME (array NAME of np.savez).\n"
      "Weights are read as qkv layer reads them (--wqkv, --bqkv, --linear-layout, "
      "FILE.safetensors:NAME);\n"
      "--heads is required with them. A batched input: the terminal walks through --batch "
      "(default 0),\n"
      "the page holds every batch element when there are at most 8 (else the one --batch "
      "names).\n"
      "Above 256 query rows the terminal gives the overview alone unless --row names rows\n"
      "(--brief: at any size); the page (--html) shows every row.");
  sub->callback([command] { run_explain(*command); });
}

}  // namespace qkv::cli
