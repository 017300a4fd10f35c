// End-to-end tests of `qkv attention --grad-out ... --grad-q/k/v/sinks`: the gradients written
// are, bit for bit, what attention_backward gives on the same inputs and options; every refusal
// is one stderr line naming the flag or file, with no file created and an existing output left
// as it was.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/backward_cases.h"
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

// --dtype bf16: the bf16 backward, its float32 sums written in --out-dtype (f32 here): bit for
// bit the library's with grad_dtype float32; f16 and f64 outputs round those sums once.
TEST_F(CliGradients, Bf16GradientsAreTheLibrarysFloat32Sums) {
  const testing::CommandRun r =
      run({"--dtype", "bf16", "--causal", "--sinks", "sinks.npy", "--grad-out", "do.npy",
           "--grad-q", "dq.npy", "--grad-k", "dk.npy", "--grad-v", "dv.npy", "--grad-sinks",
           "ds.npy", "--threads", "2"});
  ASSERT_EQ(r.status, 0) << r.err;
  AttentionOptions o;
  o.dtype = DType::kBF16;
  o.causal = true;
  o.sinks = sinks_.view();
  o.threads = 2;
  o.return_lse = true;
  const AttentionResult fwd = attention(q_.view(), k_.view(), v_.view(), o);
  o.grad_dtype = DType::kF32;
  const AttentionGradients g = attention_backward(q_.view(), k_.view(), v_.view(), fwd.out.view(),
                                                  fwd.lse.view(), dout_.view(), o);
  ASSERT_EQ(g.compute, DType::kBF16);
  EXPECT_TRUE(testing::same_bytes(read_npy(dir_ / "dq.npy"), g.dq));
  EXPECT_TRUE(testing::same_bytes(read_npy(dir_ / "dk.npy"), g.dk));
  EXPECT_TRUE(testing::same_bytes(read_npy(dir_ / "dv.npy"), g.dv));
  EXPECT_TRUE(testing::same_bytes(read_npy(dir_ / "ds.npy"), g.dsinks));
  ASSERT_EQ(run({"--dtype", "bf16", "--out-dtype", "f16", "--grad-out", "do.npy", "--grad-v",
                 "dv16.npy", "--backward-kernel", "fused_scalar"})
                .status,
            0);
  EXPECT_EQ(read_npy(dir_ / "dv16.npy").dtype(), DType::kF16);
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

// Scores near 4e4 (Q and K scaled up): the gradients the CLI writes, from every backward kernel,
// stay within 3x the plain float32 composition's error against float64 (the bound the kernel
// tests hold past scores of 1e3). Weighed from the saved lse, dV erred 1e3-1e4 times that.
TEST_F(CliGradients, LargeScoresKeepTheGradientsAccurate) {
  testing::GradCase c;
  c.h = 4;
  c.hkv = 2;
  c.nq = 9;
  c.nk = 11;
  c.d = 8;
  c.dv = 5;
  testing::GradInputs in = testing::make_grad_inputs(c, 31);
  double top = 0.0;
  const float* q = in.q.data_as<float>();
  const float* k = in.k.data_as<float>();
  for (std::int64_t h = 0; h < c.h; ++h) {
    for (std::int64_t i = 0; i < c.nq; ++i) {
      for (std::int64_t j = 0; j < c.nk; ++j) {
        double dot = 0.0;
        for (std::int64_t x = 0; x < c.d; ++x) {
          dot += static_cast<double>(q[(h * c.nq + i) * c.d + x]) *
                 k[((h / 2) * c.nk + j) * c.d + x];
        }
        top = std::max(top, std::abs(dot) / std::sqrt(8.0));
      }
    }
  }
  const double f = std::sqrt(4e4 / top);
  for (Tensor* t : {&in.q, &in.k}) {
    float* x = t->data_as<float>();
    for (std::int64_t e = 0; e < t->numel(); ++e) x[e] = static_cast<float>(x[e] * f);
  }
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"bq.npy", &in.q},
                                {"bk.npy", &in.k},
                                {"bv.npy", &in.v},
                                {"bdo.npy", &in.dout}}) {
    write_npy(dir_ / name, t->view(), t->dtype());
  }
  testing::GradCase c64 = c;
  c64.dtype = DType::kF64;
  testing::GradInputs in64;
  in64.q = contiguous_copy(in.q.view(), DType::kF64);
  in64.k = contiguous_copy(in.k.view(), DType::kF64);
  in64.v = contiguous_copy(in.v.view(), DType::kF64);
  in64.dout = contiguous_copy(in.dout.view(), DType::kF64);
  const AttentionGradients exact = testing::backward(c64, in64, "reference");
  const testing::NaiveGradients naive = testing::naive_backward_f32(c, in);
  for (const std::string& kernel : attention_backward_kernel_names()) {
    SCOPED_TRACE(kernel);
    const testing::CommandRun r = testing::run_program(
        QKV_CLI_PATH, dir_.path(),
        {"attention", "--q", "bq.npy", "--k", "bk.npy", "--v", "bv.npy", "--out", "bo.npy",
         "--grad-out", "bdo.npy", "--grad-q", "bdq.npy", "--grad-k", "bdk.npy", "--grad-v",
         "bdv.npy", "--backward-kernel", kernel});
    ASSERT_EQ(r.status, 0) << r.err;
    const std::pair<const char*, std::pair<const Tensor*, const Tensor*>> grads[] = {
        {"bdq.npy", {&exact.dq, &naive.dq}},
        {"bdk.npy", {&exact.dk, &naive.dk}},
        {"bdv.npy", {&exact.dv, &naive.dv}}};
    for (const auto& [file, want] : grads) {
      const Tensor got = read_npy(dir_ / file);
      const double size = testing::max_abs(want.first->view());
      const double plain = testing::max_abs_diff(want.second->view(), want.first->view());
      EXPECT_LE(testing::max_abs_diff(got.view(), want.first->view()),
                3.0 * plain + std::ldexp(size, -24))
          << file << ": plain float32 composition " << plain << ", size " << size;
    }
  }
}

