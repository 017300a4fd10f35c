// An interrupted run: SIGINT or SIGTERM while outputs are being written removes the temporary
// files, leaves an existing output intact, and the process still dies of the signal.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "support/command_runner.h"
#include "qkv/io.h"
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

// In a child process: stage two outputs (one replacing an existing file), tell the parent, and
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

TEST(Interrupted, SigintRemovesTemporaryFiles) { interrupt_staged_outputs(SIGINT); }
TEST(Interrupted, SigtermRemovesTemporaryFiles) { interrupt_staged_outputs(SIGTERM); }
TEST(Interrupted, SighupRemovesTemporaryFiles) { interrupt_staged_outputs(SIGHUP); }

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
  for (const int signal_number : {SIGINT, SIGTERM}) {
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
  EXPECT_EQ(caught, 2);
}

}  // namespace
}  // namespace qkv
