// End-to-end tests of the qkv executable: exit status, exactly one stderr line on failure,
// outputs equal to the library's, and no output created or altered by a failed command.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/kernel.h"
#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/io.h"
#include "qkv/layer.h"
#include "io/safetensors_builder.h"
#include "support/command_runner.h"
#include "support/refusal.h"
#include "support/test_support.h"

namespace qkv {
namespace {

namespace fs = std::filesystem;

using testing::CommandRun;
using testing::files_in;
using testing::slurp;

CommandRun run_qkv(const fs::path& dir, const std::vector<std::string>& args) {
  return testing::run_program(QKV_CLI_PATH, dir, args);
}

// A failed command: status 1..127, one non-empty stderr line that mentions `mentions`, and the
// folder's files exactly as before.
void expect_clean_failure(const fs::path& dir, const std::vector<std::string>& args,
                          const std::string& mentions) {
  testing::expect_refused(QKV_CLI_PATH, dir, args, mentions, {1, 127});
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    q_ = testing::random_tensor(DType::kF32, {2, 4, 9, 8}, 1);
    k_ = testing::random_tensor(DType::kF32, {2, 2, 11, 8}, 2);
    v_ = testing::random_tensor(DType::kF32, {2, 2, 11, 5}, 3);
    write_npy(dir_ / "q.npy", q_.view(), DType::kF32);
    write_npy(dir_ / "k.npy", k_.view(), DType::kF32);
    write_npy(dir_ / "v.npy", v_.view(), DType::kF64);  // inputs may mix float types
  }

