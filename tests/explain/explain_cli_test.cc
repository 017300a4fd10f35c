// `qkv explain` end to end: the golden walk-through of the built-in example, inputs in both
// forms, the page and SVG files, and bad input (one stderr line naming the file, no output).
//
// The golden file is tests/explain/builtin_walk_through.golden; after an intended change of
// the text, regenerate it with QKV_UPDATE_GOLDEN=1 ./test_explain and review the diff.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "qkv/io.h"
#include "qkv/layer.h"
#include "support/command_runner.h"
#include "support/test_support.h"

namespace qkv {
namespace {

namespace fs = std::filesystem;

using testing::CommandRun;

CommandRun qkv(const fs::path& dir, const std::vector<std::string>& args) {
  return testing::run_program(QKV_CLI_PATH, dir, args);
}

void expect_clean_failure(const fs::path& dir, const std::vector<std::string>& args,
                          const std::string& names) {
  const std::vector<std::string> before = testing::files_in(dir);
  const CommandRun run = qkv(dir, args);
  EXPECT_GE(run.status, 1);
  EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
  EXPECT_NE(run.err.find(names), std::string::npos) << run.err;
  EXPECT_EQ(testing::files_in(dir), before);
}

TEST(ExplainCli, BuiltinExampleMatchesTheGolden) {
  testing::ScratchDir dir;
  const CommandRun run = qkv(dir.path(), {"explain"});
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_TRUE(run.err.empty()) << run.err;
  const fs::path golden = fs::path(QKV_GOLDEN_DIR) / "builtin_walk_through.golden";
  if (std::getenv("QKV_UPDATE_GOLDEN") != nullptr) {
    std::ofstream(golden, std::ios::binary) << run.out;
  }
  EXPECT_EQ(run.out, testing::slurp(golden)) << "regenerate with QKV_UPDATE_GOLDEN=1 after review";
}

TEST(ExplainCli, WritesThePageAndTheSvg) {
  testing::ScratchDir dir;
  const CommandRun run = qkv(dir.path(), {"explain", "--html", "page.html", "--svg", "map.svg"});
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_NE(run.out.find("wrote page.html"), std::string::npos);
  const std::string page = testing::slurp(dir / "page.html");
  EXPECT_NE(page.find("id=\"qkv-data\""), std::string::npos);
  EXPECT_NE(testing::slurp(dir / "map.svg").find("</svg>"), std::string::npos);
}

class ExplainFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    write_npy(dir_ / "q.npy", testing::random_tensor(DType::kF32, {2, 20, 8}, 1).view(),
              DType::kF32);
    write_npy(dir_ / "k.npy", testing::random_tensor(DType::kF32, {2, 30, 8}, 2).view(),
              DType::kF32);
    write_npy(dir_ / "v.npy", testing::random_tensor(DType::kF32, {2, 30, 4}, 3).view(),
              DType::kF32);
    std::ofstream labels(dir_ / "keys.txt");
    for (int j = 0; j < 30; ++j) labels << "key-" << j << "\n";
  }
  testing::ScratchDir dir_;
};

TEST_F(ExplainFiles, WalksThroughChosenRowsWithLabels) {
  const CommandRun run =
      qkv(dir_.path(), {"explain", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--causal",
                        "--row", "3,19", "--labels-k", "keys.txt"});
  ASSERT_EQ(run.status, 0) << run.err;
  for (const char* expected : {"── query 3 \"3\", head 0 ──", "── query 19 \"19\", head 1 ──",
                               "masking: causal", "key-13", "(22 more allowed keys)"}) {
    EXPECT_NE(run.out.find(expected), std::string::npos) << expected << "\n" << run.out;
  }
  // Causal with 10 more keys than queries: row 3 sees keys 0..13 only.
  EXPECT_NE(run.out.find("of 14 allowed"), std::string::npos);
}

// The walk-through shows each modifier in its step: the capped score, the ALiBi term, the
// sink's share; the page is written with them; a packed batch and the built-in example refuse.
TEST_F(ExplainFiles, ShowsTheScoreModifiersInTheirSteps) {
  write_npy(dir_ / "s.npy", testing::random_tensor(DType::kF32, {2}, 9).view(), DType::kF32);
  const CommandRun run =
      qkv(dir_.path(), {"explain", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--causal",
                        "--softcap", "3", "--alibi", "--sinks", "s.npy", "--dtype", "bf16",
                        "--row", "4", "--html", "page.html"});
  ASSERT_EQ(run.status, 0) << run.err;
  for (const char* expected : {"score modifiers: softcap 3; ALiBi slopes [0.0625, 0.00390625]",
                               "Q, K, V rounded to bfloat16", "3·tanh(", "capped", "ALiBi",
                               "the sink (a logit of"}) {
    EXPECT_NE(run.out.find(expected), std::string::npos) << expected << "\n" << run.out;
  }
  EXPECT_EQ(run.out.find("-0.0000"), std::string::npos) << run.out;
  EXPECT_NE(testing::slurp(dir_.path() / "page.html").find("\"softcap\":3"), std::string::npos);
  const CommandRun builtin = qkv(dir_.path(), {"explain", "--softcap", "3"});
  EXPECT_NE(builtin.status, 0);
  EXPECT_NE(builtin.err.find("--softcap"), std::string::npos) << builtin.err;
  const CommandRun packed = qkv(dir_.path(), {"explain", "--q", "q.npy", "--k", "k.npy", "--v",
                                              "v.npy", "--cu-seqlens-q", "q.npy"});
  EXPECT_NE(packed.status, 0);
  EXPECT_NE(packed.err.find("--cu-seqlens-q"), std::string::npos) << packed.err;
}

