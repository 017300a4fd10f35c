// Memory budgets: what a call will allocate, estimated from its shapes before anything is
// allocated, and the refusal when that exceeds options.max_memory.
//
// The estimate is an upper bound on the library's own allocations: the outputs it returns, the
// intermediates of the layer (projections, the concatenation, converted copies) and the kernel
// workspace, which the kernels estimate themselves (kernels::attention_workspace_bytes in
// src/kernels/workspace.cc) and pass in. Inputs the caller already holds are not counted.
#pragma once

#include <cstdint>
#include <string>

#include "core/format_bytes.h"  // format_bytes_exact, for the refusal
#include "core/params.h"
#include "core/validate.h"
#include "qkv/attention.h"

namespace qkv::core {

struct MemoryEstimate {
  std::uint64_t outputs = 0;        // tensors returned to the caller
  std::uint64_t intermediates = 0;  // the layer's projections and copies
  std::uint64_t workspace = 0;      // kernel scratch
  std::uint64_t total() const noexcept;
};

// a * b and a + b, saturating at UINT64_MAX: a shape from a file may make them overflow.
std::uint64_t saturating_mul(std::uint64_t a, std::uint64_t b) noexcept;
std::uint64_t saturating_add(std::uint64_t a, std::uint64_t b) noexcept;

// Bytes of a contiguous tensor of this shape and dtype (saturating).
std::uint64_t tensor_bytes(const Shape& shape, DType dtype) noexcept;

// What attention() (allocates_outputs) or attention_into() allocates for a validated call;
// `workspace` is the kernels' estimate (kernels::attention_workspace_bytes).
MemoryEstimate attention_memory(const AttentionCall& call, const AttentionOptions& options,
                                bool allocates_outputs, std::uint64_t workspace) noexcept;

// The sizes of a multi-head layer call, as multi_head_attention has checked them.
struct LayerShape {
  std::int64_t b = 1, nq = 0, nk = 0, d = 0, d_m = 0;  // nk, d_m: of the memory (or X)
  std::int64_t heads = 1, kv_heads = 1, dk = 0, dv = 0, d_out = 0;
  bool cross = false;  // K and V from a separate memory
  bool has_wo = false;
  DType compute = DType::kF32;
};

// What multi_head_attention allocates: projections, converted copies, the concatenation, the
// outputs and the attention workspace.
MemoryEstimate layer_memory(const LayerShape& shape, const AttentionOptions& options,
                            std::uint64_t workspace) noexcept;

// What multi_head_attention_backward allocates beyond what the forward left it (its state and
// outputs), as its products run (layer_backward.cc): dY and the weights as matrices of the
// compute dtype, dConcat, dW^O, the heads' gradients as rows, X (and M) as matrices, every weight
// and bias gradient, dX (and dM); `attention_backward` is attention_backward's own estimate
// (its gradients and the kernels' workspace), in `workspace`. An upper bound: each counted as
// alive at once.
MemoryEstimate layer_backward_memory(const LayerShape& shape, std::uint64_t attention_backward,
                                     bool has_biases) noexcept;

// What the forward keeps for the backward (LayerForwardState: Q, K, V, the concatenation and
// the lse, in the compute dtype).
std::uint64_t layer_state_memory(const LayerShape& shape) noexcept;

// Throws qkv::Error (subject "max_memory") giving the bytes needed and the budget when
// estimate.total() > budget; budget 0 means no limit. `what` names the call ("attention").
void check_memory_budget(const MemoryEstimate& estimate, std::uint64_t budget,
                         const std::string& what);

}  // namespace qkv::core
