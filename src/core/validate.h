// The only place that checks user input. Everything past it (kernels) trusts the params.
#pragma once

#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/params.h"
#include "core/progress.h"
#include "qkv/attention.h"
#include "qkv/tensor.h"

namespace qkv::core {

// A checked attention call: the kernel params (outputs not yet bound) and the output shapes in
// Q's rank ([.., Nq, Dv], [.., Nq, Nk], [.., Nq]).
struct AttentionCall {
  AttentionParams params;
  // K and V were not scanned (defer_kv_scan): their magnitudes are the bounds of a view with
  // nothing large (2^32, float16's largest), to be made true by scan_deferred_kv or by a kernel
  // that checks what it reads (AttentionParams::kv_unchecked).
  bool kv_scan_deferred = false;
  Shape out_shape;
  Shape weights_shape;
  Shape lse_shape;
  // A packed batch (options.cu_seqlens_q/k): the B+1 offsets of each side, else empty. The
  // params then describe the whole packed rows as one sequence (nq = total_q, nk = total_k)
  // and sequence_params() cuts out each sequence.
  std::vector<std::int64_t> cu_q, cu_k;
  // The progress line of a run that reports one (options.progress); params.progress points at
  // it, so it lives as long as the call (a local would leave that pointer dangling).
  std::unique_ptr<Progress> progress;
};

// Sequence `s` of a packed call whose outputs are bound: its rows of Q, K, V and the outputs,
// positions counted from its own start.
AttentionParams sequence_params(const AttentionCall& call, std::size_t s);

// Throws qkv::Error naming the offending tensor or option. With defer_kv_scan, K and V are not
// scanned for NaN, infinity and large values (see AttentionCall::kv_scan_deferred).
AttentionCall validate_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                                 const AttentionOptions& options, bool defer_kv_scan = false);

// The scan validate_attention deferred: throws the error it would have thrown for K or V, or
// sets their magnitudes (and the storage-type check that depends on them).
void scan_deferred_kv(AttentionCall& call, const TensorView& k, const TensorView& v,
                      const AttentionOptions& options);

// The options every attention call shares (scale, its default from the head dimension d,
// causal, window, threads), checked and set in p; throws qkv::Error naming the option.
void apply_call_options(const AttentionOptions& options, std::int64_t d, AttentionParams& p);

// Points `slot` at `view` after checking its dtype and that its shape is `expected`.
// has_columns is false for the lse, whose last dim is the query row.
void bind_output(OutputOperand& slot, const MutableTensorView& view, const Shape& expected,
                 bool has_columns = true);

// Throws qkv::Error naming `view` if its strides do not match its shape or it has no data.
void require_view_consistent(const TensorView& view);

// The storage type of a call (options.dtype, or the inputs' common 16-bit type), checked and
// set in p.compute (validate_options.cc, with the two below).
void apply_storage_type(const AttentionOptions& options, AttentionParams& p);

// A packed batch (options.cu_seqlens_q/k): the offsets of both sides checked against Q's and
// K's rows and kept in call.cu_q / call.cu_k; the combinations it cannot take refused.
void apply_packed_batch(const AttentionOptions& options, const TensorView& q, const TensorView& k,
                        AttentionCall& call);

// The score modifiers of a call (softcap, ALiBi, sinks) for p.shape.h query heads, checked and
// set in p.modifiers (and the sinks' bound in p.magnitudes); throws qkv::Error naming the
// option or the tensor.
void apply_score_modifiers(const AttentionOptions& options, AttentionParams& p);
// dropout_p, seed and dropout_offset checked into p.dropout (core/dropout.h); called by
// apply_score_modifiers.
void apply_dropout(const AttentionOptions& options, AttentionParams& p);

// The canonical [b, h, row, col] strides of a rank-2..4 tensor's trailing dims.
Strides4 canonical_strides(const Shape& strides);

// The NumPy index of the element at C-order position `flat` of a tensor of `shape`, as errors
// name it: "[2, 3]" ("[]" for a scalar).
std::string index_string(const Shape& shape, std::int64_t flat);

// Before a computed float32 or float64 output is rounded to float16 (out_dtype kF16): a finite
// value of 65520 or more in magnitude would become infinity. Throws qkv::Error (subject
// "out_dtype") naming the tensor, the value and its index; infinities are left (an lse of -inf
// is a row with no allowed key).
void require_fits_float16(const Tensor& computed);

// Throws qkv::Error naming `view` and the element's index if any element is NaN or infinite.
void require_finite(const TensorView& view);
// The same for several views, the first bad one (in the order given) named; large views are
// scanned on up to `threads` threads, with the same result for any count. Returns, for each
// view in the order given, a bound on its elements' magnitude: the largest magnitude when some
// element reaches 2^32 (or the view is not scanned row by row), else 2^32 itself (the fast scan
// only asks whether an element reaches it; the float32 kernels' range checks pass below it),
// or 65504 for a float16 view (its largest finite value). Views may be float32, float64,
// bfloat16 or float16.
std::vector<double> require_finite(std::initializer_list<const TensorView*> views, int threads);


}  // namespace qkv::core
