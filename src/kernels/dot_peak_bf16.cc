// The bf16 dot-product peak probe behind `qkv bench --peak`: the FMA probe's 16 independent
// accumulator chains (fma_peak_hwy.cc) with vdpbf16ps instead of vfmadd: each 512-bit
// instruction does 32 bf16 products and 32 float32 additions into 16 lanes (two products per
// lane), counted as 64 flops, twice an FMA's 32. The peak the bf16 path of the fused kernel
// (fused_bf16-inl.h) is measured against. Compiled with a target attribute rather than through
// Highway, whose 1.0.3 API has no vdpbf16ps; run only where the CPU has AVX512-BF16.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iterator>
#include <vector>

#include "core/parallel_for.h"
#include "kernels/amx_tiles.h"
#include "kernels/blas_threads.h"
#include "kernels/kernel.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace qkv::kernels {

#if defined(__x86_64__)
namespace {

// `iterations` rounds of 16 vdpbf16ps; returns the flops done and a value that keeps the work.
__attribute__((target("avx512f,avx512bf16"))) double bf16_dot_chains(std::int64_t iterations,
                                                                     float* sink) {
  constexpr int kChains = 16;
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(0.001f * static_cast<float>(c));
  // Tiny products (2^-20 each) keep the sums finite over any number of rounds.
  const __m512bh a = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3a80));  // 2^-10
  const __m512bh b = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3a80));
  for (std::int64_t it = 0; it < iterations; ++it) {
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
  }
  __m512 total = acc[0];
  for (int c = 1; c < kChains; ++c) total = _mm512_add_ps(total, acc[c]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, total);
  *sink = lanes[0];
  return 64.0 * kChains * static_cast<double>(iterations);
}

// `iterations` times: the bf16 q·K^T micro-kernel's 6-row x 4-vector block of float32
// accumulators over 32 steps (one d = 64 tile: 32 pairs), each step loading 4 vectors of K^T
// pairs and broadcasting 6 Q pairs from an L1-resident buffer, then storing the block; returns
// the flops done. What this reaches is the ceiling of the bf16 micro-kernels.
__attribute__((target("avx512f,avx512bf16"))) double bf16_dots_from_l1(std::int64_t iterations,
                                                                       float* sink) {
  constexpr int kRows = 6;
  constexpr int kVectors = 4;
  constexpr int kSteps = 32;
  alignas(64) std::uint32_t k[kSteps * kVectors * 16];
  alignas(64) std::uint32_t q[kRows * kSteps];
  alignas(64) float out[kRows * kVectors * 16];
  std::fill(std::begin(k), std::end(k), 0x3a803a80u);  // pairs of 2^-10
  std::fill(std::begin(q), std::end(q), 0x3a803a80u);
  for (std::int64_t it = 0; it < iterations; ++it) {
    __m512 acc[kRows][kVectors];
    for (int r = 0; r < kRows; ++r) {
      for (int u = 0; u < kVectors; ++u) acc[r][u] = _mm512_setzero_ps();
    }
    for (int c = 0; c < kSteps; ++c) {
      __m512i kv[kVectors];
      for (int u = 0; u < kVectors; ++u) kv[u] = _mm512_load_si512(k + (c * kVectors + u) * 16);
      for (int r = 0; r < kRows; ++r) {
        const __m512i qr = _mm512_set1_epi32(static_cast<int>(q[r * kSteps + c]));
        for (int u = 0; u < kVectors; ++u) {
          acc[r][u] = _mm512_dpbf16_ps(acc[r][u], reinterpret_cast<__m512bh>(qr),
                                       reinterpret_cast<__m512bh>(kv[u]));
        }
      }
    }
    for (int r = 0; r < kRows; ++r) {
      for (int u = 0; u < kVectors; ++u) _mm512_store_ps(out + (r * kVectors + u) * 16, acc[r][u]);
    }
    // Keeps the compiler from hoisting the loads out of the iterations.
    asm volatile("" : : "r"(out), "r"(k), "r"(q) : "memory");
  }
  *sink = out[0];
  return 64.0 * kRows * kVectors * kSteps * static_cast<double>(iterations);
}

// The best of 3 rounds of `probe` on every thread at once, summed over threads, in GFLOP/s.
template <class Probe>
double best_rate(int threads, Probe probe) {
  // OpenBLAS's spinning pool would take a core from the probe.
  const SingleThreadedBlas one_blas_thread;
  double best = 0.0;
  for (int round = 0; round < 3; ++round) {
    std::vector<double> rate(static_cast<std::size_t>(threads), 0.0);
    std::vector<float> sink(static_cast<std::size_t>(threads), 0.0f);
    core::parallel_for(threads, threads, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t t = begin; t < end; ++t) {
        const auto start = std::chrono::steady_clock::now();
        const double flops = probe(&sink[static_cast<std::size_t>(t)]);
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

#if !defined(__clang__)  // as amx_tiles.cc: the AMX paths are GCC's
// `iterations` rounds of 6 tdpbf16ps into 6 tiles of float32 accumulators (16 x 16 each) from
// one A and one B tile held in tile registers (16 rows x 32 bf16): 16·16·32·2 = 16384 flops an
// instruction. The ceiling of the AMX products (amx_tiles.h); needs the tile state granted.
__attribute__((target("amx-tile,amx-bf16"))) double amx_chains(std::int64_t iterations,
                                                                float* sink) {
  const AmxTileSession session;
  alignas(64) std::uint16_t operand[16 * 32];
  std::fill(std::begin(operand), std::end(operand), std::uint16_t{0x3a80});  // 2^-10
  alignas(64) float out[16 * 16];
  asm volatile("" : : : "memory");  // the fill above, before the tile loads (amx_tiles.cc)
  _tile_loadd(6, operand, 64);
  _tile_loadd(7, operand, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_zero(4);
  _tile_zero(5);
  for (std::int64_t it = 0; it < iterations; ++it) {
    _tile_dpbf16ps(0, 6, 7);
    _tile_dpbf16ps(1, 6, 7);
    _tile_dpbf16ps(2, 6, 7);
    _tile_dpbf16ps(3, 6, 7);
    _tile_dpbf16ps(4, 6, 7);
    _tile_dpbf16ps(5, 6, 7);
  }
  _tile_stored(0, out, 64);
  *sink = out[0];
  return 16384.0 * 6 * static_cast<double>(iterations);
}
#endif

}  // namespace

double measure_amx_bf16_peak_gflops(int threads) {
#if !defined(__clang__)
  if (!amx_bf16_supported()) return 0.0;
  return best_rate(threads, [](float* sink) { return amx_chains(200'000, sink); });
#else
  (void)threads;
  return 0.0;
#endif
}

double measure_bf16_dot_peak_gflops(int threads) {
  if (!cpu_has_bf16_dots()) return 0.0;
  return best_rate(threads, [](float* sink) { return bf16_dot_chains(20'000'000, sink); });
}

double measure_bf16_from_l1_gflops(int threads) {
  if (!cpu_has_bf16_dots()) return 0.0;
  return best_rate(threads, [](float* sink) { return bf16_dots_from_l1(400'000, sink); });
}
#else
double measure_amx_bf16_peak_gflops(int) { return 0.0; }
double measure_bf16_dot_peak_gflops(int) { return 0.0; }
double measure_bf16_from_l1_gflops(int) { return 0.0; }
#endif

}  // namespace qkv::kernels
