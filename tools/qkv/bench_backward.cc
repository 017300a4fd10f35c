// qkv bench --backward: times attention_backward in-process, the chosen backward kernel (the
// library's choice, or --kernel) against the unfused CBLAS backward (`unfused_blas`) and the
// forward in the same run, on the same deterministic inputs as the forward bench.
//
// GFLOP/s count the backward as FlashAttention does: 2.5x the forward's useful flops
// (2·(d + dv) per allowed pair and head: the backward recomputes S and does four more
// products of the same size, against the forward's two).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "bench.h"
#include "cli_common.h"
#include "decode_support.h"
#include "kernels/kernel.h"
#include "qkv/attention.h"
#include "qkv/attention_backward.h"
#include "qkv/error.h"
#include "run_report.h"

namespace qkv::cli {
namespace {

struct BackwardTiming {
  std::string kernel;
  double ms = 0.0, min_ms = 0.0, cpu_ms = 0.0, gflops = 0.0, peak_rss_mib = 0.0;
  int runs = 0;
};

// Medians of `call` (which returns the kernel it ran): c.repeats runs, or >= 3 and ~1 s.
BackwardTiming time_call(const BenchCommand& c, const std::function<std::string()>& call,
                         double flops) {
  BackwardTiming t;
  for (int w = 0; w < c.warmup; ++w) t.kernel = call();
  std::vector<double> ms, cpu;
  double total = 0.0;
  const int max_runs = c.repeats > 0 ? c.repeats : 50;
  while (static_cast<int>(ms.size()) < max_runs &&
         (c.repeats > 0 || ms.size() < 3 || total < 1000.0)) {
    const double cpu_start = process_cpu_ms();
    const auto start = std::chrono::steady_clock::now();
    t.kernel = call();
    cpu.push_back(process_cpu_ms() - cpu_start);
    const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - start;
    ms.push_back(took.count());
    total += took.count();
  }
  std::sort(ms.begin(), ms.end());
  std::sort(cpu.begin(), cpu.end());
  t.runs = static_cast<int>(ms.size());
  t.ms = ms[ms.size() / 2];
  t.min_ms = ms.front();
  t.cpu_ms = cpu[cpu.size() / 2];
  t.gflops = flops / (t.ms * 1e-3) * 1e-9;
  t.peak_rss_mib = peak_rss_mib();
  return t;
}

void print_json(const char* key, const BackwardTiming& t, double peak) {
  std::printf(
      "  \"%s\": {\"kernel\": \"%s\", \"ms\": %.4f, \"min_ms\": %.4f, \"cpu_ms\": %.4f, "
      "\"runs\": %d, \"gflops\": %.2f, \"fraction_of_peak\": %.4f, \"peak_rss_mib\": %.1f}",
      key, t.kernel.c_str(), t.ms, t.min_ms, t.cpu_ms, t.runs, t.gflops,
      peak > 0 ? t.gflops / peak : 0.0, t.peak_rss_mib);
}

Tensor pattern(DType dtype, const Shape& shape, std::uint64_t seed, const char* name) {
  Tensor t(DType::kF64, shape, name);
  std::uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    t.data_as<double>()[i] = static_cast<double>(state >> 40) / 16777216.0 * 2.0 - 1.0;
  }
  if (dtype == DType::kF64) return t;
  return t.to(dtype);
}

}  // namespace

