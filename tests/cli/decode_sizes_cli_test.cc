// Impossible decode sizes on the command line: `qkv decode` and `qkv bench --decode` check what
// their cache and buffers will hold against --max-memory (and int64) before they allocate, so
// a size no machine holds is one stderr line and a non-zero exit at once, never minutes of
// appending first.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "support/command_runner.h"
#include "support/test_support.h"

namespace qkv {
namespace {

using testing::CommandRun;

struct TimedRun {
  CommandRun run;
  double seconds = 0.0;
};

// A refusal takes milliseconds; 20 s only bounds a run that would not stop.
TimedRun run_qkv(const std::vector<std::string>& args) {
  const testing::ScratchDir dir;
  const auto start = std::chrono::steady_clock::now();
  TimedRun timed{testing::run_program(QKV_CLI_PATH, dir.path(), args, 20), 0.0};
  timed.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return timed;
}

void expect_refused_at_once(const std::vector<std::string>& args, const std::string& says) {
  std::string line;
  for (const std::string& a : args) line += a + " ";
  SCOPED_TRACE(line);
  const TimedRun t = run_qkv(args);
  EXPECT_NE(t.run.status, 0) << t.run.err;
  EXPECT_NE(t.run.status, 137) << "killed after 20 s: the sizes were not checked first";
  EXPECT_LT(t.seconds, 5.0);
  EXPECT_EQ(std::count(t.run.err.begin(), t.run.err.end(), '\n'), 1) << t.run.err;
  EXPECT_NE(t.run.err.find(says), std::string::npos) << t.run.err;
  EXPECT_TRUE(t.run.out.empty()) << t.run.out;
}

TEST(DecodeSizesCli, DecodeBeyondTheBudgetIsRefusedBeforeAllocating) {
  // 2^62 prompt rows: far past any default budget.
  expect_refused_at_once({"decode", "--prompt", "4611686018427387904", "--tokens", "4"},
                         "--max-memory: qkv decode needs ");
  // 10^6 rows of 8 heads x 128 floats (4 GiB) against 64 MiB.
  expect_refused_at_once({"decode", "--prompt", "1000000", "--tokens", "4", "--heads", "8", "--d",
                          "64", "--max-memory", "64M"},
                         "the memory budget is 67108864 bytes (64 MiB)");
  // --check's float64 gathers count too.
  expect_refused_at_once({"decode", "--prompt", "20000", "--tokens", "1", "--heads", "1", "--d",
                          "64", "--check", "--max-memory", "16M"},
                         "--max-memory: qkv decode needs ");
  // Rows that pass int64: a usage error naming the flag.
  expect_refused_at_once({"decode", "--prompt", "9223372036854775807", "--tokens", "1"},
                         "--prompt");
  // A window bounds the cache: a long run in a small window is within a small budget.
  const TimedRun windowed =
      run_qkv({"decode", "--prompt", "10", "--tokens", "50", "--window", "16", "--page-rows", "8",
               "--heads", "2", "--d", "8", "--threads", "1", "--max-memory", "4M"});
  EXPECT_EQ(windowed.run.status, 0) << windowed.run.err;
}

TEST(DecodeSizesCli, BenchDecodeBeyondTheBudgetIsRefusedBeforeAllocating) {
  const std::vector<std::string> bench = {
      "bench", "--decode", "--heads", "2", "--d", "16", "--threads", "1", "--bandwidth-gbs", "5"};
  const auto with = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> args = bench;
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  expect_refused_at_once(with({"--nk", "1125899906842624"}),
                         "--max-memory: qkv bench --decode needs ");
  // B sequences are refused before B lengths are held.
  expect_refused_at_once(with({"--nk", "1", "--batch", "1000000000000000"}),
                         "--max-memory: qkv bench --decode needs ");
  expect_refused_at_once(with({"--mixed-lengths", "1,10", "--batch", "1000000000000000"}),
                         "--max-memory: qkv bench --decode needs ");
  expect_refused_at_once(with({"--lengths", "100000,1125899906842624"}),
                         "--max-memory: qkv bench --decode needs ");
  // The baselines' gathered copies count: 300000 rows fit 64M as int8 pages, not as float32.
  expect_refused_at_once(with({"--nk", "300000", "--dtype", "int8", "--max-memory", "64M"}),
                         "other buffers ");
  const TimedRun fits = run_qkv(with({"--nk", "300000", "--dtype", "int8", "--no-baseline",
                                      "--repeats", "1", "--max-memory", "64M"}));
  EXPECT_EQ(fits.run.status, 0) << fits.run.err;
}

}  // namespace
}  // namespace qkv
