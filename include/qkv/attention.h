// qkv::attention: softmax(scale · Q·K^T + mask) · V, one call, every option in one struct.
//
// Shapes (as in the command-line contract): Q is [B,H,Nq,D], [H,Nq,D] or [Nq,D]; K is
// [.., Hkv, Nk, D] and V is [.., Hkv, Nk, Dv], of Q's rank and batch. H % Hkv == 0: query head h
// reads kv head h / (H / Hkv) (grouped-query; Hkv = 1 is multi-query). The output is [.., Nq, Dv].
#pragma once

#include <cstdint>
#include <functional>
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
  bool return_lse = false;      // log-sum-exp of the scores the softmax sees, [.., Nq]
  // kF32, kF64 or kF16 (computed in float32, rounded to nearest even once at the end).
  DType out_dtype = DType::kF32;

  // The storage type of Q, K and V for the computation (kF64, kF32, kBF16, kF16); values are
  // rounded to it (nearest even) as the kernels read them, never copied. f32 and f16: float32
  // products and sums; bf16: q·k and P·V on bf16 operands (P rounded to bf16) with float32
  // accumulation and a float32 softmax; f64: float64 throughout (the fused kernel's float64
  // path, the reference when that declines). Default: the type Q, K and V are all stored in when
  // it is f64, bf16 or f16, else f32 (mixed dtypes); kF32 opts all-float64 inputs into float32.
  std::optional<DType> dtype;
  // The gradients' dtype (attention_backward and the layer's backward only; the forward ignores
  // it): default the compute type's, bf16 for a bf16 call (float32 accumulators rounded to
  // nearest even once at the end), float64 for float64, else float32; a bf16 call may ask for
  // kF32 (the float32 accumulators as they are).
  std::optional<DType> grad_dtype;

  // Score modifiers. What the softmax sees is
  //   s_ij = softcap(scale · q_i·k_j) + alibi_ij + float mask_ij
  // (a bool mask, causal and window remove keys).
  // Logit soft-capping (Gemma 2): softcap(x) = C·tanh(x / C), C > 0.
  std::optional<double> softcap;
  // ALiBi (Press et al.): alibi_ij = -slope_h · |i + Nk - Nq - j|. `alibi` takes the standard
  // slopes for H query heads (alibi_slopes() below); `alibi_slopes` gives them (float, [H]).
  bool alibi = false;
  std::optional<TensorView> alibi_slopes;
  // Attention sinks (StreamingLLM, gpt-oss): one logit per query head in the denominator with
  // no value (float, [H]): w_ij = exp(s_ij) / (exp(sink_h) + sum_j exp(s_ij)), and
  // lse = log(exp(sink_h) + sum_j exp(s_ij)); a row with no allowed key gives lse = sink_h.
  std::optional<TensorView> sinks;

  // Attention dropout (training): each weight w_ij is kept with probability 1 - dropout_p and
  // then scaled by 1/(1 - dropout_p), else set to 0, before it multiplies V; lse stays that of
  // the softmax before dropout. dropout_p is rounded to a multiple of 2^-16 (at most
  // 1 - 2^-16) and the scale matches the rounded probability exactly. The mask is drawn by
  // Philox4x32-10 keyed by `seed`, with (dropout_offset, batch, head, row, key) as its counter:
  // the same for any thread count, kernel or tile plan, and drawn again by attention_backward
  // (give it the same three values). With return_weights the weights returned are those after
  // dropout. 0: no dropout (bit for bit the call without it). Not with a KV cache or the ring.
  double dropout_p = 0.0;
  std::uint64_t seed = 0;
  std::uint32_t dropout_offset = 0;

  // A packed batch of sequences of different lengths (int32 or int64, [B+1], from 0,
  // non-decreasing, ending at the row count): sequence b is query rows cu_seqlens_q[b] ..
  // cu_seqlens_q[b+1] against key rows cu_seqlens_k[b] .. cu_seqlens_k[b+1]. Q is then
  // [H, total_q, D] or [total_q, D], K and V [Hkv, total_k, .]; causal, window and ALiBi count
  // positions within each sequence. Both or neither; not with a mask or the weights output.
  std::optional<TensorView> cu_seqlens_q;
  std::optional<TensorView> cu_seqlens_k;

  // Told how far the call has got: progress(done, total) counts query rows of single heads
  // (total = B·H·Nq, or H·total_q for a packed batch) whose outputs are computed. Called after
  // each kernel task (a block of rows, never per row or key) from the thread that finished it:
  // calls may come from several threads at once and a smaller `done` may arrive after a larger
  // one, so it must be thread-safe, quick, and must not throw (keep the largest `done`). The
  // largest `done` reaches `total` when the call succeeds; never called when total is 0.
  // attention_backward (and the layer's backward) counts key rows instead
  // (attention_backward.h).
  using ProgressFunction = std::function<void(std::int64_t done, std::int64_t total)>;
  ProgressFunction progress;

  // 0: one per hardware thread, but a call of fewer than 2^22 multiply-adds per thread runs on
  // fewer (core::kMultiplyAddsPerThread: a thread costs more than it saves there). The bits are
  // the same for any count.
  int threads = 0;
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
  DType compute = DType::kF32;  // the storage type it computed in (options.dtype or its default)
  int threads = 1;  // the threads the kernel was given (options.threads, or fewer when 0)
};

// The standard ALiBi slopes for `heads` query heads: 2^(-8(h+1)/H) when H is a power of two,
// else those of the power of two n below H followed by every other slope of 2n.
std::vector<double> alibi_slopes(std::int64_t heads);

// A query row with no allowed key gives a zero output row, zero weights and lse = -inf (with
// sinks: lse = sink_h).
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

// Runs qkv's threads on an OpenMP runtime this process has already loaded, given as a path or a
// file name the dynamic loader knows ("libgomp.so.1"), instead of on qkv's own threads; ""
// goes back to qkv's own. qkv.torch does this with torch's runtime when torch's parallel backend
// is OpenMP: torch's workers keep spinning for a while after each torch operator, on the cores
// qkv's own threads would need, and on torch's pool they are the ones that take qkv's work.
// Results are the same bits either way. Process-wide; throws qkv::Error naming the library when
// it is not loaded or is not an OpenMP runtime (qkv never loads one itself).
void use_openmp_threads(const std::string& library);
// The library use_openmp_threads was given, or "" while qkv runs its own threads.
std::string openmp_threads_library();

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
