// When the system will not create threads (a process limit, RLIMIT_NPROC; an address space too
// small for another stack), qkv runs on the threads it has: same bits, no hang, no abort. Each
// case runs in a child process whose thread limit is 1 (its own thread), under an alarm that
// turns a hang into a failure. RLIMIT_NPROC does not bind root, so a root child first becomes
// the unprivileged user nobody.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "qkv/attention.h"
#include "qkv/io.h"
#include "qkv/layer.h"
#include "support/command_runner.h"
#include "support/test_support.h"

namespace qkv::testing {
namespace {

constexpr unsigned kAlarmSeconds = 60;
constexpr uid_t kNobody = 65534;

// In a child: no further thread may be created. False if the limit could not be set.
bool forbid_new_threads() {
  if (::geteuid() == 0 && (::setgid(kNobody) != 0 || ::setuid(kNobody) != 0)) return false;
  const rlimit one{1, 1};
  return ::setrlimit(RLIMIT_NPROC, &one) == 0;
}

// Runs `body` in a child with no thread to spare; its return value is the child's exit status
// (0 = pass). A child killed by a signal (the alarm: a hang) reports 128 + the signal.
template <class Body>
int in_child_without_threads(Body body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(kAlarmSeconds);
    if (!forbid_new_threads()) ::_exit(90);
    ::_exit(body());
  }
  return wait_status(pid);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.nbytes())) == 0;
}

TEST(ThreadLimit, EveryKernelRunsOnTheThreadsItHasWithTheSameBits) {
  const Tensor q = random_tensor(DType::kF32, {2, 4, 300, 32}, 1);
  const Tensor k = random_tensor(DType::kF32, {2, 2, 300, 32}, 2);
  const Tensor v = random_tensor(DType::kF32, {2, 2, 300, 24}, 3);
  for (const std::string& kernel : attention_kernel_names()) {
    SCOPED_TRACE(kernel);
    for (const bool causal : {false, true}) {
      AttentionOptions options;
      options.kernel = kernel;
      options.causal = causal;
      options.threads = 1;
      const Tensor want = attention(q.view(), k.view(), v.view(), options).out;
      options.threads = 4;
      const int status = in_child_without_threads([&] {
        const std::int64_t before = threads_not_started();
        const Tensor got = attention(q.view(), k.view(), v.view(), options).out;
        if (threads_not_started() == before) return 2;  // the limit did not bite: no test
        return same_bits(got, want) ? 0 : 1;
      });
      EXPECT_EQ(status, 0) << "1: different bits, 2: threads were created anyway, 90: no limit, "
                              "128 + 14: hung (alarm), 128 + 6: aborted";
    }
  }
}

TEST(ThreadLimit, TheLayerRunsOnTheThreadsItHas) {
  const Tensor x = random_tensor(DType::kF32, {300, 16}, 4);
  const Tensor wq = random_tensor(DType::kF32, {16, 16}, 5);
  const Tensor wk = random_tensor(DType::kF32, {16, 16}, 6);
  const Tensor wv = random_tensor(DType::kF32, {16, 16}, 7);
  LayerWeights weights{wq.view(), wk.view(), wv.view()};
  LayerOptions options;
  options.heads = 4;
  options.attention.threads = 1;
  const Tensor want = multi_head_attention(x.view(), weights, options).out;
  options.attention.threads = 4;
  const int status = in_child_without_threads([&] {
    const Tensor got = multi_head_attention(x.view(), weights, options).out;
    if (threads_not_started() == 0) return 2;
    return same_bits(got, want) ? 0 : 1;
  });
  EXPECT_EQ(status, 0);
}