  testing::ScratchDir dir_;
  Tensor q_, k_, v_;
};

TEST_F(CliTest, AttentionWritesWhatTheLibraryComputes) {
  const CommandRun run = run_qkv(dir_.path(), {"attention", "--q", "q.npy", "--k", "k.npy", "--v",
                                        "v.npy", "--causal", "--out", "o.npy", "--weights",
                                        "w.npy", "--lse", "l.npy", "--out-dtype", "f64"});
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_TRUE(run.err.empty());
  AttentionOptions o;
  o.causal = true;
  o.return_weights = o.return_lse = true;
  o.out_dtype = DType::kF64;
  const AttentionResult expected = attention(q_.view(), k_.view(), v_.view(), o);
  const Tensor out = read_npy(dir_ / "o.npy");
  const Tensor weights = read_npy(dir_ / "w.npy");
  const Tensor lse = read_npy(dir_ / "l.npy");
  EXPECT_EQ(out.dtype(), DType::kF64);
  EXPECT_EQ(out.shape(), (Shape{2, 4, 9, 5}));
  EXPECT_EQ(weights.shape(), (Shape{2, 4, 9, 11}));
  EXPECT_EQ(lse.shape(), (Shape{2, 4, 9}));
  EXPECT_EQ(testing::max_abs_diff(out.view(), expected.out.view()), 0.0);
  EXPECT_EQ(testing::max_abs_diff(weights.view(), expected.weights.view()), 0.0);
  EXPECT_EQ(testing::max_abs_diff(lse.view(), expected.lse.view()), 0.0);
}

TEST_F(CliTest, MaskScaleAndWindowFlagsReachTheLibrary) {
  const Tensor mask = testing::random_tensor(DType::kBool, {2, 1, 1, 11}, 4);
  write_npy(dir_ / "m.npy", mask.view(), DType::kBool);
  const CommandRun run = run_qkv(dir_.path(), {"attention", "--q", "q.npy", "--k", "k.npy", "--v",
                                        "v.npy", "--mask", "m.npy", "--scale", "0.5", "--window",
                                        "3,-1", "--threads", "2", "--out", "o.npy"});
  ASSERT_EQ(run.status, 0) << run.err;
  AttentionOptions o;
  o.mask = mask.view();
  o.scale = 0.5;
  o.window = Window{3, -1};
  const AttentionResult expected = attention(q_.view(), k_.view(), v_.view(), o);
  const Tensor out = read_npy(dir_ / "o.npy");
  EXPECT_EQ(out.dtype(), DType::kF32);
  EXPECT_EQ(testing::max_abs_diff(out.view(), expected.out.view()), 0.0);
}

TEST_F(CliTest, CheckReportsErrorsAgainstTheReferenceAndVerboseNamesTheKernel) {
  const CommandRun run = run_qkv(dir_.path(), {"attention", "--q", "q.npy", "--k", "k.npy", "--v",
                                               "v.npy", "--out", "o.npy", "--lse", "l.npy",
                                               "--check"});
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_NE(run.out.find("against the float64 reference"), std::string::npos) << run.out;
  // The reported error is the float32 kernel's real one: small, but read back and bounded.
  const auto at = run.out.find("out     max abs error ");
  ASSERT_NE(at, std::string::npos) << run.out;
  const double error = std::stod(run.out.substr(at + 22));
  EXPECT_LT(error, 1e-5);
  EXPECT_NE(run.out.find("lse     max abs error"), std::string::npos) << run.out;

  setenv("QKV_VERBOSE", "1", 1);
  const CommandRun verbose = run_qkv(dir_.path(), {"attention", "--q", "q.npy", "--k", "k.npy",
                                                   "--v", "v.npy", "--out", "o.npy", "--kernel",
                                                   "reference"});
  unsetenv("QKV_VERBOSE");
  ASSERT_EQ(verbose.status, 0) << verbose.err;
  EXPECT_NE(verbose.err.find("reference: chosen (--kernel)"), std::string::npos) << verbose.err;
}

// float16 .npy inputs are kept as stored and run by the fused kernel; the output matches a
// float64 attention computed here from the same (exactly widened) values. A float16 mask from a
// safetensors file is widened to float32 by the command.
TEST(CliSixteenBit, Float16NpyInputsRunFusedAndMatchTheFloat64Reference) {
  testing::ScratchDir dir;
  constexpr std::int64_t kH = 2, kN = 37, kNk = 70, kD = 16, kDv = 24;
  const Tensor q = testing::random_tensor(DType::kF16, {kH, kN, kD}, 41);
  const Tensor k = testing::random_tensor(DType::kF16, {kH, kNk, kD}, 42);
  const Tensor v = testing::random_tensor(DType::kF16, {kH, kNk, kDv}, 43);
  write_npy(dir / "q.npy", q.view(), DType::kF16);
  write_npy(dir / "k.npy", k.view(), DType::kF16);
  write_npy(dir / "v.npy", v.view(), DType::kF16);
  EXPECT_EQ(read_npy(dir / "q.npy").dtype(), DType::kF16);

  setenv("QKV_VERBOSE", "1", 1);
  const CommandRun run =
      run_qkv(dir.path(), {"attention", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--causal",
                           "--out", "o.npy", "--lse", "l.npy", "--check"});
  unsetenv("QKV_VERBOSE");
  ASSERT_EQ(run.status, 0) << run.err;
  // The float32 kernel of a prefill shape takes them: fused_hwy, or in a build without SIMD
  // unfused_blas (which widens them while packing, like the fused kernels).
  const std::string chosen = kernels::simd_targets().empty() ? "unfused_blas" : "fused_hwy";
  EXPECT_NE(run.err.find(chosen + ": chosen"), std::string::npos) << run.err;
  EXPECT_NE(run.out.find("check: kernel " + chosen), std::string::npos) << run.out;

  const Tensor out = read_npy(dir / "o.npy");
  const Tensor lse = read_npy(dir / "l.npy");
  ASSERT_EQ(out.dtype(), DType::kF32);
  ASSERT_EQ(out.shape(), (Shape{kH, kN, kDv}));
  const testing::CausalAttention64 plain = testing::causal_attention_f64(q, k, v);
  EXPECT_LT(testing::max_abs_diff(plain.out, out), 1e-6);
  EXPECT_LT(testing::max_abs_diff(plain.lse, lse), 1e-5);

  // A float16 additive mask from a safetensors file: the same as its float32 values.
  Tensor mask32 = testing::random_tensor(DType::kF32, {kN, kNk}, 44, -2.0, 2.0);
  mask32.data_as<float>()[5] = -std::numeric_limits<float>::infinity();
  const Tensor mask16 = mask32.to(DType::kF16);
  testing::write_bytes(dir / "m.safetensors",
                       testing::safetensors_bytes({testing::safetensors_item("m", mask32, "F16")}));
  const CommandRun masked =
      run_qkv(dir.path(), {"attention", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--mask",
                           "m.safetensors:m", "--out", "om.npy"});
  ASSERT_EQ(masked.status, 0) << masked.err;
  const Tensor widened = mask16.to(DType::kF32);
  AttentionOptions o;
  o.mask = widened.view();
  const AttentionResult expected = attention(q.view(), k.view(), v.view(), o);
  EXPECT_EQ(testing::max_abs_diff(read_npy(dir / "om.npy").view(), expected.out.view()), 0.0);
}

TEST_F(CliTest, BadInputFailsCleanlyAndLeavesExistingOutputsAlone) {
  // An existing output must survive a failed command byte for byte.
  write_npy(dir_ / "o.npy", q_.view(), DType::kF32);
  const std::string original = slurp(dir_ / "o.npy");
  expect_clean_failure(dir_.path(),
                       {"attention", "--q", "q.npy", "--k", "missing.npy", "--v", "v.npy",
                        "--out", "o.npy", "--weights", "w.npy"},
                       "missing.npy");
  EXPECT_EQ(slurp(dir_ / "o.npy"), original);

  Tensor bad_q = q_.to(DType::kF32);
  bad_q.data_as<float>()[5] = std::numeric_limits<float>::infinity();
  write_npy(dir_ / "inf.npy", bad_q.view(), DType::kF32);
  expect_clean_failure(dir_.path(),
                       {"attention", "--q", "inf.npy", "--k", "k.npy", "--v", "v.npy", "--out",
                        "o.npy"},
                       "inf.npy");
  expect_clean_failure(dir_.path(),
                       {"attention", "--q", "q.npy", "--k", "k.npy", "--v", "q.npy", "--out",
                        "o.npy"},
                       "q.npy");
  expect_clean_failure(dir_.path(),
                       {"attention", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--window",
                        "3", "--out", "o.npy"},
                       "--window");
  {
    std::ofstream junk(dir_ / "junk.npy", std::ios::binary);
    junk << "not numpy at all";
  }
  expect_clean_failure(dir_.path(),
                       {"attention", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--mask",
                        "junk.npy", "--out", "o.npy"},
                       "junk.npy");
  // The second output cannot be written: neither appears.
  expect_clean_failure(dir_.path(),
                       {"attention", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--out",
                        "new.npy", "--lse", "no/such/dir/l.npy"},
                       "no/such/dir/l.npy");
  EXPECT_EQ(slurp(dir_ / "o.npy"), original);
}

TEST_F(CliTest, UsageErrorsAreOneLineToo) {
  expect_clean_failure(dir_.path(), {"attention", "--k", "k.npy", "--v", "v.npy", "--out", "o"},
                       "--q");
  expect_clean_failure(dir_.path(), {"frobnicate"}, "frobnicate");
  expect_clean_failure(dir_.path(),
                       {"attention", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--out",
                        "o.npy", "--out-dtype", "bf16"},
                       "bf16");
}

TEST_F(CliTest, HelpAndVersion) {
  for (const char* command : {"attention", "layer"}) {
    const CommandRun run = run_qkv(dir_.path(), {command, "--help"});
    EXPECT_EQ(run.status, 0);
    EXPECT_NE(run.out.find("Example:"), std::string::npos) << run.out;
    EXPECT_NE(run.out.find("--causal"), std::string::npos);
  }
  const CommandRun version = run_qkv(dir_.path(), {"--version"});
  EXPECT_EQ(version.status, 0);
  EXPECT_EQ(version.out, std::string("qkv ") + qkv::version() + "\n");
}

// The number after "key": in a one-line JSON object, or NaN if the key is missing.
double json_number(const std::string& json, const std::string& key) {
  const std::size_t at = json.find("\"" + key + "\": ");
  if (at == std::string::npos) return std::numeric_limits<double>::quiet_NaN();
  return std::stod(json.substr(at + key.size() + 4));
}

TEST_F(CliTest, BenchPeakReportsThePeakTheMicroKernelCeilingAndTheTriad) {
  // Both probes are timings, and a loaded machine (ctest -j, CI) can slow either one: the test
  // holds the report's form, not a relation between the two figures.
  const CommandRun run = run_qkv(dir_.path(), {"bench", "--peak", "--threads", "1", "--json"});
  ASSERT_EQ(run.status, 0) << run.err;
  const double peak = json_number(run.out, "peak_gflops");
  const double l1_fed = json_number(run.out, "l1_fed_gflops");
  ASSERT_FALSE(std::isnan(peak)) << run.out;
  ASSERT_FALSE(std::isnan(l1_fed)) << run.out;
  EXPECT_GT(json_number(run.out, "triad_gbs"), 0.0) << run.out;  // in every build
  // 0 without AVX512-BF16 (and in a portable build), but always reported.
  EXPECT_GE(json_number(run.out, "bf16_dot_peak_gflops"), 0.0) << run.out;
  if (run.out.find("\"simd_target\": \"none") == std::string::npos) {  // not a portable build
    EXPECT_GT(peak, 0.0) << run.out;
    EXPECT_GT(l1_fed, 0.0) << run.out;
  }
  const CommandRun text = run_qkv(dir_.path(), {"bench", "--peak", "--threads", "1"});
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("fp32 FMA peak: "), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("FMAs fed from L1 as in the fused micro-kernels: "), std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find("memory bandwidth (STREAM triad, 3 x 128 MiB"), std::string::npos)
      << text.out;
}

