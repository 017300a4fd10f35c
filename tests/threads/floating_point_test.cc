// qkv and the caller's floating-point environment (src/core/floating_point.h): a program that
// unmasked the IEEE exceptions (feenableexcept: SIGFPE on an invalid operation, a division by
// zero or an overflow) runs every forward kernel, every backward kernel, the layer, its
// backward and a cached decode on ordinary inputs (masks with -inf, causal rows, sinks,
// softcap) without dying of SIGFPE; the exception flags it finds afterwards are the ones it had
// before the call, its traps and rounding mode are as it set them, and the results are the bits
// of a call made in the default environment. Each case runs in a forked child, so that a
// SIGFPE is reported as such rather than ending the suite.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cfenv>
#include <csignal>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "qkv/attention.h"
#include "qkv/attention_backward.h"
#include "qkv/error.h"
#include "qkv/kv_cache.h"
#include "qkv/layer.h"
#include "qkv/layer_backward.h"
#include "support/test_support.h"

namespace qkv {
namespace {

constexpr int kTraps = FE_INVALID | FE_DIVBYZERO | FE_OVERFLOW;

// ThreadSanitizer does not support starting threads in the child of a multi-threaded fork,
// which these children do (the suite's thread team exists by then); `make test-tsan` skips them.
#if defined(__SANITIZE_THREAD__)
constexpr bool kForkCannotStartThreads = true;
#else
constexpr bool kForkCannotStartThreads = false;
#endif

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         (a.nbytes() == 0 || std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
}

// Runs `call` in a child with the traps enabled and the rounding mode set upward; the child
// exits 0 when `call` returned true and the environment is the caller's afterwards (flags
// included: FE_INEXACT raised before the call is still raised, nothing else is).
void expect_quiet(const std::string& what, const std::function<bool()>& call) {
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::feclearexcept(FE_ALL_EXCEPT);
    std::feraiseexcept(FE_INEXACT);  // a flag of the caller's own, which must survive
    std::fesetround(FE_UPWARD);
    feenableexcept(kTraps);
    const bool ok = call();
    const bool environment = fegetexcept() == kTraps && std::fegetround() == FE_UPWARD &&
                             std::fetestexcept(FE_ALL_EXCEPT) == FE_INEXACT;
    fedisableexcept(kTraps);
    std::_Exit(!ok ? 2 : !environment ? 3 : 0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  if (WIFSIGNALED(status)) {
    ADD_FAILURE() << what << ": died of signal " << WTERMSIG(status)
                  << (WTERMSIG(status) == SIGFPE ? " (SIGFPE)" : "");
    return;
  }
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_NE(WEXITSTATUS(status), 2) << what << ": results differ from the default environment's";
  EXPECT_NE(WEXITSTATUS(status), 3) << what << ": the caller's environment was not restored";
  EXPECT_EQ(WEXITSTATUS(status), 0) << what;
}

struct Inputs {
  Tensor q, k, v, mask, sinks, dout;
  AttentionOptions options;
};

Inputs make_inputs() {
  Inputs in;
  in.q = testing::random_tensor(DType::kF32, {2, 4, 67, 40}, 1, -2.0, 2.0);
  in.k = testing::random_tensor(DType::kF32, {2, 2, 131, 40}, 2, -2.0, 2.0);
  in.v = testing::random_tensor(DType::kF32, {2, 2, 131, 24}, 3);
  in.dout = testing::random_tensor(DType::kF32, {2, 4, 67, 24}, 4);
  in.sinks = testing::random_tensor(DType::kF32, {4}, 5, -1.0, 2.0);
  // Whole rows of -inf (a query that may attend to nothing) and scattered ones.
  in.mask = testing::random_tensor(DType::kF32, {1, 1, 67, 131}, 6, -1.0, 1.0);
  float* m = in.mask.data_as<float>();
  const float inf = std::numeric_limits<float>::infinity();
  for (std::int64_t i = 0; i < in.mask.numel(); i += 5) m[i] = -inf;
  for (std::int64_t j = 0; j < 131; ++j) m[3 * 131 + j] = -inf;
  in.options.mask = in.mask.view();
  in.options.causal = true;
  in.options.softcap = 5.0;
  in.options.sinks = in.sinks.view();
  in.options.return_lse = true;
  in.options.threads = 3;
  return in;
}

TEST(FloatingPoint, TrapsOfTheCallerNeverFireInsideTheForwardKernels) {
  if (kForkCannotStartThreads) GTEST_SKIP() << "threads after a multi-threaded fork under TSan";
  const Inputs in = make_inputs();
  for (const std::string& kernel : attention_kernel_names()) {
    AttentionOptions options = in.options;
    options.kernel = kernel;
    if (kernel == "unfused_blas" || kernel.find("decode") != std::string::npos) {
      options.mask.reset();  // kept to what every kernel takes
      options.softcap = 0.0;
      options.sinks.reset();
    }
    AttentionResult expected;
    try {
      expected = attention(in.q.view(), in.k.view(), in.v.view(), options);
    } catch (const Error&) {
      continue;  // a kernel that declines this call
    }
    expect_quiet("forward " + kernel, [&] {
      const AttentionResult r = attention(in.q.view(), in.k.view(), in.v.view(), options);
      return same_bits(r.out, expected.out) && same_bits(r.lse, expected.lse);
    });
  }
}

TEST(FloatingPoint, TrapsOfTheCallerNeverFireInsideTheBackwardKernels) {
  if (kForkCannotStartThreads) GTEST_SKIP() << "threads after a multi-threaded fork under TSan";
  const Inputs in = make_inputs();
  const AttentionResult fwd = attention(in.q.view(), in.k.view(), in.v.view(), in.options);
  for (const std::string& kernel : attention_backward_kernel_names()) {
    AttentionOptions options = in.options;
    options.kernel = kernel;
    AttentionGradients expected;
    try {
      expected = attention_backward(in.q.view(), in.k.view(), in.v.view(), fwd.out.view(),
                                    fwd.lse.view(), in.dout.view(), options);
    } catch (const Error&) {
      continue;
    }
    expect_quiet("backward " + kernel, [&] {
      const AttentionGradients g = attention_backward(in.q.view(), in.k.view(), in.v.view(),
                                                      fwd.out.view(), fwd.lse.view(),
                                                      in.dout.view(), options);
      return same_bits(g.dq, expected.dq) && same_bits(g.dk, expected.dk) &&
             same_bits(g.dv, expected.dv) && same_bits(g.dsinks, expected.dsinks);
    });
  }
}

TEST(FloatingPoint, TrapsOfTheCallerNeverFireInsideTheLayerOrADecodeStep) {
  if (kForkCannotStartThreads) GTEST_SKIP() << "threads after a multi-threaded fork under TSan";
  const Tensor x = testing::random_tensor(DType::kF32, {2, 37, 32}, 11);
  const Tensor wq = testing::random_tensor(DType::kF32, {32, 32}, 12);
  const Tensor wk = testing::random_tensor(DType::kF32, {32, 16}, 13);
  const Tensor wv = testing::random_tensor(DType::kF32, {32, 16}, 14);
  const Tensor dy = testing::random_tensor(DType::kF32, {2, 37, 32}, 15);
  const LayerWeights w{wq.view(), wk.view(), wv.view()};
  LayerOptions o;
  o.heads = 4;
  o.kv_heads = 2;
  o.attention.causal = true;
  o.attention.threads = 2;
  const LayerResult y = multi_head_attention(x.view(), w, o);
  const LayerGradients g = multi_head_attention_backward(x.view(), w, o, dy.view());
  expect_quiet("layer", [&] {
    return same_bits(multi_head_attention(x.view(), w, o).out, y.out) &&
           same_bits(multi_head_attention_backward(x.view(), w, o, dy.view()).dx, g.dx);
  });

  KVCacheOptions co;
  co.kv_heads = 2;
  co.d = 16;
  co.dv = 16;
  KVCache cache(co);
  const SequenceId s = cache.add_sequence();
  const Tensor k = testing::random_tensor(DType::kF32, {2, 50, 16}, 16);
  const Tensor v = testing::random_tensor(DType::kF32, {2, 50, 16}, 17);
  cache.append(s, k.view(), v.view());
  const Tensor q = testing::random_tensor(DType::kF32, {4, 1, 16}, 18);
  const std::vector<SequenceId> sequences = {s};
  AttentionOptions decode;
  decode.threads = 2;
  const AttentionResult expected = attention_cached(q.view(), cache, sequences, decode);
  expect_quiet("decode", [&] {
    return same_bits(attention_cached(q.view(), cache, sequences, decode).out, expected.out);
  });
}

}  // namespace
}  // namespace qkv
