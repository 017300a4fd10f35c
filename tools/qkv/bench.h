// What the two halves of `qkv bench` share: its flags, and the clocks and counters it reads.
// command_bench.cc times attention() on given shapes (and --peak); bench_decode.cc times
// attention_cached() on a KV cache (--decode).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

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
  std::string dtype = "f32";
  std::string lengths;
  std::string mixed_lengths;
  std::int64_t page_rows = 256;
  double bandwidth_gbs = 0.0;
  std::string max_memory;                     // empty: the default budget
  const CLI::Option* batch_option = nullptr;  // to tell a given --batch from the default
};

// Median process CPU time per run and the process's peak RSS, as every bench line reports them.
double process_cpu_ms();
double peak_rss_mib();

// The OpenBLAS variables some hosts export, which can make OpenBLAS pick slow kernels for the
// baselines; bench reports them but never unsets them itself.
bool openblas_env_set();

// qkv bench --decode.
void run_decode_bench(BenchCommand c);

// qkv bench --backward, on a command whose shape flags are checked and defaulted.
void run_backward_bench(const BenchCommand& c);

}  // namespace qkv::cli