void run_backward_bench(const BenchCommand& c) {
  if (c.dtype != "f32" && c.dtype != "f64") {
    usage_error("--dtype",
                "--backward takes f32 or f64 (gradients are computed in float32 or "
                "float64), got '" +
                    c.dtype + "'");
  }
  const DType dtype = c.dtype == "f64" ? DType::kF64 : DType::kF32;
  const Tensor q = pattern(dtype, {c.batch, c.heads, c.n, c.d}, 1, "Q");
  const Tensor k = pattern(dtype, {c.batch, c.kv_heads, c.nk, c.d}, 2, "K");
  const Tensor v = pattern(dtype, {c.batch, c.kv_heads, c.nk, c.dv}, 3, "V");
  const Tensor dout = pattern(dtype, {c.batch, c.heads, c.n, c.dv}, 4, "dO");
  AttentionOptions options;
  options.causal = c.causal;
  options.threads = c.threads;
  options.return_lse = true;
  options.out_dtype = dtype;
  const double forward_flops = attention_flops(q.shape(), k.shape(), v.shape(), options);
  const double flops = 2.5 * forward_flops;
  const double fma_peak =
      c.peak_gflops > 0 ? c.peak_gflops : kernels::measure_fma_peak_gflops(c.threads);
  const double peak = dtype == DType::kF64 ? fma_peak / 2 : fma_peak;

  const AttentionResult forward = attention(q.view(), k.view(), v.view(), options);
  const auto backward_with = [&](const std::string& kernel) {
    AttentionOptions o = options;
    o.kernel = kernel;
    return [&, o] {
      return attention_backward(q.view(), k.view(), v.view(), forward.out.view(),
                                forward.lse.view(), dout.view(), o)
          .kernel;
    };
  };
  if (const char* verbose = std::getenv("QKV_VERBOSE"); verbose != nullptr && verbose[0] == '1') {
    AttentionOptions o = options;
    o.kernel = c.kernel;
    std::fputs(explain_backward_kernel_choice(q.view(), k.view(), v.view(), forward.out.view(),
                                              forward.lse.view(), dout.view(), o)
                   .c_str(),
               stderr);
  }
  const BackwardTiming chosen = time_call(c, backward_with(c.kernel), flops);
  const BackwardTiming fwd = time_call(
      c, [&] { return attention(q.view(), k.view(), v.view(), options).kernel; }, forward_flops);
  std::optional<BackwardTiming> base;
  std::string base_note;
  if (!c.no_baseline && chosen.kernel != "unfused_blas") {
    try {
      base = time_call(c, backward_with("unfused_blas"), flops);
    } catch (const Error& e) {
      base_note = e.what();
    }
  }
  if (c.json) {
    std::printf(
        "{\n  \"backward\": true, \"n\": %lld, \"nk\": %lld, \"d\": %lld, \"dv\": %lld, "
        "\"heads\": %lld, \"kv_heads\": %lld, \"batch\": %lld, \"causal\": %s, \"threads\": %d,\n"
        "  \"dtype\": \"%s\", \"fma_peak_gflops\": %.2f, \"peak_gflops\": %.2f, "
        "\"simd_target\": \"%s\", \"useful_gflop\": %.4f, \"openblas_env_set\": %s,\n",
        static_cast<long long>(c.n), static_cast<long long>(c.nk), static_cast<long long>(c.d),
        static_cast<long long>(c.dv), static_cast<long long>(c.heads),
        static_cast<long long>(c.kv_heads), static_cast<long long>(c.batch),
        c.causal ? "true" : "false", c.threads, c.dtype.c_str(), fma_peak, peak,
        kernels::simd_target_name().c_str(), flops * 1e-9, openblas_env_set() ? "true" : "false");
    print_json("chosen", chosen, peak);
    std::printf(
        ",\n  \"forward_ms\": %.4f, \"forward_kernel\": \"%s\", "
        "\"backward_forward_ratio\": %.4f",
        fwd.ms, fwd.kernel.c_str(), chosen.ms / fwd.ms);
    if (base) {
      std::printf(",\n");
      print_json("baseline", *base, peak);
      std::printf(",\n  \"speedup_vs_baseline\": %.4f", base->ms / chosen.ms);
    }
    std::printf("\n}\n");
    return;
  }
  std::printf(
      "attention backward B=%lld H=%lld Hkv=%lld n=%lld nk=%lld d=%lld dv=%lld%s, %s, %d "
      "thread(s), SIMD %s\n",
      static_cast<long long>(c.batch), static_cast<long long>(c.heads),
      static_cast<long long>(c.kv_heads), static_cast<long long>(c.n), static_cast<long long>(c.nk),
      static_cast<long long>(c.d), static_cast<long long>(c.dv), c.causal ? " causal" : "",
      c.dtype.c_str(), c.threads, kernels::simd_target_name().c_str());
  std::printf("useful work %.3f GFLOP (2.5x the forward's); %s FMA peak %.1f GFLOP/s\n",
              flops * 1e-9, dtype == DType::kF64 ? "fp64" : "fp32", peak);
  const auto line = [&](const char* role, const BackwardTiming& t) {
    std::printf(
        "%-9s %-13s %10.3f ms (min %.3f, cpu %.3f, %d runs) %8.1f GFLOP/s %5.1f %% of peak  "
        "peak RSS %.0f MiB\n",
        role, t.kernel.c_str(), t.ms, t.min_ms, t.cpu_ms, t.runs, t.gflops,
        peak > 0 ? 100.0 * t.gflops / peak : 0.0, t.peak_rss_mib);
  };
  line("backward", chosen);
  line("forward", fwd);
  std::printf("backward / forward time: %.2f\n", chosen.ms / fwd.ms);
  if (base) {
    line("baseline", *base);
    std::printf("speedup vs the unfused backward: %.2fx\n", base->ms / chosen.ms);
  } else if (!base_note.empty()) {
    std::printf("baseline: not run (%s)\n", base_note.c_str());
  }
  if (openblas_env_set()) {
    std::printf(
        "note: OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE are set; OpenBLAS may pick slow kernels "
        "for the baseline\n");
  }
}

}  // namespace qkv::cli
