// What a new user meets first: an output is written in the format its extension names (or
// refused before anything is read), a 3-D query that reads two ways is refused with a line
// naming both unless --layout says which, a misspelt flag or command gets the closest one, and
// qkv explain on a large input prints a screenful with a pointer to --row and the page.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "qkv/io.h"
#include "support/command_runner.h"
#include "support/test_support.h"

namespace qkv {
namespace {

using testing::CommandRun;
using testing::files_in;

class CliUsability : public ::testing::Test {
 protected:
  void save(const std::string& name, const Tensor& t) {
    write_npy(dir_.path() / name, t.view(), t.dtype());
  }
  CommandRun run(const std::vector<std::string>& args) {
    return testing::run_program(QKV_CLI_PATH, dir_.path(), args, 120);
  }
  CommandRun ok(const std::vector<std::string>& args) {
    CommandRun r = run(args);
    EXPECT_EQ(r.status, 0) << r.err;
    return r;
  }
  Tensor npy(const std::string& name) { return read_npy(dir_.path() / name); }

  testing::ScratchDir dir_;
};

// [.., A, B, D] -> [.., B, A, D], contiguous.
Tensor swap_dims(const Tensor& t) {
  TensorView view = t.view();
  const std::size_t a = view.shape.size() - 3;
  std::swap(view.shape[a], view.shape[a + 1]);
  std::swap(view.strides[a], view.strides[a + 1]);
  return contiguous_copy(view, t.dtype());
}

void expect_same(const TensorView& a, const TensorView& b, const std::string& what) {
  ASSERT_EQ(a.shape, b.shape) << what;
  EXPECT_EQ(testing::max_abs_diff(a, b), 0.0) << what;
}

TEST_F(CliUsability, AnOutputIsWrittenInTheFormatItsExtensionNames) {
  save("q.npy", testing::random_tensor(DType::kF32, {2, 5, 8}, 1));
  save("k.npy", testing::random_tensor(DType::kF32, {2, 6, 8}, 2));
  save("v.npy", testing::random_tensor(DType::kF32, {2, 6, 3}, 3));
  const std::vector<std::string> in = {"attention", "--q", "q.npy", "--k", "k.npy", "--v",
                                       "v.npy",     "--causal"};
  const auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> args = in;
    args.insert(args.end(), more.begin(), more.end());
    return args;
  };
  ok(with({"--out", "o.npy", "--lse", "l.npy"}));
  const Tensor out = npy("o.npy");
  const Tensor lse = npy("l.npy");

  // One archive for both outputs, each array named after its flag (np.load(path)["out"]).
  ok(with({"--out", "r.npz", "--lse", "r.npz"}));
  EXPECT_EQ(list_npz(dir_.path() / "r.npz"), (std::vector<std::string>{"out", "lse"}));
  expect_same(read_npz_tensor(dir_.path() / "r.npz", "out").view(), out.view(), "r.npz:out");
  expect_same(read_npz_tensor(dir_.path() / "r.npz", "lse").view(), lse.view(), "r.npz:lse");
  ok(with({"--out", "O.NPZ"}));
  EXPECT_EQ(list_npz(dir_.path() / "O.NPZ"), std::vector<std::string>{"out"});

  // safetensors, in --out-dtype (f64 here), and a name without an extension as .npy.
  ok(with({"--out", "o.safetensors", "--lse", "l", "--out-dtype", "f64"}));
  const Tensor st = read_safetensors_tensor(dir_.path() / "o.safetensors", "out");
  EXPECT_EQ(st.dtype(), DType::kF64);
  expect_same(contiguous_copy(st.view(), DType::kF32).view(), out.view(), "o.safetensors:out");
  expect_same(contiguous_copy(npy("l").view(), DType::kF32).view(), lse.view(), "l (no extension)");

