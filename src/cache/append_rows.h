// append()'s two halves for one of k, v: the checks (before the cache changes) and the row
// writes (after it has committed its pages).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cache/page_layout.h"
#include "qkv/tensor.h"

namespace qkv::cache {

// What append() reads of k or v: the view's strides as [head, row, column] (head 0 for a rank-2
// view of one head).
struct Operand {
  const TensorView* view = nullptr;
  std::string name;
  std::int64_t s_head = 0, s_row = 0, s_col = 0;
  std::int64_t n = 0;
  std::int64_t width = 0;
  // The largest |value| the pages will hold (after rounding, or int8's q · scale), for the
  // kernels' float32 range checks.
  double max_abs = 0.0;

  std::int64_t offset(std::int64_t hk, std::int64_t i, std::int64_t c) const noexcept {
    return hk * s_head + i * s_row + c * s_col;
  }
};

// The float a value is rounded to before store_row converts it to the storage type.
float to_storage_float(CacheStorage storage, double value) noexcept;

// Checks one of k, v against [Hkv, n, width] (n = -1: any, k sets it; [n, width] is accepted
// when Hkv = 1), its dtype, and that every element is finite and, as the page will hold it
// (rounded to bf16 or f16, or int8's q · scale), still finite in float32. Errors name the view
// (or `role` when it has no name) and the element's index, in one line.
Operand check_operand(const TensorView& view, const char* role, const char* width_name,
                      std::int64_t width, std::int64_t n, std::int64_t hkv, CacheStorage storage);

// Writes rows [row0, row0 + op.n) of K (values = false) or V into a sequence's pages, converting
// through `scratch` (at least op.width floats). The pages from the one holding row0 on must be
// this sequence's alone.
void write_rows(const PageLayout& layout, const std::vector<std::byte*>& pages,
                std::int64_t first_page_row, std::int64_t row0, const Operand& op, bool values,
                std::vector<float>& scratch) noexcept;

}  // namespace qkv::cache
