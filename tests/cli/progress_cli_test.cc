// What `qkv attention` and `qkv layer` say about a run besides their outputs: the progress line
// on a terminal (drawn, then erased; never without a terminal; never with --quiet; the
// backward's own line, in key rows, when gradients are asked for) and the one summary line of
// -v/--verbose.
#include <gtest/gtest.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <regex>
#include <string>
#include <vector>

#include "qkv/io.h"
#include "support/command_runner.h"
#include "support/test_support.h"

namespace qkv {
namespace {

namespace fs = std::filesystem;

// Runs qkv in `dir` with stdout and stderr on a new pseudo-terminal and QKV_PROGRESS_AFTER=0
// (draw at once, so that the test does not depend on the host's speed); returns everything
// the terminal received, and the exit status in `status`.
std::string run_on_terminal(const fs::path& dir, const std::vector<std::string>& args,
                            int& status) {
  int terminal = -1;
  const pid_t pid = forkpty(&terminal, nullptr, nullptr, nullptr);
  if (pid == 0) {
    if (chdir(dir.c_str()) != 0) _exit(126);
    setenv("QKV_PROGRESS_AFTER", "0", 1);
    testing::exec_program(QKV_CLI_PATH, args);
    _exit(127);
  }
  std::string received;
  if (pid < 0) return received;
  // A qkv that hangs fails the test instead of hanging it: killed after a minute.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  char buffer[4096];
  for (;;) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      received += "[killed: still running after 60 s]";
      break;
    }
    pollfd ready{terminal, POLLIN, 0};
    const int polled = poll(&ready, 1, 100);
    if (polled == 0 || (polled < 0 && errno == EINTR)) continue;
    const ssize_t n = read(terminal, buffer, sizeof buffer);
    if (n > 0) {
      received.append(buffer, static_cast<std::size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      break;  // EIO once the child has closed the terminal
    }
  }
  close(terminal);
  int wait_status = 0;
  waitpid(pid, &wait_status, 0);
  status = WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : 128 + WTERMSIG(wait_status);
  return received;
}

class ProgressCli : public ::testing::Test {
 protected:
  void SetUp() override {
    // The reference kernel reports after every row: 2 x 300 reports on one thread.
    write_npy(dir_ / "q.npy", testing::random_tensor(DType::kF32, {2, 300, 16}, 1).view(),
              DType::kF32);
    write_npy(dir_ / "k.npy", testing::random_tensor(DType::kF32, {2, 300, 16}, 2).view(),
              DType::kF32);
    write_npy(dir_ / "v.npy", testing::random_tensor(DType::kF32, {2, 300, 16}, 3).view(),
              DType::kF32);
  }
  std::vector<std::string> attention_args(std::vector<std::string> extra) const {
    std::vector<std::string> args = {"attention", "--q", "q.npy", "--k", "k.npy", "--v",
                                     "v.npy", "--out", "o.npy", "--kernel", "reference",
                                     "--threads", "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }
  testing::ScratchDir dir_;
};

TEST_F(ProgressCli, OnATerminalTheLineIsDrawnThenErased) {
  int status = -1;
  const std::string seen = run_on_terminal(dir_.path(), attention_args({}), status);
  EXPECT_EQ(status, 0) << seen;
  EXPECT_TRUE(fs::exists(dir_ / "o.npy"));
  const std::regex line(R"(\rqkv attention: \d+% of 600 rows, \d+\.\d s(, about [0-9.]+ s left)?\x1b\[K)");
  EXPECT_TRUE(std::regex_search(seen, line)) << seen;
  // Erased at the end: the last thing on the terminal is "carriage return, clear to the end".
  ASSERT_GE(seen.size(), 4u);
  EXPECT_EQ(seen.substr(seen.size() - 4), "\r\x1b[K") << seen;
}

TEST_F(ProgressCli, QuietTurnsTheLineOff) {
  int status = -1;
  const std::string seen = run_on_terminal(dir_.path(), attention_args({"--quiet"}), status);
  EXPECT_EQ(status, 0);
  EXPECT_EQ(seen, "");
}

TEST_F(ProgressCli, NeverWithoutATerminal) {
  setenv("QKV_PROGRESS_AFTER", "0", 1);
  const testing::CommandRun run =
      testing::run_program(QKV_CLI_PATH, dir_.path(), attention_args({}));
  unsetenv("QKV_PROGRESS_AFTER");
  EXPECT_EQ(run.status, 0);
  EXPECT_EQ(run.err, "");
  EXPECT_EQ(run.out, "");
}

TEST_F(ProgressCli, VerbosePrintsOneSummaryLine) {
  for (const char* flag : {"-v", "--verbose"}) {
    const testing::CommandRun run = testing::run_program(
        QKV_CLI_PATH, dir_.path(), attention_args({flag, "--causal"}));
    EXPECT_EQ(run.status, 0) << run.err;
    const std::regex summary(
        R"(qkv attention: Q \[2, 300, 16\] float32, K \[2, 300, 16\] float32, V \[2, 300, 16\] )"
        R"(float32 -> out \[2, 300, 16\] float32; kernel reference; 1 thread; \d+\.\d{3} s; )"
        R"(\d+\.\d GFLOP/s; peak memory \d+ MiB\n)");
    EXPECT_TRUE(std::regex_match(run.err, summary)) << run.err;
  }
}

TEST_F(ProgressCli, LayerSaysTheSameThings) {
  write_npy(dir_ / "x.npy", testing::random_tensor(DType::kF32, {300, 8}, 4).view(), DType::kF32);
  write_npy(dir_ / "w.npy", testing::random_tensor(DType::kF32, {8, 16}, 5).view(), DType::kF32);
  const std::vector<std::string> args = {"layer", "--x", "x.npy", "--wq", "w.npy", "--wk",
                                         "w.npy", "--wv", "w.npy", "--heads", "2", "--out",
                                         "o.npy", "--kernel", "reference", "--threads", "1"};
  int status = -1;
  const std::string seen = run_on_terminal(dir_.path(), args, status);
  EXPECT_EQ(status, 0) << seen;
  EXPECT_TRUE(std::regex_search(seen, std::regex(R"(\rqkv layer: \d+% of 600 rows)"))) << seen;
  std::vector<std::string> verbose = args;
  verbose.push_back("-v");
  const testing::CommandRun run = testing::run_program(QKV_CLI_PATH, dir_.path(), verbose);
  EXPECT_EQ(run.status, 0) << run.err;
  EXPECT_TRUE(std::regex_match(
      run.err, std::regex(R"(qkv layer: X \[300, 8\] float32, 2 heads -> out \[300, 16\] )"
                          R"(float32; kernel reference; 1 thread; .* GFLOP/s; peak memory \d+ MiB\n)")))
      << run.err;
}

TEST_F(ProgressCli, TheBackwardHasItsOwnLineInKeyRows) {
  write_npy(dir_ / "do.npy", testing::random_tensor(DType::kF32, {2, 300, 16}, 4).view(),
            DType::kF32);
  const std::vector<std::string> args =
      attention_args({"--grad-out", "do.npy", "--grad-q", "dq.npy", "--backward-kernel",
                      "reference"});
  int status = -1;
  const std::string seen = run_on_terminal(dir_.path(), args, status);
  EXPECT_EQ(status, 0) << seen;
  EXPECT_TRUE(fs::exists(dir_ / "dq.npy"));
  EXPECT_TRUE(std::regex_search(seen, std::regex(R"(\rqkv attention: \d+% of 600 rows)"))) << seen;
  EXPECT_TRUE(std::regex_search(
      seen, std::regex(R"(\rqkv attention, backward: \d+% of 600 key rows, \d+\.\d s)")))
      << seen;
  ASSERT_GE(seen.size(), 4u);
  EXPECT_EQ(seen.substr(seen.size() - 4), "\r\x1b[K") << seen;
  std::vector<std::string> quiet = args;
  quiet.push_back("--quiet");
  EXPECT_EQ(run_on_terminal(dir_.path(), quiet, status), "");
  EXPECT_EQ(status, 0);
  setenv("QKV_PROGRESS_AFTER", "0", 1);
  const testing::CommandRun piped = testing::run_program(QKV_CLI_PATH, dir_.path(), args);
  unsetenv("QKV_PROGRESS_AFTER");
  EXPECT_EQ(piped.status, 0);
  EXPECT_EQ(piped.err, "");

  // The layer's backward: 2 heads on one kv head each, 300 key rows of each.
  write_npy(dir_ / "x.npy", testing::random_tensor(DType::kF32, {300, 8}, 5).view(), DType::kF32);
  write_npy(dir_ / "w.npy", testing::random_tensor(DType::kF32, {8, 16}, 6).view(), DType::kF32);
  write_npy(dir_ / "dy.npy", testing::random_tensor(DType::kF32, {300, 16}, 7).view(),
            DType::kF32);
  const std::vector<std::string> layer = {
      "layer", "--x", "x.npy", "--wq", "w.npy", "--wk", "w.npy", "--wv", "w.npy", "--heads", "2",
      "--out", "o.npy", "--kernel", "reference", "--threads", "1", "--grad-out", "dy.npy",
      "--grad-x", "dx.npy"};
  const std::string layer_seen = run_on_terminal(dir_.path(), layer, status);
  EXPECT_EQ(status, 0) << layer_seen;
  EXPECT_TRUE(std::regex_search(layer_seen,
                                std::regex(R"(\rqkv layer, backward: \d+% of 600 key rows)")))
      << layer_seen;
  EXPECT_EQ(layer_seen.substr(layer_seen.size() - 4), "\r\x1b[K") << layer_seen;
}

TEST_F(ProgressCli, DecodeCountsSteps) {
  const std::vector<std::string> args = {"decode", "--tokens", "5", "--prompt", "100",
                                         "--threads", "1"};
  int status = -1;
  const std::string seen = run_on_terminal(dir_.path(), args, status);
  EXPECT_EQ(status, 0) << seen;
  EXPECT_TRUE(std::regex_search(seen, std::regex(R"(\rqkv decode: \d+% of 5 steps, )"))) << seen;
  EXPECT_EQ(seen.find("qkv decode:", seen.rfind("\r\x1b[K")), std::string::npos)
      << "the line is erased before the report: " << seen;
  std::vector<std::string> quiet = args;
  quiet.push_back("--quiet");
  EXPECT_EQ(run_on_terminal(dir_.path(), quiet, status).find("qkv decode:"), std::string::npos);
}

}  // namespace
}  // namespace qkv
