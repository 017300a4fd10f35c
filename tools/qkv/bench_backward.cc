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

void run_backward_bench(const BenchCommand& c) {
  if (c.dtype != "f32" && c.dtype != "f64") {
    usage_error("--dtype",
                "--backward takes f32 or f64 (gradients are computed in float32 or "
                "float64), got '" +
                    c.dtype + "'");
  }
  const DType dtype = c.dtype == "f64" ? DType::kF64 : DType::kF32;
  const Tensor q = pattern_tensor(dtype, {c.batch, c.heads, c.n, c.d}, 1, "Q");
  const Tensor k = pattern_tensor(dtype, {c.batch, c.kv_heads, c.nk, c.d}, 2, "K");
  const Tensor v = pattern_tensor(dtype, {c.batch, c.kv_heads, c.nk, c.dv}, 3, "V");
  const Tensor dout = pattern_tensor(dtype, {c.batch, c.heads, c.n, c.dv}, 4, "dO");
  AttentionOptions options;
  options.causal = c.causal;
  options.threads = c.threads;
  options.return_lse = true;
  options.out_dtype = dtype;
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
  const double peak = bench_peak.of_dtype();
  if (c.json) {
    char useful[64];
    std::snprintf(useful, sizeof useful, "\"useful_gflop\": %.4f, ", flops * 1e-9);
    print_json_header(c, bench_peak, "\"backward\": true, ", useful);
    print_json_timing("chosen", chosen, peak);
    std::printf(
        ",\n  \"forward_ms\": %.4f, \"forward_kernel\": \"%s\", "
        "\"backward_forward_ratio\": %.4f",
        fwd.ms, fwd.kernel.c_str(), chosen.ms / fwd.ms);
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
  std::printf("useful work %.3f GFLOP (2.5x the forward's); %s FMA peak %.1f GFLOP/s\n",
              flops * 1e-9, dtype == DType::kF64 ? "fp64" : "fp32", peak);
  print_timing_line("backward", chosen, peak);
  print_timing_line("forward", fwd, peak);
  std::printf("backward / forward time: %.2f\n", chosen.ms / fwd.ms);
  if (base) {
    print_timing_line("baseline", *base, peak);
    std::printf("speedup vs the unfused backward: %.2fx\n", base->ms / chosen.ms);
  } else if (!base_note.empty()) {
    std::printf("baseline: not run (%s)\n", base_note.c_str());
  }
  print_openblas_note("the baseline");
}

}  // namespace qkv::cli
