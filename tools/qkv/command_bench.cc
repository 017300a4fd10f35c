// qkv bench: times the attention call in-process, for the chosen kernel and for the unfused
// CBLAS baseline in the same run, on random inputs of a given shape.
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "bench.h"
#include "cli_common.h"
#include "commands.h"
#include "core/half.h"
#include "core/parallel_for.h"
#include "decode_support.h"
#include "kernels/blas_threads.h"
#include "kernels/kernel.h"
#include "qkv/attention.h"
#include "qkv/error.h"
#include "run_report.h"

namespace qkv::cli {

double process_cpu_ms() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) * 1e-6;
}

double peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

bool openblas_env_set() {
  return std::getenv("OPENBLAS_CORETYPE") != nullptr || std::getenv("OPENBLAS_L2_SIZE") != nullptr;
}

Tensor pattern_tensor(DType dtype, const Shape& shape, std::uint64_t seed, const char* name) {
  Tensor t(dtype, shape, name);
  std::uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const float x =
        static_cast<float>(static_cast<double>(state >> 40) / static_cast<double>(1ull << 24)) *
            2.0f -
        1.0f;
    if (dtype == DType::kF32) {
      t.data_as<float>()[i] = x;
    } else if (dtype == DType::kF64) {
      t.data_as<double>()[i] = static_cast<double>(x);
    } else {
      t.data_as<std::uint16_t>()[i] =
          dtype == DType::kBF16 ? core::float_to_bf16(x) : core::float_to_f16(x);
    }
  }
  return t;
}

