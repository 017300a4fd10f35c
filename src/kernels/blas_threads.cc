#include "kernels/blas_threads.h"

#include <mutex>

// OpenBLAS's thread control, when the CBLAS in use is OpenBLAS; any other CBLAS leaves these
// null and runs as it is configured.
extern "C" void openblas_set_num_threads(int num_threads) __attribute__((weak));
extern "C" int blas_thread_shutdown_(void) __attribute__((weak));

namespace qkv::kernels {

void single_threaded_blas() noexcept {
  static std::once_flag once;
  std::call_once(once, [] {
    // In this order: setting the count restarts the pool (measured: a thread count change
    // re-creates it), the shutdown then joins it, and one-thread calls never start it again.
    if (openblas_set_num_threads != nullptr) openblas_set_num_threads(1);
    if (blas_thread_shutdown_ != nullptr) blas_thread_shutdown_();
  });
}

}  // namespace qkv::kernels
