// What a command says about a run besides its outputs: while a long computation runs, a progress
// line on stderr (only on a terminal, only past about a second, never with --quiet), erased when
// it ends; and with -v/--verbose, one summary line once the command has succeeded.
#pragma once

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "qkv/attention.h"
#include "qkv/tensor.h"

namespace qkv::cli {

struct ReportFlags {
  bool verbose = false;
  bool quiet = false;
};

// Adds -v/--verbose and --quiet.
void add_report_flags(CLI::App& command, ReportFlags& flags);

// The progress line of one computation. Its callback() goes into AttentionOptions::progress;
// the kernels call it from their worker threads, so it only touches atomics, and one thread at a
// time (whoever wins a flag) redraws, at most every 100 ms. The destructor erases the line.
class ProgressLine {
 public:
  // `what` names the computation ("qkv attention"), `unit` what it counts ("row": rows of
  // single heads; "step": qkv decode's generation steps). Draws nothing unless `enabled` and
  // stderr is a terminal.
  ProgressLine(bool enabled, std::string what, std::string unit = "row");
  ~ProgressLine();
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  // Empty when the line is off, so that the library is not asked to report at all.
  AttentionOptions::ProgressFunction callback();
  // For a loop of the command's own (any thread): `done` of `total` units are finished.
  void update(std::int64_t done, std::int64_t total) {
    if (enabled_) report(done, total);
  }
  // Erases the line now (before anything else is printed); later calls do nothing.
  void erase();

  // The text of the line: "qkv attention: 42% of 8192 rows, 3.1 s, about 4.2 s left".
  static std::string text(const std::string& what, std::int64_t done, std::int64_t total,
                          double elapsed_seconds, const std::string& unit = "row");

 private:
  void report(std::int64_t done, std::int64_t total);

  const bool enabled_;
  const std::string what_;
  const std::string unit_;
  const std::chrono::steady_clock::time_point start_;
  std::atomic<std::int64_t> next_draw_ns_;  // since start_
  std::atomic<bool> drawing_{false};
  std::atomic<bool> drawn_{false};
  bool erased_ = false;  // erase() runs on the command's thread only
};

// The numbers of -v/--verbose's line.
struct RunSummary {
  std::string command;  // "qkv attention"
  std::string shapes;   // "Q [1, 4, 4096, 64] f32, K ..., V ... -> out [1, 4, 4096, 64] f32"
  std::string kernel;   // the kernel that ran
  std::optional<DType> compute;  // the storage type computed in, when known
  int threads = 0;      // as run (AttentionResult::threads), or as asked for: 0 is one per
                        // hardware thread
  double seconds = 0;   // the computation's time
  double flops = 0;     // its useful floating-point operations (0: not counted)
};

// "qkv attention: Q [..] f32, K .., V .. -> out [..] f32; kernel fused_hwy (AVX3_ZEN4, float32);
// 2 threads; 1.234 s; 45.6 GFLOP/s; peak memory 312 MiB"
std::string summary_line(const RunSummary& summary);

// "Q [1, 4, 4096, 64] f32"
std::string tensor_summary(const std::string& name, const Shape& shape, DType dtype);

// The useful flops of attention on these shapes: 2·(d + dv) per allowed (query, key) pair and
// query head, counting the pairs that causal and a window allow (an explicit mask is not
// looked at: all its pairs count).
double attention_flops(const Shape& q, const Shape& k, const Shape& v, const AttentionOptions& o);

}  // namespace qkv::cli
