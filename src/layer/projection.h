// Projections X·W (+ bias) through CBLAS: the plain GEMMs of the layer, never hand-written.
#pragma once

#include "qkv/tensor.h"

namespace qkv::layer {

// out = in · w (+ bias in every row). `in` is [rows, n_in], `w` [n_in, n_out], `bias` [n_out]
// or empty; all contiguous and of one dtype, kF32 (sgemm) or kF64 (dgemm). Returns
// [rows, n_out] of that dtype, named `name`. BLAS runs on exactly `threads` threads.
Tensor project(const Tensor& in, const Tensor& w, const Tensor& bias, int threads,
               const std::string& name);

}  // namespace qkv::layer
