// What the parts of `qkv bench` share: its flags, and the clocks and counters it reads.
// command_bench.cc times attention() on given shapes (and --peak); bench_decode.cc times
// attention_cached() on a KV cache (--decode); bench_backward.cc attention_backward()
// (--backward); bench_layer.cc the multi-head layer and its backward (--layer). bench.cc holds
// the peak, JSON opening and text lines the last two print alike.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

#include "qkv/tensor.h"

namespace qkv::cli {

struct BenchCommand {
  std::int64_t n = 0, nk = 0, d = 0, dv = 0, heads = 0, kv_heads = 0, batch = 1;
  bool causal = false;
  int threads = 0;
  std::string kernel;
  bool json = false;
  bool peak_only = false;
  bool no_baseline = false;
  double peak_gflops = 0.0;
  int repeats = 0;
  int warmup = 1;
  // --decode and its own flags.
  bool decode = false;
  bool backward = false;  // --backward: time attention_backward (bench_backward.cc)
  double dropout = 0.0;   // --dropout P, --seed S: every timed call drops weights
  std::uint64_t seed = 0;
  bool layer = false;     // --layer: time the multi-head layer (bench_layer.cc)
  std::string dtype = "f32";
  std::string lengths;
  std::string mixed_lengths;
  std::int64_t page_rows = 256;
  double bandwidth_gbs = 0.0;
  std::string max_memory;                     // empty: the default budget
  const CLI::Option* batch_option = nullptr;  // to tell a given --batch from the default
};

// " dropout 0.1" for a bench line's shape, or empty.
inline std::string dropout_words(const BenchCommand& c) {
  if (c.dropout == 0.0) return {};
  char text[48];
  std::snprintf(text, sizeof text, " dropout %g", c.dropout);
  return text;
}

// Median process CPU time per run and the process's peak RSS, as every bench line reports them.
double process_cpu_ms();
double peak_rss_mib();

// One timed call, as every bench line reports it.
struct Timing {
  std::string kernel;  // the kernel that ran
  double ms = 0.0;     // median
  double min_ms = 0.0;
  double cpu_ms = 0.0;  // median process CPU time per run, all threads (robust to a busy host)
  int runs = 0;
  double gflops = 0.0;        // `flops` over the median time (0 when not given)
  double peak_rss_mib = 0.0;  // process peak RSS after these runs
};

// `warmup` untimed calls, then `repeats` timed ones (0: at least 3 and about a second, at most
// 50); `call` returns the name of the kernel that ran.
Timing time_calls(int repeats, int warmup, const std::function<std::string()>& call,
                  double flops = 0.0);

// "  "KEY": {"kernel": ..., "ms": ..., ...}" without a newline; fraction_of_peak against `peak`.
void print_json_timing(const char* key, const Timing& t, double peak);

// A tensor of `dtype` (f64, f32, bf16 or f16) holding a cheap deterministic pattern in [-1, 1),
// written straight in that type: a 16-bit run never holds a float32 copy of its inputs.
Tensor pattern_tensor(DType dtype, const Shape& shape, std::uint64_t seed, const char* name);

// The OpenBLAS variables some hosts export, which can make OpenBLAS pick slow kernels for the
// baselines; bench reports them but never unsets them itself.
bool openblas_env_set();

// The FMA peak a bench's GFLOP/s are measured against: --peak-gflops when given, else measured
// before the timed calls and (measure_again) after them, keeping the larger: on a shared host a
// measurement can only come out low. of_dtype() is the peak of the computation's type: float64
// FMAs at half the float32 rate.
class BenchPeak {
 public:
  BenchPeak(const BenchCommand& c, DType dtype);
  void measure_again();
  double fma() const { return fma_; }
  double of_dtype() const { return f64_ ? fma_ / 2 : fma_; }

 private:
  bool given_;
  bool f64_;
  int threads_;
  double fma_;
};

// Opens a bench's JSON object: "{", `lead` (the bench's own first fields, each followed by
// ", "), the shape flags (n, nk, d, dv, heads, kv_heads, batch, causal, dropout, threads), the
// dtype, both peaks, the SIMD target, `extra` (more fields, each followed by ", ") and
// openblas_env_set, then ",\n" for the timings that follow.
void print_json_header(const BenchCommand& c, const BenchPeak& peak, const std::string& lead,
                       const std::string& extra = "");

// One timed call as a text line: role, kernel, times, GFLOP/s and their share of `peak`, RSS.
void print_timing_line(const char* role, const Timing& t, double peak);

// A note that OpenBLAS's variables are set, which may slow `calls` ("the baseline"); nothing
// when they are not.
void print_openblas_note(const char* calls);

// qkv bench --decode.
void run_decode_bench(BenchCommand c);

// qkv bench --backward, on a command whose shape flags are checked and defaulted.
void run_backward_bench(const BenchCommand& c);

// qkv bench --layer [--backward], the same.
void run_layer_bench(const BenchCommand& c);

}  // namespace qkv::cli
