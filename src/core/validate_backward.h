// Validation of a backward call: the forward's checks (validate_attention) plus the tensors
// only the backward reads (out, lse, grad_out).
#pragma once

#include "core/backward_params.h"
#include "core/validate.h"

namespace qkv::core {

struct BackwardCall {
  AttentionCall forward;  // its params are also backward.forward; its shapes, offsets
  BackwardParams params;  // gradients not yet bound
};

// Throws qkv::Error naming the offending tensor or option.
BackwardCall validate_attention_backward(const TensorView& q, const TensorView& k,
                                         const TensorView& v, const TensorView& out,
                                         const TensorView& lse, const TensorView& grad_out,
                                         const AttentionOptions& options);

// Sequence `s` of a packed backward call whose gradients are bound (as sequence_params).
BackwardParams sequence_backward_params(const BackwardCall& call, std::size_t s);

}  // namespace qkv::core
