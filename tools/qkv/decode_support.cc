#include "decode_support.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "core/format_bytes.h"
#include "core/memory_budget.h"
#include "qkv/error.h"

namespace qkv::cli {

void usage_error(const std::string& flag, const std::string& problem) {
  throw CLI::ValidationError(flag, problem);
}

CLI::Validator positive_number() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        double value = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, value);
        if (text.empty() || ec != std::errc() || ptr != end || !std::isfinite(value) ||
            value <= 0) {
          return "must be a number > 0, got '" + text + "'";
        }
        return "";
      },
      "> 0");
}

void UniformFloats::fill(Tensor& t) noexcept {
  float* x = t.data_as<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) x[i] = next();
}

void append_random_rows(KVCache& cache, SequenceId sequence, std::int64_t rows,
                        UniformFloats& random) {
  const KVCacheOptions& o = cache.options();
  for (std::int64_t done = 0; done < rows;) {
    const std::int64_t n = std::min(kAppendBlockRows, rows - done);
    Tensor k(DType::kF32, {o.kv_heads, n, o.d}, "K");
    Tensor v(DType::kF32, {o.kv_heads, n, o.dv}, "V");
    random.fill(k);
    random.fill(v);
    cache.append(sequence, k.view(), v.view());
    done += n;
  }
}

double kv_bytes_read(const KVCacheOptions& o, std::int64_t rows) {
  double per_row = 0.0;
  switch (o.storage) {
    case CacheStorage::kF32:
      per_row = 4.0 * static_cast<double>(o.d + o.dv);
      break;
    case CacheStorage::kBF16:
    case CacheStorage::kF16:
      per_row = 2.0 * static_cast<double>(o.d + o.dv);
      break;
    case CacheStorage::kInt8: {
      const std::int64_t blocks = (o.d + kCacheInt8Block - 1) / kCacheInt8Block +
                                  (o.dv + kCacheInt8Block - 1) / kCacheInt8Block;
      per_row = static_cast<double>(o.d + o.dv) + 4.0 * static_cast<double>(blocks);
      break;
    }
  }
  return per_row * static_cast<double>(o.kv_heads) * static_cast<double>(rows);
}

std::uint64_t RunMemory::total() const noexcept { return core::saturating_add(cache, other); }

std::uint64_t sequence_cache_bytes(const KVCache& cache, std::int64_t rows) {
  const auto page_rows = static_cast<std::uint64_t>(cache.options().page_rows);
  const std::uint64_t pages =
      (static_cast<std::uint64_t>(std::max<std::int64_t>(rows, 0)) + page_rows - 1) / page_rows;
  return core::saturating_mul(pages, static_cast<std::uint64_t>(cache.page_bytes()));
}

std::uint64_t float32_bytes(std::initializer_list<std::int64_t> dims) {
  std::uint64_t bytes = sizeof(float);
  for (std::int64_t dim : dims) {
    bytes = core::saturating_mul(bytes, static_cast<std::uint64_t>(std::max<std::int64_t>(dim, 0)));
  }
  return bytes;
}

std::uint64_t append_staging_bytes(const KVCacheOptions& o) {
  return float32_bytes({kAppendBlockRows, o.kv_heads, o.d + o.dv});
}

void check_run_memory(const RunMemory& memory, std::uint64_t budget, const std::string& what) {
  if (budget == 0 || memory.total() <= budget) return;
  throw Error("--max-memory", what + " needs " + core::format_bytes_exact(memory.total()) +
                                  ": the KV cache " + core::format_bytes(memory.cache) +
                                  ", other buffers " + core::format_bytes(memory.other) +
                                  "; the memory budget is " + core::format_bytes_exact(budget));
}

std::uint64_t budget_left(const RunMemory& memory, std::uint64_t budget) {
  // check_run_memory has passed: total <= budget. One byte stands for "nothing left" (0 would
  // mean no limit).
  return budget == 0 ? 0 : std::max<std::uint64_t>(budget - memory.total(), 1);
}

CLI::Option* add_max_memory_option(CLI::App& command, std::string& max_memory,
                                   const std::string& prefix) {
  return command.add_option("--max-memory", max_memory,
                            prefix +
                                "memory budget: refuse, before allocating, a run whose cache and "
                                "buffers need more (e.g. 8G, 512MiB, 25%; 0: no limit; default 75% "
                                "of physical memory)");
}

std::vector<std::int64_t> parse_int_list(const std::string& text, const std::string& flag) {
  std::vector<std::int64_t> values;
  std::size_t at = 0;
  while (true) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    std::int64_t value = 0;
    const char* first = text.data() + at;
    const char* last = text.data() + comma;
    const auto [ptr, ec] = std::from_chars(first, last, value);
    if (first == last || ec != std::errc() || ptr != last) {
      usage_error(flag, "expected integers separated by commas, got '" + text + "'");
    }
    values.push_back(value);
    if (comma == text.size()) break;
    at = comma + 1;
  }
  return values;
}

CacheStorage cache_storage_flag(const std::string& text, const std::string& flag) {
  try {
    return parse_cache_storage(text, flag);
  } catch (const Error& e) {
    usage_error(flag, e.problem());
  }
}

}  // namespace qkv::cli
