// qkv's teams on an OpenMP runtime the process has already loaded, instead of on qkv's own
// threads (parallel_for.cc), when a caller asks for it (qkv::use_openmp_threads).
//
// Why: inside a PyTorch program, torch's OpenMP workers keep spinning for a while after each
// torch operator (GNU libgomp's default: 300,000 spins, about 10 ms), on the very cores qkv's
// own threads then need. At 128 tokens, a transformers model's attention on qkv took 11.4 ms
// next to torch's operators against 6.1 ms with torch's spin cut short (a Xeon, 2 threads;
// docs/performance.md). Run on torch's own pool, the spinning workers are the ones that pick
// qkv's work up.
//
// The runtime is reached through its GNU entry points (GOMP_parallel, omp_get_thread_num,
// omp_get_num_threads), which GNU libgomp and LLVM's libomp both export, looked up with dlsym in
// a library that is already loaded (dlopen RTLD_NOLOAD): qkv never loads a second OpenMP runtime
// and links none. Results are the same bits on either team: tasks own their outputs, and the
// split of work depends only on the count asked for (parallel_for.h).
#pragma once

#include <functional>
#include <string>

namespace qkv::core {

class Team;

// Makes run_team use the OpenMP runtime in `library` (a path, or a file name such as
// "libgomp.so.1", as the dynamic loader knows it); "" goes back to qkv's own threads. Throws
// qkv::Error naming the library when it is not loaded in this process or lacks the entry points.
void use_openmp_threads(const std::string& library);

// The library given to use_openmp_threads, or "" while qkv runs its own threads.
std::string openmp_threads_library();

// When an OpenMP runtime is in use: runs body(member, team) on a team of up to `wanted` of its
// threads, the caller being member 0, and returns the team's size (at least 1). Returns 0, and
// runs nothing, when none is in use.
int run_openmp_team(int wanted, const std::function<void(int member, Team& team)>& body);

}  // namespace qkv::core