TEST_F(ExplainFiles, LayerFormShowsTheProjectionAndTheLayerOutput) {
  write_npy(dir_ / "x.npy", testing::random_tensor(DType::kF64, {6, 5}, 4).view(), DType::kF64);
  write_npy(dir_ / "wq.npy", testing::random_tensor(DType::kF64, {5, 4}, 5).view(), DType::kF64);
  write_npy(dir_ / "wk.npy", testing::random_tensor(DType::kF64, {5, 4}, 6).view(), DType::kF64);
  write_npy(dir_ / "wv.npy", testing::random_tensor(DType::kF64, {5, 6}, 7).view(), DType::kF64);
  write_npy(dir_ / "wo.npy", testing::random_tensor(DType::kF64, {6, 3}, 8).view(), DType::kF64);
  const CommandRun run =
      qkv(dir_.path(), {"explain", "--x", "x.npy", "--wq", "wq.npy", "--wk", "wk.npy", "--wv",
                        "wv.npy", "--wo", "wo.npy", "--heads", "2", "--row", "2"});
  ASSERT_EQ(run.status, 0) << run.err;
  for (const char* expected : {"x_2 (row 2 of x.npy)", "q_2 = x_2·W^Q (columns of head 1)",
                               "Keys and values: two transforms of the same rows of x.npy",
                               "layer output for query 2 = concat_h O_i·W^O"}) {
    EXPECT_NE(run.out.find(expected), std::string::npos) << expected << "\n" << run.out;
  }
}

TEST_F(ExplainFiles, BadInputFailsCleanly) {
  fs::path page = dir_ / "page.html";
  std::ofstream(page) << "an older page";
  expect_clean_failure(
      dir_.path(),
      {"explain", "--q", "missing.npy", "--k", "k.npy", "--v", "v.npy", "--html", "page.html"},
      "missing.npy");
  expect_clean_failure(dir_.path(),
                       {"explain", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--labels-q",
                        "keys.txt", "--html", "new.html"},
                       "keys.txt");
  expect_clean_failure(dir_.path(),
                       {"explain", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--row", "20",
                        "--svg", "new.svg"},
                       "--row");
  expect_clean_failure(dir_.path(),
                       {"explain", "--q", "q.npy", "--k", "k.npy", "--html", "new.html"}, "--v");
  expect_clean_failure(dir_.path(), {"explain", "--causal", "--html", "new.html"}, "--causal");
  EXPECT_EQ(testing::slurp(page), "an older page");
}

// Labels files are read like inputs: a FIFO or a device is refused at once (it would block, or
// never end), and a file above 64 MiB is refused before it is read.
TEST_F(ExplainFiles, LabelsMustBeRegularFilesOfBoundedSize) {
  ASSERT_EQ(mkfifo((dir_ / "fifo.txt").c_str(), 0600), 0);
  const std::vector<std::string> inputs = {"explain", "--q", "q.npy", "--k",
                                           "k.npy",   "--v", "v.npy"};
  const auto refused = [&](const char* flag, const std::string& file, const std::string& names) {
    std::vector<std::string> args = inputs;
    args.insert(args.end(), {flag, file, "--html", "new.html"});
    const std::vector<std::string> before = testing::files_in(dir_.path());
    const CommandRun run = testing::run_program(QKV_CLI_PATH, dir_.path(), args, 30);
    EXPECT_EQ(run.status, 1) << run.err;
    EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
    EXPECT_NE(run.err.find(names), std::string::npos) << run.err;
    EXPECT_EQ(testing::files_in(dir_.path()), before);
  };
  refused("--labels-k", "fifo.txt", "fifo.txt: cannot read: not a regular file (a FIFO)");
  refused("--labels-q", "/dev/zero", "/dev/zero: cannot read: not a regular file (a character");
  // Sparse: 64 MiB and one byte of zeros, without writing them.
  ASSERT_EQ(truncate((dir_ / "keys.txt").c_str(), (off_t{64} << 20) + 1), 0);
  refused("--labels-k", "keys.txt", "keys.txt: is larger than the 64 MiB a labels file may hold");
}

}  // namespace
}  // namespace qkv
