// NumPy broadcasting of one tensor to a target shape, as strides (zero where broadcast).
#pragma once

#include <string>

#include "qkv/tensor.h"

namespace qkv::core {

// Strides that let `view` be indexed with the target's indices, by NumPy's broadcast_to rule:
// dimensions are aligned from the right, each of the view's must equal the target's or be 1, and
// the view may not have more dims than the target (NumPy refuses that even when they are 1).
// Throws qkv::Error naming `view` when it does not broadcast to `target`, which is described in
// the message as `target_description` (e.g. "the score shape [2, 4, 7, 33]").
Shape broadcast_strides(const TensorView& view, const Shape& target,
                        const std::string& target_description);

}  // namespace qkv::core
