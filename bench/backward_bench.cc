// Google Benchmark over the backward kernels: one benchmark per backward kernel (fused_hwy,
// unfused_blas) and the forward for the ratio, on B = 1, H = 8 and the n, d, causal, threads
// grid. Counters: GFLOP/s counted as FlashAttention counts them, 2.5x the forward's useful
// flops (2·(d + dv) per allowed pair and head) for the backward.
//   qkv_bench_backward --benchmark_filter='bwd_fused_hwy/.*' --benchmark_min_time=1
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>

#include "bench_pattern.h"
#include "qkv/attention.h"
#include "qkv/attention_backward.h"

namespace {

using qkv::bench::pattern;

// kernel empty: the forward (the default kernel), else that backward kernel.
void backward_benchmark(benchmark::State& state, const std::string& kernel) {
  const std::int64_t n = state.range(0);
  const std::int64_t d = state.range(1);
  const bool causal = state.range(2) != 0;
  constexpr std::int64_t kHeads = 8;
  const qkv::Tensor q = pattern({1, kHeads, n, d}, 1);
  const qkv::Tensor k = pattern({1, kHeads, n, d}, 2);
  const qkv::Tensor v = pattern({1, kHeads, n, d}, 3);
  const qkv::Tensor dout = pattern({1, kHeads, n, d}, 4);
  qkv::AttentionOptions options;
  options.causal = causal;
  options.threads = static_cast<int>(state.range(3));
  options.return_lse = true;
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

const bool kRegistered = [] {
  benchmark::RegisterBenchmark("forward", backward_benchmark, std::string())->Apply(grid);
  for (const std::string& name : qkv::attention_backward_kernel_names()) {
    if (name == "reference" || name == "fused_scalar") continue;  // minutes per shape
    benchmark::RegisterBenchmark(("bwd_" + name).c_str(), backward_benchmark, name)->Apply(grid);
  }
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
