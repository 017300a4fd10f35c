// End-to-end tests of `qkv attention --grad-out ... --grad-q/k/v/sinks`: the gradients written
// are, bit for bit, what attention_backward gives on the same inputs and options; every refusal
// is one stderr line naming the flag or file, with no file created and an existing output left
// as it was.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "qkv/attention.h"
#include "qkv/attention_backward.h"
#include "qkv/io.h"
#include "qkv/layer_backward.h"
#include "support/command_runner.h"
#include "support/refusal.h"
#include "support/test_support.h"

namespace qkv {
namespace {

class CliGradients : public ::testing::Test {
 protected:
  void SetUp() override {
    q_ = testing::random_tensor(DType::kF32, {4, 9, 8}, 21, -2.0, 2.0);
    k_ = testing::random_tensor(DType::kF32, {2, 11, 8}, 22, -2.0, 2.0);
    v_ = testing::random_tensor(DType::kF32, {2, 11, 5}, 23);
    dout_ = testing::random_tensor(DType::kF32, {4, 9, 5}, 24);
    sinks_ = testing::random_tensor(DType::kF32, {4}, 25, -1.0, 2.0);
    for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"q.npy", &q_},
                                  {"k.npy", &k_},
                                  {"v.npy", &v_},
                                  {"do.npy", &dout_},
                                  {"sinks.npy", &sinks_}}) {
      write_npy(dir_ / name, t->view(), t->dtype());
    }
  }

  testing::CommandRun run(const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"attention", "--q",   "q.npy", "--k",  "k.npy",
                                     "--v",       "v.npy", "--out", "o.npy"};
    args.insert(args.end(), extra.begin(), extra.end());
    return testing::run_program(QKV_CLI_PATH, dir_.path(), args);
  }

  void expect_refused(const std::vector<std::string>& extra, const std::string& mentions,
                      int status) {
    std::vector<std::string> args = {"attention", "--q",   "q.npy", "--k",  "k.npy",
                                     "--v",       "v.npy", "--out", "o.npy"};
    args.insert(args.end(), extra.begin(), extra.end());
    testing::expect_refused(QKV_CLI_PATH, dir_.path(), args, mentions, {status, status});
  }

  testing::ScratchDir dir_;
  Tensor q_, k_, v_, dout_, sinks_;
};

