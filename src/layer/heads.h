// What the layer's forward and backward share: the call's checked sizes, heads as strided views
// of the projections, and operands as contiguous matrices of the compute type.
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "core/memory_budget.h"
#include "qkv/layer.h"
#include "qkv/tensor.h"

namespace qkv::layer {

// The sizes of a layer call and the dtype it computes in, every shape checked as
// multi_head_attention checks it (the same errors; values are not scanned): float32 when every
// input and the output dtype are 32-bit or narrower, else float64 (multi_head_attention.cc).
core::LayerShape checked_layer_shape(const TensorView& x, const LayerWeights& weights,
                                     const LayerOptions& options,
                                     const std::optional<TensorView>& memory);

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
