// Runs the qkv executable as a user would, for every end-to-end test: captured
// stdout and stderr, the exit status (128 + signal when killed), and the folder's files.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

namespace qkv::testing {

struct CommandRun {
  int status = -1;
  std::string out;
  std::string err;
};

inline std::string slurp(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline std::vector<std::string> files_in(const std::filesystem::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// In a child process: replaces it with `program args...`; returns only if that fails.
inline void exec_program(const std::string& program, const std::vector<std::string>& args) {
  std::vector<char*> argv;
  std::string copy_program = program;
  argv.push_back(copy_program.data());
  std::vector<std::string> copy = args;
  for (std::string& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  execv(copy_program.c_str(), argv.data());
}

// Starts `program args...` in `dir` with stdout and stderr going to `out_file`, `err_file`.
inline pid_t start_program(const std::string& program, const std::filesystem::path& dir,
                           const std::vector<std::string>& args,
                           const std::filesystem::path& out_file,
                           const std::filesystem::path& err_file) {
  const pid_t pid = fork();
  if (pid == 0) {
    if (chdir(dir.c_str()) != 0) _exit(126);
    const int out = open(out_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int err = open(err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(out, 1);
    dup2(err, 2);
    // The child starts with default signal actions, whatever the test runner set, and dumps
    // no core into the folder a test compares.
    for (const int signal_number :
         {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGXFSZ, SIGXCPU, SIGUSR1, SIGUSR2, SIGPIPE, SIGALRM}) {
      signal(signal_number, SIG_DFL);
    }
    const rlimit no_core{0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    exec_program(program, args);
    _exit(127);
  }
  return pid;
}

inline int wait_status(pid_t pid) {
  int wstatus = 0;
  waitpid(pid, &wstatus, 0);
  return WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
}

// As wait_status, but a process still running after `seconds` is killed with SIGKILL (status
// 128 + 9): a test of something that must not block fails instead of hanging.
inline int wait_status_within(pid_t pid, int seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    int wstatus = 0;
    if (waitpid(pid, &wstatus, WNOHANG) == pid) {
      return WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  kill(pid, SIGKILL);
  return wait_status(pid);
}

// Runs `program args...` in `dir`; the capture files live outside `dir`, so that a test can
// compare the folder's files before and after. With `timeout_seconds` > 0, a run that takes
// longer is killed (status 137).
inline CommandRun run_program(const std::string& program, const std::filesystem::path& dir,
                              const std::vector<std::string>& args, int timeout_seconds = 0) {
  const std::filesystem::path out_file = dir.parent_path() / (dir.filename().string() + ".stdout");
  const std::filesystem::path err_file = dir.parent_path() / (dir.filename().string() + ".stderr");
  const pid_t pid = start_program(program, dir, args, out_file, err_file);
  CommandRun run;
  run.status = timeout_seconds > 0 ? wait_status_within(pid, timeout_seconds) : wait_status(pid);
  run.out = slurp(out_file);
  run.err = slurp(err_file);
  std::filesystem::remove(out_file);
  std::filesystem::remove(err_file);
  return run;
}

}  // namespace qkv::testing
