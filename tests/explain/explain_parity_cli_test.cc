// `qkv explain` reads its inputs as `qkv layer` and `qkv attention` do, and shows their results
// (issue 12): for the same files and flags, the O_i rows the walk-through prints equal the
// rows the other command writes with --out.
//
// Tolerance: the walk-through prints O_i with 4 decimals (%8.4f), so a printed value is within
// 5e-5 of the true one. Both commands pick their kernel as qkv always does (float32 arithmetic
// even on these float64 inputs: fused_hwy or decode_hwy, which agree with the float64 reference
// within ~2e-7 here), so they may differ by 1e-6 at most: a printed value may differ from --out
// by 5e-5 + 1e-6. A missing transpose, a wrong column block or an ignored bias moves O by far
// more, and the tests check that their flag matters (the result without it differs by > 1e-2).
//
// Also: --heads is required for the layer form; --quiet writes the page without the
// walk-through; --labels-d / --labels-dv with the wrong count fail with one line naming the
// file and write nothing; --batch b walks through batch element b.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "io/safetensors_builder.h"
#include "qkv/io.h"
#include "support/command_runner.h"
#include "support/test_support.h"
#include "walk_through_header.h"

namespace qkv {
namespace {

namespace fs = std::filesystem;
using testing::CommandRun;

constexpr double kPrinted = 5e-5 + 1e-6;

CommandRun qkv_run(const fs::path& dir, const std::vector<std::string>& args) {
  return testing::run_program(QKV_CLI_PATH, dir, args, 120);
}

std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

Tensor random_f64(const Shape& shape, std::uint64_t seed) {
  return testing::random_tensor(DType::kF64, shape, seed);
}

void save(const testing::ScratchDir& dir, const std::string& name, const Tensor& t) {
  write_npy(dir / name, t.view(), DType::kF64);
}

// The transpose of a 2-D float64 tensor: the [out, in] layout of nn.Linear.
Tensor transposed(const Tensor& w) {
  const std::int64_t rows = w.shape()[0], cols = w.shape()[1];
  Tensor t(DType::kF64, {cols, rows}, "transposed");
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) {
      t.data_as<double>()[c * rows + r] = w.data_as<double>()[r * cols + c];
    }
  }
  return t;
}

// Numbers inside the last "[ ... ]" of a line.
std::vector<double> bracket_values(const std::string& line) {
  const std::size_t open = line.rfind('[');
  const std::size_t close = line.rfind(']');
  std::vector<double> values;
  if (open == std::string::npos || close == std::string::npos || close < open) return values;
  static const std::regex number("-?[0-9]+\\.[0-9]+|-?inf|nan");
  const std::string inside = line.substr(open + 1, close - open - 1);
  EXPECT_EQ(inside.find("more"), std::string::npos) << "O_i is cut short: " << line;
  for (auto it = std::sregex_iterator(inside.begin(), inside.end(), number);
       it != std::sregex_iterator(); ++it) {
    values.push_back(std::stod(it->str()));
  }
  return values;
}

// The printed O rows: key (row, head) -> values, from each walk-through's "6. O_i ..." line.
struct PrintedRow {
  std::int64_t row, head;
  std::vector<double> values;
};


std::vector<PrintedRow> printed_outputs(const std::string& out) {
  std::vector<PrintedRow> rows;
  std::int64_t row = -1, head = 0;
  std::size_t start = 0;
  while (start < out.size()) {
    const std::size_t end = std::min(out.find('\n', start), out.size());
    const std::string line = out.substr(start, end - start);
    start = end + 1;
    if (testing::parse_walk_through_header(line, row, head)) {
      continue;
    } else if (line.rfind("6. O_", 0) == 0 && row >= 0) {
      rows.push_back({row, head, bracket_values(line)});
    }
  }
  return rows;
}

