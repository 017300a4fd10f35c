#include "core/parallel_for.h"

#include <algorithm>
#include <thread>
#include <vector>

namespace qkv::core {

void parallel_for(std::int64_t count, int threads,
                  const std::function<void(std::int64_t begin, std::int64_t end)>& body) {
  if (count <= 0) return;
  const std::int64_t workers = std::clamp<std::int64_t>(threads, 1, count);
  if (workers == 1) {
    body(0, count);
    return;
  }
  // Contiguous chunks of near-equal size; the split depends only on count and workers, and each
  // task's output is its own, so any split gives the same bits.
  const auto chunk_begin = [&](std::int64_t w) { return count * w / workers; };
  std::vector<std::jthread> pool;
  pool.reserve(static_cast<std::size_t>(workers - 1));
  for (std::int64_t w = 1; w < workers; ++w) {
    pool.emplace_back([&, w] { body(chunk_begin(w), chunk_begin(w + 1)); });
  }
  body(chunk_begin(0), chunk_begin(1));
}

int resolve_thread_count(int requested) noexcept {
  if (requested > 0) return requested;
  const unsigned hardware = std::thread::hardware_concurrency();
  return hardware == 0 ? 1 : static_cast<int>(hardware);
}

}  // namespace qkv::core
