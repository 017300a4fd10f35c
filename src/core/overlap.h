// Whether two views of memory may share a byte: what attention_into checks between every
// output and every input (and between outputs), so that an output written into an input's
// memory is refused rather than read back half-written (issue 22, item 1).
#pragma once

#include <vector>

#include "qkv/tensor.h"

namespace qkv::core {

// True when `a` and `b` may touch a common byte. Exact for the layouts callers use: views whose
// byte spans (lowest to highest byte touched) do not meet, and column blocks of one wider
// matrix (every stride but the last a multiple of one row pitch, rows contiguous) whose columns
// do not meet within a row, are disjoint; anything else whose spans meet counts as overlapping.
bool may_overlap(const TensorView& a, const TensorView& b) noexcept;

// Throws qkv::Error naming both tensors if any output may overlap an input or another output.
void require_no_overlap(const std::vector<const TensorView*>& inputs,
                        const std::vector<const TensorView*>& outputs);

}  // namespace qkv::core
