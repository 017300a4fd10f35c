// Google Benchmark for the version 2 options against the same call without them, in one run
// (B = 1, H = 8, the default kernel, 2 threads unless given):
//   modifiers/plain and modifiers/all     softcap 30 + standard ALiBi + sinks, or none
//   storage/f32, storage/f16              Q, K, V stored as float32 or float16
//   packed/packed, packed/one_by_one, packed/padded
//                                         twelve sequences of 64..2048 rows: one packed call,
//                                         the same sequences one call each, and one call on the
//                                         batch padded to 2048 rows with a padding mask
// Counters: useful GFLOP/s (2·(d + dv) per allowed pair and head; padding not counted).
//   qkv_bench_v2 --benchmark_repetitions=7 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

#include "bench_pattern.h"
#include "qkv/attention.h"

namespace {

constexpr std::int64_t kHeads = 8;

using qkv::bench::pattern;

double pairs(std::int64_t n, bool causal) {
  const auto x = static_cast<double>(n);
  return causal ? x * (x + 1) / 2 : x * x;
}

void set_rate(benchmark::State& state, double useful_pairs, std::int64_t d) {
  const double flops = 2.0 * useful_pairs * static_cast<double>(2 * d) * kHeads;
  state.counters["GFLOP/s"] = benchmark::Counter(
      flops * 1e-9 * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

// Args: n, d, causal, threads.
void modifiers(benchmark::State& state, bool with) {
  const std::int64_t n = state.range(0), d = state.range(1);
  const bool causal = state.range(2) != 0;
  const qkv::Tensor q = pattern({1, kHeads, n, d}, 1), k = pattern({1, kHeads, n, d}, 2),
                    v = pattern({1, kHeads, n, d}, 3), sinks = pattern({kHeads}, 4);
  qkv::Tensor out(qkv::DType::kF32, {1, kHeads, n, d});
  qkv::AttentionOptions options;
  options.causal = causal;
  options.threads = static_cast<int>(state.range(3));
  if (with) {
    options.softcap = 30.0;
    options.alibi = true;
    options.sinks = sinks.view();
  }
  const qkv::AttentionOutputs outputs{out.mutable_view(), std::nullopt, std::nullopt};
  for (auto _ : state) {
    state.SetLabel(qkv::attention_into(q.view(), k.view(), v.view(), options, outputs));
    benchmark::ClobberMemory();
  }
  set_rate(state, pairs(n, causal), d);
}

void storage(benchmark::State& state, qkv::DType dtype) {
  const std::int64_t n = state.range(0), d = state.range(1);
  const bool causal = state.range(2) != 0;
  const qkv::Tensor q = pattern({1, kHeads, n, d}, 1).to(dtype),
                    k = pattern({1, kHeads, n, d}, 2).to(dtype),
                    v = pattern({1, kHeads, n, d}, 3).to(dtype);
  qkv::Tensor out(qkv::DType::kF32, {1, kHeads, n, d});
  qkv::AttentionOptions options;
  options.causal = causal;
  options.threads = static_cast<int>(state.range(3));
  const qkv::AttentionOutputs outputs{out.mutable_view(), std::nullopt, std::nullopt};
  for (auto _ : state) {
    state.SetLabel(qkv::attention_into(q.view(), k.view(), v.view(), options, outputs));
    benchmark::ClobberMemory();
  }
  set_rate(state, pairs(n, causal), d);
}

// Twelve sequences between 64 and 2048 rows (about 1000 on average).
const std::vector<std::int64_t> kLengths = {64,  1900, 300, 2048, 128, 1000,
                                            700, 1500, 90,  2048, 500, 1200};

enum class Packing { kPacked, kOneByOne, kPadded };

// Rows [row0, row0 + rows) of a float32 [H, total, d] tensor, as a view.
template <class View>
View rows_of(View view, std::int64_t row0, std::int64_t rows, std::int64_t d) {
  using Byte =
      std::conditional_t<std::is_same_v<View, qkv::TensorView>, const std::byte, std::byte>;
  view.data = static_cast<Byte*>(view.data) + row0 * d * static_cast<std::int64_t>(sizeof(float));
  view.shape[1] = rows;
  return view;
}

// Args: d, causal, threads.
void packed(benchmark::State& state, Packing how) {
  const std::int64_t d = state.range(0);
  const bool causal = state.range(1) != 0;
  const auto count = static_cast<std::int64_t>(kLengths.size());
  const std::int64_t total = std::accumulate(kLengths.begin(), kLengths.end(), std::int64_t{0});
  const std::int64_t longest = 2048;
  qkv::AttentionOptions options;
  options.causal = causal;
  options.threads = static_cast<int>(state.range(2));
  double useful = 0.0;
  for (std::int64_t n : kLengths) useful += pairs(n, causal);
  if (how == Packing::kPadded) {
    const qkv::Tensor q = pattern({count, kHeads, longest, d}, 1),
                      k = pattern({count, kHeads, longest, d}, 2),
                      v = pattern({count, kHeads, longest, d}, 3);
    // Padded keys are masked; padded query rows keep key 0 so that no row is empty.
    qkv::Tensor mask(qkv::DType::kBool, {count, 1, longest, longest});
    bool* m = mask.data_as<bool>();
    for (std::int64_t b = 0; b < count; ++b) {
      for (std::int64_t i = 0; i < longest; ++i) {
        for (std::int64_t j = 0; j < longest; ++j) {
          m[(b * longest + i) * longest + j] = j < kLengths[static_cast<std::size_t>(b)] || j == 0;
        }
      }
    }
    options.mask = mask.view();
    qkv::Tensor out(qkv::DType::kF32, {count, kHeads, longest, d});
    const qkv::AttentionOutputs outputs{out.mutable_view(), std::nullopt, std::nullopt};
    for (auto _ : state) {
      qkv::attention_into(q.view(), k.view(), v.view(), options, outputs);
      benchmark::ClobberMemory();
    }
    set_rate(state, useful, d);
    return;
  }
  const qkv::Tensor q = pattern({kHeads, total, d}, 1), k = pattern({kHeads, total, d}, 2),
                    v = pattern({kHeads, total, d}, 3);
  qkv::Tensor out(qkv::DType::kF32, {kHeads, total, d});
  qkv::Tensor cu(qkv::DType::kI64, {count + 1});
  for (std::int64_t b = 0; b < count; ++b) {
    cu.data_as<std::int64_t>()[b + 1] =
        cu.data_as<std::int64_t>()[b] + kLengths[static_cast<std::size_t>(b)];
  }
  for (auto _ : state) {
    if (how == Packing::kPacked) {
      options.cu_seqlens_q = cu.view();
      options.cu_seqlens_k = cu.view();
      qkv::attention_into(q.view(), k.view(), v.view(), options,
                          {out.mutable_view(), std::nullopt, std::nullopt});
    } else {
      for (std::int64_t b = 0; b < count; ++b) {
        const std::int64_t row0 = cu.data_as<std::int64_t>()[b];
        const std::int64_t rows = kLengths[static_cast<std::size_t>(b)];
        qkv::attention_into(
            rows_of(q.view(), row0, rows, d), rows_of(k.view(), row0, rows, d),
            rows_of(v.view(), row0, rows, d), options,
            {rows_of(out.mutable_view(), row0, rows, d), std::nullopt, std::nullopt});
      }
    }
    benchmark::ClobberMemory();
  }
  set_rate(state, useful, d);
}

void square_grid(benchmark::internal::Benchmark* b) {
  b->ArgNames({"n", "d", "causal", "threads"});
  for (std::int64_t d : {64, 128}) {
    for (std::int64_t causal : {0, 1}) b->Args({2048, d, causal, 2});
  }
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

void packed_grid(benchmark::internal::Benchmark* b) {
  b->ArgNames({"d", "causal", "threads"});
  for (std::int64_t causal : {0, 1}) b->Args({64, causal, 2});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

const bool kRegistered = [] {
  benchmark::RegisterBenchmark("modifiers/plain", modifiers, false)->Apply(square_grid);
  benchmark::RegisterBenchmark("modifiers/all", modifiers, true)->Apply(square_grid);
  benchmark::RegisterBenchmark("storage/f32", storage, qkv::DType::kF32)->Apply(square_grid);
  benchmark::RegisterBenchmark("storage/f16", storage, qkv::DType::kF16)->Apply(square_grid);
  benchmark::RegisterBenchmark("packed/packed", packed, Packing::kPacked)->Apply(packed_grid);
  benchmark::RegisterBenchmark("packed/one_by_one", packed, Packing::kOneByOne)->Apply(packed_grid);
  benchmark::RegisterBenchmark("packed/padded", packed, Packing::kPadded)->Apply(packed_grid);
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
