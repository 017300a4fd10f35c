// Deterministic parallelism of the backward: every backward kernel gives bitwise identical
// dQ, dK, dV and dSinks for 1, 2, 3 and 8 threads, with every option at once (grouped-query
// heads, causal, softcap, ALiBi, sinks, a float mask), for a packed batch, and in float64;
// under ThreadSanitizer (`make test-tsan`) the same calls show no race. Shapes span several
// tiles and, with one kv head, several key chunks whose dQ partials are summed in order. bf16
// too (bf16-stored inputs: the bf16 backward, vdpbf16ps where the CPU has it), with dropout.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "qkv/attention_backward.h"
#include "support/test_support.h"

namespace qkv {
namespace {

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         (a.nbytes() == 0 || std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
}

struct BackwardCall {
  Tensor q, k, v, dout, mask, sinks, cu_q, cu_k;
  AttentionOptions options;
};

BackwardCall make_call(DType dtype, bool packed) {
  BackwardCall c;
  const Shape q = packed ? Shape{4, 300, 24} : Shape{1, 4, 200, 24};
  const Shape k = packed ? Shape{1, 420, 24} : Shape{1, 1, 333, 24};
  const Shape v = packed ? Shape{1, 420, 20} : Shape{1, 1, 333, 20};
  const Shape o = packed ? Shape{4, 300, 20} : Shape{1, 4, 200, 20};
  c.q = testing::random_tensor(dtype, q, 1, -2.0, 2.0);
  c.k = testing::random_tensor(dtype, k, 2, -2.0, 2.0);
  c.v = testing::random_tensor(dtype, v, 3);
  c.dout = testing::random_tensor(dtype, o, 4);
  c.sinks = testing::random_tensor(DType::kF32, {4}, 5, -1.0, 2.0);
  c.options.softcap = 4.0;
  c.options.alibi = true;
  c.options.sinks = c.sinks.view();
  c.options.causal = true;
  if (packed) {
    c.cu_q = Tensor(DType::kI64, {3}, "CQ");
    c.cu_k = Tensor(DType::kI64, {3}, "CK");
    const std::int64_t cq[] = {0, 130, 300}, ck[] = {0, 200, 420};
    std::memcpy(c.cu_q.data(), cq, sizeof cq);
    std::memcpy(c.cu_k.data(), ck, sizeof ck);
    c.options.cu_seqlens_q = c.cu_q.view();
    c.options.cu_seqlens_k = c.cu_k.view();
  } else {
    c.mask = testing::random_tensor(DType::kF32, {1, 4, 1, 333}, 6, -1.0, 1.0);
    for (std::int64_t i = 0; i < c.mask.numel(); i += 7) {
      c.mask.data_as<float>()[i] = -std::numeric_limits<float>::infinity();
    }
    c.options.mask = c.mask.view();
  }
  return c;
}

void expect_deterministic(const BackwardCall& c) {
  AttentionOptions forward = c.options;
  forward.return_lse = true;
  forward.out_dtype = c.q.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  const AttentionResult fwd = attention(c.q.view(), c.k.view(), c.v.view(), forward);
  for (const std::string& kernel : attention_backward_kernel_names()) {
    AttentionOptions options = c.options;
    options.kernel = kernel;
    options.threads = 1;
    const auto run = [&] {
      return attention_backward(c.q.view(), c.k.view(), c.v.view(), fwd.out.view(), fwd.lse.view(),
                                c.dout.view(), options);
    };
    const AttentionGradients one = run();
    for (int threads : {2, 3, 8}) {
      SCOPED_TRACE(kernel + ", threads " + std::to_string(threads));
      options.threads = threads;
      const AttentionGradients many = run();
      EXPECT_TRUE(same_bits(one.dq, many.dq));
      EXPECT_TRUE(same_bits(one.dk, many.dk));
      EXPECT_TRUE(same_bits(one.dv, many.dv));
      EXPECT_TRUE(same_bits(one.dsinks, many.dsinks));
    }
  }
}

TEST(BackwardThreads, EveryOptionFloat32) { expect_deterministic(make_call(DType::kF32, false)); }
TEST(BackwardThreads, PackedBatch) { expect_deterministic(make_call(DType::kF32, true)); }
TEST(BackwardThreads, Float64) { expect_deterministic(make_call(DType::kF64, false)); }
TEST(BackwardThreads, Bf16WithDropout) {
  BackwardCall c = make_call(DType::kF32, false);
  for (Tensor* t : {&c.q, &c.k, &c.v, &c.dout}) *t = t->to(DType::kBF16);
  c.options.dropout_p = 0.2;
  c.options.seed = 9;
  expect_deterministic(c);
}

}  // namespace
}  // namespace qkv
