// A small deterministic parallel_for, and the thread team under it. Tasks [0, count) are split
// into contiguous chunks by the thread count asked for; each task must own its output, so results
// do not depend on how many threads really ran or which ran a chunk.
//
// Creating a thread can fail (a process or user thread limit, RLIMIT_NPROC, an address-space
// limit too small for another stack). That is never an error here: the team simply has fewer
// members, the chunks of the missing ones run on the members that exist, and
// threads_not_started() counts the shortfall for whoever wants to say so (QKV_VERBOSE=1).
#pragma once

#include <barrier>
#include <cstdint>
#include <functional>

namespace qkv::core {

// The threads of one run_team call. Members may meet at sync(), a barrier sized to the team as
// it really is, so that code which waits for "every member" cannot wait for a thread that was
// never created.
class Team {
 public:
  explicit Team(int members) : members_(members), barrier_(members) {}
  int size() const noexcept { return members_; }
  void sync() { barrier_.arrive_and_wait(); }

 private:
  int members_;
  std::barrier<> barrier_;
};

// Runs body(member, team) on up to `wanted` threads, the calling thread being member 0 (the
// others from a persistent pool, parked between calls; or, when the pool is taken by another
// call, threads started for this one), and
// returns the team's size: `wanted` (at least 1), or fewer when the system refused to create
// threads. Every member starts only once the team is complete.
int run_team(int wanted, const std::function<void(int member, Team& team)>& body);

// body(begin, end) runs tasks [begin, end). The split into chunks depends only on `count` and
// `threads`; runs inline when threads <= 1 or count <= 1.
void parallel_for(std::int64_t count, int threads,
                  const std::function<void(std::int64_t begin, std::int64_t end)>& body);

// The thread count to use for a request of `requested` (0 = one per hardware thread).
int resolve_thread_count(int requested) noexcept;

// Multiply-adds a thread must have to be worth starting when the caller left the count to qkv:
// starting and joining one, with its tiles, costs ~60-100 µs here, and measured on the fused
// kernel (Zen 4, H = 8, d = 64) two threads first beat one at ~9M multiply-adds (n = 96).
inline constexpr double kMultiplyAddsPerThread = 4194304.0;  // 2^22

// resolve_thread_count, except that a request of 0 (one per hardware thread) gets no more
// threads than `multiply_adds` / kMultiplyAddsPerThread (at least 1): a small call runs on the
// calling thread alone. An explicit request is honoured as given. Either way the results are
// the same bits (tasks own their outputs).
int threads_for_work(int requested, double multiply_adds) noexcept;

// The threads of the persistent team this process has started (parked between calls, using no
// CPU time), for tests and QKV_VERBOSE.
int pool_threads() noexcept;

// How many threads this process asked run_team for and could not create, since it started.
std::int64_t threads_not_started() noexcept;

}  // namespace qkv::core
