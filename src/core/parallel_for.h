// A small deterministic parallel_for: tasks [0, count) are split into `threads` contiguous
// chunks, one per thread, the calling thread taking the first. Each task must own its output,
// so results do not depend on the thread count.
#pragma once

#include <cstdint>
#include <functional>

namespace qkv::core {

// body(begin, end) runs tasks [begin, end). Runs inline when threads <= 1 or count <= 1.
void parallel_for(std::int64_t count, int threads,
                  const std::function<void(std::int64_t begin, std::int64_t end)>& body);

// The thread count to use for a request of `requested` (0 = one per hardware thread).
int resolve_thread_count(int requested) noexcept;

}  // namespace qkv::core
