// The memory bandwidth probe behind `qkv bench --peak` and `qkv bench --decode`: STREAM's triad,
// a[i] = b[i] + s · c[i], over three float arrays of kTriadArrayBytes each, far beyond any
// last-level cache, so every element comes from and goes back to DRAM. Decoding from a KV cache
// reads each K/V element once per call, so this rate (not the FMA peak) is its ceiling.
//
// The arrays are split into one contiguous slice per thread; each thread first touches its own
// slice (so that on a NUMA machine its pages sit on its node) and then runs the triad on that
// slice only. A repetition is timed between two barriers of the whole team, i.e. by its slowest
// thread, as STREAM does; the best of kTriadRepeats counts. GB/s counts 12 bytes per element, two
// reads and one write, as STREAM does: a cache that allocates the written line on a write miss
// really moves 16, so the hardware's figure is up to 4/3 of this one.
//
// A plain loop: at -O2/-O3 GCC vectorises it for the build's baseline ISA (SSE2 on x86-64), which
// is enough to saturate memory; no Highway, so the portable build has it too.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "core/parallel_for.h"
#include "kernels/blas_threads.h"
#include "kernels/kernel.h"

namespace qkv::kernels {
namespace {

constexpr std::size_t kTriadArrayBytes = std::size_t{128} << 20;  // 3 x 128 MiB in all
constexpr int kTriadRepeats = 5;

struct FreeDeleter {
  void operator()(float* p) const noexcept { std::free(p); }
};
using FloatArray = std::unique_ptr<float[], FreeDeleter>;

// Untouched memory (a large allocation is fresh zero pages): its first writer places it.
FloatArray allocate_untouched(std::size_t bytes) {
  return FloatArray(static_cast<float*>(std::aligned_alloc(64, bytes)));
}

void triad(float* __restrict a, const float* __restrict b, const float* __restrict c,
           std::int64_t n, float s) noexcept {
  for (std::int64_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}

}  // namespace

double measure_triad_gbs(int threads) {
  // OpenBLAS's spinning pool would take a core from the probe.
  const SingleThreadedBlas one_blas_thread;
  const auto n = static_cast<std::int64_t>(kTriadArrayBytes / sizeof(float));
  const FloatArray a = allocate_untouched(kTriadArrayBytes);
  const FloatArray b = allocate_untouched(kTriadArrayBytes);
  const FloatArray c = allocate_untouched(kTriadArrayBytes);
  if (!a || !b || !c) return 0.0;
  float* const pa = a.get();
  float* const pb = b.get();
  float* const pc = c.get();
  double best_seconds = 0.0;
  core::run_team(std::max(threads, 1), [&](int member, core::Team& team) {
    const std::int64_t begin = n * member / team.size();
    const std::int64_t end = n * (member + 1) / team.size();
    for (std::int64_t i = begin; i < end; ++i) {
      pa[i] = 0.0f;
      pb[i] = 1.0f;
      pc[i] = 2.0f;
    }
    for (int repeat = 0; repeat < kTriadRepeats; ++repeat) {
      team.sync();
      const auto start = std::chrono::steady_clock::now();
      triad(pa + begin, pb + begin, pc + begin, end - begin, 3.0f);
      team.sync();
      if (member == 0) {
        const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
        if (best_seconds == 0.0 || took.count() < best_seconds) best_seconds = took.count();
      }
    }
  });
  // The result is read, so that the stores cannot be dropped as dead.
  volatile float sink = pa[n - 1];
  static_cast<void>(sink);
  if (best_seconds <= 0.0) return 0.0;
  return 12.0 * static_cast<double>(n) / best_seconds * 1e-9;
}

}  // namespace qkv::kernels