// Checks every printed O row against --out of the other command ([.., N, H·dv], heads as column
// blocks of width dv), batch element `batch`; expects `expected_rows` printed rows.
void expect_same_outputs(const std::string& explain_out, const Tensor& reference, std::int64_t dv,
                         std::int64_t batch, std::size_t expected_rows) {
  const Tensor o = reference.to(DType::kF64);
  const std::int64_t n = o.shape()[o.shape().size() - 2];
  const std::int64_t width = o.shape().back();
  const std::vector<PrintedRow> rows = printed_outputs(explain_out);
  ASSERT_EQ(rows.size(), expected_rows) << explain_out;
  double worst = 0.0;
  for (const PrintedRow& r : rows) {
    ASSERT_EQ(static_cast<std::int64_t>(r.values.size()), dv)
        << "query " << r.row << ", head " << r.head << "\n"
        << explain_out;
    for (std::int64_t c = 0; c < dv; ++c) {
      const double want = o.data_as<double>()[(batch * n + r.row) * width + r.head * dv + c];
      worst = std::max(worst, std::abs(r.values[static_cast<std::size_t>(c)] - want));
    }
  }
  EXPECT_LE(worst, kPrinted) << explain_out;
}

// max |a - b| of two outputs of the same shape: how much a flag changes the result.
double output_change(const Tensor& a, const Tensor& b) {
  return testing::max_abs_diff(a.to(DType::kF64).view(), b.to(DType::kF64).view());
}

void expect_clean_failure(const fs::path& dir, const std::vector<std::string>& args,
                          const std::string& names) {
  const std::vector<std::string> before = testing::files_in(dir);
  const CommandRun run = qkv_run(dir, args);
  EXPECT_GE(run.status, 1) << run.out;
  EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
  EXPECT_NE(run.err.find(names), std::string::npos) << run.err;
  EXPECT_EQ(testing::files_in(dir), before);
}

// X [6, 8], 2 heads of dk = dv = 3 (GPT-2's layout: one fused [d, 3·H·dk] c_attn and its bias).
class ExplainParity : public ::testing::Test {
 protected:
  static constexpr std::int64_t kN = 6, kD = 8, kHeads = 2, kDk = 3;
  static constexpr std::int64_t kWidth = (kHeads + 2 * kHeads) * kDk;
  const std::string all_rows = "0,1,2,3,4,5";
  void SetUp() override {
    save(dir_, "x.npy", random_f64({kN, kD}, 31));
    save(dir_, "wqkv.npy", random_f64({kD, kWidth}, 32));
    save(dir_, "bqkv.npy", random_f64({kWidth}, 33));
  }
  Tensor layer(const std::vector<std::string>& flags, const std::string& out = "o.npy") {
    const CommandRun run =
        qkv_run(dir_.path(), concat({"layer", "--out-dtype", "f64", "--out", out}, flags));
    EXPECT_EQ(run.status, 0) << run.err;
    return read_npy(dir_ / out);
  }
  std::string explain(const std::vector<std::string>& flags) {
    const CommandRun run = qkv_run(dir_.path(), concat({"explain", "--row", all_rows}, flags));
    EXPECT_EQ(run.status, 0) << run.err;
    return run.out;
  }
  testing::ScratchDir dir_;
};

TEST_F(ExplainParity, FusedWeightAndBiasGiveTheLayersRows) {
  const std::vector<std::string> flags = {"--x",      "x.npy",   "--wqkv", "wqkv.npy", "--bqkv",
                                          "bqkv.npy", "--heads", "2",      "--causal"};
  const Tensor o = layer(flags);
  EXPECT_GT(
      output_change(o, layer({"--x", "x.npy", "--wqkv", "wqkv.npy", "--heads", "2", "--causal"},
                             "nobias.npy")),
      1e-2)
      << "the bias must matter on these inputs";
  expect_same_outputs(explain(flags), o, kDk, 0, kN * kHeads);
}

// Grouped heads: H = 2 query heads over Hkv = 1, the fused width (H + 2·Hkv)·dk = 12.
TEST_F(ExplainParity, FusedWeightWithGroupedHeads) {
  save(dir_, "wqkv_gqa.npy", random_f64({kD, 4 * kDk}, 34));
  const std::vector<std::string> flags = {"--x",     "x.npy", "--wqkv",     "wqkv_gqa.npy",
                                          "--heads", "2",     "--kv-heads", "1"};
  expect_same_outputs(explain(flags), layer(flags), kDk, 0, kN * kHeads);
}

