// The products and the exponential of the tiled backward (bwd_fused_driver.h), two ways:
// ScalarOps, plain loops (the portable twin: what every line computes is visible), and
// BlasOps, the products through CBLAS (sgemm/dgemm on the calling thread: OpenBLAS is kept
// to one thread, blas_threads.h) with the exponential from `Exp`.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

namespace qkv::kernels::bwd {

// x_rc = exp(min(scale·x_rc - shift_r, 0)) over a rows x cols tile, in the portable way.
template <class T>
void exp_below_scalar(T* x, std::int64_t rows, std::int64_t cols, T scale,
                      const T* shift) noexcept {
  for (std::int64_t r = 0; r < rows; ++r) {
    T* row = x + r * cols;
    for (std::int64_t c = 0; c < cols; ++c) {
      row[c] = std::exp(std::min(scale * row[c] - shift[r], T(0)));
    }
  }
}

// dS = scale·P∘(dP - D_r) (∘ factor, the softcap's 1 - tanh², when given), in place over dP.
template <class T>
void ds_rows_scalar(T* ds, const T* p, const T* factor, std::int64_t rows, std::int64_t cols,
                    T scale, const T* delta) noexcept {
  for (std::int64_t r = 0; r < rows; ++r) {
    T* dsr = ds + r * cols;
    const T* pr = p + r * cols;
    if (factor != nullptr) {
      const T* f = factor + r * cols;
      for (std::int64_t c = 0; c < cols; ++c) dsr[c] = scale * pr[c] * (dsr[c] - delta[r]) * f[c];
    } else {
      for (std::int64_t c = 0; c < cols; ++c) dsr[c] = scale * pr[c] * (dsr[c] - delta[r]);
    }
  }
}

template <class T>
struct ScalarOps {
  // C (+)= A·B with A(r, x) = a[r·rs + x·cs]: each C element summed over x in order.
  static void gemm(std::int64_t m, std::int64_t n, std::int64_t k, const T* a, std::int64_t rs,
                   std::int64_t cs, const T* b, std::int64_t ldb, T* c, std::int64_t ldc,
                   bool accumulate) noexcept {
    for (std::int64_t i = 0; i < m; ++i) {
      T* row = c + i * ldc;
      if (!accumulate) std::fill_n(row, n, T(0));
      for (std::int64_t x = 0; x < k; ++x) {
        const T w = a[i * rs + x * cs];
        const T* bx = b + x * ldb;
        for (std::int64_t j = 0; j < n; ++j) row[j] += w * bx[j];
      }
    }
  }
  static void exp_below(T* x, std::int64_t rows, std::int64_t cols, T scale,
                        const T* shift) noexcept {
    exp_below_scalar(x, rows, cols, scale, shift);
  }
  static void ds_rows(T* ds, const T* p, const T* factor, std::int64_t rows, std::int64_t cols,
                      T scale, const T* delta) noexcept {
    ds_rows_scalar(ds, p, factor, rows, cols, scale, delta);
  }
};

// The products through CBLAS: a strided A is a plain one (cs = 1) or a transposed one (rs = 1).
template <class T, void (*Exp)(T*, std::int64_t, std::int64_t, T, const T*) noexcept>
struct BlasOps {
  static void gemm(std::int64_t m, std::int64_t n, std::int64_t k, const T* a, std::int64_t rs,
                   std::int64_t cs, const T* b, std::int64_t ldb, T* c, std::int64_t ldc,
                   bool accumulate) noexcept {
    if (m == 0 || n == 0) return;
    const auto i = [](std::int64_t x) { return static_cast<int>(x); };
    const CBLAS_TRANSPOSE ta = cs == 1 ? CblasNoTrans : CblasTrans;
    const std::int64_t lda = std::max<std::int64_t>(cs == 1 ? rs : cs, 1);
    const T beta = accumulate ? T(1) : T(0);
    if constexpr (std::is_same_v<T, float>) {
      cblas_sgemm(CblasRowMajor, ta, CblasNoTrans, i(m), i(n), i(k), 1.0f, a, i(lda), b, i(ldb),
                  beta, c, i(ldc));
    } else {
      cblas_dgemm(CblasRowMajor, ta, CblasNoTrans, i(m), i(n), i(k), 1.0, a, i(lda), b, i(ldb),
                  beta, c, i(ldc));
    }
  }
  static void exp_below(T* x, std::int64_t rows, std::int64_t cols, T scale,
                        const T* shift) noexcept {
    Exp(x, rows, cols, scale, shift);
  }
  static void ds_rows(T* ds, const T* p, const T* factor, std::int64_t rows, std::int64_t cols,
                      T scale, const T* delta) noexcept {
    ds_rows_scalar(ds, p, factor, rows, cols, scale, delta);
  }
};

// The SIMD exponential (attention_bwd_fused_hwy.cc; the scalar loop in a portable build).
void exp_below_rows_f32(float* x, std::int64_t rows, std::int64_t cols, float scale,
                        const float* shift) noexcept;
void exp_below_rows_f64(double* x, std::int64_t rows, std::int64_t cols, double scale,
                        const double* shift) noexcept;

template <class T>
using FastBlasOps = std::conditional_t<std::is_same_v<T, float>, BlasOps<float, exp_below_rows_f32>,
                                       BlasOps<double, exp_below_rows_f64>>;

}  // namespace qkv::kernels::bwd
