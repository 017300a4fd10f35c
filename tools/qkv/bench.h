// What the two halves of `qkv bench` share: its flags, and the clocks and counters it reads.
// command_bench.cc times attention() on given shapes (and --peak); bench_decode.cc times
// attention_cached() on a KV cache (--decode); bench_backward.cc attention_backward()
// (--backward); bench_layer.cc the multi-head layer and its backward (--layer).
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

// qkv bench --decode.
void run_decode_bench(BenchCommand c);

// qkv bench --backward, on a command whose shape flags are checked and defaulted.
void run_backward_bench(const BenchCommand& c);

// qkv bench --layer [--backward], the same.
void run_layer_bench(const BenchCommand& c);

}  // namespace qkv::cli
