#include "core/parallel_for.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>
#include <vector>

#include "core/floating_point.h"
#include "core/openmp_team.h"
#include "core/termination_signals.h"

namespace qkv::core {
namespace {

std::atomic<std::int64_t> g_threads_not_started{0};

// A team of fresh threads, started for this call and joined at its end: the way of a call that
// finds the pool busy (another thread's call, or a team nested inside a team).
int run_fresh_team(int wanted, const std::function<void(int member, Team& team)>& body) {
  // Everything that allocates comes before the first thread, so that a failure (bad_alloc)
  // leaves no thread waiting. Threads wait at the gate until the team exists, sized to the
  // threads that really started: a member that started before then could reach team.sync() on
  // a barrier still counting threads that will never exist.
  std::optional<Team> team;
  std::atomic<bool> gate{false};
  std::vector<std::jthread> threads;
  threads.reserve(static_cast<std::size_t>(wanted - 1));
  // Started with the termination signals blocked (they inherit this mask), so that a signal
  // sent to the process goes to one of the caller's threads (termination_signals.h). The
  // caller's own mask is restored once the threads exist.
  std::optional<TerminationSignalsBlocked> blocked_while_starting;
  blocked_while_starting.emplace();
  for (int member = 1; member < wanted; ++member) {
    try {
      threads.emplace_back([&, member] {
        use_default_floating_point();  // not the creating thread's (floating_point.h)
        gate.wait(false, std::memory_order_acquire);
        body(member, *team);
      });
    } catch (const std::system_error&) {
      g_threads_not_started.fetch_add(wanted - member, std::memory_order_relaxed);
      break;
    }
  }
  blocked_while_starting.reset();
  team.emplace(static_cast<int>(threads.size()) + 1);
  gate.store(true, std::memory_order_release);
  gate.notify_all();
  body(0, *team);
  return team->size();  // the threads are joined as `threads` goes out of scope
}

// The persistent team: threads started on first need and kept, parked in a futex wait (no
// spinning) between calls, so that a decode step or a small prefill pays a wake-up (a few µs)
// instead of creating and joining threads (60-100 µs each). One call uses it at a time; a call
// that finds it taken runs a fresh team instead, so nothing ever waits for the pool.
//
// The pool is never destroyed: its threads stay parked until the process exits (destroying it
// at exit would race with static destructors that still compute). After fork(), the child has
// none of the parent's threads: a pool created by another process is abandoned and a new one
// started.
class Pool {
 public:
  static Pool* for_this_process() {
    const std::lock_guard<std::mutex> lock(guard());
    Pool*& pool = current();
    if (pool == nullptr || pool->pid_ != ::getpid()) pool = new Pool();  // abandoned: see above
    return pool;
  }

  static int started() noexcept {
    const std::lock_guard<std::mutex> lock(guard());
    return current() != nullptr && current()->pid_ == ::getpid() ? current()->started_.load() : 0;
  }

  bool try_acquire() { return busy_.try_lock(); }
  void release() { busy_.unlock(); }

  // With the pool acquired: body on the caller (member 0) and on workers 1..wanted-1, as many
  // as exist or can be created.
  int run(int wanted, const std::function<void(int member, Team& team)>& body) {
    // Allocations first (bad_alloc leaves no thread behind), so that push_back cannot throw
    // once a worker's thread runs.
    workers_.reserve(static_cast<std::size_t>(wanted - 1));
    while (static_cast<int>(workers_.size()) < wanted - 1) {
      auto worker = std::make_unique<Worker>();
      try {
        Worker* w = worker.get();
        const int member = static_cast<int>(workers_.size()) + 1;
        // A worker parks for the life of the process: it must never be the thread that takes
        // a signal sent to the process (termination_signals.h), so it starts with them
        // blocked (it inherits this mask); the caller's own mask is back at the end of scope.
        const TerminationSignalsBlocked blocked_while_starting;
        std::thread([this, w, member] { serve(*w, member); }).detach();
      } catch (const std::system_error&) {
        g_threads_not_started.fetch_add(wanted - 1 - static_cast<std::int64_t>(workers_.size()),
                                        std::memory_order_relaxed);
        break;
      }
      workers_.push_back(std::move(worker));
      started_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
    }
    const int members = std::min(wanted, static_cast<int>(workers_.size()) + 1);
    Team team(members);
    body_ = &body;
    team_ = &team;
    running_.store(members - 1, std::memory_order_relaxed);
    for (int m = 1; m < members; ++m) {
      Worker& w = *workers_[static_cast<std::size_t>(m - 1)];
      w.go.store(1, std::memory_order_release);
      w.go.notify_one();
    }
    // The workers read body and team until they finish: wait for them even if member 0 throws.
    struct WaitForWorkers {
      std::atomic<int>& running;
      ~WaitForWorkers() {
        for (int left = running.load(std::memory_order_acquire); left != 0;
             left = running.load(std::memory_order_acquire)) {
          running.wait(left, std::memory_order_acquire);
        }
      }
    } wait_for_workers{running_};
    body(0, team);
    return members;
  }

 private:
  static std::mutex& guard() {
    static std::mutex mutex;
    return mutex;
  }
  static Pool*& current() {
    static Pool* pool = nullptr;
    return pool;
  }

  struct Worker {
    std::atomic<std::uint32_t> go{0};  // 1: run the job in body_/team_
  };

  void serve(Worker& w, int member) {
    use_default_floating_point();  // not the creating thread's (floating_point.h)
    for (;;) {
      w.go.wait(0, std::memory_order_acquire);
      (*body_)(member, *team_);
      w.go.store(0, std::memory_order_relaxed);
      if (running_.fetch_sub(1, std::memory_order_acq_rel) == 1) running_.notify_one();
    }
  }

  const pid_t pid_ = ::getpid();
  std::mutex busy_;
  std::vector<std::unique_ptr<Worker>> workers_;  // member m is workers_[m - 1]
  const std::function<void(int, Team&)>* body_ = nullptr;
  Team* team_ = nullptr;
  std::atomic<int> running_{0};
  std::atomic<int> started_{0};  // workers_.size(), readable without taking busy_
};

}  // namespace

int run_team(int wanted, const std::function<void(int member, Team& team)>& body) {
  wanted = std::max(wanted, 1);
  if (wanted == 1) {
    Team team(1);
    body(0, team);
    return 1;
  }
  if (const int members = run_openmp_team(wanted, body); members > 0) return members;
  Pool* pool = Pool::for_this_process();
  if (!pool->try_acquire()) return run_fresh_team(wanted, body);
  struct Release {
    Pool* pool;
    ~Release() { pool->release(); }
  } release{pool};
  return pool->run(wanted, body);
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

int pool_threads() noexcept { return Pool::started(); }

std::int64_t threads_not_started() noexcept {
  return g_threads_not_started.load(std::memory_order_relaxed);
}

}  // namespace qkv::core
