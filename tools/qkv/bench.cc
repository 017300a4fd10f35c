// What qkv bench --backward and qkv bench --layer share beyond bench.h's clocks: the peak their
// GFLOP/s are measured against, the opening of their JSON object and their text lines.
#include <algorithm>
#include <cstdio>
#include <string>

#include "bench.h"
#include "kernels/kernel.h"

namespace qkv::cli {

BenchPeak::BenchPeak(const BenchCommand& c, DType dtype)
    : given_(c.peak_gflops > 0),
      f64_(dtype == DType::kF64),
      threads_(c.threads),
      fma_(given_ ? c.peak_gflops : kernels::measure_fma_peak_gflops(c.threads)) {}

void BenchPeak::measure_again() {
  if (!given_) fma_ = std::max(fma_, kernels::measure_fma_peak_gflops(threads_));
}

void print_json_header(const BenchCommand& c, const BenchPeak& peak, const std::string& lead,
                       const std::string& extra) {
  std::printf(
      "{\n  %s\"n\": %lld, \"nk\": %lld, \"d\": %lld, \"dv\": %lld, \"heads\": %lld, "
      "\"kv_heads\": %lld, \"batch\": %lld, \"causal\": %s, \"dropout\": %g, \"threads\": %d,\n"
      "  \"dtype\": \"%s\", \"fma_peak_gflops\": %.2f, \"peak_gflops\": %.2f, "
      "\"simd_target\": \"%s\", %s\"openblas_env_set\": %s,\n",
      lead.c_str(), static_cast<long long>(c.n), static_cast<long long>(c.nk),
      static_cast<long long>(c.d), static_cast<long long>(c.dv), static_cast<long long>(c.heads),
      static_cast<long long>(c.kv_heads), static_cast<long long>(c.batch),
      c.causal ? "true" : "false", c.dropout, c.threads, c.dtype.c_str(), peak.fma(),
      peak.of_dtype(), kernels::simd_target_name().c_str(), extra.c_str(),
      openblas_env_set() ? "true" : "false");
}

void print_timing_line(const char* role, const Timing& t, double peak) {
  std::printf(
      "%-9s %-13s %10.3f ms (min %.3f, cpu %.3f, %d runs) %8.1f GFLOP/s %5.1f %% of peak  "
      "peak RSS %.0f MiB\n",
      role, t.kernel.c_str(), t.ms, t.min_ms, t.cpu_ms, t.runs, t.gflops,
      peak > 0 ? 100.0 * t.gflops / peak : 0.0, t.peak_rss_mib);
}

void print_openblas_note(const char* calls) {
  if (!openblas_env_set()) return;
  std::printf(
      "note: OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE are set; OpenBLAS may pick slow kernels for %s\n",
      calls);
}

}  // namespace qkv::cli