// nn.Linear weights [out, in] in a .safetensors file, transposed on load by --linear-layout.
TEST_F(ExplainParity, LinearLayoutFromSafetensors) {
  const Tensor wq = random_f64({kD, kHeads * kDk}, 35), wk = random_f64({kD, kHeads * kDk}, 36),
               wv = random_f64({kD, kHeads * kDk}, 37), bq = random_f64({kHeads * kDk}, 38);
  testing::write_bytes(
      dir_ / "m.safetensors",
      testing::safetensors_bytes({testing::safetensors_item("attn.q.weight", transposed(wq), "F64"),
                                  testing::safetensors_item("attn.k.weight", transposed(wk), "F64"),
                                  testing::safetensors_item("attn.v.weight", transposed(wv), "F64"),
                                  testing::safetensors_item("attn.q.bias", bq, "F64")}));
  const std::vector<std::string> flags = {"--x",
                                          "x.npy",
                                          "--wq",
                                          "m.safetensors:attn.q.weight",
                                          "--wk",
                                          "m.safetensors:attn.k.weight",
                                          "--wv",
                                          "m.safetensors:attn.v.weight",
                                          "--bq",
                                          "m.safetensors:attn.q.bias",
                                          "--linear-layout",
                                          "--heads",
                                          "2"};
  const Tensor o = layer(flags);
  // The same weights in the X·W layout, as .npy files, without --linear-layout: the same O.
  save(dir_, "wq.npy", wq);
  save(dir_, "wk.npy", wk);
  save(dir_, "wv.npy", wv);
  save(dir_, "bq.npy", bq);
  const Tensor plain = layer({"--x", "x.npy", "--wq", "wq.npy", "--wk", "wk.npy", "--wv", "wv.npy",
                              "--bq", "bq.npy", "--heads", "2"},
                             "plain.npy");
  EXPECT_LE(output_change(o, plain), 1e-12) << "qkv layer's --linear-layout is the transpose";
  expect_same_outputs(explain(flags), o, kDk, 0, kN * kHeads);
}

// A fused weight stored [(H + 2·Hkv)·dk, d] (nn.Linear) with --linear-layout.
TEST_F(ExplainParity, FusedLinearLayout) {
  save(dir_, "wqkv_t.npy", transposed(read_npy(dir_ / "wqkv.npy")));
  const std::vector<std::string> flags = {"--x",    "x.npy",    "--wqkv",          "wqkv_t.npy",
                                          "--bqkv", "bqkv.npy", "--linear-layout", "--heads",
                                          "2"};
  const Tensor o = layer(flags);
  EXPECT_LE(output_change(o, layer({"--x", "x.npy", "--wqkv", "wqkv.npy", "--bqkv", "bqkv.npy",
                                    "--heads", "2"},
                                   "plain.npy")),
            1e-12);
  expect_same_outputs(explain(flags), o, kDk, 0, kN * kHeads);
}

// The layer output line (--wo, --bo) equals qkv layer's --out with the same projection.
TEST_F(ExplainParity, LayerOutputLineWithOutputProjection) {
  save(dir_, "wo.npy", random_f64({kHeads * kDk, 5}, 39));
  save(dir_, "bo.npy", random_f64({5}, 40));
  const std::vector<std::string> flags = {"--x",    "x.npy", "--wqkv", "wqkv.npy", "--wo",
                                          "wo.npy", "--bo",  "bo.npy", "--heads",  "2"};
  const Tensor o = layer(flags).to(DType::kF64);
  const std::string out = explain(flags);
  static const std::regex line("layer output for query ([0-9]+)[^\\n]*");
  int seen = 0;
  double worst = 0.0;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), line); it != std::sregex_iterator();
       ++it) {
    const std::int64_t row = std::stoll((*it)[1].str());
    const std::vector<double> values = bracket_values(it->str());
    ASSERT_EQ(values.size(), 5u) << it->str();
    for (std::int64_t c = 0; c < 5; ++c) {
      worst = std::max(
          worst, std::abs(values[static_cast<std::size_t>(c)] - o.data_as<double>()[row * 5 + c]));
    }
    ++seen;
  }
  EXPECT_EQ(seen, kN) << out;
  EXPECT_LE(worst, kPrinted) << out;
}

