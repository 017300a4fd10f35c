// The fp32 FMA peak probe behind `qkv bench --peak`: every thread runs 16 independent chains
// of vector FMAs (enough to cover 4-cycle latency on 2 FMA ports plus headroom) on the best
// SIMD target, and the achieved flop rate is summed over threads. A measured peak, not a data
// sheet's: clocks under load and the number of FMA ports are what they are on this machine.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/fma_peak_hwy.cc"
#include <atomic>
#include <chrono>
#include <vector>

#include "core/parallel_for.h"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// After foreach_target.h, which re-includes this file once per target.
#include "hwy/highway.h"
#include "kernels/kernel.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Runs `iterations` rounds of 16 FMAs; returns the flops done and a value that keeps the work.
double FmaChains(std::int64_t iterations, float* sink) {
  const hn::ScalableTag<float> df;
  constexpr std::size_t kChains = 16;
  hn::Vec<decltype(df)> acc[kChains];
  for (std::size_t c = 0; c < kChains; ++c) acc[c] = hn::Set(df, 0.001f * static_cast<float>(c));
  const auto mul = hn::Set(df, 0.9999999f);
  const auto add = hn::Set(df, 1e-7f);
  for (std::int64_t it = 0; it < iterations; ++it) {
    for (std::size_t c = 0; c < kChains; ++c) acc[c] = hn::MulAdd(acc[c], mul, add);
  }
  auto total = acc[0];
  for (std::size_t c = 1; c < kChains; ++c) total = hn::Add(total, acc[c]);
  *sink = hn::GetLane(total);
  return 2.0 * static_cast<double>(kChains * hn::Lanes(df)) * static_cast<double>(iterations);
}

}  // namespace qkv::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace qkv::kernels {

HWY_EXPORT(FmaChains);

double measure_fma_peak_gflops(int threads) {
  constexpr std::int64_t kIterations = 20'000'000;
  double best = 0.0;
  for (int round = 0; round < 3; ++round) {
    std::vector<double> rate(static_cast<std::size_t>(threads), 0.0);
    std::vector<float> sink(static_cast<std::size_t>(threads), 0.0f);
    core::parallel_for(threads, threads, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t t = begin; t < end; ++t) {
        const auto start = std::chrono::steady_clock::now();
        const double flops =
            HWY_DYNAMIC_DISPATCH(FmaChains)(kIterations, &sink[static_cast<std::size_t>(t)]);
        const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
        rate[static_cast<std::size_t>(t)] = flops / took.count() * 1e-9;
      }
    });
    double sum = 0.0;
    for (double r : rate) sum += r;
    best = std::max(best, sum);
  }
  return best;
}

}  // namespace qkv::kernels
#endif  // HWY_ONCE
