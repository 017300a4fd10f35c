// The fp32 FMA peak probe behind `qkv bench --peak`: every thread runs 16 independent chains
// of vector FMAs (enough to cover 4-cycle latency on 2 FMA ports plus headroom) on the best
// SIMD target, and the achieved flop rate is summed over threads. A measured peak, not a data
// sheet's: clocks under load and the number of FMA ports are what they are on this machine.
//
// Beside it, the ceiling of the fused kernel's micro-kernels: the same FMAs fed from L1 the
// way q·K^T and P·V feed them (a 6-row x 4-vector accumulator block on AVX-512, per step 4
// vector loads and 6 broadcast loads, with a 64-step loop and the block stored after it, as
// for one d = 64 tile). What this reaches is what a micro-kernel can reach with every load
// hitting L1; the kernel's fraction of the peak is bounded by it.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/fma_peak_hwy.cc"
#include <algorithm>
#include <atomic>
#include <chrono>
#include <vector>

#include "core/parallel_for.h"
#include "hwy/aligned_allocator.h"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// After foreach_target.h, which re-includes this file once per target.
#include "hwy/highway.h"
#include "kernels/blas_threads.h"
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

// `iterations` times: a kRows x kVectors block of accumulators over 64 steps, each step
// loading kVectors vectors and broadcasting kRows scalars from a 16 KiB L1-resident buffer
// (at 16 lanes), then storing the block; returns the flops done.
double FmaFromL1(std::int64_t iterations, float* sink) {
  const hn::ScalableTag<float> df;
  using V = hn::Vec<decltype(df)>;
#if HWY_TARGET <= HWY_AVX3
  constexpr int kRows = 6;  // as HwyMicro on 32 vector registers
  constexpr int kVectors = 4;
#else
  constexpr int kRows = 4;
  constexpr int kVectors = 2;
#endif
  constexpr std::int64_t kSteps = 64;
  const std::int64_t lanes = static_cast<std::int64_t>(hn::Lanes(df));
  const std::int64_t k_floats = kSteps * kVectors * lanes;
  auto buffer = hwy::AllocateAligned<float>(
      static_cast<std::size_t>(k_floats + kRows * kSteps + kRows * kVectors * lanes));
  float* k = buffer.get();
  float* q = k + k_floats;
  float* out = q + kRows * kSteps;
  std::fill(k, out, 1e-3f);
  for (std::int64_t it = 0; it < iterations; ++it) {
    V acc[kRows][kVectors];
    for (int r = 0; r < kRows; ++r) {
      for (int u = 0; u < kVectors; ++u) acc[r][u] = hn::Zero(df);
    }
    for (std::int64_t c = 0; c < kSteps; ++c) {
      V kv[kVectors];
      for (int u = 0; u < kVectors; ++u) kv[u] = hn::Load(df, k + (c * kVectors + u) * lanes);
      for (int r = 0; r < kRows; ++r) {
        const V qr = hn::Set(df, q[r * kSteps + c]);
        for (int u = 0; u < kVectors; ++u) acc[r][u] = hn::MulAdd(qr, kv[u], acc[r][u]);
      }
    }
    for (int r = 0; r < kRows; ++r) {
      for (int u = 0; u < kVectors; ++u) hn::Store(acc[r][u], df, out + (r * kVectors + u) * lanes);
    }
  }
  *sink = out[0];
  return 2.0 * kRows * kVectors * static_cast<double>(lanes) * kSteps *
         static_cast<double>(iterations);
}

}  // namespace qkv::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace qkv::kernels {

HWY_EXPORT(FmaChains);
HWY_EXPORT(FmaFromL1);

namespace {

// The best of 3 rounds of `probe` on every thread at once, summed over threads, in GFLOP/s.
template <class Probe>
double best_rate_gflops(int threads, std::int64_t iterations, Probe probe) {
  // OpenBLAS's spinning pool would take a core from the probe.
  const SingleThreadedBlas one_blas_thread;
  double best = 0.0;
  for (int round = 0; round < 3; ++round) {
    std::vector<double> rate(static_cast<std::size_t>(threads), 0.0);
    std::vector<float> sink(static_cast<std::size_t>(threads), 0.0f);
    core::parallel_for(threads, threads, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t t = begin; t < end; ++t) {
        const auto start = std::chrono::steady_clock::now();
        const double flops = probe(iterations, &sink[static_cast<std::size_t>(t)]);
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

}  // namespace

double measure_fma_peak_gflops(int threads) {
  return best_rate_gflops(threads, 20'000'000, [](std::int64_t iterations, float* sink) {
    return HWY_DYNAMIC_DISPATCH(FmaChains)(iterations, sink);
  });
}

double measure_fma_from_l1_gflops(int threads) {
  return best_rate_gflops(threads, 200'000, [](std::int64_t iterations, float* sink) {
    return HWY_DYNAMIC_DISPATCH(FmaFromL1)(iterations, sink);
  });
}

}  // namespace qkv::kernels
#endif  // HWY_ONCE
