// qkv train end to end: a small run learns (the loss falls, held-out accuracy passes a
// threshold), the same seed gives bitwise identical weights with 1 and 2 threads, bad flags give
// one stderr line and exit 2, and qkv layer reads the saved weights.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "qkv/io.h"
#include "support/command_runner.h"
#include "support/test_support.h"

namespace qkv {
namespace {

const std::vector<std::string> kSmall = {"train", "--vocab", "8", "--pairs", "4", "--queries",
                                         "4", "--d-model", "32", "--steps", "300", "--batch",
                                         "16", "--seed", "5", "--json", "--quiet"};

testing::CommandRun run(const testing::ScratchDir& dir, std::vector<std::string> args) {
  return testing::run_program(QKV_CLI_PATH, dir.path(), args, 60);
}

TEST(TrainCli, SmallRunLearnsAndSavesWhatQkvLayerReads) {
  testing::ScratchDir dir;
  auto args = kSmall;
  args.insert(args.end(), {"--out", "m.safetensors", "--threads", "1", "--html", "p.html"});
  const auto r = run(dir, args);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_GE(j["heldout_accuracy"].get<double>(), 0.9);  // chance is 1/8
  EXPECT_FALSE(j["curve"].empty());
  // The page of the trained layer, its tokens labelled as pairs and queries.
  const std::string page = testing::slurp(dir / "p.html");
  EXPECT_NE(page.find("?k"), std::string::npos);
  EXPECT_NE(page.find("matched against the keys to fetch their values"), std::string::npos);
  EXPECT_LT(j["loss"].get<double>(), 0.5);              // ln 8 = 2.08 at the start
  EXPECT_EQ(j["steps"].get<int>(), 300);

  // qkv layer reads the saved projections (X·W convention).
  write_npy(dir / "x.npy", testing::random_tensor(DType::kF32, {6, 32}, 1).view(), DType::kF32);
  const auto layer = run(dir, {"layer", "--x", "x.npy", "--wq", "m.safetensors:layer0.wq", "--wk",
                               "m.safetensors:layer0.wk", "--wv", "m.safetensors:layer0.wv",
                               "--wo", "m.safetensors:layer0.wo", "--heads", "1", "--causal",
                               "--out", "y.npy"});
  EXPECT_EQ(layer.status, 0) << layer.err;
  EXPECT_EQ(read_npy(dir / "y.npy").shape(), (Shape{6, 32}));
}

TEST(TrainCli, SameSeedSameWeightsForAnyThreadCount) {
  testing::ScratchDir dir;
  std::vector<std::string> files;
  for (const std::string threads : {"1", "2"}) {
    auto args = kSmall;
    args[10] = "60";  // --steps
    args.insert(args.end(), {"--out", "m" + threads + ".safetensors", "--threads", threads});
    ASSERT_EQ(run(dir, args).status, 0);
    files.push_back(testing::slurp(dir / ("m" + threads + ".safetensors")));
  }
  EXPECT_FALSE(files[0].empty());
  EXPECT_EQ(files[0], files[1]);
}

TEST(TrainCli, BadFlagsGiveOneLineAndStatusTwo) {
  testing::ScratchDir dir;
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"train", "--task", "nope"}, {"train", "--steps", "-1"},
        {"train", "--lr", "0"}, {"train", "--heads", "zero"}, {"train", "--frobnicate"}}) {
    const auto r = run(dir, args);
    EXPECT_EQ(r.status, 2) << args[1];
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

}  // namespace
}  // namespace qkv