// Batched X [2, 5, 8]: --batch 1 walks through the second element and says so.
TEST_F(ExplainParity, BatchElementOfABatchedInput) {
  save(dir_, "xb.npy", random_f64({2, 5, kD}, 41));
  const std::vector<std::string> flags = {"--x",     "xb.npy", "--wqkv",  "wqkv.npy",
                                          "--heads", "2",      "--causal"};
  const Tensor o = layer(flags);
  const CommandRun one =
      qkv_run(dir_.path(), concat({"explain", "--row", "0,1,2,3,4", "--batch", "1"}, flags));
  ASSERT_EQ(one.status, 0) << one.err;
  EXPECT_NE(one.out.find("batch element 1 of 2"), std::string::npos) << one.out;
  expect_same_outputs(one.out, o, kDk, 1, 5 * kHeads);
  const CommandRun zero = qkv_run(dir_.path(), concat({"explain", "--row", "0,1,2,3,4"}, flags));
  ASSERT_EQ(zero.status, 0) << zero.err;
  EXPECT_NE(zero.out.find("batch element 0 of 2"), std::string::npos) << zero.out;
  expect_same_outputs(zero.out, o, kDk, 0, 5 * kHeads);
  expect_clean_failure(
      dir_.path(), concat({"explain", "--batch", "2", "--html", "page.html"}, flags), "--batch");
}

// Cross-attention: K and V from a memory of 9 rows, with grouped heads and biases.
TEST_F(ExplainParity, MemoryGivesTheLayersRows) {
  save(dir_, "m.npy", random_f64({9, 5}, 50));
  save(dir_, "wq.npy", random_f64({kD, 2 * kDk}, 51));
  save(dir_, "wk.npy", random_f64({5, kDk}, 52));
  save(dir_, "wv.npy", random_f64({5, kDk}, 53));
  save(dir_, "bk.npy", random_f64({kDk}, 54));
  const std::vector<std::string> flags = {
      "--x",  "x.npy",  "--memory", "m.npy",  "--wq",    "wq.npy", "--wk",       "wk.npy",
      "--wv", "wv.npy", "--bk",     "bk.npy", "--heads", "2",      "--kv-heads", "1"};
  expect_same_outputs(explain(flags), layer(flags), kDk, 0, kN * kHeads);
}

// Q, K and V rounded to bfloat16 (--dtype), and the score modifiers (softcap, ALiBi, sinks)
// with a window: explain shows what the layer computes with the same flags.
TEST_F(ExplainParity, StorageTypeAndScoreModifiers) {
  save(dir_, "s.npy", random_f64({kHeads}, 55));
  const std::vector<std::string> flags = {
      "--x",  "x.npy",     "--wqkv", "wqkv.npy", "--bqkv",  "bqkv.npy", "--heads",  "2",  "--dtype",
      "bf16", "--softcap", "3",      "--alibi",  "--sinks", "s.npy",    "--window", "2,1"};
  const Tensor o = layer(flags);
  EXPECT_GT(output_change(
                o, layer({"--x", "x.npy", "--wqkv", "wqkv.npy", "--bqkv", "bqkv.npy", "--heads",
                          "2", "--softcap", "3", "--alibi", "--sinks", "s.npy", "--window", "2,1"},
                         "f64.npy")),
            1e-4)
      << "bfloat16 rounding must matter on these inputs";
  expect_same_outputs(explain(flags), o, kDk, 0, kN * kHeads);
}

