// Deterministic parallelism with the version-2 options: softcap, ALiBi, sinks, packed batches
// and bf16/f16 storage give bitwise identical out, weights and lse for 1, 2, 3 and 8 threads, in
// every kernel that accepts the call (a kernel that declines it is skipped for that call).
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "qkv/attention.h"
#include "qkv/error.h"
#include "support/test_support.h"

namespace qkv {
namespace {

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         (a.nbytes() == 0 || std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
}

struct Call {
  std::string name;
  Tensor q, k, v, mask, sinks, cu_q, cu_k;
  AttentionOptions options;
};

Tensor int32_offsets(const std::vector<std::int32_t>& x, const char* name) {
  Tensor t(DType::kI32, {static_cast<std::int64_t>(x.size())}, name);
  std::memcpy(t.data(), x.data(), x.size() * sizeof(std::int32_t));
  return t;
}

// Each call owns its tensors; options point into them, so calls are built in place.
std::vector<Call> calls() {
  std::vector<Call> list(7);
  const auto base = [](Call& c, const char* name, DType dtype, bool packed) {
    c.name = name;
    const Shape q = packed ? Shape{4, 90, 24} : Shape{2, 4, 45, 24};
    const Shape k = packed ? Shape{2, 130, 24} : Shape{2, 2, 67, 24};
    const Shape v = packed ? Shape{2, 130, 20} : Shape{2, 2, 67, 20};
    c.q = testing::random_tensor(dtype, q, 1, -2.0, 2.0);
    c.k = testing::random_tensor(dtype, k, 2, -2.0, 2.0);
    c.v = testing::random_tensor(dtype, v, 3);
    c.sinks = testing::random_tensor(DType::kF32, {4}, 4, -1.0, 2.0);
    c.options.softcap = 4.0;
    c.options.alibi = true;
    c.options.sinks = c.sinks.view();
    c.options.causal = true;
    c.options.return_lse = true;
    c.options.return_weights = !packed;
  };
  base(list[0], "f32_modifiers_float_mask", DType::kF32, false);
  list[0].mask = testing::random_tensor(DType::kF32, {1, 4, 1, 67}, 5, -1.0, 1.0);
  for (std::int64_t i = 0; i < list[0].mask.numel(); i += 7) {
    list[0].mask.data_as<float>()[i] = -std::numeric_limits<float>::infinity();
  }
  list[0].options.mask = list[0].mask.view();
  base(list[1], "bf16_stored", DType::kBF16, false);
  base(list[2], "f32_rounded_to_f16", DType::kF32, false);
  list[2].options.dtype = DType::kF16;
  base(list[3], "f32_rounded_to_bf16", DType::kF32, false);
  list[3].options.dtype = DType::kBF16;
  base(list[4], "packed_bf16", DType::kF32, true);
  list[4].options.dtype = DType::kBF16;
  list[4].cu_q = int32_offsets({0, 20, 20, 75, 90}, "cu_q");
  list[4].cu_k = int32_offsets({0, 30, 45, 100, 130}, "cu_k");
  list[4].options.cu_seqlens_q = list[4].cu_q.view();
  list[4].options.cu_seqlens_k = list[4].cu_k.view();
  // Without modifiers: packed batches and 16-bit storage as the plain kernels take them.
  base(list[5], "packed_plain", DType::kF32, true);
  base(list[6], "bf16_stored_plain", DType::kBF16, false);
  for (Call* c : {&list[5], &list[6]}) {
    c->options.softcap.reset();
    c->options.alibi = false;
    c->options.sinks.reset();
  }
  list[5].cu_q = int32_offsets({0, 20, 20, 75, 90}, "cu_q");
  list[5].cu_k = int32_offsets({0, 30, 45, 100, 130}, "cu_k");
  list[5].options.cu_seqlens_q = list[5].cu_q.view();
  list[5].options.cu_seqlens_k = list[5].cu_k.view();
  return list;
}

class ThreadsModifiers : public ::testing::TestWithParam<std::string> {};

TEST_P(ThreadsModifiers, BitwiseIdenticalForOneTwoThreeAndEightThreads) {
  int accepted = 0;
  for (Call& c : calls()) {
    SCOPED_TRACE(c.name);
    c.options.kernel = GetParam();
    c.options.threads = 1;
    AttentionResult first;
    try {
      first = attention(c.q.view(), c.k.view(), c.v.view(), c.options);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cannot run this call"), std::string::npos) << e.what();
      continue;
    }
    ++accepted;
    for (const int threads : {2, 3, 8, 1}) {
      c.options.threads = threads;
      const AttentionResult again = attention(c.q.view(), c.k.view(), c.v.view(), c.options);
      EXPECT_TRUE(same_bits(again.out, first.out)) << "threads " << threads;
      EXPECT_TRUE(same_bits(again.weights, first.weights)) << "threads " << threads;
      EXPECT_TRUE(same_bits(again.lse, first.lse)) << "threads " << threads;
    }
  }
  if (accepted == 0) GTEST_SKIP() << GetParam() << " declines every call with these options";
}

INSTANTIATE_TEST_SUITE_P(EveryKernel, ThreadsModifiers,
                         ::testing::ValuesIn(attention_kernel_names()),
                         [](const auto& param_info) { return param_info.param; });

}  // namespace
}  // namespace qkv
