// What the layer's forward and backward share: heads as strided views of the projections, and
// operands as contiguous matrices of the compute type.
#pragma once

#include <string>
#include <utility>

#include "qkv/tensor.h"

namespace qkv::layer {

// A [B, heads, N, width] view (or [heads, N, width] for 2-D input) of column blocks of a
// [B·N, heads·width] matrix.
template <typename View, typename Data>
View head_view(Data data, DType dtype, bool batched, std::int64_t b, std::int64_t n,
               std::int64_t heads, std::int64_t width, std::string name) {
  const std::int64_t row = heads * width;
  View view;
  view.data = data;
  view.dtype = dtype;
  view.name = std::move(name);
  if (batched) {
    view.shape = {b, heads, n, width};
    view.strides = {n * row, width, row, 1};
  } else {
    view.shape = {heads, n, width};
    view.strides = {width, row, 1};
  }
  return view;
}

// A contiguous copy of `t` in `dtype` with all leading dims folded into rows.
inline Tensor as_matrix(const TensorView& t, DType dtype) {
  Tensor m = contiguous_copy(t, dtype);
  std::int64_t rows = 1;
  for (int axis = 0; axis + 1 < t.rank(); ++axis) rows *= t.dim(axis);
  m.reshape({rows, t.dim(-1)});
  return m;
}

}  // namespace qkv::layer
