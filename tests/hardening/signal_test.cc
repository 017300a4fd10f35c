// An interrupted run: in a program that asked for it (install_output_cleanup_on_signals, as the
// qkv executable does), any signal of kCleanupSignals (INT, TERM, HUP, QUIT, XFSZ, XCPU, USR1,
// USR2, PIPE, ALRM) while outputs are being written removes the temporary files, leaves an
// existing output intact, and the process still dies of the signal.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "qkv/io.h"
#include "support/command_runner.h"
#include "support/test_support.h"

namespace qkv {
namespace {

namespace fs = std::filesystem;

bool is_temp(const std::string& name) { return name.find(".qkv-tmp-") != std::string::npos; }

std::vector<std::string> temps_in(const fs::path& dir) {
  std::vector<std::string> temps;
  for (const std::string& name : testing::files_in(dir)) {
    if (is_temp(name)) temps.push_back(name);
  }
  return temps;
}

// Every signal whose default action ends the process and that a run may meet: the terminal's
// (INT, QUIT, HUP), a supervisor's (TERM, USR1, USR2, ALRM), the shell's limits (XFSZ, XCPU)
// and a closed pipe (PIPE).
constexpr int kCleanupSignals[] = {SIGINT,  SIGTERM, SIGHUP,  SIGQUIT, SIGXFSZ,
                                   SIGXCPU, SIGUSR1, SIGUSR2, SIGPIPE, SIGALRM};

// QUIT, XFSZ and XCPU dump core by default: not into the folders the tests compare.
void no_core_files() {
  const rlimit none{0, 0};
  setrlimit(RLIMIT_CORE, &none);
}

// In a child process that asked for the cleanup (install_output_cleanup_on_signals, as the qkv
// executable does): stage two outputs (one replacing an existing file), tell the parent, and
// wait to be killed. The parent sends `signal_number` and checks what is left.
void interrupt_staged_outputs(int signal_number) {
  testing::ScratchDir dir;
  const Tensor original = testing::random_tensor(DType::kF32, {3, 4}, 1);
  write_npy(dir / "out.npy", original.view(), DType::kF32);
  const std::string before = testing::slurp(dir / "out.npy");

  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    no_core_files();
    install_output_cleanup_on_signals();
    close(ready[0]);
    const Tensor t = testing::random_tensor(DType::kF32, {5, 6}, 2);
    OutputFiles files;
    files.stage_npy(dir / "out.npy", t.view(), DType::kF32);
    files.stage_npy(dir / "new.npy", t.view(), DType::kF32);
    const char byte = 'r';
    if (write(ready[1], &byte, 1) != 1) _exit(2);
    for (;;) pause();
  }
  close(ready[1]);
  char byte = 0;
  ASSERT_EQ(read(ready[0], &byte, 1), 1);
  close(ready[0]);
  EXPECT_EQ(temps_in(dir.path()).size(), 2u);  // both staged, neither committed
  ASSERT_EQ(kill(pid, signal_number), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status)) << status;
  EXPECT_EQ(WTERMSIG(status), signal_number);
  EXPECT_TRUE(temps_in(dir.path()).empty());
  EXPECT_EQ(testing::files_in(dir.path()), std::vector<std::string>{"out.npy"});
  EXPECT_EQ(testing::slurp(dir / "out.npy"), before);
}

class InterruptedBy : public ::testing::TestWithParam<int> {};

