// qkv::attention: softmax(scale · Q·K^T + mask) · V, one call, every option in one struct.
//
// Shapes (as in the command-line contract): Q is [B,H,Nq,D], [H,Nq,D] or [Nq,D]; K is
// [.., Hkv, Nk, D] and V is [.., Hkv, Nk, Dv], of Q's rank and batch. H % Hkv == 0: query head h
// reads kv head h / (H / Hkv) (grouped-query; Hkv = 1 is multi-query). The output is [.., Nq, Dv].
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "qkv/tensor.h"

namespace qkv {

// Key j is allowed for query i iff i + (Nk - Nq) - left <= j <= i + (Nk - Nq) + right;
// -1 leaves that side unbounded.
struct Window {
  std::int64_t left = -1;
  std::int64_t right = -1;
};

struct AttentionOptions {
  // Multiplies q·k; default 1/sqrt(D) ("Attention is all you need"); 1 is the textbook form.
  std::optional<double> scale;
  // Key j allowed iff j <= i + (Nk - Nq): bottom-right aligned, the lower triangle when square.
  bool causal = false;
  std::optional<Window> window;
  // Bool (true = may attend) or float (added to the scaled scores; -inf forbids), broadcastable
  // by NumPy rules to the score shape [.., Nq, Nk] whose leading dims are Q's.
  std::optional<TensorView> mask;
  bool return_weights = false;  // [.., Nq, Nk], leading dims as Q's
  bool return_lse = false;      // log-sum-exp of the scaled, masked scores, [.., Nq]
  DType out_dtype = DType::kF32;
  int threads = 0;       // 0: one per hardware thread
  std::string kernel;    // empty: the fastest kernel that supports the call
  // Bytes the call may allocate (outputs it returns and kernel workspace); 0: no limit. A call
  // that would need more throws qkv::Error (subject "max_memory") before allocating anything.
  std::uint64_t max_memory = 0;
};

struct AttentionResult {
  Tensor out;
  Tensor weights;  // empty unless return_weights
  Tensor lse;      // empty unless return_lse
  std::string kernel;  // the kernel that ran
};

// A query row with no allowed key gives a zero output row, zero weights and lse = -inf.
// Throws qkv::Error naming the offending tensor or option on bad input.
AttentionResult attention(const TensorView& q, const TensorView& k, const TensorView& v,
                          const AttentionOptions& options = {});

// Where attention_into writes: views of the caller's memory, any strides. `out` has the
// output's shape; `weights` and `lse`, when given, theirs. Their dtypes must be kF32 or kF64.
struct AttentionOutputs {
  MutableTensorView out;
  std::optional<MutableTensorView> weights;
  std::optional<MutableTensorView> lse;
};

// Like attention(), writing into given views (e.g. one head's column block of a wider matrix);
// options.return_weights / return_lse / out_dtype are ignored in favour of `outputs`.
// Returns the name of the kernel that ran.
std::string attention_into(const TensorView& q, const TensorView& k, const TensorView& v,
                           const AttentionOptions& options, const AttentionOutputs& outputs);

// The kernel list, fastest first, the reference last; any name may go in options.kernel.
// How many threads qkv asked the system for and could not create (a thread limit, an address-
// space limit), since the process started. Such calls run on the threads that could be created,
// with the same results; QKV_VERBOSE=1 makes the CLI say so.
std::int64_t threads_not_started() noexcept;

std::vector<std::string> attention_kernel_names();

// Which kernel attention() would choose for this call and why: one line per kernel in list
// order ("fused_hwy: chosen (SIMD target AVX3)", "x: declines: reason", "y: not tried"), for
// the CLI to print under QKV_VERBOSE=1 (the library itself prints nothing). Throws like
// attention() on bad input or an unknown / unsuitable options.kernel.
std::string explain_kernel_choice(const TensorView& q, const TensorView& k, const TensorView& v,
                                  const AttentionOptions& options = {});

// Errors of one computed tensor against the float64 reference.
struct ErrorStats {
  double max_abs_error = 0.0;      // max |computed - reference|; equal infinities count as 0
  double max_rel_error = 0.0;      // max_abs_error / max |reference| (0 if that is 0): relative
                                   // to the tensor's scale, as outputs cross zero
  double max_abs_reference = 0.0;  // max |reference| over its finite elements
};

struct AccuracyReport {
  std::string kernel;               // result.kernel, the kernel that was checked
  ErrorStats out;
  std::optional<ErrorStats> weights;  // when result.weights is not empty
  std::optional<ErrorStats> lse;      // when result.lse is not empty
};

// `qkv attention --check`: runs the float64 reference on the same inputs and options and
// compares `result` (from attention(q, k, v, options)) with it.
AccuracyReport compare_with_reference(const TensorView& q, const TensorView& k,
                                      const TensorView& v, const AttentionOptions& options,
                                      const AttentionResult& result);

}  // namespace qkv
