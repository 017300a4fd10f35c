// Google Benchmark over the attention kernels: one benchmark per kernel in the list, on
// B = 1, H = 8 and the n, d, causal, threads grid (a smaller one than bench/run_grid.sh, for
// quick A/B work on a kernel). Counters: useful GFLOP/s (2·(d + dv) per allowed pair and head).
//   qkv_bench_attention --benchmark_filter='fused_hwy/.*' --benchmark_min_time=1
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bench_pattern.h"
#include "qkv/attention.h"

namespace {

using qkv::bench::pattern;

void attention_benchmark(benchmark::State& state, const std::string& kernel) {
  const std::int64_t n = state.range(0);
  const std::int64_t d = state.range(1);
  const bool causal = state.range(2) != 0;
  const int threads = static_cast<int>(state.range(3));
  constexpr std::int64_t kHeads = 8;
  const qkv::Tensor q = pattern({1, kHeads, n, d}, 1);
  const qkv::Tensor k = pattern({1, kHeads, n, d}, 2);
  const qkv::Tensor v = pattern({1, kHeads, n, d}, 3);
  qkv::Tensor out(qkv::DType::kF32, {1, kHeads, n, d});
  qkv::AttentionOptions options;
  options.causal = causal;
  options.threads = threads;
  options.kernel = kernel;
  const qkv::AttentionOutputs outputs{out.mutable_view(), std::nullopt, std::nullopt};
  try {
    qkv::attention_into(q.view(), k.view(), v.view(), options, outputs);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  for (auto _ : state) {
    qkv::attention_into(q.view(), k.view(), v.view(), options, outputs);
    benchmark::ClobberMemory();
  }
  const double pairs = causal ? static_cast<double>(n) * static_cast<double>(n + 1) / 2.0
                              : static_cast<double>(n) * static_cast<double>(n);
  const double flops = 2.0 * pairs * static_cast<double>(2 * d) * kHeads;
  state.counters["GFLOP/s"] = benchmark::Counter(
      flops * 1e-9 * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

void grid(benchmark::internal::Benchmark* b) {
  b->ArgNames({"n", "d", "causal", "threads"});
  for (std::int64_t n : {512, 1024, 2048, 4096}) {
    for (std::int64_t d : {64, 128}) {
      for (std::int64_t causal : {0, 1}) {
        for (std::int64_t threads : {1, 2}) b->Args({n, d, causal, threads});
      }
    }
  }
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

const bool kRegistered = [] {
  for (const std::string& name : qkv::attention_kernel_names()) {
    if (name == "reference" || name == "fused_scalar") continue;  // minutes per shape
    benchmark::RegisterBenchmark(name.c_str(), attention_benchmark, name)->Apply(grid);
  }
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