TEST_F(CliGradients, WritesWhatTheLibraryComputesBitForBit) {
  const testing::CommandRun r =
      run({"--causal", "--softcap", "3", "--sinks", "sinks.npy", "--grad-out", "do.npy", "--grad-q",
           "dq.npy", "--grad-k", "dk.npy", "--grad-v", "dv.npy", "--grad-sinks", "ds.npy",
           "--threads", "2"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(r.err.empty()) << r.err;
  AttentionOptions o;
  o.causal = true;
  o.softcap = 3.0;
  o.sinks = sinks_.view();
  o.threads = 2;
  o.return_lse = true;
  const AttentionResult fwd = attention(q_.view(), k_.view(), v_.view(), o);
  const AttentionGradients g = attention_backward(q_.view(), k_.view(), v_.view(), fwd.out.view(),
                                                  fwd.lse.view(), dout_.view(), o);
  EXPECT_TRUE(testing::same_bytes(read_npy(dir_ / "dq.npy"), g.dq));
  EXPECT_TRUE(testing::same_bytes(read_npy(dir_ / "dk.npy"), g.dk));
  EXPECT_TRUE(testing::same_bytes(read_npy(dir_ / "dv.npy"), g.dv));
  EXPECT_TRUE(testing::same_bytes(read_npy(dir_ / "ds.npy"), g.dsinks));
  EXPECT_TRUE(testing::same_bytes(read_npy(dir_ / "o.npy"), fwd.out));
}

TEST_F(CliGradients, AnyBackwardKernelMayBeForcedAndAgrees) {
  ASSERT_EQ(
      run({"--grad-out", "do.npy", "--grad-q", "ref.npy", "--backward-kernel", "reference"}).status,
      0);
  ASSERT_EQ(
      run({"--grad-out", "do.npy", "--grad-q", "scalar.npy", "--backward-kernel", "fused_scalar"})
          .status,
      0);
  EXPECT_LT(testing::max_abs_diff(read_npy(dir_ / "ref.npy").view(),
                                  read_npy(dir_ / "scalar.npy").view()),
            1e-5);
}

TEST_F(CliGradients, UsageErrorsNameTheFlags) {
  expect_refused({"--grad-q", "dq.npy"}, "--grad-out", 2);
  expect_refused({"--grad-out", "do.npy"}, "--grad-out", 2);
  expect_refused({"--grad-out", "do.npy", "--grad-sinks", "ds.npy"}, "--sinks", 2);
  expect_refused({"--backward-kernel", "reference"}, "--grad-out", 2);
}

TEST_F(CliGradients, BadInputIsOneLineAndNothingIsWritten) {
  // bf16 storage cannot be differentiated.
  expect_refused({"--dtype", "bf16", "--grad-out", "do.npy", "--grad-q", "dq.npy"}, "--dtype", 1);
  // dO of the wrong shape, and with a NaN.
  const Tensor wrong = testing::random_tensor(DType::kF32, {4, 9, 6}, 26);
  write_npy(dir_ / "wrong.npy", wrong.view(), DType::kF32);
  expect_refused({"--grad-out", "wrong.npy", "--grad-q", "dq.npy"}, "wrong.npy", 1);
  Tensor nan = dout_.to(DType::kF32);
  nan.data_as<float>()[7] = std::numeric_limits<float>::quiet_NaN();
  write_npy(dir_ / "nan.npy", nan.view(), DType::kF32);
  expect_refused({"--grad-out", "nan.npy", "--grad-k", "dk.npy"}, "nan.npy", 1);
  expect_refused({"--grad-out", "do.npy", "--grad-q", "dq.npy", "--backward-kernel", "nonesuch"},
                 "--backward-kernel: no such backward kernel", 1);
  // An existing output file is left as it was by a refused run.
  { std::ofstream(dir_ / "dq.npy") << "keep"; }
  expect_refused({"--grad-out", "wrong.npy", "--grad-q", "dq.npy"}, "wrong.npy", 1);
  std::ifstream kept(dir_ / "dq.npy");
  std::string text;
  kept >> text;
  EXPECT_EQ(text, "keep");
}

// qkv layer --grad-out ... --grad-*: the library's layer gradients, bit for bit; a weight given
// in nn.Linear's layout gets its gradient in that layout.
TEST_F(CliGradients, LayerGradientsAreTheLibrarysInTheLayoutGiven) {
  const Tensor x = testing::random_tensor(DType::kF32, {2, 5, 6}, 31);
  const Tensor wq = testing::random_tensor(DType::kF32, {6, 8}, 32);
  const Tensor wk = testing::random_tensor(DType::kF32, {6, 4}, 33);
  const Tensor wv = testing::random_tensor(DType::kF32, {6, 4}, 34);
  const Tensor wo = testing::random_tensor(DType::kF32, {8, 6}, 35);
  const Tensor bo = testing::random_tensor(DType::kF32, {6}, 36);
  const Tensor dy = testing::random_tensor(DType::kF32, {2, 5, 6}, 37);
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"x.npy", &x},
                                {"wq.npy", &wq},
                                {"wk.npy", &wk},
                                {"wv.npy", &wv},
                                {"wo.npy", &wo},
                                {"bo.npy", &bo},
                                {"dy.npy", &dy}}) {
    write_npy(dir_ / name, t->view(), t->dtype());
  }
  const std::vector<std::string> layer = {"layer",      "--x",    "x.npy",    "--wq",    "wq.npy",
                                          "--wk",       "wk.npy", "--wv",     "wv.npy",  "--wo",
                                          "wo.npy",     "--bo",   "bo.npy",   "--heads", "4",
                                          "--kv-heads", "2",      "--causal", "--out",   "y.npy"};
  std::vector<std::string> args = layer;
  args.insert(args.end(), {"--grad-out", "dy.npy", "--grad-x", "gx.npy", "--grad-wq", "gq.npy",
                           "--grad-wo", "go.npy", "--grad-bo", "gbo.npy"});
  const testing::CommandRun r = testing::run_program(QKV_CLI_PATH, dir_.path(), args);
  ASSERT_EQ(r.status, 0) << r.err;
  LayerWeights w{wq.view(), wk.view(), wv.view()};
  w.wo = wo.view();
  w.bo = bo.view();
  LayerOptions o;
  o.heads = 4;
  o.kv_heads = 2;
  o.attention.causal = true;
  const LayerGradients g = multi_head_attention_backward(x.view(), w, o, dy.view());
  EXPECT_TRUE(testing::same_bytes(read_npy(dir_ / "gx.npy"), g.dx));
  EXPECT_TRUE(testing::same_bytes(read_npy(dir_ / "gq.npy"), g.dwq));
  EXPECT_TRUE(testing::same_bytes(read_npy(dir_ / "go.npy"), g.dwo));
  EXPECT_TRUE(testing::same_bytes(read_npy(dir_ / "gbo.npy"), g.dbo));
  // The same W^Q stored transposed ([out, in], --linear-layout): dW^Q comes back transposed.
  const TensorView wqv = wq.view();
  const Tensor wq_t =
      contiguous_copy(TensorView{wqv.data, wqv.dtype, {8, 6}, {1, 8}, "wq_t"}, DType::kF32);
  const Tensor wk_t =
      contiguous_copy(TensorView{wk.data(), DType::kF32, {4, 6}, {1, 4}, "wk_t"}, DType::kF32);
  const Tensor wv_t =
      contiguous_copy(TensorView{wv.data(), DType::kF32, {4, 6}, {1, 4}, "wv_t"}, DType::kF32);
  const Tensor wo_t =
      contiguous_copy(TensorView{wo.data(), DType::kF32, {6, 8}, {1, 6}, "wo_t"}, DType::kF32);
  write_npy(dir_ / "wq_t.npy", wq_t.view(), DType::kF32);
  write_npy(dir_ / "wk_t.npy", wk_t.view(), DType::kF32);
  write_npy(dir_ / "wv_t.npy", wv_t.view(), DType::kF32);
  write_npy(dir_ / "wo_t.npy", wo_t.view(), DType::kF32);
  const testing::CommandRun t = testing::run_program(
      QKV_CLI_PATH, dir_.path(),
      {"layer",           "--x",     "x.npy",    "--wq",       "wq_t.npy", "--wk",
       "wk_t.npy",        "--wv",    "wv_t.npy", "--wo",       "wo_t.npy", "--bo",
       "bo.npy",          "--heads", "4",        "--kv-heads", "2",        "--causal",
       "--linear-layout", "--out",   "y2.npy",   "--grad-out", "dy.npy",   "--grad-wq",
       "gq_t.npy"});
  ASSERT_EQ(t.status, 0) << t.err;
  const Tensor gq_t = read_npy(dir_ / "gq_t.npy");
  ASSERT_EQ(gq_t.shape(), (Shape{8, 6}));
  const TensorView back{gq_t.data(), DType::kF32, {6, 8}, {1, 6}, "back"};
  EXPECT_LT(testing::max_abs_diff(back, g.dwq.view()), 1e-6);
  // Usage errors: a gradient without --grad-out, --grad-out alone, --grad-wo without --wo.
  for (const auto& [extra, mentions] :
       {std::pair<std::vector<std::string>, std::string>{{"--grad-x", "gx2.npy"}, "--grad-out"},
        {{"--grad-out", "dy.npy"}, "--grad-out"},
        {{"--grad-out", "dy.npy", "--grad-memory", "gm.npy"}, "--memory"}}) {
    std::vector<std::string> bad = layer;
    bad.insert(bad.end(), extra.begin(), extra.end());
    testing::expect_refused(QKV_CLI_PATH, dir_.path(), bad, mentions, {2, 2});
  }
  // A dY of the wrong shape: one line naming it, nothing written.
  std::vector<std::string> bad = layer;
  bad.insert(bad.end(), {"--grad-out", "do.npy", "--grad-x", "gx3.npy"});
  testing::expect_refused(QKV_CLI_PATH, dir_.path(), bad, "do.npy", {1, 1});
}

