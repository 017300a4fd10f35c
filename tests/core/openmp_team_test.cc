// qkv's teams on an OpenMP runtime (core/openmp_team.h): the runtime qkv.torch hands over is
// torch's libgomp; here it is the system's, loaded by the test as torch would have loaded it.
#include "core/openmp_team.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/parallel_for.h"
#include "qkv/attention.h"
#include "qkv/attention_backward.h"
#include "qkv/error.h"
#include "support/test_support.h"

namespace qkv {
namespace {

constexpr const char* kRuntime = "libgomp.so.1";

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         (a.nbytes() == 0 || std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
}

// Loads the runtime (as torch's import does) and switches qkv to it for one test; back to qkv's
// own threads at the end, whatever happens.
class OpenMpThreads : public ::testing::Test {
 protected:
  void SetUp() override {
    handle_ = ::dlopen(kRuntime, RTLD_NOW | RTLD_GLOBAL);
    ASSERT_NE(handle_, nullptr) << "the system's GNU OpenMP runtime (Debian's libgomp1, which "
                                   "gcc depends on) must be installed: "
                                << ::dlerror();
  }
  void TearDown() override { use_openmp_threads(""); }
  void* handle_ = nullptr;
};

TEST_F(OpenMpThreads, RunsTheTeamOnTheRuntimesThreads) {
  EXPECT_EQ(openmp_threads_library(), "");
  use_openmp_threads(kRuntime);
  EXPECT_EQ(openmp_threads_library(), kRuntime);
  auto* thread_num = reinterpret_cast<int (*)()>(::dlsym(handle_, "omp_get_thread_num"));
  ASSERT_NE(thread_num, nullptr);
  std::vector<int> seen(3, -1);
  std::atomic<int> synced{0};
  const int members = core::run_team(3, [&](int member, core::Team& team) {
    seen[static_cast<std::size_t>(member)] = thread_num();  // the runtime's own numbering
    synced.fetch_add(1);
    team.sync();  // sized to the team the runtime gave
    EXPECT_EQ(synced.load(), team.size());
  });
  ASSERT_GE(members, 1);
  ASSERT_LE(members, 3);
  for (int m = 0; m < members; ++m) EXPECT_EQ(seen[static_cast<std::size_t>(m)], m);
  // Every task exactly once, for any thread count, on the runtime's threads.
  for (int threads : {1, 2, 3, 8}) {
    std::vector<int> hits(61, 0);
    core::parallel_for(61, threads, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) ++hits[static_cast<std::size_t>(i)];
    });
    for (int h : hits) EXPECT_EQ(h, 1) << "threads " << threads;
  }
}

TEST_F(OpenMpThreads, ForwardAndBackwardAreTheSameBitsAsOnQkvsOwnThreads) {
  const Tensor q = testing::random_tensor(DType::kF32, {2, 4, 77, 32}, 1);
  const Tensor k = testing::random_tensor(DType::kF32, {2, 2, 90, 32}, 2);
  const Tensor v = testing::random_tensor(DType::kF32, {2, 2, 90, 24}, 3);
  const Tensor d_out = testing::random_tensor(DType::kF32, {2, 4, 77, 24}, 4);
  AttentionOptions options;
  options.causal = true;
  options.return_lse = true;
  options.threads = 1;
  const AttentionResult own = attention(q.view(), k.view(), v.view(), options);
  const AttentionGradients own_grads = attention_backward(
      q.view(), k.view(), v.view(), own.out.view(), own.lse.view(), d_out.view(), options);
  use_openmp_threads(kRuntime);
  for (int threads : {1, 2, 3, 8}) {
    options.threads = threads;
    const AttentionResult again = attention(q.view(), k.view(), v.view(), options);
    EXPECT_TRUE(same_bits(again.out, own.out)) << "threads " << threads;
    EXPECT_TRUE(same_bits(again.lse, own.lse)) << "threads " << threads;
    const AttentionGradients grads = attention_backward(
        q.view(), k.view(), v.view(), own.out.view(), own.lse.view(), d_out.view(), options);
    EXPECT_TRUE(same_bits(grads.dq, own_grads.dq)) << "threads " << threads;
    EXPECT_TRUE(same_bits(grads.dk, own_grads.dk)) << "threads " << threads;
    EXPECT_TRUE(same_bits(grads.dv, own_grads.dv)) << "threads " << threads;
  }
}

TEST_F(OpenMpThreads, AnExceptionOnAMemberReachesTheCaller) {
  use_openmp_threads(kRuntime);
  EXPECT_THROW(core::run_team(2, [](int member, core::Team&) {
                 if (member == 0) throw std::runtime_error("member 0 failed");
               }),
               std::runtime_error);
}

TEST_F(OpenMpThreads, RefusesALibraryThatIsNotLoadedOrNotAnOpenMpRuntime) {
  try {
    use_openmp_threads("/nonexistent/libgomp.so.1");
    FAIL() << "accepted a library that is not loaded";
  } catch (const Error& e) {
    EXPECT_EQ(e.subject(), "OpenMP library /nonexistent/libgomp.so.1");
    EXPECT_NE(std::string(e.what()).find("is not loaded in this process"), std::string::npos);
  }
  try {
    use_openmp_threads("libc.so.6");
    FAIL() << "accepted a library without GOMP_parallel";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "OpenMP library libc.so.6: has no GOMP_parallel");
  }
  // A refusal leaves the choice as it was.
  EXPECT_EQ(openmp_threads_library(), "");
  use_openmp_threads(kRuntime);
  EXPECT_THROW(use_openmp_threads("/nonexistent/libgomp.so.1"), Error);
  EXPECT_EQ(openmp_threads_library(), kRuntime);
}

}  // namespace
}  // namespace qkv
