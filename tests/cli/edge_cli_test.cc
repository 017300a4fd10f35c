// The command line at the edges of the contract: empty inputs from .npy and safetensors files
// through every command, and scales and values beyond float32's range. Each run ends with exit
// status 0 and the defined result, or status 1 with one stderr line; never a signal.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "io/safetensors_builder.h"
#include "qkv/attention.h"
#include "qkv/io.h"
#include "support/command_runner.h"
#include "support/test_support.h"

namespace qkv {
namespace {

namespace fs = std::filesystem;

testing::CommandRun run_qkv(const fs::path& dir, const std::vector<std::string>& args) {
  return testing::run_program(QKV_CLI_PATH, dir, args);
}

void save(const fs::path& path, const Shape& shape, std::uint64_t seed) {
  write_npy(path, testing::random_tensor(DType::kF32, shape, seed).view(), DType::kF32);
}

// Exit 0 and nothing on stderr, or exit 1 with exactly one line; `what` is the command.
void expect_no_crash(const testing::CommandRun& run, const std::string& what) {
  EXPECT_TRUE(run.status == 0 || run.status == 1) << what << ": status " << run.status;
  if (run.status == 0) {
    EXPECT_EQ(run.err, "") << what;
  } else {
    EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << what << ": " << run.err;
  }
}

TEST(CliEdges, EmptyQueriesGiveEmptyOutputsForEveryKernel) {
  testing::ScratchDir dir;
  save(dir / "q.npy", {0, 4}, 1);
  save(dir / "k.npy", {5, 4}, 2);
  save(dir / "v.npy", {5, 3}, 3);
  std::vector<std::string> kernels = attention_kernel_names();
  kernels.push_back("");
  for (const std::string& kernel : kernels) {
    SCOPED_TRACE(kernel);
    std::vector<std::string> args = {"attention", "--q",       "q.npy", "--k",     "k.npy",
                                     "--v",       "v.npy",     "--out", "o.npy",   "--lse",
                                     "lse.npy",   "--weights", "w.npy", "--causal"};
    if (!kernel.empty()) args.insert(args.end(), {"--kernel", kernel});
    const testing::CommandRun run = run_qkv(dir.path(), args);
    ASSERT_EQ(run.status, 0) << run.err;
    EXPECT_EQ(read_npy(dir / "o.npy").shape(), (Shape{0, 3}));
    EXPECT_EQ(read_npy(dir / "w.npy").shape(), (Shape{0, 5}));
    EXPECT_EQ(read_npy(dir / "lse.npy").shape(), (Shape{0}));
  }
}

TEST(CliEdges, EveryZeroDimensionThroughTheCommandLine) {
  testing::ScratchDir dir;
  const std::vector<std::pair<std::string, std::vector<Shape>>> cases = {
      {"b0", {{0, 2, 3, 4}, {0, 2, 5, 4}, {0, 2, 5, 3}}},
      {"h0", {{0, 3, 4}, {0, 5, 4}, {0, 5, 3}}},
      {"nq0", {{2, 0, 4}, {2, 5, 4}, {2, 5, 3}}},
      {"nk0", {{2, 3, 4}, {2, 0, 4}, {2, 0, 3}}},
      {"d0", {{2, 3, 0}, {2, 5, 0}, {2, 5, 3}}},
      {"dv0", {{2, 3, 4}, {2, 5, 4}, {2, 5, 0}}},
  };
  for (const auto& [name, shapes] : cases) {
    SCOPED_TRACE(name);
    save(dir / "q.npy", shapes[0], 1);
    save(dir / "k.npy", shapes[1], 2);
    save(dir / "v.npy", shapes[2], 3);
    const testing::CommandRun run =
        run_qkv(dir.path(), {"attention", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--out",
                             "o.npy", "--lse", "lse.npy"});
    ASSERT_EQ(run.status, 0) << run.err;
    Shape out = shapes[0];
    out.back() = shapes[2].back();
    EXPECT_EQ(read_npy(dir / "o.npy").shape(), out);
    for (const char* command : {"explain"}) {
      expect_no_crash(run_qkv(dir.path(), {command, "--q", "q.npy", "--k", "k.npy", "--v", "v.npy",
                                           "--html", "page.html"}),
                      name + " " + command);
    }
  }
}

TEST(CliEdges, EmptySafetensorsTensorsAndLayerInputs) {
  testing::ScratchDir dir;
  const Tensor q0(DType::kF32, {0, 4}, "q");
  const Tensor k = testing::random_tensor(DType::kF32, {5, 4}, 2);
  const Tensor v = testing::random_tensor(DType::kF32, {5, 3}, 3);
  testing::write_bytes(dir / "m.safetensors",
                       testing::safetensors_bytes({testing::safetensors_item("q", q0, "F32"),
                                                   testing::safetensors_item("k", k, "F32"),
                                                   testing::safetensors_item("v", v, "F32")}));
  testing::CommandRun run =
      run_qkv(dir.path(), {"attention", "--q", "m.safetensors:q", "--k", "m.safetensors:k", "--v",
                           "m.safetensors:v", "--out", "o.npy"});
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_EQ(read_npy(dir / "o.npy").shape(), (Shape{0, 3}));

  save(dir / "x.npy", {0, 8}, 4);
  for (const char* w : {"wq.npy", "wk.npy", "wv.npy", "wo.npy"}) save(dir / w, {8, 8}, 5);
  run = run_qkv(dir.path(), {"layer", "--x", "x.npy", "--wq", "wq.npy", "--wk", "wk.npy", "--wv",
                             "wv.npy", "--wo", "wo.npy", "--heads", "2", "--out", "o.npy"});
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_EQ(read_npy(dir / "o.npy").shape(), (Shape{0, 8}));
  expect_no_crash(run_qkv(dir.path(), {"explain", "--x", "x.npy", "--wq", "wq.npy", "--wk",
                                       "wk.npy", "--wv", "wv.npy", "--heads", "2", "--html",
                                       "page.html"}),
                  "explain on an empty X");
}

// Scores past float32 (a scale of 1e39; values near FLT_MAX): finite outputs equal to the
// float64 reference's, rounded to float32.
TEST(CliEdges, BeyondFloat32TheAnswerIsTheReferences) {
  testing::ScratchDir dir;
  save(dir / "q.npy", {2, 9, 8}, 1);
  save(dir / "k.npy", {2, 30, 8}, 2);
  Tensor big = testing::random_tensor(DType::kF32, {2, 30, 5}, 3, 3.0e38, 3.3e38);
  write_npy(dir / "v.npy", big.view(), DType::kF32);
  save(dir / "v_small.npy", {2, 30, 5}, 4);
  for (const auto& [v, scale] : std::vector<std::pair<std::string, std::string>>{
           {"v_small.npy", "1e39"}, {"v_small.npy", "-1e39"}, {"v.npy", "0.5"}}) {
    SCOPED_TRACE(v + " scale " + scale);
    const testing::CommandRun run =
        run_qkv(dir.path(), {"attention", "--q", "q.npy", "--k", "k.npy", "--v", v, "--scale",
                             scale, "--out", "o.npy", "--lse", "lse.npy"});
    ASSERT_EQ(run.status, 0) << run.err;
    const testing::CommandRun ref =
        run_qkv(dir.path(), {"attention", "--q", "q.npy", "--k", "k.npy", "--v", v, "--scale",
                             scale, "--out", "ref.npy", "--kernel", "reference"});
    ASSERT_EQ(ref.status, 0) << ref.err;
    const Tensor got = read_npy(dir / "o.npy");
    const Tensor want = read_npy(dir / "ref.npy");
    for (std::int64_t e = 0; e < got.numel(); ++e) {
      ASSERT_TRUE(std::isfinite(got.data_as<float>()[e])) << e;
      EXPECT_EQ(got.data_as<float>()[e], want.data_as<float>()[e]) << e;
    }
  }
}

TEST(CliEdges, ScaleMustBeFinite) {
  testing::ScratchDir dir;
  save(dir / "q.npy", {3, 4}, 1);
  for (const char* scale : {"nan", "inf", "-inf", "1e400"}) {
    const testing::CommandRun run =
        run_qkv(dir.path(), {"attention", "--q", "q.npy", "--k", "q.npy", "--v", "q.npy", "--scale",
                             scale, "--out", "o.npy"});
    EXPECT_EQ(run.status, 1) << scale;
    EXPECT_EQ(run.err.rfind("--scale: must be a finite number", 0), 0u) << run.err;
    EXPECT_FALSE(fs::exists(dir / "o.npy"));
  }
}

}  // namespace
}  // namespace qkv
