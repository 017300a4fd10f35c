// qkv decode: a generation loop on random data, to see what decoding from a KV cache costs and
// that it is right. B sequences are prefilled with --prompt rows; then each of --tokens steps
// appends one new K/V row to every sequence and attends one new query row per sequence to its
// cache (causal, optionally a sliding window whose older pages are freed), as a decoder does.
//
// --check recomputes every step with the float64 reference on each sequence's rows gathered from
// the cache (dequantised exactly, so the reference sees the very values the kernel reads: the
// storage rounding of bf16, f16 and int8 cancels, and what remains is the decode kernel's float32
// arithmetic). Each softmax weight exp(s - m) / l then carries a relative error of a few u (u =
// 2^-24, float32's unit roundoff) times (1 + |s|), and the output, a convex combination of V rows
// summed in float32 over chunks merged by rescaling, a few u · (1 + max|s|) · max|V|. With q, K
// and V uniform in [-1, 1) and q·k scaled by 1/sqrt(d), scores have a standard deviation of 1/3
// whatever d, so max|s| stays near 2 even over 10^6 keys. Measured: 4e-8 .. 1e-7 · max|V| (d 16
// to 1024, 5 to 200000 keys, every storage type). kCheckTolerance = 1e-5 · max|V| (about 170 u)
// sits a hundred times above that and far below what a real fault gives (a wrong row, page or
// int8 scale moves the output by 1e-3 .. 1).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli_common.h"
#include "commands.h"
#include "core/memory_budget.h"
#include "core/parallel_for.h"
#include "decode_support.h"
#include "kernels/kernel.h"
#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/kv_cache.h"
#include "run_report.h"

