// End-to-end tests of decoding from a KV cache on the command line: `qkv bench --decode` and
// `qkv decode`, their reports, --check for every storage type, the sliding window, and bad flags
// as usage errors (status 2, one stderr line naming the flag). Sizes are tiny: each run takes
// well under a second.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "support/command_runner.h"
#include "support/test_support.h"

namespace qkv {
namespace {

using testing::CommandRun;

CommandRun run_qkv(const std::vector<std::string>& args) {
  const testing::ScratchDir dir;
  return testing::run_program(QKV_CLI_PATH, dir.path(), args, 60);
}

// The number after "key": in a one-object JSON report, NaN when absent.
double json_number(const std::string& json, const std::string& key) {
  const std::size_t at = json.find("\"" + key + "\": ");
  if (at == std::string::npos) return std::numeric_limits<double>::quiet_NaN();
  return std::stod(json.substr(at + key.size() + 4));
}

bool portable_build(const std::string& json) {
  return json.find("\"simd_target\": \"none") != std::string::npos;
}

// The section of `json` from "key": to the end of its object.
std::string json_object(const std::string& json, const std::string& key) {
  const std::size_t at = json.find("\"" + key + "\": {");
  if (at == std::string::npos) return "";
  return json.substr(at, json.find('}', at) - at + 1);
}

TEST(DecodeCli, BenchDecodeReportsBytesBandwidthAndBaselines) {
  // One length for both sequences: the baselines run on the gathered float32 K/V.
  const CommandRun run = run_qkv(
      {"bench",     "--decode",   "--nk",      "2048", "--batch",  "2",    "--heads",
       "4",         "--kv-heads", "2",         "--d",  "32",       "--dv", "16",
       "--threads", "2",          "--repeats", "3",    "--warmup", "1",    "--bandwidth-gbs",
       "10",        "--json"});
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_TRUE(run.err.empty()) << run.err;
  EXPECT_EQ(json_number(run.out, "batch"), 2.0) << run.out;
  EXPECT_EQ(json_number(run.out, "total_rows"), 4096.0) << run.out;
  EXPECT_EQ(json_number(run.out, "triad_gbs"), 10.0) << run.out;
  EXPECT_NE(run.out.find("\"triad_measured\": false"), std::string::npos) << run.out;
  // 2 sequences x 2048 rows x 2 kv heads x (32 + 16) float32 values.
  EXPECT_EQ(json_number(run.out, "kv_bytes_per_call"), 2.0 * 2048 * 2 * 48 * 4) << run.out;
  const std::string cached = json_object(run.out, "cached");
  const std::string expected_kernel = portable_build(run.out) ? "decode_scalar" : "decode_hwy";
  EXPECT_NE(cached.find("\"kernel\": \"" + expected_kernel + "\""), std::string::npos) << run.out;
  EXPECT_GT(json_number(cached, "ms"), 0.0) << run.out;
  EXPECT_LE(json_number(cached, "min_ms"), json_number(cached, "ms")) << run.out;
  EXPECT_EQ(json_number(cached, "runs"), 3.0) << run.out;
  EXPECT_GT(json_number(cached, "gbs"), 0.0) << run.out;
  EXPECT_NEAR(json_number(cached, "fraction_of_triad"), json_number(cached, "gbs") / 10.0, 1e-3)
      << run.out;
  const std::string unfused = json_object(run.out, "baseline_unfused_blas");
  EXPECT_NE(unfused.find("\"kernel\": \"unfused_blas\""), std::string::npos) << run.out;
  EXPECT_GT(json_number(unfused, "ratio_to_cached"), 0.0) << run.out;
  const std::string fused = json_object(run.out, "baseline_fused_hwy");
  if (portable_build(run.out)) {
    EXPECT_NE(fused.find("not_run"), std::string::npos) << run.out;
  } else {
    EXPECT_GT(json_number(fused, "ratio_to_cached"), 0.0) << run.out;
  }
}

TEST(DecodeCli, BenchDecodeCountsInt8ScalesAndMixedLengths) {
  // d = 40 is two int8 blocks per K row, dv = 24 one per V row: 64 values + 3 scales a row.
  const CommandRun run = run_qkv({"bench",
                                  "--decode",
                                  "--lengths",
                                  "100,300,7",
                                  "--heads",
                                  "2",
                                  "--kv-heads",
                                  "1",
                                  "--d",
                                  "40",
                                  "--dv",
                                  "24",
                                  "--dtype",
                                  "int8",
                                  "--page-rows",
                                  "16",
                                  "--threads",
                                  "1",
                                  "--repeats",
                                  "2",
                                  "--warmup",
                                  "0",
                                  "--bandwidth-gbs",
                                  "5",
                                  "--json"});
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_EQ(json_number(run.out, "batch"), 3.0) << run.out;  // B from the lengths
  EXPECT_NE(run.out.find("\"dtype\": \"int8\""), std::string::npos) << run.out;
  EXPECT_EQ(json_number(run.out, "kv_bytes_per_call"), 407.0 * (64 + 3 * 4)) << run.out;
  // Lengths differ: no [B, ...] tensor for the baselines, and the report says so.
  EXPECT_NE(json_object(run.out, "baseline_unfused_blas").find("not_run"), std::string::npos)
      << run.out;
  EXPECT_GT(json_number(json_object(run.out, "cached"), "gbs"), 0.0) << run.out;

  const CommandRun mixed = run_qkv({"bench",         "--decode", "--mixed-lengths", "10,1000",
                                    "--batch",       "5",        "--heads",         "2",
                                    "--d",           "16",       "--dtype",         "bf16",
                                    "--threads",     "1",        "--repeats",       "1",
                                    "--warmup",      "0",        "--bandwidth-gbs", "5",
                                    "--no-baseline", "--json"});
  ASSERT_EQ(mixed.status, 0) << mixed.err;
  const std::size_t at = mixed.out.find("\"lengths\": [");
  ASSERT_NE(at, std::string::npos) << mixed.out;
  const std::string list = mixed.out.substr(at + 12, mixed.out.find(']', at) - at - 12);
  EXPECT_EQ(std::count(list.begin(), list.end(), ','), 4) << list;
  EXPECT_EQ(mixed.out.find("baseline"), std::string::npos) << mixed.out;
  // The same lengths on every run.
  const CommandRun again = run_qkv({"bench",         "--decode", "--mixed-lengths", "10,1000",
                                    "--batch",       "5",        "--heads",         "2",
                                    "--d",           "16",       "--dtype",         "bf16",
                                    "--threads",     "1",        "--repeats",       "1",
                                    "--warmup",      "0",        "--bandwidth-gbs", "5",
                                    "--no-baseline", "--json"});
  ASSERT_EQ(again.status, 0) << again.err;
  EXPECT_NE(again.out.find("\"lengths\": [" + list + "]"), std::string::npos) << again.out;
}

TEST(DecodeCli, BenchDecodeTextNamesTheEnvironmentAndTheTriad) {
  const CommandRun run =
      run_qkv({"bench", "--decode", "--nk", "1000", "--heads", "2", "--d", "16", "--threads", "1",
               "--repeats", "1", "--warmup", "0", "--bandwidth-gbs", "7.5"});
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_NE(run.out.find("1 thread(s), SIMD "), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("memory bandwidth (STREAM triad) 7.5 GB/s"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("% of triad"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("baseline  unfused_blas"), std::string::npos) << run.out;
}

TEST(DecodeCli, DecodeCheckPassesForEveryStorage) {
  for (const char* dtype : {"f32", "bf16", "f16", "int8"}) {
    SCOPED_TRACE(dtype);
    const CommandRun run =
        run_qkv({"decode", "--prompt", "40",  "--tokens",  "6",  "--heads", "4",     "--kv-heads",
                 "2",      "--d",      "40",  "--dv",      "24", "--batch", "2",     "--page-rows",
                 "16",     "--dtype",  dtype, "--threads", "2",  "--check", "--json"});
    ASSERT_EQ(run.status, 0) << run.err << run.out;
    EXPECT_TRUE(run.err.empty()) << run.err;
    const std::string check = json_object(run.out, "check");
    EXPECT_NE(check.find("\"ok\": true"), std::string::npos) << run.out;
    const double error = json_number(check, "max_abs_error");
    EXPECT_GE(error, 0.0) << run.out;
    EXPECT_LE(error, json_number(check, "tolerance")) << run.out;
    EXPECT_GT(json_number(check, "max_abs_v"), 0.5) << run.out;
    EXPECT_GT(json_number(run.out, "tokens_per_s"), 0.0) << run.out;
    EXPECT_EQ(json_number(run.out, "length"), 46.0) << run.out;
    EXPECT_EQ(json_number(run.out, "pages_in_use"), 6.0) << run.out;  // 2 x ceil(46 / 16)
  }
  const CommandRun text = run_qkv({"decode", "--prompt", "5", "--tokens", "3", "--heads", "2",
                                   "--d", "8", "--threads", "1", "--check"});
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("check: max abs error "), std::string::npos) << text.out;
  EXPECT_NE(text.out.find(": ok\n"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("tokens/s"), std::string::npos) << text.out;
}

TEST(DecodeCli, DecodeWindowKeepsOnlyTheWindowsPages) {
  // 100 + 20 rows, window 24: the last query (row 119) attends rows 96..119, pages of 8 rows:
  // rows before 96 are forgotten and pages 12, 13 and 14 stay, for each of the 2 sequences.
  const CommandRun run =
      run_qkv({"decode",      "--prompt", "100",     "--tokens",  "20",      "--window", "24",
               "--page-rows", "8",        "--batch", "2",         "--heads", "2",        "--d",
               "16",          "--dtype",  "f16",     "--threads", "2",       "--check",  "--json"});
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_EQ(json_number(run.out, "first_stored_row"), 96.0) << run.out;
  EXPECT_EQ(json_number(run.out, "pages_in_use"), 6.0) << run.out;
  EXPECT_NE(json_object(run.out, "check").find("\"ok\": true"), std::string::npos) << run.out;
}

TEST(DecodeCli, DecodeWithNoTokensReportsNone) {
  const CommandRun run = run_qkv({"decode", "--prompt", "10", "--tokens", "0", "--heads", "2",
                                  "--d", "8", "--threads", "1", "--check", "--json"});
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_EQ(json_number(run.out, "tokens_per_s"), 0.0) << run.out;
  EXPECT_EQ(json_number(run.out, "length"), 10.0) << run.out;
  EXPECT_NE(run.out.find("\"kernel\": \"none\""), std::string::npos) << run.out;
}

TEST(DecodeCli, BadFlagsAreUsageErrorsNamingTheFlag) {
  const std::vector<std::string> bench = {
      "bench", "--decode", "--heads", "4", "--d", "8", "--threads", "1", "--bandwidth-gbs", "5"};
  const auto with = [](std::vector<std::string> base, const std::vector<std::string>& extra) {
    base.insert(base.end(), extra.begin(), extra.end());
    return base;
  };
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {with(bench, {"--nk", "64", "--dtype", "int4"}), "--dtype"},
      {with(bench, {"--nk", "-1"}), "--nk"},
      {with(bench, {}), "--nk"},
      {with(bench, {"--lengths", "5,6", "--batch", "3"}), "--lengths"},
      {with(bench, {"--lengths", "5,x"}), "--lengths"},
      {with(bench, {"--lengths", "5,0"}), "--lengths"},
      {with(bench, {"--mixed-lengths", "10"}), "--mixed-lengths"},
      {with(bench, {"--mixed-lengths", "100,10"}), "--mixed-lengths"},
      {with(bench, {"--nk", "64", "--kv-heads", "3"}), "--kv-heads"},
      {with(bench, {"--nk", "64", "--kernel", "fused_hwy"}), "--kernel"},
      {with(bench, {"--nk", "64", "--page-rows", "0"}), "--page-rows"},
      {with(bench, {"--nk", "64", "--n", "8"}), "--n"},
      {{"bench", "--n", "8", "--d", "8", "--heads", "1", "--dtype", "int8"}, "--dtype"},
      {{"bench", "--peak", "--bandwidth-gbs", "3"}, "--bandwidth-gbs"},
      {{"decode", "--dtype", "int4"}, "--dtype"},
      {{"decode", "--tokens", "-1"}, "--tokens"},
      {{"decode", "--heads", "4", "--kv-heads", "3"}, "--kv-heads"},
      {{"decode", "--window", "0"}, "--window"},
      {{"decode", "--batch", "0"}, "--batch"},
      {{"decode", "--d", "0"}, "--d"},
      {{"decode", "--kernel", "unfused_blas"}, "--kernel"},
  };
  for (const auto& [args, flag] : cases) {
    std::string line;
    for (const std::string& a : args) line += a + " ";
    SCOPED_TRACE(line);
    const CommandRun run = run_qkv(args);
    EXPECT_EQ(run.status, 2) << run.err;
    ASSERT_FALSE(run.err.empty());
    EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
    EXPECT_NE(run.err.find(flag), std::string::npos) << run.err;
    EXPECT_TRUE(run.out.empty()) << run.out;
  }
}

}  // namespace
}  // namespace qkv
