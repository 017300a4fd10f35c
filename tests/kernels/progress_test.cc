// AttentionOptions::progress: every kernel counts each query row of each head exactly once, the
// count reaches B·H·Nq (H·total_q for a packed batch), and listening changes no bit of a result,
// for float32 inputs and for float64 ones (computed in float64 by the fused kernels).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "qkv/attention.h"
#include "qkv/error.h"
#include "support/test_support.h"

namespace qkv {
namespace {

// What one call told its listener. Reports may arrive from several threads and out of order,
// so the listener keeps the largest `done` it saw, the number of reports and each report's
// `total`.
struct Heard {
  std::atomic<std::int64_t> calls{0};
  std::atomic<std::int64_t> largest{0};
  std::atomic<std::int64_t> smallest_total{INT64_MAX};
  std::atomic<std::int64_t> largest_total{-1};
  std::atomic<bool> done_out_of_range{false};

  AttentionOptions::ProgressFunction listener() {
    return [this](std::int64_t done, std::int64_t total) {
      calls.fetch_add(1);
      std::int64_t seen = largest.load();
      while (done > seen && !largest.compare_exchange_weak(seen, done)) {
      }
      std::int64_t lo = smallest_total.load();
      while (total < lo && !smallest_total.compare_exchange_weak(lo, total)) {
      }
      std::int64_t hi = largest_total.load();
      while (total > hi && !largest_total.compare_exchange_weak(hi, total)) {
      }
      if (done <= 0 || done > total) done_out_of_range.store(true);
    };
  }
};

struct Case {
  std::string name;
  Shape q, k, v;
  bool causal = false;
  bool weights = false;
  std::vector<std::int64_t> cu_q, cu_k;  // a packed batch when not empty
  std::int64_t total = 0;                // B·H·Nq
};

Tensor offsets(const std::vector<std::int64_t>& cu, const char* name) {
  Tensor t(DType::kI64, {static_cast<std::int64_t>(cu.size())}, name);
  if (!cu.empty()) std::memcpy(t.data(), cu.data(), cu.size() * sizeof(std::int64_t));
  return t;
}

std::vector<Case> cases() {
  return {
      {"plain_4d", {2, 3, 70, 16}, {2, 3, 90, 16}, {2, 3, 90, 8}, false, false, {}, {}, 2 * 3 * 70},
      {"causal_gqa", {1, 4, 300, 32}, {1, 2, 300, 32}, {1, 2, 300, 32}, true, false, {}, {},
       4 * 300},
      {"weights", {3, 33, 8}, {3, 40, 8}, {3, 40, 5}, false, true, {}, {}, 3 * 33},
      {"decode_shape", {2, 8, 1, 64}, {2, 2, 500, 64}, {2, 2, 500, 64}, false, false, {}, {},
       2 * 8},
      {"packed", {2, 23, 16}, {2, 31, 16}, {2, 31, 16}, true, false, {0, 5, 5, 23}, {0, 9, 12, 31},
       2 * 23},
      {"no_rows", {2, 0, 16}, {2, 10, 16}, {2, 10, 16}, false, false, {}, {}, 0},
  };
}

TEST(AttentionProgress, EveryKernelCountsEveryRowOnceAndChangesNoBit) {
  for (const auto& [c, dtype] : [] {
         std::vector<std::pair<Case, DType>> all;
         for (const Case& x : cases()) {
           for (const DType d : {DType::kF32, DType::kF64}) all.emplace_back(x, d);
         }
         return all;
       }()) {
    const Tensor q = testing::random_tensor(dtype, c.q, 1);
    const Tensor k = testing::random_tensor(dtype, c.k, 2);
    const Tensor v = testing::random_tensor(dtype, c.v, 3);
    const Tensor cu_q = offsets(c.cu_q, "cu_q");
    const Tensor cu_k = offsets(c.cu_k, "cu_k");
    for (const std::string& kernel : attention_kernel_names()) {
      for (const int threads : {1, 2, 3}) {
        AttentionOptions options;
        options.causal = c.causal;
        options.return_weights = c.weights;
        options.return_lse = true;
        options.kernel = kernel;
        options.threads = threads;
        if (!c.cu_q.empty()) {
          options.cu_seqlens_q = cu_q.view();
          options.cu_seqlens_k = cu_k.view();
        }
        AttentionResult quiet;
        try {
          quiet = attention(q.view(), k.view(), v.view(), options);
        } catch (const Error&) {
          continue;  // this kernel declines the call (e.g. decode on a prefill shape)
        }
        Heard heard;
        options.progress = heard.listener();
        const AttentionResult told = attention(q.view(), k.view(), v.view(), options);
        const std::string where = c.name + ", " + dtype_name(dtype) + ", " + kernel + ", " +
                                  std::to_string(threads) + " threads";
        EXPECT_EQ(told.kernel, quiet.kernel) << where;
        EXPECT_EQ(heard.largest.load(), c.total) << where;
        EXPECT_FALSE(heard.done_out_of_range.load()) << where;
        if (c.total == 0) {
          EXPECT_EQ(heard.calls.load(), 0) << where;
        } else {
          EXPECT_GE(heard.calls.load(), 1) << where;
          EXPECT_EQ(heard.smallest_total.load(), c.total) << where;
          EXPECT_EQ(heard.largest_total.load(), c.total) << where;
        }
        EXPECT_TRUE(testing::same_bytes(told.out, quiet.out)) << where;
        EXPECT_TRUE(testing::same_bytes(told.lse, quiet.lse)) << where;
        EXPECT_TRUE(testing::same_bytes(told.weights, quiet.weights)) << where;
      }
    }
  }
}

// Reports come once per task, not per row or key: a long call makes few of them.
TEST(AttentionProgress, TheFusedKernelReportsPerTaskNotPerRow) {
  const Tensor q = testing::random_tensor(DType::kF32, {1, 2, 2048, 64}, 4);
  const Tensor k = testing::random_tensor(DType::kF32, {1, 2, 2048, 64}, 5);
  const Tensor v = testing::random_tensor(DType::kF32, {1, 2, 2048, 64}, 6);
  AttentionOptions options;
  options.kernel = "fused_scalar";
  options.threads = 2;
  Heard heard;
  options.progress = heard.listener();
  attention(q.view(), k.view(), v.view(), options);
  EXPECT_EQ(heard.largest.load(), 2 * 2048);
  EXPECT_GE(heard.calls.load(), 2);
  EXPECT_LE(heard.calls.load(), 2 * 2048 / 32);  // tasks hold at least 32 rows here
}

}  // namespace
}  // namespace qkv
