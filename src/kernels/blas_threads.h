// qkv's only contact with OpenBLAS as a library (beyond CBLAS): its threads, kept out of qkv's
// way, and which kernels it picked. Debian's default OpenBLAS (the pthread build)
// starts a pool of one thread per core when it is loaded, and its pool threads spin for about
// 2^28 cycles (~0.1 s) after start-up and after every threaded call or change of thread count
// before they sleep. Measured with `qkv bench --n 256 --d 64 --heads 2 --threads 1
// --no-baseline`: the process CPU time was twice the wall time over the first 50 calls, a
// second core taken by a thread nobody asked for (and from a second qkv thread at
// --threads 2). qkv runs every BLAS call on its own threads (core::parallel_for), so OpenBLAS
// is set to one thread and its pool joined; it then starts no thread.
#pragma once

#include <cstdint>
#include <string>

namespace qkv::kernels {

// OpenBLAS at one thread, with its pool joined, for the lifetime of the object; then the
// thread count it had before, so that a program that loaded qkv as a library (Python with
// NumPy on the same OpenBLAS, say) keeps the BLAS threads it chose (docs/python.md). Scopes may
// overlap on different threads: the first to begin saves the count, the last to end restores
// it. The pool is joined (its fork-safety shutdown, blas_thread_shutdown_) when a scope finds
// it alive; the count given back starts no thread (OpenBLAS starts its pool again at the
// program's next threaded call), so a process the system refuses threads is never made to
// ask for them. A scope that finds one thread and no pool (the qkv executable tells OpenBLAS
// so before it loads) changes nothing. A no-op for
// any other CBLAS. Held by the attention entry points, the layer's projections, the ring and
// the speed probes while their kernels run.
class SingleThreadedBlas {
 public:
  SingleThreadedBlas() noexcept;
  ~SingleThreadedBlas();
  SingleThreadedBlas(const SingleThreadedBlas&) = delete;
  SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;
};

// OpenBLAS's thread count now (0 when the CBLAS is not OpenBLAS); for tests.
int blas_thread_count() noexcept;

// Why BLAS calls on `threads` threads cannot be made now, or empty. OpenBLAS (0.3.21) takes a
// buffer of 128 MiB of address space for each thread at its first call, and when that
// allocation fails it retries for ever: under an address-space limit (ulimit -v) that leaves
// less room, a BLAS call never returns. OpenBLAS keeps the buffers it took for any later call,
// so only threads beyond the most that passed this check before are counted (each check that
// passes assumes its calls follow). Empty for any CBLAS that is not OpenBLAS, or with no limit.
std::string blas_address_space_shortfall(std::int64_t threads);

// The kernel family OpenBLAS chose for this CPU ("SkylakeX", "Haswell", ...; empty when the
// CBLAS is not OpenBLAS). OpenBLAS 0.3.21 falls back to "Prescott" (SSE3) on CPUs newer than
// it knows, which makes the baseline several times slower than OpenBLAS can be there.
std::string blas_core_name();

}  // namespace qkv::kernels
