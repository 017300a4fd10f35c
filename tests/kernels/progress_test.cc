// AttentionOptions::progress: every kernel counts each query row of each head exactly once, the
// count reaches B·H·Nq (H·total_q for a packed batch), and listening changes no bit of a result,
// for float32 inputs and for float64 ones (computed in float64 by the fused kernels). The
// backward counts key rows of single kv heads instead: every backward kernel counts each once,
// the count reaches B·Hkv·Nk (Hkv·total_k packed), and listening changes no bit of a gradient;
// the layer's backward reports its attention backward's key rows alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "qkv/attention.h"
#include "qkv/attention_backward.h"
#include "qkv/error.h"
#include "qkv/layer_backward.h"
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

TEST(AttentionBackwardProgress, EveryKernelCountsEveryKeyRowOnceAndChangesNoBit) {
  for (const Case& c : cases()) {
    if (c.weights) continue;  // the backward has no weights output; the case is the forward's
    // B·Hkv·Nk: every dimension of K but D (Hkv·total_k for a packed batch too).
    std::int64_t key_rows = 1;
    for (std::size_t i = 0; i + 1 < c.k.size(); ++i) key_rows *= c.k[i];
    for (const DType dtype : {DType::kF32, DType::kF64}) {
      const Tensor q = testing::random_tensor(dtype, c.q, 1);
      const Tensor k = testing::random_tensor(dtype, c.k, 2);
      const Tensor v = testing::random_tensor(dtype, c.v, 3);
      const Tensor cu_q = offsets(c.cu_q, "cu_q");
      const Tensor cu_k = offsets(c.cu_k, "cu_k");
      AttentionOptions options;
      options.causal = c.causal;
      options.return_lse = true;
      if (!c.cu_q.empty()) {
        options.cu_seqlens_q = cu_q.view();
        options.cu_seqlens_k = cu_k.view();
      }
      const AttentionResult forward = attention(q.view(), k.view(), v.view(), options);
      const Tensor grad_out = testing::random_tensor(forward.out.dtype(), forward.out.shape(), 4);
      for (const std::string& kernel : attention_backward_kernel_names()) {
        for (const int threads : {1, 2, 3}) {
          options.kernel = kernel;
          options.threads = threads;
          options.progress = nullptr;
          const auto run = [&] {
            return attention_backward(q.view(), k.view(), v.view(), forward.out.view(),
                                      forward.lse.view(), grad_out.view(), options);
          };
          AttentionGradients quiet;
          try {
            quiet = run();
          } catch (const Error&) {
            continue;  // this kernel declines the call
          }
          Heard heard;
          options.progress = heard.listener();
          const AttentionGradients told = run();
          const std::string where = c.name + ", " + dtype_name(dtype) + ", " + kernel + ", " +
                                    std::to_string(threads) + " threads";
          EXPECT_EQ(told.kernel, quiet.kernel) << where;
          EXPECT_EQ(heard.largest.load(), key_rows) << where;
          EXPECT_FALSE(heard.done_out_of_range.load()) << where;
          // No query rows still writes key rows (of zeros): the count is of keys alone.
          if (key_rows == 0) {
            EXPECT_EQ(heard.calls.load(), 0) << where;
          } else {
            EXPECT_GE(heard.calls.load(), 1) << where;
            EXPECT_EQ(heard.smallest_total.load(), key_rows) << where;
            EXPECT_EQ(heard.largest_total.load(), key_rows) << where;
          }
          EXPECT_TRUE(testing::same_bytes(told.dq, quiet.dq)) << where;
          EXPECT_TRUE(testing::same_bytes(told.dk, quiet.dk)) << where;
          EXPECT_TRUE(testing::same_bytes(told.dv, quiet.dv)) << where;
        }
      }
    }
  }
}

// The tiled kernels report once per task (a key chunk of one kv head), not per key tile.
TEST(AttentionBackwardProgress, TheTiledKernelsReportPerTask) {
  const Tensor q = testing::random_tensor(DType::kF32, {1, 2, 1024, 32}, 4);
  const Tensor k = testing::random_tensor(DType::kF32, {1, 2, 1024, 32}, 5);
  const Tensor v = testing::random_tensor(DType::kF32, {1, 2, 1024, 32}, 6);
  AttentionOptions options;
  options.return_lse = true;
  const AttentionResult forward = attention(q.view(), k.view(), v.view(), options);
  const Tensor grad_out = testing::random_tensor(DType::kF32, forward.out.shape(), 7);
  for (const char* kernel : {"fused_scalar", "unfused_blas"}) {
    options.kernel = kernel;
    options.threads = 2;
    Heard heard;
    options.progress = heard.listener();
    attention_backward(q.view(), k.view(), v.view(), forward.out.view(), forward.lse.view(),
                       grad_out.view(), options);
    EXPECT_EQ(heard.largest.load(), 2 * 1024) << kernel;
    EXPECT_GE(heard.calls.load(), 2) << kernel;
    EXPECT_LE(heard.calls.load(), 8) << kernel;  // b·hkv·chunks tasks: 2 kv heads x 4 chunks
  }
}

// The layer's backward reports the attention backward's key rows (B·Hkv·Nk), and nothing else:
// without a state, the forward it runs first stays silent.
TEST(LayerBackwardProgress, CountsTheAttentionBackwardsKeyRowsAlone) {
  const Tensor x = testing::random_tensor(DType::kF32, {2, 40, 12}, 1);
  const Tensor wq = testing::random_tensor(DType::kF32, {12, 4 * 8}, 2);
  const Tensor wk = testing::random_tensor(DType::kF32, {12, 2 * 8}, 3);
  const Tensor wv = testing::random_tensor(DType::kF32, {12, 2 * 8}, 4);
  const LayerWeights weights{wq.view(), wk.view(), wv.view()};
  LayerOptions options;
  options.heads = 4;
  options.kv_heads = 2;
  options.attention.causal = true;
  const LayerResult forward = multi_head_attention(x.view(), weights, options);
  const Tensor grad_out = testing::random_tensor(DType::kF32, forward.out.shape(), 5);
  const LayerGradients quiet =
      multi_head_attention_backward(x.view(), weights, options, grad_out.view());
  for (const bool with_state : {false, true}) {
    LayerForwardState state;
    if (with_state) multi_head_attention(x.view(), weights, options, std::nullopt, state);
    Heard heard;
    options.attention.progress = heard.listener();
    const LayerGradients told = multi_head_attention_backward(
        x.view(), weights, options, grad_out.view(), std::nullopt, with_state ? &state : nullptr);
    options.attention.progress = nullptr;
    EXPECT_EQ(heard.largest.load(), 2 * 2 * 40) << with_state;
    EXPECT_EQ(heard.smallest_total.load(), 2 * 2 * 40) << with_state;
    EXPECT_EQ(heard.largest_total.load(), 2 * 2 * 40) << with_state;
    EXPECT_TRUE(testing::same_bytes(told.dx, quiet.dx)) << with_state;
    EXPECT_TRUE(testing::same_bytes(told.dwq, quiet.dwq)) << with_state;
  }
}

}  // namespace
}  // namespace qkv
