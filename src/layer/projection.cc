#include "layer/projection.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/parallel_for.h"
#include "kernels/blas_threads.h"
#include "qkv/error.h"

namespace qkv::layer {
namespace {

blasint blas_int(std::int64_t n, const std::string& name) {
  if (n > std::numeric_limits<blasint>::max()) {
    throw Error(name, "dimension " + std::to_string(n) + " is too large for this BLAS");
  }
  return static_cast<blasint>(n);
}

// Rows per GEMM task: fixed, so the split (and the bits) do not depend on the thread count,
// and large enough that each single-threaded GEMM runs at full speed.
constexpr std::int64_t kRowsPerTask = 256;

}  // namespace

Tensor project(const Tensor& in, const Tensor& w, const Tensor& bias, int threads,
               const std::string& name) {
  const std::int64_t rows = in.shape()[0];
  const std::int64_t n_in = in.shape()[1];
  const std::int64_t n_out = w.shape()[1];
  Tensor out(in.dtype(), {rows, n_out}, name);
  if (rows == 0 || n_out == 0) return out;

  // The bias goes into every row first; GEMM then accumulates with beta = 1.
  const bool has_bias = !bias.empty();
  if (has_bias) {
    const std::size_t row_bytes = bias.nbytes();
    auto* dst = static_cast<std::byte*>(out.data());
    for (std::int64_t r = 0; r < rows; ++r) {
      std::memcpy(dst + static_cast<std::size_t>(r) * row_bytes, bias.data(), row_bytes);
    }
  }
  if (n_in == 0) return out;
  // Row blocks on qkv's own threads, each a single-threaded GEMM (kernels/blas_threads.h:
  // OpenBLAS's pool would add threads beyond `threads`).
  const kernels::SingleThreadedBlas one_blas_thread;
  const blasint k = blas_int(n_in, name);
  const blasint n = blas_int(n_out, name);
  blas_int(rows, name);
  const std::int64_t tasks = (rows + kRowsPerTask - 1) / kRowsPerTask;
  if (const std::string why = kernels::blas_address_space_shortfall(
          std::clamp<std::int64_t>(tasks, 1, std::max(threads, 1)));
      !why.empty()) {
    throw Error(name, "cannot be computed: " + why);
  }
  core::parallel_for(tasks, threads, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t task = begin; task < end; ++task) {
      const std::int64_t r0 = task * kRowsPerTask;
      const auto m = static_cast<blasint>(std::min(kRowsPerTask, rows - r0));
      if (in.dtype() == DType::kF64) {
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0,
                    in.data_as<double>() + r0 * n_in, k, w.data_as<double>(), n,
                    has_bias ? 1.0 : 0.0, out.data_as<double>() + r0 * n_out, n);
      } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f,
                    in.data_as<float>() + r0 * n_in, k, w.data_as<float>(), n,
                    has_bias ? 1.0f : 0.0f, out.data_as<float>() + r0 * n_out, n);
      }
    }
  });
  return out;
}

}  // namespace qkv::layer
