// Float64 end to end: float64 .npy inputs are computed in float64 by default (qkv attention
// --out-dtype f64 carries float64 accuracy), --dtype f32 opts into float32, and bench --dtype
// f64 times the float64 fused kernel against the float32 one and the reference in one run.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/kernel.h"
#include "qkv/io.h"
#include "support/command_runner.h"
#include "support/test_support.h"

namespace qkv {
namespace {

namespace fs = std::filesystem;

using testing::CommandRun;

CommandRun run_qkv(const fs::path& dir, const std::vector<std::string>& args) {
  return testing::run_program(QKV_CLI_PATH, dir, args);
}

constexpr std::int64_t kH = 2, kN = 45, kNk = 90, kD = 24, kDv = 20;

// max |out - softmax(q·k / sqrt(D), causal bottom-right)·v|, the right side in plain float64.
double error_against_float64(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out) {
  return testing::max_abs_diff(testing::causal_attention_f64(q, k, v).out, out);
}

TEST(CliFloat64, Float64NpyInputsComputeInFloat64UnlessDtypeF32) {
  testing::ScratchDir dir;
  const Tensor q = testing::random_tensor(DType::kF64, {kH, kN, kD}, 61);
  const Tensor k = testing::random_tensor(DType::kF64, {kH, kNk, kD}, 62);
  const Tensor v = testing::random_tensor(DType::kF64, {kH, kNk, kDv}, 63);
  write_npy(dir / "q.npy", q.view(), DType::kF64);
  write_npy(dir / "k.npy", k.view(), DType::kF64);
  write_npy(dir / "v.npy", v.view(), DType::kF64);
  const std::vector<std::string> common = {"attention", "--q",   "q.npy",    "--k",         "k.npy",
                                           "--v",       "v.npy", "--causal", "--out-dtype", "f64"};
  const auto run_with = [&](std::vector<std::string> extra, const std::string& out) {
    std::vector<std::string> args = common;
    args.insert(args.end(), extra.begin(), extra.end());
    args.insert(args.end(), {"--out", out});
    return run_qkv(dir.path(), args);
  };

  setenv("QKV_VERBOSE", "1", 1);
  const CommandRun f64 = run_with({}, "o64.npy");
  unsetenv("QKV_VERBOSE");
  ASSERT_EQ(f64.status, 0) << f64.err;
  // In a SIMD build the fused kernel's float64 path runs; a portable build's fused_scalar.
  if (!kernels::simd_targets().empty()) {
    EXPECT_NE(f64.err.find("fused_hwy: chosen (SIMD target"), std::string::npos) << f64.err;
    EXPECT_NE(f64.err.find("float64)"), std::string::npos) << f64.err;
  }
  const Tensor o64 = read_npy(dir / "o64.npy");
  ASSERT_EQ(o64.dtype(), DType::kF64);
  EXPECT_LT(error_against_float64(q, k, v, o64), 1e-14);

  ASSERT_EQ(run_with({"--kernel", "reference"}, "oref.npy").status, 0);
  EXPECT_LT(testing::max_abs_diff(o64.view(), read_npy(dir / "oref.npy").view()), 1e-14);

  const CommandRun f32 = run_with({"--dtype", "f32"}, "o32.npy");
  ASSERT_EQ(f32.status, 0) << f32.err;
  const double e32 = error_against_float64(q, k, v, read_npy(dir / "o32.npy"));
  EXPECT_GT(e32, 1e-10);  // float32 arithmetic
  EXPECT_LT(e32, 1e-5);
}

// The number after "key": in the JSON, or NaN if the key is missing.
double json_number(const std::string& json, const std::string& key) {
  const std::size_t at = json.find("\"" + key + "\": ");
  if (at == std::string::npos) return std::numeric_limits<double>::quiet_NaN();
  return std::stod(json.substr(at + key.size() + 4));
}

TEST(CliFloat64, BenchDtypeF64TimesFloat32FusedAndTheReferenceInTheSameRun) {
  testing::ScratchDir dir;
  const CommandRun run = run_qkv(
      dir.path(), {"bench", "--n", "40", "--d", "8", "--heads", "2", "--threads", "2", "--dtype",
                   "f64", "--peak-gflops", "100", "--warmup", "0", "--repeats", "2", "--json"});
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_NE(run.out.find("\"dtype\": \"f64\""), std::string::npos) << run.out;
  EXPECT_GT(json_number(run.out, "speedup_vs_reference"), 0.0) << run.out;
  if (!kernels::simd_targets().empty()) {
    EXPECT_NE(run.out.find("\"path\": \"float64\""), std::string::npos) << run.out;
    EXPECT_GT(json_number(run.out, "speedup_vs_f32_fused"), 0.0) << run.out;
  }
  const CommandRun text = run_qkv(
      dir.path(), {"bench", "--n", "40", "--d", "8", "--heads", "2", "--threads", "2", "--dtype",
                   "f64", "--peak-gflops", "100", "--warmup", "0", "--repeats", "2"});
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("float64 fused / reference GFLOP/s: "), std::string::npos) << text.out;
}

}  // namespace
}  // namespace qkv
