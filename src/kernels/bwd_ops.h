// The products and the exponential of the tiled backward (bwd_fused_driver.h), two ways:
// ScalarOps, plain loops (the portable twin: what every line computes is visible), and
// BlasOps, the products through CBLAS (sgemm/dgemm on the calling thread: OpenBLAS is kept
// to one thread, blas_threads.h) with the element-wise steps in SIMD.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace qkv::kernels::bwd {

// The element-wise steps of the weights (bwd_row_stats.h), in the portable way, over rows x
// cols tiles. Each subtraction x - shift is its own rounded step, as in the SIMD versions.
template <class T>
void scale_rows_scalar(T* x, std::int64_t rows, std::int64_t cols, T scale) noexcept {
  for (std::int64_t e = 0; e < rows * cols; ++e) x[e] *= scale;
}

// max_r = max_c x_rc (-inf for a row of -inf).
template <class T>
void max_rows_scalar(const T* x, std::int64_t rows, std::int64_t cols, T* max) noexcept {
  for (std::int64_t r = 0; r < rows; ++r) {
    T m = -std::numeric_limits<T>::infinity();
    for (std::int64_t c = 0; c < cols; ++c) m = std::max(m, x[r * cols + c]);
    max[r] = m;
  }
}

// With e_rc = exp(min(x_rc - shift_r, 0)) in T: sum_r = Σ_c e_rc and dot_r = Σ_c e_rc·dp_rc,
// summed in float64 (summed in float32, their rounding tripled dsinks' error against the plain
// composition's). x and dp are scratch: the SIMD version overwrites them.
template <class T>
void exp_sum_rows_scalar(T* x, T* dp, std::int64_t rows, std::int64_t cols,
                         const T* shift, double* sum, double* dot) noexcept {
  for (std::int64_t r = 0; r < rows; ++r) {
    double total = 0, weighted = 0;
    for (std::int64_t c = 0; c < cols; ++c) {
      const T arg = x[r * cols + c] - shift[r];
      const T e = std::exp(std::min(arg, T(0)));
      total += e;
      weighted += static_cast<double>(e) * dp[r * cols + c];
    }
    sum[r] = static_cast<double>(total);
    dot[r] = static_cast<double>(weighted);
  }
}

// x_rc = exp(min(x_rc - shift_r, 0))·inv_r.
template <class T>
void weigh_rows_scalar(T* x, std::int64_t rows, std::int64_t cols, const T* shift,
                       const T* inv) noexcept {
  for (std::int64_t r = 0; r < rows; ++r) {
    T* row = x + r * cols;
    for (std::int64_t c = 0; c < cols; ++c) {
      const T arg = row[c] - shift[r];
      row[c] = std::exp(std::min(arg, T(0))) * inv[r];
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
  // C (+)= A·B with A(r, x) = a[r·rs + x·cs]: each C element summed over x in order, with
  // fused multiply-adds (as the SIMD kernel and BLAS sum: with separately rounded products
  // the scores erred 2.5x more at |s| ≈ 4e4, past the plain float32 composition's error).
  static void gemm(std::int64_t m, std::int64_t n, std::int64_t k, const T* a, std::int64_t rs,
                   std::int64_t cs, const T* b, std::int64_t ldb, T* c, std::int64_t ldc,
                   bool accumulate) noexcept {
    for (std::int64_t i = 0; i < m; ++i) {
      T* row = c + i * ldc;
      if (!accumulate) std::fill_n(row, n, T(0));
      for (std::int64_t x = 0; x < k; ++x) {
        const T w = a[i * rs + x * cs];
        const T* bx = b + x * ldb;
        for (std::int64_t j = 0; j < n; ++j) row[j] = std::fma(w, bx[j], row[j]);
      }
    }
  }
  static void scale_rows(T* x, std::int64_t rows, std::int64_t cols, T scale) noexcept {
    scale_rows_scalar(x, rows, cols, scale);
  }
  static void max_rows(const T* x, std::int64_t rows, std::int64_t cols, T* max) noexcept {
    max_rows_scalar(x, rows, cols, max);
  }
  static void exp_sum_rows(T* x, T* dp, std::int64_t rows, std::int64_t cols,
                           const T* shift, double* sum, double* dot) noexcept {
    exp_sum_rows_scalar(x, dp, rows, cols, shift, sum, dot);
  }
  static void weigh_rows(T* x, std::int64_t rows, std::int64_t cols, const T* shift,
                         const T* inv) noexcept {
    weigh_rows_scalar(x, rows, cols, shift, inv);
  }
  static void ds_rows(T* ds, const T* p, const T* factor, std::int64_t rows, std::int64_t cols,
                      T scale, const T* delta) noexcept {
    ds_rows_scalar(ds, p, factor, rows, cols, scale, delta);
  }
};

// The element-wise steps in SIMD (attention_bwd_fused_hwy.cc, one dynamic dispatch each; the
// scalar loops in a portable build): what BlasOps uses beside its CBLAS products.
void simd_scale_rows(float* x, std::int64_t rows, std::int64_t cols, float scale) noexcept;
void simd_scale_rows(double* x, std::int64_t rows, std::int64_t cols, double scale) noexcept;
void simd_max_rows(const float* x, std::int64_t rows, std::int64_t cols, float* max) noexcept;
void simd_max_rows(const double* x, std::int64_t rows, std::int64_t cols, double* max) noexcept;
void simd_exp_sum_rows(float* x, float* dp, std::int64_t rows, std::int64_t cols,
                       const float* shift, double* sum, double* dot) noexcept;
void simd_exp_sum_rows(double* x, double* dp, std::int64_t rows, std::int64_t cols,
                       const double* shift, double* sum, double* dot) noexcept;
void simd_weigh_rows(float* x, std::int64_t rows, std::int64_t cols, const float* shift,
                     const float* inv) noexcept;
void simd_weigh_rows(double* x, std::int64_t rows, std::int64_t cols, const double* shift,
                     const double* inv) noexcept;

// The products through CBLAS: a strided A is a plain one (cs = 1) or a transposed one (rs = 1).
template <class T>
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
  static void scale_rows(T* x, std::int64_t rows, std::int64_t cols, T scale) noexcept {
    simd_scale_rows(x, rows, cols, scale);
  }
  static void max_rows(const T* x, std::int64_t rows, std::int64_t cols, T* max) noexcept {
    simd_max_rows(x, rows, cols, max);
  }
  static void exp_sum_rows(T* x, T* dp, std::int64_t rows, std::int64_t cols,
                           const T* shift, double* sum, double* dot) noexcept {
    simd_exp_sum_rows(x, dp, rows, cols, shift, sum, dot);
  }
  static void weigh_rows(T* x, std::int64_t rows, std::int64_t cols, const T* shift,
                         const T* inv) noexcept {
    simd_weigh_rows(x, rows, cols, shift, inv);
  }
  static void ds_rows(T* ds, const T* p, const T* factor, std::int64_t rows, std::int64_t cols,
                      T scale, const T* delta) noexcept {
    ds_rows_scalar(ds, p, factor, rows, cols, scale, delta);
  }
};

template <class T>
using FastBlasOps = BlasOps<T>;

}  // namespace qkv::kernels::bwd
