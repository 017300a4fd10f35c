// AttentionOptions::progress at the kernel boundary. The kernels add the query rows (of single
// heads) whose outputs they have finished, once per task: one relaxed atomic add and one call of
// the caller's function per task, nothing inside the loops over rows, keys or columns. Tasks own
// their rows, so every row is counted exactly once and `done` reaches the total.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>

#include "core/params.h"

namespace qkv::core {

class Progress {
 public:
  using Report = std::function<void(std::int64_t done, std::int64_t total)>;

  Progress(const Report& report, std::int64_t total) noexcept : report_(report), total_(total) {}
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Called by kernels (noexcept): the caller's function must not throw (attention.h says so).
  void add(std::int64_t rows) noexcept {
    const std::int64_t done = done_.fetch_add(rows, std::memory_order_relaxed) + rows;
    report_(done, total_);
  }

 private:
  const Report& report_;
  const std::int64_t total_;
  std::atomic<std::int64_t> done_{0};
};

inline void report_rows(const AttentionParams& p, std::int64_t rows) noexcept {
  if (p.progress != nullptr && rows > 0) p.progress->add(rows);
}

}  // namespace qkv::core