TEST_P(InterruptedBy, SignalRemovesTemporaryFiles) { interrupt_staged_outputs(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Signals, InterruptedBy, ::testing::ValuesIn(kCleanupSignals),
                         [](const auto& param_info) {
                           return std::string(sigabbrev_np(param_info.param));
                         });

// SIGKILL cannot be caught: the killed run's temporary file stays, under a name no later run
// uses (pid, random suffix, O_EXCL), and a later run writes the same output around it.
TEST(Interrupted, SigkillLeftoverIsNeverReused) {
  testing::ScratchDir dir;
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    close(ready[0]);
    OutputFiles files;
    files.stage(dir / "o.bin", std::vector<char>{'k', 'i', 'l', 'l', 'e', 'd'});
    const char byte = 'r';
    if (write(ready[1], &byte, 1) != 1) _exit(2);
    for (;;) pause();
  }
  close(ready[1]);
  char byte = 0;
  ASSERT_EQ(read(ready[0], &byte, 1), 1);
  close(ready[0]);
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  EXPECT_EQ(testing::wait_status(pid), 128 + SIGKILL);
  const std::vector<std::string> leftovers = temps_in(dir.path());
  ASSERT_EQ(leftovers.size(), 1u);
  EXPECT_TRUE(leftovers[0].starts_with(".o.bin.qkv-tmp-" + std::to_string(pid) + "-"))
      << leftovers[0];
  for (int run = 0; run < 20; ++run) {
    OutputFiles files;
    files.stage(dir / "o.bin", std::vector<char>{'n', 'e', 'w'});
    files.commit();
  }
  EXPECT_EQ(testing::slurp(dir / "o.bin"), "new");
  EXPECT_EQ(temps_in(dir.path()), leftovers);
  EXPECT_EQ(testing::slurp(dir / leftovers[0]), "killed");
}

