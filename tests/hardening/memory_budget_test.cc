// Memory budgets: a call whose outputs or workspace cannot fit is refused before allocating,
// quickly, with one line giving the bytes needed and the budget.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <chrono>
#include <string>
#include <vector>

#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/io.h"
#include "qkv/layer.h"
#include "support/command_runner.h"
#include "support/test_support.h"

namespace qkv {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A [h, n, d] view of one row repeated (stride 0): a huge shape in a few bytes of memory.
TensorView repeated_rows(const std::vector<float>& row, std::int64_t h, std::int64_t n,
                         const char* name) {
  return TensorView{
      row.data(), DType::kF32, {h, n, static_cast<std::int64_t>(row.size())}, {0, 0, 1}, name};
}

TEST(MemoryBudget, AttentionRefusesWeightsThatCannotFit) {
  const std::vector<float> row(64, 0.5f);
  const TensorView q = repeated_rows(row, 1, 65536, "Q");
  AttentionOptions options;
  options.return_weights = true;  // 65536^2 float32: 16 GiB
  options.max_memory = std::uint64_t{8} << 30;
  const auto start = Clock::now();
  try {
    attention(q, q, q, options);
    FAIL() << "not refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.subject(), "max_memory");
    EXPECT_NE(e.problem().find("needs 17"), std::string::npos) << e.what();  // 17.2e9 bytes
    EXPECT_NE(e.problem().find("16 GiB"), std::string::npos) << e.what();
    EXPECT_NE(e.problem().find("budget is 8589934592 bytes (8 GiB)"), std::string::npos)
        << e.what();
  }
  EXPECT_LT(seconds_since(start), 1.0);

  // Without the weights the same call fits (a few MiB) and is not refused here: check with a
  // small shape that it then runs.
  const TensorView small = repeated_rows(row, 1, 256, "Q");
  options.return_weights = false;
  options.max_memory = std::uint64_t{64} << 20;
  EXPECT_EQ(attention(small, small, small, options).out.shape(), (Shape{1, 256, 64}));
  options.max_memory = 1000;
  EXPECT_THROW(attention(small, small, small, options), Error);
  // attention_into counts only the workspace: the caller owns the outputs.
  Tensor out(DType::kF32, {1, 256, 64}, "out");
  options.max_memory = std::uint64_t{2} << 20;
  options.kernel = "reference";
  options.threads = 1;
  EXPECT_NO_THROW(attention_into(small, small, small, options, {out.mutable_view(), {}, {}}));
}

TEST(MemoryBudget, LayerRefusesBeforeProjecting) {
  const std::vector<float> row(32, 0.25f);
  const TensorView x{row.data(), DType::kF32, {2, 65536, 32}, {0, 0, 1}, "X"};
  const Tensor w = testing::random_tensor(DType::kF32, {32, 32}, 1);
  LayerOptions options;
  options.heads = 4;
  options.attention.return_weights = true;  // 2 x 4 x 65536^2 float32: 128 GiB
  options.attention.max_memory = std::uint64_t{4} << 30;
  const auto start = Clock::now();
  try {
    multi_head_attention(x, {w.view(), w.view(), w.view()}, options);
    FAIL() << "not refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.subject(), "max_memory");
    EXPECT_NE(e.problem().find("the layer needs"), std::string::npos) << e.what();
    EXPECT_NE(e.problem().find("128 GiB"), std::string::npos) << e.what();
  }
  EXPECT_LT(seconds_since(start), 1.0);
}

// The CLI run of `args` in `dir`, with its peak resident set in peak_rss_bytes (wait4).
std::uint64_t peak_rss_bytes = 0;
testing::CommandRun run_measuring_peak(const std::filesystem::path& dir,
                                       const std::vector<std::string>& args) {
  const std::filesystem::path out = dir.parent_path() / (dir.filename().string() + ".out");
  const std::filesystem::path err = dir.parent_path() / (dir.filename().string() + ".err");
  const pid_t pid = testing::start_program(QKV_CLI_PATH, dir, args, out, err);
  int wstatus = 0;
  rusage usage{};
  ::wait4(pid, &wstatus, 0, &usage);
  peak_rss_bytes = static_cast<std::uint64_t>(usage.ru_maxrss) * 1024;
  testing::CommandRun run;
  run.status = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
  run.out = testing::slurp(out);
  run.err = testing::slurp(err);
  std::filesystem::remove(out);
  std::filesystem::remove(err);
  return run;
}

TEST(MemoryBudget, CliRefusesBeforeAllocatingWithOneLine) {
  testing::ScratchDir dir;
  // [16, 65536, 8]: 32 MiB of input; weights would be 16 x 65536^2 x 4 bytes = 256 GiB, more
  // than the default budget (75% of physical memory) of any machine this runs on.
  const Tensor q = testing::random_tensor(DType::kF32, {16, 65536, 8}, 2);
  write_npy(dir / "q.npy", q.view(), DType::kF32);
  const std::vector<std::string> before = testing::files_in(dir.path());
  for (const char* budget : {"", "16G", "50%"}) {
    std::vector<std::string> args = {"attention", "--q",   "q.npy", "--k",       "q.npy", "--v",
                                     "q.npy",     "--out", "o.npy", "--weights", "w.npy"};
    if (*budget != '\0') args.insert(args.end(), {"--max-memory", budget});
    // Refused before anything beyond the inputs is allocated: the peak resident set stays near
    // the three 32 MiB inputs read (about 105 MB measured), far from the weights' 256 GiB. (A
    // wall-clock bound of 1 s stood here; on a loaded 2-core machine it measured the load.)
    const testing::CommandRun run = run_measuring_peak(dir.path(), args);
    EXPECT_LT(peak_rss_bytes, std::uint64_t{256} << 20) << budget;
    EXPECT_EQ(run.status, 1) << run.err;
    EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
    EXPECT_EQ(run.err.rfind("--max-memory: attention needs ", 0), 0u) << run.err;
    EXPECT_NE(run.err.find("the memory budget is"), std::string::npos) << run.err;
    EXPECT_EQ(testing::files_in(dir.path()), before);
  }
  // The layer, from X: refused the same way.
  const Tensor x = testing::random_tensor(DType::kF32, {65536, 8}, 3);
  const Tensor w = testing::random_tensor(DType::kF32, {8, 8}, 4);
  write_npy(dir / "x.npy", x.view(), DType::kF32);
  write_npy(dir / "w8.npy", w.view(), DType::kF32);
  const testing::CommandRun layer = testing::run_program(
      QKV_CLI_PATH, dir.path(),
      {"layer", "--x", "x.npy", "--wq", "w8.npy", "--wk", "w8.npy", "--wv", "w8.npy", "--heads",
       "2", "--weights", "w.npy", "--out", "o.npy", "--max-memory", "1G"});
  EXPECT_EQ(layer.status, 1);
  EXPECT_EQ(layer.err.rfind("--max-memory: the layer needs ", 0), 0u) << layer.err;
  EXPECT_NE(layer.err.find("the memory budget is"), std::string::npos) << layer.err;
  // A budget that fits runs; a malformed one is a one-line error naming the flag.
  EXPECT_EQ(testing::run_program(QKV_CLI_PATH, dir.path(),
                                 {"attention", "--q", "w8.npy", "--k", "w8.npy", "--v", "w8.npy",
                                  "--out", "small.npy", "--max-memory", "64MiB"})
                .status,
            0);
  const testing::CommandRun bad =
      testing::run_program(QKV_CLI_PATH, dir.path(),
                           {"attention", "--q", "w8.npy", "--k", "w8.npy", "--v", "w8.npy", "--out",
                            "o.npy", "--max-memory", "lots"});
  EXPECT_EQ(bad.status, 1);
  EXPECT_EQ(bad.err.rfind("--max-memory: expected a size", 0), 0u) << bad.err;
}

}  // namespace
}  // namespace qkv
