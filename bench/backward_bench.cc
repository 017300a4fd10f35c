// Google Benchmark over the backward kernels: one benchmark per backward kernel and the forward
// for the ratio, on B = 1, H = 8 and the n, d, causal, threads grid (the reference and the
// scalar twin, minutes per shape there, on a small grid of their own); and the multi-head layer,
// forward and backward (from the forward's state), X [1, n, 8·d] with W^Q, W^K, W^V, W^O and
// biases. Counters: GFLOP/s counted as FlashAttention counts them, 2.5x the forward's useful
// flops (2·(d + dv) per allowed pair and head) for the backward; the layer's add its
// projections' products (twice them for its backward). bwd_bf16_fused_hwy and forward_bf16
// time the bf16 backward and forward (Q, K, V and dO stored in bf16), for the ratio to
// bwd_fused_hwy's float32 backward on the same values. forward_dropout and
// bwd_dropout_fused_hwy time both with attention dropout (p = 0.1, seed 3), for the ratio to
// forward and bwd_fused_hwy: the cost of dropout.
//   qkv_bench_backward --benchmark_filter='bwd_fused_hwy/.*' --benchmark_min_time=1
//   qkv_bench_backward --benchmark_filter='^(forward(_dropout)?|bwd(_dropout)?_fused_hwy)/n:2048/'
//   qkv_bench_backward --benchmark_filter='bwd(_bf16)?_fused_hwy/n:2048/.*'
//   qkv_bench_backward --benchmark_filter='layer_.*'
#include <benchmark/benchmark.h>

#include <cstdint>
#include <optional>
#include <string>

#include "bench_pattern.h"
#include "qkv/attention.h"
#include "qkv/attention_backward.h"
#include "qkv/layer.h"
#include "qkv/layer_backward.h"