// qkv bench --backward: the forward bench's JSON fields (chosen.ms, chosen.gflops, baseline for
// the unfused backward) plus forward_ms; the form, not the figures (timings on a shared host).
TEST_F(CliGradients, BenchBackwardReportsTheForwardBenchsFields) {
  const testing::CommandRun r = testing::run_program(
      QKV_CLI_PATH, dir_.path(),
      // --kernel fused_scalar, in every build, so that unfused_blas is the baseline (the
      // portable build's default backward kernel is unfused_blas itself)
      {"bench", "--backward", "--n", "40", "--d", "8", "--heads", "2", "--kv-heads", "1",
       "--causal", "--threads", "2", "--peak-gflops", "100", "--warmup", "0", "--repeats", "2",
       "--json", "--kernel", "fused_scalar"});
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* field :
       {"\"backward\": true", "\"chosen\": {\"kernel\": \"",
        "\"gflops\": ", "\"ms\": ", "\"forward_ms\": ", "\"backward_forward_ratio\": ",
        "\"baseline\": {\"kernel\": \"unfused_blas\"", "\"speedup_vs_baseline\": "}) {
    EXPECT_NE(r.out.find(field), std::string::npos) << field << " in " << r.out;
  }
  const testing::CommandRun text = testing::run_program(
      QKV_CLI_PATH, dir_.path(),
      {"bench", "--backward", "--n", "40", "--d", "8", "--heads", "2", "--threads", "1",
       "--peak-gflops", "100", "--warmup", "0", "--repeats", "1", "--kernel", "fused_scalar"});
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("backward  fused_scalar"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("backward / forward time: "), std::string::npos) << text.out;
  testing::expect_refused(
      QKV_CLI_PATH, dir_.path(),
      {"bench", "--backward", "--n", "40", "--d", "8", "--heads", "2", "--dtype", "bf16"},
      "--dtype", {2, 2});
  testing::expect_refused(QKV_CLI_PATH, dir_.path(), {"bench", "--backward", "--decode"},
                          "--backward", {2, 2});
}

