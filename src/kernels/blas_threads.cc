#include "kernels/blas_threads.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <mutex>

#include "core/format_bytes.h"

// OpenBLAS's thread control, when the CBLAS in use is OpenBLAS; any other CBLAS leaves these
// null and runs as it is configured.
extern "C" void openblas_set_num_threads(int num_threads) __attribute__((weak));
extern "C" int openblas_get_num_threads(void) __attribute__((weak));
extern "C" int blas_thread_shutdown_(void) __attribute__((weak));
extern "C" char* openblas_get_corename(void) __attribute__((weak));
// Non-zero while OpenBLAS's pool of threads exists, and the thread count its calls use (what
// openblas_get_num_threads returns); 0.3.21 exports both.
extern "C" int blas_server_avail __attribute__((weak));
extern "C" int blas_cpu_number __attribute__((weak));

namespace qkv::kernels {

namespace {

std::mutex g_scopes_mutex;
int g_scopes = 0;         // SingleThreadedBlas objects alive, under g_scopes_mutex
int g_saved_threads = 1;  // the count the first of them found
bool g_joined = false;    // the pool joined once (where blas_server_avail cannot tell)

bool is_openblas() noexcept {
  return openblas_set_num_threads != nullptr && openblas_get_num_threads != nullptr;
}

// Sets the count OpenBLAS's calls use without starting its pool. openblas_set_num_threads
// first re-creates a pool that was joined (its lazy re-initialisation after fork), and where
// the system refuses threads (RLIMIT_NPROC) OpenBLAS then prints two lines and raises SIGINT;
// the count itself is one variable, which the qkv executable also sets before OpenBLAS loads.
// A program's next threaded call on that count starts the pool again (exec_blas's own lazy
// re-initialisation), on the program's thread.
void set_thread_count(int threads) noexcept {
  if (&blas_cpu_number != nullptr) {
    blas_cpu_number = threads;
  } else {
    openblas_set_num_threads(threads);
  }
}

void join_pool_at_one_thread() noexcept {
  set_thread_count(1);
  if (blas_thread_shutdown_ != nullptr) blas_thread_shutdown_();
}

}  // namespace

SingleThreadedBlas::SingleThreadedBlas() noexcept {
  if (!is_openblas()) return;
  const std::lock_guard<std::mutex> lock(g_scopes_mutex);
  if (g_scopes++ == 0) g_saved_threads = openblas_get_num_threads();
  // A pool at one thread is never used but spins after its start (at load, or when the count
  // was last changed): joined too, which changes no setting (a later change of the count
  // starts it again).
  const bool pool_alive = &blas_server_avail != nullptr && blas_server_avail != 0;
  if (openblas_get_num_threads() != 1 || pool_alive || !g_joined) {
    join_pool_at_one_thread();
    g_joined = true;
  }
}

SingleThreadedBlas::~SingleThreadedBlas() {
  if (!is_openblas()) return;
  const std::lock_guard<std::mutex> lock(g_scopes_mutex);
  if (--g_scopes == 0 && g_saved_threads != 1 && g_saved_threads > 0) {
    set_thread_count(g_saved_threads);
  }
}

int blas_thread_count() noexcept { return is_openblas() ? openblas_get_num_threads() : 0; }

std::string blas_address_space_shortfall(std::int64_t threads) {
  if (openblas_get_num_threads == nullptr) return "";
  // OpenBLAS keeps its buffers once taken and hands a free one to any calling thread, so only
  // the threads beyond the most that have called before need new ones.
  static std::atomic<std::int64_t> provisioned{0};
  const std::int64_t more = threads - provisioned.load(std::memory_order_relaxed);
  if (more <= 0) return "";
  rlimit limit{};
  if (::getrlimit(RLIMIT_AS, &limit) != 0) return "";
  if (limit.rlim_cur == RLIM_INFINITY) return "";
  std::uint64_t pages = 0;
  std::ifstream statm("/proc/self/statm");
  if (!(statm >> pages)) return "";
  const std::uint64_t used = pages * static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const std::uint64_t free = limit.rlim_cur > used ? limit.rlim_cur - used : 0;
  // OpenBLAS's buffer (BUFFER_SIZE, 128 MiB on x86-64) plus its page of bookkeeping, and room
  // for the thread's own stack and the call's blocks.
  constexpr std::uint64_t kPerThread = (std::uint64_t{128} + 16) << 20;
  const std::uint64_t need = kPerThread * static_cast<std::uint64_t>(more);
  if (free >= need) {
    std::int64_t seen = provisioned.load(std::memory_order_relaxed);
    while (seen < threads && !provisioned.compare_exchange_weak(seen, threads)) {
    }
    return "";
  }
  return "OpenBLAS needs about " + core::format_bytes(need) +
         " of address space for its buffers (128 MiB for each calling thread) and the "
         "address-space limit (ulimit -v) leaves " +
         core::format_bytes(free);
}

std::string blas_core_name() {
  if (openblas_get_corename == nullptr) return "";
  const char* name = openblas_get_corename();
  return name == nullptr ? "" : name;
}

}  // namespace qkv::kernels
