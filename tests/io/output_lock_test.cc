// OutputFiles::commit holds an exclusive flock(2) on each destination folder from before its
// first rename until after its last, so that two runs writing the same outputs cannot leave
// one run's out beside the other's lse, and a reader that takes the same lock (shared) sees one
// run's set.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "qkv/error.h"
#include "qkv/io.h"
#include "support/command_runner.h"
#include "support/test_support.h"

namespace qkv {
namespace {

namespace fs = std::filesystem;

std::vector<char> bytes_of(const std::string& text) { return {text.begin(), text.end()}; }

// The folder opened and locked (exclusive or shared) for the object's lifetime.
class FolderLock {
 public:
  FolderLock(const fs::path& dir, int operation) : fd_(open(dir.c_str(), O_RDONLY | O_DIRECTORY)) {
    EXPECT_GE(fd_, 0);
    EXPECT_EQ(flock(fd_, operation), 0);
  }
  ~FolderLock() { close(fd_); }
  int fd() const noexcept { return fd_; }
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

 private:
  int fd_;
};

bool folder_is_unlocked(const fs::path& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  const bool free = flock(fd, LOCK_EX | LOCK_NB) == 0;
  close(fd);
  return free;
}

TEST(OutputLock, CommitWaitsWhileTheFolderIsLocked) {
  testing::ScratchDir dir;
  pid_t pid = -1;
  {
    const FolderLock held(dir.path(), LOCK_EX);
    pid = fork();
    if (pid == 0) {
      // The lock belongs to the open folder, which fork shares: the child lets go of it.
      close(held.fd());
      try {
        OutputFiles files;
        files.stage(dir / "o.bin", bytes_of("child"));
        files.commit();
      } catch (const Error& e) {
        std::fprintf(stderr, "%s\n", e.what());
        _exit(1);
      }
      _exit(0);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    int status = 0;
    EXPECT_EQ(waitpid(pid, &status, WNOHANG), 0) << "the commit did not wait for the lock";
    EXPECT_FALSE(fs::exists(dir / "o.bin"));
  }
  EXPECT_EQ(testing::wait_status_within(pid, 30), 0);
  EXPECT_EQ(testing::slurp(dir / "o.bin"), "child");
}

TEST(OutputLock, IsReleasedAfterSuccessAndAfterFailure) {
  testing::ScratchDir dir;
  fs::create_directory(dir / "sub");
  {
    OutputFiles files;
    files.stage(dir / "a.bin", bytes_of("a"));
    files.stage(dir / "sub" / "b.bin", bytes_of("b"));
    files.commit();
  }
  EXPECT_TRUE(folder_is_unlocked(dir.path()));
  EXPECT_TRUE(folder_is_unlocked(dir / "sub"));
  {
    OutputFiles files;
    files.stage(dir / "a.bin", bytes_of("a2"));
    files.stage(dir / "sub" / "b.bin", bytes_of("b2"));
    for (const std::string& name : testing::files_in(dir / "sub")) {
      if (name.starts_with(".b.bin.qkv-tmp-")) fs::remove(dir / "sub" / name);
    }
    EXPECT_THROW(files.commit(), Error);
    EXPECT_TRUE(folder_is_unlocked(dir.path()));
    EXPECT_TRUE(folder_is_unlocked(dir / "sub"));
  }
  EXPECT_EQ(testing::slurp(dir / "a.bin"), "a");
  // Nothing but the outputs: the lock is the folder itself, no lock file is left behind.
  EXPECT_EQ(testing::files_in(dir.path()), (std::vector<std::string>{"a.bin", "sub"}));
}

// Writers in several processes commit (out, lse) pairs of their own; a reader holding the
// shared lock must always find both files from the same commit.
TEST(OutputLock, ConcurrentWritersNeverMixRuns) {
  testing::ScratchDir dir;
  constexpr int kWriters = 4;
  constexpr int kCommits = 150;
  std::vector<pid_t> writers;
  for (int w = 0; w < kWriters; ++w) {
    const pid_t pid = fork();
    if (pid == 0) {
      try {
        for (int i = 0; i < kCommits; ++i) {
          const std::string run = "writer " + std::to_string(w) + " commit " + std::to_string(i);
          OutputFiles files;
          files.stage(dir / "out.bin", bytes_of(run));
          files.stage(dir / "lse.bin", bytes_of(run));
          files.commit();
        }
      } catch (const Error& e) {
        std::fprintf(stderr, "%s\n", e.what());
        _exit(1);
      }
      _exit(0);
    }
    writers.push_back(pid);
  }
  int observed = 0;
  int mixed = 0;
  int running = kWriters;
  while (running > 0) {
    {
      const FolderLock shared(dir.path(), LOCK_SH);
      if (fs::exists(dir / "out.bin") && fs::exists(dir / "lse.bin")) {
        ++observed;
        if (testing::slurp(dir / "out.bin") != testing::slurp(dir / "lse.bin")) ++mixed;
      }
    }
    for (pid_t& pid : writers) {
      int status = 0;
      if (pid > 0 && waitpid(pid, &status, WNOHANG) == pid) {
        EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
        pid = -1;
        --running;
      }
    }
  }
  EXPECT_EQ(testing::slurp(dir / "out.bin"), testing::slurp(dir / "lse.bin"));
  EXPECT_EQ(mixed, 0) << "of " << observed << " observed pairs";
  EXPECT_GT(observed, 0);
}

}  // namespace
}  // namespace qkv