TEST_F(CliGradients, UsageErrorsNameTheFlags) {
  expect_refused({"--grad-q", "dq.npy"}, "--grad-out", 2);
  expect_refused({"--grad-out", "do.npy"}, "--grad-out", 2);
  expect_refused({"--grad-out", "do.npy", "--grad-sinks", "ds.npy"}, "--sinks", 2);
  expect_refused({"--backward-kernel", "reference"}, "--grad-out", 2);
}

TEST_F(CliGradients, BadInputIsOneLineAndNothingIsWritten) {
  // f16 storage cannot be differentiated (bf16 can).
  expect_refused({"--dtype", "f16", "--grad-out", "do.npy", "--grad-q", "dq.npy"}, "--dtype", 1);
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

// A bool DY is refused by qkv layer as by qkv attention (it was read as 0/1 gradients).
TEST_F(CliGradients, ABoolGradOutIsRefusedByTheLayerAsByAttention) {
  const Tensor x = testing::random_tensor(DType::kF32, {5, 6}, 31);
  const Tensor w = testing::random_tensor(DType::kF32, {6, 6}, 32);
  Tensor dy(DType::kBool, {5, 6}, "dy");
  for (std::int64_t i = 0; i < dy.numel(); ++i) dy.data_as<bool>()[i] = i % 3 == 0;
  write_npy(dir_ / "x.npy", x.view(), DType::kF32);
  write_npy(dir_ / "w.npy", w.view(), DType::kF32);
  write_npy(dir_ / "dy.npy", dy.view(), DType::kBool);
  testing::expect_refused(QKV_CLI_PATH, dir_.path(),
                          {"layer", "--x", "x.npy", "--wq", "w.npy", "--wk", "w.npy", "--wv",
                           "w.npy", "--heads", "2", "--out", "y.npy", "--grad-out", "dy.npy",
                           "--grad-x", "gx.npy"},
                          "dy.npy: dtype bool is not supported", {1, 1});
  Tensor bool_dout(DType::kBool, {4, 9, 5}, "do");
  for (std::int64_t i = 0; i < bool_dout.numel(); ++i) bool_dout.data_as<bool>()[i] = true;
  write_npy(dir_ / "bool_do.npy", bool_dout.view(), DType::kBool);
  expect_refused({"--grad-out", "bool_do.npy", "--grad-q", "dq.npy"},
                 "bool_do.npy: dtype bool is not supported", 1);
}

// --out-dtype f16 with a gradient past float16's range (dV sums dO over the query rows that
// read a key: 9 rows of 60000): refused naming --out-dtype, not written as infinity.
TEST_F(CliGradients, AGradientPastFloat16sRangeIsRefusedNotWrittenAsInfinity) {
  Tensor big = dout_.to(DType::kF32);
  for (std::int64_t i = 0; i < big.numel(); ++i) big.data_as<float>()[i] = 60000.0f;
  write_npy(dir_ / "big.npy", big.view(), DType::kF32);
  expect_refused({"--out-dtype", "f16", "--grad-out", "big.npy", "--grad-v", "dv.npy"},
                 "--out-dtype: float16 cannot hold dv.npy's value", 1);
  // Within range it is written, rounded.
  const testing::CommandRun r =
      run({"--out-dtype", "f16", "--grad-out", "do.npy", "--grad-v", "dv.npy"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(read_npy(dir_ / "dv.npy").dtype(), DType::kF16);
}

// The same for the output itself: V of 1e5 gives an output of 1e5, which float16 cannot hold
// (it was written as infinity); the layer too. Refused naming --out-dtype, nothing written.
TEST_F(CliGradients, AnOutputPastFloat16sRangeIsRefusedNotWrittenAsInfinity) {
  Tensor big_v = v_.to(DType::kF32);
  for (std::int64_t i = 0; i < big_v.numel(); ++i) big_v.data_as<float>()[i] = 1e5f;
  write_npy(dir_ / "bigv.npy", big_v.view(), DType::kF32);
  testing::expect_refused(QKV_CLI_PATH, dir_.path(),
                          {"attention", "--q", "q.npy", "--k", "k.npy", "--v", "bigv.npy", "--out",
                           "o.npy", "--out-dtype", "f16"},
                          "--out-dtype: float16 cannot hold the output's value 100000", {1, 1});
  const Tensor x = testing::random_tensor(DType::kF32, {5, 6}, 31, 0.5, 1.0);  // V >= 9e4
  Tensor w = testing::random_tensor(DType::kF32, {6, 6}, 32);
  write_npy(dir_ / "x.npy", x.view(), DType::kF32);
  write_npy(dir_ / "w.npy", w.view(), DType::kF32);
  for (std::int64_t i = 0; i < w.numel(); ++i) w.data_as<float>()[i] = 3e4f;
  write_npy(dir_ / "bigw.npy", w.view(), DType::kF32);
  testing::expect_refused(QKV_CLI_PATH, dir_.path(),
                          {"layer", "--x", "x.npy", "--wq", "w.npy", "--wk", "w.npy", "--wv",
                           "bigw.npy", "--heads", "2", "--out", "y.npy", "--out-dtype", "f16"},
                          "--out-dtype: float16 cannot hold y.npy's value", {1, 1});
}

// --max-memory with gradients: the forward's outputs and the backward's gradients and
// workspace are checked together before the forward runs (the check came after it, naming
// only what the forward held).
TEST_F(CliGradients, TheBudgetCoversTheBackwardBeforeTheForwardRuns) {
  const Tensor q = testing::random_tensor(DType::kF32, {8, 1024, 64}, 41);
  const Tensor kv = testing::random_tensor(DType::kF32, {8, 1024, 64}, 42);
  write_npy(dir_ / "bq.npy", q.view(), DType::kF32);
  write_npy(dir_ / "bkv.npy", kv.view(), DType::kF32);
  // Inputs 4 x 2 MiB, leaving 8 MiB: the forward alone needs about 2 MiB, with the backward
  // (its gradients 6 MiB, its workspace 4 MiB) about 13.
  testing::expect_refused(
      QKV_CLI_PATH, dir_.path(),
      {"attention", "--q", "bq.npy", "--k", "bkv.npy", "--v", "bkv.npy", "--out", "o.npy",
       "--grad-out", "bq.npy", "--grad-q", "dq.npy", "--threads", "1", "--max-memory", "16M"},
      "the gradients need", {1, 1});
  const testing::CommandRun r = testing::run_program(
      QKV_CLI_PATH, dir_.path(),
      {"attention", "--q", "bq.npy", "--k", "bkv.npy", "--v", "bkv.npy", "--out", "o.npy",
       "--grad-out", "bq.npy", "--grad-q", "dq.npy", "--threads", "1", "--max-memory", "16M"});
  EXPECT_NE(r.err.find("checked before the forward"), std::string::npos) << r.err;
  // A budget that holds both runs.
  const testing::CommandRun ok = testing::run_program(
      QKV_CLI_PATH, dir_.path(),
      {"attention", "--q", "bq.npy", "--k", "bkv.npy", "--v", "bkv.npy", "--out", "o.npy",
       "--grad-out", "bq.npy", "--grad-q", "dq.npy", "--threads", "1", "--max-memory", "256M"});
  EXPECT_EQ(ok.status, 0) << ok.err;
}

// dO is an input: the budget left after the inputs already excludes it, and the backward's share
// once the forward has run must not take it off again. A budget with room for the inputs, the
// forward's outputs and the backward, plus half of dO: taken off twice, the backward was refused
// ("attention_backward needs ..."); counted once, the run fits.
TEST_F(CliGradients, TheBudgetCountsGradOutOnce) {
  const Tensor q = testing::random_tensor(DType::kF32, {4, 512, 64}, 51);
  const Tensor kv = testing::random_tensor(DType::kF32, {4, 512, 64}, 52);
  write_npy(dir_ / "cq.npy", q.view(), DType::kF32);
  write_npy(dir_ / "ckv.npy", kv.view(), DType::kF32);
  AttentionOptions options;
  options.threads = 1;
  const std::uint64_t backward = attention_backward_memory(q.view(), kv.view(), kv.view(), options);
  const std::uint64_t inputs = 4 * q.nbytes();  // Q, K, V and dO (Q's shape)
  const std::uint64_t forward = q.nbytes() + static_cast<std::uint64_t>(4 * 512 * 4);  // O, lse
  const std::uint64_t budget = inputs + forward + backward + q.nbytes() / 2;
  const testing::CommandRun r = testing::run_program(
      QKV_CLI_PATH, dir_.path(),
      {"attention", "--q", "cq.npy", "--k", "ckv.npy", "--v", "ckv.npy", "--out", "o.npy",
       "--grad-out", "cq.npy", "--grad-q", "dq.npy", "--threads", "1", "--max-memory",
       std::to_string(budget)});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(std::filesystem::exists(dir_ / "dq.npy"));
}

// qkv layer --grad-out checks the whole call against --max-memory before the forward, as qkv
// attention does: a budget one byte short of what the forward and the backward need together
// (multi_head_attention_backward_memory) is refused at once, in one line naming --max-memory,
// nothing written (before, the forward ran and the backward ran past the budget: only its
// attention call was checked, against the whole budget); the budget it names is enough.
TEST_F(CliGradients, TheLayersBudgetCoversTheBackwardBeforeTheForwardRuns) {
  const Tensor x = testing::random_tensor(DType::kF32, {512, 64}, 61);
  const Tensor w = testing::random_tensor(DType::kF32, {64, 64}, 62);
  const Tensor dy = testing::random_tensor(DType::kF32, {512, 64}, 63);
  write_npy(dir_ / "lx.npy", x.view(), DType::kF32);
  write_npy(dir_ / "lw.npy", w.view(), DType::kF32);
  write_npy(dir_ / "ldy.npy", dy.view(), DType::kF32);
  LayerOptions options;
  options.heads = 4;
  options.attention.threads = 1;
  const LayerWeights weights{w.view(), w.view(), w.view(), w.view()};
  const std::uint64_t need = multi_head_attention_backward_memory(x.view(), weights, options);
  // X, the four weight matrices and dY, as the budget counts the inputs.
  const std::uint64_t inputs = x.nbytes() + 4 * w.nbytes() + dy.nbytes();
  const auto args = [&](std::uint64_t budget) {
    return std::vector<std::string>{
        "layer",  "--x",   "lx.npy",   "--wq",       "lw.npy",  "--wk",         "lw.npy",
        "--wv",   "lw.npy", "--wo",    "lw.npy",     "--heads", "4",            "--out",
        "o.npy",  "--grad-out", "ldy.npy", "--grad-wq", "dwq.npy", "--threads", "1",
        "--max-memory", std::to_string(budget)};
  };
  testing::expect_refused(QKV_CLI_PATH, dir_.path(), args(inputs + need - 1), "--max-memory",
                          {1, 1});
  const testing::CommandRun refused =
      testing::run_program(QKV_CLI_PATH, dir_.path(), args(inputs + need - 1));
  EXPECT_NE(refused.err.find("checked before the forward"), std::string::npos) << refused.err;
  const testing::CommandRun ok = testing::run_program(QKV_CLI_PATH, dir_.path(),
                                                      args(inputs + need));
  EXPECT_EQ(ok.status, 0) << ok.err;
  EXPECT_TRUE(std::filesystem::exists(dir_ / "dwq.npy"));
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
      {"bench", "--backward", "--n", "40", "--d", "8", "--heads", "2", "--dtype", "f16"},
      "--dtype", {2, 2});
  // --dtype bf16: the bf16 backward, timed against the float32 backward in the same run.
  const std::vector<std::string> bf16 = {
      "bench", "--backward", "--n",  "40", "--d",          "8",   "--heads",  "2",
      "--threads", "1",     "--dtype", "bf16", "--peak-gflops", "100", "--warmup", "0",
      "--repeats", "1"};
  const testing::CommandRun b = testing::run_program(QKV_CLI_PATH, dir_.path(), bf16);
  ASSERT_EQ(b.status, 0) << b.err;
  EXPECT_NE(b.out.find("bf16 backward: "), std::string::npos) << b.out;
  EXPECT_NE(b.out.find("speedup vs the float32 backward: "), std::string::npos) << b.out;
  std::vector<std::string> bf16_json = bf16;
  bf16_json.push_back("--json");
  const testing::CommandRun bj = testing::run_program(QKV_CLI_PATH, dir_.path(), bf16_json);
  ASSERT_EQ(bj.status, 0) << bj.err;
  for (const char* field : {"\"dtype\": \"bf16\"", "\"bf16_dot_products\": ",
                            "\"f32_backward\": {\"kernel\": \"", "\"speedup_vs_f32_backward\": "}) {
    EXPECT_NE(bj.out.find(field), std::string::npos) << field << " in " << bj.out;
  }
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
