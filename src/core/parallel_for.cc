#include "core/parallel_for.h"

#include <algorithm>
#include <atomic>
#include <system_error>
#include <thread>
#include <vector>

namespace qkv::core {
namespace {

std::atomic<std::int64_t> g_threads_not_started{0};

}  // namespace

int run_team(int wanted, const std::function<void(int member, Team& team)>& body) {
  wanted = std::max(wanted, 1);
  if (wanted == 1) {
    Team team(1);
    body(0, team);
    return 1;
  }
  // Everything that allocates comes before the first thread, so that a failure (bad_alloc)
  // leaves no thread waiting. Threads wait at the gate until the team's size is known: a member
  // that started before then could reach team.sync() on a barrier still counting threads that
  // will never exist.
  Team team(wanted);
  std::atomic<bool> gate{false};
  std::vector<std::jthread> threads;
  threads.reserve(static_cast<std::size_t>(wanted - 1));
  for (int member = 1; member < wanted; ++member) {
    try {
      threads.emplace_back([&, member] {
        gate.wait(false, std::memory_order_acquire);
        body(member, team);
      });
    } catch (const std::system_error&) {
      g_threads_not_started.fetch_add(wanted - member, std::memory_order_relaxed);
      break;
    }
  }
  team.shrink_to(static_cast<int>(threads.size()) + 1);
  gate.store(true, std::memory_order_release);
  gate.notify_all();
  body(0, team);
  return team.size();  // the threads are joined as `threads` goes out of scope
}

void parallel_for(std::int64_t count, int threads,
                  const std::function<void(std::int64_t begin, std::int64_t end)>& body) {
  if (count <= 0) return;
  const std::int64_t chunks = std::clamp<std::int64_t>(threads, 1, count);
  if (chunks == 1) {
    body(0, count);
    return;
  }
  // Contiguous chunks of near-equal size, fixed by count and the threads asked for; a team
  // smaller than asked for takes them in turn.
  const auto chunk_begin = [&](std::int64_t c) { return count * c / chunks; };
  run_team(static_cast<int>(chunks), [&](int member, Team& team) {
    for (std::int64_t c = member; c < chunks; c += team.size()) {
      body(chunk_begin(c), chunk_begin(c + 1));
    }
  });
}

int resolve_thread_count(int requested) noexcept {
  if (requested > 0) return requested;
  // Asked once: glibc answers by reading /sys (~10 µs), a third of a small call.
  static const unsigned hardware = std::thread::hardware_concurrency();
  return hardware == 0 ? 1 : static_cast<int>(hardware);
}

int threads_for_work(int requested, double multiply_adds) noexcept {
  const int threads = resolve_thread_count(requested);
  if (requested > 0 || !(multiply_adds < kMultiplyAddsPerThread * threads)) return threads;
  return std::max(1, static_cast<int>(multiply_adds / kMultiplyAddsPerThread));
}

std::int64_t threads_not_started() noexcept {
  return g_threads_not_started.load(std::memory_order_relaxed);
}

}  // namespace qkv::core