namespace {

using qkv::bench::pattern;

// kernel empty: the forward (the default kernel), else that backward kernel; inputs stored in
// `storage` (kF32, or kBF16: the bf16 forward and backward); dropout_p > 0: with dropout.
void backward_benchmark(benchmark::State& state, const std::string& kernel, qkv::DType storage,
                        double dropout_p) {
  const std::int64_t n = state.range(0);
  const std::int64_t d = state.range(1);
  const bool causal = state.range(2) != 0;
  constexpr std::int64_t kHeads = 8;
  const qkv::Tensor q = pattern({1, kHeads, n, d}, 1).to(storage);
  const qkv::Tensor k = pattern({1, kHeads, n, d}, 2).to(storage);
  const qkv::Tensor v = pattern({1, kHeads, n, d}, 3).to(storage);
  const qkv::Tensor dout = pattern({1, kHeads, n, d}, 4).to(storage);
  qkv::AttentionOptions options;
  options.causal = causal;
  options.threads = static_cast<int>(state.range(3));
  options.return_lse = true;
  options.dropout_p = dropout_p;
  options.seed = 3;
  const qkv::AttentionResult forward = qkv::attention(q.view(), k.view(), v.view(), options);
  options.kernel = kernel;
  const auto run = [&] {
    if (kernel.empty()) {
      benchmark::DoNotOptimize(qkv::attention(q.view(), k.view(), v.view(), options));
    } else {
      benchmark::DoNotOptimize(qkv::attention_backward(q.view(), k.view(), v.view(),
                                                       forward.out.view(), forward.lse.view(),
                                                       dout.view(), options));
    }
  };
  try {
    run();
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  for (auto _ : state) run();
  const double pairs = causal ? static_cast<double>(n) * static_cast<double>(n + 1) / 2.0
                              : static_cast<double>(n) * static_cast<double>(n);
  const double flops =
      (kernel.empty() ? 1.0 : 2.5) * 2.0 * pairs * static_cast<double>(2 * d) * kHeads;
  state.counters["GFLOP/s"] = benchmark::Counter(
      flops * 1e-9 * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

void grid(benchmark::internal::Benchmark* b) {
  b->ArgNames({"n", "d", "causal", "threads"});
  for (std::int64_t n : {1024, 2048, 4096}) {
    for (std::int64_t d : {64, 128}) {
      for (std::int64_t causal : {0, 1}) {
        for (std::int64_t threads : {1, 2}) b->Args({n, d, causal, threads});
      }
    }
  }
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

// The kernels that take minutes per shape on the grid: n = 256 and 512 only.
void small_grid(benchmark::internal::Benchmark* b) {
  b->ArgNames({"n", "d", "causal", "threads"});
  for (std::int64_t n : {256, 512}) {
    for (std::int64_t causal : {0, 1}) {
      for (std::int64_t threads : {1, 2}) b->Args({n, 64, causal, threads});
    }
  }
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

// The layer: X [1, n, H·d] (H = 8), every weight and bias; `backward` times
// multi_head_attention_backward from the forward's state, else the forward.
void layer_benchmark(benchmark::State& state, bool backward) {
  const std::int64_t n = state.range(0);
  const std::int64_t d = state.range(1);
  const bool causal = state.range(2) != 0;
  constexpr std::int64_t kHeads = 8;
  const std::int64_t width = kHeads * d;
  const qkv::Tensor x = pattern({1, n, width}, 1);
  const qkv::Tensor wq = pattern({width, width}, 2), wk = pattern({width, width}, 3),
                    wv = pattern({width, width}, 4), wo = pattern({width, width}, 5);
  const qkv::Tensor bq = pattern({width}, 6), bk = pattern({width}, 7), bv = pattern({width}, 8),
                    bo = pattern({width}, 9);
  const qkv::Tensor dy = pattern({1, n, width}, 10);
  qkv::LayerWeights weights{wq.view(), wk.view(), wv.view()};
  weights.wo = wo.view();
  weights.bq = bq.view();
  weights.bk = bk.view();
  weights.bv = bv.view();
  weights.bo = bo.view();
  qkv::LayerOptions options;
  options.heads = kHeads;
  options.attention.causal = causal;
  options.attention.threads = static_cast<int>(state.range(3));
  qkv::LayerForwardState forward;
  const auto run = [&] {
    if (backward) {
      benchmark::DoNotOptimize(qkv::multi_head_attention_backward(
          x.view(), weights, options, dy.view(), std::nullopt, &forward));
    } else {
      benchmark::DoNotOptimize(qkv::multi_head_attention(x.view(), weights, options));
    }
  };
  try {
    if (backward) qkv::multi_head_attention(x.view(), weights, options, std::nullopt, forward);
    run();
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  for (auto _ : state) run();
  const double pairs = causal ? static_cast<double>(n) * static_cast<double>(n + 1) / 2.0
                              : static_cast<double>(n) * static_cast<double>(n);
  const double attention = 2.0 * pairs * static_cast<double>(2 * d) * kHeads;
  const double projections = 4 * 2.0 * static_cast<double>(n) * static_cast<double>(width) *
                             static_cast<double>(width);
  const double flops = backward ? 2.0 * projections + 2.5 * attention : projections + attention;
  state.counters["GFLOP/s"] = benchmark::Counter(
      flops * 1e-9 * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

void layer_grid(benchmark::internal::Benchmark* b) {
  b->ArgNames({"n", "d", "causal", "threads"});
  for (std::int64_t n : {512, 1024, 2048}) {
    for (std::int64_t causal : {0, 1}) {
      for (std::int64_t threads : {1, 2}) b->Args({n, 64, causal, threads});
    }
  }
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

const bool kRegistered = [] {
  constexpr qkv::DType kF32 = qkv::DType::kF32, kBF16 = qkv::DType::kBF16;
  benchmark::RegisterBenchmark("forward", backward_benchmark, std::string(), kF32, 0.0)
      ->Apply(grid);
  for (const std::string& name : qkv::attention_backward_kernel_names()) {
    const bool slow = name == "reference" || name == "fused_scalar";
    benchmark::RegisterBenchmark(("bwd_" + name).c_str(), backward_benchmark, name, kF32, 0.0)
        ->Apply(slow ? small_grid : grid);
  }
  benchmark::RegisterBenchmark("forward_bf16", backward_benchmark, std::string(), kBF16, 0.0)
      ->Apply(grid);
  benchmark::RegisterBenchmark("bwd_bf16_fused_hwy", backward_benchmark, std::string("fused_hwy"),
                               kBF16, 0.0)
      ->Apply(grid);
  benchmark::RegisterBenchmark("forward_dropout", backward_benchmark, std::string(), kF32, 0.1)
      ->Apply(grid);
  benchmark::RegisterBenchmark("bwd_dropout_fused_hwy", backward_benchmark,
                               std::string("fused_hwy"), kF32, 0.1)
      ->Apply(grid);
  benchmark::RegisterBenchmark("layer_forward", layer_benchmark, false)->Apply(layer_grid);
  benchmark::RegisterBenchmark("layer_backward", layer_benchmark, true)->Apply(layer_grid);
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