TEST_F(CliTest, BenchDtypeStoresTheInputsInThatTypeAndNamesThePath) {
  const CommandRun run = run_qkv(
      dir_.path(), {"bench", "--n", "40", "--d", "8", "--heads", "2", "--threads", "2",
                    "--dtype", "bf16", "--peak-gflops", "100", "--warmup", "0", "--repeats", "2",
                    "--json"});
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_NE(run.out.find("\"dtype\": \"bf16\""), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("\"path\": \""), std::string::npos) << run.out;
  if (run.out.find("\"simd_target\": \"none") == std::string::npos) {
    // The float32 fused kernel on the same values, timed in the same run.
    EXPECT_GT(json_number(run.out, "speedup_vs_f32_fused"), 0.0) << run.out;
  }
}

TEST_F(CliTest, BenchTimesTheChosenKernelAgainstTheBaseline) {
  // A forced kernel other than the baseline, so the baseline runs in every build (a portable
  // build's default for this shape is unfused_blas itself, which bench does not time twice).
  const CommandRun run = run_qkv(
      dir_.path(), {"bench", "--n", "40", "--d", "8", "--heads", "2", "--kv-heads", "1", "--causal",
                    "--threads", "2", "--peak-gflops", "100", "--warmup", "0", "--repeats", "2",
                    "--kernel", "fused_scalar", "--json"});
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_EQ(json_number(run.out, "n"), 40.0) << run.out;
  EXPECT_EQ(json_number(run.out, "peak_gflops"), 100.0) << run.out;
  EXPECT_NE(run.out.find("\"chosen\": {\"kernel\": \"fused_scalar\""), std::string::npos)
      << run.out;
  EXPECT_NE(run.out.find("\"baseline\": {\"kernel\": \"unfused_blas\""), std::string::npos)
      << run.out;
  EXPECT_GT(json_number(run.out, "speedup_vs_baseline"), 0.0) << run.out;
}

