// A library leaves the process's signal dispositions as it found them: writing outputs through
// qkv (write_npy, OutputFiles) installs no handler. Cleanup of temporary files on signals is
// installed only on request (install_output_cleanup_on_signals, which the qkv executable calls),
// and then only where a signal still has its default action. Each check runs in a freshly
// started copy of this test program (the "threadsafe" death-test style re-executes it), so no
// earlier test's writes can have changed the dispositions it starts from.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <array>
#include <filesystem>

#include "qkv/io.h"
#include "support/test_support.h"

namespace qkv {
namespace {

constexpr std::array<int, 10> kSignals = {SIGINT,  SIGTERM, SIGHUP,  SIGQUIT, SIGXFSZ,
                                          SIGXCPU, SIGUSR1, SIGUSR2, SIGPIPE, SIGALRM};

bool all_default() {
  for (const int s : kSignals) {
    struct sigaction current {};
    if (::sigaction(s, nullptr, &current) != 0 || current.sa_handler != SIG_DFL) return false;
  }
  return true;
}

void write_outputs_and_exit() {
  if (!all_default()) ::_exit(3);  // the fresh process starts with default dispositions
  testing::ScratchDir dir;
  const Tensor t = testing::random_tensor(DType::kF32, {3, 4}, 1);
  write_npy(dir / "a.npy", t.view(), DType::kF32);
  OutputFiles files;
  files.stage_npy(dir / "b.npy", t.view(), DType::kF32);
  files.commit();
  ::_exit(all_default() ? 0 : 1);
}

void install_on_request_and_exit() {
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGUSR1, &ignore, nullptr);  // the program's own choice for one signal
  install_output_cleanup_on_signals();
  install_output_cleanup_on_signals();  // idempotent
  struct sigaction term {
  }, usr1{};
  ::sigaction(SIGTERM, nullptr, &term);
  ::sigaction(SIGUSR1, nullptr, &usr1);
  ::_exit(term.sa_handler != SIG_DFL && usr1.sa_handler == SIG_IGN ? 0 : 1);
}

TEST(SignalDispositions, WritingOutputsInstallsNoHandler) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(write_outputs_and_exit(), ::testing::ExitedWithCode(0), "");
}

TEST(SignalDispositions, CleanupIsInstalledOnRequestWhereTheActionIsTheDefault) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(install_on_request_and_exit(), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace qkv