// The attention form: Q, K, V files with a causal rule, against qkv attention --out.
TEST_F(ExplainParity, AttentionFormGivesAttentionsRows) {
  save(dir_, "q.npy", random_f64({2, 7, 4}, 42));
  save(dir_, "k.npy", random_f64({2, 9, 4}, 43));
  save(dir_, "v.npy", random_f64({2, 9, 3}, 44));
  const std::vector<std::string> flags = {"--q", "q.npy", "--k",     "k.npy",
                                          "--v", "v.npy", "--causal"};
  const CommandRun att =
      qkv_run(dir_.path(), concat({"attention", "--out-dtype", "f64", "--out", "oa.npy"}, flags));
  ASSERT_EQ(att.status, 0) << att.err;
  // qkv attention writes [H, N, dv]; as one [N, H·dv] block per head it is the layer's layout.
  const Tensor oa = read_npy(dir_ / "oa.npy").to(DType::kF64);
  Tensor o(DType::kF64, {7, 6}, "o");
  for (std::int64_t h = 0; h < 2; ++h) {
    for (std::int64_t i = 0; i < 7; ++i) {
      for (std::int64_t c = 0; c < 3; ++c) {
        o.data_as<double>()[i * 6 + h * 3 + c] = oa.data_as<double>()[(h * 7 + i) * 3 + c];
      }
    }
  }
  const CommandRun run = qkv_run(dir_.path(), concat({"explain", "--row", "0,1,2,3,4,5,6"}, flags));
  ASSERT_EQ(run.status, 0) << run.err;
  expect_same_outputs(run.out, o, 3, 0, 7 * 2);
}

TEST_F(ExplainParity, LayerFormNeedsHeads) {
  save(dir_, "w.npy", random_f64({kD, kD}, 45));
  expect_clean_failure(dir_.path(),
                       {"explain", "--x", "x.npy", "--wq", "w.npy", "--wk", "w.npy", "--wv",
                        "w.npy", "--html", "page.html"},
                       "--heads");
  expect_clean_failure(dir_.path(),
                       {"explain", "--x", "x.npy", "--wqkv", "wqkv.npy", "--html", "page.html"},
                       "--heads");
}

// Weight flags refused as qkv layer refuses them, and layer-only flags refused for Q, K, V
// files and the built-in example: one line naming the flag or file, nothing written.
TEST_F(ExplainParity, WeightFlagsRefusedAsTheLayerRefusesThem) {
  save(dir_, "w.npy", random_f64({kD, kHeads * kDk}, 56));
  save(dir_, "q.npy", random_f64({5, 4}, 57));
  const std::vector<std::string> html = {"--html", "page.html"};
  expect_clean_failure(
      dir_.path(),
      concat({"explain", "--x", "x.npy", "--wqkv", "wqkv.npy", "--wq", "w.npy", "--heads", "2"},
             html),
      "--wqkv");
  expect_clean_failure(dir_.path(),
                       concat({"explain", "--x", "x.npy", "--wqkv", "wqkv.npy", "--bqkv",
                               "bqkv.npy", "--bq", "bqkv.npy", "--heads", "2"},
                              html),
                       "--bqkv");
  // 18 columns do not split into 4 + 2 x 4 heads.
  expect_clean_failure(
      dir_.path(), concat({"explain", "--x", "x.npy", "--wqkv", "wqkv.npy", "--heads", "4"}, html),
      "wqkv.npy");
  expect_clean_failure(
      dir_.path(),
      concat({"explain", "--x", "x.npy", "--wq", "w.npy", "--wk", "w.npy", "--heads", "2"}, html),
      "--wv");
  expect_clean_failure(
      dir_.path(),
      concat({"explain", "--q", "q.npy", "--k", "q.npy", "--v", "q.npy", "--linear-layout"}, html),
      "--linear-layout");
  expect_clean_failure(dir_.path(), concat({"explain", "--linear-layout"}, html),
                       "--linear-layout");
}