TEST_F(CliTest, LayerWritesWhatTheLibraryComputes) {
  const Tensor x = testing::random_tensor(DType::kF32, {2, 6, 10}, 5);
  const Tensor wq = testing::random_tensor(DType::kF32, {10, 8}, 6);
  const Tensor wk = testing::random_tensor(DType::kF32, {10, 4}, 7);
  const Tensor wv = testing::random_tensor(DType::kF32, {10, 6}, 8);
  const Tensor wo = testing::random_tensor(DType::kF32, {12, 3}, 9);
  const Tensor bo = testing::random_tensor(DType::kF32, {3}, 10);
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"x.npy", &x},
                                {"wq.npy", &wq}, {"wk.npy", &wk}, {"wv.npy", &wv},
                                {"wo.npy", &wo}, {"bo.npy", &bo}}) {
    write_npy(dir_ / name, t->view(), DType::kF32);
  }
  const CommandRun run = run_qkv(dir_.path(), {"layer", "--x", "x.npy", "--wq", "wq.npy", "--wk",
                                        "wk.npy", "--wv", "wv.npy", "--wo", "wo.npy", "--bo",
                                        "bo.npy", "--heads", "4", "--kv-heads", "2", "--causal",
                                        "--out", "o.npy", "--weights", "w.npy"});
  ASSERT_EQ(run.status, 0) << run.err;
  LayerOptions o;
  o.heads = 4;
  o.kv_heads = 2;
  o.attention.causal = true;
  o.attention.return_weights = true;
  LayerWeights w{wq.view(), wk.view(), wv.view()};
  w.wo = wo.view();
  w.bo = bo.view();
  const LayerResult expected = multi_head_attention(x.view(), w, o);
  const Tensor out = read_npy(dir_ / "o.npy");
  EXPECT_EQ(out.shape(), (Shape{2, 6, 3}));
  EXPECT_EQ(testing::max_abs_diff(out.view(), expected.out.view()), 0.0);
  EXPECT_EQ(read_npy(dir_ / "w.npy").shape(), (Shape{2, 4, 6, 6}));

  expect_clean_failure(dir_.path(),
                       {"layer", "--x", "x.npy", "--wq", "wq.npy", "--wk", "wk.npy", "--wv",
                        "wv.npy", "--heads", "4", "--out", "o2.npy"},
                       "wk.npy");
  expect_clean_failure(dir_.path(),
                       {"layer", "--x", "x.npy", "--wq", "wq.npy", "--wk", "wk.npy", "--wv",
                        "wv.npy", "--heads", "4", "--kv-heads", "2", "--bo", "bo.npy", "--out",
                        "o2.npy"},
                       "bo.npy");
}

}  // namespace
}  // namespace qkv
