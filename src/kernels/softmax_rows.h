// Row-wise softmax of a float matrix, in place: the middle step of attention_fwd_unfused_blas.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

namespace qkv::kernels {

inline constexpr float kSoftmaxInf = std::numeric_limits<float>::infinity();

// For each of `rows` rows of length n (row stride ld): x := exp(x - max) / sum, with the row's
// max and sum of exp(x - max) written out. A row of -inf becomes zeros (sum 0); a row whose max
// overflowed to +inf shares the weight among its +inf entries, as in the reference.
void softmax_rows(float* s, std::int64_t n, std::int64_t ld, std::int64_t rows, float* row_max,
                  float* row_sum) noexcept;

// The two rare rows above, for either implementation.
inline void softmax_row_special(float* x, std::int64_t n, float m, float& row_max,
                                float& row_sum) noexcept {
  float count = 0.0f;
  for (std::int64_t j = 0; j < n; ++j) {
    x[j] = (m == kSoftmaxInf && x[j] == kSoftmaxInf) ? 1.0f : 0.0f;
    count += x[j];
  }
  if (count > 0.0f) {
    for (std::int64_t j = 0; j < n; ++j) x[j] /= count;
  }
  row_max = m;
  row_sum = count;
}

}  // namespace qkv::kernels
