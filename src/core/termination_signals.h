// The asynchronous signals whose default action ends the process and that a run may meet: the
// terminal's (INT, QUIT, HUP), a supervisor's (TERM, USR1, USR2, ALRM), the shell's limits (XFSZ,
// XCPU) and a closed pipe (PIPE). Not SIGKILL and SIGSTOP, which cannot be caught or blocked, nor
// the signals of a fault (SEGV, BUS, FPE, ...), which must reach the thread that faulted.
//
// Two users: the output files' cleanup (src/io/atomic_file.cc) handles these and defers them
// through a commit, and the thread team (parallel_for.cc) starts its threads with them blocked,
// so that a signal sent to the process is taken by a thread of the caller, never by a parked
// worker of ours in the middle of someone else's commit.
#pragma once

#include <signal.h>

#include <array>

namespace qkv::core {

inline constexpr std::array<int, 10> kTerminationSignals = {
    SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGXFSZ, SIGXCPU, SIGUSR1, SIGUSR2, SIGPIPE, SIGALRM};

// Blocks kTerminationSignals on the calling thread for its lifetime, then restores the mask it
// found (a signal that arrived meanwhile is then delivered, to this thread or another).
class TerminationSignalsBlocked {
 public:
  TerminationSignalsBlocked() {
    sigset_t set;
    sigemptyset(&set);
    for (const int signal_number : kTerminationSignals) sigaddset(&set, signal_number);
    blocked_ = ::pthread_sigmask(SIG_BLOCK, &set, &previous_) == 0;
  }
  ~TerminationSignalsBlocked() {
    if (blocked_) ::pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
  }
  TerminationSignalsBlocked(const TerminationSignalsBlocked&) = delete;
  TerminationSignalsBlocked& operator=(const TerminationSignalsBlocked&) = delete;

  bool blocked() const noexcept { return blocked_; }

 private:
  sigset_t previous_{};
  bool blocked_ = false;
};

}  // namespace qkv::core
