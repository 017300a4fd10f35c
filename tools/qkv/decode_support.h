// What `qkv bench --decode` and `qkv decode` share: deterministic pseudo-random K/V rows
// appended to a KVCache in bounded blocks, the bytes one decode call reads, the memory a run
// will hold (checked against --max-memory before anything is allocated), the integer-list
// flags, and usage errors (exit status 2) that name a flag.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "cli_common.h"
#include "qkv/kv_cache.h"
#include "qkv/tensor.h"

namespace qkv::cli {

// A bad flag value found after parsing: one stderr line naming the flag, exit status 2, as
// CLI11's own checks give.
[[noreturn]] void usage_error(const std::string& flag, const std::string& problem);

// A CLI11 check that a number flag is finite and > 0.
CLI::Validator positive_number();

// A cheap deterministic generator of floats uniform in [-1, 1) (a 64-bit LCG's top 24 bits).
class UniformFloats {
 public:
  explicit UniformFloats(std::uint64_t seed) : state_(seed * 0x9E3779B97F4A7C15ull + 1) {}
  float next() noexcept {
    state_ = state_ * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>(static_cast<double>(state_ >> 40) / static_cast<double>(1ull << 24)) *
               2.0f -
           1.0f;
  }
  double next_unit() noexcept { return 0.5 * (static_cast<double>(next()) + 1.0); }  // [0, 1)
  void fill(Tensor& t) noexcept;

 private:
  std::uint64_t state_;
};

// Appends `rows` rows of K [Hkv, n, D] and V [Hkv, n, Dv] drawn from `random` to `sequence`,
// at most kAppendBlockRows at a time, so that the staging tensors stay small whatever the length.
inline constexpr std::int64_t kAppendBlockRows = 4096;
void append_random_rows(KVCache& cache, SequenceId sequence, std::int64_t rows,
                        UniformFloats& random);

// Bytes of K and V one decode call reads for `rows` cached rows: rows · Hkv · (D + Dv) values of
// the storage type, plus for int8 the 4-byte scale of every 32-value block of each row.
double kv_bytes_read(const KVCacheOptions& options, std::int64_t rows);

// Memory a decode run will hold, counted from its flags before anything is allocated (the
// saturating sums of core/memory_budget.h: sizes from the command line may overflow).
struct RunMemory {
  std::uint64_t cache = 0;  // the pages at their peak
  std::uint64_t other = 0;  // q/k/v and staging tensors, --check's gathers, the baselines
  std::uint64_t total() const noexcept;
};

// Bytes of the whole pages `rows` rows of one sequence span (saturating).
std::uint64_t sequence_cache_bytes(const KVCache& cache, std::int64_t rows);

// Bytes of a float32 tensor with these dims (saturating; negative dims count as 0).
std::uint64_t float32_bytes(std::initializer_list<std::int64_t> dims);

// The staging tensors of append_random_rows: kAppendBlockRows rows of K and V.
std::uint64_t append_staging_bytes(const KVCacheOptions& options);

// Refuses a run that needs more than `budget` (0: no limit), before it allocates: one line,
// qkv::Error naming --max-memory. `what` names the run ("qkv decode").
void check_run_memory(const RunMemory& memory, std::uint64_t budget, const std::string& what);

// What is left of `budget` for the library's own checks (attention_cached's workspace and
// outputs) once `memory` is held; 0 (no limit) stays 0.
std::uint64_t budget_left(const RunMemory& memory, std::uint64_t budget);

// The --max-memory option of decode and bench --decode, as qkv attention words it.
CLI::Option* add_max_memory_option(CLI::App& command, std::string& max_memory,
                                   const std::string& prefix);

// "A,B,C" -> integers; throws usage_error naming `flag` on anything else.
std::vector<std::int64_t> parse_int_list(const std::string& text, const std::string& flag);

// The CLI11 option for --dtype of a cache: f32, bf16, f16 or int8.
CacheStorage cache_storage_flag(const std::string& text, const std::string& flag);

}  // namespace qkv::cli
