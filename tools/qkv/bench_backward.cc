// qkv bench --backward: times attention_backward in-process, the chosen backward kernel (the
// library's choice, or --kernel) against the unfused CBLAS backward (`unfused_blas`) and the
// forward in the same run, on the same deterministic inputs as the forward bench. --dtype bf16
// (Q, K, V and dO stored in bf16: the bf16 backward) is also timed against the float32
// backward on float32 copies of the same values, in the same run.
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
#include "kernels/backward_kernel.h"
#include "kernels/kernel.h"
#include "qkv/attention.h"
#include "qkv/attention_backward.h"
#include "qkv/error.h"
#include "run_report.h"

namespace qkv::cli {

void run_backward_bench(const BenchCommand& c) {
  if (c.dtype != "f32" && c.dtype != "f64" && c.dtype != "bf16") {
    usage_error("--dtype",
                "--backward takes f32, f64 or bf16 (gradients are computed in float32, "
                "float64 or bfloat16), got '" +
                    c.dtype + "'");
  }
  const DType dtype = c.dtype == "f64"    ? DType::kF64
                      : c.dtype == "bf16" ? DType::kBF16
                                          : DType::kF32;
  const bool bf16 = dtype == DType::kBF16;
  const Tensor q = pattern_tensor(dtype, {c.batch, c.heads, c.n, c.d}, 1, "Q");
  const Tensor k = pattern_tensor(dtype, {c.batch, c.kv_heads, c.nk, c.d}, 2, "K");
  const Tensor v = pattern_tensor(dtype, {c.batch, c.kv_heads, c.nk, c.dv}, 3, "V");
  const Tensor dout = pattern_tensor(dtype, {c.batch, c.heads, c.n, c.dv}, 4, "dO");
  AttentionOptions options;
  options.causal = c.causal;
  options.threads = c.threads;
  options.return_lse = true;
  options.out_dtype = dtype == DType::kF64 ? DType::kF64 : DType::kF32;
  options.dropout_p = c.dropout;
  options.seed = c.seed;
  const double forward_flops = attention_flops(q.shape(), k.shape(), v.shape(), options);
  const double flops = 2.5 * forward_flops;
  BenchPeak bench_peak(c, dtype);  // measured now and again after the timed calls

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
  const Timing chosen = time_calls(c.repeats, c.warmup, backward_with(c.kernel), flops);
  // bf16: the float32 backward (the library's choice) on float32 copies of the same values.
  std::optional<Timing> f32_backward;
  std::string f32_note;
  if (bf16 && !c.no_baseline) {
    try {
      const Tensor q32 = q.to(DType::kF32), k32 = k.to(DType::kF32), v32 = v.to(DType::kF32),
                   do32 = dout.to(DType::kF32);
      AttentionOptions o = options;
      const AttentionResult f32_forward = attention(q32.view(), k32.view(), v32.view(), o);
      f32_backward = time_calls(
          c.repeats, c.warmup,
          [&] {
            return attention_backward(q32.view(), k32.view(), v32.view(), f32_forward.out.view(),
                                      f32_forward.lse.view(), do32.view(), o)
                .kernel;
          },
          flops);
    } catch (const Error& e) {
      f32_note = e.what();
    }
  }
  const Timing fwd = time_calls(
      c.repeats, c.warmup, [&] { return attention(q.view(), k.view(), v.view(), options).kernel; },
      forward_flops);
  std::optional<Timing> base;
  std::string base_note;
  if (!c.no_baseline && chosen.kernel != "unfused_blas") {
    try {
      base = time_calls(c.repeats, c.warmup, backward_with("unfused_blas"), flops);
    } catch (const Error& e) {
      base_note = e.what();
    }
  }
  bench_peak.measure_again();
  const double fma_peak = bench_peak.fma();
  // The relevant peak: the AMX peak where the bf16 backward runs on AMX tiles, the bf16
  // dot-product peak where it runs vdpbf16ps, the fp64 FMA peak for float64, the FMA peak
  // otherwise.
  const bool bf16_amx = bf16 && kernels::backward_bf16_amx_available();
  const bool bf16_dots = bf16 && kernels::backward_bf16_dots_available();
  const double peak = bf16_amx && c.peak_gflops <= 0
                          ? kernels::measure_amx_bf16_peak_gflops(c.threads)
                      : bf16_dots && c.peak_gflops <= 0
                          ? kernels::measure_bf16_dot_peak_gflops(c.threads)
                          : bench_peak.of_dtype();
  if (c.json) {
    char useful[64];
    std::snprintf(useful, sizeof useful, "\"useful_gflop\": %.4f, ", flops * 1e-9);
    print_json_header(c, bench_peak, "\"backward\": true, ", useful);
    print_json_timing("chosen", chosen, peak);
    std::printf(
        ",\n  \"forward_ms\": %.4f, \"forward_kernel\": \"%s\", "
        "\"backward_forward_ratio\": %.4f",
        fwd.ms, fwd.kernel.c_str(), chosen.ms / fwd.ms);
    if (bf16) {
      std::printf(",\n  \"bf16_dot_products\": %s, \"bf16_amx_tiles\": %s",
                  bf16_dots ? "true" : "false", bf16_amx ? "true" : "false");
    }
    if (f32_backward) {
      std::printf(",\n");
      print_json_timing("f32_backward", *f32_backward, fma_peak);
      std::printf(",\n  \"speedup_vs_f32_backward\": %.4f", f32_backward->ms / chosen.ms);
    }
    if (base) {
      std::printf(",\n");
      print_json_timing("baseline", *base, peak);
      std::printf(",\n  \"speedup_vs_baseline\": %.4f", base->ms / chosen.ms);
    }
    std::printf("\n}\n");
    return;
  }
  std::printf(
      "attention backward B=%lld H=%lld Hkv=%lld n=%lld nk=%lld d=%lld dv=%lld%s%s, %s, %d "
      "thread(s), SIMD %s\n",
      static_cast<long long>(c.batch), static_cast<long long>(c.heads),
      static_cast<long long>(c.kv_heads), static_cast<long long>(c.n), static_cast<long long>(c.nk),
      static_cast<long long>(c.d), static_cast<long long>(c.dv), c.causal ? " causal" : "",
      dropout_words(c).c_str(), c.dtype.c_str(), c.threads, kernels::simd_target_name().c_str());
  std::printf("useful work %.3f GFLOP (2.5x the forward's); %s peak %.1f GFLOP/s\n",
              flops * 1e-9,
              dtype == DType::kF64 ? "fp64 FMA"
              : bf16_amx           ? "AMX bf16 (tdpbf16ps)"
              : bf16_dots          ? "bf16 dot-product (vdpbf16ps)"
                                   : "fp32 FMA",
              peak);
  if (bf16) {
    std::printf("bf16 backward: %s\n",
                bf16_amx    ? "bf16 products on AMX tiles (QKV_BF16_AMX=0 turns them off)"
                : bf16_dots ? "bf16 dot products (vdpbf16ps)"
                : kernels::cpu_has_bf16_dots()
                    ? "float32 products on bf16-rounded operands (vdpbf16ps is half rate on an "
                      "AMX CPU; QKV_BF16_DOTS=1 forces it)"
                    : "float32 products on bf16-rounded operands (no vdpbf16ps here)");
  }
  print_timing_line("backward", chosen, peak);
  print_timing_line("forward", fwd, peak);
  std::printf("backward / forward time: %.2f\n", chosen.ms / fwd.ms);
  if (f32_backward) {
    print_timing_line("f32 bwd", *f32_backward, fma_peak);
    std::printf("speedup vs the float32 backward: %.2fx\n", f32_backward->ms / chosen.ms);
  } else if (!f32_note.empty()) {
    std::printf("float32 backward: not run (%s)\n", f32_note.c_str());
  }
  if (base) {
    print_timing_line("baseline", *base, peak);
    std::printf("speedup vs the unfused backward: %.2fx\n", base->ms / chosen.ms);
  } else if (!base_note.empty()) {
    std::printf("baseline: not run (%s)\n", base_note.c_str());
  }
  print_openblas_note("the baseline");
}

}  // namespace qkv::cli