namespace qkv::cli {
namespace {

constexpr double kCheckTolerance = 1e-5;  // of max|V|; see the comment at the top

struct DecodeCommand {
  std::int64_t prompt = 0, tokens = 64, heads = 8, kv_heads = 0, d = 64, dv = 0, batch = 1;
  std::int64_t page_rows = 256, window = 0;
  std::string dtype = "f32";
  int threads = 0;
  std::int64_t seed = 1;
  bool check = false;
  bool json = false;
  bool quiet = false;
  std::string kernel;
  std::string max_memory;
};

// Row b of a contiguous [B, ...] tensor, as a view of rank one less.
TensorView slice(const Tensor& t, std::int64_t b) {
  TensorView view = t.view();
  const std::int64_t stride = view.strides[0];
  view.data = static_cast<const std::byte*>(view.data) +
              b * stride * static_cast<std::int64_t>(dtype_size(view.dtype));
  view.shape.erase(view.shape.begin());
  view.strides.erase(view.strides.begin());
  return view;
}

void check_flags(DecodeCommand& c) {
  if (c.kv_heads == 0) c.kv_heads = c.heads;
  if (c.heads % c.kv_heads != 0) {
    usage_error("--kv-heads",
                std::to_string(c.kv_heads) + " does not divide --heads " + std::to_string(c.heads));
  }
  if (c.dv == 0) c.dv = c.d;
  if (c.prompt > std::numeric_limits<std::int64_t>::max() - c.tokens) {
    usage_error("--prompt", "--prompt " + std::to_string(c.prompt) + " + --tokens " +
                                std::to_string(c.tokens) + " rows per sequence pass 2^63 - 1");
  }
  if (!c.kernel.empty() && c.kernel != "decode_hwy" && c.kernel != "decode_scalar" &&
      c.kernel != "reference") {
    usage_error("--kernel", "decode_hwy, decode_scalar or reference, got '" + c.kernel + "'");
  }
  if (c.kernel == "decode_hwy" && kernels::simd_targets().empty()) {
    usage_error("--kernel", "decode_hwy is not in this build (portable, no SIMD)");
  }
}

// The most rows one sequence's pages span: the prompt and every token; with a window, once
// the prompt and the first token are in, at most window + page_rows (forget_before frees whole
// pages only, so up to a page more than the window stays).
std::int64_t peak_rows(const DecodeCommand& c) {
  const std::int64_t total = c.prompt + c.tokens;  // check_flags: no overflow
  if (c.window == 0) return total;
  const std::int64_t first = c.prompt + (c.tokens > 0 ? 1 : 0);
  const std::int64_t kept = c.window > std::numeric_limits<std::int64_t>::max() - c.page_rows
                                ? std::numeric_limits<std::int64_t>::max()
                                : c.window + c.page_rows;
  return std::min(total, std::max(first, kept));
}

// What the run holds at its peak, from the flags alone: the pages of B sequences, the step's
// q, k, v and output, the append staging, and --check's float64 gathers of one sequence.
RunMemory decode_memory(const DecodeCommand& c, const KVCache& cache) {
  const std::int64_t rows = peak_rows(c);
  RunMemory m;
  m.cache =
      core::saturating_mul(sequence_cache_bytes(cache, rows), static_cast<std::uint64_t>(c.batch));
  m.other = append_staging_bytes(cache.options());
  for (const std::uint64_t bytes :
       {float32_bytes({c.batch, c.heads, c.d}), float32_bytes({c.batch, c.kv_heads, c.d + c.dv}),
        float32_bytes({c.batch, c.heads, c.dv})}) {
    m.other = core::saturating_add(m.other, bytes);
  }
  if (c.check) {  // float64: twice a float32 tensor of the gathered rows
    m.other = core::saturating_add(
        m.other, core::saturating_mul(float32_bytes({c.kv_heads, rows, c.d + c.dv}), 2));
  }
  return m;
}

struct CheckState {
  double max_abs_error = 0.0;
  double max_abs_v = 0.0;
};

// The step's result for every sequence against attention() with the float64 reference on the
// sequence's gathered rows.
void check_step(const Tensor& q, const Tensor& out, const KVCache& cache,
                const std::vector<SequenceId>& ids, const AttentionOptions& options,
                CheckState& state) {
  AttentionOptions ref_options = options;
  ref_options.kernel = "reference";
  ref_options.out_dtype = DType::kF64;
  for (std::size_t s = 0; s < ids.size(); ++s) {
    const Tensor k = cache.gather(ids[s], false, DType::kF64);
    const Tensor v = cache.gather(ids[s], true, DType::kF64);
    const auto b = static_cast<std::int64_t>(s);
    const AttentionResult ref = attention(slice(q, b), k.view(), v.view(), ref_options);
    const double* expected = ref.out.data_as<double>();
    const float* got = out.data_as<float>() + b * ref.out.numel();
    for (std::int64_t i = 0; i < ref.out.numel(); ++i) {
      state.max_abs_error =
          std::max(state.max_abs_error, std::abs(static_cast<double>(got[i]) - expected[i]));
    }
    const double* values = v.data_as<double>();
    for (std::int64_t i = 0; i < v.numel(); ++i) {
      state.max_abs_v = std::max(state.max_abs_v, std::abs(values[i]));
    }
  }
}

void run_decode(DecodeCommand c) {
  check_flags(c);
  const CacheStorage storage = cache_storage_flag(c.dtype, "--dtype");
  const int threads = core::resolve_thread_count(c.threads);

  // Sizes are checked against the budget before a page or tensor is allocated (an impossible
  // --prompt must not run for minutes first); the cache's capacity is the budget as well.
  const std::uint64_t budget = memory_budget(c.max_memory);
  KVCache cache(KVCacheOptions{c.kv_heads, c.d, c.dv, storage, c.page_rows, 0, budget});
  const RunMemory memory = decode_memory(c, cache);
  check_run_memory(memory, budget, "qkv decode");
  UniformFloats random(static_cast<std::uint64_t>(c.seed));
  std::vector<SequenceId> ids;
  for (std::int64_t b = 0; b < c.batch; ++b) {
    ids.push_back(cache.add_sequence());
    append_random_rows(cache, ids.back(), c.prompt, random);
  }

  AttentionOptions options;
  options.causal = true;
  // Query i attends keys i - W + 1 .. i: W keys, itself included.
  if (c.window > 0) options.window = Window{c.window - 1, 0};
  options.threads = threads;
  options.kernel = c.kernel;
  options.max_memory = budget_left(memory, budget);

  Tensor q(DType::kF32, {c.batch, c.heads, 1, c.d}, "q");
  Tensor k(DType::kF32, {c.batch, c.kv_heads, 1, c.d}, "k");
  Tensor v(DType::kF32, {c.batch, c.kv_heads, 1, c.dv}, "v");
  std::vector<double> step_ms;
  CheckState check;
  std::string kernel = "none";
  ProgressLine progress(!c.quiet, "qkv decode", "step");
  for (std::int64_t step = 0; step < c.tokens; ++step) {
    // New rows for this step: what a model's projections would hand over (not timed).
    random.fill(q);
    random.fill(k);
    random.fill(v);
    const auto start = std::chrono::steady_clock::now();
    for (std::int64_t b = 0; b < c.batch; ++b) {
      const SequenceId id = ids[static_cast<std::size_t>(b)];
      cache.append(id, slice(k, b), slice(v, b));
      if (c.window > 0)
        cache.forget_before(id, std::max<std::int64_t>(0, cache.length(id) - c.window));
    }
    const AttentionResult result = attention_cached(q.view(), cache, ids, options);
    const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - start;
    step_ms.push_back(took.count());
    kernel = result.kernel;
    if (c.check) check_step(q, result.out, cache, ids, options, check);
    progress.update(step + 1, c.tokens);
  }
  progress.erase();

  double loop_ms = 0.0;
  for (double ms : step_ms) loop_ms += ms;
  std::vector<double> sorted = step_ms;
  std::sort(sorted.begin(), sorted.end());
  const double median_ms = sorted.empty() ? 0.0 : sorted[sorted.size() / 2];
  const double min_ms = sorted.empty() ? 0.0 : sorted.front();
  const double tokens = static_cast<double>(c.batch * c.tokens);
  const double tokens_per_s = loop_ms > 0.0 ? tokens / (loop_ms * 1e-3) : 0.0;
  const std::int64_t length = c.prompt + c.tokens;
  const std::int64_t first_stored = ids.empty() ? 0 : cache.first_stored_row(ids.front());
  const double tolerance = kCheckTolerance * check.max_abs_v;
  const bool failed = c.check && check.max_abs_error > tolerance;

  if (c.json) {
    std::printf(
        "{\"batch\": %lld, \"heads\": %lld, \"kv_heads\": %lld, \"d\": %lld, \"dv\": %lld, "
        "\"dtype\": \"%s\", \"page_rows\": %lld, \"prompt\": %lld, \"tokens\": %lld, "
        "\"window\": %lld, \"threads\": %d, \"simd_target\": \"%s\", \"kernel\": \"%s\", "
        "\"loop_ms\": %.4f, \"tokens_per_s\": %.1f, \"step_ms\": %.4f, \"min_step_ms\": %.4f, "
        "\"length\": %lld, \"first_stored_row\": %lld, \"pages_in_use\": %lld, "
        "\"bytes_in_use\": %llu",
        static_cast<long long>(c.batch), static_cast<long long>(c.heads),
        static_cast<long long>(c.kv_heads), static_cast<long long>(c.d),
        static_cast<long long>(c.dv), cache_storage_name(storage),
        static_cast<long long>(c.page_rows), static_cast<long long>(c.prompt),
        static_cast<long long>(c.tokens), static_cast<long long>(c.window), threads,
        kernels::simd_target_name().c_str(), kernel.c_str(), loop_ms, tokens_per_s, median_ms,
        min_ms, static_cast<long long>(length), static_cast<long long>(first_stored),
        static_cast<long long>(cache.pages_in_use()),
        static_cast<unsigned long long>(cache.bytes_in_use()));
    if (c.check) {
      std::printf(
          ", \"check\": {\"max_abs_error\": %.3e, \"max_abs_v\": %.6g, \"tolerance\": %.3e, "
          "\"ok\": %s}",
          check.max_abs_error, check.max_abs_v, tolerance, failed ? "false" : "true");
    }
    std::printf("}\n");
  } else {
    std::printf(
        "decode B=%lld H=%lld Hkv=%lld d=%lld dv=%lld, cache %s in pages of %lld rows, prompt "
        "%lld + %lld tokens",
        static_cast<long long>(c.batch), static_cast<long long>(c.heads),
        static_cast<long long>(c.kv_heads), static_cast<long long>(c.d),
        static_cast<long long>(c.dv), cache_storage_name(storage),
        static_cast<long long>(c.page_rows), static_cast<long long>(c.prompt),
        static_cast<long long>(c.tokens));
    if (c.window > 0) std::printf(", window %lld", static_cast<long long>(c.window));
    std::printf(", %d thread(s), SIMD %s, kernel %s\n", threads,
                kernels::simd_target_name().c_str(), kernel.c_str());
    std::printf("%.0f tokens in %.3f ms: %.1f tokens/s; %.4f ms per step (median, min %.4f)\n",
                tokens, loop_ms, tokens_per_s, median_ms, min_ms);
    std::printf(
        "final: %lld sequence(s) of %lld rows (rows %lld.. stored), %lld pages in use, %.1f KiB\n",
        static_cast<long long>(c.batch), static_cast<long long>(length),
        static_cast<long long>(first_stored), static_cast<long long>(cache.pages_in_use()),
        static_cast<double>(cache.bytes_in_use()) / 1024.0);
    if (c.check) {
      std::printf(
          "check: max abs error %.3e over %lld steps against the float64 reference on the "
          "gathered cache; tolerance %.3e (1e-5 of max|V| %.6g): %s\n",
          check.max_abs_error, static_cast<long long>(c.tokens), tolerance, check.max_abs_v,
          failed ? "FAILED" : "ok");
    }
  }
  if (failed) {
    std::fflush(stdout);
    throw Error("decode --check", "max abs error " + std::to_string(check.max_abs_error) +
                                      " exceeds the tolerance " + std::to_string(tolerance));
  }
}

}  // namespace

void register_decode_command(CLI::App& app) {
  auto command = std::make_shared<DecodeCommand>();
  CLI::App* sub =
      app.add_subcommand("decode",
                         "simulate a generation loop against a KV cache on random data: tokens/s, "
                         "pages in use, and with --check the error against the float64 reference");
  sub->add_option("--prompt", command->prompt, "rows appended to each sequence first (default 0)")
      ->check(at_least(0));
  sub->add_option("--tokens", command->tokens,
                  "generation steps (default 64; 0 runs none and reports 0 tokens)")
      ->check(at_least(0));
  sub->add_option("--heads", command->heads, "query heads H (default 8)")->check(at_least(1));
  sub->add_option("--kv-heads", command->kv_heads, "key/value heads, dividing H (default H)")
      ->check(at_least(1));
  sub->add_option("--d", command->d, "head dimension of q and K (default 64)")->check(at_least(1));
  sub->add_option("--dv", command->dv, "head dimension of V (default d)")->check(at_least(1));
  sub->add_option("--dtype", command->dtype,
                  "the cache's storage: f32, bf16, f16 or int8 (blocks of 32 values with a "
                  "float scale) (default f32)");
  sub->add_option("--batch", command->batch, "sequences B, decoded together (default 1)")
      ->check(at_least(1));
  sub->add_option("--page-rows", command->page_rows, "rows per cache page (default 256)")
      ->check(at_least(1));
  sub->add_option("--window", command->window,
                  "sliding window of W keys: the query at position i attends keys i-W+1 .. i, "
                  "and pages holding only older rows are freed (forget_before)")
      ->check(at_least(1));
  add_threads_option(*sub, command->threads, "threads (default: one per hardware thread)");
  sub->add_option("--seed", command->seed, "seed of the random q, K and V (default 1)")
      ->check(at_least(0));
  sub->add_option("--kernel", command->kernel,
                  "force decode_hwy, decode_scalar or reference (default: the library's choice)");
  sub->add_flag("--check", command->check,
                "also compute every step with the float64 reference on the gathered cache and "
                "compare (not timed); exit 1 if the error passes the tolerance");
  add_max_memory_option(*sub, command->max_memory, "");
  sub->add_flag("--json", command->json, "print one JSON object");
  sub->add_flag("--quiet", command->quiet,
                "no progress line (shown on a terminal for runs longer than about a second)");
  sub->footer(
      "Example:\n"
      "  qkv decode --prompt 4096 --tokens 256 --heads 32 --kv-heads 8 --d 128 --dtype bf16\n"
      "Each step appends one random K/V row to every sequence (timed), frees the pages before a\n"
      "--window, and attends one random query row per sequence, causal (timed); tokens/s is\n"
      "B·T over the timed part of the loop. Generating the random rows and --check are not timed.\n"
      "--check: the reference reads the same stored values (dequantised exactly from bf16, f16\n"
      "or int8), so storage rounding cancels and only the kernel's float32 arithmetic remains,\n"
      "a few float32 roundings of max|V| (measured 4e-8 .. 1e-7 · max|V| on this random data).\n"
      "The tolerance is 1e-5 · max|V|; past it the command exits 1. --tokens 0 runs no step and\n"
      "reports 0 tokens/s.\n"
      "Benchmarks may be run as env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE qkv decode ...");
  sub->callback([command] { run_decode(*command); });
}

}  // namespace qkv::cli