// The CLI under the same limit: exit 0, the output of an unlimited run byte for byte, and with
// QKV_VERBOSE=1 one line saying that fewer threads ran.
TEST(ThreadLimit, TheCliSaysSoAndWritesTheSameOutput) {
  ScratchDir dir;
  std::filesystem::permissions(dir.path(), std::filesystem::perms::all);
  write_npy(dir.path() / "q.npy", random_tensor(DType::kF32, {4, 300, 32}, 8).view(), DType::kF32);
  write_npy(dir.path() / "k.npy", random_tensor(DType::kF32, {4, 300, 32}, 9).view(), DType::kF32);
  write_npy(dir.path() / "v.npy", random_tensor(DType::kF32, {4, 300, 32}, 10).view(), DType::kF32);
  for (const char* name : {"q.npy", "k.npy", "v.npy"}) {
    std::filesystem::permissions(dir.path() / name, std::filesystem::perms::all);
  }
  const std::vector<std::string> args = {"attention", "--q",   "q.npy",    "--k",       "k.npy",
                                         "--v",       "v.npy", "--causal", "--threads", "4"};
  std::vector<std::string> free_args = args;
  free_args.insert(free_args.end(), {"--out", "free.npy"});
  ASSERT_EQ(run_program(QKV_CLI_PATH, dir.path(), free_args).status, 0);

  std::vector<std::string> limited_args = args;
  limited_args.insert(limited_args.end(), {"--out", "limited.npy"});
  const std::filesystem::path err = dir.path() / "stderr.txt";
  const int status = in_child_without_threads([&] {
    if (::chdir(dir.path().c_str()) != 0) return 91;
    if (::freopen(err.c_str(), "w", stderr) == nullptr) return 92;
    ::setenv("QKV_VERBOSE", "1", 1);
    // LeakSanitizer's exit-time check runs on a thread of its own, which this child cannot have.
    const char* asan = std::getenv("ASAN_OPTIONS");
    const std::string options = std::string(asan != nullptr ? asan : "") + ":detect_leaks=0";
    ::setenv("ASAN_OPTIONS", options.c_str(), 1);
    exec_program(QKV_CLI_PATH, limited_args);
    return 127;
  });
  const std::string message = slurp(err);
  EXPECT_EQ(status, 0) << message;
  EXPECT_NE(message.find("refused"), std::string::npos) << message;
  EXPECT_TRUE(slurp(dir.path() / "limited.npy") == slurp(dir.path() / "free.npy"));
}

// Under an address-space limit too small for OpenBLAS's 128 MiB buffer, OpenBLAS retries its
// allocation for ever: a BLAS call is refused with one line instead (the layer's projections,
// unfused_blas when forced), and the default kernel choice passes it by. Sanitizers reserve
// more address space than any such limit, so this runs only without them.
TEST(AddressSpaceLimit, BlasCallsAreRefusedNeverHung) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "sanitizers reserve more address space than the limit";
#endif
  ScratchDir dir;
  write_npy(dir / "x.npy", random_tensor(DType::kF32, {64, 16}, 1).view(), DType::kF32);
  write_npy(dir / "w.npy", random_tensor(DType::kF32, {16, 16}, 2).view(), DType::kF32);
  const auto run_limited = [&](const std::vector<std::string>& args) {
    const std::filesystem::path err = dir / "stderr.txt";
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::alarm(kAlarmSeconds);
      if (::chdir(dir.path().c_str()) != 0) ::_exit(91);
      if (::freopen(err.c_str(), "w", stderr) == nullptr) ::_exit(92);
      const rlimit space{std::uint64_t{150} << 20, std::uint64_t{150} << 20};
      if (::setrlimit(RLIMIT_AS, &space) != 0) ::_exit(90);
      exec_program(QKV_CLI_PATH, args);
      ::_exit(127);
    }
    const int status = wait_status(pid);
    return std::make_pair(status, slurp(err));
  };
  const auto [forced, forced_err] =
      run_limited({"attention", "--q", "x.npy", "--k", "x.npy", "--v", "x.npy", "--out", "o.npy",
                   "--kernel", "unfused_blas", "--threads", "1"});
  EXPECT_EQ(forced, 1) << "128 + 14: hung; " << forced_err;
  EXPECT_EQ(std::count(forced_err.begin(), forced_err.end(), '\n'), 1) << forced_err;
  EXPECT_NE(forced_err.find("ulimit -v"), std::string::npos) << forced_err;

  const auto [chosen, chosen_err] = run_limited({"attention", "--q", "x.npy", "--k", "x.npy", "--v",
                                                 "x.npy", "--out", "o.npy", "--threads", "1"});
  EXPECT_EQ(chosen, 0) << chosen_err;

  const auto [layer, layer_err] =
      run_limited({"layer", "--x", "x.npy", "--wq", "w.npy", "--wk", "w.npy", "--wv", "w.npy",
                   "--heads", "2", "--out", "o.npy", "--threads", "1"});
  EXPECT_EQ(layer, 1) << "128 + 14: hung; " << layer_err;
  EXPECT_NE(layer_err.find("ulimit -v"), std::string::npos) << layer_err;
}

}  // namespace
}  // namespace qkv::testing