// A file size limit (ulimit -f) reached while writing: SIGXFSZ, by default, ends the run and
// the temporary file goes with it; ignored, the write fails with EFBIG, reported in one line.
TEST(Interrupted, FileSizeLimitWhileWriting) {
  for (const bool ignored : {false, true}) {
    SCOPED_TRACE(ignored ? "SIGXFSZ ignored" : "SIGXFSZ default");
    testing::ScratchDir dir;
    const Tensor q = testing::random_tensor(DType::kF32, {64, 64}, 6);
    write_npy(dir / "q.npy", q.view(), DType::kF32);
    const fs::path err_file = dir.path().parent_path() / (dir.path().filename().string() + ".e");
    const pid_t pid = fork();
    if (pid == 0) {
      no_core_files();
      const rlimit small{4096, 4096};
      setrlimit(RLIMIT_FSIZE, &small);
      signal(SIGXFSZ, ignored ? SIG_IGN : SIG_DFL);
      if (chdir(dir.path().c_str()) != 0) _exit(126);
      const int err = open(err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      dup2(err, 2);
      execl(QKV_CLI_PATH, QKV_CLI_PATH, "attention", "--q", "q.npy", "--k", "q.npy", "--v", "q.npy",
            "--weights", "w.npy", "--out", "o.npy", static_cast<char*>(nullptr));
      _exit(127);
    }
    const int status = testing::wait_status_within(pid, 60);
    const std::string err = testing::slurp(err_file);
    fs::remove(err_file);
    if (ignored) {
      EXPECT_EQ(status, 1) << err;
      EXPECT_EQ(err.find('\n'), err.size() - 1) << err;
      EXPECT_NE(err.find("cannot write: File too large"), std::string::npos) << err;
    } else {
      EXPECT_EQ(status, 128 + SIGXFSZ) << err;
    }
    EXPECT_EQ(testing::files_in(dir.path()), std::vector<std::string>{"q.npy"});
  }
}

TEST(Interrupted, AnIgnoredSignalStaysIgnored) {
  // A process that ignores SIGTERM (nohup-style) must keep ignoring it after staging.
  testing::ScratchDir dir;
  const pid_t pid = fork();
  if (pid == 0) {
    signal(SIGTERM, SIG_IGN);
    const Tensor t = testing::random_tensor(DType::kF32, {2, 2}, 3);
    OutputFiles files;
    files.stage_npy(dir / "o.npy", t.view(), DType::kF32);
    raise(SIGTERM);
    files.commit();
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(testing::files_in(dir.path()), std::vector<std::string>{"o.npy"});
}

// Standard output a pipe whose reader is gone: with SIGPIPE's default the run dies of it; with
// SIGPIPE ignored, the failed write (EPIPE) is reported in one line and the status is not 0.
TEST(Interrupted, ClosedStandardOutput) {
  for (const bool ignored : {false, true}) {
    SCOPED_TRACE(ignored ? "SIGPIPE ignored" : "SIGPIPE default");
    testing::ScratchDir dir;
    const fs::path err_file = dir / "err.txt";
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    close(fds[0]);
    const pid_t pid = fork();
    if (pid == 0) {
      signal(SIGPIPE, ignored ? SIG_IGN : SIG_DFL);
      dup2(fds[1], 1);
      const int err = open(err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      dup2(err, 2);
      execl(QKV_CLI_PATH, QKV_CLI_PATH, "explain", static_cast<char*>(nullptr));
      _exit(127);
    }
    close(fds[1]);
    const int status = testing::wait_status_within(pid, 60);
    const std::string err = testing::slurp(err_file);
    if (ignored) {
      EXPECT_EQ(status, 1) << err;
      EXPECT_EQ(err, "standard output: cannot write: Broken pipe\n");
    } else {
      EXPECT_EQ(status, 128 + SIGPIPE) << err;
    }
  }
}

// The executable, stopped by a signal while it writes a large output: the signal arrives when
// the poll below first sees a temporary file, i.e. mid-write.
TEST(Interrupted, CliRunStoppedWhileWritingLeavesOutputsAlone) {
  testing::ScratchDir dir;
  // 8 heads x 1024 x 1024 float64 weights: 64 MiB to encode and write.
  const Tensor q = testing::random_tensor(DType::kF32, {8, 1024, 8}, 4);
  write_npy(dir / "q.npy", q.view(), DType::kF32);
  const Tensor existing = testing::random_tensor(DType::kF32, {2, 2}, 5);
  write_npy(dir / "o.npy", existing.view(), DType::kF32);
  write_npy(dir / "w.npy", existing.view(), DType::kF32);
  const std::string o_before = testing::slurp(dir / "o.npy");
  const std::string w_before = testing::slurp(dir / "w.npy");
  const std::vector<std::string> before = testing::files_in(dir.path());

  int caught = 0;
  for (const int signal_number : kCleanupSignals) {
    SCOPED_TRACE(sigabbrev_np(signal_number));
    const fs::path out_file = dir.path().parent_path() / (dir.path().filename().string() + ".o");
    const fs::path err_file = dir.path().parent_path() / (dir.path().filename().string() + ".e");
    const pid_t pid = testing::start_program(
        QKV_CLI_PATH, dir.path(),
        {"attention", "--q", "q.npy", "--k", "q.npy", "--v", "q.npy", "--out", "o.npy", "--weights",
         "w.npy", "--out-dtype", "f64", "--threads", "1"},
        out_file, err_file);
    bool sent = false;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!sent && std::chrono::steady_clock::now() < deadline) {
      if (!temps_in(dir.path()).empty()) {
        ASSERT_EQ(kill(pid, signal_number), 0);
        sent = true;
        break;
      }
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == pid) break;  // finished before we saw a temp file
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    if (!sent) continue;
    ++caught;
    EXPECT_EQ(testing::wait_status(pid), 128 + signal_number);
    EXPECT_TRUE(temps_in(dir.path()).empty());
    EXPECT_EQ(testing::files_in(dir.path()), before);
    EXPECT_EQ(testing::slurp(dir / "o.npy"), o_before);
    EXPECT_EQ(testing::slurp(dir / "w.npy"), w_before);
    fs::remove(out_file);
    fs::remove(err_file);
  }
  // A run that finished first would have replaced the outputs; the poll catches the write.
  EXPECT_EQ(caught, static_cast<int>(std::size(kCleanupSignals)));
}

}  // namespace
}  // namespace qkv
