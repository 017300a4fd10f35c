#include "core/openmp_team.h"

#include <dlfcn.h>

#include <atomic>
#include <cfenv>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "core/parallel_for.h"
#include "qkv/error.h"

namespace qkv::core {
namespace {

// The entry points qkv calls, resolved once per library. Kept for the life of the process (a
// team may be running on one while another thread switches away from it), one per library
// named, in a list that stays reachable (so leak checkers do not count them).
struct OpenMpRuntime {
  std::string library;
  void (*parallel)(void (*fn)(void*), void* data, unsigned num_threads, unsigned flags);
  int (*thread_num)();
  int (*num_threads)();
};

std::atomic<const OpenMpRuntime*> g_runtime{nullptr};
std::mutex g_switching;  // guards runtimes() too

std::vector<std::unique_ptr<OpenMpRuntime>>& runtimes() {
  static auto* kept = new std::vector<std::unique_ptr<OpenMpRuntime>>();
  return *kept;
}

// One run_openmp_team call, as every member of the OpenMP team sees it.
struct Job {
  const OpenMpRuntime* runtime;
  const std::function<void(int, Team&)>* body;
  std::once_flag team_made;
  std::optional<Team> team;
  std::mutex failure_guard;
  std::exception_ptr failure;
};

void run_member(void* data) {
  Job& job = *static_cast<Job*>(data);
  const int member = job.runtime->thread_num();
  // The team is sized to the threads the runtime really gave (it may give fewer than asked).
  std::call_once(job.team_made, [&] { job.team.emplace(job.runtime->num_threads()); });
  // The workers are the runtime's, left with whatever environment its last job set: qkv's
  // default one while qkv runs on them (floating_point.h), theirs again after.
  std::fenv_t saved;
  if (member != 0) {
    std::fegetenv(&saved);
    std::fesetenv(FE_DFL_ENV);
  }
  try {
    (*job.body)(member, *job.team);
  } catch (...) {
    // No exception may leave an OpenMP region: the first is rethrown by the caller.
    const std::lock_guard<std::mutex> lock(job.failure_guard);
    if (!job.failure) job.failure = std::current_exception();
  }
  if (member != 0) std::fesetenv(&saved);
}

template <class Function>
Function entry_point(void* handle, const char* name, const std::string& library) {
  void* symbol = ::dlsym(handle, name);
  if (symbol == nullptr) {
    throw Error("OpenMP library " + library, std::string("has no ") + name);
  }
  return reinterpret_cast<Function>(symbol);
}

}  // namespace

void use_openmp_threads(const std::string& library) {
  const std::lock_guard<std::mutex> lock(g_switching);
  if (library.empty()) {
    g_runtime.store(nullptr, std::memory_order_release);
    return;
  }
  // RTLD_NOLOAD: only a library the process has loaded already (torch's); the handle keeps it
  // loaded for as long as qkv may call it.
  void* handle = ::dlopen(library.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr) {
    throw Error("OpenMP library " + library,
                "is not loaded in this process (qkv uses a runtime already loaded, such as "
                "torch's; it loads none)");
  }
  for (const auto& known : runtimes()) {
    if (known->library == library) {
      g_runtime.store(known.get(), std::memory_order_release);
      return;
    }
  }
  auto runtime = std::make_unique<OpenMpRuntime>(OpenMpRuntime{
      library,
      entry_point<decltype(OpenMpRuntime::parallel)>(handle, "GOMP_parallel", library),
      entry_point<decltype(OpenMpRuntime::thread_num)>(handle, "omp_get_thread_num", library),
      entry_point<decltype(OpenMpRuntime::num_threads)>(handle, "omp_get_num_threads", library)});
  runtimes().push_back(std::move(runtime));
  g_runtime.store(runtimes().back().get(), std::memory_order_release);
}

std::string openmp_threads_library() {
  const OpenMpRuntime* runtime = g_runtime.load(std::memory_order_acquire);
  return runtime == nullptr ? std::string() : runtime->library;
}

int run_openmp_team(int wanted, const std::function<void(int member, Team& team)>& body) {
  const OpenMpRuntime* runtime = g_runtime.load(std::memory_order_acquire);
  if (runtime == nullptr) return 0;
  Job job{runtime, &body, {}, {}, {}, {}};
  runtime->parallel(&run_member, &job, static_cast<unsigned>(wanted), 0);
  if (job.failure) std::rethrow_exception(job.failure);
  return job.team ? job.team->size() : 1;
}

}  // namespace qkv::core