  // Another extension: refused by the parser, before anything is read or written.
  const std::vector<std::string> before = files_in(dir_.path());
  for (const auto& [flag, path] : std::vector<std::pair<std::string, std::string>>{
           {"--out", "o.txt"}, {"--lse", "l.npy.gz"}, {"--weights", "w.pt"}}) {
    std::vector<std::string> args = with({"--out", "o.npy"});
    if (flag == "--out") args.back() = path;
    else args.insert(args.end(), {flag, path});
    const CommandRun r = run(args);
    EXPECT_EQ(r.status, 2) << r.err;
    EXPECT_EQ(r.err, "qkv attention: " + flag + ": '" + path +
                         "' has no output format; name it .npy, .npz or .safetensors (see 'qkv "
                         "attention --help')\n");
  }
  EXPECT_EQ(files_in(dir_.path()), before);
}

TEST_F(CliUsability, LayerAndGradientOutputsFollowTheirExtensionsToo) {
  save("x.npy", testing::random_tensor(DType::kF32, {5, 8}, 4));
  save("w.npy", testing::random_tensor(DType::kF32, {8, 8}, 5));
  save("dy.npy", testing::random_tensor(DType::kF32, {5, 8}, 6));
  const std::vector<std::string> layer = {"layer", "--x",  "x.npy", "--wq", "w.npy", "--wk",
                                          "w.npy", "--wv", "w.npy", "--heads", "2", "--grad-out",
                                          "dy.npy"};
  auto args = layer;
  args.insert(args.end(), {"--out", "o.npy", "--grad-x", "dx.npy"});
  ok(args);
  args = layer;
  args.insert(args.end(), {"--out", "g.npz", "--grad-x", "g.npz", "--grad-wq", "g.npz"});
  ok(args);
  EXPECT_EQ(list_npz(dir_.path() / "g.npz"),
            (std::vector<std::string>{"out", "grad-x", "grad-wq"}));
  expect_same(read_npz_tensor(dir_.path() / "g.npz", "grad-x").view(), npy("dx.npy").view(),
              "g.npz:grad-x");
  expect_same(read_npz_tensor(dir_.path() / "g.npz", "out").view(), npy("o.npy").view(),
              "g.npz:out");
}

TEST_F(CliUsability, AQueryThatReadsTwoWaysIsRefusedUnlessLayoutSaysWhich) {
  // [N, H, D] = [8, 4, 16] queries against [Nk, Hkv, D] = [8, 2, 16] keys (grouped heads, as
  // transformers keeps them): heads first, this is 8 heads of 4 rows against 2 keys, which ran
  // without a word.
  const Tensor q = testing::random_tensor(DType::kF32, {8, 4, 16}, 7);
  const Tensor k = testing::random_tensor(DType::kF32, {8, 2, 16}, 8);
  const Tensor v = testing::random_tensor(DType::kF32, {8, 2, 8}, 9);
  const Tensor dout = testing::random_tensor(DType::kF32, {8, 4, 8}, 10);
  save("q.npy", q);
  save("k.npy", k);
  save("v.npy", v);
  save("do.npy", dout);
  const std::vector<std::string> in = {"attention", "--q", "q.npy", "--k", "k.npy", "--v",
                                       "v.npy"};
  auto args = in;
  args.insert(args.end(), {"--out", "o.npy"});
  const CommandRun refused = run(args);
  EXPECT_EQ(refused.status, 1);
  EXPECT_EQ(refused.err,
            "--q: [8, 4, 16] against K [8, 2, 16] reads two ways: [H, N, D] (H 8, Nq 4, Hkv 8, "
            "Nk 2) or [N, H, D] (Nq 8, H 4, Nk 8, Hkv 2); say which with --layout bhnd (heads "
            "first) or --layout bnhd (tokens first)\n");
  EXPECT_FALSE(std::filesystem::exists(dir_.path() / "o.npy"));
  save("q6.npy", testing::random_tensor(DType::kF32, {6, 4, 16}, 14));
  const CommandRun unfit =
      run({"attention", "--q", "q6.npy", "--k", "k.npy", "--v", "v.npy", "--out", "o.npy"});
  EXPECT_EQ(unfit.status, 1);
  EXPECT_EQ(unfit.err,
            "--q: [6, 4, 16] against K [8, 2, 16] does not fit as [H, N, D] (H 6, Hkv 8) but "
            "does as [N, H, D] (Nq 6, H 4, Nk 8, Hkv 2); say which with --layout bhnd (heads "
            "first) or --layout bnhd (tokens first)\n");
  auto explain = std::vector<std::string>{"explain", "--q", "q.npy", "--k", "k.npy", "--v",
                                          "v.npy", "--svg", "h.svg"};
  EXPECT_EQ(run(explain).status, 1);

  // --layout bhnd: as before. --layout bnhd: the same as the heads-first files, transposed.
  args = in;
  args.insert(args.end(), {"--out", "o_bhnd.npy", "--layout", "bhnd"});
  ok(args);
  EXPECT_EQ(npy("o_bhnd.npy").shape(), (Shape{8, 4, 8}));
  save("qt.npy", swap_dims(q));
  save("kt.npy", swap_dims(k));
  save("vt.npy", swap_dims(v));
  save("dot.npy", swap_dims(dout));
  ok({"attention", "--q", "qt.npy", "--k", "kt.npy", "--v", "vt.npy", "--causal", "--out",
      "ot.npy", "--lse", "lt.npy", "--grad-out", "dot.npy", "--grad-q", "dqt.npy", "--grad-k",
      "dkt.npy", "--layout", "bhnd"});
  args = in;
  args.insert(args.end(), {"--layout", "bnhd", "--causal", "--out", "o.npy", "--lse", "l.npy",
                           "--grad-out", "do.npy", "--grad-q", "dq.npy", "--grad-k", "dk.npy"});
  ok(args);
  expect_same(npy("o.npy").view(), swap_dims(npy("ot.npy")).view(), "out in [N, H, Dv]");
  expect_same(npy("l.npy").view(), npy("lt.npy").view(), "lse stays [H, N]");
  expect_same(npy("dq.npy").view(), swap_dims(npy("dqt.npy")).view(), "dQ in Q's layout");
  expect_same(npy("dk.npy").view(), swap_dims(npy("dkt.npy")).view(), "dK in K's layout");
  explain.insert(explain.end(), {"--layout", "bnhd", "--row", "1"});
  ok(explain);

  // Heads first with Nq = Nk (self-attention, grouped or not) is read so, as it always was;
  // so are K/V that only heads first fits.
  ok({"attention", "--q", "q.npy", "--k", "q.npy", "--v", "q.npy", "--out", "same.npy"});
  save("k1.npy", testing::random_tensor(DType::kF32, {2, 4, 16}, 15));
  ok({"attention", "--q", "q.npy", "--k", "k1.npy", "--v", "k1.npy", "--out", "mqa.npy"});
  save("k5.npy", testing::random_tensor(DType::kF32, {2, 5, 16}, 11));
  ok({"attention", "--q", "q.npy", "--k", "k5.npy", "--v", "k5.npy", "--out", "gqa.npy"});
  const CommandRun bad_word = run({"attention", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy",
                                   "--out", "o.npy", "--layout", "nhd"});
  EXPECT_EQ(bad_word.status, 2);
  EXPECT_NE(bad_word.err.find("--layout"), std::string::npos) << bad_word.err;
}

TEST_F(CliUsability, AMisspeltFlagOrCommandGetsTheClosestOne) {
  save("q.npy", testing::random_tensor(DType::kF32, {5, 8}, 1));
  const CommandRun casual = run(
      {"attention", "--q", "q.npy", "--k", "q.npy", "--v", "q.npy", "--casual", "--out", "o.npy"});
  EXPECT_EQ(casual.status, 2);
  EXPECT_EQ(casual.err,
            "qkv attention: unknown option --casual; did you mean --causal? (see 'qkv attention "
            "--help')\n");
  const CommandRun brief = run({"explain", "--breif"});
  EXPECT_EQ(brief.err,
            "qkv explain: unknown option --breif; did you mean --brief? (see 'qkv explain "
            "--help')\n");
  const CommandRun command = run({"atention", "--q", "q.npy"});
  EXPECT_EQ(command.status, 2);
  EXPECT_EQ(command.err,
            "qkv: unknown command 'atention'; did you mean 'attention'? (commands: attention, "
            "layer, explain, bench, decode, train)\n");
  // Nothing close: no guess.
  const CommandRun far = run({"explain", "--frobnicate"});
  EXPECT_EQ(far.err, "qkv explain: unknown option --frobnicate (see 'qkv explain --help')\n");
  EXPECT_EQ(run({"zzz"}).err,
            "qkv: unknown command 'zzz' (commands: attention, layer, explain, bench, decode, "
            "train)\n");
}

std::size_t lines(const std::string& text) {
  return static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n'));
}

TEST_F(CliUsability, ExplainOnALargeInputFitsAScreenAndPointsAtRowAndThePage) {
  save("q.npy", testing::random_tensor(DType::kF32, {4, 300, 16}, 12));
  save("small.npy", testing::random_tensor(DType::kF32, {4, 40, 16}, 13));
  const std::vector<std::string> large = {"explain", "--q", "q.npy", "--k", "q.npy", "--v",
                                          "q.npy", "--causal"};
  const CommandRun r = ok(large);
  EXPECT_LE(lines(r.out), 40u) << r.out;
  EXPECT_EQ(r.out.find("── query "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("The walk-through is left out (300 query rows): --row 3,7 walks through "
                       "chosen rows;\n--html page.html writes a page that shows every row.\n"),
            std::string::npos)
      << r.out;
  auto with_page = large;
  with_page.insert(with_page.end(), {"--html", "p.html"});
  EXPECT_NE(ok(with_page).out.find(";\nthe page p.html shows every row.\n"), std::string::npos);

  // Rows asked for are walked through, by --row or --rows.
  for (const char* flag : {"--row", "--rows"}) {
    auto rows = large;
    rows.insert(rows.end(), {flag, "3", "--head", "1"});
    const CommandRun walked = ok(rows);
    EXPECT_NE(walked.out.find("── query 3"), std::string::npos) << flag;
    EXPECT_EQ(walked.out.find("The walk-through is left out"), std::string::npos) << flag;
  }
  // A small input keeps its walk-through unless --brief; --brief with --row is refused.
  const std::vector<std::string> small = {"explain", "--q", "small.npy", "--k", "small.npy",
                                          "--v", "small.npy"};
  EXPECT_NE(ok(small).out.find("── query "), std::string::npos);
  auto brief = small;
  brief.push_back("--brief");
  const CommandRun short_one = ok(brief);
  EXPECT_EQ(short_one.out.find("── query "), std::string::npos);
  EXPECT_NE(short_one.out.find("(40 query rows, --brief)"), std::string::npos) << short_one.out;
  brief.insert(brief.end(), {"--row", "1"});
  const CommandRun both = run(brief);
  EXPECT_EQ(both.status, 1);
  EXPECT_EQ(both.err, "--brief: leaves out the walk-through that --row asks for\n");
}

}  // namespace
}  // namespace qkv
