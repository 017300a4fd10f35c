#include "kernels/blas_threads.h"

#include <mutex>

// OpenBLAS's thread control, when the CBLAS in use is OpenBLAS; any other CBLAS leaves these
// null and runs as it is configured.
extern "C" void openblas_set_num_threads(int num_threads) __attribute__((weak));
extern "C" int openblas_get_num_threads(void) __attribute__((weak));
extern "C" int blas_thread_shutdown_(void) __attribute__((weak));
extern "C" char* openblas_get_corename(void) __attribute__((weak));

namespace qkv::kernels {

void single_threaded_blas() noexcept {
  if (openblas_set_num_threads == nullptr || openblas_get_num_threads == nullptr) return;
  static std::once_flag startup;
  static std::mutex changing;
  // Once for the pool started at load, and again whenever the program has since asked
  // OpenBLAS for more threads. In this order: setting the count restarts the pool (measured:
  // any change of thread count re-creates it), the shutdown then joins it, and one-thread calls
  // never start it again.
  const auto stop = [] {
    openblas_set_num_threads(1);
    if (blas_thread_shutdown_ != nullptr) blas_thread_shutdown_();
  };
  std::call_once(startup, stop);
  if (openblas_get_num_threads() != 1) {
    const std::lock_guard<std::mutex> lock(changing);
    if (openblas_get_num_threads() != 1) stop();
  }
}

std::string blas_core_name() {
  if (openblas_get_corename == nullptr) return "";
  const char* name = openblas_get_corename();
  return name == nullptr ? "" : name;
}

}  // namespace qkv::kernels