Timing time_calls(int repeats, int warmup, const std::function<std::string()>& call, double flops) {
  Timing t;
  for (int w = 0; w < warmup; ++w) t.kernel = call();
  std::vector<double> ms, cpu;
  double total = 0.0;
  const int max_runs = repeats > 0 ? repeats : 50;
  while (static_cast<int>(ms.size()) < max_runs &&
         (repeats > 0 || ms.size() < 3 || total < 1000.0)) {
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
  t.gflops = flops > 0.0 ? flops / (t.ms * 1e-3) * 1e-9 : 0.0;
  t.peak_rss_mib = peak_rss_mib();
  return t;
}

void print_json_timing(const char* key, const Timing& t, double peak) {
  std::printf(
      "  \"%s\": {\"kernel\": \"%s\", \"ms\": %.4f, \"min_ms\": %.4f, \"cpu_ms\": %.4f, "
      "\"runs\": %d, \"gflops\": %.2f, \"fraction_of_peak\": %.4f, \"peak_rss_mib\": %.1f}",
      key, t.kernel.c_str(), t.ms, t.min_ms, t.cpu_ms, t.runs, t.gflops,
      peak > 0 ? t.gflops / peak : 0.0, t.peak_rss_mib);
}

namespace {

// --dtype of a prefill bench: the storage of Q, K, V and the computation's type.
DType prefill_dtype(const std::string& name) {
  if (name == "f32") return DType::kF32;
  if (name == "f64") return DType::kF64;
  if (name == "bf16") return DType::kBF16;
  if (name == "f16") return DType::kF16;
  usage_error("--dtype", "expected f64, f32, bf16 or f16 without --decode, got '" + name + "'");
}

// The useful flops: 2·(d + dv) per allowed (query, key) pair and head, counted as -v counts
// them (run_report.h).
double useful_flops(const BenchCommand& c) {
  AttentionOptions options;
  options.causal = c.causal;
  return attention_flops({c.batch, c.heads, c.n, c.d}, {c.batch, c.kv_heads, c.nk, c.d},
                         {c.batch, c.kv_heads, c.nk, c.dv}, options);
}

Timing time_kernel(const BenchCommand& c, const TensorView& q, const TensorView& k,
                   const TensorView& v, const std::string& kernel, double flops) {
  AttentionOptions options;
  options.dtype = q.dtype;  // the inputs' own storage type: no rounding
  options.causal = c.causal;
  options.threads = c.threads;
  options.kernel = kernel;
  options.dropout_p = c.dropout;
  options.seed = c.seed;
  // A float64 call writes a float64 output (its accuracy is the point); every other a float32 one.
  Tensor out(q.dtype == DType::kF64 ? DType::kF64 : DType::kF32, {c.batch, c.heads, c.n, c.dv},
             "out");
  const AttentionOutputs outputs{out.mutable_view(), std::nullopt, std::nullopt};
  return time_calls(
      c.repeats, c.warmup, [&] { return attention_into(q, k, v, options, outputs); }, flops);
}

// OpenBLAS 0.3.21 runs its SSE3 "Prescott" kernels on x86 CPUs newer than it knows (seen here
// on a Xeon of family 6, model 207): a baseline several times slower than OpenBLAS can be.
bool blas_core_is_fallback(const std::string& core) { return core == "Prescott"; }

void run_bench(BenchCommand c) {
  const int threads = core::resolve_thread_count(c.threads);
  c.threads = threads;
  if (c.peak_only) {
    const double peak = kernels::measure_fma_peak_gflops(threads);
    const double bf16_peak = kernels::measure_bf16_dot_peak_gflops(threads);
    const double bf16_l1_fed = kernels::measure_bf16_from_l1_gflops(threads);
    const double amx_peak = kernels::measure_amx_bf16_peak_gflops(threads);
    const double l1_fed = kernels::measure_fma_from_l1_gflops(threads);
    const double share = peak > 0 ? 100.0 * l1_fed / peak : 0.0;
    const double triad = kernels::measure_triad_gbs(threads);
    if (c.json) {
      std::printf(
          "{\"threads\": %d, \"simd_target\": \"%s\", \"peak_gflops\": %.2f, "
          "\"bf16_dot_peak_gflops\": %.2f, \"l1_fed_gflops\": %.2f, \"bf16_l1_fed_gflops\": %.2f, "
          "\"amx_bf16_peak_gflops\": %.2f, \"triad_gbs\": %.2f, \"openblas_core\": \"%s\"}\n",
          threads, kernels::simd_target_name().c_str(), peak, bf16_peak, l1_fed, bf16_l1_fed,
          amx_peak, triad, kernels::blas_core_name().c_str());
    } else {
      std::printf("fp32 FMA peak: %.1f GFLOP/s on %d thread(s) (%s)\n", peak, threads,
                  kernels::simd_target_name().c_str());
      if (bf16_peak > 0) {
        std::printf(
            "bf16 dot-product peak (vdpbf16ps, 64 flops per 512-bit instruction): %.1f GFLOP/s "
            "(%.2fx the FMA peak)\n",
            bf16_peak, peak > 0 ? bf16_peak / peak : 0.0);
        std::printf(
            "vdpbf16ps fed from L1 as in the bf16 micro-kernels: %.1f GFLOP/s (%.1f %% of the bf16 "
            "peak)\n",
            bf16_l1_fed, 100.0 * bf16_l1_fed / bf16_peak);
      } else {
        std::printf("bf16 dot-product peak: none (no AVX512-BF16 on this CPU)\n");
      }
      if (amx_peak > 0) {
        std::printf(
            "AMX bf16 peak (tdpbf16ps, 16384 flops per tile instruction): %.1f GFLOP/s (%.2fx the "
            "FMA peak)\n",
            amx_peak, peak > 0 ? amx_peak / peak : 0.0);
      }
      std::printf(
          "FMAs fed from L1 as in the fused micro-kernels: %.1f GFLOP/s (%.1f %% of the peak, "
          "the ceiling of those micro-kernels)\n",
          l1_fed, share);
      std::printf(
          "memory bandwidth (STREAM triad, 3 x 128 MiB, 12 bytes per element): %.1f GB/s on %d "
          "thread(s), the ceiling of decoding from a KV cache\n",
          triad, threads);
    }
    return;
  }
  if (c.decode) {
    run_decode_bench(c);
    return;
  }
  // Required but with --peak (--decode checks its own), so CLI11 cannot check them; the parser
  // took only values >= 1.
  if (c.n <= 0) {
    throw CLI::RequiredError("--n is required, unless --peak or --decode",
                             CLI::ExitCodes::RequiredError);
  }
  if (c.d <= 0) {
    throw CLI::RequiredError("--d is required, unless --peak", CLI::ExitCodes::RequiredError);
  }
  if (c.heads <= 0) {
    throw CLI::RequiredError("--heads is required, unless --peak", CLI::ExitCodes::RequiredError);
  }
  if (c.nk <= 0) c.nk = c.n;
  if (c.dv <= 0) c.dv = c.d;
  if (c.kv_heads <= 0) c.kv_heads = c.heads;
  if (c.heads % c.kv_heads != 0) {
    usage_error("--kv-heads",
                std::to_string(c.kv_heads) + " does not divide --heads " + std::to_string(c.heads));
  }

  if (c.layer) {
    run_layer_bench(c);
    return;
  }
  if (c.backward) {
    run_backward_bench(c);
    return;
  }
  const DType dtype = prefill_dtype(c.dtype);
  const Shape q_shape{c.batch, c.heads, c.n, c.d};
  const Shape k_shape{c.batch, c.kv_heads, c.nk, c.d};
  const Shape v_shape{c.batch, c.kv_heads, c.nk, c.dv};
  const Tensor q = pattern_tensor(dtype, q_shape, 1, "Q");
  const Tensor k = pattern_tensor(dtype, k_shape, 2, "K");
  const Tensor v = pattern_tensor(dtype, v_shape, 3, "V");
  const double input_output_mib =
      static_cast<double>(q.nbytes() + k.nbytes() + v.nbytes() +
                          static_cast<std::size_t>(c.batch * c.heads * c.n * c.dv) * 4) /
      (1024.0 * 1024.0);
  const double flops = useful_flops(c);
  // The peaks are measured before the timed calls and again after them, keeping the larger: on
  // a shared host a measurement can only come out low (a fraction of peak above 1 was seen).
  double fma_peak = c.peak_gflops > 0 ? c.peak_gflops : kernels::measure_fma_peak_gflops(threads);
  // The relevant peak: the AMX peak or the bf16 dot-product peak for the bf16 paths, the fp64
  // FMA peak (half the fp32 one: the same FMAs on half as many lanes) for float64, the FMA peak
  // otherwise.
  const std::string path = kernels::fused_hwy_path(dtype, c.d);
  const bool bf16_amx = dtype == DType::kBF16 && kernels::fused_bf16_amx_available(c.d);
  const bool bf16_dots =
      dtype == DType::kBF16 && !bf16_amx && kernels::fused_bf16_dots_available();
  const bool f64 = dtype == DType::kF64;
  const auto relevant_peak = [&] {
    return bf16_amx    ? kernels::measure_amx_bf16_peak_gflops(threads)
           : bf16_dots ? kernels::measure_bf16_dot_peak_gflops(threads)
           : f64       ? fma_peak / 2
                       : fma_peak;
  };
  double peak = relevant_peak();
  const char* peak_name = bf16_amx ? "AMX bf16" : bf16_dots ? "bf16 dot" : f64 ? "fp64 FMA" : "FMA";

  if (const char* verbose = std::getenv("QKV_VERBOSE"); verbose != nullptr && verbose[0] == '1') {
    AttentionOptions options;
    options.causal = c.causal;
    options.threads = c.threads;
    options.kernel = c.kernel;
    options.dtype = dtype;
    options.dropout_p = c.dropout;
    options.seed = c.seed;
    std::fprintf(stderr, "%s",
                 explain_kernel_choice(q.view(), k.view(), v.view(), options).c_str());
  }
  const Timing main = time_kernel(c, q.view(), k.view(), v.view(), c.kernel, flops);
  // A 16-bit run against the float32 fused kernel on float32 copies of the same inputs, timed
  // after the run above so that its peak RSS holds no float32 copy.
  std::optional<Timing> f32_fused;
  std::string f32_note;
  if (!c.no_baseline && dtype != DType::kF32) {
    try {
      const Tensor q32 = contiguous_copy(q.view(), DType::kF32);
      const Tensor k32 = contiguous_copy(k.view(), DType::kF32);
      const Tensor v32 = contiguous_copy(v.view(), DType::kF32);
      f32_fused = time_kernel(c, q32.view(), k32.view(), v32.view(), "fused_hwy", flops);
    } catch (const Error& e) {
      f32_note = e.what();
    }
  }
  // A float64 run against the float64 reference (row by row, one thread per row block): the
  // fused kernel's float64 path must beat it by 10x; unfused_blas computes in float32 only.
  std::optional<Timing> reference;
  std::string reference_note;
  if (!c.no_baseline && f64 && main.kernel != "reference") {
    try {
      reference = time_kernel(c, q.view(), k.view(), v.view(), "reference", flops);
    } catch (const Error& e) {
      reference_note = e.what();
    }
  }
  std::optional<Timing> base;
  std::string base_note;
  // unfused_blas draws no dropout: no baseline then.
  if (!c.no_baseline && !f64 && main.kernel != "unfused_blas" && c.dropout == 0.0) {
    try {
      base = time_kernel(c, q.view(), k.view(), v.view(), "unfused_blas", flops);
    } catch (const Error& e) {
      base_note = e.what();
    }
  }
  if (c.peak_gflops <= 0) {
    fma_peak = std::max(fma_peak, kernels::measure_fma_peak_gflops(threads));
    peak = std::max(peak, relevant_peak());
  }
  const bool blas_env = openblas_env_set();
  const std::string blas_core = kernels::blas_core_name();

  if (c.json) {
    std::printf(
        "{\n  \"n\": %lld, \"nk\": %lld, \"d\": %lld, \"dv\": %lld, \"heads\": %lld, "
        "\"kv_heads\": %lld, \"batch\": %lld, \"causal\": %s, \"dropout\": %g, \"threads\": %d,\n"
        "  \"dtype\": \"%s\", \"path\": \"%s\", \"fma_peak_gflops\": %.2f,\n"
        "  \"simd_target\": \"%s\", \"peak_gflops\": %.2f, \"useful_gflop\": %.4f, "
        "\"inputs_outputs_mib\": %.1f, \"openblas_env_set\": %s, \"openblas_core\": \"%s\",\n",
        static_cast<long long>(c.n), static_cast<long long>(c.nk), static_cast<long long>(c.d),
        static_cast<long long>(c.dv), static_cast<long long>(c.heads),
        static_cast<long long>(c.kv_heads), static_cast<long long>(c.batch),
        c.causal ? "true" : "false", c.dropout, threads, c.dtype.c_str(), path.c_str(), fma_peak,
        kernels::simd_target_name().c_str(), peak, flops * 1e-9, input_output_mib,
        blas_env ? "true" : "false", blas_core.c_str());
    print_json_timing("chosen", main, peak);
    if (f32_fused) {
      std::printf(",\n");
      print_json_timing("f32_fused", *f32_fused, fma_peak);
      std::printf(",\n  \"speedup_vs_f32_fused\": %.4f", f32_fused->ms / main.ms);
    }
    if (reference) {
      std::printf(",\n");
      print_json_timing("reference", *reference, peak);
      std::printf(",\n  \"speedup_vs_reference\": %.4f", reference->ms / main.ms);
    }
    if (base) {
      std::printf(",\n");
      print_json_timing("baseline", *base, peak);
      std::printf(",\n  \"speedup_vs_baseline\": %.4f\n}\n", base->ms / main.ms);
    } else {
      std::printf("\n}\n");
    }
    return;
  }
  std::printf(
      "attention B=%lld H=%lld Hkv=%lld n=%lld nk=%lld d=%lld dv=%lld%s%s, %d thread(s), "
      "SIMD %s\n",
      static_cast<long long>(c.batch), static_cast<long long>(c.heads),
      static_cast<long long>(c.kv_heads), static_cast<long long>(c.n), static_cast<long long>(c.nk),
      static_cast<long long>(c.d), static_cast<long long>(c.dv), c.causal ? " causal" : "",
      dropout_words(c).c_str(), threads, kernels::simd_target_name().c_str());
  std::printf("useful work %.3f GFLOP; fp32 FMA peak %.1f GFLOP/s; inputs+output %.1f MiB\n",
              flops * 1e-9, fma_peak, input_output_mib);
  if (bf16_dots) std::printf("bf16 dot-product peak %.1f GFLOP/s\n", peak);
  if (f64) std::printf("fp64 FMA peak %.1f GFLOP/s (half the fp32 one)\n", peak);
  std::printf("Q, K, V stored and computed as %s; fused_hwy path: %s\n", c.dtype.c_str(),
              path.c_str());
  auto line = [&](const char* role, const Timing& t, double of_peak, const char* of_name) {
    std::printf(
        "%-9s %-13s %10.3f ms (min %.3f, cpu %.3f, %d runs) %8.1f GFLOP/s %5.1f %% of %s peak  "
        "peak RSS %.0f MiB\n",
        role, t.kernel.c_str(), t.ms, t.min_ms, t.cpu_ms, t.runs, t.gflops,
        of_peak > 0 ? 100.0 * t.gflops / of_peak : 0.0, of_name, t.peak_rss_mib);
  };
  line("chosen", main, peak, peak_name);
  if (f32_fused) {
    line("f32 fused", *f32_fused, fma_peak, "FMA");
    if (f64) {
      std::printf("float64 / float32 fused GFLOP/s: %.2fx (target >= 0.4)\n",
                  f32_fused->ms / main.ms);
    } else {
      std::printf("speedup vs the float32 fused kernel: %.2fx\n", f32_fused->ms / main.ms);
    }
  } else if (!f32_note.empty()) {
    std::printf("float32 fused kernel: not run (%s)\n", f32_note.c_str());
  }
  if (reference) {
    line("reference", *reference, peak, peak_name);
    std::printf("float64 fused / reference GFLOP/s: %.1fx (target >= 10)\n",
                reference->ms / main.ms);
  } else if (!reference_note.empty()) {
    std::printf("reference: not run (%s)\n", reference_note.c_str());
  }
  if (base) {
    line("baseline", *base, fma_peak, "FMA");
    std::printf("speedup vs baseline: %.2fx\n", base->ms / main.ms);
  } else if (!base_note.empty()) {
    std::printf("baseline: not run (%s)\n", base_note.c_str());
  }
  if (base && !blas_core.empty())
    std::printf("baseline's OpenBLAS kernels: %s\n", blas_core.c_str());
  if (base && blas_core_is_fallback(blas_core)) {
    std::printf(
        "note: that is OpenBLAS's SSE3 fallback for a CPU it does not know; "
        "OPENBLAS_CORETYPE=SkylakeX (AVX-512) or Haswell (AVX2) picks its fast kernels "
        "(bench/run_grid.sh does so)\n");
  }
  if (blas_env) {
    std::printf(
        "note: OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE are set; OpenBLAS may pick slow kernels "
        "for the baseline (bench/run_grid.sh unsets them)\n");
  }
}

}  // namespace

void register_bench_command(CLI::App& app) {
  auto command = std::make_shared<BenchCommand>();
  CLI::App* sub = app.add_subcommand(
      "bench", "time attention in-process: the chosen kernel against the unfused CBLAS baseline");
  CLI::Option* n_option =
      sub->add_option("--n", command->n,
                      "query rows (and key rows unless --nk); REQUIRED but with --peak or --decode")
          ->check(at_least(1));
  CLI::Option* nk_option =
      sub->add_option("--nk", command->nk, "key rows (default n); with --decode: keys per sequence")
          ->check(at_least(0));
  sub->add_option("--d", command->d, "head dimension of Q and K; REQUIRED but with --peak")
      ->check(at_least(1));
  sub->add_option("--dv", command->dv, "head dimension of V (default d)")->check(at_least(1));
  sub->add_option("--heads", command->heads, "query heads H; REQUIRED but with --peak")
      ->check(at_least(1));
  sub->add_option("--kv-heads", command->kv_heads, "key/value heads (default H)")
      ->check(at_least(1));
  command->batch_option =
      sub->add_option("--batch", command->batch, "batch size B (default 1)")->check(at_least(1));
  CLI::Option* causal_option =
      sub->add_flag("--causal", command->causal, "bottom-right causal mask");
  add_threads_option(*sub, command->threads, "threads (default: one per hardware thread)");
  sub->add_option("--kernel", command->kernel,
                  "force a kernel (default: the library's choice); with --decode: decode_hwy, "
                  "decode_scalar or reference");
  sub->add_option("--repeats", command->repeats, "timed runs (default: >= 3 and ~1 s)")
      ->check(at_least(0));
  sub->add_option("--warmup", command->warmup, "untimed runs first (default 1)")
      ->check(at_least(0));
  CLI::Option* peak_gflops_option =
      sub->add_option("--peak-gflops", command->peak_gflops, "use this peak instead of measuring");
  sub->add_flag("--no-baseline", command->no_baseline, "skip the baselines");
  sub->add_flag("--json", command->json, "print one JSON object");
  CLI::Option* peak_option = sub->add_flag(
      "--peak", command->peak_only,
      "only measure the fp32 FMA peak, the fused micro-kernels' ceiling and the memory "
      "bandwidth (STREAM triad)");
  CLI::Option* decode_option = sub->add_flag(
      "--decode", command->decode,
      "time attention_cached: one query row per sequence against a KV cache of --nk rows (or "
      "--lengths, --mixed-lengths), against the memory bandwidth");
  sub->add_flag("--backward", command->backward,
                "time attention_backward: the chosen backward kernel against the unfused CBLAS "
                "backward and the forward (GFLOP/s: 2.5x the forward's useful flops); with "
                "--layer: the layer's backward")
      ->excludes(decode_option)
      ->excludes(peak_option);
  sub->add_flag("--layer", command->layer,
                "time the multi-head layer: X [B, n, H·d], W^Q, W^K, W^V, W^O and biases "
                "(self-attention); with --backward its backward too, from the forward's state")
      ->excludes(decode_option)
      ->excludes(peak_option)
      ->excludes(nk_option);
  add_dropout_flags(*sub, command->dropout, command->seed, nullptr);
  sub->get_option("--dropout")->excludes(decode_option)->excludes(peak_option);
  decode_option->excludes(n_option)
      ->excludes(causal_option)
      ->excludes(peak_option)
      ->excludes(peak_gflops_option);
  sub->add_option("--dtype", command->dtype,
                  "Q, K and V stored and computed as f64, f32, bf16 or f16 (default f32; f64, "
                  "bf16 and f16 are also timed against the float32 fused kernel, f64 also "
                  "against the float64 reference); with --backward f32, f64 or bf16 (bf16 also "
                  "timed against the float32 backward); with --decode: the cache's storage, "
                  "f32, bf16, f16 or int8");
  CLI::Option* lengths_option =
      sub->add_option("--lengths", command->lengths,
                      "with --decode: L1,L2,... rows of each sequence (B entries; B defaults to "
                      "their count)")
          ->needs(decode_option)
          ->excludes(nk_option);
  sub->add_option("--mixed-lengths", command->mixed_lengths,
                  "with --decode: LO,HI: B lengths drawn log-uniform in [LO, HI] (deterministic)")
      ->needs(decode_option)
      ->excludes(nk_option)
      ->excludes(lengths_option);
  sub->add_option("--page-rows", command->page_rows,
                  "with --decode: rows per cache page (default 256)")
      ->check(at_least(1))
      ->needs(decode_option);
  sub->add_option("--bandwidth-gbs", command->bandwidth_gbs,
                  "with --decode: use this memory bandwidth (GB/s) instead of measuring the triad")
      ->check(positive_number())
      ->needs(decode_option);
  add_max_memory_option(*sub, command->max_memory, "with --decode: ")->needs(decode_option);
  sub->footer(
      "Examples:\n"
      "  qkv bench --n 4096 --d 64 --heads 8 --causal --threads 2\n"
      "  qkv bench --decode --nk 32768 --heads 8 --d 128 --dtype bf16 --threads 2\n"
      "  qkv bench --n 4096 --d 64 --heads 8 --dtype bf16 --threads 2\n"
      "  qkv bench --n 1024 --d 64 --heads 8 --dtype f64 --threads 2\n"
      "  qkv bench --peak --threads 2\n"
      "  qkv bench --backward --n 2048 --d 64 --heads 8 --threads 2\n"
      "  qkv bench --backward --n 2048 --d 128 --heads 8 --dtype bf16 --threads 2\n"
      "  qkv bench --layer --backward --n 1024 --d 64 --heads 8 --threads 2\n"
      "GFLOP/s count the useful work 2·(d+dv) per allowed (query, key) pair and head.\n"
      "--decode counts the K/V bytes one call must read: rows · Hkv · (d + dv) values of the\n"
      "storage type (int8: plus a 4-byte scale per 32 values), and compares the rate with the\n"
      "STREAM triad measured in the same run on the same threads (12 bytes per element). With\n"
      "one length for every sequence it also times attention() on the same K/V gathered as\n"
      "float32, with unfused_blas and fused_hwy (--no-baseline skips them).\n"
      "Some hosts export OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE, which can make OpenBLAS pick\n"
      "slow kernels for the baselines; bench leaves them alone, so run benchmarks as\n"
      "  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE qkv bench ...");
  sub->callback([command] { run_bench(*command); });
}

}  // namespace qkv::cli
