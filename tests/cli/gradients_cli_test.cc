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

// qkv bench --backward: the forward bench's JSON fields (chosen.ms, chosen.gflops, baseline for
// the unfused backward) plus forward_ms; the form, not the figures (timings on a shared host).
TEST_F(CliGradients, BenchBackwardReportsTheForwardBenchsFields) {
  const testing::CommandRun r = testing::run_program(
      QKV_CLI_PATH, dir_.path(),
      {"bench", "--backward", "--n", "40",        "--d",       "8",     "--heads",
       "2",     "--kv-heads", "1",   "--causal",  "--threads", "2",     "--peak-gflops",
       "100",   "--warmup",   "0",   "--repeats", "2",         "--json"});
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

}  // namespace
}  // namespace qkv
