// Dropout from the command line: qkv attention --dropout/--seed (weights 0 or w/(1-p), the
// same seed the same files, --dropout 0 the run without it, gradients with the same mask as the
// library's), its refusals (one line, status 2 for usage, 1 for a kernel that cannot draw it,
// nothing written), qkv layer --dropout/--seed/--dropout-offset (the library's layer and its
// backward with the same options, the same refusals, --help), qkv bench --dropout with and
// without --backward, and qkv train --dropout (the same weights for 1 and 2 threads).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "qkv/attention.h"
#include "qkv/attention_backward.h"
#include "qkv/io.h"
#include "qkv/layer_backward.h"
#include "support/command_runner.h"
#include "support/test_support.h"

namespace qkv {
namespace {

namespace fs = std::filesystem;
using testing::CommandRun;

CommandRun run_qkv(const fs::path& dir, const std::vector<std::string>& args) {
  return testing::run_program(QKV_CLI_PATH, dir, args, 120);
}

class DropoutCli : public ::testing::Test {
 protected:
  void SetUp() override {
    q_ = testing::random_tensor(DType::kF32, {2, 3, 40, 16}, 1);
    k_ = testing::random_tensor(DType::kF32, {2, 3, 90, 16}, 2);
    v_ = testing::random_tensor(DType::kF32, {2, 3, 90, 8}, 3);
    dout_ = testing::random_tensor(DType::kF32, {2, 3, 40, 8}, 4);
    write_npy(dir_ / "q.npy", q_.view(), DType::kF32);
    write_npy(dir_ / "k.npy", k_.view(), DType::kF32);
    write_npy(dir_ / "v.npy", v_.view(), DType::kF32);
    write_npy(dir_ / "do.npy", dout_.view(), DType::kF32);
  }
  std::vector<std::string> attention(std::vector<std::string> extra) const {
    std::vector<std::string> args = {"attention", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }
  testing::ScratchDir dir_;
  Tensor q_, k_, v_, dout_;
};

TEST_F(DropoutCli, WeightsAreDroppedOrScaledAndTheGradientsMatchTheLibrary) {
  const CommandRun plain = run_qkv(dir_.path(), attention({"--causal", "--out", "o0.npy",
                                                           "--weights", "w0.npy"}));
  ASSERT_EQ(plain.status, 0) << plain.err;
  const CommandRun run = run_qkv(
      dir_.path(), attention({"--causal", "--dropout", "0.25", "--seed", "18446744073709551615",
                              "--dropout-offset", "7", "--out", "o.npy", "--weights", "w.npy",
                              "--lse", "l.npy", "--grad-out", "do.npy", "--grad-q", "dq.npy",
                              "--grad-v", "dv.npy", "--threads", "3"}));
  ASSERT_EQ(run.status, 0) << run.err;
  const Tensor w0 = read_npy(dir_ / "w0.npy"), w = read_npy(dir_ / "w.npy");
  std::int64_t kept = 0, allowed = 0;
  for (std::int64_t e = 0; e < w.numel(); ++e) {
    const float a = w0.data_as<float>()[e], b = w.data_as<float>()[e];
    if (a == 0.0f) continue;
    ++allowed;
    if (b != 0.0f) {
      ++kept;
      EXPECT_NEAR(b, a / 0.75f, 1e-6f);
    }
  }
  EXPECT_NEAR(static_cast<double>(kept) / static_cast<double>(allowed), 0.75, 0.02);
  // The library with the same options, forward and backward, gives the files' values.
  AttentionOptions options;
  options.causal = true;
  options.dropout_p = 0.25;
  options.seed = 18446744073709551615ull;
  options.dropout_offset = 7;
  options.return_lse = true;
  const AttentionResult r = qkv::attention(q_.view(), k_.view(), v_.view(), options);
  EXPECT_LE(testing::max_abs_diff(r.out.view(), read_npy(dir_ / "o.npy").view()), 1e-6);
  const AttentionGradients g = attention_backward(q_.view(), k_.view(), v_.view(), r.out.view(),
                                                  r.lse.view(), dout_.view(), options);
  EXPECT_LE(testing::max_abs_diff(g.dq.view(), read_npy(dir_ / "dq.npy").view()), 1e-5);
  EXPECT_LE(testing::max_abs_diff(g.dv.view(), read_npy(dir_ / "dv.npy").view()), 1e-5);
  // --dropout 0 is the run without it, bit for bit.
  const CommandRun zero = run_qkv(dir_.path(), attention({"--causal", "--dropout", "0", "--seed",
                                                          "9", "--out", "oz.npy"}));
  ASSERT_EQ(zero.status, 0) << zero.err;
  EXPECT_EQ(testing::slurp(dir_ / "oz.npy"), testing::slurp(dir_ / "o0.npy"));
}

TEST_F(DropoutCli, RefusalsAreOneLineAndWriteNothing) {
  struct Refusal {
    std::vector<std::string> flags;
    int status;
    std::string words;
  };
  const Refusal refusals[] = {
      {{"--dropout", "1"}, 2, "--dropout: must be a number in [0, 1), got '1'"},
      {{"--dropout", "-0.1"}, 2, "--dropout: must be a number in [0, 1)"},
      {{"--dropout", "nan"}, 2, "--dropout: must be a number in [0, 1)"},
      {{"--dropout", "0.1", "--seed", "1.5"}, 2, "--seed: must be an integer in [0, 2^64)"},
      {{"--dropout", "0.1", "--seed", "-1"}, 2, "--seed: must be an integer in [0, 2^64)"},
      {{"--dropout", "0.1", "--seed", "18446744073709551616"}, 2, "--seed: must be an integer"},
      {{"--dropout", "0.1", "--dropout-offset", "4294967296"}, 2, "--dropout-offset: must be"},
      {{"--dropout", "0.1", "--ring"}, 2, "--ring: cannot be combined with --weights, --dropout"},
      {{"--dropout", "0.1", "--kernel", "unfused_blas"}, 1, "it draws no dropout"},
      {{"--dropout", "0.1", "--kernel", "decode_scalar"}, 1, "it draws no dropout"},
  };
  for (const Refusal& refusal : refusals) {
    std::vector<std::string> flags = refusal.flags;
    flags.insert(flags.end(), {"--out", "never.npy", "--weights", "never_w.npy"});
    const CommandRun run = run_qkv(dir_.path(), attention(flags));
    EXPECT_EQ(run.status, refusal.status) << refusal.words << ": " << run.err;
    EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
    EXPECT_NE(run.err.find(refusal.words), std::string::npos) << run.err;
    EXPECT_FALSE(fs::exists(dir_ / "never.npy"));
    EXPECT_FALSE(fs::exists(dir_ / "never_w.npy"));
  }
}

class LayerDropoutCli : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto make = [&](Tensor& t, const char* file, Shape shape, std::uint64_t seed) {
      t = testing::random_tensor(DType::kF32, shape, seed);
      write_npy(dir_ / file, t.view(), DType::kF32);
    };
    make(x_, "x.npy", {2, 30, 12}, 21);
    make(wq_, "wq.npy", {12, 4 * 4}, 22);
    make(wk_, "wk.npy", {12, 2 * 4}, 23);
    make(wv_, "wv.npy", {12, 2 * 3}, 24);
    make(wo_, "wo.npy", {4 * 3, 8}, 25);
    make(dy_, "dy.npy", {2, 30, 8}, 26);
  }
  std::vector<std::string> layer(std::vector<std::string> extra) const {
    std::vector<std::string> args = {"layer",  "--x",    "x.npy",  "--wq",      "wq.npy",
                                     "--wk",   "wk.npy", "--wv",   "wv.npy",    "--wo",
                                     "wo.npy", "--heads", "4",     "--kv-heads", "2"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }
  testing::ScratchDir dir_;
  Tensor x_, wq_, wk_, wv_, wo_, dy_;
};

// qkv layer --dropout writes what the library's layer and its backward compute with the same
// options: the forward's mask drawn again for the gradients.
TEST_F(LayerDropoutCli, OutputsAndGradientsAreTheLibrarysWithTheSameOptions) {
  const CommandRun run = run_qkv(
      dir_.path(), layer({"--causal", "--dropout", "0.25", "--seed", "12345678901234567890",
                          "--dropout-offset", "4294967295", "--out", "o.npy", "--weights",
                          "w.npy", "--grad-out", "dy.npy", "--grad-x", "dx.npy", "--grad-wq",
                          "dwq.npy", "--grad-wv", "dwv.npy", "--threads", "3"}));
  ASSERT_EQ(run.status, 0) << run.err;
  LayerOptions options;
  options.heads = 4;
  options.kv_heads = 2;
  options.attention.causal = true;
  options.attention.return_weights = true;
  options.attention.dropout_p = 0.25;
  options.attention.seed = 12345678901234567890ull;
  options.attention.dropout_offset = 4294967295u;
  const LayerWeights weights{wq_.view(), wk_.view(), wv_.view(), wo_.view()};
  LayerForwardState state;
  const LayerResult r = multi_head_attention(x_.view(), weights, options, std::nullopt, state);
  const LayerGradients g =
      multi_head_attention_backward(x_.view(), weights, options, dy_.view(), std::nullopt, &state);
  // The same library calls on the same float32 inputs: the same bits for any thread count.
  EXPECT_EQ(testing::max_abs_diff(r.out.view(), read_npy(dir_ / "o.npy").view()), 0.0);
  EXPECT_EQ(testing::max_abs_diff(r.weights.view(), read_npy(dir_ / "w.npy").view()), 0.0);
  EXPECT_EQ(testing::max_abs_diff(g.dx.view(), read_npy(dir_ / "dx.npy").view()), 0.0);
  EXPECT_EQ(testing::max_abs_diff(g.dwq.view(), read_npy(dir_ / "dwq.npy").view()), 0.0);
  EXPECT_EQ(testing::max_abs_diff(g.dwv.view(), read_npy(dir_ / "dwv.npy").view()), 0.0);
  // Dropout dropped weights: the run without it differs; --dropout 0 is that run, bit for bit.
  const CommandRun plain = run_qkv(dir_.path(), layer({"--causal", "--out", "o0.npy"}));
  ASSERT_EQ(plain.status, 0) << plain.err;
  const CommandRun zero = run_qkv(
      dir_.path(), layer({"--causal", "--dropout", "0", "--seed", "5", "--out", "oz.npy"}));
  ASSERT_EQ(zero.status, 0) << zero.err;
  EXPECT_EQ(testing::slurp(dir_ / "oz.npy"), testing::slurp(dir_ / "o0.npy"));
  EXPECT_NE(testing::slurp(dir_ / "o.npy"), testing::slurp(dir_ / "o0.npy"));
  const CommandRun help = run_qkv(dir_.path(), {"layer", "--help"});
  EXPECT_EQ(help.status, 0);
  for (const char* flag : {"--dropout", "--seed", "--dropout-offset"}) {
    EXPECT_NE(help.out.find(flag), std::string::npos) << flag;
  }
}

TEST_F(LayerDropoutCli, RefusalsAreOneLineAndWriteNothing) {
  struct Refusal {
    std::vector<std::string> flags;
    std::string words;
  };
  const Refusal refusals[] = {
      {{"--dropout", "1"}, "--dropout: must be a number in [0, 1), got '1'"},
      {{"--dropout", "-0.5"}, "--dropout: must be a number in [0, 1)"},
      {{"--dropout", "inf"}, "--dropout: must be a number in [0, 1)"},
      {{"--dropout", "0.1", "--seed", "x"}, "--seed: must be an integer in [0, 2^64)"},
      {{"--dropout", "0.1", "--dropout-offset", "-1"}, "--dropout-offset: must be"},
      {{"--dropout", "0.1", "--ring"}, "--ring: cannot be combined with --weights, --dropout"},
  };
  for (const Refusal& refusal : refusals) {
    std::vector<std::string> flags = refusal.flags;
    flags.insert(flags.end(), {"--out", "never.npy", "--weights", "never_w.npy", "--grad-out",
                               "dy.npy", "--grad-x", "never_dx.npy"});
    const CommandRun run = run_qkv(dir_.path(), layer(flags));
    EXPECT_EQ(run.status, 2) << refusal.words << ": " << run.err;
    EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
    EXPECT_NE(run.err.find(refusal.words), std::string::npos) << run.err;
    EXPECT_NE(run.err.find("(see 'qkv layer --help')"), std::string::npos) << run.err;
    for (const char* never : {"never.npy", "never_w.npy", "never_dx.npy"}) {
      EXPECT_FALSE(fs::exists(dir_ / never)) << never;
    }
  }
}

TEST(DropoutCliBench, ForwardAndBackwardRunWithDropout) {
  testing::ScratchDir dir;
  for (const bool backward : {false, true}) {
    std::vector<std::string> args = {"bench", "--n", "64", "--d", "16", "--heads", "2",
                                     "--threads", "2", "--dropout", "0.1", "--seed", "3",
                                     "--peak-gflops", "100", "--warmup", "0", "--repeats", "1",
                                     "--json"};
    if (backward) args.push_back("--backward");
    const CommandRun run = run_qkv(dir.path(), args);
    ASSERT_EQ(run.status, 0) << run.err;
    EXPECT_NE(run.out.find("\"dropout\": 0.1"), std::string::npos) << run.out;
    // The layer's bench too: its heads' attention drops weights (forward and backward).
    args.push_back("--layer");
    const CommandRun layer_run = run_qkv(dir.path(), args);
    ASSERT_EQ(layer_run.status, 0) << layer_run.err;
    EXPECT_NE(layer_run.out.find("\"dropout\": 0.1"), std::string::npos) << layer_run.out;
    EXPECT_NE(layer_run.out.find("\"layer\": true"), std::string::npos) << layer_run.out;
  }
  const CommandRun refused =
      run_qkv(dir.path(), {"bench", "--decode", "--nk", "64", "--d", "16", "--heads", "2",
                           "--dropout", "0.1"});
  EXPECT_EQ(refused.status, 2) << refused.err;
}

TEST(DropoutCliTrain, SameWeightsForAnyThreadCountAndRefusesOne) {
  testing::ScratchDir dir;
  std::vector<std::string> files;
  for (const std::string threads : {"1", "2"}) {
    const CommandRun run = run_qkv(
        dir.path(), {"train", "--vocab", "8", "--pairs", "4", "--queries", "4", "--d-model", "32",
                     "--steps", "40", "--batch", "8", "--dropout", "0.2", "--quiet", "--out",
                     "m" + threads + ".safetensors", "--threads", threads});
    ASSERT_EQ(run.status, 0) << run.err;
    files.push_back(testing::slurp(dir / ("m" + threads + ".safetensors")));
  }
  EXPECT_FALSE(files[0].empty());
  EXPECT_EQ(files[0], files[1]);
  // Dropout changes the training: different weights from the same seed without it.
  const CommandRun plain = run_qkv(
      dir.path(), {"train", "--vocab", "8", "--pairs", "4", "--queries", "4", "--d-model", "32",
                   "--steps", "40", "--batch", "8", "--quiet", "--out", "m0.safetensors"});
  ASSERT_EQ(plain.status, 0) << plain.err;
  EXPECT_NE(testing::slurp(dir / "m0.safetensors"), files[0]);
  const CommandRun bad = run_qkv(dir.path(), {"train", "--dropout", "1"});
  EXPECT_EQ(bad.status, 2) << bad.err;
  EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << bad.err;
}

}  // namespace
}  // namespace qkv
