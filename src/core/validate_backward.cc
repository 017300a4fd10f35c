#include "core/validate_backward.h"

#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "core/mask_rule.h"
#include "core/parallel_for.h"
#include "qkv/error.h"

namespace qkv::core {
namespace {

void require_real_input(const TensorView& view) {
  require_view_consistent(view);
  if (view.dtype != DType::kF32 && view.dtype != DType::kF64 && view.dtype != DType::kBF16 &&
      view.dtype != DType::kF16) {
    throw Error(view.name, std::string("dtype ") + dtype_name(view.dtype) +
                               " is not supported (expected float32, float64, bfloat16 or "
                               "float16)");
  }
}

void require_shape(const TensorView& view, const Shape& expected, const std::string& what) {
  if (view.shape != expected) {
    throw Error(view.name, "shape " + shape_string(view.shape) + " should be " +
                               shape_string(expected) + " (" + what + ")");
  }
}

// The lse may hold -inf (a row with no allowed key) but neither NaN nor +inf.
void require_lse_values(const TensorView& lse) {
  const std::int64_t count = lse.numel();
  const std::size_t rank = lse.shape.size();
  std::vector<std::int64_t> index(rank, 0);
  std::int64_t offset = 0;
  for (std::int64_t flat = 0; flat < count; ++flat) {
    const double value = load_real(lse.data, lse.dtype, offset);
    if (std::isnan(value) || value == std::numeric_limits<double>::infinity()) {
      throw Error(lse.name, std::string("holds ") + (std::isnan(value) ? "NaN" : "+inf") + " at " +
                                index_string(lse.shape, flat) +
                                " (an lse is finite, or -inf for a row with no allowed key)");
    }
    for (std::size_t axis = rank; axis-- > 0;) {
      offset += lse.strides[axis];
      if (++index[axis] < lse.shape[axis]) break;
      offset -= lse.strides[axis] * lse.shape[axis];
      index[axis] = 0;
    }
  }
}

InputOperand operand_of(const TensorView& view, bool has_columns = true) {
  Shape strides = view.strides;
  if (!has_columns) strides.push_back(0);
  return {view.data, view.dtype, canonical_strides(strides)};
}

}  // namespace

DType gradient_dtype(DType compute, std::optional<DType> requested) {
  const DType natural = compute == DType::kF64    ? DType::kF64
                        : compute == DType::kBF16 ? DType::kBF16
                                                  : DType::kF32;
  if (!requested || *requested == natural) return natural;
  if (compute == DType::kBF16 && *requested == DType::kF32) return DType::kF32;
  if (*requested == DType::kBF16) {
    throw Error("grad_dtype", std::string("bfloat16 gradients come from a bfloat16 call (dtype "
                                          "bfloat16, or Q, K and V stored in it); this one "
                                          "computes in ") +
                                  dtype_name(compute));
  }
  throw Error("grad_dtype", std::string("must be ") + dtype_name(natural) +
                                (compute == DType::kBF16 ? " or float32" : "") +
                                " for a call computed in " + dtype_name(compute) + ", got " +
                                dtype_name(*requested));
}

BackwardCall validate_attention_backward(const TensorView& q, const TensorView& k,
                                         const TensorView& v, const TensorView& out,
                                         const TensorView& lse, const TensorView& grad_out,
                                         const AttentionOptions& options) {
  BackwardCall call;
  call.forward = validate_attention(q, k, v, options);
  AttentionParams& p = call.forward.params;
  if (p.compute == DType::kF16) {
    throw Error("dtype", "gradients are computed in float32, float64 or bfloat16, not float16 (ask "
                         "for dtype float32 or bfloat16 to differentiate float16 inputs)");
  }
  call.grad_dtype = gradient_dtype(p.compute, options.grad_dtype);
  for (const TensorView* t : {&out, &lse, &grad_out}) require_real_input(*t);
  require_shape(out, call.forward.out_shape, "the output of attention on these inputs");
  require_shape(grad_out, call.forward.out_shape, "the output's shape");
  require_shape(lse, call.forward.lse_shape, "one per query row");
  const int threads = options.threads < 0 ? 1 : resolve_thread_count(options.threads);
  const std::vector<double> magnitudes = require_finite({&grad_out, &out}, threads);
  require_lse_values(lse);

  // The backward does about 2.5 times the forward's multiply-adds (FlashAttention's count):
  // the threads it is worth starting follow that.
  const AttentionShape& s = p.shape;
  p.threads =
      threads_for_work(options.threads, 2.5 * static_cast<double>(s.b) * static_cast<double>(s.h) *
                                            static_cast<double>(s.nq) * static_cast<double>(s.nk) *
                                            static_cast<double>(s.d + s.dv));
  BackwardParams& b = call.params;
  b.forward = p;
  b.out = operand_of(out);
  b.lse = operand_of(lse, false);
  b.grad_out = operand_of(grad_out);
  b.grad_out_magnitude = magnitudes[0];
  return call;
}

BackwardParams sequence_backward_params(const BackwardCall& call, std::size_t s) {
  BackwardParams b = call.params;
  b.forward = sequence_params(call.forward, s);
  const std::int64_t q0 = call.forward.cu_q[s];
  const std::int64_t k0 = call.forward.cu_k[s];
  const auto advance = [](auto* data, DType dtype, std::int64_t elements) {
    using Byte = std::conditional_t<std::is_const_v<std::remove_pointer_t<decltype(data)>>,
                                    const char, char>;
    return static_cast<decltype(data)>(static_cast<Byte*>(data) +
                                       elements * static_cast<std::int64_t>(dtype_size(dtype)));
  };
  if (b.forward.shape.nq > 0) {
    for (InputOperand* op : {&b.out, &b.lse, &b.grad_out}) {
      op->data = advance(op->data, op->dtype, q0 * op->strides.row);
    }
    if (b.dq.data != nullptr) b.dq.data = advance(b.dq.data, b.dq.dtype, q0 * b.dq.strides.row);
  }
  if (b.forward.shape.nk > 0) {
    for (OutputOperand* op : {&b.dk, &b.dv}) {
      if (op->data != nullptr) op->data = advance(op->data, op->dtype, k0 * op->strides.row);
    }
  }
  return b;
}

}  // namespace qkv::core
