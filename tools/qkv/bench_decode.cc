// qkv bench --decode: times attention_cached() for one new query row per sequence against a KV
// cache, and sets the rate at which it reads K and V against the memory bandwidth measured in
// the same run (STREAM's triad on the same threads). A decode step reads every cached K/V
// element once and does 2 flops with each value (about 1 flop per byte of float32), so memory,
// not the FMA units, bounds it. When every sequence has one length it also times attention() on
// the same K/V gathered into float32 tensors, with qkv's unfused CBLAS kernel and with the fused
// one: what decoding costs without a cache-aware kernel.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "bench.h"
#include "core/memory_budget.h"
#include "core/parallel_for.h"
#include "decode_support.h"
#include "kernels/blas_threads.h"
#include "kernels/kernel.h"
#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/kv_cache.h"

namespace qkv::cli {
namespace {

// Log-uniform lengths in [lo, hi], one per sequence, from a fixed seed: the same on every run.
std::vector<std::int64_t> mixed_lengths(std::int64_t lo, std::int64_t hi, std::int64_t count) {
  UniformFloats random(7);
  std::vector<std::int64_t> lengths;
  const double log_lo = std::log(static_cast<double>(lo));
  const double log_hi = std::log(static_cast<double>(hi));
  for (std::int64_t i = 0; i < count; ++i) {
    const double x = std::exp(log_lo + random.next_unit() * (log_hi - log_lo));
    lengths.push_back(std::clamp(static_cast<std::int64_t>(std::llround(x)), lo, hi));
  }
  return lengths;
}

// What the run holds besides the STREAM triad (whose arrays are freed before the cache is
// filled): the pages of every sequence, q and the output, the append staging, and with
// --baseline's gathered float32 K/V (one length for all: [B, Hkv, Nk, D + Dv], plus one
// sequence's gather and the baselines' output). `lengths` holds each sequence's rows, or is
// empty for B sequences of `rows` rows each (checked before B lengths are held).
RunMemory bench_memory(const BenchCommand& c, const KVCache& cache,
                       const std::vector<std::int64_t>& lengths, std::int64_t rows) {
  RunMemory m;
  const bool one_length =
      lengths.empty() ||
      std::all_of(lengths.begin(), lengths.end(), [&](std::int64_t l) { return l == lengths[0]; });
  if (lengths.empty()) {
    m.cache = core::saturating_mul(sequence_cache_bytes(cache, rows),
                                   static_cast<std::uint64_t>(c.batch));
  } else {
    for (std::int64_t length : lengths) {
      m.cache = core::saturating_add(m.cache, sequence_cache_bytes(cache, length));
    }
    rows = lengths[0];
  }
  m.other = core::saturating_add(append_staging_bytes(cache.options()),
                                 core::saturating_mul(float32_bytes({c.batch, c.heads, c.d}), 2));
  m.other = core::saturating_add(m.other, float32_bytes({c.batch, c.heads, c.dv}));
  if (!c.no_baseline && one_length) {
    for (const std::uint64_t bytes :
         {float32_bytes({c.batch, c.kv_heads, rows, c.d + c.dv}),
          float32_bytes({c.kv_heads, rows, c.d + c.dv}), float32_bytes({c.batch, c.heads, c.dv})}) {
      m.other = core::saturating_add(m.other, bytes);
    }
  }
  return m;
}

// The sequence lengths the flags ask for; checks them (usage errors naming the flag), and
// before holding B of them, that B sequences of the shortest length fit the budget.
std::vector<std::int64_t> sequence_lengths(BenchCommand& c, const KVCache& cache,
                                           std::uint64_t budget) {
  const bool batch_given = c.batch_option != nullptr && c.batch_option->count() > 0;
  if (c.batch <= 0) usage_error("--batch", "must be >= 1, got " + std::to_string(c.batch));
  if (!c.lengths.empty()) {
    std::vector<std::int64_t> lengths = parse_int_list(c.lengths, "--lengths");
    const auto count = static_cast<std::int64_t>(lengths.size());
    if (batch_given && count != c.batch) {
      usage_error("--lengths", "has " + std::to_string(count) + " entries; --batch is " +
                                   std::to_string(c.batch) + " (one length per sequence)");
    }
    for (std::int64_t length : lengths) {
      if (length < 1)
        usage_error("--lengths", "every length must be >= 1, got '" + c.lengths + "'");
    }
    c.batch = count;
    return lengths;
  }
  if (!c.mixed_lengths.empty()) {
    const std::vector<std::int64_t> range = parse_int_list(c.mixed_lengths, "--mixed-lengths");
    if (range.size() != 2 || range[0] < 1 || range[1] < range[0]) {
      usage_error("--mixed-lengths",
                  "expected LO,HI with 1 <= LO <= HI, got '" + c.mixed_lengths + "'");
    }
    check_run_memory(bench_memory(c, cache, {}, range[0]), budget, "qkv bench --decode");
    return mixed_lengths(range[0], range[1], c.batch);
  }
  if (c.nk <= 0) {
    usage_error("--nk",
                "keys per sequence (> 0) are required with --decode, or --lengths or "
                "--mixed-lengths");
  }
  check_run_memory(bench_memory(c, cache, {}, c.nk), budget, "qkv bench --decode");
  return std::vector<std::int64_t>(static_cast<std::size_t>(c.batch), c.nk);
}

void check_decode_flags(BenchCommand& c) {
  if (c.heads <= 0) usage_error("--heads", "query heads (> 0) are required with --decode");
  if (c.d <= 0) usage_error("--d", "the head dimension (> 0) is required with --decode");
  if (c.kv_heads < 0) usage_error("--kv-heads", "must be >= 1");
  if (c.kv_heads == 0) c.kv_heads = c.heads;
  if (c.heads % c.kv_heads != 0) {
    usage_error("--kv-heads",
                std::to_string(c.kv_heads) + " does not divide --heads " + std::to_string(c.heads));
  }
  if (c.dv < 0) usage_error("--dv", "must be >= 1");
  if (c.dv == 0) c.dv = c.d;
  if (c.repeats < 0) usage_error("--repeats", "must be >= 0 (0: at least 3 and about 1 s)");
  if (c.warmup < 0) usage_error("--warmup", "must be >= 0");
  if (!c.kernel.empty() && c.kernel != "decode_hwy" && c.kernel != "decode_scalar" &&
      c.kernel != "reference") {
    usage_error("--kernel",
                "with --decode: decode_hwy, decode_scalar or reference, got '" + c.kernel + "'");
  }
  if (c.kernel == "decode_hwy" && kernels::simd_targets().empty()) {
    usage_error("--kernel", "decode_hwy is not in this build (portable, no SIMD)");
  }
}

struct Baseline {
  std::string label;   // the name printed and the JSON key's suffix
  std::string kernel;  // forced, or empty for the library's choice
  std::optional<Timing> timing;
  std::string note;  // why it did not run
};

void print_json_call(const Timing& t, const char* ratio_key, double ratio) {
  std::printf(
      "{\"kernel\": \"%s\", \"ms\": %.4f, \"min_ms\": %.4f, \"cpu_ms\": %.4f, \"runs\": %d, "
      "\"%s\": %.4f}",
      t.kernel.c_str(), t.ms, t.min_ms, t.cpu_ms, t.runs, ratio_key, ratio);
}

std::string json_escape(const std::string& text) {
  std::string out;
  for (char ch : text) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += (ch == '\n' || ch == '\r' || ch == '\t') ? ' ' : ch;
  }
  return out;
}

}  // namespace

