// Validation of a backward call: the forward's checks (validate_attention) plus the tensors
// only the backward reads (out, lse, grad_out).
#pragma once

#include "core/backward_params.h"
#include <optional>

#include "core/validate.h"

namespace qkv::core {

struct BackwardCall {
  AttentionCall forward;  // its params are also backward.forward; its shapes, offsets
  BackwardParams params;  // gradients not yet bound
  DType grad_dtype = DType::kF32;  // what the caller gets (gradient_dtype)
};

// The gradients' dtype for a call computed in `compute` (kF32, kF64 or kBF16) when the caller
// asked for `requested` (options.grad_dtype): the compute type's by default, float32 on request
// for bf16. Throws qkv::Error (subject "grad_dtype") for anything else.
DType gradient_dtype(DType compute, std::optional<DType> requested);

// Throws qkv::Error naming the offending tensor or option.
BackwardCall validate_attention_backward(const TensorView& q, const TensorView& k,
                                         const TensorView& v, const TensorView& out,
                                         const TensorView& lse, const TensorView& grad_out,
                                         const AttentionOptions& options);

// Sequence `s` of a packed backward call whose gradients are bound (as sequence_params).
BackwardParams sequence_backward_params(const BackwardCall& call, std::size_t s);

}  // namespace qkv::core