// qkv bench --layer [--backward]: the layer's forward, and its backward from the forward's state,
// in one JSON object or two text lines; the form, not the figures.
TEST_F(CliGradients, BenchLayerTimesTheForwardAndTheBackward) {
  const std::vector<std::string> shape = {"bench", "--layer", "--n", "40", "--d", "8", "--heads",
                                          "2", "--kv-heads", "1", "--causal", "--threads", "2",
                                          "--peak-gflops", "100", "--warmup", "0", "--repeats",
                                          "2"};
  std::vector<std::string> args = shape;
  args.insert(args.end(), {"--backward", "--json", "--kernel", "fused_scalar"});
  const testing::CommandRun r = testing::run_program(QKV_CLI_PATH, dir_.path(), args);
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* field :
       {"\"layer\": true", "\"backward\": true", "\"width\": 16", "\"forward\": {\"kernel\": \"",
        "\"backward\": {\"kernel\": \"fused_scalar\"", "\"gflops\": ",
        "\"backward_forward_ratio\": "}) {
    EXPECT_NE(r.out.find(field), std::string::npos) << field << " in " << r.out;
  }
  const testing::CommandRun text = testing::run_program(QKV_CLI_PATH, dir_.path(), shape);
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("forward   "), std::string::npos) << text.out;
  EXPECT_EQ(text.out.find("backward"), std::string::npos) << "no --backward: " << text.out;
  std::vector<std::string> f64 = shape;
  f64.insert(f64.end(), {"--backward", "--dtype", "f64"});
  const testing::CommandRun doubles = testing::run_program(QKV_CLI_PATH, dir_.path(), f64);
  ASSERT_EQ(doubles.status, 0) << doubles.err;
  EXPECT_NE(doubles.out.find("backward / forward time: "), std::string::npos) << doubles.out;
  std::vector<std::string> bf16 = shape;
  bf16.insert(bf16.end(), {"--dtype", "bf16"});
  testing::expect_refused(QKV_CLI_PATH, dir_.path(), bf16, "--dtype", {2, 2});
  std::vector<std::string> nk = shape;
  nk.insert(nk.end(), {"--nk", "30"});
  testing::expect_refused(QKV_CLI_PATH, dir_.path(), nk, "--nk", {2, 2});
  testing::expect_refused(QKV_CLI_PATH, dir_.path(), {"bench", "--layer", "--decode"}, "--layer",
                          {2, 2});
}

}  // namespace
}  // namespace qkv
