// qkv bench --layer [--backward]: times the multi-head layer in-process, X [B, n, H·d] with
// W^Q [H·d, H·d], W^K [H·d, Hkv·d], W^V [H·d, Hkv·dv], W^O [H·dv, H·d] and their biases
// (self-attention; n query and key rows), on the same deterministic pattern as the other benches;
// --dropout P drops the heads' attention weights (the backward draws the same mask).
// With --backward it times multi_head_attention_backward from the forward's state (nothing
// computed twice) beside the forward in the same run. --kernel names the forward's kernel, or
// with --backward the backward's (as for bench --backward; the forward then runs the default).
//
// GFLOP/s count the projections' products (2·rows·in·out each) and the attention's useful flops
// (2·(d + dv) per allowed pair and head); the backward counts twice the projections (the two
// products of each weight's gradient and its input's) and 2.5x the attention, as FlashAttention
// counts its backward.
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "bench.h"
#include "cli_common.h"
#include "decode_support.h"
#include "kernels/kernel.h"
#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/layer.h"
#include "qkv/layer_backward.h"
#include "run_report.h"

namespace qkv::cli {

void run_layer_bench(const BenchCommand& c) {
  if (c.dtype != "f32" && c.dtype != "f64") {
    usage_error("--dtype", "--layer takes f32 or f64 (the layer computes in float32 or "
                           "float64), got '" + c.dtype + "'");
  }
  const DType dtype = c.dtype == "f64" ? DType::kF64 : DType::kF32;
  const std::int64_t width = c.heads * c.d;  // the model's width, X's columns
  const Tensor x = pattern_tensor(dtype, {c.batch, c.n, width}, 1, "X");
  const Tensor wq = pattern_tensor(dtype, {width, c.heads * c.d}, 2, "W^Q");
  const Tensor wk = pattern_tensor(dtype, {width, c.kv_heads * c.d}, 3, "W^K");
  const Tensor wv = pattern_tensor(dtype, {width, c.kv_heads * c.dv}, 4, "W^V");
  const Tensor wo = pattern_tensor(dtype, {c.heads * c.dv, width}, 5, "W^O");
  const Tensor bq = pattern_tensor(dtype, {c.heads * c.d}, 6, "b^Q");
  const Tensor bk = pattern_tensor(dtype, {c.kv_heads * c.d}, 7, "b^K");
  const Tensor bv = pattern_tensor(dtype, {c.kv_heads * c.dv}, 8, "b^V");
  const Tensor bo = pattern_tensor(dtype, {width}, 9, "b^O");
  const Tensor dy = pattern_tensor(dtype, {c.batch, c.n, width}, 10, "dY");
  LayerWeights weights{wq.view(), wk.view(), wv.view()};
  weights.wo = wo.view();
  weights.bq = bq.view();
  weights.bk = bk.view();
  weights.bv = bv.view();
  weights.bo = bo.view();
  LayerOptions options;
  options.heads = c.heads;
  options.kv_heads = c.kv_heads;
  options.attention.causal = c.causal;
  options.attention.threads = c.threads;
  options.attention.out_dtype = dtype;
  // Dropout in the heads' attention (forward and backward draw the same mask); counted as the
  // same useful work as without it.
  options.attention.dropout_p = c.dropout;
  options.attention.seed = c.seed;
  LayerOptions backward_options = options;
  (c.backward ? backward_options : options).attention.kernel = c.kernel;

  const double rows = static_cast<double>(c.batch * c.n);
  const double projections =
      2.0 * rows * static_cast<double>(width) *
      static_cast<double>(2 * c.heads * c.d + c.kv_heads * c.d + c.kv_heads * c.dv) +
      2.0 * rows * static_cast<double>(c.heads * c.dv) * static_cast<double>(width);
  const double attention = attention_flops({c.batch, c.heads, c.n, c.d},
                                           {c.batch, c.kv_heads, c.n, c.d},
                                           {c.batch, c.kv_heads, c.n, c.dv}, options.attention);
  const double forward_flops = projections + attention;
  const double backward_flops = 2.0 * projections + 2.5 * attention;
  BenchPeak bench_peak(c, dtype);  // measured now and again after the timed calls

  const Timing forward = time_calls(
      c.repeats, c.warmup,
      [&] { return multi_head_attention(x.view(), weights, options).kernel; }, forward_flops);
  Timing backward;
  if (c.backward) {
    LayerForwardState state;
    multi_head_attention(x.view(), weights, options, std::nullopt, state);
    backward = time_calls(
        c.repeats, c.warmup,
        [&] {
          return multi_head_attention_backward(x.view(), weights, backward_options, dy.view(),
                                               std::nullopt, &state)
              .kernel;
        },
        backward_flops);
  }
  bench_peak.measure_again();
  const double peak = bench_peak.of_dtype();
  if (c.json) {
    print_json_header(c, bench_peak,
                      std::string("\"layer\": true, \"backward\": ") +
                          (c.backward ? "true" : "false") + ", \"width\": " +
                          std::to_string(width) + ", ");
    print_json_timing("forward", forward, peak);
    if (c.backward) {
      std::printf(",\n");
      print_json_timing("backward", backward, peak);
      std::printf(",\n  \"backward_forward_ratio\": %.4f", backward.ms / forward.ms);
    }
    std::printf("\n}\n");
    return;
  }
  std::printf(
      "layer B=%lld n=%lld width=%lld H=%lld Hkv=%lld d=%lld dv=%lld%s%s, %s, %d thread(s), "
      "SIMD %s\n",
      static_cast<long long>(c.batch), static_cast<long long>(c.n),
      static_cast<long long>(width), static_cast<long long>(c.heads),
      static_cast<long long>(c.kv_heads), static_cast<long long>(c.d),
      static_cast<long long>(c.dv), c.causal ? " causal" : "", dropout_words(c).c_str(),
      c.dtype.c_str(), c.threads,
      kernels::simd_target_name().c_str());
  std::printf("useful work: forward %.3f GFLOP (projections %.3f)", forward_flops * 1e-9,
              projections * 1e-9);
  if (c.backward) std::printf(", backward %.3f GFLOP", backward_flops * 1e-9);
  std::printf("; %s FMA peak %.1f GFLOP/s\n", dtype == DType::kF64 ? "fp64" : "fp32", peak);
  print_timing_line("forward", forward, peak);
  if (c.backward) {
    print_timing_line("backward", backward, peak);
    std::printf("backward / forward time: %.2f\n", backward.ms / forward.ms);
  }
  print_openblas_note("the projections");
}

}  // namespace qkv::cli