// --quiet: the page (or SVG) is written; stdout holds no walk-through, at most "wrote FILE".
TEST_F(ExplainParity, QuietWritesThePageOnly) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"explain", "--quiet", "--html", "page.html"},
        std::vector<std::string>{"explain", "--quiet", "--x", "x.npy", "--wqkv", "wqkv.npy",
                                 "--heads", "2", "--svg", "map.svg"}}) {
    const CommandRun run = qkv_run(dir_.path(), args);
    ASSERT_EQ(run.status, 0) << run.err;
    EXPECT_TRUE(run.err.empty()) << run.err;
    EXPECT_EQ(run.out.find("── query"), std::string::npos) << run.out;
    std::size_t start = 0;
    while (start < run.out.size()) {
      const std::size_t end = std::min(run.out.find('\n', start), run.out.size());
      EXPECT_EQ(run.out.compare(start, 6, "wrote "), 0) << run.out;
      start = end + 1;
    }
  }
  EXPECT_NE(testing::slurp(dir_ / "page.html").find("</html>"), std::string::npos);
  EXPECT_NE(testing::slurp(dir_ / "map.svg").find("</svg>"), std::string::npos);
  // --quiet with nothing to write would do nothing at all: refused, naming the flag.
  expect_clean_failure(dir_.path(), {"explain", "--quiet"}, "--quiet");
}

// Coordinate labels: one per line, d of them for queries/keys and dv for values. The right
// counts are used (the walk-through names the coordinates); a wrong count is one line naming
// the file, and nothing is written.
class CoordinateLabels : public ExplainParity {
 protected:
  void SetUp() override {
    save(dir_, "q.npy", random_f64({5, 4}, 46));
    save(dir_, "k.npy", random_f64({6, 4}, 47));
    save(dir_, "v.npy", random_f64({6, 3}, 48));
    std::ofstream(dir_ / "d4.txt") << "alpha-coord\nbeta-coord\ngamma-coord\ndelta-coord\n";
    std::ofstream(dir_ / "d3.txt") << "alpha\nbeta\ngamma\n";
    std::ofstream(dir_ / "dv3.txt") << "thrill-coord\nlaughs-coord\ntears-coord\n";
    std::ofstream(dir_ / "dv4.txt") << "a\nb\nc\nd\n";
  }
  const std::vector<std::string> inputs = {"explain", "--q",   "q.npy", "--k", "k.npy",
                                           "--v",     "v.npy", "--row", "1"};
  const std::vector<std::string> labels = {"alpha-coord", "delta-coord", "thrill-coord",
                                           "tears-coord"};
};

TEST_F(CoordinateLabels, WalkThroughNamesTheCoordinates) {
  const CommandRun ok =
      qkv_run(dir_.path(), concat(inputs, {"--labels-d", "d4.txt", "--labels-dv", "dv3.txt"}));
  ASSERT_EQ(ok.status, 0) << ok.err;
  for (const std::string& label : labels) {
    EXPECT_NE(ok.out.find(label), std::string::npos) << label << "\n" << ok.out;
  }
}

TEST_F(CoordinateLabels, WrongCountIsOneLineNamingTheFile) {
  expect_clean_failure(dir_.path(), concat(inputs, {"--labels-d", "d3.txt", "--html", "bad.html"}),
                       "d3.txt");
  expect_clean_failure(dir_.path(),
                       concat(inputs, {"--labels-dv", "dv4.txt", "--html", "bad.html"}), "dv4.txt");
  expect_clean_failure(dir_.path(), concat(inputs, {"--labels-d", "dv3.txt", "--svg", "bad.svg"}),
                       "dv3.txt");
}

// The page carries the labels too (its vector tables' column headers).
TEST_F(CoordinateLabels, PageCarriesTheLabels) {
  const CommandRun ok =
      qkv_run(dir_.path(), concat(inputs, {"--labels-d", "d4.txt", "--labels-dv", "dv3.txt",
                                           "--quiet", "--html", "ok.html"}));
  ASSERT_EQ(ok.status, 0) << ok.err;
  const std::string page = testing::slurp(dir_ / "ok.html");
  for (const std::string& label : labels) {
    EXPECT_NE(page.find(label), std::string::npos) << label;
  }
}

}  // namespace
}  // namespace qkv
