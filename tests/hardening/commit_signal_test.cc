// A signal that arrives while a set of outputs is being renamed into place: the set must end
// all old or all new, with no temporary file left, whichever thread of the process takes the
// signal (a parked worker of qkv's thread team, a thread of the application's, or the committing
// thread itself once the commit is over).
//
// The signal is aimed at the renames: the parent watches the output folder with inotify and
// sends SIGTERM when the first output is moved into place (IN_MOVED_TO), so it lands during the
// commit or just after it. Each run then checks the invariant; none may fail.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "core/parallel_for.h"
#include "qkv/io.h"
#include "support/command_runner.h"
#include "support/test_support.h"

namespace qkv {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> temps_in(const fs::path& dir) {
  std::vector<std::string> temps;
  for (const std::string& name : testing::files_in(dir)) {
    if (name.find(".qkv-tmp-") != std::string::npos) temps.push_back(name);
  }
  return temps;
}

// Watches `dir` for a file renamed into it; started before the writer, so no rename is missed.
class RenameWatch {
 public:
  explicit RenameWatch(const fs::path& dir) : fd_(inotify_init1(IN_CLOEXEC)) {
    if (fd_ >= 0) inotify_add_watch(fd_, dir.c_str(), IN_MOVED_TO);
  }
  ~RenameWatch() {
    if (fd_ >= 0) close(fd_);
  }
  RenameWatch(const RenameWatch&) = delete;
  RenameWatch& operator=(const RenameWatch&) = delete;

  bool ok() const { return fd_ >= 0; }
  // Whether a rename was seen within `seconds`.
  bool wait_for_rename(int seconds) const {
    pollfd p{fd_, POLLIN, 0};
    return poll(&p, 1, seconds * 1000) == 1;
  }