void run_decode_bench(BenchCommand c) {
  check_decode_flags(c);
  const CacheStorage storage = cache_storage_flag(c.dtype, "--dtype");
  // Sizes are checked against the budget before the triad, a page or a tensor is allocated (an
  // impossible --nk must not run for minutes first); the cache's capacity is the budget too.
  const std::uint64_t budget = memory_budget(c.max_memory);
  KVCache cache(KVCacheOptions{c.kv_heads, c.d, c.dv, storage, c.page_rows, 0, budget});
  const std::vector<std::int64_t> lengths = sequence_lengths(c, cache, budget);
  const RunMemory memory = bench_memory(c, cache, lengths, 0);
  check_run_memory(memory, budget, "qkv bench --decode");
  const int threads = core::resolve_thread_count(c.threads);

  // The triad first, while its 384 MiB do not sit beside the cache.
  const bool triad_measured = c.bandwidth_gbs <= 0.0;
  const double triad = triad_measured ? kernels::measure_triad_gbs(threads) : c.bandwidth_gbs;

  std::vector<SequenceId> ids;
  UniformFloats kv_random(2);
  std::int64_t total_rows = 0;
  double kv_bytes = 0.0;
  for (std::int64_t length : lengths) {
    ids.push_back(cache.add_sequence());
    append_random_rows(cache, ids.back(), length, kv_random);
    total_rows += length;
    kv_bytes += kv_bytes_read(cache.options(), length);
  }
  Tensor q(DType::kF32, {c.batch, c.heads, 1, c.d}, "q");
  UniformFloats q_random(1);
  q_random.fill(q);

  AttentionOptions options;
  options.causal = true;  // one new row at the end of each sequence: it sees every cached row
  options.threads = threads;
  options.kernel = c.kernel;
  options.max_memory = budget_left(memory, budget);
  const Timing cached = time_calls(
      c.repeats, c.warmup, [&] { return attention_cached(q.view(), cache, ids, options).kernel; });
  const double gbs = kv_bytes / (cached.ms * 1e-3) * 1e-9;
  const double best_gbs = kv_bytes / (cached.min_ms * 1e-3) * 1e-9;

  // Same-run baselines on the gathered float32 K/V, when the sequences form one [B, ...] tensor.
  std::vector<Baseline> baselines;
  const bool one_length =
      std::all_of(lengths.begin(), lengths.end(), [&](std::int64_t l) { return l == lengths[0]; });
  if (!c.no_baseline) {
    // "plain": attention() on the same bytes as plain tensors, with the cached call's kernel
    // choice, as a PyTorch or NumPy user calls it.
    baselines.push_back({"plain", c.kernel, {}, ""});
    for (const char* kernel : {"unfused_blas", "fused_hwy"}) {
      baselines.push_back({kernel, kernel, {}, ""});
    }
    if (!one_length) {
      for (Baseline& b : baselines) b.note = "the sequences differ in length";
    } else {
      const std::int64_t nk = lengths[0];
      Tensor k(DType::kF32, {c.batch, c.kv_heads, nk, c.d}, "K");
      Tensor v(DType::kF32, {c.batch, c.kv_heads, nk, c.dv}, "V");
      for (std::size_t s = 0; s < ids.size(); ++s) {
        const Tensor ks = cache.gather(ids[s], false, DType::kF32);
        const Tensor vs = cache.gather(ids[s], true, DType::kF32);
        const auto at = static_cast<std::int64_t>(s);
        std::copy_n(ks.data_as<float>(), ks.numel(), k.data_as<float>() + at * ks.numel());
        std::copy_n(vs.data_as<float>(), vs.numel(), v.data_as<float>() + at * vs.numel());
      }
      Tensor out(DType::kF32, {c.batch, c.heads, 1, c.dv}, "out");
      const AttentionOutputs outputs{out.mutable_view(), std::nullopt, std::nullopt};
      for (Baseline& b : baselines) {
        AttentionOptions forced = options;
        forced.kernel = b.kernel;
        try {
          b.timing = time_calls(c.repeats, c.warmup, [&] {
            return attention_into(q.view(), k.view(), v.view(), forced, outputs);
          });
        } catch (const Error& e) {
          b.note = e.what();
        }
      }
    }
  }

  const std::string simd = kernels::simd_target_name();
  const std::string blas_core = kernels::blas_core_name();
  const bool blas_env = openblas_env_set();
  const double fraction = triad > 0 ? gbs / triad : 0.0;
  if (c.json) {
    std::printf(
        "{\n  \"decode\": true, \"batch\": %lld, \"heads\": %lld, \"kv_heads\": %lld, \"d\": %lld, "
        "\"dv\": %lld, \"dtype\": \"%s\", \"page_rows\": %lld, \"threads\": %d,\n  \"lengths\": [",
        static_cast<long long>(c.batch), static_cast<long long>(c.heads),
        static_cast<long long>(c.kv_heads), static_cast<long long>(c.d),
        static_cast<long long>(c.dv), cache_storage_name(storage),
        static_cast<long long>(c.page_rows), threads);
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      std::printf("%s%lld", i == 0 ? "" : ", ", static_cast<long long>(lengths[i]));
    }
    std::printf(
        "], \"total_rows\": %lld,\n  \"simd_target\": \"%s\", \"openblas_env_set\": %s, "
        "\"openblas_core\": \"%s\",\n  \"triad_gbs\": %.2f, \"triad_measured\": %s, "
        "\"kv_bytes_per_call\": %.0f, \"cache_bytes_in_use\": %llu,\n"
        "  \"cached\": {\"kernel\": \"%s\", \"ms\": %.4f, \"min_ms\": %.4f, \"cpu_ms\": %.4f, "
        "\"runs\": %d, \"gbs\": %.3f, \"best_gbs\": %.3f, \"fraction_of_triad\": %.4f}",
        static_cast<long long>(total_rows), simd.c_str(), blas_env ? "true" : "false",
        blas_core.c_str(), triad, triad_measured ? "true" : "false", kv_bytes,
        static_cast<unsigned long long>(cache.bytes_in_use()), cached.kernel.c_str(), cached.ms,
        cached.min_ms, cached.cpu_ms, cached.runs, gbs, best_gbs, fraction);
    for (const Baseline& b : baselines) {
      std::printf(",\n  \"baseline_%s\": ", b.label.c_str());
      if (b.timing) {
        print_json_call(*b.timing, "ratio_to_cached", b.timing->ms / cached.ms);
      } else {
        // The kernel that would have run: the forced one, or null for the library's choice.
        const std::string kernel = b.kernel.empty() ? "null" : "\"" + b.kernel + "\"";
        std::printf("{\"kernel\": %s, \"not_run\": \"%s\"}", kernel.c_str(),
                    json_escape(b.note).c_str());
      }
    }
    std::printf("\n}\n");
    return;
  }

  std::printf(
      "decode B=%lld H=%lld Hkv=%lld d=%lld dv=%lld, cache %s in pages of %lld rows, %d "
      "thread(s), SIMD %s\n",
      static_cast<long long>(c.batch), static_cast<long long>(c.heads),
      static_cast<long long>(c.kv_heads), static_cast<long long>(c.d), static_cast<long long>(c.dv),
      cache_storage_name(storage), static_cast<long long>(c.page_rows), threads, simd.c_str());
  const auto [shortest, longest] = std::minmax_element(lengths.begin(), lengths.end());
  if (one_length) {
    std::printf("lengths: %lld rows per sequence", static_cast<long long>(lengths[0]));
  } else {
    std::printf("lengths: %lld .. %lld rows", static_cast<long long>(*shortest),
                static_cast<long long>(*longest));
  }
  std::printf("; K/V read per call %.1f MiB; cache %.1f MiB in %lld pages\n",
              kv_bytes / (1024.0 * 1024.0),
              static_cast<double>(cache.bytes_in_use()) / (1024.0 * 1024.0),
              static_cast<long long>(cache.pages_in_use()));
  std::printf("memory bandwidth (STREAM triad) %.1f GB/s on %d thread(s)%s\n", triad, threads,
              triad_measured ? "" : " (given by --bandwidth-gbs)");
  std::printf(
      "cached    %-13s %10.3f ms (min %.3f, cpu %.3f, %d runs) %7.2f GB/s (best %.2f) %5.1f %% "
      "of triad\n",
      cached.kernel.c_str(), cached.ms, cached.min_ms, cached.cpu_ms, cached.runs, gbs, best_gbs,
      100.0 * fraction);
  for (const Baseline& b : baselines) {
    if (b.timing) {
      std::printf(
          "baseline  %-13s %10.3f ms (min %.3f, cpu %.3f, %d runs) %6.2fx the cached call\n",
          b.label.c_str(), b.timing->ms, b.timing->min_ms, b.timing->cpu_ms, b.timing->runs,
          b.timing->ms / cached.ms);
    } else {
      std::printf("baseline  %-13s not run (%s)\n", b.label.c_str(), b.note.c_str());
    }
  }
  if (!baselines.empty() && blas_env) {
    std::printf(
        "note: OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE are set; OpenBLAS may pick slow kernels "
        "for unfused_blas (run as env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE qkv bench ...)\n");
  }
}

}  // namespace qkv::cli
