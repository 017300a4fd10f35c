// tools/qkv/run_report: the progress line's text (fraction, elapsed, expected remaining, units),
// -v's summary line, and the useful flops its GFLOP/s divides, counted by hand here.
#include "run_report.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <regex>
#include <string>
#include <vector>

namespace qkv::cli {
namespace {

TEST(ProgressText, FractionElapsedAndWhatIsLeft) {
  EXPECT_EQ(ProgressLine::text("qkv attention", 0, 8192, 0.4),
            "qkv attention: 0% of 8192 rows, 0.4 s");
  EXPECT_EQ(ProgressLine::text("qkv attention", 4096, 8192, 2.0),
            "qkv attention: 50% of 8192 rows, 2.0 s, about 2.0 s left");
  // A quarter done after 3 s: three times as long again.
  EXPECT_EQ(ProgressLine::text("qkv layer", 25, 100, 3.0),
            "qkv layer: 25% of 100 rows, 3.0 s, about 9.0 s left");
  // Whole percents are floored: 99.9 % is not shown as 100 %.
  EXPECT_EQ(ProgressLine::text("qkv attention", 999, 1000, 9.99),
            "qkv attention: 99% of 1000 rows, 10.0 s, about 0.0 s left");
  EXPECT_EQ(ProgressLine::text("qkv attention", 1, 1, 1.25), "qkv attention: 100% of 1 row, 1.2 s");
  EXPECT_EQ(ProgressLine::text("qkv decode", 3, 300, 1.0, "step"),
            "qkv decode: 1% of 300 steps, 1.0 s, about 1 min 39 s left");
}

TEST(ProgressText, LongRunsInMinutesAndHours) {
  EXPECT_EQ(ProgressLine::text("qkv attention", 1, 2, 125.0),
            "qkv attention: 50% of 2 rows, 2 min 05 s, about 2 min 05 s left");
  EXPECT_EQ(ProgressLine::text("qkv attention", 1, 4, 3725.0),
            "qkv attention: 25% of 4 rows, 1 h 02 min, about 3 h 06 min left");
}

TEST(ProgressLineOff, NoTerminalMeansNoCallback) {
  // The test's stderr is a file or pipe under ctest; either way a disabled line hands the
  // library no function, so the kernels are not even asked to report.
  ProgressLine off(false, "qkv attention");
  EXPECT_FALSE(static_cast<bool>(off.callback()));
  off.update(1, 2);  // draws nothing, and erase() twice returns at once
  off.erase();
  off.erase();
}

// 2·(d + dv) per allowed (query, key) pair and query head.
TEST(AttentionFlops, CountsAllowedPairsOfEveryHead) {
  AttentionOptions o;
  const double per_pair = 2.0 * (8 + 4);
  EXPECT_DOUBLE_EQ(attention_flops({2, 3, 10, 8}, {2, 3, 20, 8}, {2, 3, 20, 4}, o),
                   6 * 10 * 20 * per_pair);
  // Causal, bottom-right aligned: query i sees keys 0 .. i + 10, i.e. 11 .. 20 of them.
  o.causal = true;
  EXPECT_DOUBLE_EQ(attention_flops({2, 3, 10, 8}, {2, 3, 20, 8}, {2, 3, 20, 4}, o),
                   6 * 155 * per_pair);
  // And a window of 2 keys to the left: 3 keys a row.
  o.window = Window{2, 0};
  EXPECT_DOUBLE_EQ(attention_flops({2, 3, 10, 8}, {2, 3, 20, 8}, {2, 3, 20, 4}, o),
                   6 * 30 * per_pair);
}

TEST(AttentionFlops, PackedSequencesCountWithinEachSequence) {
  const std::vector<std::int64_t> cu_q = {0, 3, 7}, cu_k = {0, 5, 9};
  Tensor tq(DType::kI64, {3}, "cu_q"), tk(DType::kI64, {3}, "cu_k");
  std::memcpy(tq.data(), cu_q.data(), sizeof(std::int64_t) * 3);
  std::memcpy(tk.data(), cu_k.data(), sizeof(std::int64_t) * 3);
  AttentionOptions o;
  o.causal = true;
  o.cu_seqlens_q = tq.view();
  o.cu_seqlens_k = tk.view();
  // Sequence 1: 3 queries on 5 keys see 3, 4, 5; sequence 2: 4 on 4 see 1, 2, 3, 4.
  EXPECT_DOUBLE_EQ(attention_flops({2, 7, 16}, {2, 9, 16}, {2, 9, 16}, o), 2 * 22 * 2.0 * 32);
}

TEST(SummaryLine, SaysWhatRanAndHowFast) {
  const std::string line = summary_line(RunSummary{.command = "qkv attention",
                                                   .shapes = "Q [4, 8] float32",
                                                   .kernel = "reference",
                                                   .compute = DType::kF32,
                                                   .threads = 1,
                                                   .seconds = 2.0,
                                                   .flops = 3e9});
  EXPECT_TRUE(std::regex_match(
      line, std::regex(R"(qkv attention: Q \[4, 8\] float32; kernel reference; 1 thread; )"
                       R"(2\.000 s; 1\.5 GFLOP/s; peak memory \d+ MiB)")))
      << line;
}

}  // namespace
}  // namespace qkv::cli