 private:
  int fd_;
};

// What a run left of `names` in `dir`, each compared with its content before the run.
struct Outcome {
  int unchanged = 0, replaced = 0;
  std::vector<std::string> temps;
};

Outcome outcome(const fs::path& dir, const std::vector<std::string>& names,
                const std::vector<std::string>& before) {
  Outcome o;
  for (std::size_t i = 0; i < names.size(); ++i) {
    (testing::slurp(dir / names[i]) == before[i] ? o.unchanged : o.replaced) += 1;
  }
  o.temps = temps_in(dir);
  return o;
}

std::string describe(const Outcome& o) {
  return std::to_string(o.unchanged) + " outputs old, " + std::to_string(o.replaced) + " new, " +
         std::to_string(o.temps.size()) + " temporary files left";
}

// In a child that asked for the cleanup, as the qkv executable does: starts qkv's thread team
// (one parked worker) and, with `application_thread`, a thread of its own that leaves every
// signal unblocked; then commits `count` outputs over existing files. The parent sends SIGTERM
// at the first rename.
void commit_interrupted(bool application_thread, int count) {
  testing::ScratchDir dir;
  std::vector<std::string> names, before;
  for (int i = 0; i < count; ++i) {
    names.push_back("out" + std::to_string(i) + ".bin");
    before.push_back("old " + std::to_string(i));
    std::ofstream(dir / names.back(), std::ios::binary) << before.back();
  }
  const RenameWatch watch(dir.path());
  ASSERT_TRUE(watch.ok());
  const pid_t pid = fork();
  if (pid == 0) {
    install_output_cleanup_on_signals();
    core::parallel_for(2, 2, [](std::int64_t, std::int64_t) {});
    if (application_thread) {
      std::thread([] {
        for (;;) pause();
      }).detach();
    }
    OutputFiles files;
    for (const std::string& name : names) files.stage(dir / name, std::vector<char>{'n', 'e', 'w'});
    files.commit();
    _exit(0);
  }
  ASSERT_TRUE(watch.wait_for_rename(30));
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  const int status = testing::wait_status_within(pid, 30);
  EXPECT_TRUE(status == 128 + SIGTERM || status == 0) << status;
  const Outcome o = outcome(dir.path(), names, before);
  // The first rename was seen, so the set must be whole and new.
  EXPECT_EQ(o.replaced, count) << describe(o);
  EXPECT_TRUE(o.temps.empty()) << describe(o);
}

// 48 outputs: their renames and the removal of their backups take long enough (a few hundred
// µs) for the signal to land in the middle on any machine.
TEST(CommitInterrupted, ParkedWorkerDoesNotTakeTheSignalMidCommit) {
  for (int run = 0; run < 3; ++run) commit_interrupted(false, 48);
}

TEST(CommitInterrupted, ApplicationThreadWaitsForTheCommit) {
  for (int run = 0; run < 3; ++run) commit_interrupted(true, 48);
}

// A process forked while another thread of its parent is renaming has no such thread: a signal
// must still end it at once (its handler must not wait for the parent's commit). A harness
// process commits 16 outputs at a time on one thread while its main thread forks children that
// raise SIGTERM; each child must die of it within 5 s.
TEST(CommitInterrupted, ChildForkedMidCommitStillDiesOfTheSignal) {
  testing::ScratchDir dir;
  const pid_t harness = fork();
  if (harness == 0) {
    install_output_cleanup_on_signals();
    std::atomic<bool> stop{false};
    std::thread committer([&] {
      try {
        while (!stop.load()) {
          OutputFiles files;
          for (int i = 0; i < 16; ++i) {
            files.stage(dir / ("out" + std::to_string(i) + ".bin"), std::vector<char>{'x'});
          }
          files.commit();
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "committer: %s\n", e.what());
        _exit(2);
      }
    });
    int failures = 0;
    for (int child = 0; child < 100; ++child) {
      const pid_t pid = fork();
      if (pid == 0) {
        raise(SIGTERM);
        _exit(3);
      }
      failures += testing::wait_status_within(pid, 5) != 128 + SIGTERM;
    }
    stop.store(true);
    committer.join();
    _exit(failures == 0 ? 0 : 1);
  }
  EXPECT_EQ(testing::wait_status_within(harness, 120), 0);
}

// The executable, as the red team ran it: `attention` with gradients over existing outputs on
// two threads, SIGTERM at the first rename. Every run must leave its outputs all old or all new
// (the first rename was seen: new) and no temporary file.
TEST(CommitInterrupted, CliGradientOutputsAllOrNothing) {
  testing::ScratchDir dir;
  for (const char* name : {"q.npy", "k.npy", "v.npy", "do.npy"}) {
    const Tensor t = testing::random_tensor(DType::kF32, {2, 48, 16},
                                            static_cast<std::uint64_t>(name[0]));
    write_npy(dir / name, t.view(), DType::kF32);
  }
  const std::vector<std::string> names = {"o.npy", "lse.npy", "dq.npy", "dk.npy", "dv.npy"};
  std::vector<std::string> before;
  for (const std::string& name : names) {
    const Tensor t = testing::random_tensor(DType::kF32, {1, 1}, before.size() + 10);
    write_npy(dir / name, t.view(), DType::kF32);
    before.push_back(testing::slurp(dir / name));
  }
  const fs::path out_file = dir.path().parent_path() / (dir.path().filename().string() + ".o");
  const fs::path err_file = dir.path().parent_path() / (dir.path().filename().string() + ".e");
  int interrupted = 0;
  for (int run = 0; run < 20; ++run) {
    SCOPED_TRACE("run " + std::to_string(run));
    const RenameWatch watch(dir.path());
    ASSERT_TRUE(watch.ok());
    const pid_t pid = testing::start_program(
        QKV_CLI_PATH, dir.path(),
        {"attention", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--grad-out", "do.npy",
         "--out", "o.npy", "--lse", "lse.npy", "--grad-q", "dq.npy", "--grad-k", "dk.npy",
         "--grad-v", "dv.npy", "--threads", "2"},
        out_file, err_file);
    ASSERT_TRUE(watch.wait_for_rename(30));
    ASSERT_EQ(kill(pid, SIGTERM), 0);
    const int status = testing::wait_status_within(pid, 30);
    EXPECT_TRUE(status == 128 + SIGTERM || status == 0) << status << testing::slurp(err_file);
    interrupted += status == 128 + SIGTERM;
    const Outcome o = outcome(dir.path(), names, before);
    EXPECT_EQ(o.replaced, static_cast<int>(names.size())) << describe(o);
    EXPECT_TRUE(o.temps.empty()) << describe(o);
    // The old outputs back for the next run.
    for (std::size_t i = 0; i < names.size(); ++i) {
      std::ofstream(dir / names[i], std::ios::binary | std::ios::trunc) << before[i];
    }
    for (const std::string& temp : o.temps) fs::remove(dir / temp);
  }
  fs::remove(out_file);
  fs::remove(err_file);
  // The signal was sent while the process was alive; most runs die of it.
  EXPECT_GT(interrupted, 0);
}

}  // namespace
}  // namespace qkv
